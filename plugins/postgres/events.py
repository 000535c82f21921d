"""The PostgreSQL run event store: `runstore.sql.SqlEventStore` on asyncpg.

asyncpg is imported only when a store is opened (`runstore.sql.engine`), never at
module import.
"""

from __future__ import annotations

from typing import ClassVar

from runstore.options import BackendOptions
from runstore.sql.events import SqlEventStore
from runstore.urls import BackendURL


class PostgresEventStore(SqlEventStore):
    """Event store in PostgreSQL; ``?schema=NAME`` keeps its table in that schema.

    Writers of a thread serialize on a transaction advisory lock of the thread, so
    several processes (and hosts) can share the database.
    """

    url_options: ClassVar[frozenset[str]] = frozenset({"schema"})

    @classmethod
    async def open(cls, url: BackendURL, options: BackendOptions) -> PostgresEventStore:
        """Open ``postgresql://...``, creating the schema/table or upgrading them as needed."""
        url = BackendURL.parse(url)
        if url.scheme not in ("postgresql", "postgres"):
            raise ValueError(f"{url} is not a postgresql:// URL")
        store = await super().open(url, options)
        assert isinstance(store, PostgresEventStore)
        return store
