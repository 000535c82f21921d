"""Broken saver: pending writes come back in insertion order, not `writes_sort_key` order.

The saver suite must fail it (contract: pending_writes in writes_sort_key order).
"""

from __future__ import annotations

from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory import layout
from runstore.plugins.memory import saver as memory_saver
from runstore.registry import SaverRegistry
from runstore.urls import BackendURL


class _InsertionOrderWrites(layout.PendingWrites):
    def ordered(self) -> list[layout.StoredWrite]:
        # BUG (on purpose): no sort.
        return list(self.by_key.values())


class UnsortedWritesSaver(memory_saver.MemorySaver):
    def put_writes(self, config, writes, task_id, task_path=""):  # type: ignore[no-untyped-def]
        configurable = config["configurable"]
        ns = self._threads.setdefault(configurable["thread_id"], {}).setdefault(
            configurable.get("checkpoint_ns", ""), layout.Namespace()
        )
        if configurable["checkpoint_id"] not in ns.writes:
            ns.writes[configurable["checkpoint_id"]] = _InsertionOrderWrites()
        super().put_writes(config, writes, task_id, task_path)


async def _open(url: BackendURL, options: BackendOptions) -> UnsortedWritesSaver:
    return UnsortedWritesSaver()


@hookimpl
def runstore_register_savers(registry: SaverRegistry) -> None:
    registry.add(
        "broken-unsorted-writes",
        schemes=["broken-unsorted-writes"],
        factory=_open,
        capabilities=["copy_thread", "prune", "delete_for_runs", "delta_history", "sync_api"],
    )
