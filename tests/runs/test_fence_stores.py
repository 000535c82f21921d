"""`runstore.fencing.fence_stores`: how a lease grant fences the stores of its run."""

from __future__ import annotations

import asyncio

import pytest

from runstore.errors import StaleFenceError
from runstore.fencing import FenceGrant, fence_stores

GRANT = FenceGrant("thread-1", "run-1", 5)


class _Saver:
    def __init__(self, entered: asyncio.Event, release: asyncio.Event) -> None:
        self.entered = entered
        self.release = release
        self.calls: list[tuple[str, int]] = []
        self.done = False

    async def afence_thread(self, thread_id: str, fence: int) -> None:
        self.calls.append((thread_id, fence))
        self.entered.set()
        await self.release.wait()
        self.done = True


class _Bridge:
    def __init__(self, entered: asyncio.Event, release: asyncio.Event, stale: bool = False) -> None:
        self.entered = entered
        self.release = release
        self.stale = stale
        self.calls: list[tuple[str, int]] = []

    async def fence_stream(self, run_id: str, fence: int) -> None:
        self.calls.append((run_id, fence))
        # Reached only if the saver's fence call is in progress at the same time.
        await self.entered.wait()
        if self.stale:
            raise StaleFenceError(None, fence, fence + 1, run_id=run_id)
        self.release.set()


async def test_the_stores_are_fenced_at_once_each_by_its_key() -> None:
    """The saver's call is still waiting when the bridge's starts (which releases it):
    one after the other, this grant would never end."""
    entered, release = asyncio.Event(), asyncio.Event()
    saver, bridge = _Saver(entered, release), _Bridge(entered, release)
    await asyncio.wait_for(fence_stores(GRANT, [saver, None, object(), bridge]), 30)
    assert saver.calls == [("thread-1", 5)] and bridge.calls == [("run-1", 5)]
    assert saver.done


async def test_a_refusal_is_raised_once_every_call_has_ended() -> None:
    """A store refusing the grant raises its `StaleFenceError`, but only after the other
    stores' calls have ended: none is left running behind the caller."""
    entered, release = asyncio.Event(), asyncio.Event()
    saver, bridge = _Saver(entered, release), _Bridge(entered, release, stale=True)
    task = asyncio.ensure_future(fence_stores(GRANT, [saver, bridge]))
    await entered.wait()
    await asyncio.sleep(0)
    assert not task.done(), "the refusal was raised while the saver's fence call ran"
    release.set()
    with pytest.raises(StaleFenceError) as refused:
        await asyncio.wait_for(task, 30)
    assert refused.value.run_id == "run-1" and saver.done
