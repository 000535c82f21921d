"""Broken savers whose retention removes what it must keep. The retention suite must
fail each, naming the contract: one drops an interrupted checkpoint's pending writes
(a resume loses its interrupts and resume values), one keeps the newest checkpoints but
not the ancestors their delta reconstruction reads, one leaves a kept checkpoint naming
a parent the sweep removed."""

from __future__ import annotations

from langgraph.checkpoint.serde.types import INTERRUPT

from runstore.checkpoint.policy import RetentionPolicy, ThreadSwept, plan_thread
from runstore.checkpoint.threads import Removed
from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory.layout import footprint
from runstore.plugins.memory.saver import MemorySaver
from runstore.registry import SaverRegistry
from runstore.urls import BackendURL

CAPABILITIES = ["copy_thread", "prune", "delete_for_runs", "delta_history", "sync_api", "retention"]


class DropsInterruptWritesSaver(MemorySaver):
    def _sweep_thread(
        self, thread_id: str, policy: RetentionPolicy, now: int, dry_run: bool
    ) -> ThreadSwept | None:
        swept = super()._sweep_thread(thread_id, policy, now, dry_run)
        if swept is None or swept.expired or dry_run:
            return swept
        with self._lock:
            for ns in self._threads.get(thread_id, {}).values():
                for checkpoint_id, writes in list(ns.writes.items()):
                    # BUG (on purpose): "stale" interrupts are cleared, the head's too.
                    if any(w[1] == INTERRUPT for w in writes.by_key.values()):
                        del ns.writes[checkpoint_id]
        return swept


class DropsDeltaAncestorSaver(MemorySaver):
    def _sweep_thread(
        self, thread_id: str, policy: RetentionPolicy, now: int, dry_run: bool
    ) -> ThreadSwept | None:
        with self._lock:
            record = self._records.get(thread_id)
            if record is None or self._info(thread_id) is None:
                return None
            namespaces = self._threads[thread_id]
            plan = plan_thread(
                lambda: {name: ns.graph() for name, ns in namespaces.items()},
                policy,
                now=now,
                touched_at=record.touched_at,
            )
            if plan.expire:
                return ThreadSwept(thread_id, True, self._purge([thread_id], dry_run=dry_run))
            removed = Removed()
            for ns in namespaces.values():
                ids = sorted(ns.entries)
                keep = set(ids if policy.keep_last is None else ids[-policy.keep_last :])
                if policy.max_age is not None:
                    cutoff = now - int(policy.max_age * 1_000_000)
                    keep = {c for c in keep if ns.entries[c].created_at >= cutoff}
                # BUG (on purpose): the head and the newest stay, what they rebuild from goes.
                keep.add(ids[-1])
                target = ns.copy() if dry_run else ns
                before = footprint([target])
                target.remove(set(ids) - keep)
                removed += before - footprint([target])
            if not dry_run:
                record.swept_at, record.claimed_until = now, None
            return ThreadSwept(thread_id, False, removed)


class KeepsRemovedParentSaver(MemorySaver):
    def _sweep_thread(
        self, thread_id: str, policy: RetentionPolicy, now: int, dry_run: bool
    ) -> ThreadSwept | None:
        with self._lock:
            parents = {
                (name, cid): entry.parent
                for name, ns in self._threads.get(thread_id, {}).items()
                for cid, entry in ns.entries.items()
            }
        swept = super()._sweep_thread(thread_id, policy, now, dry_run)
        with self._lock:
            for name, ns in self._threads.get(thread_id, {}).items():
                for cid, entry in ns.entries.items():
                    # BUG (on purpose): the link to a removed parent is put back.
                    entry.parent = parents.get((name, cid), entry.parent)
        return swept


async def _writes(url: BackendURL, options: BackendOptions) -> DropsInterruptWritesSaver:
    return DropsInterruptWritesSaver()


async def _ancestor(url: BackendURL, options: BackendOptions) -> DropsDeltaAncestorSaver:
    return DropsDeltaAncestorSaver()


async def _parent(url: BackendURL, options: BackendOptions) -> KeepsRemovedParentSaver:
    return KeepsRemovedParentSaver()


@hookimpl
def runstore_register_savers(registry: SaverRegistry) -> None:
    registry.add("broken-retention-writes", schemes=["broken-retention-writes"], factory=_writes,
                 capabilities=CAPABILITIES)
    registry.add("broken-retention-ancestor", schemes=["broken-retention-ancestor"], factory=_ancestor,
                 capabilities=CAPABILITIES)
    registry.add("broken-retention-parent", schemes=["broken-retention-parent"], factory=_parent,
                 capabilities=CAPABILITIES)
