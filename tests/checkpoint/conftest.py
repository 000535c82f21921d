"""Fixtures for the checkpoint-layer tests: savers to run against, mode reset.

``saver_kind`` runs a test on LangGraph's stock savers (InMemorySaver,
AsyncSqliteSaver, AsyncPostgresSaver) and on runstore's own memory / sqlite /
PostgreSQL savers once those modules exist (they are skipped, with the reason,
until then).
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from runstore.checkpoint import modes
from runstore.urls import BackendURL

SAVER_KINDS = [
    "stock-memory",
    "stock-sqlite",
    "stock-postgres",
    "runstore-memory",
    "runstore-sqlite",
    "runstore-postgres",
]


@pytest.fixture(autouse=True)
def _reset_checkpoint_mode() -> Iterator[None]:
    """Every test starts and ends with no frozen mode (freezing is per process)."""
    modes.reset_checkpoint_mode_for_tests()
    yield
    modes.reset_checkpoint_mode_for_tests()


SaverOpener = Callable[[], contextlib.AbstractAsyncContextManager[Any]]


def _needs(kind: str, request: pytest.FixtureRequest) -> str | None:
    if kind.endswith("postgres"):
        return request.getfixturevalue("postgres_url")
    return None


@pytest.fixture(params=SAVER_KINDS)
def saver_opener(request: pytest.FixtureRequest, tmp_path: Path) -> SaverOpener:
    """An opener: ``async with opener() as saver`` opens a saver on this test's storage.

    Opening twice reaches the same stored threads (a reload), except for the stock
    in-memory saver, which returns the same instance.
    """
    kind: str = request.param
    pg_url = _needs(kind, request)
    if kind.startswith("runstore-"):
        name = kind.split("-", 1)[1]
        if importlib.util.find_spec(f"runstore.plugins.{name}.saver") is None:
            pytest.skip(f"runstore's {name} saver is not written yet")
    if kind == "stock-memory":
        from langgraph.checkpoint.memory import InMemorySaver

        shared = InMemorySaver()

        @contextlib.asynccontextmanager
        async def open_memory() -> AsyncIterator[Any]:
            yield shared

        return open_memory
    if kind == "stock-sqlite":
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        path = str(tmp_path / "stock.db")

        @contextlib.asynccontextmanager
        async def open_sqlite() -> AsyncIterator[Any]:
            async with AsyncSqliteSaver.from_conn_string(path) as saver:
                await saver.setup()
                yield saver

        return open_sqlite
    if kind == "stock-postgres":
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

        assert pg_url is not None
        url = BackendURL.parse(pg_url)
        schema = url.option("schema")
        conninfo = url.without_query("schema").render(hide_password=False)
        if schema:
            conninfo += f"?options=-csearch_path%3D{schema}"

        @contextlib.asynccontextmanager
        async def open_pg() -> AsyncIterator[Any]:
            async with AsyncPostgresSaver.from_conn_string(conninfo) as saver:
                await saver.setup()
                yield saver

        return open_pg
    # runstore's own savers, opened like runstore.open does
    from runstore.loader import get_backends
    from runstore.options import BackendOptions

    if kind == "runstore-memory":
        raw = "memory://"
    elif kind == "runstore-sqlite":
        raw = BackendURL.for_file("sqlite", tmp_path / "rs.db").render()
    else:
        assert pg_url is not None
        raw = pg_url
    spec = get_backends().savers.for_url(raw)
    memory_instance: list[Any] = []

    @contextlib.asynccontextmanager
    async def open_runstore() -> AsyncIterator[Any]:
        if kind == "runstore-memory":
            # Nothing to close in memory; keep one instance so a "reload" sees the data.
            if not memory_instance:
                memory_instance.append(await spec.open(BackendURL.parse(raw), BackendOptions()))
            yield memory_instance[0]
            return
        async with BackendOptions.scope() as options:
            yield await spec.open(BackendURL.parse(raw), options)

    return open_runstore
