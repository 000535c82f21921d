"""`runstore.retry`: the one retry loop, on an event loop whose clock only moves when
every task waits (virtual time), so deadlines are exact and the tests take no time."""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from runstore.errors import BackendUnavailableError
from runstore.retry import BACKOFF, Deadline, current_deadline, deadline_cause, retried

T = TypeVar("T")


class _JumpingSelector(selectors.DefaultSelector):
    """Never blocks: when nothing is ready, the loop's clock jumps to the next timer."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if not ready:
            if timeout is None:
                raise RuntimeError("every task waits and no timer is set: the test would hang")
            self._loop.now += timeout
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio loop on a virtual clock starting at 0 (``loop.time()``)."""

    def __init__(self) -> None:
        self.now = 0.0
        super().__init__(_JumpingSelector(self))

    def time(self) -> float:
        return self.now


def run(main: Callable[[], Awaitable[T]]) -> T:
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


def now() -> float:
    return asyncio.get_running_loop().time()


class Lost(Exception):
    """A transient failure: the connection went away."""


def transient(exc: Exception) -> bool:
    return isinstance(exc, Lost)


class GiveUp:
    """A driver's ``give_up``: records what it was given, builds the runstore error."""

    def __init__(self, deadline: Deadline) -> None:
        self.deadline = deadline
        self.calls: list[BaseException | None] = []

    def __call__(self, last: BaseException | None) -> BackendUnavailableError:
        self.calls.append(last)
        cause = deadline_cause(last, self.deadline)
        return BackendUnavailableError("test backend", "call", write_may_have_happened=False, cause=cause)


async def call_until_deadline(
    attempt: Callable[[Deadline], Awaitable[Any]], timeout: float, **kwargs: Any
) -> tuple[BackendUnavailableError, GiveUp]:
    deadline = Deadline.after(timeout)
    give_up = GiveUp(deadline)
    with pytest.raises(BackendUnavailableError) as caught:
        await retried(attempt, deadline, transient=transient, give_up=give_up, **kwargs)
    return caught.value, give_up


def test_an_attempt_that_never_answers_is_cut_at_the_deadline() -> None:
    seen: list[str] = []

    async def hung(deadline: Deadline) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            seen.append(f"cancelled at {now():g}")  # the driver's clean-up runs here
            raise

    async def main() -> None:
        error, give_up = await call_until_deadline(hung, 4.0)
        assert now() == 4.0, "ended at the deadline, not when the attempt would have"
        assert seen == ["cancelled at 4"]
        assert give_up.calls == [None], "nothing failed: no failure to report"
        assert isinstance(error.__cause__, TimeoutError) and "no answer within 4s" in str(error)
        assert not error.write_may_have_happened

    run(main)


def test_each_attempt_is_handed_what_is_left_of_the_one_deadline() -> None:
    """Attempts that wait their driver bound (1.5 s, capped) and lose the connection: the
    third gets 0.95 s, not a fresh 1.5 s, and the call ends at 4 s with the last failure."""
    caps: list[tuple[float, float]] = []

    async def slow_then_lost(deadline: Deadline) -> None:
        assert current_deadline() is deadline, "driver hooks can read the attempt's deadline"
        bound = deadline.cap(1.5)
        caps.append((round(now(), 6), round(bound, 6)))
        await asyncio.sleep(bound)
        raise Lost(f"attempt {len(caps)}")

    async def main() -> None:
        error, give_up = await call_until_deadline(slow_then_lost, 4.0, immediate_first=True)
        assert caps == [(0.0, 1.5), (1.5, 1.5), (3.05, 0.95)]
        assert now() == pytest.approx(4.0)
        # The third attempt's own bound and the cut end at the same instant; either way
        # the call reports a lost connection, the driver's error.
        assert len(give_up.calls) == 1 and isinstance(give_up.calls[0], Lost)
        assert error.__cause__ is give_up.calls[0]
        assert current_deadline() is None, "reset once the attempt is over"

    run(main)


def test_no_backoff_wait_crosses_the_deadline() -> None:
    """Attempts failing at once: waits from the table, and the wait that would reach the
    deadline is not taken: the call gives up when the last possible attempt failed."""
    starts: list[float] = []

    async def refused(deadline: Deadline) -> None:
        starts.append(round(now(), 6))
        raise Lost("connection refused")

    async def main() -> None:
        await call_until_deadline(refused, 2.0)
        # BACKOFF: 0.05, 0.1, 0.2, 0.4, 0.8, then 1.0 would end at 2.55 > 2.
        assert BACKOFF[:6] == (0.05, 0.1, 0.2, 0.4, 0.8, 1.0)
        assert starts == [0.0, 0.05, 0.15, 0.35, 0.75, 1.55]
        assert now() == pytest.approx(1.55), "no sleep into (or past) the deadline"

    run(main)


def test_the_last_backoff_wait_repeats_until_the_deadline() -> None:
    starts: list[float] = []

    async def refused(deadline: Deadline) -> None:
        starts.append(round(now(), 6))
        raise Lost("connection refused")

    async def main() -> None:
        await call_until_deadline(refused, 1.0, backoff=(0.125, 0.25))
        assert starts == [0.0, 0.125, 0.375, 0.625, 0.875]
        assert now() == 0.875

    run(main)


@pytest.mark.parametrize("after", [0, 2], ids=["first attempt", "after two lost connections"])
def test_an_error_no_retry_fixes_passes_through_at_once(after: int) -> None:
    made: list[float] = []

    async def attempt(deadline: Deadline) -> None:
        made.append(now())
        if len(made) <= after:
            raise Lost("gone")
        raise ValueError("refused by the server")

    async def main() -> None:
        deadline = Deadline.after(30.0)
        give_up = GiveUp(deadline)
        with pytest.raises(ValueError, match="refused by the server"):
            await retried(attempt, deadline, transient=transient, give_up=give_up, backoff=(0.01,))
        assert len(made) == after + 1, "no attempt after it"
        assert now() == pytest.approx(0.01 * after), "raised as it came, no wait"
        assert give_up.calls == []

    run(main)


def test_success_after_transient_failures_returns_the_result() -> None:
    async def attempt(deadline: Deadline) -> str:
        if now() < 0.2:
            raise Lost("restarting")
        return "answer"

    async def main() -> None:
        deadline = Deadline.after(5.0)
        result = await retried(attempt, deadline, transient=transient, give_up=GiveUp(deadline))
        assert result == "answer"
        assert now() == pytest.approx(0.35)  # 0, 0.05, 0.15, 0.35

    run(main)


def test_a_cancelled_caller_gets_cancelled_error_after_the_attempt_cleaned_up() -> None:
    cleaned: list[float] = []
    made: list[float] = []

    async def attempt(deadline: Deadline) -> None:
        made.append(now())
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(0.5)  # the driver rolls back before the error goes on
            cleaned.append(now())
            raise

    async def main() -> None:
        deadline = Deadline.after(10.0)
        give_up = GiveUp(deadline)
        task = asyncio.ensure_future(retried(attempt, deadline, transient=transient, give_up=give_up))
        await asyncio.sleep(1.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert made == [0.0], "never retried"
        assert cleaned == [1.5] and now() == 1.5, "the error came once the attempt had cleaned up"
        assert give_up.calls == [], "a cancellation is not a BackendUnavailableError"
        assert current_deadline() is None

    run(main)


def test_a_caller_cancelled_during_a_backoff_wait_makes_no_more_attempts() -> None:
    made: list[float] = []

    async def attempt(deadline: Deadline) -> None:
        made.append(now())
        raise Lost("gone")

    async def main() -> None:
        deadline = Deadline.after(10.0)
        task = asyncio.ensure_future(
            retried(attempt, deadline, transient=transient, give_up=GiveUp(deadline), backoff=(1.0,))
        )
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(5)
        assert made == [0.0]

    run(main)


def test_an_attempt_that_turns_the_cut_into_its_own_failure_still_ends_the_call() -> None:
    """A driver that reports the deadline's cancellation as a lost connection: the loop
    gives up (no attempt after the deadline) and reports that failure."""

    async def attempt(deadline: Deadline) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise Lost("cut mid-statement") from None

    async def main() -> None:
        error, give_up = await call_until_deadline(attempt, 2.0)
        assert now() == 2.0
        assert [str(c) for c in give_up.calls] == ["cut mid-statement"]
        assert isinstance(error.__cause__, Lost)

    run(main)


def test_attempts_limit_raises_the_last_transient_error_as_is() -> None:
    made: list[float] = []

    async def raced(deadline: Deadline) -> None:
        made.append(now())
        raise Lost(f"lost race {len(made)}")

    async def main() -> None:
        deadline = Deadline.after(10.0)
        give_up = GiveUp(deadline)
        with pytest.raises(Lost, match="lost race 3"):
            await retried(raced, deadline, transient=transient, give_up=give_up, backoff=(0.0,), attempts=3)
        assert made == [0.0, 0.0, 0.0] and give_up.calls == []

    run(main)


def test_a_failed_first_attempt_goes_on_to_the_retries() -> None:
    made: list[float] = []
    told: list[tuple[str, int]] = []

    async def attempt(deadline: Deadline) -> str:
        made.append(now())
        return "fresh connection"

    async def main() -> None:
        deadline = Deadline.after(10.0)
        result = await retried(
            attempt, deadline, transient=transient, give_up=GiveUp(deadline), immediate_first=True,
            failed=Lost("idle connection closed"), on_retry=lambda exc, n: told.append((str(exc), n)),
        )
        assert result == "fresh connection"
        assert made == [0.0], "the first retry is immediate"
        assert told == [("idle connection closed", 0)]

    run(main)


def test_a_deadline_already_spent_makes_no_attempt() -> None:
    made: list[float] = []

    async def attempt(deadline: Deadline) -> None:
        made.append(now())

    async def main() -> None:
        deadline = Deadline.after(1.0)
        await asyncio.sleep(1.0)
        give_up = GiveUp(deadline)
        with pytest.raises(BackendUnavailableError):
            await retried(attempt, deadline, transient=transient, give_up=give_up)
        assert made == [] and give_up.calls == [None]

    run(main)


def test_deadline_cap_and_cause() -> None:
    async def main() -> None:
        deadline = Deadline.after(2.0)
        assert deadline.cap(5.0) == 2.0 and deadline.cap(0.5) == 0.5
        await asyncio.sleep(3.0)
        assert deadline.left() == -1.0 and deadline.cap(0.5) == 0.0
        lost = Lost("x")
        assert deadline_cause(lost, deadline) is lost
        assert str(deadline_cause(None, deadline)) == "no answer within 2s"
        assert isinstance(deadline_cause(asyncio.CancelledError(), deadline), TimeoutError)

    run(main)


def test_an_empty_backoff_table_is_refused() -> None:
    async def main() -> None:
        deadline = Deadline.after(1.0)

        async def attempt(deadline: Deadline) -> None:
            return None

        with pytest.raises(ValueError, match="at least one wait"):
            await retried(attempt, deadline, transient=transient, give_up=GiveUp(deadline), backoff=())

    run(main)
