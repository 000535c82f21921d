"""PostgreSQL connect options on the shared server: the transaction-pooler switch leaves no
prepared statement behind on any connection and sends the saver's hot statements through
the functions wrapping them, session options reach the server, and the pool keeps at most
``pool_max_idle`` idle connections."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from runstore.errors import BackendRefusedError, BackendUnavailableError
from runstore.options import BackendOptions
from runstore.plugins.postgres import sql as saver_sql
from runstore.plugins.postgres.events import PostgresEventStore
from runstore.plugins.postgres.pooler_functions import function_name
from runstore.plugins.postgres.runs import PostgresRunStore
from runstore.plugins.postgres.saver import PostgresSaver
from runstore.settings import Settings
from runstore.sql.dialect import driver_connection
from runstore.urls import BackendURL

from .test_postgres_saver import cfg, put_chain


async def _work_then_inspect(url: str, settings: Settings, sql: str) -> list[Any]:
    """Use the saver, the event store and the run store on ``url``, give every connection
    back to the pool, then run ``sql`` on each pooled connection (raw asyncpg)."""
    async with BackendOptions.scope(settings) as options:
        saver = await PostgresSaver.open(BackendURL.parse(url), options)
        events = await PostgresEventStore.open(BackendURL.parse(url), options)
        runs = await PostgresRunStore.open(BackendURL.parse(url), options)
        for round_ in (uuid.uuid4().hex for _ in range(3)):
            await asyncio.gather(
                put_chain(saver, f"t-pool-{round_}", [{"a": [1]}, {"a": [2]}]),
                events.put(thread_id="t", run_id=f"r{round_}", event_type="x", category="message", content="hi",
                           user_id=None),
                runs.create(f"t-runs-{round_}"),
            )
            assert await saver.aget_tuple(cfg(f"t-pool-{round_}")) is not None
            assert [c async for c in saver.alist(cfg(f"t-pool-{round_}"))]
            assert await events.list_messages("t", user_id=None)
        await saver.aclose()
        await events.close()
        await runs.close()
        engine = saver.engine
        pool = engine.sync_engine.pool
        held = [await engine.connect() for _ in range(pool.checkedin())]  # type: ignore[attr-defined]
        try:
            return [await (await driver_connection(sa_conn)).fetchval(sql) for sa_conn in held]
        finally:
            for sa_conn in held:
                await sa_conn.close()


async def _prepared_counts(url: str, settings: Settings) -> list[int]:
    return await _work_then_inspect(url, settings, "SELECT count(*) FROM pg_prepared_statements")


async def test_pooler_transaction_leaves_no_prepared_statements(postgres_url: str) -> None:
    pooled = BackendURL.parse(postgres_url).with_query(pooler="transaction").render(hide_password=False)
    counts = await _prepared_counts(pooled, Settings())
    assert counts and counts == [0] * len(counts), counts
    # The control: by default asyncpg and SQLAlchemy keep named statements on the connections
    # (the count query is one of them: its own statement is prepared before it runs).
    control = await _prepared_counts(postgres_url, Settings())
    assert max(control) > 1, control


SCHEMA_VERSION = saver_sql.SCHEMA_MIGRATIONS[-1].version
_HOT = {
    "put": saver_sql.PUT_SQL,
    "put_writes": saver_sql.PUT_WRITES_SQL,
    "get_latest": saver_sql.GET_LATEST_SQL,
    "get_by_id": saver_sql.GET_BY_ID_SQL,
}


async def _functions(saver: PostgresSaver) -> set[str]:
    """The hot statements whose wrapping function exists in the saver's schema."""
    names = {function_name(statement, SCHEMA_VERSION): key for key, statement in _HOT.items()}
    async with saver.engine.connect() as conn:
        rows = (await conn.exec_driver_sql(
            "SELECT proname FROM pg_proc WHERE pronamespace = current_schema()::regnamespace"
        )).all()
    return {names[name] for (name,) in rows if name in names}


async def test_pooler_transaction_sends_the_hot_statements_through_functions(postgres_url: str) -> None:
    """Behind a transaction pooler the saver's put, pending-writes and head-read statements
    go through the functions wrapping them (nothing else keeps their plans between calls):
    opening creates them, the saver works through them (dropping one makes the next call of
    its statement fail), and a saver opened without migrations uses the ones it finds."""
    url = BackendURL.parse(postgres_url)
    async with BackendOptions.scope(Settings()) as options:
        direct = await PostgresSaver.open(url, options)
        assert await _functions(direct) == set()  # a direct connection keeps plans itself
    pooled = url.with_query(pooler="transaction")
    async with BackendOptions.scope(Settings()) as options:
        saver = await PostgresSaver.open(pooled, options)
        assert await _functions(saver) == set(_HOT)
        ids = await put_chain(saver, "t-fn", [{"a": [1]}, {"a": [2]}])
        await saver.aput_writes(cfg("t-fn", ids[-1]), [("a", 3)], "task-1")
        head = await saver.aget_tuple(cfg("t-fn"))
        assert head is not None and head.checkpoint["id"] == ids[-1]
        assert ("task-1", "a", 3) in head.pending_writes
        first = await saver.aget_tuple(cfg("t-fn", ids[0]))
        assert first is not None and first.checkpoint["channel_values"] == {"a": [1]}
        async with saver.engine.connect() as conn:
            await conn.exec_driver_sql(f"DROP FUNCTION {function_name(saver_sql.PUT_WRITES_SQL, SCHEMA_VERSION)}")
            await conn.commit()
        with pytest.raises(BackendRefusedError) as info:
            await saver.aput_writes(cfg("t-fn", ids[-1]), [("a", 4)], "task-2")
        assert function_name(saver_sql.PUT_WRITES_SQL, SCHEMA_VERSION) in str(info.value.__cause__), info.value
    async with BackendOptions.scope(Settings()) as options:
        options.migrate = False
        reopened = await PostgresSaver.open(pooled, options)
        assert await _functions(reopened) == set(_HOT) - {"put_writes"}
        # The statement without its function goes as itself.
        await reopened.aput_writes(cfg("t-fn", ids[-1]), [("a", 4)], "task-2")
        head = await reopened.aget_tuple(cfg("t-fn"))
        assert head is not None and {("task-1", "a", 3), ("task-2", "a", 4)} <= set(head.pending_writes)


async def test_session_options_reach_the_server(postgres_url: str) -> None:
    url = BackendURL.parse(postgres_url).with_query(
        application_name="runstore-test", options="-c statement_timeout=7s -c lock_timeout=3s"
    )
    async with BackendOptions.scope(Settings()) as options:
        saver = await PostgresSaver.open(url, options)
        async with saver.engine.connect() as conn:
            got = (await conn.exec_driver_sql(
                "SELECT current_setting('application_name'), current_setting('statement_timeout'), "
                "current_setting('lock_timeout')"
            )).one()
    assert tuple(got) == ("runstore-test", "7s", "3s")


async def test_pool_keeps_at_most_max_idle_connections(postgres_url: str) -> None:
    settings = Settings().merged({"postgres": {"pool_max_size": 4, "pool_max_idle": 1}})
    async with BackendOptions.scope(settings) as options:
        saver = await PostgresSaver.open(BackendURL.parse(postgres_url), options)
        engine = saver.engine
        held = [await engine.connect() for _ in range(4)]  # the pool's maximum, all at once
        for conn in held:
            await conn.close()
        assert engine.sync_engine.pool.checkedin() == 1  # type: ignore[attr-defined]


async def test_a_cancelled_statement_is_unavailable_and_wrote_nothing(postgres_url: str) -> None:
    """The server cancelling a write at ``statement_timeout`` (here: stuck behind a table
    lock) is `BackendUnavailableError` saying nothing was written, the driver's
    `QueryCanceledError` as its cause, and the store works once the lock is gone."""
    url = BackendURL.parse(postgres_url).with_query(options="-c statement_timeout=300ms")
    async with BackendOptions.scope(Settings()) as options:
        events = await PostgresEventStore.open(url, options)
        await events.put(thread_id="t", run_id="r", event_type="x", category="message", content="before",
                         user_id=None)
        async with events.engine.connect() as blocker, blocker.begin():
            await blocker.exec_driver_sql("LOCK TABLE runstore_events IN ACCESS EXCLUSIVE MODE")
            with pytest.raises(BackendUnavailableError) as info:
                await events.put(thread_id="t", run_id="r", event_type="x", category="message",
                                 content="stuck", user_id=None)
        assert info.value.write_may_have_happened is False, str(info.value)
        assert type(info.value.__cause__).__name__ == "QueryCanceledError", repr(info.value.__cause__)
        await events.put(thread_id="t", run_id="r", event_type="x", category="message", content="after",
                         user_id=None)
        got = [e["content"] for e in await events.list_messages("t", user_id=None)]
        assert got == ["before", "after"], got
        await events.close()
