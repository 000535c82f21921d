"""The SQL backends under fault tests: a store and saver on one database, a second pair on
their own connections to read back what was acknowledged, and the checks every trial ends with.

`Stack` opens the writer side (event store and saver sharing one `BackendOptions`, so one
engine and pool, as an application has them) and a reader side on separate options
(a separate pool: "visible from another connection"). `Stack.assert_settled` checks
that no write is left half done: on PostgreSQL no session other than the checker's is
inside a transaction and no advisory lock is held (pg_stat_activity, pg_locks); on
sqlite another connection takes the file's write lock at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langgraph.checkpoint.base import empty_checkpoint

from runstore.options import BackendOptions
from runstore.settings import Settings
from runstore.urls import BackendURL

from .servers import PostgresServer, TcpProxy


def ev(thread: str, run: str, content: str, event_type: str = "e") -> dict[str, Any]:
    """One message event of ``thread``/``run`` whose content identifies it."""
    return {
        "thread_id": thread, "run_id": run, "event_type": event_type,
        "category": "message", "content": content,
    }  # fmt: skip


def cfg(thread: str, checkpoint_id: str | None = None) -> dict[str, Any]:
    """A saver config of ``thread`` (its latest checkpoint without ``checkpoint_id``)."""
    configurable: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ""}
    if checkpoint_id:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def checkpoint_args(saver: Any, parent: Any, value: str, run_id: str, step: int) -> tuple[Any, ...]:
    """``aput`` arguments of a full checkpoint holding ``value`` in channel ``a``."""
    version = saver.get_next_version(None, None)
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"a": value}
    checkpoint["channel_versions"] = {"a": version}
    return parent, checkpoint, {"step": step, "run_id": run_id}, {"a": version}


async def put_chain(saver: Any, thread: str, values: list[str], run_ids: list[str] | None = None) -> list[str]:
    """Put a chain of checkpoints (each with one pending write); return their ids."""
    ids: list[str] = []
    parent = cfg(thread)
    for i, value in enumerate(values):
        run_id = run_ids[i] if run_ids else "run"
        parent = await saver.aput(*checkpoint_args(saver, parent, value, run_id, i))
        await saver.aput_writes(parent, [("a", f"w-{value}")], "task", "")
        ids.append(parent["configurable"]["checkpoint_id"])
    return ids


async def snapshot(saver: Any, thread: str) -> list[tuple[str, Any, list[Any]]]:
    """Every checkpoint of ``thread``, newest first: id, channel values, pending writes."""
    out = []
    async for item in saver.alist(cfg(thread)):
        writes = sorted((w[1], w[2]) for w in item.pending_writes or [])
        out.append((item.config["configurable"]["checkpoint_id"], item.checkpoint["channel_values"], writes))
    return out


@dataclass
class Tally:
    """Counts over one sweep, as docs/reliability.md reports them."""

    trials: int = 0
    acknowledged: int = 0
    lost: int = 0
    duplicated: int = 0
    completed: int = 0
    extra: dict[str, int] = field(default_factory=dict)

    def report(self, fault_report: Any, fault: str) -> None:
        fault_report.add(fault, trials=self.trials, acknowledged=self.acknowledged, lost=self.lost,
                         duplicated=self.duplicated, completed_anyway=self.completed, **self.extra)


class Stack:
    """Writers and readers of one database; see the module docstring."""

    def __init__(self, kind: str, url: str, checker: Any) -> None:
        self.kind = kind
        self.url = url
        self._checker = checker
        self.store: Any = None
        self.saver: Any = None
        self.reader: Any = None
        self.saver_reader: Any = None
        self._scopes: list[BackendOptions] = []

    async def open_runs(self) -> tuple[Any, Any]:
        """A run store on the writers' options (their pool) and one on the readers'."""
        from runstore.plugins.postgres.runs import PostgresRunStore
        from runstore.plugins.sqlite.runs import SqliteRunStore

        cls = SqliteRunStore if self.kind == "sqlite" else PostgresRunStore
        url = BackendURL.parse(self.url)
        writer, reader = self._scopes[:2]
        return await cls.open(url, writer), await cls.open(url, reader)

    async def open(self, **settings: Any) -> None:
        """Open the writers (one options scope) and the readers (another)."""
        from runstore.plugins.postgres.events import PostgresEventStore
        from runstore.plugins.postgres.saver import PostgresSaver
        from runstore.plugins.sqlite.events import SqliteEventStore
        from runstore.plugins.sqlite.saver import SqliteSaver

        store_cls, saver_cls = (
            (SqliteEventStore, SqliteSaver) if self.kind == "sqlite" else (PostgresEventStore, PostgresSaver)
        )
        url = BackendURL.parse(self.url)
        pair = []
        for _ in range(2):
            options = BackendOptions(settings=Settings().merged(settings))
            self._scopes.append(options)
            pair.append((await store_cls.open(url, options), await saver_cls.open(url, options)))
        (self.store, self.saver), (self.reader, self.saver_reader) = pair

    async def close(self) -> None:
        for options in reversed(self._scopes):
            await options.aclose()
        self._scopes.clear()
        await self._checker.close()

    async def events(self, thread: str, run: str) -> dict[int, str]:
        """seq -> content of the run's events, read by the other store."""
        rows = await self.reader.list_events(thread, run, limit=10_000, user_id=None)
        return {r["seq"]: r["content"] for r in rows}

    async def assert_settled(self) -> None:
        """Nothing half done: no open transaction, no lock held (see the module docstring)."""
        await self._checker.assert_settled()

    async def go_cold(self) -> None:
        """Drop every pooled connection of the writers, so the next call connects afresh."""
        if self.kind != "postgres":
            return
        for leases in (self.store._driver._leases, self.saver._leases):
            await leases.release_idle()
        await self.store.engine.dispose()


class PostgresChecker:
    """Session and lock state of a throwaway cluster, seen from a connection of its own
    (direct, never through a test's proxy; reconnected when a fault killed it)."""

    def __init__(self, server: PostgresServer) -> None:
        self.server = server
        self.conn: Any = None

    async def fetch(self, sql: str, *args: Any) -> list[Any]:
        import asyncpg

        if self.conn is None or self.conn.is_closed():
            self.conn = await asyncpg.connect(self.server.url())
        try:
            return list(await self.conn.fetch(sql, *args))
        except (asyncpg.InterfaceError, asyncpg.PostgresConnectionError):
            await self.close()
            self.conn = await asyncpg.connect(self.server.url())
            return list(await self.conn.fetch(sql, *args))

    async def assert_settled(self) -> None:
        busy = await self.fetch(
            "SELECT pid, state, query FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
            "AND backend_type = 'client backend' AND xact_start IS NOT NULL"
        )
        assert not busy, f"sessions inside a transaction: {[tuple(r) for r in busy]}"
        locks = await self.fetch("SELECT pid, locktype, mode FROM pg_locks WHERE locktype = 'advisory'")
        assert not locks, f"advisory locks held: {[tuple(r) for r in locks]}"

    async def close(self) -> None:
        if self.conn is not None:
            self.conn.terminate()
            self.conn = None


class SqliteChecker:
    """Whether another connection can take a sqlite file's write lock right now."""

    def __init__(self, path: Path) -> None:
        self.path = path

    async def assert_settled(self) -> None:
        def probe() -> None:
            conn = sqlite3.connect(self.path, timeout=0, isolation_level=None)
            try:
                conn.execute("BEGIN IMMEDIATE")  # "database is locked" if a writer holds it
                conn.execute("ROLLBACK")
            finally:
                conn.close()

        await asyncio.to_thread(probe)

    async def close(self) -> None:
        return None


@contextlib.asynccontextmanager
async def open_stack(
    kind: str,
    *,
    server: PostgresServer | None = None,
    proxy: TcpProxy | None = None,
    tmp_path: Path | None = None,
    url_options: dict[str, str] | None = None,
    **settings: Any,
) -> AsyncIterator[Stack]:
    """A `Stack` on a fresh sqlite file (``tmp_path``) or a fresh schema of ``server``
    (reached through ``proxy`` if given, with ``url_options`` in the URL)."""
    checker: Any
    if kind == "sqlite":
        assert tmp_path is not None
        path = tmp_path / f"faults-{uuid.uuid4().hex[:8]}.db"
        url = BackendURL.for_file("sqlite", path).render()
        checker = SqliteChecker(path)
    else:
        assert server is not None
        url = server.url(schema=f"faults_{uuid.uuid4().hex[:10]}", **(url_options or {}))
        if proxy is not None:
            url = proxy.url(url)
        checker = PostgresChecker(server)
    stack = Stack(kind, url, checker)
    try:
        await stack.open(**settings)
        yield stack
    finally:
        await stack.close()
