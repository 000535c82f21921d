"""The memory store's ``bulk_import`` (`runstore.store.bulk.BulkStore`): items out and in
with their own times and expiry, under the store's lock."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, cast

from runstore.clock import from_micros, to_micros
from runstore.store import Checked, Put, check_ops, expired
from runstore.store.bulk import check_record, put_ops
from runstore.validation import copy_json_value


class _Store(Protocol):
    """What these methods use of `MemoryStore` (whose module imports this one)."""

    _items: dict[tuple[str, ...], dict[str, Any]]
    _lock: threading.Lock

    def now(self) -> Any: ...
    def _texts(self, ops: list[Checked]) -> tuple[list[tuple[int, int]], list[str], list[str]]: ...
    def _split(self, spans: list[tuple[int, int]], vectors: list[list[float]]) -> dict[int, list[list[float]]]: ...
    def _live(self, namespace: tuple[str, ...], key: str, now: datetime) -> Any: ...
    def _drop(self, namespace: tuple[str, ...], key: str) -> None: ...
    def _put(self, op: Put, vectors: list[list[float]], now: datetime) -> None: ...
    async def aembed_documents(self, texts: Sequence[str]) -> list[list[float]]: ...


class MemoryStoreBulk:
    """`MemoryStore`'s export and import of records."""

    async def aexport_namespaces(
        self, *, after: Sequence[str] | None = None, limit: int = 500
    ) -> list[tuple[str, ...]]:
        """Up to ``limit`` namespaces holding live items, in tuple order, after ``after``."""
        store = cast(_Store, self)
        with store._lock:
            now = store.now()
            live = sorted(
                ns for ns, entries in store._items.items()
                if (after is None or ns > tuple(after)) and any(not expired(e.expires_at, now) for e in entries.values())
            )  # fmt: skip
        return live[:limit]

    async def aexport_items(
        self, namespace: Sequence[str], *, after_key: str | None = None, limit: int = 500
    ) -> list[dict[str, Any]]:
        """The namespace's live items above ``after_key`` in key order, as records."""
        store = cast(_Store, self)
        ns = tuple(namespace)
        with store._lock:
            now = store.now()
            entries = store._items.get(ns, {})
            keys = sorted(k for k, e in entries.items() if (after_key is None or k > after_key) and not expired(e.expires_at, now))
            records = []
            for key in keys[:limit]:
                entry = entries[key]
                expires = None if entry.expires_at is None else to_micros(entry.expires_at)
                records.append({
                    "namespace": list(ns), "key": key, "value": copy_json_value(entry.value),
                    "created_at": to_micros(entry.created_at), "updated_at": to_micros(entry.updated_at),
                    "ttl_minutes": entry.ttl, "expires_at": expires,
                })  # fmt: skip
            return records

    async def aimport_items(self, records: Sequence[Mapping[str, Any]], *, overwrite: bool = False) -> int:
        """Write ``records`` as they were where no live item holds the key (``overwrite``:
        replacing one); all or nothing; return how many were written."""
        store = cast(_Store, self)
        checked = [check_record(r) for r in records]
        ops = check_ops(put_ops(checked))
        spans, texts, _ = store._texts(ops)
        vectors = store._split(spans, await store.aembed_documents(texts) if texts else [])
        written = 0
        with store._lock:
            now = store.now()
            for position, (record, op) in enumerate(zip(checked, ops, strict=True)):
                assert isinstance(op, Put) and op.value is not None
                if not overwrite and store._live(op.namespace, op.key, now) is not None:
                    continue
                # Written as a put would, then given the record's own times and expiry.
                store._drop(op.namespace, op.key)
                store._put(op, vectors.get(position, []), now)
                entry = store._items[op.namespace][op.key]
                expires = record["expires_at"]
                entry.created_at = from_micros(record["created_at"])
                entry.updated_at = from_micros(record["updated_at"])
                entry.expires_at = None if expires is None else from_micros(expires)
                written += 1
        return written
