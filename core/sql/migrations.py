"""Versioned schema migrations shared by every SQL component (event store, savers).

Each component (``"events"``, ``"sqlite-saver"``, ...) keeps its own version in one
table, ``runstore_schema_versions(component TEXT PRIMARY KEY, version INTEGER)``.
`ensure_schema` brings a component up to its latest migration on open; it is
idempotent and safe when several processes open the same database at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from runstore.errors import SchemaVersionError
from runstore.sql.dialect import dialect_of

VERSION_TABLE = "runstore_schema_versions"

#: A migration step: one SQL statement (no trailing ``;`` needed, never two statements
#: in one string) or an async callable receiving the connection inside the transaction.
Step = str | Callable[[AsyncConnection], Awaitable[None]]




@dataclass(frozen=True)
class Migration:
    """Version ``version`` of a component: the steps that bring ``version - 1`` to it."""

    version: int
    steps: Sequence[Step]
    description: str = ""


async def ensure_schema(
    conn_or_engine: AsyncEngine | AsyncConnection,
    component: str,
    migrations: Sequence[Migration],
) -> int:
    """Apply the ``migrations`` of ``component`` newer than its stored version; return the version.

    ``migrations`` are numbered 1, 2, 3... in order. All pending ones run in one
    transaction together with the version update, serialized across processes
    (`SqlDialect.schema_transaction` of the engine's dialect, e.g. an advisory lock or
    ``BEGIN IMMEDIATE``), and the stored version is re-read under the lock, so
    concurrent openers apply each step once. A stored version above the newest
    migration raises `SchemaVersionError`. An `AsyncConnection` argument must not be
    inside a transaction; it is committed.
    """
    expected = list(range(1, len(migrations) + 1))
    if [m.version for m in migrations] != expected:
        raise ValueError(f"migrations of {component!r} must be numbered 1..{len(migrations)}")
    latest = len(migrations)
    if isinstance(conn_or_engine, AsyncEngine):
        lock = dialect_of(conn_or_engine).write_lock
        async with conn_or_engine.connect() as conn:
            current = await _read_version(conn, component)
            if current == latest:
                return current
            if lock is None:
                return await _migrate(conn, component, migrations)
            async with lock:
                return await _migrate(conn, component, migrations)
    conn = conn_or_engine
    current = await _read_version(conn, component)
    if current == latest:
        return current
    return await _migrate(conn, component, migrations)


async def _read_version(conn: AsyncConnection, component: str) -> int | None:
    """The stored version without locking (``None`` when unknown or the table is missing)."""
    sql = dialect_of(conn.engine).placeholders(
        f"SELECT version FROM {VERSION_TABLE} WHERE component = ?"
    )
    try:
        row = (await conn.exec_driver_sql(sql, (component,))).first()
    except DBAPIError:
        row = None
    await conn.rollback()
    return None if row is None else int(row[0])


async def _migrate(conn: AsyncConnection, component: str, migrations: Sequence[Migration]) -> int:
    dialect = dialect_of(conn.engine)
    async with dialect.schema_transaction(conn):
        await conn.exec_driver_sql(
            f"CREATE TABLE IF NOT EXISTS {VERSION_TABLE} "
            "(component TEXT PRIMARY KEY, version INTEGER NOT NULL)"
        )
        row = (
            await conn.exec_driver_sql(
                dialect.placeholders(f"SELECT version FROM {VERSION_TABLE} WHERE component = ?"),
                (component,),
            )
        ).first()
        current = 0 if row is None else int(row[0])
        if current > len(migrations):
            raise SchemaVersionError(
                f"the database holds schema version {current} of {component!r}, but this "
                f"runstore knows only up to {len(migrations)}; upgrade runstore"
            )
        for migration in migrations[current:]:
            for step in migration.steps:
                if isinstance(step, str):
                    await conn.exec_driver_sql(step)
                else:
                    await step(conn)
        if current < len(migrations):
            await conn.exec_driver_sql(
                dialect.placeholders(
                    f"INSERT INTO {VERSION_TABLE} (component, version) VALUES (?, ?) "
                    "ON CONFLICT (component) DO UPDATE SET version = excluded.version"
                ),
                (component, len(migrations)),
            )
    return len(migrations)


class _Rehearsal(Exception):
    """Raised inside a rehearsed migration so its transaction rolls back."""


async def pending_sql(
    engine: AsyncEngine, component: str, migrations: Sequence[Migration]
) -> list[str]:
    """The statements `ensure_schema` would run on ``engine`` now, without applying any.

    The pending migrations run in a transaction that is rolled back, and every statement
    that changes something is recorded (reads such as the version check and a migration's
    own probes are left out), ending with the version update. Nothing pending: ``[]``.
    Needs the privileges the migrations need (run it as the DBA, or on an empty copy).
    """
    from sqlalchemy import event

    latest = len(migrations)
    dialect = dialect_of(engine)
    statements: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        first = statement.lstrip().split(None, 1)[0].upper() if statement.strip() else ""
        if first not in ("SELECT", "BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE"):
            statements.append(statement.strip())

    async with engine.connect() as conn:
        current = await _read_version(conn, component) or 0
        if current >= latest:
            return []
        statements.extend(await dialect.script_preamble(conn))
        event.listen(conn.sync_connection, "before_cursor_execute", record)
        try:
            async with dialect.schema_transaction(conn):
                await conn.exec_driver_sql(
                    f"CREATE TABLE IF NOT EXISTS {VERSION_TABLE} "
                    "(component TEXT PRIMARY KEY, version INTEGER NOT NULL)"
                )
                for migration in migrations[current:]:
                    for step in migration.steps:
                        if isinstance(step, str):
                            await conn.exec_driver_sql(step)
                        else:
                            await step(conn)
                raise _Rehearsal
        except _Rehearsal:
            pass
        finally:
            event.remove(conn.sync_connection, "before_cursor_execute", record)
    quoted = component.replace("'", "''")
    statements.append(
        f"INSERT INTO {VERSION_TABLE} (component, version) VALUES ('{quoted}', {latest}) "
        "ON CONFLICT (component) DO UPDATE SET version = excluded.version"
    )
    return statements


def sql_script(statements: Sequence[str]) -> str:
    """``statements`` as one SQL script a DBA can apply (one transaction; ``""`` when empty)."""
    if not statements:
        return ""
    body = "".join(f"{statement};\n" for statement in statements)
    return f"BEGIN;\n{body}COMMIT;\n"
