"""Shared SQLAlchemy async engines for the sqlite and PostgreSQL backends.

Every SQL backend opened on one `BackendOptions` for the same database (a checkpoint
saver and an event store on one sqlite file, say) gets the same engine and pool from
`shared_engine`. Connection-level configuration happens in a pool ``connect`` hook, so
raw driver connections taken from the pool (``(await conn.get_raw_connection())
.driver_connection``) carry it too:

sqlite (aiosqlite)
    ``journal_mode=WAL``, ``busy_timeout`` = ``settings.sqlite.busy_timeout_ms``,
    ``synchronous`` = ``settings.sqlite.synchronous``. The driver connection runs in
    autocommit mode (``isolation_level=None``): SQLAlchemy transactions issue their
    own ``BEGIN`` (``BEGIN IMMEDIATE`` on a connection carrying the execution option
    ``runstore_write=True``, see `write_connection`), and raw users must issue
    ``BEGIN``/``BEGIN IMMEDIATE`` ... ``COMMIT`` themselves. Read-only SQLAlchemy
    connections issue no ``BEGIN`` at all: each statement is its own snapshot.

PostgreSQL (asyncpg)
    ``?schema=NAME`` becomes the connection's ``search_path`` (a startup parameter, so
    it holds on every pooled connection) and the schema is created if missing. Pool
    pre-ping (a closed connection is replaced; one idle over a second is pinged with one
    round trip), ``pool_recycle`` = ``settings.postgres.pool_recycle_seconds``, pool size
    ``settings.postgres.pool_max_size``, ``command_timeout`` from settings.
"""

from __future__ import annotations

import asyncio
import time
import weakref
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from ..errors import InvalidURLError
from ..options import BackendOptions
from ..urls import BackendURL

SQLITE_SCHEMES = frozenset({"sqlite"})
POSTGRES_SCHEMES = frozenset({"postgresql", "postgres"})

#: URL options runstore interprets itself; never forwarded to a driver.
RUNSTORE_QUERY_OPTIONS = frozenset({"schema"})

#: Execution option asking a sqlite connection to start its transaction with BEGIN IMMEDIATE.
WRITE_OPTION = "runstore_write"

_SQLITE_LOCKS: weakref.WeakKeyDictionary[Any, asyncio.Lock] = weakref.WeakKeyDictionary()


def dialect_of(url: BackendURL) -> str:
    """``"sqlite"`` or ``"postgresql"`` for a URL `shared_engine` accepts; `InvalidURLError` otherwise."""
    if url.scheme in SQLITE_SCHEMES:
        return "sqlite"
    if url.scheme in POSTGRES_SCHEMES:
        return "postgresql"
    raise InvalidURLError(f"{url} is not a sqlite:// or postgresql:// URL")


def quote_ident(name: str) -> str:
    """Quote ``name`` as a SQL identifier (both dialects accept double quotes)."""
    if not name or "\x00" in name:
        raise InvalidURLError(f"invalid SQL identifier {name!r}")
    return '"' + name.replace('"', '""') + '"'


def postgres_schema(url: BackendURL) -> str | None:
    """The ``?schema=`` option of a PostgreSQL URL, validated (``None`` when absent)."""
    schema = url.option("schema")
    if schema is None:
        return None
    if not schema or len(schema.encode()) > 63 or "\x00" in schema:
        raise InvalidURLError(
            f"schema option of {url} must be 1-63 bytes without NUL; got {schema!r}"
        )
    return schema


def engine_key(url: BackendURL) -> tuple[str, str]:
    """The `BackendOptions.shared` key of the engine for ``url``.

    ``("sqlalchemy-engine", text)`` where ``text`` is the absolute sqlite file path or
    the PostgreSQL URL (password included, never logged) with only ``schema`` kept, so
    backends naming one database with different runstore-only options share a pool.
    """
    dialect = dialect_of(url)
    if dialect == "sqlite":
        path = url.file_path()
        if path is None:
            raise InvalidURLError(
                f"{url} names no file; use sqlite:///relative/path.db or "
                "sqlite:////absolute/path.db (memory:// is the in-memory backend)"
            )
        return ("sqlalchemy-engine", "sqlite:///" + str(path.expanduser().resolve()))
    schema = postgres_schema(url)
    keep = url.without_query(*RUNSTORE_QUERY_OPTIONS)
    if schema is not None:
        keep = keep.with_query(schema=schema)
    return ("sqlalchemy-engine", "postgresql" + keep.render(hide_password=False)[len(url.scheme) :])


async def shared_engine(url: BackendURL, options: BackendOptions) -> AsyncEngine:
    """Return the engine for ``url`` shared through ``options`` (created once, disposed on close).

    Accepts ``sqlite:///path`` (parent directories are created) and
    ``postgresql://...[?schema=NAME]`` (the schema is created if missing). See the
    module docstring for the connection configuration raw-connection users inherit.
    """
    key = engine_key(url)

    async def opener() -> AsyncEngine:
        if dialect_of(url) == "sqlite":
            return await _open_sqlite(key[1][len("sqlite:///") :], options)
        return await _open_postgres(url, options)

    async def closer(engine: AsyncEngine) -> None:
        _SQLITE_LOCKS.pop(engine.sync_engine, None)
        await engine.dispose()

    return await options.shared(key, opener, closer)


def sqlite_write_lock(engine: AsyncEngine) -> asyncio.Lock | None:
    """The in-process writer lock of a sqlite engine (``None`` for other dialects).

    sqlite has one writer at a time; queueing this process's writers on a lock
    instead of on ``busy_timeout`` polling keeps in-process contention cheap and fair.
    """
    return _SQLITE_LOCKS.get(engine.sync_engine)


@asynccontextmanager
async def write_connection(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection inside a write transaction, committed on success, rolled back on error.

    On sqlite the transaction is ``BEGIN IMMEDIATE`` (the file's write lock is taken up
    front, waiting up to ``busy_timeout``) and this process's writers queue on
    `sqlite_write_lock` first. On PostgreSQL it is a plain transaction; callers add
    their own advisory locks.
    """
    lock = sqlite_write_lock(engine)
    if lock is None:
        async with engine.connect() as conn:
            await conn.execution_options(**{WRITE_OPTION: True})
            async with conn.begin():
                yield conn
        return
    async with lock, engine.connect() as conn:
        await conn.execution_options(**{WRITE_OPTION: True})
        async with conn.begin():
            yield conn


async def _open_sqlite(path_text: str, options: BackendOptions) -> AsyncEngine:
    from pathlib import Path

    path = Path(path_text)
    await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True)
    cfg = options.settings.sqlite
    engine = create_async_engine(
        URL.create("sqlite+aiosqlite", database=str(path)),
        # A writer holds its pooled connection for the whole transaction; readers in WAL
        # never block it, so a small pool serves many coroutines.
        pool_size=5,
        max_overflow=10,
        connect_args={"timeout": max(cfg.busy_timeout_ms, 0) / 1000.0},
    )
    busy_timeout_ms = int(cfg.busy_timeout_ms)

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Autocommit at the driver level: we issue BEGIN ourselves so a writer can ask
        # for BEGIN IMMEDIATE (a deferred BEGIN that later upgrades to a write lock
        # fails with SQLITE_BUSY instead of waiting on busy_timeout).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
            _ensure_wal(cursor, busy_timeout_ms)
            cursor.execute(f"PRAGMA synchronous = {cfg.synchronous.upper()}")
        finally:
            cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        if conn.get_execution_options().get(WRITE_OPTION):
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        # Readers issue no BEGIN: single statements are consistent on their own and
        # skipping it saves a hop to the aiosqlite thread.

    _SQLITE_LOCKS[engine.sync_engine] = asyncio.Lock()
    return engine


def _ensure_wal(cursor: Any, busy_timeout_ms: int) -> None:
    """Put the file in WAL mode, tolerating other processes opening it at the same time.

    Switching to WAL takes an exclusive lock and SQLite answers "database is locked"
    at once instead of waiting on busy_timeout. The mode is stored in the file, so only
    the first opener switches; later ones just read it, and a contended switch is retried
    until busy_timeout has passed.
    """
    deadline = time.monotonic() + max(busy_timeout_ms, 1000) / 1000
    while True:
        try:
            cursor.execute("PRAGMA journal_mode")
            if str(cursor.fetchone()[0]).lower() != "wal":
                cursor.execute("PRAGMA journal_mode = WAL")
            return
        except Exception as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


async def _open_postgres(url: BackendURL, options: BackendOptions) -> AsyncEngine:
    try:
        import asyncpg  # noqa: F401
    except ImportError:
        from ..errors import MissingDriverError

        raise MissingDriverError("postgres", "asyncpg", "postgres") from None
    cfg = options.settings.postgres
    schema = postgres_schema(url)
    query = {k: v for k, v in url.query.items() if k not in RUNSTORE_QUERY_OPTIONS}
    sa_url = URL.create(
        "postgresql+asyncpg",
        username=url.username,
        password=url.password,
        host=url.host,
        port=url.port,
        database=url.path.lstrip("/") or None,
        query=query,
    )
    server_settings: dict[str, str] = {}
    if schema is not None:
        server_settings["search_path"] = quote_ident(schema)
    engine = create_async_engine(
        sa_url,
        # Pre-ping is ours (see _install_pre_ping): SQLAlchemy's asyncpg ping costs three
        # round trips (BEGIN, ping, ROLLBACK) on every checkout.
        pool_pre_ping=False,
        pool_recycle=cfg.pool_recycle_seconds if cfg.pool_recycle_seconds > 0 else -1,
        pool_size=cfg.pool_max_size,
        max_overflow=0,
        connect_args={
            "server_settings": server_settings,
            "command_timeout": cfg.command_timeout_seconds,
        },
    )
    _install_pre_ping(engine)
    if schema is not None:
        try:
            await _create_schema(engine, schema)
        except BaseException:
            await engine.dispose()
            raise
    return engine


#: A pooled PostgreSQL connection idle longer than this is pinged before reuse.
PING_AFTER_IDLE_SECONDS = 1.0
_CHECKIN_TIME = "runstore_checkin_time"


def _install_pre_ping(engine: AsyncEngine) -> None:
    """Check pooled asyncpg connections on checkout: closed ones are replaced, idle ones pinged.

    A connection whose socket the server closed (restart, idle kill) is seen as closed
    without a round trip; one idle for more than `PING_AFTER_IDLE_SECONDS` also gets
    a one-round-trip ping (``SELECT 1``). Either failure makes the pool discard it and
    connect afresh, as SQLAlchemy's own pre-ping does.
    """
    import time

    from sqlalchemy.exc import DisconnectionError
    from sqlalchemy.util import await_only

    @event.listens_for(engine.sync_engine, "checkout")
    def _on_checkout(_dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        driver = record.driver_connection
        if driver is None or driver.is_closed():
            raise DisconnectionError("connection closed by the server")
        last = record.info.get(_CHECKIN_TIME)
        if last is None or time.monotonic() - last > PING_AFTER_IDLE_SECONDS:
            try:
                await_only(driver.execute("SELECT 1"))
            except Exception as exc:
                raise DisconnectionError(f"ping failed: {type(exc).__name__}") from exc

    @event.listens_for(engine.sync_engine, "checkin")
    def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
        if record is not None:
            record.info[_CHECKIN_TIME] = time.monotonic()


#: Advisory lock key taken around schema creation and migrations (any constant works).
SCHEMA_LOCK_KEY = zlib.crc32(b"runstore.schema") - 2**31


async def _create_schema(engine: AsyncEngine, schema: str) -> None:
    async with engine.connect() as conn:
        exists = (
            await conn.exec_driver_sql(
                "SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1", (schema,)
            )
        ).scalar()
        if not exists:
            # Two processes creating the schema at once would collide on the catalog's
            # unique index; the lock makes the second one see the first one's schema.
            await conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({SCHEMA_LOCK_KEY})")
            await conn.exec_driver_sql(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(schema)}")
        await conn.commit()
