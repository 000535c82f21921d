"""A caller waiting for a pooled PostgreSQL connection is served, never starved by parked ones.

The saver and the event store share one engine's pool and each keeps a few connections
parked between calls. With every connection parked or in use, a caller waiting on the
pool must get the next connection that frees up (and the parked ones of the other
store), not wait while later callers reuse parked connections.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from runstore.options import BackendOptions
from runstore.plugins.postgres.connections import PostgresCalls
from runstore.plugins.postgres.engine import shared_engine
from runstore.plugins.postgres.settings import PostgresTimeouts
from runstore.settings import Settings
from runstore.urls import BackendURL

TIMEOUTS = PostgresTimeouts(connect=5.0, command=5.0, operation=20.0)


async def _one(conn: Any) -> Any:
    return await conn.fetchval("SELECT 1")


@pytest.fixture
async def engine(postgres_url: str) -> AsyncIterator[Any]:
    settings = Settings.load({"postgres": {"pool_max_size": 2}})
    async with BackendOptions.scope(settings) as options:
        yield await shared_engine(BackendURL.parse(postgres_url), options)


def _holding(leases: PostgresCalls, gate: asyncio.Event) -> asyncio.Task[Any]:
    async def hold(conn: Any) -> Any:
        await gate.wait()
        return await conn.fetchval("SELECT 2")

    return asyncio.create_task(leases.run(hold, operation="hold"))


async def test_a_waiter_gets_the_connection_another_store_parked(engine: Any) -> None:
    first = PostgresCalls(engine, 1, backend="first", timeouts=TIMEOUTS)
    second = PostgresCalls(engine, 1, backend="second", timeouts=TIMEOUTS)
    try:
        await first.run(_one, operation="warm")
        await second.run(_one, operation="warm")  # both park one: the pool has none left
        gate = asyncio.Event()
        holder = _holding(first, gate)  # takes first's parked connection and keeps it
        await asyncio.sleep(0.05)
        # Only the connection second parked can serve this call.
        assert await asyncio.wait_for(first.run(_one, operation="wait"), 5) == 1
        gate.set()
        assert await holder == 2
    finally:
        await first.aclose()
        await second.aclose()


async def test_a_waiter_gets_the_next_connection_a_call_returns(engine: Any) -> None:
    leases = PostgresCalls(engine, 1, backend="store", timeouts=TIMEOUTS)
    try:
        keep, release = asyncio.Event(), asyncio.Event()
        kept = _holding(leases, keep)
        released = _holding(leases, release)  # the two hold the whole pool
        await asyncio.sleep(0.05)
        waiter = asyncio.create_task(leases.run(_one, operation="wait"))
        await asyncio.sleep(0.05)
        release.set()
        assert await released == 2
        # The freed connection goes to the waiter, not into the parked list.
        assert await asyncio.wait_for(waiter, 5) == 1
        keep.set()
        assert await kept == 2
    finally:
        await leases.aclose()
