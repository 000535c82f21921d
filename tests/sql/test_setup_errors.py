"""A store from ``from_conn_string`` whose ``setup()`` never ran says to call it.

Every kind with tables (saver, event store, run store) on sqlite and PostgreSQL raises
`SchemaNotSetUpError` (a `BackendRefusedError`) naming ``setup()``, the driver's
missing-table error as ``__cause__``; after ``setup()`` the same call works.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from runstore.errors import BackendRefusedError, SchemaNotSetUpError
from runstore.plugins.postgres.events import PostgresEventStore
from runstore.plugins.postgres.runs import PostgresRunStore
from runstore.plugins.postgres.saver import PostgresSaver
from runstore.plugins.sqlite.events import SqliteEventStore
from runstore.plugins.sqlite.runs import SqliteRunStore
from runstore.plugins.sqlite.saver import SqliteSaver

UNKNOWN_RUN = "00000000-0000-0000-0000-000000000000"


async def _saver_call(saver: Any) -> Any:
    return await saver.aget_tuple({"configurable": {"thread_id": "t"}})


async def _events_call(store: Any) -> Any:
    return await store.list_messages("t", user_id=None)


async def _runs_call(store: Any) -> Any:
    return await store.get(UNKNOWN_RUN)


KINDS: list[tuple[str, Any, Any, Callable[[Any], Awaitable[Any]]]] = [
    ("saver", SqliteSaver, PostgresSaver, _saver_call),
    ("events", SqliteEventStore, PostgresEventStore, _events_call),
    ("runs", SqliteRunStore, PostgresRunStore, _runs_call),
]


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
@pytest.mark.parametrize("kind", KINDS, ids=[k[0] for k in KINDS])
def test_missing_tables_say_to_call_setup(
    kind: tuple[str, Any, Any, Callable[[Any], Awaitable[Any]]], backend: str, request: pytest.FixtureRequest
) -> None:
    _, sqlite_cls, postgres_cls, call = kind
    cls = sqlite_cls if backend == "sqlite" else postgres_cls
    # The PostgreSQL fixture provisions on an event loop of its own: this test is sync.
    url = request.getfixturevalue("sqlite_url" if backend == "sqlite" else "postgres_url")

    async def main() -> None:
        async with cls.from_conn_string(url) as store:
            with pytest.raises(SchemaNotSetUpError) as caught:
                await call(store)
            assert isinstance(caught.value, BackendRefusedError)
            assert "setup()" in str(caught.value)
            cause = caught.value.__cause__
            assert cause is not None and type(cause).__module__.split(".")[0] in ("sqlite3", "asyncpg")
            await store.setup()
            await call(store)

    asyncio.run(main())
