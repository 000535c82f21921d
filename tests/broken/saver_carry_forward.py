"""Broken saver: get_tuple carries a channel value forward from an older version.

When a checkpoint stores no value for a channel at its version (a DeltaChannel step),
this saver returns the newest older value instead, which silently truncates delta
history. The saver suite must fail it (contract: never carried forward).
"""

from __future__ import annotations

from typing import Any

from langgraph.checkpoint.base import CheckpointTuple

from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory.layout import Namespace
from runstore.plugins.memory.saver import MemorySaver
from runstore.registry import SaverRegistry
from runstore.urls import BackendURL


class CarryForwardSaver(MemorySaver):
    def _tuple(
        self, thread_id: str, checkpoint_ns: str, ns: Namespace, checkpoint_id: str
    ) -> CheckpointTuple:
        found = super()._tuple(thread_id, checkpoint_ns, ns, checkpoint_id)
        values: dict[str, Any] = found.checkpoint["channel_values"]
        for channel, version in ns.entries[checkpoint_id].versions.items():
            if channel in values:
                continue
            # BUG (on purpose): fall back to the newest older version that has a value.
            older = sorted(
                (ver for (ch, ver), blob in ns.blobs.items()
                 if ch == channel and blob is not None and str(ver) < str(version)),
                key=str,
            )
            if older:
                blob = ns.blobs[(channel, older[-1])]
                assert blob is not None
                values[channel] = self.serde.loads_typed(blob)
        return found


async def _open(url: BackendURL, options: BackendOptions) -> CarryForwardSaver:
    return CarryForwardSaver()


@hookimpl
def runstore_register_savers(registry: SaverRegistry) -> None:
    registry.add(
        "broken-carry-forward",
        schemes=["broken-carry-forward"],
        factory=_open,
        capabilities=["copy_thread", "prune", "delete_for_runs", "delta_history", "sync_api"],
    )
