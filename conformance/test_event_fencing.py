"""Fenced appends to event stores (capability ``fencing``), as generated tests.

``put``, ``put_batch`` and ``put_if_absent`` take ``fence=`` (a run store lease's token);
a store declaring ``fencing`` refuses a token older than one the thread has seen with
`StaleFenceError`, writing nothing, in the same step as the write (docs/events.md).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import uuid
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest

from runstore.errors import InvalidEventError, StaleFenceError
from runstore.events.protocol import RunEventStore

from .fencing_workers import event_contents, fresh_appender, refused_as_stale, stale_appender
from .session import development_plugins

pytestmark = pytest.mark.requires("fencing")


def _thread() -> str:
    return f"fence-{uuid.uuid4().hex}"


def _event(thread: str, i: int, run: str = "r1") -> dict[str, Any]:
    return {"thread_id": thread, "run_id": run, "event_type": "step", "category": "trace", "content": str(i)}



async def _contents(store: RunEventStore, thread: str) -> list[str]:
    out: list[str] = []
    for run in ("r1", "r2"):
        out += [str(e["content"]) for e in await store.list_events(thread, run, user_id=None)]
    return sorted(out)


def test_stale_token_is_refused_and_writes_nothing(events_target: Any) -> None:
    """put, put_batch and put_if_absent with an older token than the thread has seen raise
    StaleFenceError and write nothing; the current and newer tokens, and no token, pass."""

    async def body(store: RunEventStore) -> None:
        thread, other = _thread(), _thread()
        await store.put(**_event(thread, 1), user_id=None, fence=2)
        before = await _contents(store, thread)
        raised = await refused_as_stale(store.put(**_event(thread, 2), user_id=None, fence=1), "put")
        assert (raised.thread_id, raised.fence, raised.current) == (thread, 1, 2), (
            f"contract: StaleFenceError names the thread, the stale token and the current one: {raised!r}"
        )
        # A batch over two threads, stale on one of them: nothing of it is written.
        await refused_as_stale(
            store.put_batch([_event(other, 3), _event(thread, 4)], user_id=None, fence=1), "put_batch"
        )
        await refused_as_stale(
            store.put_if_absent(**{**_event(thread, 5), "event_type": "done"}, user_id=None, fence=1),
            "put_if_absent",
        )
        assert await _contents(store, thread) == before and await _contents(store, other) == [], (
            "contract: fencing: a refused append writes nothing (put, put_batch, put_if_absent)"
        )
        await store.put(**_event(thread, 6), user_id=None, fence=2)
        await store.put_batch([_event(thread, 7, "r2")], user_id=None, fence=3)
        await store.put(**_event(thread, 8), user_id=None)
        _, created = await store.put_if_absent(
            **{**_event(thread, 9), "event_type": "done"}, user_id=None, fence=3
        )
        assert created
        assert await _contents(store, thread) == ["1", "6", "7", "8", "9"], (
            "contract: fencing: appends with the current or a newer token, and without a token, "
            f"are written; got {await _contents(store, thread)}"
        )
        await refused_as_stale(store.put(**_event(thread, 10), user_id=None, fence=2), "put")
        await store.delete_by_thread(thread, user_id=None)
        await refused_as_stale(store.put(**_event(thread, 11), user_id=None, fence=2), "put after a delete")

    events_target.run(body)


def test_stale_append_after_a_grant_fences_the_thread_is_refused(events_target: Any) -> None:
    """A takeover: the old holder appended with token 1, the new holder's grant calls
    fence_thread(thread, 2) before writing anything; the old holder's next put, put_batch
    and put_if_absent are refused, as is fence_thread with an older token; the same token
    again passes, and nothing else of the thread changes."""

    async def body(store: RunEventStore) -> None:
        thread = _thread()
        await store.put(**_event(thread, 1), user_id=None, fence=1)
        await store.fence_thread(thread, 2)
        assert await _contents(store, thread) == ["1"], "contract: fence_thread writes no event"
        raised = await refused_as_stale(
            store.put(**_event(thread, 2), user_id=None, fence=1), "put after fence_thread with a newer token"
        )
        assert (raised.thread_id, raised.fence, raised.current) == (thread, 1, 2), (
            f"contract: StaleFenceError names the thread, the stale token and fence_thread's: {raised!r}"
        )
        await refused_as_stale(
            store.put_batch([_event(thread, 3)], user_id=None, fence=1), "put_batch after fence_thread"
        )
        await refused_as_stale(
            store.put_if_absent(**{**_event(thread, 4), "event_type": "done"}, user_id=None, fence=1),
            "put_if_absent after fence_thread",
        )
        await refused_as_stale(store.fence_thread(thread, 1), "fence_thread with an older token")
        await store.fence_thread(thread, 2)  # the same token again: passes, changes nothing
        assert await _contents(store, thread) == ["1"], (
            "contract: fencing: after fence_thread(thread, 2) no append of token 1 is written"
        )
        await store.put(**_event(thread, 5), user_id=None, fence=2)
        fresh = _thread()
        await store.fence_thread(fresh, 3)  # a thread with no event yet
        await refused_as_stale(store.put(**_event(fresh, 6), user_id=None, fence=2), "put on a fenced new thread")
        assert await _contents(store, thread) == ["1", "5"] and await _contents(store, fresh) == [], (
            "contract: fencing: appends of the current token are written, stale ones are not"
        )

    events_target.run(body)


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2"])
def test_bad_token_is_an_input_error(events_target: Any, bad: Any) -> None:
    """A token that is not an int from 1 to 2**63-1 raises InvalidEventError; nothing is written."""

    async def body(store: RunEventStore) -> None:
        thread = _thread()
        with pytest.raises(InvalidEventError, match="fence"):
            await store.put(**_event(thread, 1), user_id=None, fence=bad)
        with pytest.raises(InvalidEventError, match="fence"):
            await store.put_batch([_event(thread, 1)], user_id=None, fence=bad)
        with pytest.raises(InvalidEventError, match="fence"):
            await store.fence_thread(thread, bad)
        assert await _contents(store, thread) == [], "contract: a malformed token writes nothing"

    events_target.run(body)


async def _race_round(store: RunEventStore, yields: int) -> None:
    """One race; the newer appender starts after ``yields`` turns of the loop."""
    thread = _thread()
    await store.put(**_event(thread, 0), user_id=None, fence=1)
    acked: list[str] = []
    seen: list[str] = []

    async def old() -> None:
        for i in range(1, 400):
            try:
                await store.put(**_event(thread, i), user_id=None, fence=1)
            except StaleFenceError:
                return
            acked.append(str(i))
            await asyncio.sleep(0)

    async def new() -> None:
        for _ in range(yields):
            await asyncio.sleep(0)
        # A batch, as a worker appends a step's events; the check of every append call
        # must be one step with its write.
        await store.put_batch([_event(thread, 1000, "r2")], user_id=None, fence=2)
        seen.extend(await _contents(store, thread))

    await asyncio.gather(old(), new())
    late = sorted(set(acked) - set(seen), key=int)
    assert not late, (
        "contract: fencing: no append carrying a stale token lands after a newer token was "
        f"written (new appender after {yields} turns): {late[:5]}"
    )
    stored = set(await _contents(store, thread))
    assert set(acked) <= stored and stored <= {"0", "1000", *acked}, (
        "contract: fencing: exactly the acknowledged appends are stored"
    )


def test_fence_race_in_one_process(events_target: Any) -> None:
    """An appender with token 1 races one with token 2: every append of token 1 that
    succeeded is stored before token 2's first append was acknowledged."""

    async def body(store: RunEventStore) -> None:
        for yields in range(2, 8):
            await _race_round(store, yields)

    events_target.run(body)


@pytest.mark.requires("cross_process")
def test_fence_race_across_processes(events_target: Any, request: pytest.FixtureRequest) -> None:
    """Two OS processes append to one thread, the second with a newer token after the
    first has written: every append of the older token that succeeded was stored before
    the newer token's batch was acknowledged, none began after it and landed, and exactly
    the acknowledged appends are stored."""
    url = events_target.url.render(hide_password=False)
    plugins = development_plugins(request.config)
    ctx = multiprocessing.get_context("spawn")
    for head_start in (0.0, 0.2):
        thread = _thread()
        with ctx.Manager() as manager:
            fenced, wrote, barrier = manager.Event(), manager.Event(), manager.Barrier(2)
            with ProcessPoolExecutor(max_workers=2, mp_context=ctx) as pool:
                old_f = pool.submit(stale_appender, url, plugins, thread, fenced, wrote, barrier)
                new_f = pool.submit(
                    fresh_appender, url, plugins, thread, fenced, wrote, barrier, head_start
                )
                old, (new, seen) = old_f.result(timeout=300), new_f.result(timeout=300)
        where = f"2 processes, head start {head_start}s"
        odd = [a for a in old if a[2] not in ("ok", "stale")]
        assert not odd, f"the stale appender failed unexpectedly ({where}): {odd[:3]}"
        acked = {a[3] for a in old if a[2] == "ok"}
        late = sorted(acked - set(seen))
        assert not late, (
            "contract: fencing: no append carrying a stale token lands after a newer token was "
            f"written ({where}): {late[:5]}"
        )
        assert not [a for a in old if a[1] and a[2] == "ok"], (
            f"contract: fencing: an append that began after the newer token was written is refused ({where})"
        )

        async def stored(store: RunEventStore, t: str = thread) -> set[str]:
            return set(await event_contents(store, t))

        assert events_target.run(stored) == acked | {a[3] for a in new}, (
            f"contract: fencing: exactly the acknowledged appends are stored ({where})"
        )
