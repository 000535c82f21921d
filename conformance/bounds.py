"""Every suite test ends: a per-test time bound, and what the test was waiting for when it ran out.

The suite's own waits are bounded and name their contract (``WAIT`` in the stream
suite); this bound is the backstop for a backend call that never returns (a deadlocked
``publish``, a lock never released). Each phase of a suite test (setup, call, teardown)
gets ``--runstore-timeout`` / ``[tool.runstore.conformance] timeout`` seconds (default
`DEFAULT_TIMEOUT`, ``0`` for none). When it runs out, the test fails with a
`ContractTimeout` naming the backend call that did not return and where the suite was.

The bound is a ``SIGALRM`` timer, so it also interrupts a call that blocks the event
loop's thread; where there is no ``SIGALRM`` (Windows) or the test does not run on the
main thread, tests are not bounded.
"""

from __future__ import annotations

import asyncio
import gc
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

#: Seconds each phase of a suite test may take unless the author says otherwise.
DEFAULT_TIMEOUT = 300.0
#: After the bound ran out, how long the test may take to cancel what it was doing.
GRACE = 15.0

_SUITE_DIR = Path(__file__).resolve().parent
_STDLIB_DIR = Path(threading.__file__).resolve().parent


class ContractTimeout(BaseException):
    """A suite test ran past its time bound. A BaseException, so neither backend code
    catching ``Exception`` nor Hypothesis (which would re-run the example) swallows it."""


def _where(frame: FrameType) -> str:
    code = frame.f_code
    return f"{code.co_qualname} ({Path(code.co_filename).name}:{frame.f_lineno})"


def _is_suite(frame: FrameType) -> bool:
    return Path(frame.f_code.co_filename).resolve().parent == _SUITE_DIR


def _is_plumbing(frame: FrameType) -> bool:
    """Frames that are neither the suite nor the backend: the standard library, pytest, Hypothesis."""
    path = Path(frame.f_code.co_filename).resolve()
    return (
        path.is_relative_to(_STDLIB_DIR) and "site-packages" not in path.parts
    ) or any(part in ("_pytest", "pluggy", "hypothesis") for part in path.parts)


def _coroutine_frames(task: asyncio.Task[Any]) -> list[FrameType]:
    """The frames of ``task`` from its coroutine down to what it awaits (outermost first)."""
    frames: list[FrameType] = []
    awaitable: Any = task.get_coro()
    while awaitable is not None:
        frame = getattr(awaitable, "cr_frame", None) or getattr(awaitable, "ag_frame", None)
        if frame is not None:
            frames.append(frame)
        awaitable = getattr(awaitable, "cr_await", None) or getattr(awaitable, "ag_await", None)
    return frames


def _thread_frames(frame: FrameType | None) -> list[FrameType]:
    frames: list[FrameType] = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return frames[::-1]


def _stuck_call(chains: list[list[FrameType]]) -> tuple[str | None, str | None]:
    """(the call the suite made that has not returned, where the suite was), best effort."""
    fallback = None
    for chain in chains:
        suite = [i for i, f in enumerate(chain) if _is_suite(f)]
        if not suite:
            continue
        last = suite[-1]
        callee = next((f for f in chain[last + 1 :] if not _is_plumbing(f)), None)
        if callee is not None:
            return _where(callee), _where(chain[last])
        fallback = fallback or _where(chain[last])
    return None, fallback


def describe_stuck(frame: FrameType | None) -> tuple[str | None, str | None]:
    """What the main thread (and the tasks of its running event loop) are stuck in."""
    # The thread's own stack first: it holds the coroutine that is running (blocking the
    # loop); then the suspended tasks, the longest await chain first.
    chains = [_thread_frames(frame)]
    loop = asyncio._get_running_loop()
    if loop is not None:
        tasks = [_coroutine_frames(t) for t in asyncio.all_tasks(loop)]
        chains += sorted(tasks, key=len, reverse=True)
    return _stuck_call(chains)


def timeout_message(seconds: float, what: str, frame: FrameType | None, *, grace: bool = False) -> str:
    """The failure of a test that ran past its bound: the contract it was waiting for."""
    call, at = describe_stuck(frame)
    hint = (
        "raise the bound with `runstore check --timeout SECONDS` (under pytest: "
        "--runstore-timeout SECONDS or `timeout = SECONDS` in [tool.runstore.conformance])"
    )
    if grace:
        return (
            f"contract: a cancelled {what} call ends (it was still running {GRACE:.0f}s after the "
            f"test's {seconds:g}s bound ran out{': ' + call if call else ''})"
        )
    if call is not None:
        return (
            f"contract: every {what} call returns ({call} had not returned when the test's "
            f"{seconds:g}s bound ran out; the suite was waiting at {at}); {hint}"
        )
    place = f" (the suite was at {at})" if at else ""
    return f"contract: the test ends within its {seconds:g}s bound{place}; {hint}"


@contextmanager
def bounded(seconds: float | None, what: str) -> Iterator[None]:
    """Raise `ContractTimeout` in the main thread if the block runs past ``seconds``.

    ``what`` names the kind of backend for the message (``streams backend``). Another
    SIGALRM timer (pytest-timeout's) is suspended meanwhile and restored after.
    """
    if (
        not seconds
        or not hasattr(signal, "SIGALRM")
        or threading.current_thread() is not threading.main_thread()
    ):
        yield
        return
    fired = 0

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        nonlocal fired
        fired += 1
        if fired == 1:
            signal.setitimer(signal.ITIMER_REAL, GRACE)
            raise ContractTimeout(timeout_message(seconds, what, frame))
        raise ContractTimeout(timeout_message(seconds, what, frame, grace=True))

    started = time.monotonic()
    previous_handler = signal.signal(signal.SIGALRM, on_alarm)
    previous_delay, previous_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        if fired:
            # Finalize what the interrupted test left behind (its tasks and generators log
            # as they go) now, not inside pytest's report formatting: on Python 3.11 a
            # traceback printed from a finalizer during `ast.parse` breaks that parse.
            gc.collect()
        if previous_delay:
            left = previous_delay - (time.monotonic() - started)
            signal.setitimer(signal.ITIMER_REAL, max(left, 0.001), previous_interval)


def parse_timeout(value: Any, source: str) -> float:
    """A bound in seconds from an option or pyproject value (``0`` = no bound)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if not (0 <= seconds < float("inf")) or isinstance(value, bool):
        raise ValueError(f"{source}: the per-test timeout is a number of seconds >= 0 (0 = none); got {value!r}")
    return seconds



class BoundsPlugin:
    """Pytest hook wrappers that bound each phase of every test that drives a backend."""

    def __init__(self, seconds: float, target_fixtures: dict[str, str]) -> None:
        self.seconds = seconds
        self.target_fixtures = target_fixtures  # kind -> fixture of the backend under test

    def _what(self, item: pytest.Item) -> str | None:
        callspec = getattr(item, "callspec", None)
        if callspec is None:
            return None
        for kind, fixture in self.target_fixtures.items():
            if callspec.params.get(fixture) is not None:
                return f"{kind} backend"
        return None

    @contextmanager
    def _phase(self, item: pytest.Item) -> Iterator[None]:
        what = self._what(item)
        if what is None:
            yield
            return
        with bounded(self.seconds, what):
            yield

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Any:
        with self._phase(item):
            return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Any:
        with self._phase(item):
            return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Any:
        with self._phase(item):
            return (yield)
