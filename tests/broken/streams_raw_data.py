"""Broken stream bridge: it refuses what has no JSON form but delivers the objects it was
given (an in-process buffer, or pickle on the wire), so one subscriber gets a message
object where another bridge's gets its JSON form.

The stream suite must fail it (contract: stream data arrives in one JSON form).
"""

from __future__ import annotations

from typing import Any

from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory.streams import MemoryStreamBridge
from runstore.registry import StreamBridgeRegistry
from runstore.streams import check_stream_data
from runstore.streams.protocol import StreamEvent
from runstore.urls import BackendURL


class RawDataBridge(MemoryStreamBridge):
    async def publish(self, run_id: str, event: str, data: Any, *, fence: int | None = None) -> str:
        check_stream_data(data)
        event_id = await super().publish(run_id, event, None, fence=fence)
        # BUG (on purpose): the checked form is thrown away and the objects delivered.
        self._run(run_id).buffer[-1] = StreamEvent(event_id, event, data)
        return event_id


async def _open(url: BackendURL, options: BackendOptions) -> RawDataBridge:
    return await RawDataBridge.open(url, options)  # type: ignore[return-value]


@hookimpl
def runstore_register_stream_bridges(registry: StreamBridgeRegistry) -> None:
    registry.add("broken-raw-data", schemes=["broken-raw-data"], factory=_open, capabilities=["replay"])
