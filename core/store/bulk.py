"""The store's ``bulk_import`` methods: items out and back in with their own times and expiry.

A store declaring ``bulk_import`` (`BulkStore`) lists the namespaces holding live items,
exports a namespace's live items in key order as *records*, and imports records as
they were: ``created_at``, ``updated_at``, the per-item TTL in minutes and the expiry
instant are written as given, not taken from the store's clock. A record is JSON-ready:

``{"namespace": [labels], "key": str, "value": {...}, "created_at": micros,
"updated_at": micros, "ttl_minutes": float | None, "expires_at": micros | None}``

(stamps in microseconds since the epoch, `runstore.clock.to_micros`). Vectors are not
part of a record: the importing store embeds each value with its own ``index`` config,
because an embedding is a function of that config (model, dims, fields), not data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from langgraph.store.base import PutOp

from runstore.errors import InvalidStoreInputError
from runstore.store.indexing import IndexRules
from runstore.store.sqlbatch import PutStep, prepare
from runstore.store.sqlplan import FilterSql

#: The keys of a store record, in the order archives write them.
RECORD_KEYS = ("namespace", "key", "value", "created_at", "updated_at", "ttl_minutes", "expires_at")


@runtime_checkable
class BulkStore(Protocol):
    """The methods a store declaring ``bulk_import`` has (`runstore migrate` calls them)."""

    async def aexport_namespaces(self, *, after: Sequence[str] | None = None, limit: int = 500) -> list[tuple[str, ...]]:
        """Up to ``limit`` namespaces holding live items, in tuple order, after ``after``."""
        ...

    async def aexport_items(
        self, namespace: Sequence[str], *, after_key: str | None = None, limit: int = 500
    ) -> list[dict[str, Any]]:
        """The namespace's first ``limit`` live items with keys above ``after_key``, in key
        order, as records (the namespace exactly, not those below it); reads refresh nothing."""
        ...

    async def aimport_items(self, records: Sequence[Mapping[str, Any]], *, overwrite: bool = False) -> int:
        """Write ``records`` with their own times and expiry where no live item holds the
        key (``overwrite``: replacing one); one transaction; return how many were written."""
        ...


def check_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """One record to import, checked (`InvalidStoreInputError` naming the field); the
    namespace becomes a tuple."""
    missing = [key for key in RECORD_KEYS if key not in record]
    if missing:
        raise InvalidStoreInputError(f"a store record lacks {', '.join(missing)}")
    for name in ("created_at", "updated_at"):
        if not _is_int(record[name]):
            raise InvalidStoreInputError(f"a store record's {name} must be integer microseconds, got {record[name]!r}")
    if record["expires_at"] is not None and not _is_int(record["expires_at"]):
        raise InvalidStoreInputError(f"a store record's expires_at must be integer microseconds or null, got {record['expires_at']!r}")
    ttl = record["ttl_minutes"]
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int | float) or ttl <= 0):
        raise InvalidStoreInputError(f"a store record's ttl_minutes must be a positive number or null, got {ttl!r}")
    if not isinstance(record["key"], str) or not isinstance(record["value"], Mapping):
        raise InvalidStoreInputError("a store record's key must be a string and its value a JSON object")
    if not isinstance(record["namespace"], list | tuple):
        raise InvalidStoreInputError(f"a store record's namespace must be a list of labels, got {record['namespace']!r}")
    return {**record, "namespace": tuple(record["namespace"])}


def put_ops(records: Sequence[Mapping[str, Any]]) -> list[PutOp]:
    """The records as puts (so the store's own checks and embedding apply to them)."""
    return [PutOp(tuple(r["namespace"]), r["key"], r["value"], None, r["ttl_minutes"]) for r in records]


async def prepare_import(
    records: Sequence[Mapping[str, Any]], index: IndexRules | None, filters: FilterSql
) -> list[tuple[PutStep, dict[str, Any]]]:
    """A SQL store's ``aimport_items`` input: each record checked (`check_record`) beside its
    put step, prepared as a put of the store is (its checks, embedded by ``index``)."""
    checked = [check_record(r) for r in records]
    steps = await prepare(put_ops(checked), index, filters)
    return [(step, record) for step, record in zip(steps, checked, strict=True) if isinstance(step, PutStep)]


def exported_items(
    namespace: Sequence[str], rows: Iterable[Sequence[Any]], decode: Callable[[Any], Any]
) -> list[dict[str, Any]]:
    """``aexport_items`` records from a SQL store's ``(key, value, created_at, updated_at,
    ttl_minutes, expires_at)`` rows; ``decode`` turns a stored value into its dict."""
    return [
        {"namespace": list(namespace), "key": key, "value": decode(value), "created_at": created,
         "updated_at": updated, "ttl_minutes": ttl, "expires_at": expires}
        for key, value, created, updated, ttl, expires in rows
    ]  # fmt: skip


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
