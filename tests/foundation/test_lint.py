"""ruff, mypy and a dead-code check (vulture) are part of the tests."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    return str(BIN / name) if (BIN / name).exists() else (shutil.which(name) or name)


def test_ruff_clean() -> None:
    out = subprocess.run([_tool("ruff"), "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_clean_on_everything_that_ships() -> None:
    out = subprocess.run([_tool("mypy"), "core", "plugins", "conformance"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


#: Names vulture cannot see used: pytest and pluggy hooks, click commands, Hypothesis rules
#: and fixtures are found by decorator or name; the rest is listed, with why, in
#: tests/foundation/vulture_whitelist.py.
VULTURE_IGNORE_NAMES = "pytest_*,pytestmark,runstore_*,__dir__,__getattr__"
VULTURE_IGNORE_DECORATORS = (
    "@rule,@invariant,@initialize,@precondition,@*.command,@*.group,@hookimpl,@*.fixture"
)


def test_no_dead_code_ships() -> None:
    """Nothing in core, plugins or the suite is unused; the tests count as users, and their
    own helpers (mutant classes found by reflection, say) are not reported."""
    out = subprocess.run(
        [
            _tool("vulture"), "core", "plugins", "conformance", "tests",
            "tests/foundation/vulture_whitelist.py", "--min-confidence", "60",
            "--ignore-names", VULTURE_IGNORE_NAMES, "--ignore-decorators", VULTURE_IGNORE_DECORATORS,
        ],
        cwd=ROOT, capture_output=True, text=True,
    )
    shipped = [line for line in out.stdout.splitlines() if not line.startswith("tests")]
    assert not out.stderr and shipped == [], out.stdout + out.stderr
