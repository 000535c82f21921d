"""``memory://`` long-term memory store: LangGraph's ``BaseStore`` in process, on runstore's rules.

Items live in dicts guarded by a lock; nothing outlives the process. A batch is checked
whole first (`runstore.store.check_ops`), then its texts and queries are embedded, then
its ops apply in order under the lock, each seeing the puts before it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from langgraph.store.base import Item, SearchItem

from runstore.clock import Clock, system_clock
from runstore.store import (
    Checked,
    Get,
    ListNamespaces,
    Put,
    Search,
    StoreBase,
    check_ops,
    cosine,
    expired,
    expiry,
    list_namespaces,
    matches,
    texts_to_embed,
    within,
)
from runstore.validation import copy_json_value

from .store_bulk import MemoryStoreBulk

if TYPE_CHECKING:
    from runstore.options import BackendOptions
    from runstore.urls import BackendURL


@dataclass
class _Entry:
    value: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    ttl: float | None
    expires_at: datetime | None
    vectors: list[list[float]] = field(default_factory=list)


#: What a batch needs embedded before it applies: per put position, its vectors; per
#: query text, its vector.
_Embedded = tuple[dict[int, list[list[float]]], dict[str, list[float]]]


class MemoryStore(MemoryStoreBulk, StoreBase):
    """In-process store: namespaces, filtered and semantic search, TTL on ``clock``."""

    def __init__(
        self,
        *,
        index: Mapping[str, Any] | None = None,
        ttl: Mapping[str, Any] | None = None,
        clock: Clock = system_clock,
    ) -> None:
        super().__init__(index=index, ttl=ttl, clock=clock)
        self._items: dict[tuple[str, ...], dict[str, _Entry]] = {}
        self._lock = threading.Lock()

    @classmethod
    async def open(cls, url: BackendURL, options: BackendOptions) -> MemoryStore:
        """Open ``memory://`` (no URL options); ``index``/``ttl`` from `runstore.open`'s
        ``store_index``/``store_ttl``."""
        from runstore.store.base import store_config

        url.check_options(set())
        index, ttl = store_config(options)
        return cls(index=index, ttl=ttl)

    # -- batches -----------------------------------------------------------------------

    def _texts(self, ops: list[Checked]) -> tuple[list[tuple[int, int]], list[str], list[str]]:
        """Per put the slice of texts it embeds, the texts, and the distinct queries."""
        spans: list[tuple[int, int]] = []
        texts: list[str] = []
        queries: list[str] = []
        rules = self.index_rules
        for op in ops:
            if rules is not None and isinstance(op, Put) and op.value is not None:
                found = texts_to_embed(op.value, op.index, rules)
                spans.append((len(texts), len(texts) + len(found)))
                texts.extend(text for _, text in found)
            else:
                spans.append((0, 0))
            if rules is not None and isinstance(op, Search) and op.query and op.query not in queries:
                queries.append(op.query)
        return spans, texts, queries

    @staticmethod
    def _split(spans: list[tuple[int, int]], vectors: list[list[float]]) -> dict[int, list[list[float]]]:
        return {i: vectors[a:b] for i, (a, b) in enumerate(spans) if b > a}

    def batch(self, ops: Iterable[Any]) -> list[Any]:
        """Run ``ops`` in order and return one result per op."""
        checked = check_ops(ops)
        spans, texts, queries = self._texts(checked)
        vectors = self.embed_documents(texts) if texts else []
        embedded = self._split(spans, vectors), {q: self.embed_query(q) for q in queries}
        return self._apply(checked, embedded)

    async def abatch(self, ops: Iterable[Any]) -> list[Any]:
        """Run ``ops`` in order and return one result per op."""
        checked = check_ops(ops)
        spans, texts, queries = self._texts(checked)
        vectors = await self.aembed_documents(texts) if texts else []
        embedded = self._split(spans, vectors), {q: await self.aembed_query(q) for q in queries}
        return self._apply(checked, embedded)

    def _apply(self, ops: list[Checked], embedded: _Embedded) -> list[Any]:
        vectors, queries = embedded
        with self._lock:
            now = self.now()
            results: list[Any] = []
            for position, op in enumerate(ops):
                if isinstance(op, Get):
                    results.append(self._get(op, now))
                elif isinstance(op, Put):
                    self._put(op, vectors.get(position, []), now)
                    results.append(None)
                elif isinstance(op, Search):
                    results.append(self._search(op, queries.get(op.query or ""), now))
                else:
                    results.append(self._list(op, now))
            return results

    # -- one op each (under the lock) ---------------------------------------------------

    def _live(self, namespace: tuple[str, ...], key: str, now: datetime) -> _Entry | None:
        entries = self._items.get(namespace)
        entry = entries.get(key) if entries else None
        if entry is None or not expired(entry.expires_at, now):
            return entry
        self._drop(namespace, key)
        return None

    def _drop(self, namespace: tuple[str, ...], key: str) -> None:
        entries = self._items.get(namespace)
        if entries is not None:
            entries.pop(key, None)
            if not entries:
                del self._items[namespace]

    @staticmethod
    def _touch(entry: _Entry, refresh: bool, now: datetime) -> None:
        if refresh and entry.ttl is not None:
            entry.expires_at = expiry(now, entry.ttl)

    def _get(self, op: Get, now: datetime) -> Item | None:
        entry = self._live(op.namespace, op.key, now)
        if entry is None:
            return None
        self._touch(entry, op.refresh_ttl, now)
        return Item(
            value=copy_json_value(entry.value),
            key=op.key,
            namespace=op.namespace,
            created_at=entry.created_at,
            updated_at=entry.updated_at,
        )

    def _put(self, op: Put, vectors: list[list[float]], now: datetime) -> None:
        if op.value is None:
            self._drop(op.namespace, op.key)
            return
        previous = self._live(op.namespace, op.key, now)
        self._items.setdefault(op.namespace, {})[op.key] = _Entry(
            value=op.value,
            created_at=previous.created_at if previous is not None else now,
            updated_at=now,
            ttl=op.ttl,
            expires_at=expiry(now, op.ttl),
            vectors=vectors,
        )

    def _search(self, op: Search, query: list[float] | None, now: datetime) -> list[SearchItem]:
        found: list[tuple[tuple[str, ...], str, _Entry]] = []
        for namespace, entries in self._items.items():
            if not within(namespace, op.prefix):
                continue
            for key, entry in entries.items():
                if not expired(entry.expires_at, now) and matches(op.conditions, entry.value):
                    found.append((namespace, key, entry))
        # Newest first, then by namespace and key: one order, so pages never overlap.
        found.sort(key=lambda f: (f[0], f[1]))
        found.sort(key=lambda f: f[2].updated_at, reverse=True)
        scores: list[float | None] = [None] * len(found)
        if query is not None:
            scores = [max(cosine(query, e.vectors)) if e.vectors else None for _, _, e in found]
            ranked = sorted(
                range(len(found)),
                key=lambda i: (scores[i] is None, -(scores[i] or 0.0)),
            )
            found = [found[i] for i in ranked]
            scores = [scores[i] for i in ranked]
        page = slice(op.offset, op.offset + op.limit)
        out = []
        for (namespace, key, entry), score in zip(found[page], scores[page], strict=True):
            self._touch(entry, op.refresh_ttl, now)
            out.append(
                SearchItem(
                    namespace=namespace,
                    key=key,
                    value=copy_json_value(entry.value),
                    created_at=entry.created_at,
                    updated_at=entry.updated_at,
                    score=score,
                )
            )
        return out

    def _list(self, op: ListNamespaces, now: datetime) -> list[tuple[str, ...]]:
        live = [
            ns for ns, entries in self._items.items()
            if any(not expired(e.expires_at, now) for e in entries.values())
        ]
        return list_namespaces(live, op)

    # -- expiry ----------------------------------------------------------------------

    async def asweep_expired(self) -> int:
        """Delete every item whose TTL has run out; return how many went."""
        return self.sweep_expired()

    def sweep_expired(self) -> int:
        """`asweep_expired` for synchronous callers."""
        with self._lock:
            now = self.now()
            gone = [
                (ns, key) for ns, entries in self._items.items()
                for key, entry in entries.items() if expired(entry.expires_at, now)
            ]
            for ns, key in gone:
                self._drop(ns, key)
            return len(gone)
