"""Run store conformance, rule by rule: each time rule on its boundary, every way out of a
terminal state, every argument of `RunStore.list_by_thread`, generated ids, durability
and bad input (docs/runs.md). The state machine, the lease rules one at a time and the
races are in `test_runs`; ``-k test_runs`` selects both modules.

Time is a `ManualClock` the tests move in microsecond steps: a rule that turns at an
instant is checked at that instant and one microsecond before it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from runstore.clock import ManualClock
from runstore.errors import (
    InvalidRunError,
    LeaseLostError,
    RunAlreadyStartedError,
    RunFinishedError,
)
from runstore.runs.protocol import RunRecord, RunStore

from .events_model import fresh_id
from .runs_machine import FINAL_STATUSES
from .runs_model import delete_all as _delete_all
from .test_runs import RACE_EPOCH

pytestmark = pytest.mark.runstore_contract("run store")

#: Where these tests' clocks start: before the races' epoch, after the machine's.
RULES_EPOCH = datetime(1995, 1, 1, tzinfo=UTC)
#: One microsecond, the finest time a backend stores.
US = timedelta(microseconds=1)


async def _refused(call: Awaitable[Any], error: type[Exception], contract: str) -> None:
    """Await ``call``, which must raise ``error``; else the contract fails by name."""
    try:
        got = await call
    except error:
        return
    raise AssertionError(f"contract: {contract} (raises {error.__name__}; it returned {got!r})")


async def _running(store: RunStore, thread: str, owner: str, ttl: float, run_id: str | None = None) -> RunRecord:
    created = await store.create(thread, run_id=run_id, multitask_strategy="enqueue")
    return await store.start(created.run["run_id"], owner, ttl)


def test_lease_time_rules_on_their_boundaries(runs_target: Any) -> None:
    """A lease is live while clock() < lease_expires_at: a renewal 1 µs before the end
    extends it; at exactly the end it is over (no renewal, no finalize, no restart, an
    interrupt may stop it). A claim takes a lease that ended exactly grace seconds ago,
    not 1 µs sooner."""

    async def body(store: RunStore) -> None:
        clock = store.clock = ManualClock(RULES_EPOCH)
        threads = [fresh_id("edge") for _ in range(2)]
        try:
            run = await _running(store, threads[0], "w", 10)
            end = run["lease_expires_at"]
            assert end is not None
            clock.set(end - US)
            assert await store.renew_lease(run["run_id"], "w", 10) == (True, None), (
                "contract: a lease is live until lease_expires_at: a renewal at its last instant "
                "(1 µs before the end) extends it"
            )
            renewed = await store.get(run["run_id"])
            assert renewed is not None and renewed["lease_expires_at"] == end - US + timedelta(seconds=10), (
                "contract: a renewal extends the lease to now + ttl"
            )
            clock.set(end - US + timedelta(seconds=10))
            assert await store.renew_lease(run["run_id"], "w", 10) == (False, None), (
                "contract: a lease is over at exactly lease_expires_at: a renewal at that instant fails"
            )
            await _refused(store.finalize(run["run_id"], "w", "success"), LeaseLostError,
                           "a lease is over at exactly lease_expires_at: finalize at that instant is refused")
            await _refused(store.start(run["run_id"], "w", 10), RunAlreadyStartedError,
                           "a lease is over at exactly lease_expires_at: its owner cannot start the run again")
            stopped = await store.create(threads[0], multitask_strategy="interrupt")
            assert stopped.interrupted is not None and stopped.interrupted["run_id"] == run["run_id"], (
                "contract: a lease is over at exactly lease_expires_at: interrupt may stop the run then"
            )

            other = await _running(store, threads[1], "w", 5)
            ended = other["lease_expires_at"]
            assert ended is not None
            clock.set(ended + timedelta(seconds=2) - US)
            early = await store.claim_expired("c", 5, grace=2, limit=1000)
            assert other["run_id"] not in [r["run_id"] for r in early], (
                "contract: claim_expired takes a lease that ended at least grace seconds ago: not "
                "1 µs sooner"
            )
            clock.set(ended + timedelta(seconds=2))
            claimed = await store.claim_expired("c", 5, grace=2, limit=1000)
            assert other["run_id"] in [r["run_id"] for r in claimed], (
                "contract: claim_expired takes a lease that ended exactly grace seconds ago"
            )
        finally:
            await _delete_all(store, threads)

    runs_target.run(body)


def test_claims_take_the_longest_expired_first_and_ties_in_any_order(runs_target: Any) -> None:
    """claim_expired hands out the longest-expired runs first; runs whose leases ended at
    the same instant come in an order the store chooses, and limit cuts through them."""

    async def body(store: RunStore) -> None:
        clock = store.clock = ManualClock(RULES_EPOCH)
        threads = [fresh_id("tie") for _ in range(4)]
        try:
            first = await _running(store, threads[0], "w", 5)
            tied = {(await _running(store, t, "w", 10))["run_id"] for t in threads[1:]}
            clock.advance(60)
            got = [r["run_id"] for r in await store.claim_expired("c", 30, grace=0, limit=2)]
            assert len(got) == 2 and got[0] == first["run_id"] and got[1] in tied, (
                "contract: claim_expired takes the longest-expired run first, then any of the runs "
                f"whose leases ended together (limit 2): got {got}"
            )
            rest = [r["run_id"] for r in await store.claim_expired("d", 30, grace=0, limit=10)]
            assert sorted(rest) == sorted(tied - {got[1]}), (
                f"contract: the next claim takes the rest of the tie, in any order: got {rest}"
            )
        finally:
            await _delete_all(store, threads)

    runs_target.run(body)


@pytest.mark.parametrize("status", FINAL_STATUSES)
def test_a_finished_run_stays_finished(runs_target: Any, status: str) -> None:
    """Finalizing a finished run again: its owner with the same status gets the stored run
    back unchanged; its owner with another status, or any other worker, gets
    RunFinishedError. start, renew, cancel and claim leave it as it is."""

    async def body(store: RunStore) -> None:
        clock = store.clock = ManualClock(RULES_EPOCH)
        thread = fresh_id("final")
        try:
            run = await _running(store, thread, "w", 30)
            if status in ("cancelled", "interrupted"):
                await store.request_cancel(run["run_id"], "rollback")
            done = await store.finalize(run["run_id"], "w", status, stop_reason="why", error="e")  # type: ignore[arg-type]
            clock.advance(1)
            again = await store.finalize(run["run_id"], "w", status)  # type: ignore[arg-type]
            assert again == done, (
                "contract: finalize of a finished run by its owner with the same status returns the "
                f"stored run unchanged\n got: {again}\n stored: {done}"
            )
            for owner, other in [("w", s) for s in FINAL_STATUSES if s != status] + [("x", status), ("x", "error")]:
                await _refused(
                    store.finalize(run["run_id"], owner, other), RunFinishedError,  # type: ignore[arg-type]
                    f"finalize of a run finished as {status} by {owner!r} with {other!r} (anything but "
                    "its owner repeating its status) is refused",
                )
            await _refused(store.start(run["run_id"], "w", 30), RunFinishedError, "a finished run cannot start again")
            renewed, _ = await store.renew_lease(run["run_id"], "w", 30)
            assert not renewed, "contract: a finished run has no lease to renew"
            if done["cancel_action"] is None:
                await _refused(store.request_cancel(run["run_id"]), RunFinishedError,
                               "a cancel request on a run that ended without one is refused")
            else:
                assert await store.request_cancel(run["run_id"], "interrupt") == "rollback", (
                    "contract: a cancel request on a run that ended by one returns the first action"
                )
            clock.advance(3600)
            assert run["run_id"] not in [r["run_id"] for r in await store.claim_expired("c", 5, grace=0, limit=1000)]
            assert await store.get(run["run_id"]) == done, (
                "contract: nothing changes a finished run (finalize again, start, renew, cancel, claim)"
            )
        finally:
            await _delete_all(store, [thread])

    runs_target.run(body)


def test_a_pending_run_cancelled_stays_cancelled(runs_target: Any) -> None:
    """A run cancelled before it started has no owner: any finalize is RunFinishedError."""

    async def body(store: RunStore) -> None:
        store.clock = ManualClock(RULES_EPOCH)
        thread = fresh_id("final")
        try:
            run = (await store.create(thread)).run
            assert await store.request_cancel(run["run_id"]) == "interrupt"
            stored = await store.get(run["run_id"])
            for status in FINAL_STATUSES:
                await _refused(store.finalize(run["run_id"], "w", status), RunFinishedError,  # type: ignore[arg-type]
                               f"a run cancelled before it started cannot be finalized ({status})")
            assert await store.get(run["run_id"]) == stored, "contract: a finalize refused writes nothing"
        finally:
            await _delete_all(store, [thread])

    runs_target.run(body)


def test_list_by_thread_arguments(runs_target: Any) -> None:
    """list_by_thread: creation order (not id or status order), the status filter as one
    status, a list, a set, a tuple or [] (nothing), applied before the limit; limits
    below, at and above the count; only the thread's own runs."""

    async def body(store: RunStore) -> None:
        store.clock = ManualClock(RULES_EPOCH)
        thread, other = fresh_id("list"), fresh_id("list")
        ids = [f"{thread}-{name}" for name in ("z", "y", "x", "w")]  # creation order is not id order
        try:
            first = await _running(store, thread, "w", 30, run_id=ids[0])
            for run_id in ids[1:]:
                await store.create(thread, run_id=run_id, multitask_strategy="enqueue")
            await store.create(other, run_id=f"{other}-a")
            await store.finalize(first["run_id"], "w", "success")  # ids[1] becomes active
            await store.start(ids[1], "w", 30)
            await store.request_cancel(ids[3])  # pending: cancelled at once
            statuses = {ids[0]: "success", ids[1]: "running", ids[2]: "pending", ids[3]: "cancelled"}

            async def listed(**kwargs: Any) -> list[str]:
                return [r["run_id"] for r in await store.list_by_thread(thread, **kwargs)]

            cases: list[tuple[dict[str, Any], list[str]]] = [
                ({}, ids),
                ({"status": None}, ids),
                ({"status": "running"}, [ids[1]]),
                ({"status": "timeout"}, []),
                ({"status": ["pending", "success"]}, [ids[0], ids[2]]),
                ({"status": {"cancelled", "running"}}, [ids[1], ids[3]]),
                ({"status": ("success", "running", "pending", "cancelled")}, ids),
                ({"status": []}, []),
                ({"limit": 1}, ids[:1]),
                ({"limit": 3}, ids[:3]),
                ({"limit": 4}, ids),
                ({"limit": 50}, ids),
                ({"limit": None}, ids),
                ({"status": ["cancelled", "pending", "success"], "limit": 2}, [ids[0], ids[2]]),
                ({"status": "cancelled", "limit": 1}, [ids[3]]),
            ]
            for kwargs, expected in cases:
                got = await listed(**kwargs)
                assert got == expected, (
                    f"contract: list_by_thread({kwargs}) gives the thread's runs with those statuses in "
                    f"creation order, at most limit of them (filter first)\n got: "
                    f"{[statuses.get(r, r) for r in got]}\n expected: {[statuses[r] for r in expected]}"
                )
        finally:
            await _delete_all(store, [thread, other])

    runs_target.run(body)


def test_generated_run_ids(runs_target: Any) -> None:
    """``run_id=None`` generates a fresh id per run."""

    async def body(store: RunStore) -> None:
        thread = fresh_id("gen")
        try:
            ids = [(await store.create(thread, multitask_strategy="enqueue")).run["run_id"] for _ in range(3)]
            assert len(set(ids)) == 3 and all(isinstance(i, str) and i for i in ids), (
                f"contract: create without run_id generates a unique id: {ids}"
            )
        finally:
            await _delete_all(store, [thread])

    runs_target.run(body)


def test_records_are_copies(runs_target: Any) -> None:
    """What a caller passed in or got back is its own: mutating the metadata given to
    ``create`` or a returned record (its metadata included) never changes what is stored."""

    async def body(store: RunStore) -> None:
        thread = fresh_id("copies")
        try:
            metadata: dict[str, Any] = {"tags": ["a"], "nested": {"n": 1}}
            created = await store.create(thread, metadata=metadata)
            run_id = created.run["run_id"]
            metadata["tags"].append("caller")
            metadata["nested"]["n"] = 2
            metadata["added"] = True
            got = await store.get(run_id)
            assert got is not None and got["metadata"] == {"tags": ["a"], "nested": {"n": 1}}, (
                "contract: a run store keeps its own copy of the metadata given to create: mutating "
                f"the caller's dict afterwards changed the stored run; got {got and got['metadata']}"
            )
            for returned, how in ((created.run, "create"), (got, "get"),
                                  ((await store.list_by_thread(thread))[0], "list_by_thread")):
                returned["metadata"]["tags"].append(how)
                returned["metadata"]["nested"]["n"] = how
                returned["status"] = "success"
                again = await store.get(run_id)
                assert again is not None and again["metadata"] == {"tags": ["a"], "nested": {"n": 1}} and (
                    again["status"] == "pending"
                ), (
                    f"contract: records are copies: mutating the record {how} returned changed the "
                    f"stored run; got {again}"
                )
        finally:
            await _delete_all(store, [thread])

    runs_target.run(body)


@pytest.mark.requires("durable")
def test_durable(runs_target: Any) -> None:
    """Runs, leases and each thread's fencing counter survive reopening the store."""
    thread = fresh_id("durable")

    async def write(store: RunStore) -> RunRecord:
        store.clock = ManualClock(RACE_EPOCH)
        await store.create(thread, run_id=f"{thread}-a")
        started = await store.start(f"{thread}-a", "w", 30)
        await store.finalize(f"{thread}-a", "w", "success")
        await store.delete(f"{thread}-a")
        await store.create(thread, run_id=f"{thread}-b", idempotency_key=f"{thread}-key")
        return started

    async def read(store: RunStore) -> tuple[list[Any], Any]:
        store.clock = ManualClock(RACE_EPOCH + timedelta(seconds=1))
        runs = await store.list_by_thread(thread)
        again = await store.create(thread, idempotency_key=f"{thread}-key")
        started = await store.start(f"{thread}-b", "w", 30)
        return runs, (again, started)

    first = runs_target.run(write)
    try:
        runs, (again, started) = runs_target.run(read)
        assert [r["run_id"] for r in runs] == [f"{thread}-b"] and runs[0]["active"], (
            "contract: durable backends keep runs across reopening"
        )
        assert again.outcome == "existing", "contract: durable backends keep idempotency keys"
        assert started["fence"] > first["fence"], (
            "contract: a thread's fencing counter survives reopening and deleting its runs "
            f"(token {started['fence']} after {first['fence']})"
        )
    finally:
        runs_target.run(lambda store: _delete_all(store, [thread]))


BAD_CALLS: list[tuple[str, Callable[[RunStore], Awaitable[Any]], str]] = [
    ("thread_id", lambda s: s.create(""), "thread_id"),
    ("thread_id type", lambda s: s.create(42), "thread_id"),  # type: ignore[arg-type]
    ("thread_id NUL", lambda s: s.create("a\x00b"), "NUL"),
    ("run_id", lambda s: s.create("t", run_id="x" * 300), "run_id"),
    ("strategy", lambda s: s.create("t", multitask_strategy="replace"), "reject, interrupt, rollback, enqueue"),  # type: ignore[arg-type]
    ("kind", lambda s: s.create("t", kind=""), "kind"),
    ("kind length", lambda s: s.create("t", kind="k" * 33), "1 to 32"),
    ("metadata", lambda s: s.create("t", metadata={"x": float("nan")}), "NaN"),
    ("metadata type", lambda s: s.create("t", metadata=["a"]), "metadata"),  # type: ignore[arg-type]
    ("idempotency_key", lambda s: s.create("t", idempotency_key=""), "idempotency_key"),
    ("ttl zero", lambda s: s.start("r", "w", 0), "ttl"),
    ("ttl negative", lambda s: s.renew_lease("r", "w", -1), "ttl"),
    ("ttl nan", lambda s: s.start("r", "w", float("nan")), "ttl"),
    ("ttl bool", lambda s: s.start("r", "w", True), "ttl"),
    ("ttl huge", lambda s: s.claim_expired("w", 10**9, grace=0), "86400"),
    ("ttl str", lambda s: s.start("r", "w", "5"), "ttl"),  # type: ignore[arg-type]
    ("owner", lambda s: s.start("r", "", 5), "owner"),
    ("grace", lambda s: s.claim_expired("w", 5, grace=-1), "grace"),
    ("limit", lambda s: s.claim_expired("w", 5, grace=0, limit=0), "limit"),
    ("status", lambda s: s.finalize("r", "w", "running"), "success, error"),
    ("status unknown", lambda s: s.finalize("r", "w", "done"), "success, error"),  # type: ignore[arg-type]
    ("action", lambda s: s.request_cancel("r", "stop"), "interrupt, rollback"),  # type: ignore[arg-type]
    ("list status", lambda s: s.list_by_thread("t", status="finished"), "pending, running"),  # type: ignore[arg-type]
    ("list limit", lambda s: s.list_by_thread("t", limit=-1), "limit"),
    ("stop_reason", lambda s: s.finalize("r", "w", "success", stop_reason="x" * 201), "stop_reason"),
    ("error", lambda s: s.finalize("r", "w", "error", error=7), "error"),  # type: ignore[arg-type]
    ("get", lambda s: s.get(None), "run_id"),  # type: ignore[arg-type]
    ("delete", lambda s: s.delete(""), "run_id"),
]


@pytest.mark.parametrize("case", [c[0] for c in BAD_CALLS])
def test_bad_input_is_rejected_naming_what_is_accepted(runs_target: Any, case: str) -> None:
    """Invalid ids, statuses, strategies, actions, ttl values: InvalidRunError, nothing written."""
    _, call, mention = next(c for c in BAD_CALLS if c[0] == case)

    async def body(store: RunStore) -> None:
        with pytest.raises(InvalidRunError) as info:
            await call(store)
        assert mention in str(info.value), (
            f"contract: bad input raises InvalidRunError naming what is accepted ({case}): "
            f"{info.value!s} does not mention {mention!r}"
        )
        assert isinstance(info.value, ValueError) and isinstance(info.value, TypeError)
        assert await store.list_by_thread("t") == [], "contract: a rejected call writes nothing"

    runs_target.run(body)
