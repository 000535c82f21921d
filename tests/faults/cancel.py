"""Cancel a coroutine at each of its suspension points, to sweep every cancel point of a call.

asyncio can only cancel a task where it is suspended (an ``await`` that actually
waits: a socket read, a lock, a sleep). `suspensions` counts those points for one run
of a call; `cancel_at` runs the call and cancels it at the k-th one, exactly as
``task.cancel()`` would (the awaited future is cancelled, so ``CancelledError`` is
raised inside the call at that ``await``). Sweeping k over ``1..suspensions(...)``
therefore visits every place a caller's cancellation (a client disconnecting,
``asyncio.wait_for`` expiring) can land, with no knowledge of the driver:

    async def trial(k: int) -> Outcome[Any]:
        ...  # set up
        outcome = await cancel_at(lambda: store.put_batch(events), k)
        ...  # outcome.cancelled or it completed; assert all-or-nothing, the store works
        return outcome

    trials = await every_cancel_point(trial)

The number of suspensions varies between runs (a reply already buffered needs no
wait; a pool sometimes connects), so `every_cancel_point` does not trust a count made
beforehand: it raises k until a trial ends before its k-th suspension. A cancellation
can also be swallowed (``asyncio.wait_for`` before Python 3.12 returns a result that
is ready instead of raising): the call then completes, which a sweep must accept as
one more valid case (`Outcome.cancelled` is False).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass
class Outcome(Generic[T]):
    """How one run of a call ended: cancelled at the requested point, or completed."""

    cancelled: bool
    result: T | None = None
    error: BaseException | None = None
    suspensions: int = 0


class _Stepper:
    """Drives a coroutine, counting its suspensions and cancelling it at the k-th
    (or, given ``action``, calling ``action()`` there instead)."""

    def __init__(
        self,
        coro: Coroutine[Any, Any, Any],
        cancel_at: int | None,
        action: Callable[[], Any] | None = None,
    ) -> None:
        self.coro = coro
        self.cancel_at = cancel_at
        self.action = action
        self.count = 0
        self.injected = False

    def __await__(self) -> Generator[Any, Any, Any]:
        coro = self.coro
        send: Any = None
        throw: BaseException | None = None
        while True:
            try:
                yielded = coro.throw(throw) if throw is not None else coro.send(send)
            except StopIteration as stop:
                return stop.value
            throw = None
            self.count += 1
            if self.count == self.cancel_at and self.action is not None:
                self.action()
            elif self.count == self.cancel_at:
                self.injected = True
                if isinstance(yielded, asyncio.Future):
                    # As task.cancel() does: cancel what it waits for; the CancelledError
                    # surfaces inside the call when the task resumes it.
                    yielded.cancel()
                else:
                    throw = asyncio.CancelledError()  # a bare yield (sleep(0)): raise right there
                    continue
            try:
                send = yield yielded
            except BaseException as exc:  # the outer task was cancelled: pass it in
                throw = exc


async def _drive(
    call: Callable[[], Awaitable[T]], cancel_at: int | None, action: Callable[[], Any] | None = None
) -> Outcome[T]:
    awaitable = call()
    if not asyncio.iscoroutine(awaitable):
        raise TypeError("cancel sweeps need a coroutine (an async def call)")
    stepper = _Stepper(awaitable, cancel_at, action)
    try:
        result = await stepper
    except asyncio.CancelledError as exc:
        if not stepper.injected:
            raise
        return Outcome(cancelled=True, error=exc, suspensions=stepper.count)
    except Exception as exc:
        return Outcome(cancelled=False, error=exc, suspensions=stepper.count)
    return Outcome(cancelled=False, result=result, suspensions=stepper.count)


async def suspensions(call: Callable[[], Awaitable[Any]]) -> int:
    """How many times one uncancelled run of ``call()`` suspends (its cancel points)."""
    outcome = await _drive(call, None)
    if outcome.error is not None:
        raise outcome.error
    return outcome.suspensions


async def cancel_at(call: Callable[[], Awaitable[T]], k: int) -> Outcome[T]:
    """Run ``call()`` and cancel it at its k-th suspension (1-based); errors other than
    the injected cancellation are returned in `Outcome.error`, not raised."""
    if k < 1:
        raise ValueError("suspension points are numbered from 1")
    return await _drive(call, k)


async def act_at(call: Callable[[], Awaitable[T]], k: int, action: Callable[[], Any]) -> Outcome[T]:
    """Run ``call()`` and call ``action()`` at its k-th suspension, without cancelling it
    (e.g. cancel the caller whose work ``call`` does in another task). `Outcome.cancelled`
    is always False; errors are returned as in `cancel_at`."""
    if k < 1:
        raise ValueError("suspension points are numbered from 1")
    return await _drive(call, k, action)


def batch_acting_at(
    run_batch: Callable[[list[Any]], Awaitable[Any]], k: int, action: Callable[[], Any],
    seen: list[Outcome[Any]],
) -> Callable[[list[Any]], Awaitable[Any]]:
    """A group-commit batch callback that runs ``run_batch`` and calls ``action()`` at its
    k-th suspension (`act_at`), recording each batch's `Outcome` in ``seen`` and handing
    on its result or error."""

    async def acting(ops: list[Any]) -> Any:
        out = await act_at(lambda: run_batch(ops), k, action)
        seen.append(out)
        if out.error is not None:
            raise out.error
        return out.result

    return acting


async def every_cancel_point(trial: Callable[[int], Awaitable[Outcome[Any]]], *, limit: int = 500) -> int:
    """Run ``trial(k)`` for k = 1, 2, ... until one ends before its k-th suspension; return how many ran.

    ``trial`` sets up, calls `cancel_at` with its k, checks the outcome and returns it.
    """
    for k in range(1, limit + 1):
        outcome = await trial(k)
        if not outcome.cancelled and outcome.suspensions < k:
            return k
    raise AssertionError(f"still suspending after {limit} cancel points")
