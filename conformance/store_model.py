"""The plain-dict model the store suite compares a store with (docs/store.md's rules).

Items by ``(namespace, key)``; a search is every live item under the prefix that the
filter matches (order left to the store, pages checked for overlap separately); a
listing is every namespace holding a live item, matched and cut to ``max_depth``.
Filters are evaluated with `runstore.store.matches`, the documented evaluator.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from runstore.store import compile_filter, matches, matches_labels


@dataclass
class ModelItem:
    """One stored item as the model expects it."""

    value: dict[str, Any]
    created_at: datetime | None
    updated_at: datetime | None
    ttl: float | None = None
    expires_at: datetime | None = None


class StoreModel:
    """What a correct store holds; ``now`` is ``None`` when the store's clock is not ours."""

    def __init__(self) -> None:
        self.items: dict[tuple[tuple[str, ...], str], ModelItem] = {}
        #: Every namespace a call named: where a store without ``store_namespace_cleanup``
        #: may still list one.
        self.touched: set[tuple[str, ...]] = set()

    def live(self, now: datetime | None) -> dict[tuple[tuple[str, ...], str], ModelItem]:
        """The items not expired at ``now``."""
        return {
            k: v for k, v in self.items.items()
            if now is None or v.expires_at is None or v.expires_at > now
        }

    def put(
        self, namespace: tuple[str, ...], key: str, value: dict[str, Any], ttl: float | None, now: datetime | None
    ) -> None:
        """A put at ``now`` (``ttl`` in minutes)."""
        previous = self.live(now).get((namespace, key))
        self.items[(namespace, key)] = ModelItem(
            value=value,
            created_at=previous.created_at if previous is not None else now,
            updated_at=now,
            ttl=ttl,
            expires_at=now + timedelta(minutes=ttl) if ttl is not None and now is not None else None,
        )

    def delete(self, namespace: tuple[str, ...], key: str) -> None:
        """A delete (of a missing item too)."""
        self.items.pop((namespace, key), None)

    def get(self, namespace: tuple[str, ...], key: str, now: datetime | None) -> ModelItem | None:
        """The live item, or ``None``."""
        return self.live(now).get((namespace, key))

    def refresh(self, namespace: tuple[str, ...], key: str, now: datetime | None) -> None:
        """A read that refreshes the item's TTL."""
        item = self.items.get((namespace, key))
        if item is not None and item.ttl is not None and now is not None:
            item.expires_at = now + timedelta(minutes=item.ttl)

    def search(
        self, prefix: tuple[str, ...], filter: dict[str, Any] | None, now: datetime | None
    ) -> dict[tuple[tuple[str, ...], str], ModelItem]:
        """Every live item under ``prefix`` matching ``filter``."""
        conditions = compile_filter(filter)
        return {
            (ns, key): item for (ns, key), item in self.live(now).items()
            if ns[: len(prefix)] == prefix and matches(conditions, item.value)
        }

    def namespaces(
        self,
        prefix: tuple[str, ...] | None,
        suffix: tuple[str, ...] | None,
        max_depth: int | None,
        now: datetime | None,
        *,
        loose: bool = False,
    ) -> set[tuple[str, ...]]:
        """The namespaces a listing returns (as a set: the order is checked elsewhere);
        ``loose``: those it may return, counting every namespace a call named."""
        out = set()
        for ns in self.touched if loose else {ns for ns, _ in self.live(now)}:
            if prefix and not matches_labels(ns, "prefix", prefix):
                continue
            if suffix and not matches_labels(ns, "suffix", suffix):
                continue
            out.add(ns[:max_depth] if max_depth is not None else ns)
        return out
