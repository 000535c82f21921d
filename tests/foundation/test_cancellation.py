"""The one cancellation rule (`runstore.cancellation`): a cancelled caller returns only once
what it started has ended, however often it is cancelled meanwhile; and no other runtime
module holds a cancellation with a rule of its own."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from runstore.cancellation import settle, wait_until_done

ROOT = Path(__file__).resolve().parents[2]


class Operation:
    """An operation held open until released, recording whether it ended or was cancelled."""

    def __init__(self, fail: bool = False) -> None:
        self.release = asyncio.Event()
        self.started = asyncio.Event()
        self.ended = False
        self.cancelled = False
        self.fail = fail

    async def run(self) -> str:
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        self.ended = True
        if self.fail:
            raise ValueError("the operation failed")
        return "done"


async def _cancel_repeatedly(caller: asyncio.Future[object], times: int) -> None:
    for _ in range(times):
        caller.cancel()
        await asyncio.sleep(0)
        assert not caller.done(), "back before the operation ended"


@pytest.mark.parametrize("cancels", [1, 3])
async def test_settle_returns_only_once_the_operation_ended(cancels: int) -> None:
    op = Operation()
    caller = asyncio.ensure_future(settle(op.run()))
    await op.started.wait()
    await _cancel_repeatedly(caller, cancels)
    op.release.set()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert op.ended and not op.cancelled


async def test_settle_without_a_cancellation_returns_the_result_or_error() -> None:
    op = Operation()
    op.release.set()
    assert await settle(op.run()) == "done"
    failing = Operation(fail=True)
    failing.release.set()
    with pytest.raises(ValueError, match="failed"):
        await settle(failing.run())


@pytest.mark.parametrize("fail", [False, True])
@pytest.mark.parametrize("cancels", [0, 1, 3])
async def test_wait_until_done_holds_every_cancellation_until_the_end(cancels: int, fail: bool) -> None:
    op = Operation(fail=fail)
    running = asyncio.ensure_future(op.run())
    await op.started.wait()
    caller = asyncio.ensure_future(wait_until_done(running))
    await asyncio.sleep(0)
    await _cancel_repeatedly(caller, cancels)
    op.release.set()
    if cancels:
        with pytest.raises(asyncio.CancelledError):
            await caller
    else:
        assert await caller is None, "its outcome is not the wait's business"
    assert op.ended and not op.cancelled and running.done()


def test_no_other_runtime_module_holds_a_cancellation_its_own_way() -> None:
    """`asyncio.shield` holds a cancellation back; outside `runstore.cancellation` only where
    the shielded thing is not an operation whose caller must wait for it."""
    allowed = {
        # wait_idle: a caller closing a store stops waiting when cancelled; the batch
        # task it waits on must not be cancelled with it (its ops' callers still wait).
        "core/batching.py",
        # a redis-py connection checkout: a cancelled caller does not wait; the checkout
        # finishes in the background and the connection goes back closed.
        "plugins/redis/client.py",
    }
    users = {
        str(path.relative_to(ROOT))
        for folder in ("core", "plugins")
        for path in (ROOT / folder).rglob("*.py")
        if "bench" not in path.parts and re.search(r"\bshield\(", path.read_text(encoding="utf-8"))
    }
    assert users - {"core/cancellation.py"} <= allowed, sorted(users)
