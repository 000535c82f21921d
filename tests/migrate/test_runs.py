"""Run stores move with their runs as stored: statuses, times, idempotency keys, queue
order and fencing counters. A running (leased) run is refused by name unless
``--include-active``, which copies it orphaned for the destination's recovery."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runstore.errors import ActiveRunsError
from runstore.migrate.endpoints import open_endpoint
from runstore.migrate.engine import MigrateOptions
from runstore.migrate.transfer import run_migrate
from runstore.urls import BackendURL


async def populate(url: str) -> str:
    """A finished run with an idempotency key, a running one and one queued behind it; the running id."""
    async with open_endpoint(url, ["runs"]) as side:
        runs = side.runs
        done = await runs.create(thread_id="t1", kind="run", idempotency_key="k-1", metadata={"a": 1})
        await runs.start(done.run["run_id"], "worker-a", 30)
        await runs.finalize(done.run["run_id"], "worker-a", "success")
        running = await runs.create(thread_id="t1", kind="run")
        await runs.start(running.run["run_id"], "worker-a", 30)
        await runs.create(thread_id="t1", kind="wait", multitask_strategy="enqueue")
        await runs.create(thread_id="t2", kind="run")
        return str(running.run["run_id"])


def strip_lease(records: list[Any]) -> list[Any]:
    return [{**r, "lease_expires_at": None} for r in records]


async def test_runs_move_as_stored_and_an_active_run_is_refused_by_name(tmp_path: Path, postgres_url: str) -> None:
    source = BackendURL.for_file("sqlite", tmp_path / "a.db").render()
    running = await populate(source)
    options = MigrateOptions(kinds=(), ledger=tmp_path / "ledger")
    with pytest.raises(ActiveRunsError, match=running) as caught:
        await run_migrate(source, postgres_url, options, ["runs"])
    assert "--include-active" in str(caught.value)
    async with open_endpoint(postgres_url, ["runs"]) as b:
        assert await b.runs.list_by_thread("t1") == []

    options = MigrateOptions(kinds=(), ledger=tmp_path / "ledger", include_active=True)
    report = await run_migrate(source, postgres_url, options, ["runs"])
    assert report.counts["runs"].copied == 4 and not any(report.mismatches.values())
    again = await run_migrate(source, postgres_url, MigrateOptions(kinds=(), ledger=tmp_path / "ledger",
                                                                   include_active=True), ["runs"])  # fmt: skip
    assert again.counts["runs"].copied == 0
    async with open_endpoint(source, ["runs"]) as a, open_endpoint(postgres_url, ["runs"]) as b:
        for thread_id in ("t1", "t2"):
            assert strip_lease(await b.runs.list_by_thread(thread_id)) == strip_lease(await a.runs.list_by_thread(thread_id))
        # The idempotency key holds on the destination: the same create returns the copied run.
        same = await b.runs.create(thread_id="t1", kind="run", idempotency_key="k-1", metadata={"a": 1})
        assert same.outcome == "existing"
        # The orphaned run's lease has long expired: the destination's recovery takes it over,
        # with a fencing token above every token the source handed out.
        claimed = await b.runs.claim_expired("recovery", 30, grace=1)
        assert [r["run_id"] for r in claimed] == [running]
        assert claimed[0]["fence"] > (await a.runs.get(running))["fence"]
