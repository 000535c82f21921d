"""Output for people and for logs: tables fit the terminal's width, also when piped
(COLUMNS, else 120 columns), names wrap instead of being cut, help texts show no reST
markup, and progress bars draw only on a terminal: a log gets plain lines."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from runstore.cli.check import CheckResult


def _env(columns: int | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "FORCE_COLOR", "TTY_COMPATIBLE")}
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return {**env, **extra}


def _run(*args: str, cwd: Path, columns: int | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([sys.executable, "-m", "runstore", *args], capture_output=True, text=True, cwd=cwd,
                         env=_env(columns, **env), timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return out


def _runstore(*args: str, cwd: Path, columns: int | None) -> str:
    return _run(*args, cwd=cwd, columns=columns).stdout


#: What a live display writes to redraw its line: carriage returns, cursor moves, line
#: erases, hiding the cursor. Colours (FORCE_COLOR) are not among them.
REDRAW = re.compile(r"\r|\x1b\[[0-9;]*[ABCDEFGHJKST]|\x1b\[\?25[hl]")


def _widest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


@pytest.mark.parametrize("columns", [80, 120, None])
def test_backends_tables_fit_the_width_when_piped(tmp_path: Path, columns: int | None) -> None:
    text = _runstore("backends", cwd=tmp_path, columns=columns)
    assert _widest(text) <= (columns or 120), text
    assert "…" not in text and "runstore backends" in text, text  # long cells wrap, never cut


#: Every suite of a run over all kinds (each its own column once: far wider than a terminal).
SUITES = [
    ("saver", "savers"), ("saver", "threads"), ("saver", "retention"), ("saver", "retention_claims"),
    ("saver", "fencing"), ("saver", "portability"), ("events", "events"), ("events", "event_fencing"),
    ("events", "portability"), ("streams", "streams"), ("streams", "stream_fencing"), ("streams", "stream_data"),
    ("streams", "stream_lifetimes"), ("runs", "runs"), ("runs", "runs_rules"), ("store", "store"),
    ("history_cache", "history_cache"),
]


@pytest.mark.parametrize("columns", [80, 120])
def test_check_matrix_fits_and_keeps_names_whole(columns: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    main = importlib.import_module("runstore.cli.main")  # the module; runstore.cli.main is also the group

    records = [
        {"type": "result", "nodeid": f"t.py::test_{suite}[sqlite-with-a-long-name]", "name": f"test_{suite}",
         "kind": kind, "backend": "sqlite-with-a-long-name", "suite": suite, "outcome": "passed", "requires": []}
        for kind, suite in SUITES
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
    for _, suite in SUITES:  # every suite's counts on a line of their own, whole
        assert f"{suite} 1/0/0" in text, text


@pytest.mark.parametrize("args", [("check", "--help"), ("bench", "--help"), ("retention", "run", "--help"),
                                  ("backends", "--help")])
def test_help_shows_no_rest_markup(tmp_path: Path, args: tuple[str, ...]) -> None:
    text = _runstore(*args, cwd=tmp_path, columns=100)
    assert "``" not in text and "`" not in text, text


# --------------------------------------------------------------------------- bench tables


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """One real checkpoint bench, piped, with colours forced (rich then believes it is on a
    terminal), every column group filled (peer, ceiling, fences, history cache); plus an
    events and a load table with long names."""
    cwd = tmp_path_factory.mktemp("bench")
    out = _run("bench", "checkpoint", "-b", "memory://,langgraph:memory", "--updates", "5", "--repetitions", "1",
               "--snapshot-frequencies", "2", "--history-cache", "none,memory", "--fenced", "-o", "run.jsonl",
               cwd=cwd, FORCE_COLOR="1")
    def row(**fields: object) -> str:
        return json.dumps({"schema_version": 1, "record": "row", "status": "ok", **fields})

    long = "postgresql://bench@a-rather-long-host-name.example:5432/benchmarks|postgres.pool_max_size=3"
    extra = [row(bench="events", case_backend=long, backend=long, op="put_batch", variant="20",
                 metric="rate_per_s", rate_per_s=900.0, p50_ms=1.0, p99_ms=2.0,
                 reference={"backend": "raw:asyncpg", "op": "put_batch", "variant": "20"}),
             row(bench="events", case_backend=long, backend="raw:asyncpg", op="put_batch", variant="20",
                 metric="rate_per_s", rate_per_s=1000.0, p50_ms=0.9, p99_ms=1.8)]
    for stack, peer in (("pg+redis", False), ("stock", True)):
        extra.append(row(bench="load", stack=stack, peer=peer, mode="full", concurrency=8, processes=1, turns=5,
                         digest_ok=True, errors_total=0, turns_per_s=100.0, turn_p50_ms=5.0, turn_p99_ms=9.0,
                         events_per_s=400.0, delivery_p99_ms=3.0, pool_wait_ms=0.0, cpu_ms_per_turn=2.0,
                         peak_rss_bytes=2**27))
    (cwd / "more.jsonl").write_text("\n".join(extra) + "\n")
    return cwd, out


def test_a_bench_run_logs_plain_lines(bench_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    _cwd, out = bench_run
    assert not REDRAW.search(out.stderr), repr(out.stderr)
    assert "━" not in out.stderr, out.stderr  # no bar drawn into the log
    cases = [line for line in out.stderr.splitlines() if line.startswith(("memory://|", "langgraph:memory|"))]
    assert len(cases) == 2 * (1 + 2) and all(": ok" in line for line in cases), out.stderr


@pytest.mark.parametrize("columns", [80, 120, None])
def test_bench_summary_fits_the_width_piped(bench_run: tuple[Path, subprocess.CompletedProcess[str]],
                                            columns: int | None) -> None:
    cwd, _out = bench_run
    text = _runstore("bench", "summarize", "run.jsonl", "more.jsonl", cwd=cwd, columns=columns)
    width = columns or 120
    assert _widest(text) <= width, text
    assert "…" not in text, text
    for table in ("checkpoint", "events / streams / runs", "load"):
        assert table in text, text
    # Identifying columns and the first ratios are always there; names are whole or wrap.
    assert "langgraph:memory" in text and "vs peer" in text and "x stock" in text and "ratio" in text, text
    flat = "".join(cell.strip() for line in text.splitlines() for cell in line.split("│")[:2])
    assert "a-rather-long-host-name" in flat.replace(" ", ""), text
    # What did not fit is named, with the way to see it.
    assert "left out to fit" in text and "--wide" in text, text
    if width >= 120:
        assert "fenced/" in text and "cache" in text and "delta/full" in text, text
    note = text[text.index("left out to fit"):]
    assert "vs peer" not in note and "p50 ms" in note, text  # dropped from the least important


def test_bench_summary_wide_and_json_show_every_column(
        bench_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    from runstore.bench.tables import CHECKPOINT_COLUMNS, LOAD_COLUMNS, MEASUREMENT_COLUMNS

    cwd, _out = bench_run
    text = _runstore("bench", "summarize", "run.jsonl", "more.jsonl", "--wide", cwd=cwd, columns=80)
    assert "left out" not in text
    header_words = set(text.replace("┃", " ").split())
    for column in (*CHECKPOINT_COLUMNS, *MEASUREMENT_COLUMNS, *LOAD_COLUMNS):
        assert set(column.header.split()) <= header_words, column
    summary = json.loads(_runstore("bench", "summarize", "run.jsonl", "--json", cwd=cwd, columns=80))
    keys = set().union(*summary["checkpoint"])
    assert {c.key for c in CHECKPOINT_COLUMNS} <= keys


# --------------------------------------------------------------------------- live displays


def test_check_and_retention_log_plain_lines(tmp_path: Path) -> None:
    check = _run("check", "memory://", "-k", "roundtrip", cwd=tmp_path, FORCE_COLOR="1")
    sweep = _run("retention", "run", "--checkpointer", f"sqlite:///{tmp_path / 'db.sqlite'}", "--keep-last", "2",
                 cwd=tmp_path, FORCE_COLOR="1")
    for out in (check, sweep):
        assert not REDRAW.search(out.stderr) and "━" not in out.stderr, repr(out.stderr)


def test_check_draws_its_bar_on_a_terminal(tmp_path: Path) -> None:
    """On a terminal the bar is live and is fed by the suite's results (it ends at n/n)."""
    controller, terminal = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "runstore", "check", "memory://", "-k", "roundtrip"],
                                stdin=terminal, stdout=terminal, stderr=terminal, cwd=tmp_path,
                                env=_env(100, TERM="xterm"))
        os.close(terminal)
        chunks = []
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the other end closed
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert proc.wait(timeout=300) == 0
    finally:
        os.close(controller)
    text = b"".join(chunks).decode(errors="replace")
    counts = re.findall(r"conformance.*?(\d+)/(\d+)", text)
    assert counts and counts[-1][0] == counts[-1][1] != "0", text
