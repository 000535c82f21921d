"""The sqlite memory store's ``bulk_import`` (`runstore.store.bulk.BulkStore`): items out
in key order and back in with their own times and expiry.

An import is one op of the file's write queue (one transaction): each record is
written where no live item holds its key (``overwrite``: always), its vectors embedded
by this store's ``index`` config beforehand (`runstore.store.bulk.prepare_import`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

from runstore.cancellation import settle
from runstore.clock import to_micros
from runstore.store.bulk import exported_items, prepare_import
from runstore.store.sqlbatch import PutStep
from runstore.store.sqlplan import decode_namespace, encode_namespace

from .errors import translated_errors
from .store_ops import FILTERS, ITEMS, VECTORS

if TYPE_CHECKING:
    from runstore.store.indexing import IndexRules

    from .adapter import WorkerConnection
    from .file import SqliteFile


class _Store(Protocol):
    """What these methods use of `SqliteStore` (whose module imports this one)."""

    _file: SqliteFile
    _reader: WorkerConnection | None
    index_rules: IndexRules | None
    closed_message: str

    def now(self) -> Any: ...


_LIVE = "(expires_at IS NULL OR expires_at > ?)"


def export_namespaces(conn: sqlite3.Connection, after: bytes | None, limit: int, now: int) -> list[bytes]:
    """Distinct stored namespaces above ``after`` holding a live item, ascending."""
    rows = conn.execute(
        f"SELECT DISTINCT prefix FROM {ITEMS} WHERE prefix > ? AND {_LIVE} ORDER BY prefix LIMIT ?",
        (after or b"", now, limit),
    ).fetchall()
    return [bytes(row[0]) for row in rows]


def export_items(conn: sqlite3.Connection, prefix: bytes, after_key: str | None, limit: int, now: int) -> list[tuple[Any, ...]]:
    """The namespace's live rows above ``after_key`` in key order."""
    after = "" if after_key is None else "AND key > ?"
    params = (prefix, now, limit) if after_key is None else (prefix, after_key, now, limit)
    return conn.execute(
        f"SELECT key, value, created_at, updated_at, ttl_minutes, expires_at FROM {ITEMS} "
        f"WHERE prefix = ? {after} AND {_LIVE} ORDER BY key LIMIT ?",
        params,
    ).fetchall()


def import_items(conn: sqlite3.Connection, rows: Sequence[tuple[PutStep, Mapping[str, Any]]], overwrite: bool, now: int) -> int:
    """Write each item where no live one holds its key (``overwrite``: always), inside the
    caller's write transaction; return how many were written."""
    keep = "" if overwrite else f"WHERE {ITEMS}.expires_at IS NOT NULL AND {ITEMS}.expires_at <= ?"
    written = 0
    for step, record in rows:
        params: tuple[Any, ...] = (
            step.prefix, step.key, step.value_text, record["created_at"], record["updated_at"],
            record["expires_at"], step.ttl_minutes,
        )  # fmt: skip
        cursor = conn.execute(
            f"""INSERT INTO {ITEMS} (prefix, key, value, created_at, updated_at, expires_at, ttl_minutes)
VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (prefix, key) DO UPDATE SET value = excluded.value, created_at = excluded.created_at,
    updated_at = excluded.updated_at, expires_at = excluded.expires_at, ttl_minutes = excluded.ttl_minutes
{keep}""",
            params if overwrite else (*params, now),
        )
        if cursor.rowcount <= 0:
            continue
        written += 1
        conn.execute(f"DELETE FROM {VECTORS} WHERE prefix = ? AND key = ?", (step.prefix, step.key))
        if step.vectors:
            conn.executemany(
                f"INSERT INTO {VECTORS} (prefix, key, field, embedding) VALUES (?, ?, ?, ?)",
                [(step.prefix, step.key, path, vector.tobytes()) for path, vector in step.vectors],
            )
    return written


class SqliteStoreBulk:
    """`SqliteStore`'s export and import of records."""

    async def aexport_namespaces(
        self, *, after: Sequence[str] | None = None, limit: int = 500
    ) -> list[tuple[str, ...]]:
        """Up to ``limit`` namespaces holding live items, in tuple order, after ``after``."""
        store = cast(_Store, self)
        reader = store._reader
        if reader is None:
            raise RuntimeError(store.closed_message)
        start = None if after is None else encode_namespace(after)
        with translated_errors("sqlite memory store", "export namespaces"):
            found = await store._file.commits.read(reader, export_namespaces, start, limit, to_micros(store.now()))
        return [decode_namespace(prefix) for prefix in found]

    async def aexport_items(
        self, namespace: Sequence[str], *, after_key: str | None = None, limit: int = 500
    ) -> list[dict[str, Any]]:
        """The namespace's live items above ``after_key`` in key order, as records."""
        store = cast(_Store, self)
        from runstore.validation import loads

        reader = store._reader
        if reader is None:
            raise RuntimeError(store.closed_message)
        prefix = encode_namespace(namespace)
        with translated_errors("sqlite memory store", "export items"):
            rows = await store._file.commits.read(reader, export_items, prefix, after_key, limit, to_micros(store.now()))
        return exported_items(namespace, rows, loads)

    async def aimport_items(self, records: Sequence[Mapping[str, Any]], *, overwrite: bool = False) -> int:
        """Write ``records`` as they were where no live item holds the key (``overwrite``:
        replacing one); one transaction; return how many were written."""
        store = cast(_Store, self)
        rows = await prepare_import(records, store.index_rules, FILTERS)
        if not rows:
            return 0
        with translated_errors("sqlite memory store", "import items"):
            written: int = await settle(
                store._file.commits.submit(import_items, rows, overwrite, to_micros(store.now()))
            )
        return written
