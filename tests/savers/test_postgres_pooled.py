"""The functions wrapping the PostgreSQL saver's hot statements behind a transaction pooler
(`runstore.plugins.postgres.pooler_functions`): two processes creating them at once both end up
calling them, a role that may not create functions sends the statements as they are, and
a saver opened without migrations gets them from `setup`."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from runstore.options import BackendOptions
from runstore.plugins.postgres import sql
from runstore.plugins.postgres.pooler_functions import function_name, statement_functions
from runstore.plugins.postgres.saver import PostgresSaver
from runstore.settings import Settings
from runstore.urls import BackendURL

from .test_postgres_saver import cfg, put_chain

pytestmark = pytest.mark.postgres

VERSION = sql.SCHEMA_MIGRATIONS[-1].version


async def _connect(url: BackendURL, **kwargs: object) -> asyncpg.Connection:
    conn = await asyncpg.connect(
        url.without_query("schema").render(hide_password=False),
        server_settings={"search_path": f'"{url.option("schema")}"'},
        **kwargs,  # type: ignore[arg-type]
    )
    return conn


async def test_a_function_created_meanwhile_by_another_process_is_used(postgres_url: str) -> None:
    """Both creators found the function missing; the second's ``CREATE`` fails on the first's
    (it waits for it to commit), and the second uses the function all the same."""
    url = BackendURL.parse(postgres_url)
    async with BackendOptions.scope(Settings()) as options:
        await PostgresSaver.open(url, options)  # the tables; no functions on a direct URL
    first = await _connect(url)
    second = await _connect(url, statement_cache_size=0)
    try:
        blocker = first.transaction()
        await blocker.start()
        made = await statement_functions(first, [sql.PUT_SQL], schema_version=VERSION, create=True)
        racing = asyncio.ensure_future(
            statement_functions(second, [sql.PUT_SQL], schema_version=VERSION, create=True)
        )
        # The second creator is now waiting on the first's uncommitted catalog row.
        for _ in range(100):
            waiting = await first.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'",
                second.get_server_pid(),
            )
            if waiting:
                break
            await asyncio.sleep(0.05)
        assert waiting, "the second creator never waited for the first"
        await blocker.commit()
        assert await asyncio.wait_for(racing, 10) == made
        assert made[sql.PUT_SQL].startswith(f"SELECT {function_name(sql.PUT_SQL, VERSION)}(")
    finally:
        await first.close()
        await second.close()


async def test_a_role_that_may_not_create_functions_sends_the_statements(postgres_url: str) -> None:
    url = BackendURL.parse(postgres_url)
    schema = url.option("schema")
    role = f"rs_nofn_{uuid.uuid4().hex[:10]}"
    async with BackendOptions.scope(Settings()) as options:
        await PostgresSaver.open(url, options)  # the tables, by their owner
    admin = await _connect(url)
    try:
        await admin.execute(f"CREATE ROLE {role} LOGIN")
        await admin.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO {role}')
        await admin.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "{schema}" TO {role}')
        await admin.execute(f'GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA "{schema}" TO {role}')
        as_role = BackendURL.parse(postgres_url.replace("postgres@", f"{role}@", 1))
        assert as_role.username == role
        async with BackendOptions.scope(Settings()) as options:
            saver = await PostgresSaver.open(as_role.with_query(pooler="transaction"), options)
            ids = await put_chain(saver, "t-role", [{"a": [1]}, {"a": [2]}])
            head = await saver.aget_tuple(cfg("t-role"))
            assert head is not None and head.checkpoint["id"] == ids[-1]
        made = await admin.fetchval(
            "SELECT count(*) FROM pg_proc WHERE proname LIKE 'runstore_q_%' AND pronamespace = $1::regnamespace",
            schema,
        )
        assert made == 0
    finally:
        await admin.execute(f'REVOKE ALL ON ALL TABLES IN SCHEMA "{schema}" FROM {role}')
        await admin.execute(f'REVOKE ALL ON ALL FUNCTIONS IN SCHEMA "{schema}" FROM {role}')
        await admin.execute(f'REVOKE ALL ON SCHEMA "{schema}" FROM {role}')
        await admin.execute(f"DROP ROLE IF EXISTS {role}")
        await admin.close()


async def test_setup_creates_the_functions_of_a_saver_opened_without_migrations(postgres_url: str) -> None:
    pooled = BackendURL.parse(postgres_url).with_query(pooler="transaction")
    names = {function_name(s, VERSION) for s in (sql.PUT_SQL, sql.PUT_WRITES_SQL, sql.GET_LATEST_SQL)}
    async with PostgresSaver.from_conn_string(pooled) as saver:
        await saver.setup()
        admin = await _connect(BackendURL.parse(postgres_url))
        try:
            found = {r[0] for r in await admin.fetch(
                "SELECT proname FROM pg_proc WHERE proname = ANY($1::text[])"
                " AND pronamespace = current_schema()::regnamespace", list(names))}
        finally:
            await admin.close()
        assert found == names
        ids = await put_chain(saver, "t-setup", [{"a": [1]}])
        head = await saver.aget_tuple(cfg("t-setup"))
        assert head is not None and head.checkpoint["id"] == ids[-1]
