"""Broken stream bridge: ``subscribe(heartbeat_interval=...)`` is ignored; the bridge default wins.

The stream suite must fail it (contract: the per-subscription heartbeat override applies).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory.streams import MemoryStreamBridge
from runstore.registry import StreamBridgeRegistry
from runstore.streams.protocol import StreamItem
from runstore.urls import BackendURL


class IgnoreOverrideBridge(MemoryStreamBridge):
    def subscribe(
        self,
        run_id: str,
        *,
        last_event_id: str | None = None,
        heartbeat_interval: float | None = None,
    ) -> AsyncIterator[StreamItem]:
        # BUG (on purpose): the subscription's own cadence is dropped.
        return super().subscribe(run_id, last_event_id=last_event_id)


async def _open(url: BackendURL, options: BackendOptions) -> IgnoreOverrideBridge:
    return await IgnoreOverrideBridge.open(url, options)  # type: ignore[return-value]


@hookimpl
def runstore_register_stream_bridges(registry: StreamBridgeRegistry) -> None:
    registry.add(
        "broken-ignore-heartbeat",
        schemes=["broken-ignore-heartbeat"],
        factory=_open,
        capabilities=["replay"],
    )
