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
