"""`runstore bench load` reads the local servers' CPU from /proc: a PostgreSQL backend's
work counts even after it exited (through the postmaster's reaped-children counters)."""

from __future__ import annotations

import asyncio

import asyncpg

from runstore.bench.servercpu import per_turn_ms, server_cpu_seconds
from runstore.urls import BackendURL


async def test_an_exited_backends_cpu_still_counts(postgres_url: str, redis_url: str) -> None:
    before = server_cpu_seconds()
    assert before is not None and before["postgres"] > 0 and before["redis"] > 0
    dsn = BackendURL.parse(postgres_url).without_query("schema").render(hide_password=False)
    conn = await asyncpg.connect(dsn)
    pid = await conn.fetchval("SELECT pg_backend_pid()")
    # About half a second of one backend's CPU, then the backend exits.
    await conn.fetchval("SELECT count(*) FROM generate_series(1, 8000000)")
    await conn.close()
    observer = await asyncpg.connect(dsn)
    try:
        for _ in range(100):
            if not await observer.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid):
                break
            await asyncio.sleep(0.05)
    finally:
        await observer.close()
    await asyncio.sleep(0.2)  # the postmaster reaps the exited backend
    after = server_cpu_seconds()
    assert after is not None
    assert after["postgres"] - before["postgres"] >= 0.2, (before, after)


def test_per_turn_fields() -> None:
    fields = per_turn_ms({"postgres": 1.0, "redis": 2.0}, {"postgres": 1.5, "redis": 2.0}, 100)
    assert fields == {
        "postgres_cpu_ms_per_turn": 5.0, "redis_cpu_ms_per_turn": 0.0, "server_cpu_ms_per_turn": 5.0
    }  # fmt: skip
    assert set(per_turn_ms(None, None, 10).values()) == {None}
