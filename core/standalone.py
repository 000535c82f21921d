"""Building one store on its own, the way LangGraph's savers are built.

`Standalone` gives a backend class whose factory is ``open(url, options)`` the
construction LangGraph users know from ``AsyncPostgresSaver``::

    async with PostgresSaver.from_conn_string("postgresql://app@db/app") as saver:
        await saver.setup()            # apply the migrations (or have a DBA apply schema_sql())

`Standalone.from_conn_string` opens the store with its own pool and closes both on
exit; it applies no migrations: `Standalone.setup` does, and `Standalone.schema_sql`
returns what it would run as one SQL script, applying nothing. A class that runs on a
caller's pool, engine or client adds its own constructor (``from_engine``,
``from_client``) that never closes it. `runstore.open` keeps opening stores with their
migrations applied.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, ClassVar, cast

from runstore.options import BackendOptions
from runstore.settings import Settings
from runstore.urls import BackendURL

if TYPE_CHECKING:
    from typing import Self

    from sqlalchemy.ext.asyncio import AsyncEngine

    from runstore.sql.migrations import Migration


class Standalone:
    """Mixin: `from_conn_string`, `setup` and `schema_sql` for a class with ``open(url, options)``.

    A SQL backend names its schema with `schema_component` and `schema_migrations` and
    exposes its engine as ``engine``; for any other backend `setup` does nothing and
    `schema_sql` is empty.
    """

    #: The migrations component of a SQL backend (``None``: it keeps no schema).
    schema_component: ClassVar[str | None] = None
    #: Its migrations, numbered 1, 2, ...
    schema_migrations: ClassVar[Sequence[Migration]] = ()
    #: The scheme of a file-backed store: ``from_conn_string`` then also takes a plain path,
    #: as LangGraph's ``AsyncSqliteSaver.from_conn_string("checkpoints.sqlite")`` does.
    file_scheme: ClassVar[str | None] = None

    @classmethod
    @asynccontextmanager
    async def from_conn_string(
        cls,
        url: str | BackendURL,
        config: Mapping[str, Any] | str | os.PathLike[str] | Settings | None = None,
    ) -> AsyncIterator[Self]:
        """Open the store on ``url`` with its own connections; close everything on exit.

        A file-backed store (sqlite, JSON lines) also takes a plain path for ``url``.

        ``config`` is what `runstore.open` takes (a mapping shaped like ``runstore.yaml``,
        a YAML path or `Settings`) for the plugin sections, e.g. ``{"postgres":
        {"pool_max_size": 5}}``. No migrations run: call `setup` (or apply `schema_sql`).
        """
        if isinstance(url, str) and "://" not in url and cls.file_scheme is not None:
            url = BackendURL.for_file(cls.file_scheme, url)
        settings = Settings.load(config)
        async with BackendOptions.scope(settings) as options:
            options.migrate = False
            yield await cls._open_standalone(BackendURL.parse(url), options)

    @classmethod
    async def _open_standalone(cls, url: BackendURL, options: BackendOptions, **open_options: Any) -> Self:
        """Open through the class's factory (``open_options`` passed to it, e.g. a memory
        store's ``index`` from ``from_engine``); ``options`` close the store (`BackendOptions.adopt`)."""
        opened = await cast(Any, cls).open(url, options, **open_options)
        return cast("Self", await options.adopt(opened))

    def _schema_engine(self) -> AsyncEngine:
        engine = getattr(self, "engine", None)
        if engine is None:
            raise RuntimeError(f"{type(self).__name__} is not open")
        return cast("AsyncEngine", engine)

    async def setup(self) -> None:
        """Create or upgrade the store's tables (idempotent; a no-op for stores without any).

        Safe when several processes call it at once; needs the privileges to create tables.
        """
        if self.schema_component is None:
            return
        from runstore.sql.migrations import ensure_schema

        await ensure_schema(self._schema_engine(), self.schema_component, self.schema_migrations)

    async def schema_sql(self) -> str:
        """What `setup` would run now, as one SQL script, without applying it.

        Empty when the schema is current. Computed by running the pending migrations in
        a transaction that is rolled back, so it needs the privileges `setup` needs:
        run it as the DBA (or on an empty database of the same server version), review
        the script, apply it, and the application can then run without DDL privileges.
        """
        if self.schema_component is None:
            return ""
        from runstore.sql.migrations import pending_sql, sql_script

        return sql_script(
            await pending_sql(self._schema_engine(), self.schema_component, self.schema_migrations)
        )
