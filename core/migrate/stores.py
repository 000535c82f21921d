"""The store kind of a migration: namespaces and their items, with times and TTL state.

A store declaring ``bulk_import`` (`runstore.store.bulk.BulkStore`) is read and written
with its items' own ``created_at``/``updated_at``, TTL and expiry instant; any other
``BaseStore`` goes through the public API (`alist_namespaces`, `asearch` pages without
refreshing TTLs, `abatch` puts): read that way an item's TTL is unknown (it comes over
without expiry), and written that way its times become the copy's. Expired items are
not exported. Vectors are never copied: the destination embeds each value with its own
``index`` config.

A namespace is the unit the ledger records and conflicts and digests are reported by
(`namespace_name`). An item the destination holds with another value is a
conflict, except one the copy itself wrote earlier (same ``created_at``) whose source
copy was updated since: a catch-up pass writes that one over.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from langgraph.store.base import GetOp, PutOp

from runstore.clock import to_micros
from runstore.errors import MigrationConflictError
from runstore.migrate.fingerprints import canonical
from runstore.store.bulk import BulkStore

#: Namespaces listed and items read or written per call.
PAGE = 500
Record = dict[str, Any]


def namespace_name(namespace: Sequence[str]) -> str:
    """How a namespace is named in reports and the ledger: its labels joined by ``/`` (a
    ``/`` or ``%`` inside a label escaped as in URLs, so two namespaces never share a name)."""
    return "/".join(label.replace("%", "%25").replace("/", "%2F") for label in namespace)


class StoreSide:
    """One side's store, read and written through ``bulk_import`` where it has it."""

    def __init__(self, store: Any) -> None:
        self.store = store
        #: Whether the store keeps items' times and TTL state across a copy.
        self.native = isinstance(store, BulkStore)

    async def namespaces(self) -> AsyncIterator[tuple[str, ...]]:
        """Every namespace holding a live item, in tuple order."""
        if self.native:
            after: tuple[str, ...] | None = None
            while True:
                page = await self.store.aexport_namespaces(after=after, limit=PAGE)
                for namespace in page:
                    yield namespace
                if len(page) < PAGE:
                    return
                after = page[-1]
        offset = 0
        found: list[tuple[str, ...]] = []
        while True:
            page = await self.store.alist_namespaces(limit=PAGE, offset=offset)
            found.extend(tuple(ns) for ns in page)
            if len(page) < PAGE:
                break
            offset += PAGE
        for namespace in sorted(set(found)):
            yield namespace

    async def pages(self, namespace: tuple[str, ...]) -> AsyncIterator[list[Record]]:
        """The namespace's live items (not those of namespaces below it) in key order, as
        records in pages of up to `PAGE`."""
        if self.native:
            after: str | None = None
            while True:
                page = await self.store.aexport_items(namespace, after_key=after, limit=PAGE)
                if page:
                    yield [dict(record) for record in page]
                if len(page) < PAGE:
                    return
                after = page[-1]["key"]
        # A search under the namespace also returns deeper namespaces' items: kept out.
        items: list[Record] = []
        offset = 0
        while True:
            found = await self.store.asearch(namespace, limit=PAGE, offset=offset, refresh_ttl=False)
            items.extend(_record(item) for item in found if tuple(item.namespace) == namespace)
            if len(found) < PAGE:
                break
            offset += PAGE
        items.sort(key=lambda record: record["key"])
        for start in range(0, len(items), PAGE):
            yield items[start : start + PAGE]

    async def held(self, namespace: tuple[str, ...], keys: Sequence[str], after: str | None) -> dict[str, Record]:
        """The live items the store holds at ``keys`` (ascending, all above ``after``) of
        ``namespace``; TTLs not refreshed. With ``bulk_import`` a key range is read in pages
        (one query each) instead of one get per key."""
        if not keys:
            return {}
        if not self.native:
            found = await self.store.abatch([GetOp(namespace, key, refresh_ttl=False) for key in keys])
            return {key: _record(item) for key, item in zip(keys, found, strict=True) if item is not None}
        wanted, last = set(keys), keys[-1]
        out: dict[str, Record] = {}
        while True:
            page = await self.store.aexport_items(namespace, after_key=after, limit=PAGE)
            out.update((r["key"], dict(r)) for r in page if r["key"] in wanted)
            if len(page) < PAGE or page[-1]["key"] >= last:
                return out
            after = page[-1]["key"]

    async def write(self, records: Sequence[Record], *, overwrite: bool) -> int:
        """Write ``records`` (as they were where the store has ``bulk_import``); return how many."""
        if not records:
            return 0
        if self.native:
            return int(await self.store.aimport_items(records, overwrite=overwrite))
        ops = [PutOp(tuple(r["namespace"]), r["key"], r["value"], None, r["ttl_minutes"]) for r in records]
        await self.store.abatch(ops)
        return len(records)


def _record(item: Any) -> Record:
    """A record of an `Item` read through the public API (TTL state unknown)."""
    return {
        "namespace": list(item.namespace), "key": item.key, "value": item.value,
        "created_at": _micros(item.created_at), "updated_at": _micros(item.updated_at),
        "ttl_minutes": None, "expires_at": None,
    }  # fmt: skip


def _micros(when: datetime) -> int:
    # A store that hands out naive times (some stock stores do) stores UTC.
    return to_micros(when if when.tzinfo is not None else when.replace(tzinfo=UTC))


async def live_pages(side: StoreSide, skip: Mapping[str, Any] | None = None) -> AsyncIterator[tuple[tuple[str, ...], list[Record]]]:
    """``(namespace, page)`` of a live store, namespaces in order, a namespace's pages
    contiguous; namespaces named in ``skip`` are left out."""
    async for namespace in side.namespaces():
        if skip and namespace_name(namespace) in skip:
            continue
        async for page in side.pages(namespace):
            yield namespace, page


def _plan(page: list[Record], held: dict[str, Record]) -> tuple[list[Record], list[Record], list[Record], int]:
    """Split a source page into new items, catch-up updates, conflicts, and how many are there already."""
    fresh: list[Record] = []
    updates: list[Record] = []
    conflicts: list[Record] = []
    present = 0
    for record in page:
        there = held.get(record["key"])
        if there is None:
            fresh.append(record)
        elif canonical(there["value"]) == canonical(record["value"]):
            present += 1
        elif there["created_at"] == record["created_at"] and record["updated_at"] > there["updated_at"]:
            updates.append(record)
        else:
            conflicts.append(record)
    return fresh, updates, conflicts, present


def _size(records: Sequence[Record]) -> int:
    return sum(len(canonical(record["value"])) for record in records)


async def prescan(pages: AsyncIterator[tuple[tuple[str, ...], list[Record]]], destination: StoreSide,
                  counts: Any, *, dry_run: bool) -> None:  # fmt: skip
    """Find the namespaces holding conflicting items (and, in a dry run, count what a pass
    would copy); writes nothing."""
    current: tuple[str, ...] | None = None
    after: str | None = None
    async for namespace, page in pages:
        if namespace != current:
            current, after = namespace, None
            if dry_run:
                counts.threads += 1
        held = await destination.held(namespace, [record["key"] for record in page], after)
        after = page[-1]["key"]
        fresh, updates, conflicts, present = _plan(page, held)
        name = namespace_name(namespace)
        if conflicts and name not in counts.conflicts:
            counts.conflicts.append(name)
        if dry_run:
            counts.copied += len(fresh) + len(updates)
            counts.present += present
            counts.bytes += _size(fresh) + _size(updates)


async def copy(pages: AsyncIterator[tuple[tuple[str, ...], list[Record]]], destination: StoreSide,
               on_conflict: str, ledger: Any, counts: Any, progress: Any = None,
               conflicted: set[str] | None = None) -> None:  # fmt: skip
    """Copy every page into ``destination``, namespace by namespace, recorded in ``ledger``.
    Under ``skip``, a namespace in ``conflicted`` (found before any write) is left whole."""
    current: str | None = None
    after: str | None = None
    skipped: set[str] = set(conflicted or ()) if on_conflict == "skip" else set()
    async for namespace, page in pages:
        name = namespace_name(namespace)
        if name != current:
            if current is not None:
                ledger.finish("store", current)
            current, after = name, None
            counts.threads += 1
            ledger.begin("store", name)
            if name in skipped and name not in counts.conflicts:
                counts.conflicts.append(name)
        if name in skipped:
            continue
        held = await destination.held(namespace, [record["key"] for record in page], after)
        after = page[-1]["key"]
        fresh, updates, conflicts, present = _plan(page, held)
        if conflicts:
            if on_conflict == "fail":  # appeared after the prescan: a concurrent writer
                raise MigrationConflictError("store", [name])
            if name not in counts.conflicts:
                counts.conflicts.append(name)
            if on_conflict == "skip":
                skipped.add(name)
            else:
                updates += conflicts
        if name in skipped:
            continue
        written = await destination.write(fresh, overwrite=False) + await destination.write(updates, overwrite=True)
        counts.copied += written
        counts.present += present + len(fresh) + len(updates) - written
        counts.bytes += _size(fresh) + _size(updates)
        if progress is not None:
            progress("store", counts.threads, counts.copied)
    if current is not None:
        ledger.finish("store", current)


class NamespaceDigest:
    """A namespace's items fed in key order: key and value, plus the times (``times``) and
    the TTL state (``ttl``) where both sides keep them."""

    def __init__(self, *, times: bool, ttl: bool) -> None:
        self._hash = hashlib.sha256()
        self._fields = ("key", "value") + (("created_at", "updated_at") if times else ()) + (
            ("ttl_minutes", "expires_at") if ttl else ()
        )

    def update(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Add records in key order."""
        for record in records:
            self._hash.update(canonical({name: record.get(name) for name in self._fields}))

    def hexdigest(self) -> str:
        """The digest so far."""
        return self._hash.hexdigest()


async def verify(pages: AsyncIterator[tuple[tuple[str, ...], list[Record]]], destination: StoreSide,
                 *, times: bool, ttl: bool, skip: set[str]) -> list[str]:  # fmt: skip
    """The namespaces (named) whose items differ between the source's ``pages`` and ``destination``."""
    bad: list[str] = []
    current: tuple[str, ...] | None = None
    mine = NamespaceDigest(times=times, ttl=ttl)

    async def differs(namespace: tuple[str, ...], expected: NamespaceDigest) -> bool:
        theirs = NamespaceDigest(times=times, ttl=ttl)
        async for page in destination.pages(namespace):
            theirs.update(page)
        return theirs.hexdigest() != expected.hexdigest()

    async for namespace, page in pages:
        if namespace != current:
            if current is not None and await differs(current, mine):
                bad.append(namespace_name(current))
            current, mine = namespace, NamespaceDigest(times=times, ttl=ttl)
        mine.update(page)
    if current is not None and await differs(current, mine):
        bad.append(namespace_name(current))
    return [name for name in bad if name not in skip]


def to_json(record: Mapping[str, Any]) -> dict[str, Any]:
    """A record as an archive line."""
    return {"kind": "store_item", **{key: record[key] for key in ("namespace", "key", "value", "created_at",
                                                                  "updated_at", "ttl_minutes", "expires_at")}}  # fmt: skip

