"""Broken stream bridge: a subscriber behind the window silently skips to the oldest retained event.

The stream suite must fail it (contract: a cursor older than the window, or a slow
subscriber that falls behind it, gets a StreamGap, never a silent skip).
"""

from __future__ import annotations

from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory.streams import MemoryStreamBridge, _Cursor, _Run
from runstore.registry import StreamBridgeRegistry
from runstore.streams.protocol import StreamGap
from runstore.urls import BackendURL


class SkipEvictedBridge(MemoryStreamBridge):
    def _find_gap(self, run: _Run, cursor: _Cursor) -> StreamGap | None:
        # BUG (on purpose): evicted events are skipped without telling the subscriber.
        return None


async def _open(url: BackendURL, options: BackendOptions) -> SkipEvictedBridge:
    return await SkipEvictedBridge.open(url, options)  # type: ignore[return-value]


@hookimpl
def runstore_register_stream_bridges(registry: StreamBridgeRegistry) -> None:
    registry.add(
        "broken-skip-evicted", schemes=["broken-skip-evicted"], factory=_open, capabilities=["replay"]
    )
