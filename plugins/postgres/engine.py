"""One PostgreSQL database as runstore's backends see it: `PostgresDatabase`.

Every postgres backend (saver, event store, run store) opened on one `BackendOptions`
for the same database (and ``schema``) shares one `PostgresDatabase` from
`shared_database`: the URL is parsed, checked and resolved once (its servers, TLS and
session options, the transaction-pooler switch: `PostgresConnectOptions`; its time
bounds: `PostgresTimeouts`; its ``schema``) and the database holds the one engine and
pool the backends lease connections from. ``?schema=NAME`` becomes the connection's
``search_path`` (a startup parameter, so it holds on every pooled connection, raw ones
included) and the schema is created if missing. Pool pre-ping (a closed connection is
replaced; one idle over a second is pinged with one round trip; one found inside a
transaction is replaced too), ``pool_recycle`` = ``postgres.pool_recycle_seconds``, pool
size ``postgres.pool_max_size`` of which ``postgres.pool_max_idle`` stay open when idle,
the connect options, and the time bounds (``postgres.*_timeout_seconds`` or the URL
options ``connect_timeout``, ``command_timeout``, ``operation_timeout``): asyncpg's
connect timeout, its command timeout, the ping's and the wait for a free pooled
connection. Inside a call's attempt (`runstore.retry.current_deadline`), the connect and
ping timeouts are cut to what is left of the call's deadline. The engine connects once
when it opens, so a server that refuses us is
reported then. A caller's own engine (``from_engine``) is adopted as a database that
is never disposed (`adopt_engine`). asyncpg is imported only when an engine is opened.
"""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy import event
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from runstore.errors import (
    BackendRefusedError,
    BackendUnavailableError,
    ConfigError,
    InvalidURLError,
    MissingDriverError,
    UnboundEngineError,
)
from runstore.options import BackendOptions
from runstore.retry import current_deadline
from runstore.settings import Settings
from runstore.sql.dialect import SqlDialect, bind_dialect, dialect_of, numbered_placeholders
from runstore.standalone import Standalone
from runstore.urls import BackendURL

from .connect_options import CONNECT_OPTIONS, SERVER_OPTIONS, PostgresConnectOptions, refusal_hint
from .settings import TIMEOUT_OPTIONS, PostgresSettings, PostgresTimeouts

if TYPE_CHECKING:
    from typing import Self

SCHEMES = frozenset({"postgresql", "postgres"})

#: URL options the postgres backends accept (``schema``: the search_path, created if
#: missing; ``host`` and ``port``: the servers, libpq style; the timeouts in seconds and
#: the connect options override the ``postgres`` settings). runstore reads every one of them itself and hands asyncpg keyword arguments.
URL_OPTIONS = frozenset({"schema", *SERVER_OPTIONS, *TIMEOUT_OPTIONS, *CONNECT_OPTIONS})

#: Advisory lock key taken around schema creation and migrations (any constant works).
SCHEMA_LOCK_KEY = zlib.crc32(b"runstore.schema") - 2**31

#: Stands for the engine while a URL is resolved, before the engine is created.
_UNOPENED: Any = None

#: A pooled connection idle longer than this is pinged before reuse.
PING_AFTER_IDLE_SECONDS = 1.0
_CHECKIN_TIME = "runstore_checkin_time"


class PostgresDialect(SqlDialect):
    """PostgreSQL: ``$n`` placeholders; schema changes serialize on an advisory lock."""

    name: ClassVar[str] = "postgresql"

    def placeholders(self, sql: str) -> str:
        """asyncpg's ``$1, $2, ...`` for our ``?``."""
        return numbered_placeholders(sql)

    async def script_preamble(self, conn: AsyncConnection) -> list[str]:
        """Create and select the schema the connection works in (its ``search_path``)."""
        schema = (await conn.exec_driver_sql("SELECT current_schema()")).scalar()
        await conn.rollback()
        if not schema or schema == "public":
            return []
        return [f"CREATE SCHEMA IF NOT EXISTS {quote_ident(schema)}", f"SET search_path TO {quote_ident(schema)}"]

    @asynccontextmanager
    async def schema_transaction(self, conn: AsyncConnection) -> AsyncIterator[None]:
        """A transaction holding `SCHEMA_LOCK_KEY` (released at commit or rollback)."""
        async with conn.begin():
            await conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({SCHEMA_LOCK_KEY})")
            yield

    def in_list(self, column: str, values: Sequence[str], params: list[Any]) -> str:
        """``column IN values`` as one array parameter, so the statement text does not vary with the length."""
        params.append(list(values))
        return f"{column} = ANY(?::text[])"


#: The one dialect object of every PostgreSQL engine (it holds no per-engine state).
POSTGRES = PostgresDialect()


def quote_ident(name: str) -> str:
    """Quote ``name`` as a SQL identifier."""
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

    The URL (password included, never logged) with its query options sorted, so
    spellings of one database and options share a pool (``postgres://`` and
    ``postgresql://`` too); the timeout options are part of it because the engine
    applies them to every connection.
    """
    if url.scheme not in SCHEMES:
        raise InvalidURLError(f"{url} is not a postgresql:// URL")
    postgres_schema(url)
    keep = url.without_query(*url.query).with_query(**dict(sorted(url.query.items())))
    return ("sqlalchemy-engine", "postgresql" + keep.render(hide_password=False)[len(url.scheme) :])


@dataclass(frozen=True)
class PostgresDatabase:
    """One database's URL resolved once, and the engine its backends share (module docstring)."""

    #: The URL the database was opened with (its password is never logged).
    url: BackendURL
    engine: AsyncEngine
    #: The ``postgres`` settings section.
    settings: PostgresSettings
    timeouts: PostgresTimeouts
    connect: PostgresConnectOptions
    #: The ``?schema=`` option (``None``: the server's default ``search_path``).
    schema: str | None

    @property
    def behind_pooler(self) -> bool:
        """Whether a transaction pooler sits in between (``pooler=transaction``): no
        prepared statements and no session settings survive between transactions."""
        return not self.connect.prepared_statements

    @classmethod
    def on(cls, engine: AsyncEngine, url: BackendURL, settings: Settings) -> PostgresDatabase:
        """``url`` checked (its options: `URL_OPTIONS`) and resolved with ``settings``, on ``engine``."""
        url.check_options(URL_OPTIONS)
        cfg = settings.section(PostgresSettings)
        return cls(
            url=url,
            engine=engine,
            settings=cfg,
            timeouts=PostgresTimeouts.resolve(url, cfg),
            connect=PostgresConnectOptions.resolve(url, cfg),
            schema=postgres_schema(url),
        )


async def shared_database(url: BackendURL | str, options: BackendOptions) -> PostgresDatabase:
    """Return the `PostgresDatabase` for ``postgresql://...[?schema=NAME]``, shared through ``options``.

    Checked, resolved and opened once (the schema created if missing); its engine is
    disposed when ``options`` close. A bad URL is an `InvalidURLError` naming what is
    accepted, a bad setting a `ConfigError`, before any connection is made.
    """
    url = BackendURL.parse(url)
    key = engine_key(url)

    async def opener() -> PostgresDatabase:
        try:
            import asyncpg  # noqa: F401
        except ImportError:
            raise MissingDriverError("postgres", "asyncpg", "postgres") from None
        return await _open(url, options.settings)

    async def closer(database: PostgresDatabase) -> None:
        await database.engine.dispose()

    return await options.shared(key, opener, closer)


async def shared_engine(url: BackendURL, options: BackendOptions) -> AsyncEngine:
    """The engine of `shared_database` (for code that needs only the engine)."""
    return (await shared_database(url, options)).engine


async def _open(url: BackendURL, settings: Settings) -> PostgresDatabase:
    # Resolved before the engine exists: a bad URL or setting opens nothing.
    resolved = PostgresDatabase.on(_UNOPENED, url, settings)
    cfg, timeouts, connect, schema = resolved.settings, resolved.timeouts, resolved.connect, resolved.schema
    pool_size, max_overflow = pool_sizes(cfg)
    # The servers go to asyncpg as keyword arguments (`PostgresConnectOptions.connect_args`):
    # a list of hosts and ports, socket directories among them, exactly as checked.
    sa_url = URL.create(
        "postgresql+asyncpg",
        username=url.username,
        password=url.password,
        database=url.path.lstrip("/") or None,
    )
    connect_args = connect.connect_args()
    if schema is not None:
        connect_args["server_settings"]["search_path"] = quote_ident(schema)
    engine = create_async_engine(
        sa_url,
        # Pre-ping is ours (see _install_pre_ping): SQLAlchemy's asyncpg ping costs three
        # round trips (BEGIN, ping, ROLLBACK) on every checkout.
        pool_pre_ping=False,
        pool_recycle=cfg.pool_recycle_seconds if cfg.pool_recycle_seconds > 0 else -1,
        pool_size=pool_size,
        max_overflow=max_overflow,
        # Callers bound the wait for a free connection with their operation deadline.
        pool_timeout=timeouts.operation,
        connect_args={**connect_args, "command_timeout": timeouts.command, "timeout": timeouts.connect},
    )
    _install_pre_ping(engine, timeouts.connect)
    _install_connect_deadline(engine)
    bind_dialect(engine, POSTGRES)
    try:
        await _first_connection(engine, schema, url)
    except BaseException:
        await engine.dispose()
        raise
    return replace(resolved, engine=engine)


async def _first_connection(engine: AsyncEngine, schema: str | None, url: BackendURL) -> None:
    """Connect once (creating ``schema`` if missing), so a server that cannot be reached or
    refuses us (TLS, authentication, pg_hba) is reported when the backend opens, as a
    `BackendUnavailableError` naming the URL, with the driver's error as ``__cause__``."""
    from .connections import driver_error

    try:
        async with engine.connect() as conn:
            if schema is not None:
                await _create_schema(conn, schema)
    except Exception as exc:
        cause = driver_error(exc)
        hint = refusal_hint(cause)
        if hint is not None:
            code = getattr(cause, "sqlstate", None)
            raise BackendRefusedError(f"postgres at {url}", "connect", cause, code, hint=hint) from cause
        error = BackendUnavailableError(f"postgres at {url}", "connect", write_may_have_happened=False, cause=cause)
        raise error from cause


def pool_sizes(cfg: PostgresSettings) -> tuple[int, int]:
    """SQLAlchemy's ``pool_size`` (connections kept open when idle) and ``max_overflow``
    (more, closed as they come back) for ``postgres.pool_max_size`` and ``pool_max_idle``."""
    idle = cfg.pool_max_size if cfg.pool_max_idle is None else cfg.pool_max_idle
    if idle > cfg.pool_max_size:
        raise ConfigError(
            f"config key 'postgres.pool_max_idle' ({idle}) must not exceed "
            f"'postgres.pool_max_size' ({cfg.pool_max_size})"
        )
    return idle, cfg.pool_max_size - idle


def _install_pre_ping(engine: AsyncEngine, timeout: float) -> None:
    """Check pooled asyncpg connections on checkout: closed ones are replaced, idle ones pinged.

    A connection whose socket the server closed (restart, idle kill) is seen as closed
    without a round trip, and one left inside a transaction is never handed out; one
    idle for more than `PING_AFTER_IDLE_SECONDS` also gets a one-round-trip ping
    (``SELECT 1``, waiting at most ``timeout``, cut to what is left of the call's
    deadline). Any of these makes the pool discard it and connect afresh, as
    SQLAlchemy's own pre-ping does.
    """
    from sqlalchemy.exc import DisconnectionError
    from sqlalchemy.util import await_only

    @event.listens_for(engine.sync_engine, "checkout")
    def _on_checkout(_dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        driver = record.driver_connection
        if driver is None or driver.is_closed():
            raise DisconnectionError("connection closed by the server")
        if driver.is_in_transaction():
            driver.terminate()
            raise DisconnectionError("connection returned inside a transaction")
        last = record.info.get(_CHECKIN_TIME)
        if last is None or time.monotonic() - last > PING_AFTER_IDLE_SECONDS:
            try:
                await_only(driver.execute("SELECT 1", timeout=_capped(timeout)))
            except BaseException as exc:
                # Closed at once: SQLAlchemy would otherwise say goodbye to the server and
                # wait up to two seconds for an answer that may never come (after a
                # cancellation, the deadline's included, for asyncpg's cancel request too).
                driver.terminate()
                if not isinstance(exc, Exception):
                    raise
                raise DisconnectionError(f"ping failed: {type(exc).__name__}") from exc

    @event.listens_for(engine.sync_engine, "checkin")
    def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
        if record is not None:
            record.info[_CHECKIN_TIME] = time.monotonic()


#: The shortest connect or ping timeout handed to asyncpg (a deadline already passed).
MIN_DRIVER_TIMEOUT = 0.001


def _capped(seconds: float) -> float:
    """``seconds``, cut to what is left of the deadline of the call being attempted, if any."""
    deadline = current_deadline()
    if deadline is None:
        return seconds
    return max(MIN_DRIVER_TIMEOUT, deadline.cap(seconds))


def _install_connect_deadline(engine: AsyncEngine) -> None:
    """Cut the connect timeout of a connection the pool opens for a call to what is left
    of the call's deadline, so asyncpg gives up by itself before the call is cut."""

    @event.listens_for(engine.sync_engine, "do_connect")
    def _on_connect(_dialect: Any, _record: Any, _cargs: Any, cparams: dict[str, Any]) -> None:
        if "timeout" in cparams:
            cparams["timeout"] = _capped(float(cparams["timeout"]))


async def _create_schema(conn: AsyncConnection, schema: str) -> None:
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


def adopt_engine(engine: AsyncEngine, options: BackendOptions) -> BackendURL:
    """Let the postgres backends opened on ``options`` run on the caller's ``engine``.

    The engine must use asyncpg (``postgresql+asyncpg://``); runstore binds its dialect
    to it, never disposes it, and installs none of its own hooks (the engine's pool
    settings, ``search_path`` and pre-ping are the caller's): `shared_database` then
    returns a database on it, its time bounds and connect options from the settings.
    Returns the URL to open the backends with.
    """
    if engine.dialect.name != "postgresql" or engine.dialect.driver != "asyncpg":
        raise InvalidURLError(
            f"runstore's postgres backends run on asyncpg; the engine "
            f"{engine.url.render_as_string(hide_password=True)} uses "
            f"{engine.dialect.name}+{engine.dialect.driver} (create it with "
            "create_async_engine('postgresql+asyncpg://...'))"
        )
    sa_url = engine.url
    url = BackendURL(
        scheme="postgresql",
        username=sa_url.username,
        password=sa_url.password if isinstance(sa_url.password, str) else None,
        host=sa_url.host,
        port=sa_url.port,
        path="/" + (sa_url.database or ""),
    )
    try:
        dialect_of(engine)
    except UnboundEngineError:
        bind_dialect(engine, POSTGRES)
    options.provide(engine_key(url), PostgresDatabase.on(engine, url, options.settings))
    return url


class FromEngine(Standalone):
    """`Standalone` plus ``from_engine``: a postgres backend on the caller's SQLAlchemy engine."""

    @classmethod
    @asynccontextmanager
    async def from_engine(
        cls,
        engine: AsyncEngine,
        config: Mapping[str, Any] | str | os.PathLike[str] | Settings | None = None,
        **open_options: Any,
    ) -> AsyncIterator[Self]:
        """Open the store on ``engine`` (``postgresql+asyncpg``), which it never closes.

        Connections go back to the engine's pool when the block exits; disposing the
        engine stays the caller's job. No migrations run: call ``setup()``. ``config`` as
        in ``from_conn_string`` (the ``postgres`` section's time bounds apply to calls).
        """
        async with BackendOptions.scope(Settings.load(config)) as options:
            options.migrate = False
            yield await cls._open_standalone(adopt_engine(engine, options), options, **open_options)
