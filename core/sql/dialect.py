"""What runstore's dialect-neutral SQL code needs to know about a database.

The migrations runner (`runstore.sql.migrations`) and the SQL event store base
(`runstore.events.sql`) run on any SQLAlchemy `AsyncEngine`. The few things that
differ between databases and that SQLAlchemy does not abstract (how to serialize
schema changes across processes, an in-process writer queue, the driver's
placeholder style) come from a `SqlDialect` the plugin that opened the engine binds
to it with `bind_dialect`. The sqlite and postgres plugins each define one; a
third-party SQL backend defines its own the same way.
"""

from __future__ import annotations

import asyncio
import weakref
from abc import ABC, abstractmethod
from contextlib import AbstractAsyncContextManager
from typing import Any, ClassVar

from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from runstore.errors import UnboundEngineError


class SqlDialect(ABC):
    """One database's answers to what SQLAlchemy leaves open, bound to each engine a plugin opens."""

    #: SQLAlchemy's name of the dialect (``engine.dialect.name``), for messages.
    name: ClassVar[str]

    #: Writers of this process queue on this lock before a write transaction (``None``:
    #: the database serializes concurrent writers well enough on its own).
    write_lock: asyncio.Lock | None = None

    def placeholders(self, sql: str) -> str:
        """Rewrite ``sql`` written with ``?`` placeholders into the driver's style."""
        return sql

    async def script_preamble(self, conn: AsyncConnection) -> list[str]:
        """Statements a standalone schema script starts with (e.g. choosing the schema)."""
        return []

    @abstractmethod
    def schema_transaction(self, conn: AsyncConnection) -> AbstractAsyncContextManager[None]:
        """A transaction on ``conn`` serialized with every other schema change of the database.

        The migrations runner applies its steps inside it; concurrent openers in other
        processes wait for it and then see its result.
        """


async def driver_connection(conn: AsyncConnection) -> Any:
    """The driver's own connection (an asyncpg or aiosqlite connection) behind ``conn``."""
    driver = (await conn.get_raw_connection()).driver_connection
    if driver is None:
        raise RuntimeError("the pool handed out a connection without a driver connection")
    return driver


def numbered_placeholders(sql: str, prefix: str = "$") -> str:
    """Rewrite ``?`` placeholders as ``$1, $2, ...`` (our SQL never has ``?`` in a literal)."""
    parts = sql.split("?")
    out = [parts[0]]
    for index, part in enumerate(parts[1:], start=1):
        out.append(f"{prefix}{index}{part}")
    return "".join(out)




_DIALECTS: weakref.WeakKeyDictionary[Engine, SqlDialect] = weakref.WeakKeyDictionary()


def bind_dialect(engine: AsyncEngine, dialect: SqlDialect) -> None:
    """Attach ``dialect`` to ``engine`` (done once by the plugin that creates the engine)."""
    _DIALECTS[engine.sync_engine] = dialect


def dialect_of(engine: AsyncEngine) -> SqlDialect:
    """The `SqlDialect` bound to ``engine``; `UnboundEngineError` if its plugin bound none."""
    try:
        return _DIALECTS[engine.sync_engine]
    except KeyError:
        raise UnboundEngineError(
            f"the {engine.dialect.name} engine {engine.url.render_as_string(hide_password=True)} "
            "has no runstore SqlDialect; open it through its plugin (e.g. "
            "runstore.plugins.sqlite.engine.shared_engine) or call runstore.sql.dialect.bind_dialect"
        ) from None
