"""Broken saver: data given back to it loses its parent links.

It stores a checkpoint written under a thread id starting with ``imported-`` (the
threads the no-lock-in group copies back into the backend) without its parent, as a
saver with a separate, careless import path would. The no-lock-in group must fail it
(contract: no lock-in: ... imported back ...).
"""

from __future__ import annotations

from typing import Any

from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory.saver import MemorySaver
from runstore.registry import SaverRegistry
from runstore.urls import BackendURL


class ImportDropsParentsSaver(MemorySaver):
    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        configurable = dict(config.get("configurable") or {})
        if str(configurable.get("thread_id", "")).startswith("imported-"):
            # BUG (on purpose): the parent link of imported checkpoints is dropped.
            configurable.pop("checkpoint_id", None)
            config = {**config, "configurable": configurable}
        return super().put(config, checkpoint, metadata, new_versions)


async def _open(url: BackendURL, options: BackendOptions) -> ImportDropsParentsSaver:
    return ImportDropsParentsSaver()


@hookimpl
def runstore_register_savers(registry: SaverRegistry) -> None:
    registry.add("broken-import-parents", schemes=["broken-import-parents"], factory=_open,
                 capabilities=["delta_history", "sync_api"])  # fmt: skip
