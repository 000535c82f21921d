"""Stock-style construction: from_conn_string + setup(), schema_sql() for a DBA, the caller's
engine or client (never closed by runstore), on real sqlite, PostgreSQL and Redis."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

import runstore
from runstore.errors import ConfigError, InvalidURLError
from runstore.plugins.jsonl.events import JsonlEventStore
from runstore.plugins.memory.events import MemoryEventStore
from runstore.plugins.memory.saver import MemorySaver
from runstore.plugins.memory.streams import MemoryStreamBridge
from runstore.plugins.postgres.events import PostgresEventStore
from runstore.plugins.postgres.runs import PostgresRunStore
from runstore.plugins.postgres.saver import PostgresSaver
from runstore.plugins.redis.streams import RedisStreamBridge
from runstore.plugins.sqlite.events import SqliteEventStore
from runstore.plugins.sqlite.saver import SqliteSaver
from runstore.urls import BackendURL
from tests.checkpoint.graphs import chat_turns


async def _event(store: Any) -> int:
    record = await store.put(thread_id="t", run_id="r", event_type="note", category="message",
                             content="hi", user_id=None)
    return int(record["seq"])


@pytest.fixture(params=["sqlite", "postgres"])
def sql_url(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """``(kind, url)`` of a fresh sqlite file or PostgreSQL schema."""
    if request.param == "sqlite":
        return "sqlite", BackendURL.for_file("sqlite", tmp_path / "a.db").render()
    return "postgres", request.getfixturevalue("postgres_url")


async def test_saver_from_conn_string_setup_and_schema_sql(sql_url: tuple[str, str]) -> None:
    kind, url = sql_url
    cls = SqliteSaver if kind == "sqlite" else PostgresSaver
    async with cls.from_conn_string(url) as saver:
        script = await saver.schema_sql()
        assert script.startswith("BEGIN;\n") and script.endswith("COMMIT;\n")
        assert "CREATE TABLE" in script and "runstore_schema_versions" in script
        again = await saver.schema_sql()  # the back-fill's time differs, nothing else
        assert again.count(";\n") == script.count(";\n"), "schema_sql applies nothing"
        await saver.setup()
        await saver.setup()  # idempotent
        assert await saver.schema_sql() == ""
        assert await chat_turns(saver, "t1", ["hi"]) == ["hi", "you said: hi"]
    async with cls.from_conn_string(url) as saver:  # reopened: the data is there
        assert await chat_turns(saver, "t1", ["again"]) == ["hi", "you said: hi", "again", "you said: again"]


async def test_event_store_from_conn_string(sql_url: tuple[str, str]) -> None:
    kind, url = sql_url
    cls: Any = SqliteEventStore if kind == "sqlite" else PostgresEventStore
    async with cls.from_conn_string(url) as store:
        assert "CREATE TABLE" in await store.schema_sql()
        await store.setup()
        assert await store.schema_sql() == ""
        assert await _event(store) == 1


async def test_stores_without_a_schema(tmp_path: Path, redis_url: str) -> None:
    for cls, url in ((MemorySaver, "memory://"), (MemoryEventStore, "memory://"),
                     (JsonlEventStore, BackendURL.for_file("jsonl", tmp_path / "runs").render()),
                     (MemoryStreamBridge, "memory://"), (RedisStreamBridge, redis_url)):
        async with cls.from_conn_string(url) as store:  # type: ignore[attr-defined]
            await store.setup()  # nothing to do, but generic code may call it
            assert await store.schema_sql() == ""
            if isinstance(store, MemorySaver):
                assert await chat_turns(store, "t", ["hi"]) == ["hi", "you said: hi"]
            elif hasattr(store, "publish"):
                assert await store.publish("run-1", "values", {"a": 1})
            else:
                assert await _event(store) == 1


async def test_a_dba_applies_the_script_and_the_app_runs_without_ddl_privileges(postgres_url: str) -> None:
    import asyncpg

    url = BackendURL.parse(postgres_url)
    schema = url.option("schema")
    admin = await asyncpg.connect(url.without_query("schema").render(hide_password=False))
    role = f"rs_app_{uuid.uuid4().hex[:10]}"
    try:
        async with PostgresSaver.from_conn_string(postgres_url) as saver:
            saver_sql = await saver.schema_sql()
        async with PostgresEventStore.from_conn_string(postgres_url) as store:
            events_sql = await store.schema_sql()
        assert f'SET search_path TO "{schema}"' in saver_sql
        await admin.execute(saver_sql)  # the DBA applies the scripts as they are
        await admin.execute(events_sql)
        await admin.execute(f'CREATE ROLE "{role}" LOGIN')
        await admin.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
        await admin.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "{schema}" TO "{role}"')
        await admin.execute(f'GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA "{schema}" TO "{role}"')
        app_url = BackendURL(scheme="postgresql", username=role, host=url.host, port=url.port,
                             path=url.path).with_query(schema=schema).render(hide_password=False)
        async with PostgresSaver.from_conn_string(app_url) as saver:
            assert await chat_turns(saver, "t-app", ["hi"]) == ["hi", "you said: hi"]
        runstore.checkpoint.modes.reset_checkpoint_mode_for_tests()
        async with runstore.open(checkpointer=app_url, events=app_url) as stores:  # no DDL at open
            assert await chat_turns(stores.checkpointer, "t-app", ["again"]) == [
                "hi", "you said: hi", "again", "you said: again"]
            assert await _event(stores.events) == 1
        with pytest.raises(Exception, match="permission denied"):
            await admin.execute(f'SET ROLE "{role}"; CREATE TABLE "{schema}".probe (x int)')
    finally:
        runstore.checkpoint.modes.reset_checkpoint_mode_for_tests()
        await admin.execute("RESET ROLE")
        await admin.execute(f'DROP OWNED BY "{role}"') if await admin.fetchval(
            "SELECT 1 FROM pg_roles WHERE rolname = $1", role) else None
        await admin.execute(f'DROP ROLE IF EXISTS "{role}"')
        await admin.close()


async def test_the_callers_engine_is_used_and_never_disposed(postgres_url: str) -> None:
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    url = BackendURL.parse(postgres_url)
    engine = create_async_engine(
        "postgresql+asyncpg://" + url.without_query("schema").render(hide_password=False).split("://", 1)[1],
        pool_size=4, connect_args={"server_settings": {"search_path": url.option("schema") or "public"}},
    )
    try:
        async with PostgresSaver.from_engine(engine) as saver, PostgresEventStore.from_engine(engine) as store:
            assert saver.engine is engine and store.engine is engine
            await saver.setup()
            await store.setup()
            assert await chat_turns(saver, "t-engine", ["hi"]) == ["hi", "you said: hi"]
            assert await _event(store) == 1
        async with PostgresRunStore.from_engine(engine) as runs:
            assert runs.engine is engine
            await runs.setup()
            await runs.create("t-engine", run_id="r-engine")
            assert [r["run_id"] for r in await runs.list_by_thread("t-engine")] == ["r-engine"]
        async with engine.connect() as conn:  # still open, pool intact
            count = (await conn.execute(text("SELECT count(*) FROM runstore_checkpoints"))).scalar()
        assert count and count > 0
        assert engine.sync_engine.pool.checkedout() == 0, "every connection went back to the pool"
    finally:
        await engine.dispose()
    sqlite_engine = create_async_engine("sqlite+aiosqlite://")
    try:
        with pytest.raises(InvalidURLError, match="asyncpg"):
            async with PostgresSaver.from_engine(sqlite_engine):
                pass
    finally:
        await sqlite_engine.dispose()


async def test_the_callers_redis_client_is_used_and_never_closed(redis_url: str) -> None:
    import redis.asyncio as aioredis

    url = BackendURL.parse(redis_url)
    prefix = url.option("prefix", "")
    client = aioredis.Redis.from_url(url.without_query("prefix").render(hide_password=False))
    try:
        async with RedisStreamBridge.from_client(client, prefix=prefix) as bridge:
            event_id = await bridge.publish("run-1", "values", {"a": 1})
            await bridge.publish_end("run-1")
            seen = [item async for item in bridge.subscribe("run-1", heartbeat_interval=0.5)]
            assert any(getattr(item, "id", None) == event_id for item in seen)
        assert await client.ping() is True, "the caller's client stays open"
        assert await client.exists(f"{prefix}stream:run-1".encode())
        decoding = aioredis.Redis.from_url(url.without_query("prefix").render(hide_password=False),
                                           decode_responses=True)
        with pytest.raises(ConfigError, match="bytes"):
            async with RedisStreamBridge.from_client(decoding, prefix=prefix):
                pass
        await decoding.aclose()
    finally:
        await client.aclose()


def test_schema_sql_command_prints_every_kind_then_nothing(postgres_url: str) -> None:
    import asyncio

    import asyncpg
    from click.testing import CliRunner

    from runstore.cli.main import main

    first = CliRunner().invoke(main, ["schema-sql", postgres_url])
    assert first.exit_code == 0, first.output
    for kind in ("checkpointer", "events", "runs"):
        assert f"-- runstore {kind} (postgres)" in first.output
    only = CliRunner().invoke(main, ["schema-sql", postgres_url, "--kind", "runs"])
    assert "-- runstore runs" in only.output and "checkpointer" not in only.output

    async def apply() -> None:
        url = BackendURL.parse(postgres_url)
        conn = await asyncpg.connect(url.without_query("schema").render(hide_password=False))
        try:
            await conn.execute(first.output)
        finally:
            await conn.close()

    asyncio.run(apply())
    again = CliRunner().invoke(main, ["schema-sql", postgres_url])
    assert again.exit_code == 0 and again.output == "", "a current schema needs nothing"


async def test_file_stores_take_a_plain_path_like_the_stock_sqlite_saver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    async with SqliteSaver.from_conn_string("checkpoints.sqlite") as saver:
        await saver.setup()
        assert await chat_turns(saver, "t", ["hi"]) == ["hi", "you said: hi"]
    assert (tmp_path / "checkpoints.sqlite").is_file()
    absolute = tmp_path / "sub" / "events.db"
    async with SqliteEventStore.from_conn_string(str(absolute)) as store:
        await store.setup()
        assert await _event(store) == 1
    assert absolute.is_file()
    async with JsonlEventStore.from_conn_string("runs") as store:
        assert await _event(store) == 1
    assert (tmp_path / "runs").is_dir()
