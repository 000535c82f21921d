"""Time for every kind: the `Clock` type, the system and manual clocks, microsecond stamps.

Leases, thread-index timestamps and retention all read time through a `Clock` that a
caller can replace (tests, simulations); SQL backends store it as microseconds since the
Unix epoch.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from runstore.errors import InvalidRunError

#: ``clock() -> datetime``: the current time, timezone-aware. Every lease decision of a
#: call reads it once.
Clock = Callable[[], datetime]


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


_MICROSECOND = timedelta(microseconds=1)


def system_clock() -> datetime:
    """The default `Clock`: this machine's wall clock, in UTC."""
    return datetime.now(UTC)


class ManualClock:
    """A `Clock` that moves only when told to (tests, simulations).

    >>> clock = ManualClock(datetime(2001, 1, 1, tzinfo=UTC))
    >>> store.clock = clock; clock.advance(30)
    """

    def __init__(self, start: datetime | None = None) -> None:
        self._now = check_time(start if start is not None else system_clock(), "start")

    def __call__(self) -> datetime:
        return self._now

    def advance(self, seconds: float) -> datetime:
        """Move forward by ``seconds`` (>= 0) and return the new time."""
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds >= 0:
            raise InvalidRunError(f"advance takes seconds >= 0, got {seconds!r}")
        self._now += timedelta(seconds=seconds)
        return self._now

    def set(self, when: datetime) -> None:
        """Jump to ``when`` (an aware datetime; backwards too, to simulate a skewed clock)."""
        self._now = check_time(when, "when")


def check_time(value: Any, what: str = "clock()") -> datetime:
    """Return ``value`` if it is a timezone-aware datetime, else raise `InvalidRunError`."""
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise InvalidRunError(
            f"{what} must be a timezone-aware datetime (e.g. datetime.now(UTC)), got {value!r}"
        )
    return value


def to_micros(value: datetime) -> int:
    """Microseconds since the Unix epoch of an aware datetime (how SQL backends store time)."""
    return (value - EPOCH) // _MICROSECOND


def from_micros(value: int) -> datetime:
    """The aware UTC datetime of `to_micros` output."""
    return EPOCH + timedelta(microseconds=value)


def seconds_to_micros(seconds: float) -> int:
    """Whole microseconds of a validated duration, rounded like `datetime.timedelta`."""
    return timedelta(seconds=seconds) // _MICROSECOND
