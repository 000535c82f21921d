"""Broken stream bridges on bad input: one takes any run id, one turns NaN/Infinity into
null (as the Redis bridge once did through orjson).

The stream suite must fail them (contract: a run id is a non-empty string; contract: NaN
and Infinity in data are an InvalidStreamInputError).
"""

from __future__ import annotations

import json
from typing import Any

from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory.streams import MemoryStreamBridge
from runstore.registry import StreamBridgeRegistry
from runstore.urls import BackendURL


class AnyRunIdBridge(MemoryStreamBridge):
    # BUG (on purpose): any run id becomes a string.
    async def publish(self, run_id: Any, event: str, data: Any) -> str:
        return await super().publish(str(run_id), event, data)

    async def publish_end(self, run_id: Any) -> None:
        await super().publish_end(str(run_id))

    async def cleanup(self, run_id: Any, *, delay: float = 0) -> None:
        await super().cleanup(str(run_id), delay=delay)

    async def stream_exists(self, run_id: Any) -> bool:
        return await super().stream_exists(str(run_id))

    def subscribe(self, run_id: Any, **kwargs: Any) -> Any:
        return super().subscribe(str(run_id), **kwargs)


class NanToNullBridge(MemoryStreamBridge):
    async def publish(self, run_id: str, event: str, data: Any) -> str:
        # BUG (on purpose): non-finite numbers silently become null.
        text = json.dumps(data).replace("-Infinity", "null").replace("Infinity", "null").replace("NaN", "null")
        return await super().publish(run_id, event, json.loads(text))


async def _open_any_run_id(url: BackendURL, options: BackendOptions) -> AnyRunIdBridge:
    return await AnyRunIdBridge.open(url, options)  # type: ignore[return-value]


async def _open_nan_to_null(url: BackendURL, options: BackendOptions) -> NanToNullBridge:
    return await NanToNullBridge.open(url, options)  # type: ignore[return-value]


@hookimpl
def runstore_register_stream_bridges(registry: StreamBridgeRegistry) -> None:
    registry.add("broken-any-run-id", schemes=["broken-any-run-id"], factory=_open_any_run_id,
                 capabilities=["replay"])
    registry.add("broken-nan-to-null", schemes=["broken-nan-to-null"], factory=_open_nan_to_null,
                 capabilities=["replay"])
