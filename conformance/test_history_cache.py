"""Delta-history cache conformance (`runstore.checkpoint.cache.HistoryCacheBackend`,
docs/checkpoint-modes.md "History cache"): the state machine against a dict model, then
each edge rule on its own.

A cache may forget an entry (an LRU bound, a TTL, a server restart), never answer with a
wrong one: `CachedHistorySaver` trusts every hit. Every test works under fresh thread
ids on one provisioned cache (``clear`` empties all of it: the suite's tests run one at a
time). Rules not every cache keeps are gated by capability:
``cache_max_entries`` (an LRU bound), ``cross_process`` (workers in
`runstore.conformance.history_cache_workers`).
"""

from __future__ import annotations

import copy
import multiprocessing
from collections.abc import Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest

from runstore.checkpoint.cache import entry_key

from .events_model import fresh_id
from .harness import BackendTarget
from .history_cache_machine import HistoryCacheMachine, mutate, sample
from .history_cache_workers import cache_worker
from .machines import run_machine
from .session import development_plugins

pytestmark = pytest.mark.runstore_contract("history_cache")

KEY = entry_key("", "c1", "messages")


def run(target: BackendTarget[Any], body: Callable[[Any, str], Awaitable[None]], **kw: Any) -> None:
    """Run ``body(cache, base)`` on a fresh instance, ``base`` a fresh thread id prefix."""
    base = fresh_id("hc")
    target.run(lambda cache: body(cache, base), **kw)


def test_history_cache_state_machine(history_cache_target: BackendTarget[Any]) -> None:
    run_machine(history_cache_target, HistoryCacheMachine)


def test_a_miss_is_none(history_cache_target: BackendTarget[Any]) -> None:
    async def body(cache: Any, base: str) -> None:
        await cache.set(f"{base}/t1", KEY, sample())
        for thread_id, key in [(f"{base}/t2", KEY), (f"{base}/t1", KEY + "\x1fseed"), (f"{base}/t1", KEY[:-1])]:
            got = await cache.get(thread_id, key)
            assert got is None, f"contract: a miss is None: get({thread_id!r}, {key!r}), never set, returned {got}"
        await cache.purge_thread(f"{base}/never-written")

    run(history_cache_target, body)


def test_get_returns_a_copy(history_cache_target: BackendTarget[Any]) -> None:
    """The entry got equals the one set and shares nothing with it or with another get's:
    LangGraph hands the seed list and message objects to the caller's state."""

    async def body(cache: Any, base: str) -> None:
        thread_id, given = f"{base}/t1", sample(1)
        await cache.set(thread_id, KEY, given)
        expected = copy.deepcopy(given)
        mutate(given)
        first = await cache.get(thread_id, KEY)
        assert first == expected, (
            f"contract: get returns a copy: mutating the entry given to set changed the stored entry: got {first}"
        )
        mutate(first)
        second = await cache.get(thread_id, KEY)
        assert second == expected, (
            f"contract: get returns a copy: mutating an entry get returned changed the stored entry: got {second}"
        )

    run(history_cache_target, body)


def test_set_replaces(history_cache_target: BackendTarget[Any]) -> None:
    async def body(cache: Any, base: str) -> None:
        thread_id = f"{base}/t1"
        await cache.set(thread_id, KEY, sample(1))
        await cache.get(thread_id, KEY)  # a cache that keeps what it has read is still replaced
        for replacement in [sample(2), {"writes": [("task-a", "messages", [])], "seed_ref": KEY + "\x1fseed"}, {"writes": []}]:
            await cache.set(thread_id, KEY, replacement)
            got = await cache.get(thread_id, KEY)
            assert got == replacement, (
                f"contract: set replaces the entry at its key (no key of the old entry kept): "
                f"got {got}, expected {replacement}"
            )

    run(history_cache_target, body)


def test_purge_thread_removes_exactly_that_thread(history_cache_target: BackendTarget[Any]) -> None:
    """Thread ids that are prefixes of each other, or glob patterns matching each other,
    are different threads."""

    async def body(cache: Any, base: str) -> None:
        threads = [f"{base}/t1", f"{base}/t10", f"{base}/t1[0]", f"{base}/t1*", f"{base}/t", f"{base}/T1"]
        keys = [KEY, KEY + "\x1fseed"]
        for i, thread_id in enumerate(threads):
            for key in keys:
                await cache.set(thread_id, key, sample(i))
        purged: list[str] = []
        for thread_id in (f"{base}/t1", f"{base}/t1*"):
            await cache.purge_thread(thread_id)
            purged.append(thread_id)
            for i, other in enumerate(threads):
                for key in keys:
                    got = await cache.get(other, key)
                    if other in purged:
                        assert got is None, (
                            f"contract: purge_thread removes exactly that thread's entries: {other!r} kept {got}"
                        )
                    else:
                        assert got == sample(i), (
                            f"contract: purge_thread removes exactly that thread's entries: "
                            f"purge_thread({thread_id!r}) changed {other!r}: got {got}"
                        )

    run(history_cache_target, body)


def test_clear_removes_every_entry(history_cache_target: BackendTarget[Any]) -> None:
    async def body(cache: Any, base: str) -> None:
        slots = [(f"{base}/t{i}", key) for i in range(3) for key in (KEY, KEY + "\x1fseed")]
        for thread_id, key in slots:
            await cache.set(thread_id, key, sample())
        await cache.clear()
        left = {slot: got for slot in slots if (got := await cache.get(*slot)) is not None}
        assert not left, f"contract: clear removes every entry: kept {sorted(left)}"
        await cache.set(slots[0][0], KEY, sample(7))
        got = await cache.get(slots[0][0], KEY)
        assert got == sample(7), f"contract: a cache takes entries again after clear: got {got}"

    run(history_cache_target, body)


def test_a_cache_may_forget_never_lie(history_cache_target: BackendTarget[Any]) -> None:
    """With ``max_entries: 4`` and 40 entries set, every get is the entry set there or a
    miss, and the entry set last is a hit: evicting never answers with another entry."""

    async def body(cache: Any, base: str) -> None:
        slots = [(f"{base}/t{i % 3}", entry_key("", f"c{i}", "messages")) for i in range(40)]
        for n, (thread_id, key) in enumerate(slots):
            await cache.set(thread_id, key, sample(n))
            got = await cache.get(thread_id, key)
            assert got == sample(n), (
                f"contract: an entry just set is a hit (checkpoint_cache.max_entries >= 1): "
                f"get({thread_id!r}, {key!r}) returned {got}"
            )
        for n, (thread_id, key) in enumerate(slots):
            got = await cache.get(thread_id, key)
            assert got is None or got == sample(n), (
                f"contract: a cache may forget an entry, never return a wrong one: get({thread_id!r}, {key!r}) "
                f"returned {got}, expected {sample(n)} or None"
            )

    run(history_cache_target, body, settings={"checkpoint_cache": {"max_entries": 4}})


@pytest.mark.requires("cache_max_entries")
def test_max_entries_evicts_the_least_recently_used(history_cache_target: BackendTarget[Any]) -> None:
    async def body(cache: Any, base: str) -> None:
        thread_id = f"{base}/t1"
        keys = [entry_key("", f"c{i}", "messages") for i in range(5)]
        for n, key in enumerate(keys[:4]):
            await cache.set(thread_id, key, sample(n))
        await cache.get(thread_id, keys[0])  # a use: c1 is now the least recently used
        await cache.set(thread_id, keys[4], sample(4))
        held = {key: (await cache.get(thread_id, key)) is not None for key in keys}
        assert held == {k: k != keys[1] for k in keys}, (
            "contract: a cache bounded by checkpoint_cache.max_entries holds at most that many entries and "
            f"evicts the least recently used first (a get is a use): with max_entries 4, held {held}"
        )

    run(history_cache_target, body, settings={"checkpoint_cache": {"max_entries": 4}})


@pytest.mark.requires("cross_process")
def test_history_cache_across_processes(history_cache_target: BackendTarget[Any], request: pytest.FixtureRequest) -> None:
    """An entry set in one process is a hit in another; a purge there is a miss here."""
    target = history_cache_target
    url = target.url.render(hide_password=False)
    base = fresh_id("hc")
    here, there, other = f"{base}/t1", f"{base}/t10", f"{base}/t2"

    async def before(cache: Any) -> None:
        await cache.set(here, KEY, sample(1))
        await cache.set(other, KEY, sample(3))

    target.run(before)
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        seen = pool.submit(cache_worker, url, development_plugins(request.config), here, there, KEY).result(timeout=300)
    assert seen == sample(1), (
        f"contract: cross_process: an entry set in one process is a hit in another: the worker got {seen}"
    )

    async def after(cache: Any) -> None:
        got = {t: await cache.get(t, KEY) for t in (here, there, other)}
        assert got == {here: None, there: sample(2), other: sample(3)}, (
            "contract: cross_process: an entry set or purged in one process is seen so in another: after the "
            f"worker purged {here!r} and set {there!r}, got {got}"
        )
        await cache.purge_thread(there)
        await cache.purge_thread(other)

    target.run(after)
