"""`runstore bench load`: planning, digests, summaries, and tiny real runs on every stack.

No timing is asserted: the real runs check rows, digests, zero errors and the summary.
Cases run in this process (the runner's ``child`` hook) to keep the test fast; a cell
with two processes still starts two real worker processes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from runstore.bench.cli import bench_group
from runstore.bench.common import read_jsonl
from runstore.bench.load import LoadCase, check_load_digests, plan_load, run_load
from runstore.bench.load_shard import classify
from runstore.bench.load_stacks import StreamBroken
from runstore.bench.runner import RunOptions
from runstore.bench.summarize import summarize
from runstore.checkpoint.modes import reset_checkpoint_mode_for_tests


def _plan(**overrides: Any) -> list[LoadCase]:
    kwargs: dict[str, Any] = {
        "stacks": ["pg+redis", "stock"],
        "modes": ["full", "delta"],
        "concurrency": [1, 4],
        "processes": [1, 2],
        "turns": 2,
        "pool_size": 10,
        "repetitions": 2,
    }
    kwargs.update(overrides)
    return plan_load(**kwargs)


def test_plan_runs_the_stacks_of_a_cell_back_to_back_and_alternates_their_order() -> None:
    cases = _plan()
    # p2 needs at least 2 threads: (c1,p1), (c4,p1), (c4,p2) x 2 modes x 2 reps, 2 stacks each
    assert len(cases) == 3 * 2 * 2 * 2
    assert all(c.processes <= c.concurrency for c in cases)
    assert len({c.case_id for c in cases}) == len(cases)
    for i in range(0, len(cases), 2):
        pair = cases[i : i + 2]
        assert pair[0].cell_id == pair[1].cell_id
        expected = ["pg+redis", "stock"] if pair[0].repetition == 0 else ["stock", "pg+redis"]
        assert [c.stack for c in pair] == expected
    assert {c.peer for c in cases if c.stack == "stock"} == {True}


@pytest.mark.parametrize(
    "bad",
    [{"stacks": ["nope"]}, {"modes": ["half"]}, {"concurrency": [0]}, {"turns": 0}, {"processes": []}],
)
def test_plan_rejects_bad_parameters(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        _plan(**bad)


def test_errors_are_classified_through_their_causes() -> None:
    import sqlite3

    wrapped = RuntimeError("write failed")
    wrapped.__cause__ = sqlite3.OperationalError("database is locked")
    assert classify(wrapped) == "locked"
    assert classify(RuntimeError("QueuePool limit of size 5 overflow 0 reached")) == "pool"
    assert classify(type("PoolTimeout", (Exception,), {})("couldn't get a connection")) == "pool"
    assert classify(RuntimeError("Too many connections")) == "pool"
    assert classify(StreamBroken("got event 3, expected 2")) == "lost"
    assert classify(ValueError("boom")) == "other"
    unavailable = RuntimeError("postgres event store is unavailable")
    unavailable.__cause__ = TimeoutError("no answer within 90s")
    assert classify(unavailable) == "timeout"


def _row(stack: str, cell: str, digest: str, **extra: Any) -> dict[str, Any]:
    return {"stack": stack, "cell_id": cell, "digest": digest, "status": "ok", **extra}


def test_stacks_of_a_cell_that_disagree_are_all_marked() -> None:
    rows = [
        _row("pg+redis", "c1", "aaa"),
        _row("stock", "c1", "bbb"),
        _row("pg+redis", "c2", "ccc"),
        _row("stock", "c2", "ccc"),
    ]
    failures = check_load_digests(rows)
    assert len(failures) == 1 and "c1" in failures[0]
    assert [r["status"] for r in rows] == ["digest_mismatch", "digest_mismatch", "ok", "ok"]


def _summary_row(stack: str, conc: int, procs: int, rate: float, p99: float, **extra: Any) -> dict[str, Any]:
    return {
        "schema_version": 1, "record": "row", "bench": "load", "status": "ok",
        "stack": stack, "peer": stack.startswith("stock"), "mode": "full",
        "concurrency": conc, "processes": procs, "turns": 3, "case_id": f"{stack}|{conc}|{procs}",
        "turns_per_s": rate, "turn_p99_ms": p99, "errors_total": 0, "digest_ok": True,
        **extra,
    }  # fmt: skip


def test_summary_divides_by_the_peer_at_the_same_point_and_by_one_process(tmp_path: Path) -> None:
    rows = [
        _summary_row("pg+redis", 32, 1, 300.0, 50.0),
        _summary_row("pg+redis", 32, 1, 100.0, 70.0),  # median of the two: 200 turns/s, 60 ms
        _summary_row("stock", 32, 1, 50.0, 120.0),
        _summary_row("pg+redis", 32, 4, 400.0, 40.0),
        _summary_row("embedded", 32, 1, 80.0, 10.0),  # its peer (stock-sqlite) did not run
        _summary_row("stock", 8, 1, 10.0, 1.0, status="failed"),
    ]
    path = tmp_path / "load.jsonl"
    path.write_text("\n".join(orjson.dumps(r).decode() for r in rows) + "\n")
    summary = summarize([read_jsonl(path)])
    entries = {(e["stack"], e["concurrency"], e["processes"]): e for e in summary.load}
    assert set(entries) == {("pg+redis", 32, 1), ("stock", 32, 1), ("pg+redis", 32, 4), ("embedded", 32, 1)}
    one = entries[("pg+redis", 32, 1)]
    assert one["repetitions"] == 2 and one["turns_per_s"] == 200.0
    assert one["peer_turns_per_s"] == pytest.approx(4.0) and one["peer_p99"] == pytest.approx(0.5)
    assert entries[("pg+redis", 32, 4)]["process_speedup"] == pytest.approx(2.0)
    assert "peer_turns_per_s" not in entries[("embedded", 32, 1)]
    assert any("not ok" in w for w in summary.warnings)


def _inline(case: Mapping[str, Any], _timeout: float | None) -> dict[str, Any]:
    """Run a case in this process (each resets the frozen checkpoint mode first)."""
    from runstore.bench.worker import run_case

    reset_checkpoint_mode_for_tests()
    try:
        return run_case(dict(case))
    finally:
        reset_checkpoint_mode_for_tests()


@pytest.fixture
def services(postgres_url: str, redis_url: str) -> Iterator[RunOptions]:
    yield RunOptions(postgres_url=postgres_url, redis_url=redis_url, timeout_seconds=120)


def _check_rows(rows: list[dict[str, Any]], expected_cases: int) -> None:
    assert len(rows) == expected_cases
    for r in rows:
        assert r["status"] == "ok", (r["case_id"], r.get("error"), r.get("traceback"))
        assert r["digest_ok"] is True and r["errors_total"] == 0, r["case_id"]
        assert r["turns_done"] == r["concurrency"] * r["turns"]
        assert r["turns_per_s"] > 0 and r["turn_p99_ms"] >= r["turn_p50_ms"] > 0
        assert r["events_per_s"] > 0 and r["delivery_p99_ms"] is not None
        assert r["peak_rss_bytes"] > 0 and r["cpu_ms_per_turn"] > 0
        assert all(r["phase_ms"][p] >= 0 for p in ("graph", "journal", "read", "drain")), r["phase_ms"]
    by_cell: dict[str, set[str]] = {}
    for r in rows:
        by_cell.setdefault(r["cell_id"], set()).add(r["digest"])
    assert all(len(digests) == 1 for digests in by_cell.values()), by_cell


def test_every_stack_runs_a_tiny_load_end_to_end(tmp_path: Path, services: RunOptions) -> None:
    out = tmp_path / "load.jsonl"
    cases = plan_load(
        stacks=["embedded", "stock-sqlite", "pg+redis", "stock"], modes=["full"],
        concurrency=[1, 4], processes=[1], turns=2, pool_size=10, repetitions=1,
    )  # fmt: skip
    outcome = run_load(cases, output=out, options=services, child=_inline)
    assert outcome.exit_code == 0, outcome.failures
    rows = read_jsonl(out).rows
    _check_rows(rows, 8)
    pg = [r for r in rows if r["stack"] == "pg+redis"]
    assert all(r["pool_checkouts"] > 0 for r in pg)
    result = CliRunner().invoke(
        bench_group,
        ["summarize", str(out), "--json"],
    )
    assert result.exit_code == 0, result.output
    load = orjson.loads(result.stdout)["load"]
    ratios = {(e["stack"], e["concurrency"]): e.get("peer_turns_per_s") for e in load}
    assert ratios[("pg+redis", 4)] > 0 and ratios[("embedded", 4)] > 0
    assert ratios[("stock", 4)] is None
    table = CliRunner().invoke(
        bench_group,
        ["summarize", str(out)],
        env={"COLUMNS": "250"},  # names are read whole: no wrapping inside cells
    )
    assert table.exit_code == 0
    assert all(name in table.stdout for name in ("x stock", "pg+redis", "stock-sqlite", "embedded"))


def test_two_worker_processes_share_one_cell(tmp_path: Path, services: RunOptions) -> None:
    out = tmp_path / "load.jsonl"
    cases = plan_load(
        stacks=["pg+redis"], modes=["delta"], concurrency=[4], processes=[2], turns=2,
        pool_size=10, repetitions=1,
    )  # fmt: skip
    outcome = run_load(cases, output=out, options=services, child=_inline)
    assert outcome.exit_code == 0, outcome.failures
    rows = read_jsonl(out).rows
    _check_rows(rows, 1)
    assert rows[0]["processes"] == 2 and rows[0]["peak_rss_total_bytes"] > rows[0]["peak_rss_bytes"]


def test_fenced_plan_follows_each_runstore_stack_with_its_fenced_case() -> None:
    cases = _plan(concurrency=[4], processes=[1], modes=["full"], fenced=True)
    names = [c.case_id.split("|")[0] for c in cases]
    assert names == ["pg+redis", "pg+redis+fenced", "stock", "stock", "pg+redis+fenced", "pg+redis"]
    assert [c.fenced for c in cases if c.stack == "stock"] == [False, False]
    assert all(c.params()["fenced"] == c.case_id.startswith("pg+redis+fenced") for c in cases)


def test_summary_divides_a_fenced_stack_by_the_same_stack_unfenced(tmp_path: Path) -> None:
    rows = [
        _summary_row("pg+redis", 8, 1, 200.0, 50.0),
        _summary_row(
            "pg+redis",
            8,
            1,
            150.0,
            60.0,
            fenced=True,
            case_id="pg+redis+fenced|8|1",
            fenced_stores=["checkpointer", "events", "streams"],
            fence_stale_refused=True,
        ),
        _summary_row("stock", 8, 1, 100.0, 100.0),
    ]
    path = tmp_path / "load.jsonl"
    path.write_text("\n".join(orjson.dumps(r).decode() for r in rows) + "\n")
    entries = {e["stack"]: e for e in summarize([read_jsonl(path)]).load}
    fenced = entries["pg+redis+fenced"]
    assert fenced["fence_turns_ratio"] == pytest.approx(0.75) and fenced["fence_p99"] == pytest.approx(1.2)
    assert fenced["peer_turns_per_s"] == pytest.approx(1.5)
    assert fenced["fenced_stores"] == ["checkpointer", "events", "streams"]
    assert "fence_turns_ratio" not in entries["pg+redis"]


def test_fenced_pg_redis_over_two_processes_refuses_stale_tokens(tmp_path: Path, services: RunOptions) -> None:
    out = tmp_path / "load.jsonl"
    cases = plan_load(
        stacks=["pg+redis"], modes=["delta"], concurrency=[4], processes=[2], turns=2,
        pool_size=10, repetitions=1, fenced=True,
    )  # fmt: skip
    outcome = run_load(cases, output=out, options=services, child=_inline)
    assert outcome.exit_code == 0, outcome.failures
    rows = read_jsonl(out).rows
    _check_rows(rows, 2)  # the fenced and unfenced cases end with one digest
    fenced = next(r for r in rows if r["fenced"])
    assert fenced["fenced_stores"] == ["checkpointer", "events", "streams"]
    assert fenced["fence_stale_refused_by"] == {"checkpointer": True, "events": True, "streams": True}
    assert fenced["phase_ms"]["fence"] > 0
