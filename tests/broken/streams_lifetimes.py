"""Broken stream bridges, each breaking one lifetime or heartbeat rule the way a careful
author might. The stream lifetime suite must fail each by the rule's name:

- ``broken-heartbeat-cadence``: heartbeats tick at a fixed cadence, also between events
  that arrive faster (the idle clock is not restarted by an event);
- ``broken-run-id-stays-ended``: a run id that published END stays ended after its
  stream was removed, so a new run under that id cannot publish;
- ``broken-ttl-from-first``: the expiry is set by a run's first publish and never moved,
  so a long run that never ends is cut off while it still publishes;
- ``broken-eager-position``: a subscription without a cursor takes its position when
  ``subscribe`` is called, so events evicted before it is first iterated become a gap.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from runstore.errors import StreamEndedError
from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory.streams import MemoryStreamBridge
from runstore.registry import StreamBridgeRegistry
from runstore.streams.protocol import END, HEARTBEAT, StreamGap, StreamItem
from runstore.urls import BackendURL


class CadenceBridge(MemoryStreamBridge):
    async def _follow(self, run_id: str, last_event_id: str | None, interval: float) -> AsyncGenerator[StreamItem, None]:
        run = self._run(run_id)
        run.subscribers += 1
        cursor = self._start(run, last_event_id)
        # BUG (on purpose): a fixed ticker; events do not restart the idle clock.
        deadline = time.monotonic() + interval
        try:
            while True:
                since = run.news.version
                items: Sequence[StreamItem] = self._collect(run, cursor)
                if not items:
                    await run.news.wait(max(0.0, deadline - time.monotonic()), since)
                    items = self._collect(run, cursor)
                for item in items:
                    yield item
                    if item is END or isinstance(item, StreamGap):
                        return
                if time.monotonic() >= deadline:
                    yield HEARTBEAT
                    deadline += interval
        finally:
            run.subscribers -= 1


class StaysEndedBridge(MemoryStreamBridge):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ended_ids: set[str] = set()

    async def publish_end(self, run_id: str, *, fence: int | None = None) -> None:
        await super().publish_end(run_id, fence=fence)
        self._ended_ids.add(run_id)

    async def publish(self, run_id: str, event: str, data: Any, *, fence: int | None = None) -> str:
        if run_id in self._ended_ids:
            # BUG (on purpose): "ended" is remembered apart from the stream, past its removal.
            raise StreamEndedError(f"run {run_id!r} already published END; no more events")
        return await super().publish(run_id, event, data, fence=fence)


class TtlFromFirstBridge(MemoryStreamBridge):
    async def publish(self, run_id: str, event: str, data: Any, *, fence: int | None = None) -> str:
        run = self._runs.get(run_id)
        first = None if run is None or not run.published else run.expires_at
        event_id = await super().publish(run_id, event, data, fence=fence)
        run = self._runs.get(run_id)
        if run is not None and first is not None:
            # BUG (on purpose): the deadline the first publish set is kept.
            run.expires_at = first
        return event_id


class EagerPositionBridge(MemoryStreamBridge):
    def subscribe(self, run_id: str, *, last_event_id: str | None = None,
                  heartbeat_interval: float | None = None) -> AsyncGenerator[StreamItem, None]:
        run = self._runs.get(run_id) if isinstance(run_id, str) else None
        if last_event_id is None:
            # BUG (on purpose): the position is taken now, not at the first iteration.
            last_event_id = f"0-{(run.first_seq if run is not None else 1) - 1}"
        return super().subscribe(run_id, last_event_id=last_event_id, heartbeat_interval=heartbeat_interval)


BRIDGES: dict[str, type[MemoryStreamBridge]] = {
    "broken-heartbeat-cadence": CadenceBridge,
    "broken-run-id-stays-ended": StaysEndedBridge,
    "broken-ttl-from-first": TtlFromFirstBridge,
    "broken-eager-position": EagerPositionBridge,
}


def _factory(cls: type[MemoryStreamBridge]) -> Any:
    async def open_bridge(url: BackendURL, options: BackendOptions) -> MemoryStreamBridge:
        bridge = await cls.open(url.with_query(), options)
        assert isinstance(bridge, cls)
        return bridge

    return open_bridge


@hookimpl
def runstore_register_stream_bridges(registry: StreamBridgeRegistry) -> None:
    for name, cls in BRIDGES.items():
        registry.add(name, schemes=[name], factory=_factory(cls), capabilities=["replay", "fencing"])


