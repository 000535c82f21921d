"""The SQL run stores underneath the contract: constraints, locks, driver errors, cancellation."""

from __future__ import annotations

import asyncio
import random
import sqlite3
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from runstore.clock import ManualClock
from runstore.errors import BackendUnavailableError, RunError, SchemaNotSetUpError
from runstore.options import BackendOptions
from runstore.runs.protocol import RunStore
from runstore.settings import Settings
from runstore.urls import BackendURL

EPOCH = datetime(2001, 1, 1, tzinfo=UTC)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest) -> str:
    """A fresh database of each dialect (PostgreSQL: a fresh schema)."""
    return str(request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "postgres_url"))


OpenStore = Callable[..., Any]


@pytest.fixture
async def open_store(db_url: str) -> AsyncIterator[OpenStore]:
    """Open run stores on ``db_url`` (each call: its own BackendOptions), closed at teardown."""
    scopes: list[BackendOptions] = []

    async def opener(**settings: Any) -> RunStore:
        from runstore.loader import get_backends

        options = BackendOptions(settings=Settings().merged(settings))
        scopes.append(options)
        url = BackendURL.parse(db_url)
        store: RunStore = await get_backends().runs.for_url(url).open(url, options)
        store.clock = ManualClock(EPOCH)
        return store

    yield opener
    for options in reversed(scopes):
        await options.aclose()


async def _raw(db_url: str) -> Any:
    """A raw driver connection to the same database, outside the store's pool."""
    url = BackendURL.parse(db_url)
    if url.scheme == "sqlite":
        return sqlite3.connect(str(url.file_path()), isolation_level=None)
    import asyncpg

    schema = url.option("schema")
    conn = await asyncpg.connect(url.without_query("schema").render(hide_password=False))
    await conn.execute(f'SET search_path TO "{schema}"')
    return conn


async def _execute(raw: Any, sql: str) -> Any:
    if isinstance(raw, sqlite3.Connection):
        return raw.execute(sql).fetchall()
    return await raw.fetch(sql)


async def _close(raw: Any) -> None:
    result = raw.close()
    if asyncio.iscoroutine(result):
        await result


async def test_the_database_allows_one_active_run_per_thread(open_store: OpenStore, db_url: str) -> None:
    """The partial unique index refuses a second active row, whatever code writes it."""
    store = await open_store()
    await store.create("t", run_id="a")
    raw = await _raw(db_url)
    try:
        with pytest.raises(Exception, match="(?i)unique|duplicate"):
            await _execute(
                raw,
                "INSERT INTO runstore_runs (run_id, thread_id, seq, status, active, kind, metadata, "
                "created_at, updated_at) VALUES ('b', 't', 2, 'pending', TRUE, 'run', '{}', 0, 0)",
            )
    finally:
        await _close(raw)


async def test_driver_errors_are_run_errors_with_the_cause(open_store: OpenStore, db_url: str) -> None:
    store = await open_store()
    await store.create("t", run_id="a")
    raw = await _raw(db_url)
    try:
        await _execute(raw, "ALTER TABLE runstore_runs DROP COLUMN metadata")
    finally:
        await _close(raw)
    with pytest.raises(RunError) as info:
        await store.create("t", run_id="b")
    assert info.value.__cause__ is not None and "metadata" in str(info.value.__cause__)
    assert not isinstance(info.value, BackendUnavailableError)
    with pytest.raises(RunError) as info:
        await store.get("a")
    assert info.value.__cause__ is not None


async def test_a_missing_table_says_to_call_setup(open_store: OpenStore, db_url: str) -> None:
    store = await open_store()
    raw = await _raw(db_url)
    try:
        await _execute(raw, "DROP TABLE runstore_runs")
    finally:
        await _close(raw)
    with pytest.raises(SchemaNotSetUpError, match=r"setup\(\)") as info:
        await store.create("t", run_id="b")
    assert "runstore_runs" in str(info.value.__cause__)


async def test_a_locked_sqlite_file_is_unavailable_and_nothing_is_written(sqlite_url: str, tmp_path: Any) -> None:
    options = BackendOptions(settings=Settings().merged({"sqlite": {"busy_timeout_ms": 50}}))
    from runstore.plugins.sqlite.runs import SqliteRunStore

    try:
        store = await SqliteRunStore.open(BackendURL.parse(sqlite_url), options)
        blocker = sqlite3.connect(str(BackendURL.parse(sqlite_url).file_path()), isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(BackendUnavailableError) as info:
                await store.create("t", run_id="a")
            assert info.value.write_may_have_happened is False
            assert isinstance(info.value.__cause__, sqlite3.OperationalError)
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert await store.list_by_thread("t") == []
        assert (await store.create("t", run_id="a")).outcome == "created"
    finally:
        await options.aclose()


@pytest.mark.postgres
async def test_claims_skip_threads_locked_by_another_transaction(postgres_url: str) -> None:
    """A claimer never waits on a thread another transaction holds: it takes the others."""
    options = BackendOptions()
    from runstore.plugins.postgres.runs import PostgresRunStore

    try:
        store = await PostgresRunStore.open(BackendURL.parse(postgres_url), options)
        clock = store.clock = ManualClock(EPOCH)
        for name in ("a", "b"):
            await store.create(f"t-{name}", run_id=name)
            await store.start(name, "dead", 1)
        clock.advance(60)
        raw = await _raw(postgres_url)
        try:
            async with raw.transaction():
                await raw.execute("SELECT 1 FROM runstore_run_threads WHERE thread_id = 't-a' FOR UPDATE")
                got = await asyncio.wait_for(store.claim_expired("c", 60, grace=0), timeout=30)
                assert [r["run_id"] for r in got] == ["b"]
        finally:
            await _close(raw)
        assert [r["run_id"] for r in await store.claim_expired("c", 60, grace=0)] == ["a"]
    finally:
        await options.aclose()


async def test_cancelled_calls_write_all_or_nothing(open_store: OpenStore, db_url: str) -> None:
    """Calls cancelled at random points: each thread shows the call entirely or not at all,
    the store keeps working, and no pooled connection is left inside a transaction."""
    store = await open_store()
    rng = random.Random(7)
    threads = [f"t{i}" for i in range(30)]
    for thread in threads:
        await store.create(thread, run_id=f"{thread}-old")
    cancelled = 0
    for thread in threads:
        # interrupt: the old run is interrupted AND the new one created, or neither.
        task = asyncio.ensure_future(
            store.create(thread, run_id=f"{thread}-new", multitask_strategy="interrupt")
        )
        for _ in range(rng.randrange(0, 6)):
            await asyncio.sleep(0)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            cancelled += 1
        runs = {r["run_id"]: r for r in await store.list_by_thread(thread)}
        old = runs[f"{thread}-old"]
        if f"{thread}-new" in runs:
            assert old["status"] == "interrupted" and not old["active"]
            assert runs[f"{thread}-new"]["active"]
        else:
            assert old["status"] == "pending" and old["active"], f"half a create on {thread}: {runs}"
    assert cancelled > 0, "no call was cancelled mid-way; the test proved nothing"
    # Still working, and every pooled connection is out of any transaction.
    assert (await store.create("after", run_id="after")).outcome == "created"
    if BackendURL.parse(db_url).scheme != "sqlite":
        engine = store._driver._engine  # type: ignore[attr-defined]
        conns = [await engine.connect() for _ in range(3)]
        try:
            for conn in conns:
                raw = (await conn.get_raw_connection()).driver_connection
                assert not raw.is_in_transaction()
        finally:
            for conn in conns:
                await conn.close()
