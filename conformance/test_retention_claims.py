"""Retention sweep claims (capability ``retention``): a sweep batch claims the threads
it takes, and no other sweep, in this process or another, takes a claimed thread until
the claim lapses after ``claim_seconds``; sweepers running one pass together split the
threads exactly (docs/threads.md, "Sweeping a saver"). Assertion messages name the
contract that broke.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from runstore.checkpoint.policy import RetentionPolicy
from runstore.clock import ManualClock
from runstore.errors import InvalidSaverInputError

from .savers_model import config_for, make_checkpoint, named, new_checkpoint_id, new_thread_id
from .test_retention import START, Saver, _ids

pytestmark = pytest.mark.requires("retention")


def test_claims_split_the_work(saver_target: Any) -> None:
    """Two sweeps running one after the other within the claim's time take disjoint
    threads; a lapsed claim is taken again; bad sweep arguments raise."""

    async def body(saver: Saver) -> None:
        clock = ManualClock(START)
        saver.clock = clock  # type: ignore[attr-defined]
        threads = sorted(new_thread_id() for _ in range(4))
        for thread in threads:
            parent = None
            for _ in range(3):
                cid = new_checkpoint_id()
                await saver.aput(config_for(thread, parent), make_checkpoint(cid, {}, {}), {}, {})
                parent = cid
        policy = RetentionPolicy(keep_last=1)
        peek = await saver.asweep(policy, limit=2, dry_run=True, thread_ids=threads)  # type: ignore[attr-defined]
        assert [t.thread_id for t in peek.threads] == threads[:2] and peek.cursor == threads[1]
        # A sweeper that claimed and died: its claim holds until it lapses.
        first = await saver.asweep(policy, limit=2, thread_ids=threads, claim_seconds=30)  # type: ignore[attr-defined]
        second = await saver.asweep(policy, limit=4, thread_ids=threads)  # type: ignore[attr-defined]
        taken = [t.thread_id for t in first.threads] + [t.thread_id for t in second.threads]
        assert sorted(taken) == threads and len(set(taken)) == 4, (
            f"{taken} (contract: sweeps take each due thread once)"
        )
        for bad in ({"limit": 0}, {"limit": 10**6}, {"claim_seconds": 0}):
            with pytest.raises(InvalidSaverInputError):
                await saver.asweep(policy, **bad)  # type: ignore[attr-defined]
        with pytest.raises(InvalidSaverInputError):
            await saver.asweep({"keep_last": 1})  # type: ignore[attr-defined]
        for thread in threads:
            await saver.adelete_thread(thread)

    saver_target.run(body)


@pytest.mark.requires("cross_process")
def test_sweepers_in_processes_split_the_work_exactly(
    saver_target: Any, request: pytest.FixtureRequest
) -> None:
    """Three sweeper processes run one pass each against one database while this process
    keeps writing to the same threads; after a last pass every thread holds exactly
    ``keep_last`` checkpoints, the record says so, and the sweeps' reported removals add
    up to exactly what was written minus what is kept (nothing deleted twice or wrongly)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from runstore.sweeper import Sweeper

    from .retention_workers import sweeper_worker
    from .session import development_plugins

    url = saver_target.url.render(hide_password=False)
    plugins = development_plugins(request.config)
    threads, before, during, keep, workers = 18, 6, 3, 2, 3

    async def body(saver: Saver) -> None:
        ids = sorted(new_thread_id("sweep") for _ in range(threads))
        heads: dict[str, str | None] = dict.fromkeys(ids)

        async def put(thread: str, n: int) -> None:
            cid = new_checkpoint_id()
            version = f"{n:032}.0"
            await saver.aput(
                config_for(thread, heads[thread]),
                make_checkpoint(cid, {"a": n}, {"a": version}),
                {"step": n},
                {"a": version},
            )
            heads[thread] = cid

        for n in range(before):
            for thread in ids:
                await put(thread, n)
        loop = asyncio.get_running_loop()
        ctx = multiprocessing.get_context("spawn")
        with ctx.Manager() as manager:
            barrier = manager.Barrier(workers + 1)
            with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
                futures = [
                    asyncio.wrap_future(pool.submit(sweeper_worker, url, plugins, keep, ids, barrier))
                    for _ in range(workers)
                ]
                await loop.run_in_executor(None, barrier.wait, 120)
                for n in range(before, before + during):
                    for thread in ids:
                        await put(thread, n)
                results = await asyncio.wait_for(asyncio.gather(*futures), 300)
        last = await Sweeper(saver).sweep(RetentionPolicy(keep_last=keep), thread_ids=ids)
        removed = sum(r["checkpoints"] for r in results) + last.removed.checkpoints
        shown = f"(per process {results}, last pass {last.as_dict()})"
        assert sum(r["examined"] for r in results) >= 1, f"no process swept anything {shown}"
        for thread in ids:
            left = await _ids(saver, thread)
            assert len(left) == keep, (
                f"{thread}: {len(left)} checkpoints left (contract: concurrent sweepers and "
                f"writers end with exactly keep_last={keep})"
            )
            info = await saver.aget_thread(thread)  # type: ignore[attr-defined]
            assert info.checkpoints == keep and info.latest_checkpoint_id == heads[thread], (
                "contract: the thread record stays exact under concurrent sweeps and writes"
            )
        written = threads * (before + during)
        assert removed == written - threads * keep, named(
            f"sweeps reported {removed} checkpoints removed, {written - threads * keep} were "
            f"(contract: concurrent sweepers split the work without deleting anything twice) {shown}"
        )
        for thread in ids:
            await saver.adelete_thread(thread)

    saver_target.run(body)


@pytest.mark.requires("cross_process")
def test_sweep_claims_are_exclusive_across_processes(
    saver_target: Any, request: pytest.FixtureRequest
) -> None:
    """Two processes each run one sweep batch over the same due threads at the same
    moment (no writer): a thread claimed by one is examined by no other while the claim
    holds, so every thread is examined exactly once in all."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from .retention_workers import claim_worker
    from .session import development_plugins

    url = saver_target.url.render(hide_password=False)
    plugins = development_plugins(request.config)
    threads, depth, workers = 12, 6, 2

    async def body(saver: Saver) -> None:
        ids = sorted(new_thread_id("claim") for _ in range(threads))
        for thread in ids:
            parent = None
            for n in range(depth):
                cid = new_checkpoint_id()
                await saver.aput(config_for(thread, parent), make_checkpoint(cid, {"a": n}, {}), {}, {})
                parent = cid
        loop = asyncio.get_running_loop()
        ctx = multiprocessing.get_context("spawn")
        with ctx.Manager() as manager:
            barrier = manager.Barrier(workers + 1)
            with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
                futures = [
                    asyncio.wrap_future(pool.submit(claim_worker, url, plugins, 1, ids, barrier))
                    for _ in range(workers)
                ]
                await loop.run_in_executor(None, barrier.wait, 120)
                results = await asyncio.wait_for(asyncio.gather(*futures), 300)
        examined = [t for r in results for t in r]
        twice = sorted({t for t in examined if examined.count(t) > 1})
        assert not twice, named(
            f"{len(twice)} thread(s) examined by more than one sweeper {results} (contract: a "
            "sweep claim is exclusive: no other sweeper takes a claimed thread while the claim holds)"
        )
        assert sorted(examined) == ids, (
            f"examined {sorted(examined)} of {ids} (contract: one pass of several sweepers examines "
            "every due thread)"
        )
        for thread in ids:
            assert len(await _ids(saver, thread)) == 1
            await saver.adelete_thread(thread)

    saver_target.run(body)


async def _claimed_tombstones(saver: Saver, count: int) -> list[str]:
    """``count`` deleted threads whose cleanup one sweep batch has just claimed (claims on
    tombstones hold until ``afinish_cleanup`` or until they lapse: nothing sweeps them)."""
    ids = sorted(new_thread_id("claim") for _ in range(count))
    for thread in ids:
        await saver.aput(config_for(thread), make_checkpoint(new_checkpoint_id(), {}, {}), {}, {})
        await saver.adelete_thread(thread)
    batch = await saver.asweep(RetentionPolicy(keep_last=1), limit=100, thread_ids=ids, claim_seconds=300)  # type: ignore[attr-defined]
    assert sorted(batch.cleanup) == ids, (
        f"contract: a sweep hands out deleted threads for cleanup (got {batch.cleanup})"
    )
    return ids


def test_a_claim_holds_until_it_lapses(saver_target: Any) -> None:
    """A sweeper that claimed threads and stopped (here: deleted threads it claimed for
    cleanup and never finished) keeps them from every other sweep until ``claim_seconds``
    pass: one microsecond before, a sweep takes none of them; at the lapse it takes them
    all; ``afinish_cleanup`` ends the hand-outs."""

    async def body(saver: Saver) -> None:
        clock = ManualClock(START)
        saver.clock = clock  # type: ignore[attr-defined]
        ids = await _claimed_tombstones(saver, 3)
        policy = RetentionPolicy(keep_last=1)
        clock.advance(300 - 1e-6)
        held = await saver.asweep(policy, limit=100, thread_ids=ids)  # type: ignore[attr-defined]
        assert not held.cleanup and not held.threads, named(
            f"{held.cleanup} taken again while claimed (contract: a sweep claim is exclusive: no "
            "other sweeper takes a claimed thread while the claim holds)"
        )
        clock.advance(1e-6)
        lapsed = await saver.asweep(policy, limit=100, thread_ids=ids)  # type: ignore[attr-defined]
        assert sorted(lapsed.cleanup) == ids, (
            f"{lapsed.cleanup} (contract: a claim lapses after claim_seconds; the threads are "
            "handed out again)"
        )
        await saver.afinish_cleanup(ids)  # type: ignore[attr-defined]
        clock.advance(1000)
        done = await saver.asweep(policy, limit=100, thread_ids=ids)  # type: ignore[attr-defined]
        assert not done.cleanup, "contract: afinish_cleanup ends a deleted thread's hand-outs"

    saver_target.run(body)


@pytest.mark.requires("cross_process")
def test_a_claim_holds_in_other_processes(saver_target: Any, request: pytest.FixtureRequest) -> None:
    """Threads this process's sweep claimed are taken by no sweep in another process
    while the claim holds (sqlite files included)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from .retention_workers import sweep_once_worker
    from .session import development_plugins

    url = saver_target.url.render(hide_password=False)
    plugins = development_plugins(request.config)

    async def body(saver: Saver) -> None:
        ids = await _claimed_tombstones(saver, 3)
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
            other = await asyncio.wait_for(
                asyncio.wrap_future(pool.submit(sweep_once_worker, url, plugins, ids)), 300
            )
        assert not other["cleanup"] and not other["threads"], named(
            f"another process took {other} (contract: a sweep claim is exclusive: no other sweeper "
            "takes a claimed thread while the claim holds)"
        )
        await saver.afinish_cleanup(ids)  # type: ignore[attr-defined]

    saver_target.run(body)
