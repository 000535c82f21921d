"""Broken saver: the delta-history walk follows checkpoint-id order, not parent links.

A fork written after its sibling branch then sees the sibling's writes. The saver
suite must fail it (contract: delta history follows parent links).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import DeltaChannelHistory, get_checkpoint_id

from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory.saver import MemorySaver
from runstore.registry import SaverRegistry
from runstore.urls import BackendURL


class IdOrderWalkSaver(MemorySaver):
    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        if not channels:
            return {}
        configurable = config["configurable"]
        ns = self._ns(configurable["thread_id"], configurable.get("checkpoint_ns", ""))
        result: dict[str, DeltaChannelHistory] = {ch: {"writes": []} for ch in channels}
        if ns is None:
            return result
        target = get_checkpoint_id(config) or ns.latest()
        if target not in ns.entries:
            return result
        # BUG (on purpose): "the previous checkpoint" = the previous id, not the parent.
        older = [cid for cid in ns.order if cid < target]
        remaining = set(channels)
        loads = self.serde.loads_typed
        blocks: dict[str, list[list[Any]]] = {ch: [] for ch in channels}
        for cid in reversed(older):
            if not remaining:
                break
            entry = ns.entries[cid]
            writes = ns.writes.get(cid)
            ordered = writes.ordered() if writes else []
            for ch in list(remaining):
                blocks[ch].append([(t, c, loads(v)) for t, c, v, _ in ordered if c == ch])
                version = entry.versions.get(ch)
                blob = ns.blobs.get((ch, version)) if version is not None else None
                if blob is not None:
                    result[ch]["seed"] = loads(blob)
                    remaining.discard(ch)
        for ch in channels:
            result[ch]["writes"] = [w for block in reversed(blocks[ch]) for w in block]
        return result

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return self.get_delta_channel_history(config=config, channels=channels)


async def _open(url: BackendURL, options: BackendOptions) -> IdOrderWalkSaver:
    return IdOrderWalkSaver()


@hookimpl
def runstore_register_savers(registry: SaverRegistry) -> None:
    registry.add(
        "broken-id-order",
        schemes=["broken-id-order"],
        factory=_open,
        capabilities=["copy_thread", "prune", "delete_for_runs", "delta_history", "sync_api"],
    )
