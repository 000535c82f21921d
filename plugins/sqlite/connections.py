"""The sqlite saver's two connections to its file.

* `open_worker`: one pooled connection of the SQLAlchemy engine shared with the
  sqlite event store, checked out for the saver's lifetime
  (`runstore.plugins.sqlite.adapter.WorkerConnection`). Every async operation runs as
  one function on its aiosqlite worker thread against the underlying
  ``sqlite3.Connection`` (one thread hop, instead of one per statement).
* `SyncConnection`: a stdlib ``sqlite3`` connection to the same file for the sync
  twins, used from the calling thread (no event loop needed), one caller at a time.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from .adapter import WorkerConnection
from .ops import register_functions

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

R = TypeVar("R")

__all__ = ["SyncConnection", "open_worker"]


async def open_worker(engine: AsyncEngine) -> WorkerConnection:
    """Check out the saver's worker connection from ``engine``, its SQL functions registered."""
    worker = await WorkerConnection.checkout(engine)
    try:
        await worker.run(register_functions)
    except BaseException:
        await worker.close()
        raise
    return worker


class SyncConnection:
    """A stdlib ``sqlite3`` connection, opened on first use, one caller at a time."""

    def __init__(self, path: Path, synchronous: str, busy_timeout_ms: int) -> None:
        self.path = path
        self.synchronous = synchronous
        self.busy_timeout_ms = busy_timeout_ms
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._closed = False

    def run(self, fn: Callable[..., R], *args: Any) -> R:
        """Run ``fn(sqlite3_connection, *args)`` in the calling thread."""
        with self._lock:
            if self._closed:
                raise RuntimeError("SqliteSaver is closed")
            if self._conn is None:
                self._conn = self._connect()
            return fn(self._conn, *args)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path,
            timeout=self.busy_timeout_ms / 1000.0,
            isolation_level=None,
            check_same_thread=False,
        )
        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {self.synchronous.upper()}")
        register_functions(conn)
        return conn

    def close(self) -> None:
        """Close the connection (idempotent); later calls raise."""
        with self._lock:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None

