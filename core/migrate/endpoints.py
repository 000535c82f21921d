"""Opening the two sides of a migration: runstore backends by URL, LangGraph's stock savers.

A runstore URL opens each kind asked for through the registry (one options scope per
side, so a sqlite file's saver and event store share their file). A URL whose scheme
starts with ``langgraph+`` opens LangGraph's own saver class, read-only:

* ``langgraph+sqlite:///path.db`` -> ``AsyncSqliteSaver`` on the file opened ``mode=ro``;
* ``langgraph+postgresql://user@host/db[?schema=name]`` -> ``AsyncPostgresSaver`` on a
  psycopg connection whose transactions are read-only (``connect_timeout`` 10 s and
  ``command_timeout`` 60 s, a statement's bound, unless the URL sets them; TCP keepalives
  end a wait on a silent peer; ``schema`` becomes the search path);
* ``langgraph+memory://`` -> an empty ``InMemorySaver`` (tests pass their own object to
  `Endpoint`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from runstore.errors import InvalidURLError, KindNotServedError, MissingDriverError
from runstore.urls import BackendURL

#: The kinds a migration moves, by the names ``--kinds`` takes.
KINDS = ("saver", "events", "runs", "store")
_REGISTRY_KIND = {"saver": "saver", "events": "events", "runs": "runs", "store": "store"}
STOCK_PREFIX = "langgraph+"
#: What a stock URL serves: the saver, and the store whose tables share its database.
STOCK_KINDS = ("saver", "store")


@dataclass
class Endpoint:
    """One side of a migration: the stores of the kinds it serves and how it is named."""

    label: str
    saver: Any = None
    events: Any = None
    runs: Any = None
    #: The long-term memory store (LangGraph ``BaseStore``).
    store: Any = None
    #: LangGraph's stock saver: read through its own class, never written.
    stock: bool = False

    def has(self, kind: str) -> bool:
        """Whether this side serves ``kind``."""
        return getattr(self, kind) is not None


def same_place(a: str, b: str) -> bool:
    """Whether two URLs name the same store (same text, or the same sqlite file)."""
    if a == b:
        return True
    try:
        ua, ub = BackendURL.parse(a.removeprefix(STOCK_PREFIX)), BackendURL.parse(b.removeprefix(STOCK_PREFIX))
    except Exception:
        return False
    if ua.scheme == ub.scheme == "sqlite":
        pa, pb = ua.file_path(), ub.file_path()
        return pa is not None and pb is not None and pa.resolve() == pb.resolve()
    if ua.scheme in ("postgresql", "postgres") and ub.scheme in ("postgresql", "postgres"):
        return ua.render(include_query=True) == ub.render(include_query=True).replace(ub.scheme, ua.scheme, 1)
    return False


def served_kinds(url: str) -> tuple[str, ...]:
    """The migratable kinds ``url`` has a backend for."""
    if url.startswith(STOCK_PREFIX):
        return STOCK_KINDS
    from runstore.loader import get_backends

    parsed = BackendURL.parse(url)
    registry = get_backends()
    return tuple(kind for kind in KINDS if registry.of(_REGISTRY_KIND[kind]).serves(parsed))


@contextlib.asynccontextmanager
async def open_endpoint(url: str, kinds: Sequence[str], *, create: bool = True, store_index: Any = None,
                        settings: Mapping[str, Any] | None = None) -> AsyncIterator[Endpoint]:  # fmt: skip
    """Open ``url`` for ``kinds`` (`KindNotServedError` naming a kind it lacks) with
    ``settings`` (runstore settings, e.g. ``{"sqlite": {"synchronous": "full"}}``); its
    store with ``store_index`` (LangGraph ``IndexConfig``) when given."""
    if url.startswith(STOCK_PREFIX):
        unwanted = [kind for kind in kinds if kind not in STOCK_KINDS]
        if unwanted:
            raise KindNotServedError(
                f"{url} is one of LangGraph's stock savers: it holds checkpoints and store items only, not "
                f"{', '.join(unwanted)}; pass --kinds saver,store"
            )
        async with _open_stock(url) as saver:
            store = await _stock_store(saver) if "store" in kinds else None
            yield Endpoint(url, saver=saver, store=store, stock=True)
        return
    from runstore.loader import get_backends
    from runstore.options import BackendOptions
    from runstore.settings import Settings

    parsed = BackendURL.parse(url)
    registry = get_backends()
    specs = {}
    for kind in kinds:
        kinds_registry = registry.of(_REGISTRY_KIND[kind])
        if not kinds_registry.serves(parsed):
            raise KindNotServedError(
                f"no {kind} backend serves {parsed.scheme}:// ({url}); the kinds it serves: "
                f"{', '.join(served_kinds(url)) or 'none'}; choose them with --kinds"
            )
        spec = kinds_registry.for_url(parsed)
        if kind in ("events", "runs") and not spec.has("bulk_import"):
            # Refused before anything opens (an open may create files or tables).
            why = ("its feeds cannot be copied with their seqs, and renumbering them would break the cursors "
                   "clients hold") if kind == "events" else "its runs cannot be copied with their statuses and times"
            raise KindNotServedError(
                f"the {kind} store {spec.name!r} ({url}) does not declare bulk_import: {why}; "
                f"leave {kind} out with --kinds"
            )  # fmt: skip
        specs[kind] = spec
    # Full-mode settings: the saver opens unwrapped, so checkpoints are copied as stored.
    async with BackendOptions.scope(Settings.load({**(settings or {}), "checkpoint_channel_mode": "full"})) as options:
        options.migrate = create
        if store_index is not None:
            from runstore.store.base import STORE_CONFIG_KEY

            options.provide(STORE_CONFIG_KEY, (store_index, None))
        endpoint = Endpoint(url)
        for kind, spec in specs.items():
            # Each backend's open registers its own close with the options.
            store = await spec.open(parsed, options)
            setattr(endpoint, kind, store)
        yield endpoint


async def _stock_store(saver: Any) -> Any:
    """LangGraph's stock store on the stock saver's own connection (read-only like it); an
    empty ``InMemoryStore`` when the database has no store table (the store was never used)."""
    from langgraph.store.memory import InMemoryStore

    name = type(saver).__name__
    if name == "AsyncSqliteSaver":
        from langgraph.store.sqlite.aio import AsyncSqliteStore

        async with saver.conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'store'") as cur:
            if await cur.fetchone() is None:
                return InMemoryStore()
        store = AsyncSqliteStore(saver.conn)
        store.is_setup = True  # read-only: never create tables in the source
        return store
    if name == "AsyncPostgresSaver":
        from langgraph.store.postgres.aio import AsyncPostgresStore

        async with saver.conn.cursor() as cur:
            await cur.execute("SELECT to_regclass('store') IS NOT NULL AS present")
            row = await cur.fetchone()
        return AsyncPostgresStore(saver.conn) if row and row["present"] else InMemoryStore()
    return InMemoryStore()


@contextlib.asynccontextmanager
async def _open_stock(url: str) -> AsyncIterator[Any]:
    rest = url.removeprefix(STOCK_PREFIX)
    scheme = rest.split(":", 1)[0]
    if scheme == "memory":
        from langgraph.checkpoint.memory import InMemorySaver

        yield InMemorySaver()
    elif scheme == "sqlite":
        try:
            import aiosqlite
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
        except ImportError as exc:
            raise MissingDriverError("langgraph+sqlite", "langgraph.checkpoint.sqlite", "langgraph") from exc
        path = BackendURL.parse(rest).file_path()
        if path is None or not path.exists():
            raise InvalidURLError(f"{url}: no sqlite file at {path}; write langgraph+sqlite:///relative/path.db")
        async with aiosqlite.connect(f"file:{path.resolve()}?mode=ro", uri=True) as lite:
            saver = AsyncSqliteSaver(lite)
            saver.is_setup = True  # read-only: never create tables in the source
            yield saver
    elif scheme in ("postgresql", "postgres"):
        try:
            from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
            from psycopg import AsyncConnection
            from psycopg.rows import dict_row
        except ImportError as exc:
            raise MissingDriverError("langgraph+postgresql", "langgraph.checkpoint.postgres", "langgraph") from exc
        parsed = BackendURL.parse(rest)
        schema = parsed.option("schema")
        command_timeout = _seconds(STOCK_PREFIX + parsed.render(), "command_timeout", parsed.option("command_timeout") or "60")
        # The server ends a statement past command_timeout; keepalives end a wait on a
        # peer that stopped answering (about 25 s), which no statement timeout sees.
        conninfo = parsed.without_query("schema", "command_timeout").with_query(
            connect_timeout=parsed.option("connect_timeout") or "10",
            keepalives="1", keepalives_idle="10", keepalives_interval="5", keepalives_count="3",
        ).render(hide_password=False)
        settings = "-c default_transaction_read_only=on" + f" -c statement_timeout={round(command_timeout * 1000)}"
        settings += f" -c search_path={schema}" if schema else ""
        pg = await AsyncConnection.connect(
            conninfo, autocommit=True, prepare_threshold=0, row_factory=dict_row,
            options=settings,
        )  # fmt: skip
        async with pg:
            yield AsyncPostgresSaver(conn=pg)
    else:
        raise InvalidURLError(
            f"{url}: unknown stock saver; accepted: langgraph+sqlite:///path.db, "
            "langgraph+postgresql://user@host/db, langgraph+memory://"
        )


def _seconds(url: str, option: str, value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise InvalidURLError(f"{url}: {option}={value!r} is not a positive number of seconds")
    return seconds
