"""The benchmark harness's own logic: planning, pairing, digests, summaries, schema.

No timing is asserted anywhere: children are faked or trivial.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest

from runstore.bench.common import SCHEMA_VERSION, BenchSchemaError, read_jsonl
from runstore.bench.matrix import (
    check_cell_digests,
    estimate_full_payload_bytes,
    plan_checkpoint,
)
from runstore.bench.runner import RunOptions, run_checkpoint_plan, run_child
from runstore.bench.summarize import summarize


def _plan(**overrides: Any) -> Any:
    kwargs: dict[str, Any] = {
        "backends": ["memory://", "langgraph:memory"],
        "updates": [10, 20],
        "payload_bytes": [128],
        "snapshot_frequencies": [10, 100],
        "repetitions": 2,
        "seed": 7,
    }
    kwargs.update(overrides)
    return plan_checkpoint(**kwargs)


# --------------------------------------------------------------------------- matrix


def test_matrix_expands_every_cell_with_full_and_each_delta_variant() -> None:
    plan = _plan(caches=["none", "memory"])
    # 2 reps x 2 backends x 2 update counts = 8 cells; each: full + 2 freqs x 2 caches
    assert len(plan.cases) == 8 * 5
    assert len({c.case_id for c in plan.cases}) == len(plan.cases)
    cells: dict[str, list[Any]] = {}
    for case in plan.cases:
        cells.setdefault(case.cell_id, []).append(case)
    assert len(cells) == 8
    for cases in cells.values():
        modes = sorted((c.mode, c.snapshot_frequency or 0, c.cache) for c in cases)
        assert modes == [
            ("delta", 10, "memory"),
            ("delta", 10, "none"),
            ("delta", 100, "memory"),
            ("delta", 100, "none"),
            ("full", 0, "none"),
        ]
        assert len({(c.backend, c.updates, c.payload_bytes, c.repetition) for c in cases}) == 1


def test_mode_order_alternates_between_repetitions() -> None:
    plan = _plan(backends=["memory://"], updates=[10], repetitions=4)
    by_rep: dict[int, list[str]] = {}
    for case in plan.cases:  # plan order is run order
        by_rep.setdefault(case.repetition, []).append(case.mode)
    assert by_rep[0][0] == "full" and by_rep[0][-1] == "delta"
    assert by_rep[1][0] == "delta" and by_rep[1][-1] == "full"
    assert by_rep[2] == by_rep[0] and by_rep[3] == by_rep[1]
    # repetitions are the outer loop: every rep-0 case runs before any rep-1 case
    reps = [c.repetition for c in plan.cases]
    assert reps == sorted(reps)


def test_cap_skips_both_modes_of_an_oversized_cell_with_a_warning() -> None:
    small, big = 10, 2000
    cap = estimate_full_payload_bytes(1000, 128)
    assert estimate_full_payload_bytes(big, 128) > cap >= estimate_full_payload_bytes(small, 128)
    plan = _plan(updates=[small, big], payload_cap_bytes=cap)
    skipped = plan.skipped
    assert skipped and all(c.updates == big for c in skipped)
    assert {c.mode for c in skipped} == {"full", "delta"}
    assert all(c.updates == small for c in plan.runnable)
    # every case of a skipped cell is skipped: no half pair
    for cell in {c.cell_id for c in skipped}:
        assert all(c.skipped for c in plan.cases if c.cell_id == cell)
    assert len(plan.warnings) == 1 and "--allow-large-cases" in plan.warnings[0]
    allowed = _plan(updates=[small, big], payload_cap_bytes=cap, allow_large_cases=True)
    assert not allowed.skipped and not allowed.warnings


def test_the_estimate_matches_the_measured_full_mode_storage() -> None:
    # DESIGN §7: 500 turns of 128-byte messages wrote 243 MB in full mode.
    assert 200e6 < estimate_full_payload_bytes(500, 128) < 290e6


@pytest.mark.parametrize(
    "bad",
    [
        {"repetitions": 0},
        {"snapshot_frequencies": [0]},
        {"updates": [0]},
        {"snapshot_frequencies": []},
    ],
)
def test_plan_rejects_bad_parameters(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        _plan(**bad)


# --------------------------------------------------------------------------- digests


def _row(cell: str, mode: str, digest: str, status: str = "ok", **extra: Any) -> dict[str, Any]:
    return {
        "cell_id": cell,
        "mode": mode,
        "snapshot_frequency": None if mode == "full" else 10,
        "cache": "none",
        "digest": digest,
        "status": status,
        **extra,
    }


def test_a_digest_mismatch_fails_both_rows_of_the_pair_only() -> None:
    rows = [
        _row("a", "full", "x"),
        _row("a", "delta", "y"),
        _row("b", "full", "x"),
        _row("b", "delta", "x"),
        _row("c", "full", "x"),
        _row("c", "delta", "zzz", status="error"),  # a crashed case has nothing to compare
    ]
    failures = check_cell_digests(rows)
    assert len(failures) == 1 and failures[0].startswith("a:")
    assert [r["status"] for r in rows] == [
        "digest_mismatch",
        "digest_mismatch",
        "ok",
        "ok",
        "ok",
        "error",
    ]


class FakeChild:
    """Stands in for the child process: returns a digest per mode, records calls."""

    def __init__(self, digests: Mapping[str, str] | None = None) -> None:
        self.digests = dict(digests or {})
        self.cases: list[dict[str, Any]] = []

    def __call__(self, case: Mapping[str, Any], timeout: float | None) -> dict[str, Any]:
        self.cases.append(dict(case))
        digest = self.digests.get(f"{case['backend']}:{case['mode']}", "same")
        return {
            "status": "ok",
            "digest": digest,
            "turns_per_s": 100.0 if case["backend"].startswith("langgraph") else 150.0,
            "write_total_s": case["updates"]
            / (100.0 if case["backend"].startswith("langgraph") else 150.0),
            "logical_bytes": 1000 if case["mode"] == "full" else 100,
        }


def test_runner_writes_final_statuses_and_exits_nonzero_on_a_digest_mismatch(
    tmp_path: Path,
) -> None:
    plan = _plan(
        backends=["memory://", "langgraph:memory"],
        updates=[10],
        repetitions=1,
        snapshot_frequencies=[10],
    )
    child = FakeChild({"memory://:delta": "different"})
    out = tmp_path / "run.jsonl"
    outcome = run_checkpoint_plan(
        plan, backend_urls={}, output=out, options=RunOptions(), child=child
    )
    assert outcome.exit_code == 1
    data = read_jsonl(out)
    statuses = {(r["backend"], r["mode"]): r["status"] for r in data.rows}
    assert statuses == {
        ("memory://", "full"): "digest_mismatch",
        ("memory://", "delta"): "digest_mismatch",
        ("langgraph:memory", "full"): "ok",
        ("langgraph:memory", "delta"): "ok",
    }
    assert outcome.failures and "memory://" in outcome.failures[0]
    # the child got the real URL separately from the row
    assert all("backend_url" in c for c in child.cases)
    assert all("backend_url" not in r for r in data.rows)


def test_runner_emits_skipped_rows_and_never_runs_them(tmp_path: Path) -> None:
    plan = _plan(
        backends=["memory://"], updates=[10, 3000], repetitions=1, snapshot_frequencies=[10]
    )
    child = FakeChild()
    out = tmp_path / "run.jsonl"
    outcome = run_checkpoint_plan(
        plan, backend_urls={}, output=out, options=RunOptions(), child=child
    )
    assert outcome.exit_code == 0
    assert {c["updates"] for c in child.cases} == {10}
    rows = read_jsonl(out).rows
    assert sorted((r["updates"], r["mode"], r["status"]) for r in rows) == [
        (10, "delta", "ok"),
        (10, "full", "ok"),
        (3000, "delta", "skipped"),
        (3000, "full", "skipped"),
    ]


def test_profiled_rows_are_marked(tmp_path: Path) -> None:
    plan = _plan(backends=["memory://"], updates=[10], repetitions=1, snapshot_frequencies=[10])
    child = FakeChild()
    out = tmp_path / "run.jsonl"
    run_checkpoint_plan(
        plan,
        backend_urls={},
        output=out,
        options=RunOptions(profile_dir=tmp_path / "prof"),
        child=child,
    )
    rows = read_jsonl(out).rows
    assert rows and all(r["profiled"] for r in rows)
    assert all(c["profile_path"].startswith(str(tmp_path / "prof")) for c in child.cases)
    summary = summarize([read_jsonl(out)])
    assert summary.checkpoint == []
    assert any("profiled" in w for w in summary.warnings)


# --------------------------------------------------------------------------- summarize


def _file(
    tmp_path: Path,
    name: str,
    backends: list[str],
    reps: int = 2,
    digests: Mapping[str, str] | None = None,
) -> Path:
    plan = _plan(backends=backends, updates=[10], repetitions=reps, snapshot_frequencies=[10])
    out = tmp_path / name
    run_checkpoint_plan(
        plan, backend_urls={}, output=out, options=RunOptions(), child=FakeChild(digests)
    )
    return out


def test_summary_takes_medians_over_paired_repetitions_and_ratios(tmp_path: Path) -> None:
    path = _file(tmp_path, "a.jsonl", ["memory://", "langgraph:memory"])
    summary = summarize([read_jsonl(path)])
    by = {(e["backend"], e["mode"]): e for e in summary.checkpoint}
    assert set(by) == {
        ("memory://", "full"),
        ("memory://", "delta"),
        ("langgraph:memory", "full"),
        ("langgraph:memory", "delta"),
    }
    delta = by[("memory://", "delta")]
    assert delta["repetitions"] == 2
    assert delta["delta_full_bytes"] == pytest.approx(0.1)
    assert delta["peer_turns_per_s"] == pytest.approx(1.5)
    assert delta["peer_backend"] == "langgraph:memory"
    assert by[("langgraph:memory", "full")].get("peer_turns_per_s") is None
    # the ceiling is the stock in-memory saver in full mode, for both of our modes
    assert delta["ceiling_turns_per_s"] == pytest.approx(1.5)
    assert by[("memory://", "full")]["ceiling_turns_per_s"] == pytest.approx(1.5)
    assert by[("langgraph:memory", "delta")].get("ceiling_turns_per_s") is None


def test_no_ceiling_ratio_without_the_in_memory_peer(tmp_path: Path) -> None:
    path = _file(tmp_path, "a.jsonl", ["memory://"])
    summary = summarize([read_jsonl(path)])
    assert all(e.get("ceiling_turns_per_s") is None for e in summary.checkpoint)


def test_a_row_whose_pair_failed_is_left_out(tmp_path: Path) -> None:
    path = _file(tmp_path, "a.jsonl", ["memory://"], reps=1)
    data = read_jsonl(path)
    for row in data.rows:
        if row["mode"] == "full":
            row["status"] = "timeout"
    summary = summarize([data])
    assert summary.checkpoint == []
    assert any("timeout" in w for w in summary.warnings)


def test_summarize_never_pairs_across_files(tmp_path: Path) -> None:
    ours = _file(tmp_path, "ours.jsonl", ["memory://"])
    peer = _file(tmp_path, "peer.jsonl", ["langgraph:memory"])
    summary = summarize([read_jsonl(ours), read_jsonl(peer)])
    assert len(summary.checkpoint) == 4
    assert all(e.get("peer_turns_per_s") is None for e in summary.checkpoint)
    # the same file twice stays two separate summaries
    twice = summarize([read_jsonl(ours), read_jsonl(ours)])
    assert len(twice.checkpoint) == 4
    assert {e["file_index"] for e in twice.checkpoint} == {0, 1}
    assert all(e["repetitions"] == 2 for e in twice.checkpoint)


def test_measurement_ratios_use_the_reference_of_the_same_case(tmp_path: Path) -> None:
    from runstore.bench.common import BenchFile

    def m(backend: str, case_backend: str, value: float, ref: str | None) -> dict[str, Any]:
        return {
            "schema_version": 1,
            "record": "row",
            "bench": "events",
            "status": "ok",
            "case_backend": case_backend,
            "backend": backend,
            "op": "put_batch",
            "variant": "20",
            "metric": "rate_per_s",
            "rate_per_s": value,
            "reference": {"backend": ref, "op": "put_batch", "variant": "20"} if ref else None,
        }

    f = BenchFile(
        "x",
        rows=[
            m("sqlite://a", "sqlite://a", 50.0, "raw:aiosqlite"),
            m("raw:aiosqlite", "sqlite://a", 100.0, None),
            m("sqlite://b", "sqlite://b", 90.0, "raw:aiosqlite"),
            m("raw:aiosqlite", "sqlite://b", 100.0, None),
            m("raw:aiosqlite", "sqlite://b", 200.0, None),
        ],
    )
    summary = summarize([f])
    ratios = {e["backend"]: e.get("ratio") for e in summary.measurements if e.get("ratio")}
    assert ratios == {"sqlite://a": pytest.approx(0.5), "sqlite://b": pytest.approx(0.6)}


# --------------------------------------------------------------------------- JSONL schema


def test_jsonl_has_a_versioned_run_record_then_rows(tmp_path: Path) -> None:
    path = _file(tmp_path, "a.jsonl", ["memory://"], reps=1)
    lines = [orjson.loads(x) for x in path.read_text().splitlines()]
    run = lines[0]
    assert run["record"] == "run" and run["schema_version"] == SCHEMA_VERSION
    for key in (
        "run_id",
        "bench",
        "started_at",
        "git_sha",
        "versions",
        "platform",
        "argv",
        "params",
    ):
        assert key in run
    assert "langgraph" in run["versions"] and "python" in run["platform"]
    for row in lines[1:]:
        assert row["record"] == "row" and row["schema_version"] == SCHEMA_VERSION
        assert row["run_id"] == run["run_id"] and row["bench"] == "checkpoint"
        for key in (
            "case_id",
            "cell_id",
            "backend",
            "mode",
            "updates",
            "payload_bytes",
            "snapshot_frequency",
            "cache",
            "seed",
            "repetition",
            "status",
            "profiled",
        ):
            assert key in row


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"record": "row"}', "schema_version"),
        ('{"record": "row", "schema_version": 999}', "newer"),
        ('{"record": "what", "schema_version": 1}', "unknown record"),
        ("not json", "not JSON"),
    ],
)
def test_reader_rejects_unknown_schema(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(BenchSchemaError, match=message):
        read_jsonl(path)


# --------------------------------------------------------------------------- child process


def test_child_timeout_and_error_become_statuses() -> None:
    slow = run_child({"bench": "selftest", "sleep": 30}, timeout=1.0)
    assert slow["status"] == "timeout"
    broken = run_child({"bench": "selftest", "fail": True}, timeout=60)
    assert broken["status"] == "error" and "selftest failure" in broken["error"]
    fine = run_child({"bench": "selftest", "digest": "abc"}, timeout=60)
    assert fine["status"] == "ok" and fine["digest"] == "abc"


# --------------------------------------------------------------------------- output forms


def test_passwords_stay_out_of_rows_and_per_backend_settings_parse(tmp_path: Path) -> None:
    from runstore.bench.runner import backend_name, display_backend
    from runstore.bench.targets import split_backend

    raw = "postgresql://bench:s3cret@db.example:5432/app|sqlite.synchronous=full"
    label = display_backend(raw)
    assert "s3cret" not in label and label.endswith("|sqlite.synchronous=full")
    assert backend_name("sqlite://|sqlite.synchronous=full") == "sqlite"
    assert backend_name("langgraph:sqlite") == "sqlite"
    url, settings = split_backend("sqlite://|sqlite.synchronous=full|postgres.pool_max_size=3")
    assert url == "sqlite://"
    assert settings == {"sqlite": {"synchronous": "full"}, "postgres": {"pool_max_size": 3}}
    plan = _plan(backends=[label], updates=[10], repetitions=1, snapshot_frequencies=[10])
    child = FakeChild()
    out = tmp_path / "run.jsonl"
    run_checkpoint_plan(
        plan, backend_urls={label: raw}, output=out, options=RunOptions(), child=child
    )
    assert "s3cret" not in out.read_text()
    assert all(c["backend_url"] == raw for c in child.cases)


def test_csv_and_plot_render(tmp_path: Path) -> None:
    from runstore.bench.summarize import plot, to_csv
    from runstore.bench.tables import to_markdown

    path = _file(tmp_path, "a.jsonl", ["memory://", "langgraph:memory"])
    summary = summarize([read_jsonl(path)])
    text = to_csv(summary)
    header = text.splitlines()[0].split(",")
    assert "delta_full_write" in header and "peer_turns_per_s" in header
    assert len(text.strip().splitlines()) == 1 + len(summary.checkpoint)
    md = to_markdown(summary).splitlines()
    assert md[0].startswith("| backend |") and len(md) == 2 + len(summary.checkpoint)
    pytest.importorskip("matplotlib")
    png = tmp_path / "plot.png"
    plot(summary, str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_raw_rows_follow_the_store_table_and_decode_back() -> None:
    import random

    from runstore.bench.events import decode_rows, make_events, raw_rows
    from runstore.events.schema import INSERT_COLUMNS, RECORD_COLUMNS

    events = make_events("t", 0, 4, random.Random(1))
    rows = raw_rows(events, 7, INSERT_COLUMNS)
    assert all(len(r) == len(INSERT_COLUMNS) for r in rows)
    seq_at = list(INSERT_COLUMNS).index("seq")
    assert [r[seq_at] for r in rows] == [7, 8, 9, 10]
    names = [c.strip() for c in RECORD_COLUMNS.split(",")]
    selected = [tuple(r[list(INSERT_COLUMNS).index(n)] for n in names) for r in reversed(rows)]
    decoded = decode_rows(selected, RECORD_COLUMNS)
    assert [d["seq"] for d in decoded] == [7, 8, 9, 10]
    assert decoded[0]["metadata"] == events[0]["metadata"]


def test_measurement_cases_expand_into_rows(tmp_path: Path) -> None:
    from runstore.bench.runner import run_measurement_cases

    def child(case: Mapping[str, Any], timeout: float | None) -> dict[str, Any]:
        ref = {"backend": "raw:x", "op": "put_batch", "variant": "20"}
        return {
            "status": "ok",
            "measurements": [
                {
                    "op": "put_batch",
                    "variant": "20",
                    "backend": case["backend"],
                    "metric": "rate_per_s",
                    "rate_per_s": 50.0,
                    "reference": ref,
                },
                {
                    "op": "put_batch",
                    "variant": "20",
                    "backend": "raw:x",
                    "metric": "rate_per_s",
                    "rate_per_s": 100.0,
                    "reference": None,
                },
            ],
        }

    out = tmp_path / "ev.jsonl"
    outcome = run_measurement_cases(
        "events",
        ["memory://"],
        output=out,
        options=RunOptions(),
        repetitions=2,
        params={"batch_size": 20},
        argv=[],
        reporter=None,
        child=child,
    )
    assert outcome.exit_code == 0
    rows = read_jsonl(out).rows
    assert len(rows) == 4 and {r["repetition"] for r in rows} == {0, 1}
    summary = summarize([read_jsonl(out)])
    store = next(e for e in summary.measurements if e["backend"] == "memory://")
    assert store["repetitions"] == 2 and store["ratio"] == pytest.approx(0.5)


def test_gc_timer_counts_collections_per_generation() -> None:
    import gc

    from runstore.bench.common import GcTimer

    with GcTimer() as timer:
        gc.collect(0)
        gc.collect(2)
    gc.collect(1)  # after the block: not counted
    assert timer.collections == [1, 0, 1]
    assert timer.seconds > 0



def test_events_rejects_threads_too_small_for_random_cursors(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from runstore.bench.cli import bench_group

    out = tmp_path / "events.jsonl"
    result = CliRunner().invoke(
        bench_group,
        ["events", "-b", "memory://", "--thread-sizes", "1000,60", "-o", str(out), "-q"],
    )
    assert result.exit_code == 2
    assert "at least 2 x --page-size (100); got [60]" in result.output
    assert not out.exists(), "nothing runs and no file is written"
