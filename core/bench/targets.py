"""Opening the storage under test inside a benchmark child process.

Every case gets fresh storage: file URLs are moved into the case's work directory,
PostgreSQL URLs get a fresh ``schema`` (dropped afterwards). The stock LangGraph
savers are reachable as ``langgraph:memory``, ``langgraph:sqlite`` and
``langgraph:postgres`` (the last on ``--postgres-url``).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runstore.bench.matrix import PEER_PREFIX, PEERS

if TYPE_CHECKING:
    from langgraph.checkpoint.base import BaseCheckpointSaver

    from runstore.urls import BackendURL

POSTGRES_SCHEMES = ("postgresql", "postgres")
FILE_SCHEMES = ("sqlite", "jsonl")


def split_backend(raw: str) -> tuple[str, dict[str, Any]]:
    """Split ``URL|key=value|...`` into the URL and nested runstore setting overrides.

    The suffix lets one run compare settings of one backend, e.g.
    ``sqlite://|sqlite.synchronous=full`` next to ``sqlite://``.
    """
    import yaml

    url, *pairs = raw.split("|")
    overrides: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"backend setting {pair!r} is not KEY=VALUE (in {url}|...)")
        key, value = pair.split("=", 1)
        node = overrides
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = yaml.safe_load(value)
    return url, overrides


def merge_settings(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` merged in, nested mappings merged key by key."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_settings(out[key], value)
        else:
            out[key] = value
    return out


def is_file_url(url: BackendURL) -> bool:
    """Whether ``url`` names a file or directory (so each case needs its own copy)."""
    if url.scheme in POSTGRES_SCHEMES:
        return False  # a hostless one names a database on a socket (?host=/var/run/postgresql)
    return url.scheme in FILE_SCHEMES or (not (url.host or url.hosts) and bool(url.path.strip("/")))


def relocate(url: BackendURL, work_dir: Path, default_name: str) -> tuple[BackendURL, Path]:
    """``url`` moved into ``work_dir`` (keeping its file name and query options)."""
    from runstore.urls import BackendURL

    name = Path(url.path).name if url.path.strip("/") else default_name
    path = (work_dir / name).resolve()
    moved = BackendURL.for_file(url.scheme, path).with_query(**dict(url.query))
    return moved, path


def fresh_schema(prefix: str = "rsbench") -> str:
    """A unique PostgreSQL schema name for one case."""
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


#: The query options asyncpg reads from a DSN; any other (runstore's ``schema``, ``pooler``,
#: time bounds, ``options``) would reach the server as an unknown setting.
_ASYNCPG_DSN_OPTIONS = frozenset(
    {"host", "port", "sslmode", "sslrootcert", "sslcert", "sslkey", "target_session_attrs"}
)


def postgres_dsn(url: BackendURL) -> str:
    """The driver DSN of ``url`` without runstore's query options."""
    others = [key for key in url.query if key not in _ASYNCPG_DSN_OPTIONS]
    return url.without_query(*others).render(hide_password=False)


async def postgres_schema_bytes(dsn: str, schema: str) -> int:
    """Total on-disk size (tables, indexes, TOAST) of every table in ``schema``."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        value = await conn.fetchval(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = $1 AND c.relkind IN ('r', 'm')",
            schema,
        )
        return int(value or 0)
    finally:
        await conn.close()


async def postgres_create_schema(dsn: str, schema: str) -> None:
    """Create ``schema`` (idempotent)."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    finally:
        await conn.close()


async def postgres_drop_schema(dsn: str, schema: str) -> None:
    """Drop ``schema`` and everything in it; errors are ignored (cleanup is best effort)."""
    import asyncpg

    try:
        conn = await asyncpg.connect(dsn)
    except Exception:
        return
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    except Exception:
        pass
    finally:
        await conn.close()


async def redis_delete_prefix(redis_url: str, prefix: str) -> None:
    """Delete every key under ``prefix`` on the server at ``redis_url`` (a bench's cleanup)."""
    import redis.asyncio as redis

    client = redis.Redis.from_url(redis_url)
    try:
        batch = [key async for key in client.scan_iter(match=prefix + "*", count=500)]
        if batch:
            await client.delete(*batch)
    finally:
        await client.aclose()


def file_sizes(path: Path | None) -> dict[str, int | None]:
    """Main file and ``-wal`` sizes of a sqlite database (``None`` when not file-backed)."""
    if path is None:
        return {"db_bytes": None, "wal_bytes": None}
    if path.is_dir():
        total = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        return {"db_bytes": total, "wal_bytes": None}
    wal = Path(str(path) + "-wal")
    return {
        "db_bytes": path.stat().st_size if path.exists() else 0,
        "wal_bytes": wal.stat().st_size if wal.exists() else 0,
    }


class SaverTarget:
    """A saver under test that can be opened, closed, reopened and measured."""

    def __init__(
        self,
        backend: str,
        work_dir: Path,
        *,
        postgres_url: str | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        backend, extra = split_backend(backend)
        self.backend = backend
        self.work_dir = work_dir
        self.postgres_url = postgres_url
        self.settings_overrides = merge_settings(settings or {}, extra)
        self.durable = False
        self.file_path: Path | None = None
        self.pg_dsn: str | None = None
        self.pg_schema: str | None = None
        self._stack: AsyncExitStack | None = None
        self._prepared = False
        self._runstore_url: BackendURL | None = None

    @property
    def is_peer(self) -> bool:
        """Whether this is a stock LangGraph saver."""
        return self.backend.startswith(PEER_PREFIX)

    async def _prepare(self) -> None:
        if self._prepared:
            return
        self._prepared = True
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if self.is_peer:
            if self.backend not in PEERS:
                raise ValueError(f"unknown peer {self.backend!r}; known: {', '.join(PEERS)}")
            if self.backend == "langgraph:sqlite":
                self.file_path = (self.work_dir / "langgraph.db").resolve()
                self.durable = True
            elif self.backend == "langgraph:postgres":
                from runstore.urls import BackendURL

                if not self.postgres_url:
                    raise ValueError("langgraph:postgres needs --postgres-url")
                self.pg_dsn = postgres_dsn(BackendURL.parse(self.postgres_url))
                self.pg_schema = fresh_schema("rsbench_lg")
                await postgres_create_schema(self.pg_dsn, self.pg_schema)
                self.durable = True
            return
        from runstore.loader import get_backends
        from runstore.urls import BackendURL

        url = BackendURL.parse(self.backend)
        spec = get_backends().savers.for_url(url)
        self.durable = spec.has("durable")
        if url.scheme in POSTGRES_SCHEMES:
            self.pg_dsn = postgres_dsn(url)
            self.pg_schema = fresh_schema()
            url = url.with_query(schema=self.pg_schema)
        elif is_file_url(url):
            url, self.file_path = relocate(url, self.work_dir, f"{url.scheme}.db")
        self._runstore_url = url

    async def open(self) -> BaseCheckpointSaver[Any]:
        """Open a new instance of the saver (storage persists across instances if durable)."""
        await self._prepare()
        if self._stack is not None:
            raise RuntimeError("target already open")
        stack = AsyncExitStack()
        try:
            saver = await self._open_into(stack)
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack
        return saver

    async def _open_into(self, stack: AsyncExitStack) -> BaseCheckpointSaver[Any]:
        if self.backend == "langgraph:memory":
            from langgraph.checkpoint.memory import InMemorySaver

            return InMemorySaver()
        if self.backend == "langgraph:sqlite":
            import aiosqlite
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

            conn = await aiosqlite.connect(str(self.file_path))
            stack.push_async_callback(conn.close)
            sqlite_saver = AsyncSqliteSaver(conn)
            await sqlite_saver.setup()
            return sqlite_saver
        if self.backend == "langgraph:postgres":
            from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
            from psycopg import AsyncConnection
            from psycopg.conninfo import make_conninfo
            from psycopg.rows import dict_row

            assert self.pg_dsn is not None
            conninfo = make_conninfo(self.pg_dsn, options=f"-c search_path={self.pg_schema}")
            pg_conn = await AsyncConnection.connect(
                conninfo, autocommit=True, prepare_threshold=0, row_factory=dict_row
            )
            stack.push_async_callback(pg_conn.close)
            pg_saver = AsyncPostgresSaver(conn=pg_conn)
            await pg_saver.setup()
            return pg_saver
        from runstore.loader import get_backends
        from runstore.options import BackendOptions
        from runstore.settings import Settings

        assert self._runstore_url is not None
        url = self._runstore_url
        settings = Settings.load(
            self.settings_overrides or None, checkpointer=url.render(hide_password=False)
        )
        options = await stack.enter_async_context(BackendOptions.scope(settings))
        spec = get_backends().savers.for_url(url)
        return await spec.open(url, options)

    async def close(self) -> None:
        """Close the open instance (a memory saver's data is gone afterwards)."""
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()

    async def sizes(self) -> dict[str, int | None]:
        """Storage sizes now: ``db_bytes`` and ``wal_bytes`` (``None`` where not applicable)."""
        if self.pg_dsn and self.pg_schema:
            try:
                total = await postgres_schema_bytes(self.pg_dsn, self.pg_schema)
            except Exception:
                total = None
            return {"db_bytes": total, "wal_bytes": None}
        return file_sizes(self.file_path)

    async def cleanup(self) -> None:
        """Drop what the case created outside its work directory."""
        if self.pg_dsn and self.pg_schema:
            await postgres_drop_schema(self.pg_dsn, self.pg_schema)
