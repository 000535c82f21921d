"""`SqliteFile`: one sqlite file as every sqlite store opened on it sees it.

The saver, the event store and the run store opened on one `BackendOptions` for the
same file (two spellings of one path included) share one `SqliteFile` through
`shared_file`: the URL is checked and the path resolved once, and the file holds the
shared engine (`runstore.plugins.sqlite.engine`), the ``sqlite`` settings and the
file's one writer and write queue (`runstore.plugins.sqlite.commits.FileCommits`),
through which every store writes. The engine closes with the options; the writer goes
back to the pool when the last store using it closes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncEngine

from runstore.errors import InvalidURLError
from runstore.options import BackendOptions
from runstore.urls import BackendURL

from .commits import FileCommits
from .engine import database_path, shared_engine, sqlite_write_lock
from .settings import SqliteSettings


@dataclass(frozen=True)
class SqliteFile:
    """One sqlite file's engine, settings and write queue, shared by its stores."""

    #: The file's absolute path.
    path: Path
    engine: AsyncEngine
    settings: SqliteSettings
    #: The file's one writer and write queue: every store's writes go through it.
    commits: FileCommits

    @property
    def write_lock(self) -> asyncio.Lock | None:
        """The in-process lock the file's writers queue on (the engine's)."""
        return sqlite_write_lock(self.engine)


def file_key(url: BackendURL) -> tuple[str, str]:
    """The `BackendOptions.shared` key of the file ``url`` names: its absolute path."""
    return ("sqlite-file", str(database_path(url)))


async def shared_file(url: BackendURL, options: BackendOptions, url_options: frozenset[str] = frozenset()) -> SqliteFile:
    """The `SqliteFile` of ``sqlite:///path.db``, shared through ``options``.

    ``url`` is checked here (scheme, a file, no options beyond ``url_options``): a bad
    one is an `InvalidURLError` naming what is accepted.
    """
    url = BackendURL.parse(url)
    if url.scheme != "sqlite":
        raise InvalidURLError(f"{url} is not a sqlite:// URL")
    url.check_options(url_options)
    path = database_path(url)

    async def opener() -> SqliteFile:
        engine = await shared_engine(url, options)
        return SqliteFile(
            path=path,
            engine=engine,
            settings=options.settings.section(SqliteSettings),
            commits=FileCommits(engine, sqlite_write_lock(engine)),
        )

    return await options.shared(file_key(url), opener)
