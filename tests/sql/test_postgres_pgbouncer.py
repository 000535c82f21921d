"""``pooler=transaction`` through a real PgBouncer in transaction mode (version 1.18 in CI):
the saver, the event store and the run store work while their transactions share two
server connections, nothing of theirs is left prepared on those connections, and the
saver's hot statements go through the functions wrapping them.

PgBouncer before 1.20 cannot pass a ``search_path`` startup parameter, so, as the docs
tell users of such a pooler, the URL has no ``schema`` and the test's own role has the
schema as its ``search_path``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import asyncpg
import pytest
from langgraph.checkpoint.base import empty_checkpoint

from runstore.conformance.harness import service_unavailable
from runstore.options import BackendOptions
from runstore.plugins.postgres import sql
from runstore.plugins.postgres.events import PostgresEventStore
from runstore.plugins.postgres.pooler_functions import function_name
from runstore.plugins.postgres.runs import PostgresRunStore
from runstore.plugins.postgres.saver import PostgresSaver
from runstore.settings import Settings
from runstore.urls import BackendURL

from ..conftest import POSTGRES_URL
from ..faults.servers import PgBouncer, ServerUnavailable

pytestmark = pytest.mark.postgres

VERSION = sql.SCHEMA_MIGRATIONS[-1].version
HOT = (sql.PUT_SQL, sql.PUT_WRITES_SQL, sql.GET_LATEST_SQL, sql.GET_BY_ID_SQL)


def _admin_dsn() -> str:
    return BackendURL.parse(POSTGRES_URL).without_query("schema").render(hide_password=False)


@pytest.fixture
def role_and_schema() -> Iterator[tuple[str, str]]:
    """A login role whose ``search_path`` is a schema it owns; both dropped afterwards."""
    name = f"rs_pgb_{uuid.uuid4().hex[:10]}"

    async def run(*statements: str) -> None:
        conn = await asyncpg.connect(_admin_dsn())
        try:
            for statement in statements:
                await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(run(
        f"CREATE ROLE {name} LOGIN",
        f"CREATE SCHEMA {name} AUTHORIZATION {name}",
        f"ALTER ROLE {name} SET search_path TO {name}",
    ))
    try:
        yield name, name
    finally:
        asyncio.run(run(f"DROP SCHEMA IF EXISTS {name} CASCADE", f"DROP ROLE IF EXISTS {name}"))


@pytest.fixture
def pgbouncer(role_and_schema: tuple[str, str]) -> Iterator[PgBouncer]:
    """PgBouncer in transaction mode before the shared server, two server connections."""
    server = BackendURL.parse(POSTGRES_URL)
    try:
        bouncer = PgBouncer((server.host or "127.0.0.1", server.port or 5432),
                            users=[role_and_schema[0], "postgres"], pool_size=2)
    except ServerUnavailable as exc:
        service_unavailable("pgbouncer", exc)
        raise
    with bouncer:
        yield bouncer


async def test_the_stores_work_through_pgbouncer_in_transaction_mode(
    pgbouncer: PgBouncer, role_and_schema: tuple[str, str]
) -> None:
    role, schema = role_and_schema
    url = pgbouncer.url(BackendURL.parse(POSTGRES_URL).path.lstrip("/"), user=role, pooler="transaction")
    async with BackendOptions.scope(Settings()) as options:
        saver = await PostgresSaver.open(url, options)
        events = await PostgresEventStore.open(url, options)
        runs = await PostgresRunStore.open(url, options)

        async def turn(thread: str) -> None:
            cfg = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
            for step in range(3):
                checkpoint = empty_checkpoint()
                cfg = await saver.aput(cfg, checkpoint, {"source": "loop", "step": step}, {})  # type: ignore[arg-type]
                await saver.aput_writes(cfg, [("a", step)], f"task-{step}")
                await events.put(thread_id=thread, run_id="r", event_type="x", category="message",
                                 content=f"m{step}", user_id=None)
            head = await saver.aget_tuple({"configurable": {"thread_id": thread, "checkpoint_ns": ""}})
            assert head is not None and head.checkpoint["id"] == cfg["configurable"]["checkpoint_id"]
            assert head.pending_writes == [("task-2", "a", 2)]
            assert [e["content"] for e in await events.list_messages(thread, user_id=None)] == ["m0", "m1", "m2"]
            created = await runs.create(thread, run_id=f"run-{thread}")
            assert created.outcome == "created"

        # Ten callers at once over two server connections: their transactions interleave
        # on them, which is what breaks anything a session would have to keep.
        await asyncio.gather(*(turn(f"t{i}") for i in range(10)))

    conn = await asyncpg.connect(_admin_dsn())
    try:
        made = {row[0] for row in await conn.fetch(
            "SELECT proname FROM pg_proc WHERE pronamespace = $1::regnamespace", schema)}
    finally:
        await conn.close()
    assert {function_name(statement, VERSION) for statement in HOT} <= made

    # Both server connections, each pinned by a client's open transaction, hold no
    # prepared statement after the stores' work.
    dsn = pgbouncer.url(BackendURL.parse(POSTGRES_URL).path.lstrip("/"), user=role).render(hide_password=False)
    clients = [await asyncpg.connect(dsn, statement_cache_size=0) for _ in range(2)]
    try:
        transactions = [client.transaction() for client in clients]
        for transaction in transactions:
            await transaction.start()
        assert len({await client.fetchval("SELECT pg_backend_pid()") for client in clients}) == 2
        for client in clients:
            assert await client.fetchval("SELECT count(*) FROM pg_prepared_statements") == 0
        for transaction in transactions:
            await transaction.rollback()
    finally:
        for client in clients:
            await client.close()
