"""The stream bridge protocol: live events of a running run.

DRAFT by the lead: signatures are fixed; the streams owner refines docstrings and
behaviour.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, ClassVar, Final


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One data event of a run's stream; ``id`` increases in publish order."""

    id: str
    event: str
    data: Any


@dataclass(frozen=True, slots=True)
class StreamGap:
    """The cursor fell out of the retained window; the subscription ends after this."""

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


class StreamBridge(ABC):
    """Publish/subscribe for live run events with replay, gaps and heartbeats."""

    supports_cross_process: ClassVar[bool] = False

    @abstractmethod
    async def publish(self, run_id: str, event: str, data: Any) -> str:
        """Append one event to the run's stream and return its id."""

    @abstractmethod
    async def publish_end(self, run_id: str) -> None:
        """Mark the run finished; END never takes a data slot."""

    @abstractmethod
    def subscribe(
        self,
        run_id: str,
        *,
        last_event_id: str | None = None,
        heartbeat_interval: float | None = None,
    ) -> AsyncIterator[StreamItem]:
        """Replay retained events after ``last_event_id`` then follow live until END or a gap."""

    @abstractmethod
    async def cleanup(self, run_id: str, *, delay: float = 0) -> None:
        """Remove the run's stream (after ``delay`` seconds)."""

    @abstractmethod
    async def stream_exists(self, run_id: str) -> bool:
        """Whether the run's stream is still held."""

    async def close(self) -> None:
        """Release resources."""
