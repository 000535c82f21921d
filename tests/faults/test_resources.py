"""Resources: after many runs nothing per-run remains on either stack (see soak.py; the
10,000-run soak with RSS is run by hand and recorded in docs/reliability.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .soak import soak, stack

pytestmark = pytest.mark.faults

RUNS = 1000


@pytest.mark.parametrize("name", ["embedded", "servers"])
async def test_nothing_per_run_remains_after_many_runs(name: str, tmp_path: Path, fault_report: Any) -> None:
    with stack(name, tmp_path) as (config, redis_url):
        result = await soak(config, RUNS, redis_url=redis_url, samples=2)
    assert result.leftovers == {
        "bridge_entries": 0, "stream_keys": 0, "keys_without_ttl": 0, "tasks_while_open": result.leftovers[
            "tasks_while_open"], "tasks_after_close": 0, "stream_keys_after_close": 0, "keys_without_ttl_after_close": 0,
    }, result.leftovers
    # While open, a Redis bridge keeps its one reader task; the memory bridge none.
    assert result.leftovers["tasks_while_open"] == (0 if name == "embedded" else 1), result.leftovers
    assert result.events_stored == result.events_written == 2 * RUNS
    assert result.stream_events_delivered > 0
    fault_report.add(f"{name}: {RUNS} runs, per-run state left", trials=RUNS,
                     acknowledged=result.stream_events_acknowledged, lost=0, duplicated=0)
