"""The stream bridge protocol: live events of a running run.

A stream bridge carries the events of a run from the process executing it to every
subscriber (an SSE endpoint, a ``wait`` call, an internal consumer). The contract,
shared by every backend and checked by ``runstore.conformance``:

- Ids are stream ids, ``"<int>-<int>"`` (the Redis Streams format), and increase in
  publish order within a run; `parse_event_id` gives their sort key.
- A subscriber without a cursor replays every retained event, then follows live.
  A valid cursor resumes right after it. A cursor older than the retained window
  yields exactly one `StreamGap` and the subscription ends (the run goes on). A
  malformed cursor (``-1``, ``abc``) or one past the newest id starts at the live
  tail; on a finished run that means END straight away.
- A subscriber that falls behind the window gets a `StreamGap`, never a silent skip.
- `END` never takes a data slot: it survives a full buffer and is always the last item.
- `HEARTBEAT` is yielded when nothing arrived within the heartbeat interval (the
  bridge's default, or the subscription's override); never between events that
  arrive faster.
- After END the stream stays readable for the late-subscriber window, then it is
  removed; `cleanup` removes it earlier (or after ``delay``).
- A run id is a non-empty string and an event name a non-empty string; data is
  published in one JSON form on every bridge (`check_stream_data`, which gives
  messages, Interrupt, Command and other Pydantic models and dataclasses the form the
  LangGraph SDK reads; `runstore.streams.payloads`), and holds no NaN or Infinity.
  Anything else is an `InvalidStreamInputError` and nothing is published.
- Fencing (capability ``fencing``): `StreamBridge.publish` and `StreamBridge.publish_end`
  take ``fence=`` (a run store lease's token). A bridge declaring ``fencing`` keeps per
  run the highest token a publish carried (or `StreamBridge.fence_stream` raised it
  to) and refuses an older one with `StaleFenceError`, in the same atomic step as the
  append: nothing reaches a subscriber, and a stale END never ends the stream. The
  fence outlives the stream (kept ``stream_ttl_seconds`` after its last raise), so a
  stale publish cannot start a removed stream again either. Without a token a
  publish is not checked; a bad token is an `InvalidStreamInputError`.
"""

from __future__ import annotations

import asyncio
import re
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from runstore.errors import InvalidStreamInputError
from runstore.fencing import check_fence
from runstore.streams.payloads import to_stream_json


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One data event of a run's stream; ``id`` increases in publish order."""

    id: str
    event: str
    data: Any


@dataclass(frozen=True, slots=True)
class StreamGap:
    """The cursor fell out of the retained window; the subscription ends after this.

    ``requested_event_id`` is the cursor the subscriber stood at (``None`` when it had
    none); the other two bound what is still retained, so a client can tell how much
    it lost and recover the rest from the run event store.
    """

    requested_event_id: str | None
    earliest_available_event_id: str | None
    latest_available_event_id: str | None


class _Marker:
    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name

    def __reduce__(self) -> str:
        return self._name


#: Yielded when no event arrived within the heartbeat interval. Compare by identity.
HEARTBEAT: Final = _Marker("HEARTBEAT")
#: Yielded once when the run finished; the subscription ends after it.
END: Final = _Marker("END")

StreamItem = StreamEvent | StreamGap | _Marker






def check_run_id(run_id: object) -> str:
    """Return ``run_id`` if it is a non-empty string, else raise `InvalidStreamInputError`."""
    if isinstance(run_id, str) and run_id:
        return run_id
    raise InvalidStreamInputError(f"run_id must be a non-empty string; got {run_id!r}")


def check_stream_fence(fence: object) -> int | None:
    """``None`` (an unfenced publish) or a fencing token, else `InvalidStreamInputError`."""
    return None if fence is None else check_fence(fence, "fence", InvalidStreamInputError)


def check_event(event: object) -> str:
    """Return the event name if it is a non-empty string, else raise `InvalidStreamInputError`."""
    if isinstance(event, str) and event:
        return event
    raise InvalidStreamInputError(f"the event name must be a non-empty string; got {event!r}")


def check_stream_data(data: Any) -> Any:
    """Return ``data`` in the JSON form every bridge publishes (`runstore.streams.payloads`:
    messages, Interrupt, Command, Pydantic models and plain JSON), or raise
    `InvalidStreamInputError` naming what has none (NaN and Infinity included)."""
    return to_stream_json(data)


class StreamBridge(ABC):
    """Publish/subscribe for live run events with replay, gaps and heartbeats.

    ``heartbeat_interval`` is the default idle cadence of every subscription (from
    ``stream_bridge.heartbeat_interval_seconds``); ``supports_cross_process`` says
    whether a publisher and a subscriber may live in different processes.
    """

    supports_cross_process: ClassVar[bool] = False
    heartbeat_interval: float = 15.0

    @abstractmethod
    async def publish(self, run_id: str, event: str, data: Any, *, fence: int | None = None) -> str:
        """Append one event to the run's stream and return its id.

        Raises `StreamEndedError` after `publish_end` for the run, and (bridges
        declaring ``fencing``) `StaleFenceError` when ``fence`` is older than the run's
        fence; backend errors (a lost connection) are raised to the caller, never
        swallowed.
        """

    @abstractmethod
    async def publish_end(self, run_id: str, *, fence: int | None = None) -> None:
        """Mark the run finished (idempotent); END never takes a data slot.

        The stream stays readable for the late-subscriber window, then is removed. A
        stale ``fence`` raises `StaleFenceError` and ends nothing (``fencing`` bridges).
        """

    async def fence_stream(self, run_id: str, fence: int) -> None:
        """Raise the run's fence to ``fence`` without publishing: from now on a publish or
        END carrying an older token is refused. `StaleFenceError` if the run has already
        seen a newer token. Creates no stream (`stream_exists` stays as it was).

        A bridge declaring ``fencing`` overrides this with the check its fenced publishes
        run; this default, for bridges that do not fence, checks the arguments only."""
        check_run_id(run_id)
        check_stream_fence(fence)

    @abstractmethod
    def subscribe(
        self,
        run_id: str,
        *,
        last_event_id: str | None = None,
        heartbeat_interval: float | None = None,
    ) -> AsyncGenerator[StreamItem, None]:
        """Replay retained events after ``last_event_id`` then follow live until END or a gap.

        ``heartbeat_interval`` overrides the bridge default for this subscription only.
        Close the iterator (``aclose``) to unsubscribe early.
        """

    @abstractmethod
    async def cleanup(self, run_id: str, *, delay: float = 0) -> None:
        """Remove the run's stream now, or after ``delay`` seconds.

        A subscriber still following a removed stream receives END.
        """

    @abstractmethod
    async def stream_exists(self, run_id: str) -> bool:
        """Whether the run's stream is held: live, or finished and inside its window.

        False for a run never published and for a finished run that was cleaned up.
        """

    async def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release resources (idempotent); followers of this instance stop."""


# ---------------------------------------------------------------------------
# helpers shared by the built-in bridges (and usable by third-party ones)

_EVENT_ID = re.compile(r"([0-9]{1,19})(?:-([0-9]{1,19}))?")
_MAX_PART = 2**64 - 1


def parse_event_id(value: object) -> tuple[int, int] | None:
    """The sort key of a stream id (``"5-0"`` -> ``(5, 0)``; ``"5"`` means ``"5-0"``).

    Returns ``None`` for anything malformed (``"-1"``, ``"abc"``, ``""``, ``None``), which
    a subscription treats as "start at the live tail".
    """
    if not isinstance(value, str):
        return None
    match = _EVENT_ID.fullmatch(value.strip())
    if match is None:
        return None
    first, second = int(match.group(1)), int(match.group(2) or 0)
    if first > _MAX_PART or second > _MAX_PART:
        return None
    return first, second


def format_event_id(key: tuple[int, int]) -> str:
    """The stream id text of a sort key (inverse of `parse_event_id`)."""
    return f"{key[0]}-{key[1]}"


def resolve_heartbeat(value: float | None, default: float) -> float:
    """The heartbeat interval a subscription uses: its override, else the bridge default."""
    interval = default if value is None else float(value)
    if not interval > 0:
        raise ValueError(f"heartbeat_interval must be > 0 seconds; got {value!r}")
    return interval


Poll = Callable[[float], Awaitable[Sequence[StreamItem]]]


async def heartbeat_loop(poll: Poll, interval: float) -> AsyncGenerator[StreamItem, None]:
    """Drive a subscription: yield what ``poll`` returns, and HEARTBEAT on idle intervals.

    ``poll(timeout)`` waits at most ``timeout`` seconds for new items and returns them
    (possibly none, e.g. after a spurious wake-up). The idle clock restarts each time
    the consumer asks for the next item after an event or a heartbeat, so a heartbeat
    only fills a silence of ``interval`` seconds and never sits between events that
    arrive faster. The loop ends after END or a `StreamGap`.
    """
    clock = time.monotonic
    deadline = clock() + interval
    while True:
        items = await poll(max(0.0, deadline - clock()))
        if items:
            for item in items:
                yield item
                if item is END or isinstance(item, StreamGap):
                    return
            deadline = clock() + interval
        elif clock() >= deadline:
            yield HEARTBEAT
            deadline = clock() + interval


class Notifier:
    """Wakes the subscribers waiting for news of one stream.

    ``version`` counts notifications: read it before looking for new items and pass it
    to `wait`, so a notification that lands in between is never lost. Each waiter
    has its own future, so a wake-up reaches every subscriber in one loop turn.
    """

    __slots__ = ("_waiters", "version")

    def __init__(self) -> None:
        self.version = 0
        self._waiters: set[asyncio.Future[bool]] = set()

    def notify(self) -> None:
        """Wake every current waiter."""
        self.version += 1
        waiters, self._waiters = self._waiters, set()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(True)

    # A budget, not a cancel scope (ASYNC109): running out is an answer (False), not an error.
    async def wait(self, timeout: float, since: int) -> bool:  # noqa: ASYNC109
        """Wait until a notification after ``since`` or ``timeout``; True when notified."""
        if self.version != since:
            return True
        if timeout <= 0:
            return False
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        self._waiters.add(waiter)
        timer = loop.call_later(timeout, _expire, waiter)
        try:
            return await waiter
        finally:
            timer.cancel()
            self._waiters.discard(waiter)


def _expire(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(False)
