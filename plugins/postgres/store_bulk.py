"""The PostgreSQL memory store's ``bulk_import`` (`runstore.store.bulk.BulkStore`): items
out in key order and back in with their own times and expiry.

An import is one transaction: each record is written where no live item holds its key
(``overwrite``: always) and, when it was, its vectors replaced by the ones this store's
``index`` config embedded beforehand (`runstore.store.bulk.prepare_import`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

from runstore.cancellation import settle
from runstore.clock import to_micros
from runstore.store.bulk import exported_items, prepare_import
from runstore.store.sqlbatch import PutStep
from runstore.store.sqlplan import decode_namespace, encode_namespace
from runstore.validation import loads

from .store_sql import FILTERS, ITEMS, VECTORS, sql

if TYPE_CHECKING:
    from runstore.store.indexing import IndexRules

    from .connections import PostgresCalls


class _Store(Protocol):
    """What these methods use of `PostgresStore` (whose module imports this one)."""

    _leases: PostgresCalls
    index_rules: IndexRules | None

    def now(self) -> Any: ...


_LIVE = "(expires_at IS NULL OR expires_at > ?)"
_NAMESPACES = f"SELECT DISTINCT prefix FROM {ITEMS} WHERE prefix > ? AND {_LIVE} ORDER BY prefix LIMIT ?"
_COLUMNS = "key, value, created_at, updated_at, ttl_minutes, expires_at"
_ITEMS_FIRST = f"SELECT {_COLUMNS} FROM {ITEMS} WHERE prefix = ? AND {_LIVE} ORDER BY key LIMIT ?"
_ITEMS_AFTER = f"SELECT {_COLUMNS} FROM {ITEMS} WHERE prefix = ? AND key > ? AND {_LIVE} ORDER BY key LIMIT ?"
#: Every record in one statement (arrays unnested); the keys it wrote come back.
_INSERT = f"""INSERT INTO {ITEMS} AS old (prefix, key, value, created_at, updated_at, expires_at, ttl_minutes)
    SELECT p, k, v::jsonb, c, u, e, t
    FROM unnest(?::bytea[], ?::text[], ?::text[], ?::bigint[], ?::bigint[], ?::bigint[], ?::float8[]) AS r(p, k, v, c, u, e, t)
    ON CONFLICT (prefix, key) DO UPDATE SET value = excluded.value, created_at = excluded.created_at,
        updated_at = excluded.updated_at, expires_at = excluded.expires_at, ttl_minutes = excluded.ttl_minutes
    {{keep}}
    RETURNING prefix, key"""
_IF_ABSENT = _INSERT.format(keep="WHERE old.expires_at IS NOT NULL AND old.expires_at <= ?")
_OVERWRITE = _INSERT.format(keep="")
_DROP_VECTORS = f"""DELETE FROM {VECTORS} v USING unnest(?::bytea[], ?::text[]) AS w(p, k)
    WHERE v.prefix = w.p AND v.key = w.k"""
_ADD_VECTORS = f"""INSERT INTO {VECTORS} (prefix, key, field, embedding)
    SELECT * FROM unnest(?::bytea[], ?::text[], ?::text[], ?::bytea[])"""


async def _import(conn: Any, rows: Sequence[tuple[PutStep, Mapping[str, Any]]], overwrite: bool, now: int) -> int:
    # One row per key (the last record wins): a statement may not update a row twice.
    latest = {(step.prefix, step.key): (step, record) for step, record in rows}
    steps = [step for step, _ in latest.values()]
    records = [record for _, record in latest.values()]
    columns = [
        [s.prefix for s in steps], [s.key for s in steps], [s.value_text for s in steps],
        [r["created_at"] for r in records], [r["updated_at"] for r in records],
        [r["expires_at"] for r in records], [s.ttl_minutes for s in steps],
    ]  # fmt: skip
    if overwrite:
        written = await conn.fetch(sql(_OVERWRITE), *columns)
    else:
        written = await conn.fetch(sql(_IF_ABSENT), *columns, now)
    done = {(bytes(row[0]), row[1]) for row in written}
    if done:
        await conn.execute(sql(_DROP_VECTORS), [p for p, _ in done], [k for _, k in done])
        vectors = [(s.prefix, s.key, path, v.tobytes()) for s in steps if (s.prefix, s.key) in done
                   for path, v in s.vectors or ()]  # fmt: skip
        if vectors:
            await conn.execute(sql(_ADD_VECTORS), *(list(column) for column in zip(*vectors, strict=True)))
    return len(done)


class PostgresStoreBulk:
    """`PostgresStore`'s export and import of records."""

    async def aexport_namespaces(
        self, *, after: Sequence[str] | None = None, limit: int = 500
    ) -> list[tuple[str, ...]]:
        """Up to ``limit`` namespaces holding live items, in tuple order, after ``after``."""
        store = cast(_Store, self)
        start = b"" if after is None else encode_namespace(after)
        now = to_micros(store.now())
        rows = await store._leases.run(
            lambda conn: conn.fetch(sql(_NAMESPACES), start, now, limit), operation="export namespaces", idempotent=True
        )
        return [decode_namespace(row[0]) for row in rows]

    async def aexport_items(
        self, namespace: Sequence[str], *, after_key: str | None = None, limit: int = 500
    ) -> list[dict[str, Any]]:
        """The namespace's live items above ``after_key`` in key order, as records."""
        store = cast(_Store, self)
        prefix = encode_namespace(namespace)
        now = to_micros(store.now())
        params: tuple[Any, ...]
        if after_key is None:
            text, params = _ITEMS_FIRST, (prefix, now, limit)
        else:
            text, params = _ITEMS_AFTER, (prefix, after_key, now, limit)
        rows = await store._leases.run(lambda conn: conn.fetch(sql(text), *params), operation="export items", idempotent=True)
        return exported_items(namespace, rows, lambda value: value if isinstance(value, dict) else loads(value))

    async def aimport_items(self, records: Sequence[Mapping[str, Any]], *, overwrite: bool = False) -> int:
        """Write ``records`` as they were where no live item holds the key (``overwrite``:
        replacing one); one transaction; return how many were written."""
        store = cast(_Store, self)
        rows = await prepare_import(records, store.index_rules, FILTERS)
        if not rows:
            return 0
        now = to_micros(store.now())
        call = store._leases.run(
            lambda conn: _import(conn, rows, overwrite, now), operation="import items", write=True, begin="BEGIN"
        )
        written: int = await settle(call)
        return written
