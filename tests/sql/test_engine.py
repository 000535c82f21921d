"""The plugins' engines: one configured engine per database, shared and disposed by its options."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading

import pytest

from runstore.errors import InvalidURLError, UnboundEngineError
from runstore.options import BackendOptions
from runstore.plugins.postgres import engine as postgres_engine
from runstore.plugins.sqlite import engine as sqlite_engine
from runstore.plugins.sqlite.engine import shared_engine
from runstore.settings import Settings
from runstore.sql.dialect import dialect_of
from runstore.urls import BackendURL


async def test_sqlite_engine_is_shared_and_raw_connections_are_configured(tmp_path) -> None:
    settings = Settings().merged({"sqlite": {"synchronous": "full", "busy_timeout_ms": 1234}})
    url = BackendURL.for_file("sqlite", tmp_path / "sub" / "a.db")
    async with BackendOptions.scope(settings) as options:
        engine = await shared_engine(url, options)
        assert await shared_engine(url, options) is engine
        async with engine.connect() as conn:
            raw = (await conn.get_raw_connection()).driver_connection
            # Raw users (the sqlite saver) inherit the pragmas and driver autocommit.
            assert raw.isolation_level is None
            for pragma, expected in (
                ("journal_mode", "wal"),
                ("busy_timeout", 1234),
                ("synchronous", 2),
            ):
                cursor = await raw.execute(f"PRAGMA {pragma}")
                assert (await cursor.fetchone())[0] == expected, pragma
        assert (tmp_path / "sub" / "a.db").exists()
    # Disposed on close: the pool holds no connection any more.
    assert engine.pool.checkedin() == 0


async def test_closing_a_sqlite_engine_ends_its_connection_threads(tmp_path) -> None:
    # aiosqlite's close only asks a connection's thread to stop; closing the options
    # must mean it has ended (a sync script checks that no thread outlives the stores).
    before = set(threading.enumerate())
    url = BackendURL.for_file("sqlite", tmp_path / "t.db")
    async with BackendOptions.scope(Settings()) as options:
        engine = await shared_engine(url, options)
        async with engine.connect() as a, engine.connect() as b:
            for conn in (a, b):
                await (await conn.get_raw_connection()).driver_connection.execute("SELECT 1")
        # The event loop's executor threads (asyncio_N) are not the engine's.
        opened = {t for t in set(threading.enumerate()) - before if not t.name.startswith("asyncio_")}
        assert len(opened) >= 2, "each pooled connection runs on its own thread"
    assert not [t for t in opened if t.is_alive()], "threads still running after close"


def test_engine_key_ignores_spelling_of_one_file(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    relative = BackendURL.parse("sqlite:///data/x.db")
    absolute = BackendURL.for_file("sqlite", tmp_path / "data" / "x.db")
    assert sqlite_engine.engine_key(relative) == sqlite_engine.engine_key(absolute)


def test_sqlite_without_path_is_a_clear_error() -> None:
    with pytest.raises(InvalidURLError, match="names no file"):
        sqlite_engine.engine_key(BackendURL.parse("sqlite://"))


@pytest.mark.parametrize("kind", ["checkpointer", "events", "runs"])
async def test_sqlite_memory_database_is_a_clear_error_and_creates_no_file(tmp_path, monkeypatch, kind) -> None:
    import runstore

    monkeypatch.chdir(tmp_path)
    urls = {"checkpointer": "memory://", "events": "memory://", "runs": "memory://",
            kind: "sqlite:///:memory:"}
    from runstore.checkpoint.modes import reset_checkpoint_mode_for_tests

    try:
        with pytest.raises(InvalidURLError, match="memory:// for in-process"):
            async with runstore.open(**urls):
                pass
    finally:
        reset_checkpoint_mode_for_tests()
    assert list(tmp_path.iterdir()) == []


def test_postgres_key_keeps_schema_only() -> None:
    a = postgres_engine.engine_key(BackendURL.parse("postgresql://u:pw@h:5432/db?schema=a"))
    b = postgres_engine.engine_key(BackendURL.parse("postgres://u:pw@h:5432/db?schema=b"))
    assert a != b
    assert a[1].startswith("postgresql://") and "schema=a" in a[1]


async def test_an_engine_no_plugin_opened_is_a_clear_error() -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    from runstore.sql.migrations import Migration, ensure_schema

    engine = create_async_engine("sqlite+aiosqlite://")
    try:
        with pytest.raises(UnboundEngineError, match="has no runstore SqlDialect"):
            await ensure_schema(engine, "c", [Migration(1, ["CREATE TABLE x (y INTEGER)"])])
    finally:
        await engine.dispose()


async def test_engines_carry_their_plugins_dialect(tmp_path) -> None:
    async with BackendOptions.scope() as options:
        engine = await shared_engine(BackendURL.for_file("sqlite", tmp_path / "d.db"), options)
        assert isinstance(dialect_of(engine), sqlite_engine.SqliteDialect)
        assert dialect_of(engine).write_lock is sqlite_engine.sqlite_write_lock(engine)


@pytest.mark.postgres
async def test_postgres_schema_created_and_search_path_on_raw_connections(
    postgres_url: str,
) -> None:
    url = BackendURL.parse(postgres_url).with_query(
        schema=BackendURL.parse(postgres_url).option("schema") + "_x"
    )
    schema = url.option("schema")
    async with BackendOptions.scope() as options:
        engine = await postgres_engine.shared_engine(url, options)
        try:
            assert dialect_of(engine) is postgres_engine.POSTGRES
            async with engine.connect() as conn:
                raw = (await conn.get_raw_connection()).driver_connection
                assert await raw.fetchval("SELECT current_schema()") == schema
        finally:
            async with engine.begin() as conn:
                await conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')


def test_postgres_plugin_module_does_not_import_asyncpg() -> None:
    code = (
        "import sys, runstore.plugins.postgres, runstore.plugins.postgres.events,"
        " runstore.plugins.postgres.engine, runstore.events.sql;"
        "assert 'asyncpg' not in sys.modules, 'asyncpg imported at module import'"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


@pytest.mark.postgres
@pytest.mark.parametrize("idle_ping", [False, True])
async def test_postgres_pool_replaces_a_connection_the_server_killed(
    postgres_url: str, idle_ping: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from runstore.plugins.postgres.events import PostgresEventStore

    if idle_ping:
        monkeypatch.setattr(postgres_engine, "PING_AFTER_IDLE_SECONDS", 0.0)
    async with BackendOptions.scope() as options:
        store = await PostgresEventStore.open(BackendURL.parse(postgres_url), options)
        await store.count_messages("t", user_id=None)
        async with store.engine.connect() as conn:
            raw = (await conn.get_raw_connection()).driver_connection
            victim = raw.get_server_pid()
        async with BackendOptions.scope() as other:
            killer = await postgres_engine.shared_engine(
                BackendURL.parse(postgres_url).without_query("schema"), other
            )
            async with killer.connect() as conn:
                await conn.exec_driver_sql(f"SELECT pg_terminate_backend({victim})")
        if not idle_ping:
            # Once the event loop has seen the socket close, the checkout hook discards
            # the dead connection without a round trip.
            await asyncio.sleep(0.2)
        # Otherwise the ping of an idle connection finds it dead. Either way the pool
        # reconnects and the caller never sees the failure.
        for _ in range(3):
            assert await store.count_messages("t", user_id=None) == 0


async def test_postgres_stores_share_one_database_resolved_once(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The saver, event store and run store on one URL share one `PostgresDatabase`: the
    URL's connect options and time bounds are resolved once, for all three."""
    from runstore.plugins.postgres import connect_options, settings
    from runstore.plugins.postgres.events import PostgresEventStore
    from runstore.plugins.postgres.runs import PostgresRunStore
    from runstore.plugins.postgres.saver import PostgresSaver

    calls = {"connect": 0, "timeouts": 0}
    resolve_connect = connect_options.PostgresConnectOptions.resolve.__func__  # type: ignore[attr-defined]
    resolve_timeouts = settings.PostgresTimeouts.resolve.__func__  # type: ignore[attr-defined]

    def counted(name, real):  # type: ignore[no-untyped-def]
        def resolve(cls, *args):  # type: ignore[no-untyped-def]
            calls[name] += 1
            return real(cls, *args)

        return classmethod(resolve)

    monkeypatch.setattr(connect_options.PostgresConnectOptions, "resolve", counted("connect", resolve_connect))
    monkeypatch.setattr(settings.PostgresTimeouts, "resolve", counted("timeouts", resolve_timeouts))
    url = BackendURL.parse(postgres_url).with_query(command_timeout="30")
    async with BackendOptions.scope() as options:
        saver = await PostgresSaver.open(url, options)
        events = await PostgresEventStore.open(url, options)
        runs = await PostgresRunStore.open(url, options)
        database = await postgres_engine.shared_database(url, options)
        assert saver.engine is events.engine is runs.engine is database.engine
        assert database.timeouts.command == 30.0
        assert calls == {"connect": 1, "timeouts": 1}
