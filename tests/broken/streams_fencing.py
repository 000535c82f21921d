"""Broken fenced stream bridges, each missing one part of the fencing contract.

The stream fencing suite (`runstore.conformance.test_stream_fencing`) must fail each
by the rule's name: a bridge that ignores tokens (a stale worker's events reach
subscribers after a takeover), one whose END ignores them (a stale worker ends the new
holder's stream), one that compares tokens as floats (wrong above 2**53), and one
that checks the token in a step apart from the append.
"""

from __future__ import annotations

import asyncio
from typing import Any

from runstore.errors import StaleFenceError
from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory.streams import MemoryStreamBridge
from runstore.registry import StreamBridgeRegistry
from runstore.urls import BackendURL


class FenceIgnored(MemoryStreamBridge):
    def _admit(self, run_id: str, fence: int | None) -> None:
        return None  # BUG (on purpose): every token passes

    def _current_fence(self, run_id: str, now: float) -> int:
        return 0


class StaleEndAccepted(MemoryStreamBridge):
    async def publish_end(self, run_id: str, *, fence: int | None = None) -> None:
        await super().publish_end(run_id)  # BUG (on purpose): END drops its token


class FloatFence(MemoryStreamBridge):
    def _admit(self, run_id: str, fence: int | None) -> None:
        if fence is None:
            return
        now = asyncio.get_running_loop().time()
        current = self._current_fence(run_id, now)
        # BUG (on purpose): tokens compared as doubles, which round above 2**53.
        if float(fence) < float(current):
            raise StaleFenceError(None, fence, current, run_id=run_id)
        self._fences[run_id] = (fence, now + self.stream_ttl_seconds)

    async def publish(self, run_id: str, event: str, data: Any, *, fence: int | None = None) -> str:
        self._admit(run_id, fence)  # the same step as the append: no await in between
        return await super().publish(run_id, event, data)


class CheckThenPublish(MemoryStreamBridge):
    async def publish(self, run_id: str, event: str, data: Any, *, fence: int | None = None) -> str:
        if fence is not None:
            await self.fence_stream(run_id, fence)
            await asyncio.sleep(0)  # BUG (on purpose): the append is a later step than the check
        return await super().publish(run_id, event, data)


BROKEN = {
    "broken-stream-fence-ignored": FenceIgnored,
    "broken-stream-stale-end": StaleEndAccepted,
    "broken-stream-float-fence": FloatFence,
    "broken-stream-check-then-publish": CheckThenPublish,
}


def _factory(cls: type[MemoryStreamBridge]) -> Any:
    async def _open(url: BackendURL, options: BackendOptions) -> MemoryStreamBridge:
        return await cls.open(url.with_query(), options)

    return _open


@hookimpl
def runstore_register_stream_bridges(registry: StreamBridgeRegistry) -> None:
    for name, cls in BROKEN.items():
        registry.add(name, schemes=[name], factory=_factory(cls), capabilities=["replay", "fencing"])
