"""In-process stream bridge: a bounded buffer per run, asyncio wake-ups, no serialization.

Ids are ``"0-<n>"`` with ``n`` counting the run's events from 1, the same shape the
Redis bridge uses, so a client cursor means the same thing on both. Data objects are
handed to subscribers as published (not copied): do not mutate them afterwards.
Everything lives on the event loop that uses the bridge.

A run's stream expires like a Redis stream: ``stream_ttl_seconds`` after its last
publish (a run that never publishes END does not stay forever), the late-subscriber
window after END, or the delay of ``cleanup``; the last of these calls wins. One timer
per run carries the expiry; a publish only moves its deadline.

Fencing: per run, the highest token a publish carried (or `fence_stream` raised it
to), checked and raised in the same uninterrupted step as the append. Fences live
apart from the streams, ``stream_ttl_seconds`` after their last raise, so a removed
stream keeps refusing stale publishers; expired ones are swept as the table grows.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator, Sequence
from typing import TYPE_CHECKING, Any

from runstore.errors import StreamEndedError
from runstore.fencing import admit_fence
from runstore.standalone import Standalone
from runstore.streams.protocol import (
    END,
    Notifier,
    StreamBridge,
    StreamEvent,
    StreamGap,
    StreamItem,
    check_event,
    check_run_id,
    check_stream_data,
    check_stream_fence,
    heartbeat_loop,
    parse_event_id,
    resolve_heartbeat,
)

if TYPE_CHECKING:
    from runstore.options import BackendOptions
    from runstore.urls import BackendURL


def _event_id(seq: int) -> str:
    return f"0-{seq}"


class _Run:
    """One run's stream: the retained events, the END flag and who waits for news."""

    __slots__ = (
        "buffer", "ended", "expires_at", "last_seq", "news", "published", "removed", "subscribers", "timer",
    )

    def __init__(self, maxsize: int) -> None:
        self.buffer: deque[StreamEvent] = deque(maxlen=maxsize)
        self.last_seq = 0
        self.ended = False
        self.removed = False
        self.published = False
        self.subscribers = 0
        self.timer: asyncio.TimerHandle | None = None
        self.expires_at = 0.0  # event-loop time at which the stream is removed (once a timer runs)
        self.news = Notifier()

    @property
    def first_seq(self) -> int:
        """Sequence number of the oldest retained event (``last_seq + 1`` when none is)."""
        return self.last_seq - len(self.buffer) + 1

    def notify(self) -> None:
        self.news.notify()


class _Cursor:
    """Where one subscription stands: the last sequence delivered and its id text."""

    __slots__ = ("pos", "requested")

    def __init__(self, pos: int, requested: str | None) -> None:
        self.pos = pos
        self.requested = requested


class MemoryStreamBridge(StreamBridge, Standalone):
    """`StreamBridge` inside one process: replay, gaps, heartbeats and END as in the contract.

    Examples:

    ```python
    import asyncio

    from runstore.plugins.memory.streams import MemoryStreamBridge


    async def main() -> None:
        async with MemoryStreamBridge.from_conn_string("memory://") as bridge:
            await bridge.publish("run-1", "values", {"count": 1})
            await bridge.publish_end("run-1")
            async for item in bridge.subscribe("run-1"):  # replays, then follows until END
                print(item)  # StreamEvent(id='0-1', event='values', data={'count': 1}), then END


    asyncio.run(main())
    ```
    """

    supports_cross_process = False

    def __init__(
        self,
        *,
        queue_maxsize: int = 256,
        heartbeat_interval: float = 15.0,
        late_subscriber_window: float = 60.0,
        stream_ttl_seconds: float = 86400.0,
    ) -> None:
        self.queue_maxsize = queue_maxsize
        self.heartbeat_interval = resolve_heartbeat(None, heartbeat_interval)
        self.late_subscriber_window = late_subscriber_window
        self.stream_ttl_seconds = stream_ttl_seconds
        self._runs: dict[str, _Run] = {}
        # run id -> (its fence, event-loop time it is forgotten); see the module docstring.
        self._fences: dict[str, tuple[int, float]] = {}
        self._sweep_fences_at = 64
        self._closed = False

    @classmethod
    async def open(cls, url: BackendURL, options: BackendOptions) -> MemoryStreamBridge:
        """Open from ``memory://`` (no options) using ``options.settings.stream_bridge``."""
        url.check_options(set())
        settings = options.settings.stream_bridge
        return cls(
            queue_maxsize=settings.queue_maxsize,
            heartbeat_interval=settings.heartbeat_interval_seconds,
            late_subscriber_window=settings.late_subscriber_window_seconds,
            stream_ttl_seconds=settings.stream_ttl_seconds,
        )

    # -- publishing ---------------------------------------------------------------

    def _run(self, run_id: str) -> _Run:
        run = self._runs.get(run_id)
        if run is None:
            run = self._runs[run_id] = _Run(self.queue_maxsize)
        return run

    def _current_fence(self, run_id: str, now: float) -> int:
        held = self._fences.get(run_id)
        return held[0] if held is not None and held[1] > now else 0

    def _check_fence(self, run_id: str, fence: int, now: float) -> None:
        """`StaleFenceError` if ``fence`` is older than the run's fence."""
        admit_fence(fence, self._current_fence(run_id, now), run_id=run_id)

    def _raise_fence(self, run_id: str, fence: int, now: float) -> None:
        """Raise the run's fence to the (checked) ``fence``; sweep forgotten fences now and then."""
        self._fences[run_id] = (fence, now + self.stream_ttl_seconds)
        if len(self._fences) > self._sweep_fences_at:
            # Amortized: a sweep at most each time the table doubled since the last one.
            self._fences = {r: held for r, held in self._fences.items() if held[1] > now}
            self._sweep_fences_at = max(64, 2 * len(self._fences))

    def _admit(self, run_id: str, fence: int | None) -> None:
        """Refuse a stale ``fence`` (`StaleFenceError`), else raise the run's fence to it."""
        if fence is None:
            return
        now = asyncio.get_running_loop().time()
        self._check_fence(run_id, fence, now)
        self._raise_fence(run_id, fence, now)

    async def fence_stream(self, run_id: str, fence: int) -> None:
        """Raise the run's fence to ``fence`` (`StaleFenceError` if it is already higher)."""
        check_run_id(run_id)
        self._admit(run_id, check_stream_fence(fence))

    async def publish(self, run_id: str, event: str, data: Any, *, fence: int | None = None) -> str:
        """Append one event; the oldest retained event is evicted once the buffer is full."""
        check_event(event)
        data = check_stream_data(data)
        check_run_id(run_id)
        fence = check_stream_fence(fence)
        loop = asyncio.get_running_loop()
        now = loop.time()
        if fence is not None:  # refused before anything, even on an ended stream
            self._check_fence(run_id, fence, now)
        run = self._run(run_id)
        if run.ended:
            raise StreamEndedError(f"run {run_id!r} already published END; no more events")
        if fence is not None:
            self._raise_fence(run_id, fence, now)
        run.last_seq += 1
        item = StreamEvent(_event_id(run.last_seq), event, data)
        run.buffer.append(item)
        run.published = True
        # Rolling expiry: move the deadline; the run's one timer re-arms when it fires early.
        run.expires_at = now + self.stream_ttl_seconds
        if run.timer is None:
            run.timer = loop.call_at(run.expires_at, self._expire, run_id, run)
        run.notify()
        return item.id

    async def publish_end(self, run_id: str, *, fence: int | None = None) -> None:
        """Mark the run finished and schedule its removal after the late-subscriber window."""
        check_run_id(run_id)
        self._admit(run_id, check_stream_fence(fence))
        run = self._run(run_id)
        if run.ended:
            return
        run.ended = True
        run.notify()
        self._expire_after(run_id, run, self.late_subscriber_window)

    async def cleanup(self, run_id: str, *, delay: float = 0) -> None:
        """Remove the run's stream now or after ``delay`` seconds."""
        run = self._runs.get(check_run_id(run_id))
        if run is None or not (run.published or run.ended):
            return  # nothing held (subscribers waiting for a run to start keep waiting)
        if delay > 0:
            self._expire_after(run_id, run, delay)
        else:
            self._remove(run_id, run)

    async def stream_exists(self, run_id: str) -> bool:
        """Whether the run published something or END and was not removed yet."""
        run = self._runs.get(check_run_id(run_id))
        return run is not None and (run.published or run.ended)

    async def close(self) -> None:
        """Drop every stream; followers receive END."""
        self._closed = True
        for run_id, run in list(self._runs.items()):
            self._remove(run_id, run)

    def _expire_after(self, run_id: str, run: _Run, delay: float) -> None:
        """Remove the run ``delay`` seconds from now, whatever deadline it had (the last call wins)."""
        loop = asyncio.get_running_loop()
        run.expires_at = loop.time() + max(0.0, delay)
        if run.timer is not None:
            if run.timer.when() <= run.expires_at:
                return  # fires first, then re-arms for the new deadline
            run.timer.cancel()
        run.timer = loop.call_at(run.expires_at, self._expire, run_id, run)

    def _expire(self, run_id: str, run: _Run) -> None:
        """The run's timer fired: remove it, or wait on if a later call moved its deadline."""
        loop = asyncio.get_running_loop()
        if run.expires_at > loop.time():
            run.timer = loop.call_at(run.expires_at, self._expire, run_id, run)
            return
        run.timer = None
        self._remove(run_id, run)

    def _remove(self, run_id: str, run: _Run) -> None:
        if run.timer is not None:
            run.timer.cancel()
            run.timer = None
        if self._runs.get(run_id) is run:
            del self._runs[run_id]
        run.removed = True
        run.notify()

    # -- subscribing --------------------------------------------------------------

    def subscribe(
        self,
        run_id: str,
        *,
        last_event_id: str | None = None,
        heartbeat_interval: float | None = None,
    ) -> AsyncGenerator[StreamItem, None]:
        """Replay after ``last_event_id`` (everything retained without one), then follow live."""
        interval = resolve_heartbeat(heartbeat_interval, self.heartbeat_interval)
        return self._follow(check_run_id(run_id), last_event_id, interval)

    async def _follow(
        self, run_id: str, last_event_id: str | None, interval: float
    ) -> AsyncGenerator[StreamItem, None]:
        run = self._run(run_id)
        run.subscribers += 1
        cursor = self._start(run, last_event_id)

        # heartbeat_loop's poll: ``timeout`` is a budget, and running out returns [].
        async def poll(timeout: float) -> Sequence[StreamItem]:  # noqa: ASYNC109
            since = run.news.version
            items = self._collect(run, cursor)
            if items:
                return items
            await run.news.wait(timeout, since)
            return self._collect(run, cursor)

        try:
            async for item in heartbeat_loop(poll, interval):
                yield item
        finally:
            run.subscribers -= 1
            # A subscriber waiting for a run that never published leaves no trace.
            unused = not (run.subscribers or run.published or run.ended or run.removed)
            if unused and self._runs.get(run_id) is run:
                del self._runs[run_id]

    def _start(self, run: _Run, last_event_id: str | None) -> _Cursor:
        if last_event_id is None:
            return _Cursor(run.first_seq - 1, None)
        key = parse_event_id(last_event_id)
        if key is None or key > (0, run.last_seq):
            # Malformed, or from the future (another stream's id): follow the live tail.
            return _Cursor(run.last_seq, _event_id(run.last_seq) if run.last_seq else None)
        return _Cursor(key[1] if key[0] == 0 else run.last_seq, last_event_id)

    def _find_gap(self, run: _Run, cursor: _Cursor) -> StreamGap | None:
        """A gap when events after the cursor were evicted before it read them."""
        if cursor.pos + 1 >= run.first_seq or not run.buffer:
            return None
        return StreamGap(cursor.requested, run.buffer[0].id, run.buffer[-1].id)

    def _collect(self, run: _Run, cursor: _Cursor) -> list[StreamItem]:
        gap = self._find_gap(run, cursor)
        if gap is not None:
            return [gap]
        items: list[StreamItem] = []
        fresh_count = min(run.last_seq - cursor.pos, len(run.buffer))
        if fresh_count > 0:
            # New events sit at the right end of the deque, where indexing is cheap.
            buffer = run.buffer
            fresh = [buffer[-k] for k in range(fresh_count, 0, -1)]
            items.extend(fresh)
            cursor.pos = run.last_seq
            cursor.requested = fresh[-1].id
        if run.ended or run.removed:
            items.append(END)
        return items
