"""One retry loop for the network calls of every backend, under the call's one deadline.

A call (a saver ``aput``, an event store ``put``, a stream bridge ``publish``...) gets
``operation_timeout`` for everything it does: waiting for a connection, connecting,
its statements or commands, the waits between attempts and every retry. `retried` runs
its attempts until one succeeds, one fails with an error no retry can fix, or that
`Deadline` passes:

- Each attempt is cut to what is left of the deadline. It runs under
  ``asyncio.timeout_at(deadline)``, and it is handed the `Deadline` so it can cap the
  driver's own bounds (connect, statement, reply) by `Deadline.cap`: the driver then
  usually gives up by itself, by the deadline, and cleans up its own connection, rather
  than being cancelled in the middle of its protocol (hooks that no attempt can hand it
  to, such as a connection pool's events, read it with `current_deadline`). An attempt
  never gets a fresh ``operation_timeout``, nor one more ``command_timeout`` past the
  deadline.
- The waits between attempts come from a backoff table whose last entry repeats. A wait
  that would reach the deadline is not taken: no attempt could follow it, so the call
  gives up at once.
- When the deadline passes, the call raises the `BackendUnavailableError` its driver
  builds from the last transient failure (`give_up`), with the driver's error as
  ``__cause__`` (`deadline_cause`: a timeout naming the bound when no attempt had
  failed yet).

Which errors are transient, and what an attempt that may have written does instead of
being retried, are the driver's decisions (its ``transient`` predicate and its attempt
function); the loop only counts, waits and keeps time. It starts no task of its own: a
caller's cancellation reaches the attempt in flight (or the wait) and propagates as
`asyncio.CancelledError` once the driver has cleaned up, never as a
`BackendUnavailableError` and never retried. Callers that must not return before a
write has settled still wrap the whole call in `runstore.cancellation.settle`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from typing import TypeVar

from runstore.errors import BackendUnavailableError

T = TypeVar("T")

__all__ = ["BACKOFF", "Deadline", "current_deadline", "deadline_cause", "retried"]

#: Waits (seconds) before the retries of a call after a transient failure; the last one
#: repeats until the deadline, so a call rides out a server restart shorter than it. A
#: driver whose usual first failure is a pooled connection the server closed passes
#: ``immediate_first=True`` to `retried` and retries that once at once.
BACKOFF: tuple[float, ...] = (0.05, 0.1, 0.2, 0.4, 0.8, 1.0)


class Deadline:
    """When one call must be over, on the running loop's clock (``loop.time()``)."""

    __slots__ = ("at", "timeout")

    def __init__(self, at: float, timeout: float) -> None:
        #: The loop time the call ends by.
        self.at = at
        #: The call's whole bound in seconds (``operation_timeout``), for messages.
        self.timeout = timeout

    @classmethod
    def after(cls, timeout: float) -> Deadline:
        """The deadline ``timeout`` seconds from now (inside a running loop)."""
        return cls(asyncio.get_running_loop().time() + timeout, timeout)

    def left(self) -> float:
        """Seconds until the deadline (negative once it passed)."""
        return self.at - asyncio.get_running_loop().time()

    def cap(self, seconds: float) -> float:
        """``seconds`` (a driver's own bound: connect, statement, reply), cut to what is left."""
        return max(0.0, min(seconds, self.left()))

    def __repr__(self) -> str:
        return f"Deadline(at={self.at!r}, timeout={self.timeout!r})"


#: The deadline of the attempt running in this context (see `current_deadline`).
_CURRENT: ContextVar[Deadline | None] = ContextVar("runstore_attempt_deadline", default=None)


def current_deadline() -> Deadline | None:
    """The deadline of the `retried` attempt running in this context, if any: for driver
    hooks no attempt can hand it to (a connection pool's checkout or connect events),
    which cap their own bounds with it."""
    return _CURRENT.get()


def deadline_cause(last: BaseException | None, deadline: Deadline) -> BaseException:
    """What a call that ran out of time reports as ``__cause__``: its last failure, else a
    timeout naming the bound (nothing failed: an attempt was still waiting)."""
    if last is None or isinstance(last, asyncio.CancelledError):
        return TimeoutError(f"no answer within {deadline.timeout:g}s")
    return last


async def retried(
    attempt: Callable[[Deadline], Awaitable[T]],
    deadline: Deadline,
    *,
    transient: Callable[[Exception], bool],
    give_up: Callable[[BaseException | None], BackendUnavailableError],
    backoff: Sequence[float] = BACKOFF,
    immediate_first: bool = False,
    attempts: int | None = None,
    failed: Exception | None = None,
    on_retry: Callable[[Exception, int], None] | None = None,
) -> T:
    """``await attempt(deadline)`` until it returns, raises a non-transient error (raised
    as is), or ``deadline`` passes (``give_up(last transient failure or None)`` is raised).

    ``attempts`` limits the number of attempts (the last transient error is then raised
    as is); ``failed`` is the transient failure of an attempt the caller already made
    (the loop goes on with the retries); ``on_retry(error, retries so far)`` is told
    before each wait (logging). See the module docstring for the rules.
    """
    if not backoff:
        raise ValueError("a backoff table needs at least one wait")
    waits = (0.0, *backoff) if immediate_first else tuple(backoff)
    made = 0 if failed is None else 1
    last: Exception | None = failed
    if failed is None and deadline.left() <= 0:
        # The deadline of a larger call, spent before this part of it began.
        error = give_up(None)
        raise error from error.__cause__
    while True:
        if last is not None:
            if attempts is not None and made >= attempts:
                raise last
            retries = made - 1
            wait = waits[min(retries, len(waits) - 1)]
            if wait >= deadline.left():
                break  # no attempt could follow the wait
            if on_retry is not None:
                on_retry(last, retries)
            if wait > 0:
                await asyncio.sleep(wait)
        cut = asyncio.timeout_at(deadline.at)
        made += 1
        token = _CURRENT.set(deadline)
        try:
            async with cut:
                return await attempt(deadline)
        except asyncio.CancelledError:
            raise  # the caller's own cancellation (the deadline's is a TimeoutError here)
        except Exception as exc:
            if cut.expired() and (isinstance(exc, TimeoutError) or transient(exc)):
                if not isinstance(exc, TimeoutError):
                    last = exc
                break
            if not transient(exc):
                raise
            last = exc
        finally:
            _CURRENT.reset(token)
    error = give_up(last)
    raise error from error.__cause__
