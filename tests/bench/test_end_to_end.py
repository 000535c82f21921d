"""One tiny real run of ``runstore bench checkpoint`` as a subprocess, parsed from JSONL."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

from runstore.bench.common import read_jsonl


def _runstore() -> list[str]:
    script = Path(sys.executable).parent / "runstore"
    return [str(script)] if script.exists() else [sys.executable, "-m", "runstore.bench"]


def test_tiny_checkpoint_run_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    cmd = [*_runstore()]
    if cmd[-1] != "runstore.bench":
        cmd.append("bench")
    proc = subprocess.run(
        [
            *cmd,
            "checkpoint",
            "--backends",
            "memory://",
            "--updates",
            "5",
            "--repetitions",
            "1",
            "--snapshot-frequencies",
            "2",
            "--output",
            str(out),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = read_jsonl(out)
    assert len(data.runs) == 1
    rows = data.rows
    assert sorted(r["mode"] for r in rows) == ["delta", "full"]
    assert all(r["status"] == "ok" for r in rows), rows
    assert len({r["digest"] for r in rows}) == 1
    for r in rows:
        assert r["messages"] == 10
        assert r["checkpoint_rows"] > 0 and r["write_rows"] > 0 and r["logical_bytes"] > 0
        assert r["peak_rss_bytes"] > 0
        assert r["gc_tracked_objects"] > 0 and r["write_gc_ms"] >= 0
        assert len(r["write_gc_collections"]) == 3
        for key in (
            "turn_p50_ms",
            "turn_p95_ms",
            "turn_p99_ms",
            "window_first_ms",
            "window_middle_ms",
            "window_last_ms",
            "warm_read_ms",
            "cold_read_ms",
        ):
            assert r[key] is not None, key
    summary = orjson.loads(proc.stdout)
    assert {e["mode"] for e in summary["checkpoint"]} == {"full", "delta"}


def _bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [*_runstore()]
    if cmd[-1] != "runstore.bench":
        cmd.append("bench")
    return subprocess.run(
        [*cmd, *args, "--repetitions", "1", "--output", str(tmp_path / "run.jsonl"), "--json"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False,
    )  # fmt: skip


def test_tiny_runs_bench_end_to_end(tmp_path: Path) -> None:
    proc = _bench(tmp_path, "runs", "--backends", "memory://", "--cycles", "20", "--renewals", "20")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_jsonl(tmp_path / "run.jsonl").rows
    assert sorted(r["op"] for r in rows) == ["create_start_finalize", "renew"]
    assert all(r["status"] == "ok" and r["rate_per_s"] > 0 and r["count"] == 20 for r in rows), rows
    assert {m["op"] for m in orjson.loads(proc.stdout)["measurements"]} == {
        "create_start_finalize", "renew",
    }  # fmt: skip


def test_fenced_checkpoint_bench_reports_the_ratio(tmp_path: Path) -> None:
    proc = _bench(
        tmp_path, "checkpoint", "--backends", "memory://", "--updates", "4",
        "--snapshot-frequencies", "2", "--fenced",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_jsonl(tmp_path / "run.jsonl").rows
    assert rows and all(r["fence_turns_ratio"] > 0 for r in rows), rows
    # The fenced thread was fenced first: a turn with an older token is refused.
    assert all(r["fence_stale_refused"] is True for r in rows), rows
    assert all(e["fence_turns_ratio"] is not None for e in orjson.loads(proc.stdout)["checkpoint"])


def test_tiny_threads_bench_end_to_end(tmp_path: Path) -> None:
    proc = _bench(
        tmp_path, "threads", "--backends", "sqlite://", "--threads", "4", "--turns", "15",
        "--keep-last", "3", "--index-small", "60", "--index-large", "300",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {(r["op"], r["variant"]): r for r in read_jsonl(tmp_path / "run.jsonl").rows}
    size = rows[("size", "4x15 keep 3")]
    assert size["checkpoints_removed"] == 4 * 12 and size["size_after_bytes"] < size["size_before_bytes"]
    assert rows[("sweep", "4x15 keep 3")]["rate_per_s"] > 0
    large = rows[("list_threads filtered", "300")]
    assert large["reference"] == {"backend": "sqlite://", "op": "list_threads filtered", "variant": "60"}


def test_tiny_store_bench_end_to_end(tmp_path: Path) -> None:
    proc = _bench(
        tmp_path, "store", "--backends", "sqlite://", "--items", "30", "--calls", "10",
        "--queries", "5", "--dims", "8",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [r for r in read_jsonl(tmp_path / "run.jsonl").rows if r.get("op")]
    ops = {(r["backend"], r["op"]) for r in rows}
    for backend in ("runstore sqlite", "langgraph sqlite"):
        assert {(backend, op) for op in ("put", "get", "filtered_search")} <= ops
    assert {("runstore sqlite", "semantic_search"), ("numpy", "semantic_search")} <= ops
    assert all(r["status"] == "ok" and r["rate_per_s"] > 0 for r in rows), rows
    ratios = {(m["backend"], m["op"]): m.get("ratio") for m in orjson.loads(proc.stdout)["measurements"]}
    assert ratios[("runstore sqlite", "put")] is not None
    assert ratios[("runstore sqlite", "semantic_search")] is not None


def test_fenced_load_bench_fences_every_store_and_reports_the_ratio(tmp_path: Path) -> None:
    proc = _bench(
        tmp_path, "load", "--stacks", "embedded", "--modes", "full", "--concurrency", "2",
        "--turns", "2", "--fenced",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["fenced"]: r for r in read_jsonl(tmp_path / "run.jsonl").rows}
    assert set(rows) == {False, True} and all(r["status"] == "ok" for r in rows.values()), rows
    fenced, unfenced = rows[True], rows[False]
    # sqlite saver and event store and the memory bridge all declare fencing.
    assert fenced["fenced_stores"] == ["checkpointer", "events", "streams"]
    assert unfenced["fenced_stores"] == [] and "fence_stale_refused" not in unfenced
    # After the run each store refuses a write carrying a token older than the last run's.
    assert fenced["fence_stale_refused"] is True
    assert fenced["fence_stale_refused_by"] == {"checkpointer": True, "events": True, "streams": True}
    # Fenced writes land like unfenced ones: the same final states and journals.
    assert fenced["digest"] == unfenced["digest"]
    (entry,) = [e for e in orjson.loads(proc.stdout)["load"] if e["fenced"]]
    assert entry["stack"] == "embedded+fenced" and entry["fence_turns_ratio"] > 0
