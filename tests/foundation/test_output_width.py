"""Output for people and for logs: tables fit the terminal's width, also when piped
(COLUMNS, else 120 columns), names wrap instead of being cut, and help texts show no
reST markup."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from runstore.cli.check import CheckResult


def _runstore(*args: str, cwd: Path, columns: int | None) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    if columns is not None:
        env["COLUMNS"] = str(columns)
    out = subprocess.run([sys.executable, "-m", "runstore", *args], capture_output=True, text=True, cwd=cwd,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _widest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


@pytest.mark.parametrize("columns", [80, 120, None])
def test_backends_tables_fit_the_width_when_piped(tmp_path: Path, columns: int | None) -> None:
    text = _runstore("backends", cwd=tmp_path, columns=columns)
    assert _widest(text) <= (columns or 120), text
    assert "…" not in text and "runstore backends" in text, text  # long cells wrap, never cut


@pytest.mark.parametrize("columns", [80, 120])
def test_check_matrix_fits_and_keeps_names_whole(columns: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    main = importlib.import_module("runstore.cli.main")  # the module; runstore.cli.main is also the group

    records = [
        {"type": "result", "nodeid": f"t.py::test_{suite}[sqlite-with-a-long-name]", "name": f"test_{suite}",
         "kind": kind, "backend": "sqlite-with-a-long-name", "suite": suite, "outcome": "passed", "requires": []}
        for kind, suite in [("saver", "savers"), ("saver", "threads"), ("saver", "retention"), ("saver", "fencing"),
                            ("events", "events"), ("events", "event_fencing"), ("streams", "streams"), ("runs", "runs")]
    ]
    result = CheckResult(records=records, returncode=0, collected=len(records), log="",
                         session={"backends": {}})
    buffer = io.StringIO()
    monkeypatch.setattr(main, "console", Console(file=buffer, width=columns, markup=False, emoji=False))
    main._print_report(result)
    text = buffer.getvalue()
    assert _widest(text) <= columns, text
    assert "…" not in text, text
    first_column = "".join(line.split("│")[1].strip() for line in text.splitlines() if line.startswith("│"))
    assert "events:sqlite-with-a-long-name" in first_column, text


@pytest.mark.parametrize("args", [("check", "--help"), ("bench", "--help"), ("retention", "run", "--help"),
                                  ("backends", "--help")])
def test_help_shows_no_rest_markup(tmp_path: Path, args: tuple[str, ...]) -> None:
    text = _runstore(*args, cwd=tmp_path, columns=100)
    assert "``" not in text and "`" not in text, text
