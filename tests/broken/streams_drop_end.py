"""Broken stream bridge: END is stored in a data slot, so a full buffer drops it.

The stream suite must fail it (contract: END never takes a data slot, so it survives
a full buffer).
"""

from __future__ import annotations

from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory.streams import MemoryStreamBridge
from runstore.registry import StreamBridgeRegistry
from runstore.urls import BackendURL


class DropEndBridge(MemoryStreamBridge):
    async def publish_end(self, run_id: str) -> None:
        run = self._run(run_id)
        # BUG (on purpose): END needs a free slot; with a full buffer it is lost.
        if len(run.buffer) >= self.queue_maxsize:
            return
        await super().publish_end(run_id)


async def _open(url: BackendURL, options: BackendOptions) -> DropEndBridge:
    return await DropEndBridge.open(url, options)  # type: ignore[return-value]


@hookimpl
def runstore_register_stream_bridges(registry: StreamBridgeRegistry) -> None:
    registry.add("broken-drop-end", schemes=["broken-drop-end"], factory=_open, capabilities=["replay"])
