"""The README's two fresh-machine commands are what CI runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(.*?)\n```", text, flags=re.S)[:2]


def test_readme_starts_with_install_and_test_commands() -> None:
    install, test = _commands()
    assert "pip install" in install and install.rstrip().endswith("runstore check")
    assert "pytest" in test


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    _, test = _commands()
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test.strip() in ci_lines
    install, _ = _commands()
    assert ".[all,test]" in install and any(".[all,test]" in line for line in ci_lines)
    # Whole files per worker: split across workers, a module-scoped fixture (a teeth
    # module's child suite run) would be built once in each.
    assert "-n" not in test.split() or "--dist loadfile" in test, test


def test_the_readme_test_command_reports_slowest_tests_and_skip_reasons() -> None:
    """What CI prints ends with the 25 slowest tests (where its time goes) and the reason for
    every skip, so a test that quietly stopped running is seen."""
    _, test = _commands()
    words = test.split()
    assert "--durations=25" in words, test
    assert any(w.startswith("-r") and "s" in w[2:] for w in words), test


def _python_blocks() -> list[str]:
    # Top-level blocks only. Every block is run (or exempted with its reason) by
    # test_readme_examples.py; the plugin block is run here, as a package.
    return re.findall(r"^```python\n(.*?)\n```$", (ROOT / "README.md").read_text(), flags=re.S | re.M)


def test_readme_plugin_example_is_selectable(tmp_path: Path) -> None:
    import subprocess
    import sys

    plugin = next(b for b in _python_blocks() if "runstore_register_event_stores" in b)
    (tmp_path / "acme_runstore").mkdir()
    (tmp_path / "acme_runstore" / "__init__.py").write_text(plugin)
    code = (
        "import asyncio, runstore, acme_runstore\n"
        "runstore.register_plugin(acme_runstore)\n"
        "async def main():\n"
        "    async with runstore.open(checkpointer='memory://', events='acme://') as stores:\n"
        "        print(type(stores.events).__name__)\n"
        "asyncio.run(main())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
        env={**__import__("os").environ, "PYTHONPATH": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "AcmeEventStore"


def test_readme_plugin_example_passes_runstore_check(tmp_path: Path) -> None:
    """The example plugin, as the README shows it, passes the conformance suite."""
    import json
    import os
    import subprocess
    import sys

    plugin = next(b for b in _python_blocks() if "runstore_register_event_stores" in b)
    (tmp_path / "acme_runstore").mkdir()
    (tmp_path / "acme_runstore" / "__init__.py").write_text(plugin)
    out = subprocess.run(
        [sys.executable, "-m", "runstore", "check", "acme://", "--plugin", "acme_runstore", "--json"],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["ok"] is True
    suites = result["backends"]["events:acme"]["suites"]
    assert sum(s["passed"] for s in suites.values()) >= 50


def test_the_readme_test_command_runs_every_fault_test() -> None:
    """The fault tests are part of what CI runs: nothing in the pytest configuration
    deselects them, and every test under tests/faults carries the ``faults`` marker
    (so ``pytest -m faults`` runs them all)."""
    import subprocess
    import sys
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    addopts = config.get("addopts", "")
    addopts = " ".join(addopts) if isinstance(addopts, list) else addopts
    assert not re.search(r"(^|\s)(-m|--deselect|--ignore)", addopts), f"the default run deselects tests: {addopts}"
    assert any(marker.startswith("faults:") for marker in config["markers"])

    # One collection of tests/faults under -m faults: nothing may be deselected.
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "faults",
         "tests/faults"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert sum("::" in line for line in out.stdout.splitlines()) > 40
    assert "deselected" not in out.stdout, f"a test under tests/faults without the faults marker: {out.stdout[-300:]}"
