"""Run store conformance: the contract of `runstore.runs` (docs/runs.md), checked on any backend.

Every test takes ``runs_target`` and is synchronous. Assertion messages start with
``contract:`` and name the rule a backend broke. Time is a `ManualClock` the tests move,
so leases expire without sleeping. Claims see every run of the store, so each test
deletes the runs it created, and clocks start far from the wall clock (runs another
test left with real-time leases are never expired on them).

Why one module of this size: pytest collects a suite per module, and one module per
kind is what ``-k test_runs``, `runstore check` and the broken-backend runner select;
the model, state machine and worker helpers live in ``runs_model``, ``runs_machine``
and ``runs_workers``.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from runstore.clock import ManualClock
from runstore.errors import ThreadBusyError
from runstore.runs.protocol import RunStore

from .events_model import fresh_id
from .machines import RunStoreMachine, run_machine
from .runs_model import delete_all as _delete_all
from .runs_workers import claim_worker, create_race_worker
from .session import development_plugins

pytestmark = pytest.mark.runstore_contract("run store")

#: Where the race tests' clock starts: before the wall clock, after the machine's.
RACE_EPOCH = datetime(2001, 1, 1, tzinfo=UTC)


def test_state_machine_matches_model(runs_target: Any) -> None:
    """Random creates/starts/renewals/cancels/finalizes/claims/deletes and clock moves agree
    with a plain-dict model."""
    run_machine(runs_target, RunStoreMachine)


# =====================================================================================
# Leases, cancels and claims, one rule at a time
# =====================================================================================


def test_finalize_needs_the_live_lease_and_honours_a_pending_cancel(runs_target: Any) -> None:
    """Only the owner of a live lease finalizes; a pending cancel admits only cancelled/interrupted."""
    from runstore.errors import CancelPendingError, LeaseLostError

    async def body(store: RunStore) -> None:
        clock = store.clock = ManualClock(RACE_EPOCH)
        thread = fresh_id("final")
        try:
            run_id = (await store.create(thread)).run["run_id"]
            await store.start(run_id, "owner", 10)
            with pytest.raises(LeaseLostError):
                await store.finalize(run_id, "intruder", "success")
            assert await store.request_cancel(run_id, "rollback") == "rollback"
            assert await store.request_cancel(run_id, "interrupt") == "rollback", (
                "contract: request_cancel is first-writer-wins: a later request gets the first action"
            )
            assert await store.renew_lease(run_id, "owner", 10) == (True, "rollback"), (
                "contract: renew_lease reports the pending cancel action to the owner"
            )
            try:
                await store.finalize(run_id, "owner", "success")
            except CancelPendingError:
                pass
            else:
                raise AssertionError(
                    "contract: finalize refuses any status but cancelled/interrupted while a cancel "
                    "is pending (finalize(success) after request_cancel succeeded)"
                )
            clock.advance(11)
            with pytest.raises(LeaseLostError):
                await store.finalize(run_id, "owner", "cancelled")
            clock.set(RACE_EPOCH + timedelta(seconds=5))
            done = await store.finalize(run_id, "owner", "cancelled")
            assert done["status"] == "cancelled" and not done["active"] and done["lease_expires_at"] is None
            assert await store.finalize(run_id, "owner", "cancelled") == done, (
                "contract: repeating finalize as the same owner with the same status returns the run"
            )
        finally:
            await _delete_all(store, [thread])

    runs_target.run(body)


def test_claim_takes_only_expired_leases(runs_target: Any) -> None:
    """A live lease, or one that ended less than grace ago, is never claimed."""

    async def body(store: RunStore) -> None:
        clock = store.clock = ManualClock(RACE_EPOCH)
        threads = [fresh_id("lease") for _ in range(3)]
        try:
            ids = []
            for thread, ttl in zip(threads, (5, 20, 60), strict=True):
                run_id = (await store.create(thread)).run["run_id"]
                await store.start(run_id, "owner", ttl)
                ids.append(run_id)
            clock.advance(30)  # leases ended 25 s ago, 10 s ago, and still live
            got = await store.claim_expired("claimer", 60, grace=15)
            assert [r["run_id"] for r in got] == ids[:1], (
                "contract: claim_expired takes only runs whose lease ended at least grace seconds "
                f"ago (grace 15 s; leases ended 25 s ago, 10 s ago, live): claimed "
                f"{[ids.index(r['run_id']) for r in got if r['run_id'] in ids]}"
            )
            assert got[0]["owner"] == "claimer" and got[0]["fence"] == 2
            assert await store.renew_lease(ids[0], "owner", 60) == (False, None), (
                "contract: after a takeover the old owner's renewals fail"
            )
        finally:
            await _delete_all(store, threads)

    runs_target.run(body)


# =====================================================================================
# Races in one process
# =====================================================================================


def _check_reject_race(results: list[tuple[str, str]], thread: str, contenders: int, where: str) -> None:
    created = [run for outcome, run in results if outcome == "created"]
    assert len(created) == 1, (
        f"contract: create with reject is atomic: exactly one of {contenders} racing creates on "
        f"thread {thread!r} succeeds, the others raise ThreadBusyError ({where}; "
        f"{len(created)} succeeded: {created})"
    )
    named = {run for outcome, run in results if outcome == "busy"}
    assert named <= set(created), (
        f"contract: ThreadBusyError names the active run ({where}): named {sorted(named)}, "
        f"active {created}"
    )


def test_reject_race_in_one_process(runs_target: Any) -> None:
    """8 coroutines create with reject on each of 4 threads at once: one run per thread."""

    async def body(store: RunStore) -> None:
        threads = [fresh_id("reject") for _ in range(4)]
        try:

            async def contender(thread: str, i: int) -> tuple[str, str]:
                try:
                    result = await store.create(thread, run_id=f"{thread}-c{i}")
                    return ("created", result.run["run_id"])
                except ThreadBusyError as exc:
                    return ("busy", exc.active_run["run_id"])

            for thread in threads:
                results = await asyncio.gather(*(contender(thread, i) for i in range(8)))
                _check_reject_race(list(results), thread, 8, "coroutines")
                runs = await store.list_by_thread(thread)
                assert len(runs) == 1 and runs[0]["active"], (
                    f"contract: create with reject is atomic: a rejected create writes nothing "
                    f"(thread holds {[r['run_id'] for r in runs]})"
                )
        finally:
            await _delete_all(store, threads)

    runs_target.run(body)


async def _expired_runs(store: RunStore, count: int, prefix: str) -> list[str]:
    """``count`` running runs, one per thread, whose leases ended a minute ago (store clock)."""
    clock = ManualClock(RACE_EPOCH)
    store.clock = clock
    ids = []
    for i in range(count):
        created = await store.create(f"{prefix}-t{i}", run_id=f"{prefix}-r{i}")
        await store.start(created.run["run_id"], f"{prefix}-dead", 1)
        ids.append(created.run["run_id"])
    clock.advance(60)
    return ids


def _check_claims(claims: Sequence[tuple[str, int | None]], run_ids: list[str], where: str) -> None:
    seen: dict[str, int] = {}
    for run_id, _ in claims:
        seen[run_id] = seen.get(run_id, 0) + 1
    twice = sorted(r for r, n in seen.items() if n > 1)
    assert not twice, (
        f"contract: each expired run is claimed by exactly one claimer ({where}): claimed more "
        f"than once: {twice[:10]}{'...' if len(twice) > 10 else ''}"
    )
    missing = sorted(set(run_ids) - set(seen))
    assert not missing, f"contract: claim_expired hands out every expired run ({where}): never claimed {missing[:10]}"
    assert all(fence == 2 for _, fence in claims), (
        "contract: a claim issues the thread's next fencing token (start gave 1, so the claim gives 2)"
    )


def test_claim_race_in_one_process(runs_target: Any) -> None:
    """4 coroutines claim 40 expired runs in small batches: each run exactly once."""

    async def body(store: RunStore) -> None:
        prefix = fresh_id("claim")
        run_ids = await _expired_runs(store, 40, prefix)
        try:

            async def claimer(i: int) -> list[tuple[str, int | None]]:
                out: list[tuple[str, int | None]] = []
                for _ in range(100):
                    got = await store.claim_expired(f"{prefix}-c{i}", 600, grace=5, limit=3)
                    out += [(r["run_id"], r["fence"]) for r in got]
                    if not got:
                        left = [await store.get(r) for r in run_ids]
                        if all(r is not None and r["owner"] != f"{prefix}-dead" for r in left):
                            break
                    await asyncio.sleep(0)
                return out

            results = await asyncio.gather(*(claimer(i) for i in range(4)))
            _check_claims([c for result in results for c in result], run_ids, "coroutines")
        finally:
            await _delete_all(store, [f"{prefix}-t{i}" for i in range(40)])

    runs_target.run(body)


def test_idempotency_key_race_in_one_process(runs_target: Any) -> None:
    """6 coroutines create with one idempotency key: one run, every caller gets it."""

    async def body(store: RunStore) -> None:
        thread, key = fresh_id("idem"), fresh_id("key")
        try:
            results = await asyncio.gather(
                *(store.create(thread, idempotency_key=key, multitask_strategy="enqueue") for _ in range(6))
            )
            created = [r for r in results if r.outcome != "existing"]
            assert len(created) == 1, (
                f"contract: a repeated idempotency key returns the existing run, never a second "
                f"one ({len(created)} runs created)"
            )
            assert {r.run["run_id"] for r in results} == {created[0].run["run_id"]}, (
                "contract: every caller with the key gets the one run"
            )
            assert len(await store.list_by_thread(thread)) == 1
        finally:
            await _delete_all(store, [thread])

    runs_target.run(body)


def test_idempotency_key_race_across_threads(runs_target: Any) -> None:
    """One key raced on two threads: one run; the other caller gets IdempotencyConflictError."""
    from runstore.errors import IdempotencyConflictError

    async def body(store: RunStore) -> None:
        pairs = [(fresh_id("idem"), fresh_id("idem"), fresh_id("key")) for _ in range(5)]
        try:
            for t1, t2, key in pairs:
                results = await asyncio.gather(
                    store.create(t1, idempotency_key=key),
                    store.create(t2, idempotency_key=key),
                    return_exceptions=True,
                )
                ok = [r for r in results if not isinstance(r, BaseException)]
                errors = [r for r in results if isinstance(r, BaseException)]
                assert len(ok) == 1 and len(errors) == 1 and isinstance(errors[0], IdempotencyConflictError), (
                    "contract: an idempotency key names one run of one thread: of two creates "
                    f"racing with one key on two threads, one creates and the other raises "
                    f"IdempotencyConflictError; got {results}"
                )
        finally:
            await _delete_all(store, [t for t1, t2, _ in pairs for t in (t1, t2)])

    runs_target.run(body)


# =====================================================================================
# Races across processes
# =====================================================================================


def _pool_run(
    request: pytest.FixtureRequest, workers: int, submit: Callable[[ProcessPoolExecutor, Any, list[str]], list[Any]]
) -> list[Any]:
    plugins = development_plugins(request.config)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(workers)
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            futures = submit(pool, barrier, plugins)
            return [f.result(timeout=300) for f in futures]


@pytest.mark.requires("cross_process")
def test_reject_race_across_processes(runs_target: Any, request: pytest.FixtureRequest) -> None:
    """4 OS processes create with reject on each of 5 threads at once: one active run each."""
    threads = [fresh_id("xreject") for _ in range(5)]
    url = runs_target.url.render(hide_password=False)
    try:
        results = _pool_run(
            request,
            4,
            lambda pool, barrier, plugins: [
                pool.submit(create_race_worker, url, plugins, threads, i, barrier) for i in range(4)
            ],
        )

        async def read(store: RunStore) -> list[list[Any]]:
            return [await store.list_by_thread(t) for t in threads]

        stored = runs_target.run(read)
        for k, thread in enumerate(threads):
            _check_reject_race([res[k] for res in results], thread, 4, "4 processes")
            assert len(stored[k]) == 1 and stored[k][0]["active"], (
                f"contract: create with reject is atomic across processes: thread {thread!r} "
                f"holds exactly one (active) run, got {[r['run_id'] for r in stored[k]]}"
            )
    finally:
        runs_target.run(lambda store: _delete_all(store, threads))


@pytest.mark.requires("cross_process")
def test_claim_race_across_processes(runs_target: Any, request: pytest.FixtureRequest) -> None:
    """4 OS processes claim 100 expired runs: each exactly once."""
    prefix = fresh_id("xclaim")
    url = runs_target.url.render(hide_password=False)
    run_ids = runs_target.run(lambda store: _expired_runs(store, 100, prefix))
    try:
        results = _pool_run(
            request,
            4,
            lambda pool, barrier, plugins: [
                pool.submit(
                    claim_worker, url, plugins, f"{prefix}-c{i}", run_ids, f"{prefix}-dead", 15, barrier
                )
                for i in range(4)
            ],
        )
        _check_claims([c for result in results for c in result], run_ids, "4 processes")
    finally:
        runs_target.run(lambda store: _delete_all(store, [f"{prefix}-t{i}" for i in range(100)]))


# =====================================================================================
# Idempotency, durability, bad input
# =====================================================================================


def test_idempotency_keys(runs_target: Any) -> None:
    """A key returns its run on its thread, conflicts on another, and is free after delete."""
    from runstore.errors import IdempotencyConflictError

    async def body(store: RunStore) -> None:
        t1, t2, key = fresh_id("idem"), fresh_id("idem"), fresh_id("key")
        try:
            first = await store.create(t1, idempotency_key=key, metadata={"a": 1})
            again = await store.create(t1, idempotency_key=key, metadata={"b": 2})
            assert again.outcome == "existing" and again.run == first.run and not again.created, (
                "contract: a repeated idempotency key returns the existing run unchanged "
                f"(outcome 'existing'); got {again}"
            )
            with pytest.raises(IdempotencyConflictError, match=first.run["run_id"]):
                await store.create(t2, idempotency_key=key)
            assert await store.list_by_thread(t2) == [], "contract: a failed create writes nothing"
            assert await store.delete(first.run["run_id"]) is True
            reborn = await store.create(t2, idempotency_key=key)
            assert reborn.outcome == "created", "contract: a deleted run's key can be used again"
        finally:
            await _delete_all(store, [t1, t2])

    runs_target.run(body)
