"""Fixtures of the SQL event store tests: one store per dialect on a fresh database."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from runstore.events.sql import SqlEventStore
from runstore.options import BackendOptions
from runstore.settings import Settings
from runstore.urls import BackendURL

Opener = Callable[..., Awaitable[SqlEventStore]]


def store_class(url: str) -> type[SqlEventStore]:
    """The plugin class serving ``url``."""
    if url.startswith("sqlite"):
        from runstore.plugins.sqlite.events import SqliteEventStore

        return SqliteEventStore
    from runstore.plugins.postgres.events import PostgresEventStore

    return PostgresEventStore


async def open_engine(url: str | BackendURL, options: BackendOptions) -> AsyncEngine:
    """The engine the plugin serving ``url`` shares through ``options``."""
    parsed = BackendURL.parse(url)
    if parsed.scheme == "sqlite":
        from runstore.plugins.sqlite.engine import shared_engine
    else:
        from runstore.plugins.postgres.engine import shared_engine
    return await shared_engine(parsed, options)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest) -> str:
    """A fresh database URL of each dialect (PostgreSQL: a fresh schema)."""
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
async def open_store(db_url: str) -> AsyncIterator[Opener]:
    """Open stores on ``db_url`` (each call: its own BackendOptions), all closed at teardown."""
    scopes: list[BackendOptions] = []

    async def opener(**settings: Any) -> SqlEventStore:
        options = BackendOptions(settings=Settings().merged(settings))
        scopes.append(options)
        return await store_class(db_url).open(BackendURL.parse(db_url), options)

    yield opener
    for options in reversed(scopes):
        await options.aclose()


@pytest.fixture
async def store(open_store: Opener) -> SqlEventStore:
    """A store on a fresh database of each dialect."""
    return await open_store()
