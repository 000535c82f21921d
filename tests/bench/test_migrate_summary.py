"""`bench migrate` rows summarize per source size: runstore against the naive loop of the
same size, peak RSS against the smallest size, the resume case's damage counts. No timing
is asserted: the rows are made up."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from runstore.bench.common import SCHEMA_VERSION, read_jsonl
from runstore.bench.summarize import summarize
from runstore.bench.tables import MIGRATE_COLUMNS, fit, tables


def _row(method: str, threads: int, status: str = "ok", **extra: Any) -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "record": "row", "bench": "migrate", "method": method,
            "threads": threads, "turns": 17, "source_checkpoints": threads * 51, "status": status,
            "case_id": f"{method}|{threads}", **extra}  # fmt: skip


def test_migrate_rows_become_one_entry_per_size_with_ratios(tmp_path: Path) -> None:
    rows = [
        {"schema_version": SCHEMA_VERSION, "record": "run", "bench": "migrate", "run_id": "r"},
        _row("runstore", 200, checkpoints_per_s=5000.0, peak_rss_bytes=100 * 2**20),
        _row("runstore", 200, checkpoints_per_s=7000.0, peak_rss_bytes=100 * 2**20),
        _row("naive", 200, checkpoints_per_s=500.0, peak_rss_bytes=90 * 2**20),
        _row("resume", 200, missing=0, duplicated=0, mismatched=0),
        _row("runstore", 2000, checkpoints_per_s=6000.0, peak_rss_bytes=110 * 2**20),
        _row("naive", 2000, "skipped", error="naive loop not run above --naive-max-threads 200"),
        _row("naive", 2000, "timeout", error="too slow"),
    ]
    path = tmp_path / "migrate.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    summary = summarize([read_jsonl(path)])
    small, large = summary.migrate
    assert (small["threads"], small["runstore_per_s"], small["x_naive"], small["runstore_n"]) == (200, 6000.0, 12.0, 2)
    assert (small["resume_runs"], small["resume_missing"], small["resume_duplicated"]) == (1, 0, 0)
    assert large["x_naive"] is None and large["naive_per_s"] is None
    assert abs(large["rss_vs_smallest"] - 1.1) < 1e-9 and "rss_vs_smallest" not in small
    assert any("naive|2000" in w for w in summary.warnings)  # the timeout is named, the skip is not
    [(title, entries, columns)] = tables(summary)
    assert title == "migrate" and columns == MIGRATE_COLUMNS
    shown = fit(entries, columns, 120)
    assert [c.key for c in shown.columns][:4] == ["threads", "turns", "source_checkpoints", "x_naive"]
    assert shown.rows[0][3] == "12.0"


def test_the_command_refuses_unknown_methods_and_tiny_sizes_before_running(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from runstore.bench.cli import bench_group

    out = tmp_path / "migrate.jsonl"
    for argv, message in ((["--methods", "runstore,copy"], "unknown methods ['copy']"),
                          (["--threads", "1"], "at least 2 threads")):  # fmt: skip
        result = CliRunner().invoke(bench_group, ["migrate", *argv, "-o", str(out), "-q"])
        assert result.exit_code == 2 and message in result.output
    assert not out.exists(), "nothing runs and no file is written"
    hidden = CliRunner().invoke(bench_group, ["migrate", "--help"]).output
    assert "--postgres-url" in hidden and "--postgres " not in hidden
