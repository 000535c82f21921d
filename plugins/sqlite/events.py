"""The sqlite run event store: `runstore.sql.SqlEventStore` on aiosqlite (WAL, busy timeout)."""

from __future__ import annotations

from typing import ClassVar

from runstore.options import BackendOptions
from runstore.sql.events import SqlEventStore
from runstore.urls import BackendURL


class SqliteEventStore(SqlEventStore):
    """Event store in a sqlite file, sharing the file's engine with the sqlite saver.

    Writers serialize on the file's write lock (``BEGIN IMMEDIATE``), so concurrent
    processes on one file stay consistent.
    """

    url_options: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    async def open(cls, url: BackendURL, options: BackendOptions) -> SqliteEventStore:
        """Open ``sqlite:///path.db``, creating the file and upgrading the schema as needed."""
        url = BackendURL.parse(url)
        if url.scheme != "sqlite":
            raise ValueError(f"{url} is not a sqlite:// URL")
        store = await super().open(url, options)
        assert isinstance(store, SqliteEventStore)
        return store
