"""`MemoryRunStore`: the in-process run store.

It runs the SQL run store's scripts (`runstore.runs.sql`) on a private in-memory
stdlib ``sqlite3`` database, synchronously on the caller's thread: each operation is
one uninterrupted call, so it is atomic with respect to every other coroutine, and the
rules are exactly those of the sqlite and PostgreSQL backends. Nothing survives the
process and nothing is shared between processes.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, TypeVar

from runstore.runs.sql import MIGRATIONS, RunDriver, Script, SqlRunStore, run_script

if TYPE_CHECKING:
    from collections.abc import Callable

    from runstore.options import BackendOptions
    from runstore.urls import BackendURL

T = TypeVar("T")


class MemoryRunDriver(RunDriver):
    """One private ``sqlite3`` connection to ``:memory:``, used only from the event loop."""

    def __init__(self) -> None:
        # check_same_thread=False: a store may be closed from another thread at exit.
        conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        for migration in MIGRATIONS:
            for step in migration.steps:
                assert isinstance(step, str)
                conn.execute(step)
        self._conn: sqlite3.Connection | None = conn

    @property
    def connection(self) -> sqlite3.Connection:
        """The database (for tests that need to look underneath the contract)."""
        if self._conn is None:
            raise RuntimeError("this run store is closed")
        return self._conn

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    async def write(self, script: Callable[[], Script[T]], operation: str) -> T:
        conn = self.connection
        # No other connection exists, so a plain BEGIN is as exclusive as sqlite's IMMEDIATE.
        conn.execute("BEGIN")
        try:
            result = run_script(conn, script())
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return result

    async def read(self, script: Callable[[], Script[T]], operation: str) -> T:
        return run_script(self.connection, script())


class MemoryRunStore(SqlRunStore):
    """In-process run store; the rules of `runstore.runs.sql` on a private in-memory database.

    Examples:

    ```python
    import asyncio

    from runstore.plugins.memory.runs import MemoryRunStore


    async def main() -> None:
        async with MemoryRunStore.from_conn_string("memory://") as runs:
            created = await runs.create("thread-1")
            run = await runs.start(created.run["run_id"], owner="worker-1", ttl=30)
            renewed, cancel = await runs.renew_lease(run["run_id"], "worker-1", ttl=30)
            done = await runs.finalize(run["run_id"], "worker-1", "success")
            print(done["status"])  # success


    asyncio.run(main())
    ```
    """

    def __init__(self) -> None:
        self.driver = MemoryRunDriver()
        super().__init__(self.driver)

    @classmethod
    async def open(cls, url: BackendURL, options: BackendOptions) -> MemoryRunStore:
        """Open ``memory://`` (no options)."""
        url.check_options(set())
        store = cls()
        options.on_close(store.close)
        return store
