"""The saver's hot statements as server functions, for connections behind a transaction pooler.

Behind a transaction pooler (``pooler=transaction``) a connection keeps no prepared
statement between exchanges, so PostgreSQL parses and plans every statement on every
call, and asyncpg first asks the server to describe it (one more round trip). For the
saver's few large statements (a put, a pending-writes call, the two head reads) that
costs more than running them (docs/benchmarks.md, "Behind a transaction pooler"). A PL/pgSQL function keeps the plans of its statements for the life of
the server session, and server sessions outlive the pooler's transactions, so the
saver calls each such statement through a function wrapping it: only the short call is
parsed and planned each time.

Each function is named by a digest of the statement it wraps, of the schema version its
tables are at and of this module's wrapping rule, so two runstore versions sharing a
database each call their own, a migration that changes the tables gets new functions,
and a function, once created, never changes (the ones an upgrade leaves unused stay:
another process may still call them). The functions live in the saver's schema, are
created when the saver opens with migrations on or runs ``setup()`` (missing ones only;
the server describes each statement, which gives the parameter and column types), and
are only looked up when it opens with migrations off. A statement whose function is missing and cannot
be created (e.g. the role may not create functions) is sent as itself, as before.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["function_name", "statement_functions"]

#: Part of every function's digest: change it when the wrapping below changes.
_WRAPPING = "1"
_PREFIX = "runstore_q_"
#: Dollar-quote tag of the function bodies (no statement of the saver contains it).
_TAG = "$runstore_body$"

_EXISTING = (
    "SELECT p.proname, p.pronargs, p.proretset FROM pg_proc p WHERE p.proname = ANY($1::text[])"
    " AND p.pronamespace = current_schema()::regnamespace"
)


def function_name(statement: str, schema_version: int) -> str:
    """The name of the function wrapping ``statement`` on tables at ``schema_version``."""
    key = f"{_WRAPPING}\n{schema_version}\n{statement}"
    return _PREFIX + hashlib.sha256(key.encode()).hexdigest()[:20]


async def statement_functions(
    conn: Any, statements: Iterable[str], *, schema_version: int, create: bool
) -> Mapping[str, str]:
    """For each of ``statements`` whose function exists in the current schema (or, with
    ``create``, could be created there), the statement calling it instead; the others
    are left out. ``conn`` is a raw asyncpg connection outside a transaction, on tables
    at ``schema_version``."""
    import asyncpg

    wanted = {function_name(s, schema_version): s for s in statements}
    if _TAG in "".join(wanted.values()):
        raise ValueError(f"a statement contains the function body's quote tag {_TAG}")
    present = {
        name: _call(name, nargs, rows)
        for name, nargs, rows in await conn.fetch(_EXISTING, list(wanted))
    }
    calls: dict[str, str] = {}
    for name, statement in wanted.items():
        call = present.get(name)
        if call is None:
            if not create:
                continue
            ddl, call = _wrap(name, statement, await conn.prepare(statement))
            try:
                await conn.execute(ddl)
            except (asyncpg.DuplicateFunctionError, asyncpg.UniqueViolationError):
                pass  # another process created the same function meanwhile
            except asyncpg.InsufficientPrivilegeError:
                continue  # not ours to create: the statement goes as itself
        calls[statement] = call
    return calls


def _wrap(name: str, statement: str, described: Any) -> tuple[str, str]:
    """The ``CREATE FUNCTION`` wrapping ``statement`` and the statement calling it, from
    asyncpg's description of ``statement`` (parameter and column types)."""
    params = [_type(t) for t in described.get_parameters()]
    columns = [(a.name, _type(a.type)) for a in described.get_attributes()]
    signature = f"{name}({', '.join(params)})"
    if columns:
        table = ", ".join(f'"{column}" {type_}' for column, type_ in columns)
        # The output columns are also variables inside the body: let the statement's
        # column references win, as they did when it ran on its own.
        body = f"#variable_conflict use_column\nBEGIN\nRETURN QUERY {statement};\nEND"
        returns = f"TABLE ({table})"
    else:
        body = f"BEGIN\n{statement};\nEND"
        returns = "void"
    ddl = (
        f"CREATE FUNCTION {signature} RETURNS {returns} LANGUAGE plpgsql"
        f" AS {_TAG}\n{body}\n{_TAG}"
    )
    return ddl, _call(name, len(params), bool(columns))


def _call(name: str, nargs: int, rows: bool) -> str:
    """The statement calling function ``name`` with the wrapped statement's parameters."""
    args = ", ".join(f"${i}" for i in range(1, nargs + 1))
    return f"SELECT * FROM {name}({args})" if rows else f"SELECT {name}({args})"


def _type(t: Any) -> str:
    """A type as DDL names it, from asyncpg's description (``text[]``, ``int8``, ...)."""
    return t.name if t.schema in ("pg_catalog", "") else f'"{t.schema}".{t.name}'
