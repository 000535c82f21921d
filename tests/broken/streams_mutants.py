"""Broken stream bridges, one realistic bug each, for the stream suite's teeth tests.

Each class subclasses the correct `MemoryStreamBridge` and breaks one rule of
docs/streams.md (the docstring names it). The plugin registers every class under
``mut-streams-<name>://`` with capability ``replay``; `tests/test_streams_teeth.py`
requires the named failure for each.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory.streams import MemoryStreamBridge, _Cursor, _Run
from runstore.registry import StreamBridgeRegistry
from runstore.streams.protocol import StreamGap, StreamItem, parse_event_id, resolve_heartbeat
from runstore.urls import BackendURL

MUTANTS: dict[str, type[MemoryStreamBridge]] = {}


def mutant(name: str) -> Any:
    """Register a broken bridge class as ``mut-streams-<name>``."""

    def register(cls: type[MemoryStreamBridge]) -> type[MemoryStreamBridge]:
        MUTANTS[f"mut-streams-{name}"] = cls
        return cls

    return register


@mutant("exists-for-waiting-subscriber")
class ExistsForWaitingSubscriber(MemoryStreamBridge):
    """stream_exists is true for a run that only has a subscriber waiting (never published)."""

    async def stream_exists(self, run_id: str) -> bool:
        return run_id in self._runs


@mutant("trusts-future-cursor")
class TrustsFutureCursor(MemoryStreamBridge):
    """A well-formed Last-Event-ID newer than the newest event is trusted: the
    subscriber resumes "after" it and silently skips what is published up to that id."""

    def _start(self, run: _Run, last_event_id: str | None) -> _Cursor:
        key = parse_event_id(last_event_id) if last_event_id is not None else None
        if key is not None and key[0] == 0 and key[1] > run.last_seq:
            return _Cursor(key[1], last_event_id)
        return super()._start(run, last_event_id)


@mutant("never-heartbeats")
class NeverHeartbeats(MemoryStreamBridge):
    """Idle subscriptions never yield HEARTBEAT."""

    def subscribe(self, run_id: str, *, last_event_id: str | None = None,
                  heartbeat_interval: float | None = None) -> AsyncIterator[StreamItem]:
        resolve_heartbeat(heartbeat_interval, self.heartbeat_interval)  # still validated
        return self._follow(run_id, last_event_id, 10**6)


@mutant("gap-without-cursor")
class GapWithoutCursor(MemoryStreamBridge):
    """A StreamGap does not say where the subscriber stood (requested id is None)."""

    def _find_gap(self, run: _Run, cursor: _Cursor) -> StreamGap | None:
        gap = super()._find_gap(run, cursor)
        return None if gap is None else StreamGap(None, gap.earliest_available_event_id,
                                                  gap.latest_available_event_id)


@mutant("cursor-inclusive")
class CursorInclusive(MemoryStreamBridge):
    """Resuming from a cursor replays the cursor's own event again."""

    def _start(self, run: _Run, last_event_id: str | None) -> _Cursor:
        cursor = super()._start(run, last_event_id)
        key = parse_event_id(last_event_id) if last_event_id is not None else None
        if key is not None and key[0] == 0 and 0 < key[1] <= run.last_seq:
            cursor.pos = key[1] - 1
        return cursor


@mutant("malformed-cursor-replays")
class MalformedCursorReplays(MemoryStreamBridge):
    """A malformed cursor replays everything retained instead of starting at the live tail."""

    def _start(self, run: _Run, last_event_id: str | None) -> _Cursor:
        if last_event_id is not None and parse_event_id(last_event_id) is None:
            last_event_id = None
        return super()._start(run, last_event_id)


@mutant("delayed-cleanup-silent")
class DelayedCleanupSilent(MemoryStreamBridge):
    """A delayed cleanup removes the stream without telling its followers (they wait forever)."""

    def _expire_after(self, run_id: str, run: _Run, delay: float) -> None:
        if run.timer is not None:
            run.timer.cancel()
        import asyncio

        def silently() -> None:
            run.timer = None
            if self._runs.get(run_id) is run:
                del self._runs[run_id]

        run.timer = asyncio.get_running_loop().call_later(max(0.0, delay), silently)


@mutant("cleanup-delay-first-wins")
class CleanupDelayFirstWins(MemoryStreamBridge):
    """cleanup(delay=...) keeps the first scheduled removal; a later call does not replace it."""

    def _expire_after(self, run_id: str, run: _Run, delay: float) -> None:
        scheduled: set[str] = self.__dict__.setdefault("_scheduled", set())
        if run_id not in scheduled:
            scheduled.add(run_id)
            super()._expire_after(run_id, run, delay)


@mutant("exists-after-subscriber-left")
class ExistsAfterSubscriberLeft(MemoryStreamBridge):
    """A subscriber that gave up waiting for a run that never started leaves the run
    behind, and stream_exists reports it."""

    async def _follow(self, run_id: str, last_event_id: str | None, interval: float) -> AsyncIterator[StreamItem]:
        run = self._run(run_id)
        inner = super()._follow(run_id, last_event_id, interval)
        try:
            async for item in inner:
                yield item
        finally:
            await inner.aclose()
            self._runs.setdefault(run_id, run)  # the waiting run is never dropped

    async def stream_exists(self, run_id: str) -> bool:
        run = self._runs.get(run_id)
        return run is not None and (run.published or run.ended or run.subscribers == 0)


def _factory(cls: type[MemoryStreamBridge]) -> Any:
    async def open_mutant(url: BackendURL, options: BackendOptions) -> MemoryStreamBridge:
        return await cls.open(url.with_query(), options)

    return open_mutant


@hookimpl
def runstore_register_stream_bridges(registry: StreamBridgeRegistry) -> None:
    for name, cls in MUTANTS.items():
        registry.add(name, schemes=[name], factory=_factory(cls), capabilities=["replay"])
