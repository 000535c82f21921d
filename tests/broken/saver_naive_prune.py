"""Broken saver: prune(keep_latest) keeps only the latest checkpoint, whatever delta
reconstruction needs. The saver suite must fail it (contract: prune keep_latest keeps
what delta reconstruction needs)."""

from __future__ import annotations

from collections.abc import Sequence

from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory.saver import MemorySaver
from runstore.registry import SaverRegistry
from runstore.urls import BackendURL


class NaivePruneSaver(MemorySaver):
    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        if strategy != "keep_latest":
            return super().prune(thread_ids, strategy=strategy)
        for thread_id in thread_ids:
            for ns in self._threads.get(thread_id, {}).values():
                latest = ns.latest()
                # BUG (on purpose): the ancestors a delta walk reads are dropped too.
                ns.remove(set(ns.entries) - {latest})


async def _open(url: BackendURL, options: BackendOptions) -> NaivePruneSaver:
    return NaivePruneSaver()


@hookimpl
def runstore_register_savers(registry: SaverRegistry) -> None:
    registry.add(
        "broken-naive-prune",
        schemes=["broken-naive-prune"],
        factory=_open,
        capabilities=["copy_thread", "prune", "delete_for_runs", "delta_history", "sync_api"],
    )
