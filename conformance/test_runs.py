"""Run store conformance: the contract of `runstore.runs.protocol` (docs/runs.md), checked on any backend.

Every test takes ``runs_target`` and is synchronous. Assertion messages start with
``contract:`` and name the rule a backend broke. Time is a `ManualClock` the tests move,
so leases expire without sleeping. Claims see every run of the store, so each test
deletes the runs it created, and clocks start far from the wall clock (runs another
test left with real-time leases are never expired on them).

Why one module of this size: pytest collects a suite per module, and one module per
kind is what ``-k test_runs``, `runstore check` and the broken-backend runner select;
the model and worker helpers live in ``runs_model`` and ``runs_workers``.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from runstore.clock import ManualClock
from runstore.errors import ThreadBusyError
from runstore.runs.protocol import MULTITASK_STRATEGIES, RunStore

from .events_model import fresh_id
from .runs_model import TERMINAL, Err, RunsModel
from .runs_workers import claim_worker, create_race_worker
from .session import development_plugins

pytestmark = pytest.mark.runstore_contract("run store")

#: Where the state machine's clock starts: far before any real lease.
MACHINE_EPOCH = datetime(1990, 1, 1, tzinfo=UTC)
#: Where the race tests' clock starts: before the wall clock, after the machine's.
RACE_EPOCH = datetime(2001, 1, 1, tzinfo=UTC)

OWNERS = ["worker-a", "worker-b"]
TTLS = [1, 5, 30, 300]
FINAL_STATUSES = ["success", "error", "interrupted", "timeout", "cancelled"]


async def _delete_all(store: RunStore, thread_ids: list[str]) -> None:
    for thread_id in thread_ids:
        for run in await store.list_by_thread(thread_id):
            await store.delete(run["run_id"])


def _outcome(rule: str, expected: Any) -> None:
    """Label the step for ``--hypothesis-show-statistics`` (how often each path is taken)."""
    event(f"{rule}: {expected.cls.__name__ if isinstance(expected, Err) else 'ok'}")


def _check_error(got: BaseException | None, expected: Err, what: str) -> None:
    assert got is not None and isinstance(got, expected.cls), (
        f"contract: {what} raises {expected.cls.__name__}; got "
        f"{type(got).__name__ if got is not None else 'a result'}: {got}"
    )
    if expected.names is not None:
        assert expected.names in str(got), (
            f"contract: {expected.cls.__name__} names run {expected.names!r}: {got}"
        )


# =====================================================================================
# State machine against the model
# =====================================================================================


class RunStoreMachine(RuleBasedStateMachine):
    """Creates with each strategy, starts, renews, cancels, finalizes, claims, deletes and
    moves the clock; checks every answer and the whole store against `RunsModel`."""

    def __init__(self, session: Any) -> None:
        super().__init__()
        self.session = session
        self.store: RunStore = session.backend
        self.clock = ManualClock(MACHINE_EPOCH)
        self.store.clock = self.clock
        prefix = fresh_id("sm")
        self.threads = [f"{prefix}-t0", f"{prefix}-t1"]
        self.keys = [f"{prefix}-k0", f"{prefix}-k1"]
        self.missing = f"{prefix}-missing"
        self.model = RunsModel()
        self.next_id = 0
        self.issued: dict[str, int] = {}

    def call(self, coro: Awaitable[Any]) -> tuple[Any, BaseException | None]:
        try:
            return self.session.run(coro), None
        except Exception as exc:  # compared with the model's expectation
            return None, exc

    def pick_run(self, data: st.DataObject, *, prefer: str | None = None) -> str:
        """Mostly a known run (mostly one in status ``prefer``), sometimes an unknown id."""
        # Creation order, not sorted ids: a generated id is a random UUID, and picking by
        # its rank would draw differently when Hypothesis replays the same steps.
        known = list(self.model.runs)
        preferred = [r for r in known if self.model.runs[r]["status"] == prefer]
        choice = data.draw(st.integers(0, 9), label="pick")
        if not known or choice == 9:
            return self.missing
        pool = preferred if preferred and choice < 6 else known
        return data.draw(st.sampled_from(pool), label="run_id")

    def pick_owner(self, data: st.DataObject, run_id: str) -> str:
        """Mostly the run's owner (when it has one), sometimes another worker."""
        run = self.model.runs.get(run_id)
        owner = run["owner"] if run is not None else None
        choices = [owner, owner, *OWNERS] if owner is not None else OWNERS
        return data.draw(st.sampled_from(choices), label="owner")

    def _check_token(self, run: dict[str, Any], what: str) -> None:
        thread = run["thread_id"]
        assert run["fence"] > self.issued.get(thread, 0), (
            f"contract: every lease {what} issues a fencing token greater than any earlier one "
            f"of its thread (got {run['fence']} after {self.issued.get(thread, 0)})"
        )
        self.issued[thread] = run["fence"]

    @rule(
        t=st.integers(0, 1),
        strategy=st.sampled_from(MULTITASK_STRATEGIES),
        key=st.sampled_from([None, None, "same", "same", "other"]),
        ident=st.sampled_from(["new", "new", "new", "new", "generated", "existing"]),
        metadata=st.sampled_from([None, {"source": "sm", "n": 1}]),
    )
    def create(self, t: int, strategy: str, key: str | None, ident: str, metadata: Any) -> None:
        thread = self.threads[t]
        idem = None if key is None else self.keys[t if key == "same" else 1 - t]
        if ident == "existing" and self.model.runs:
            run_id: str | None = next(iter(self.model.runs))
        elif ident == "generated":
            run_id = None
        else:
            run_id = f"{thread}-r{self.next_id}"
            self.next_id += 1
        now = self.clock()
        got, exc = self.call(
            self.store.create(
                thread, run_id=run_id, kind="run", multitask_strategy=strategy,  # type: ignore[arg-type]
                idempotency_key=idem, metadata=metadata,
            )
        )  # fmt: skip
        model_id = run_id if run_id is not None else (got.run["run_id"] if got is not None else "?")
        expected = self.model.create(thread, model_id, "run", strategy, idem, metadata, now)
        _outcome("create", expected)
        what = f"create(strategy={strategy!r}, idempotency_key={idem!r}, run_id={run_id!r})"
        if isinstance(expected, Err):
            _check_error(exc, expected, what)
            return
        assert exc is None, f"contract: {what} succeeds here ({expected[0]}); it raised {exc!r}"
        outcome, run, interrupted = expected
        assert got.outcome == outcome, (
            f"contract: {what} gives outcome {outcome!r} (reject/interrupt/rollback create the "
            f"active run, enqueue queues behind an active run, a known idempotency key returns "
            f"the existing run); got {got.outcome!r}"
        )
        assert got.run == run, f"contract: {what} returns the run as stored\n got: {got.run}\n expected: {run}"
        assert got.interrupted == interrupted, (
            f"contract: {what} reports the run it interrupted (status interrupted, stop_reason = "
            f"the strategy, lease dropped)\n got: {got.interrupted}\n expected: {interrupted}"
        )

    @precondition(lambda self: bool(self.model.runs))
    @rule(data=st.data(), owner=st.sampled_from(OWNERS), ttl=st.sampled_from(TTLS))
    def start(self, data: st.DataObject, owner: str, ttl: int) -> None:
        run_id = self.pick_run(data, prefer="pending")
        now = self.clock()
        got, exc = self.call(self.store.start(run_id, owner, ttl))
        expected = self.model.start(run_id, owner, ttl, now)
        _outcome("start", expected)
        if isinstance(expected, Err):
            _check_error(exc, expected, f"start of {run_id!r}")
            return
        assert exc is None, f"contract: start of the active pending run {run_id!r} succeeds; got {exc!r}"
        if got["fence"] != self.issued.get(got["thread_id"]):
            self._check_token(got, "grant (start)")
        assert got == expected, (
            f"contract: start makes the active pending run running under owner {owner!r}, a "
            f"lease until now + ttl and a new fencing token\n got: {got}\n expected: {expected}"
        )

    @precondition(lambda self: bool(self.model.runs))
    @rule(data=st.data(), ttl=st.sampled_from(TTLS))
    def renew(self, data: st.DataObject, ttl: int) -> None:
        run_id = self.pick_run(data, prefer="running")
        owner = self.pick_owner(data, run_id)
        now = self.clock()
        got, exc = self.call(self.store.renew_lease(run_id, owner, ttl))
        expected = self.model.renew(run_id, owner, ttl, now)
        event(f"renew: {expected[0]}")
        assert exc is None, f"contract: renew_lease answers (renewed, cancel_action), never raises: {exc!r}"
        assert tuple(got) == expected, (
            f"contract: renew_lease extends only the owner's live lease and reports the pending "
            f"cancel action ({run_id!r}, {owner!r}): got {got}, expected {expected}"
        )

    @precondition(lambda self: bool(self.model.runs))
    @rule(data=st.data(), action=st.sampled_from(["interrupt", "rollback"]))
    def cancel(self, data: st.DataObject, action: str) -> None:
        run_id = self.pick_run(data, prefer="running")
        now = self.clock()
        got, exc = self.call(self.store.request_cancel(run_id, action))  # type: ignore[arg-type]
        expected = self.model.cancel(run_id, action, now)
        _outcome("cancel", expected)
        if isinstance(expected, Err):
            _check_error(exc, expected, f"request_cancel of {run_id!r}")
            return
        assert exc is None and got == expected, (
            f"contract: request_cancel is first-writer-wins and returns the winning action "
            f"(expected {expected!r}, got {got!r} / {exc!r})"
        )

    @precondition(lambda self: bool(self.model.runs))
    @rule(data=st.data(), status=st.sampled_from(FINAL_STATUSES), error=st.sampled_from([None, "boom"]))
    def finalize(self, data: st.DataObject, status: str, error: str | None) -> None:
        run_id = self.pick_run(data, prefer="running")
        owner = self.pick_owner(data, run_id)
        now = self.clock()
        got, exc = self.call(self.store.finalize(run_id, owner, status, stop_reason="done", error=error))  # type: ignore[arg-type]
        expected = self.model.finalize(run_id, owner, status, "done", error, now)
        _outcome("finalize", expected)
        if isinstance(expected, Err):
            _check_error(
                exc,
                expected,
                f"finalize({run_id!r}, {owner!r}, {status!r}) (finalize refuses a caller without a "
                "live lease, and any status but cancelled/interrupted while a cancel is pending)",
            )
            return
        assert exc is None and got == expected, (
            f"contract: finalize by the owner of a live lease ends the run (no lease, not active, "
            f"the next queued run becomes active)\n got: {got} / {exc!r}\n expected: {expected}"
        )

    # Only while a lease runs: moving an idle clock decides nothing, and drawing it then
    # would crowd out the rare transitions (measured with the labels below).
    @precondition(lambda self: any(r["status"] == "running" for r in self.model.runs.values()))
    @rule(seconds=st.sampled_from([3, 40, 0.5, 10]))
    def advance_clock(self, seconds: float) -> None:
        self.clock.advance(seconds)
        event(f"advance: {seconds}")

    @precondition(lambda self: any(r["status"] == "running" for r in self.model.runs.values()))
    @rule(
        owner=st.sampled_from(OWNERS),
        ttl=st.sampled_from(TTLS),
        grace=st.sampled_from([0, 2]),
        limit=st.sampled_from([1, 2, 50]),
        wait=st.sampled_from([40, 0, 2]),
    )
    def claim(self, owner: str, ttl: int, grace: int, limit: int, wait: float) -> None:
        """Claim after the clock moved ``wait`` seconds (so claims mostly find expired leases)."""
        now = self.clock.advance(wait)
        got, exc = self.call(self.store.claim_expired(owner, ttl, grace=grace, limit=limit))
        assert exc is None, f"contract: claim_expired does not raise here: {exc!r}"
        chosen = [r["run_id"] for r in got]
        candidates = self.model.claimable(grace, limit, now)
        ties = len({r["lease_expires_at"] for r in candidates}) < len(candidates)
        event(f"claim: {min(len(chosen), 2)} runs{' (a tie)' if ties else ''}")
        assert self.model.claim_choice_ok(chosen, grace, limit, now), (
            f"contract: claim_expired takes only runs whose lease ended at least grace seconds "
            f"ago (grace={grace}, limit={limit}), the longest-expired first (equal expiry times "
            f"in any order)\n got: {chosen}\n claimable, longest-expired first: "
            f"{[(r['run_id'], r['lease_expires_at'].isoformat()) for r in candidates]}"
        )
        expected = self.model.claim(owner, ttl, grace, limit, now, chosen)
        for run in got:
            self._check_token(run, "grant (claim)")
        assert got == expected, (
            f"contract: a claimed run gets the claimer as owner, a lease until now + ttl and a new "
            f"fencing token\n got: {got}\n expected: {expected}"
        )

    # Rare transitions, drawn on purpose: the random rules above mostly miss a live lease
    # (the clock moves on), a finished run, and the instants where a lease's time rules turn.

    @precondition(lambda self: any(r["status"] == "pending" and r["active"] for r in self.model.runs.values()))
    @rule(data=st.data(), owner=st.sampled_from(OWNERS), ttl=st.sampled_from(TTLS))
    def start_active(self, data: st.DataObject, owner: str, ttl: int) -> None:
        """Start a thread's active pending run (what a worker does next)."""
        ready = [r["run_id"] for r in self.model.runs.values() if r["status"] == "pending" and r["active"]]
        run_id = data.draw(st.sampled_from(ready), label="run_id")
        now = self.clock()
        got, exc = self.call(self.store.start(run_id, owner, ttl))
        expected = self.model.start(run_id, owner, ttl, now)
        _outcome("start (active pending run)", expected)
        assert exc is None, f"contract: start of the active pending run {run_id!r} succeeds; got {exc!r}"
        self._check_token(got, "grant (start)")
        assert got == expected, f"contract: start makes the run running\n got: {got}\n expected: {expected}"

    @precondition(lambda self: any(r["status"] == "running" for r in self.model.runs.values()))
    @rule(data=st.data(), offset=st.sampled_from([0.0, -0.000001, 2.0, 1.999999]))
    def advance_to_a_boundary(self, data: st.DataObject, offset: float) -> None:
        """Move the clock to exactly a running lease's end (or 1 µs before it, or its end
        plus a claim's grace of 2 s), when that is not in the past."""
        running = sorted(r["run_id"] for r in self.model.runs.values() if r["status"] == "running")
        run = self.model.runs[data.draw(st.sampled_from(running), label="run_id")]
        target = run["lease_expires_at"] + timedelta(seconds=offset)
        if target >= self.clock():
            self.clock.set(target)
            event(f"boundary: expiry {offset:+g} s")

    @precondition(lambda self: any(RunsModel.live(r, self.clock()) for r in self.model.runs.values()))
    @rule(data=st.data(), status=st.sampled_from(FINAL_STATUSES))
    def finalize_live(self, data: st.DataObject, status: str) -> None:
        """The owner of a live lease finalizes (a cancel may be pending)."""
        now = self.clock()
        live = [r["run_id"] for r in self.model.runs.values() if RunsModel.live(r, now)]
        run_id = data.draw(st.sampled_from(live), label="run_id")
        owner = self.model.runs[run_id]["owner"]
        got, exc = self.call(self.store.finalize(run_id, owner, status))  # type: ignore[arg-type]
        expected = self.model.finalize(run_id, owner, status, None, None, now)
        _outcome("finalize (live lease)", expected)
        if isinstance(expected, Err):
            _check_error(exc, expected, f"finalize({run_id!r}, {status!r}) with a cancel pending")
            return
        assert exc is None and got == expected, (
            f"contract: finalize by the owner of a live lease ends the run\n got: {got} / {exc!r}\n"
            f" expected: {expected}"
        )

    @precondition(lambda self: any(r["status"] in TERMINAL for r in self.model.runs.values()))
    @rule(data=st.data(), status=st.sampled_from(FINAL_STATUSES), same_owner=st.booleans())
    def finalize_again(self, data: st.DataObject, status: str, same_owner: bool) -> None:
        """Finalize a finished run again: by its last owner or another worker, with its own
        status or another one."""
        finished = [r["run_id"] for r in self.model.runs.values() if r["status"] in TERMINAL]
        owned = [r for r in finished if self.model.runs[r]["owner"] is not None]
        # Mostly a run a worker finished (the one whose owner may repeat itself).
        prefer_owned: bool = data.draw(st.booleans(), label="owned")
        pool = owned if owned and prefer_owned else finished
        run_id = data.draw(st.sampled_from(pool), label="run_id")
        run = self.model.runs[run_id]
        owner = run["owner"] if same_owner and run["owner"] is not None else "worker-z"
        now = self.clock()
        got, exc = self.call(self.store.finalize(run_id, owner, status))  # type: ignore[arg-type]
        expected = self.model.finalize(run_id, owner, status, None, None, now)
        same = "same" if status == run["status"] else "other"
        _outcome(f"finalize again ({'owner' if owner == run['owner'] else 'another worker'}, {same} status)", expected)
        what = (
            f"finalize of the finished run {run_id!r} ({run['status']}) again by "
            f"{owner!r} with {status!r} (the owner repeating its own status gets the stored run "
            "back; anything else is RunFinishedError)"
        )
        if isinstance(expected, Err):
            _check_error(exc, expected, what)
            return
        assert exc is None and got == expected, f"contract: {what}\n got: {got} / {exc!r}\n expected: {expected}"

    @precondition(lambda self: bool(self.model.runs))
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        run_id = self.pick_run(data, prefer="success")
        now = self.clock()
        got, exc = self.call(self.store.delete(run_id))
        expected = self.model.delete(run_id, now)
        assert exc is None and got is expected, (
            f"contract: delete returns whether the run existed ({run_id!r}: got {got!r}/{exc!r})"
        )

    @invariant()
    def store_matches_model(self) -> None:
        for thread in self.threads:
            got, exc = self.call(self.store.list_by_thread(thread))
            expected = self.model.thread_runs(thread)
            assert exc is None and got == expected, (
                f"contract: a thread holds exactly its runs in creation order, each as the contract "
                f"left it (one active run at most; nothing half-written by a failed call)\n"
                f" got: {got}\n expected: {expected}"
            )
            actives = [r["run_id"] for r in got if r["active"]]
            assert len(actives) <= 1, f"contract: a thread has at most one active run: {actives}"

    def teardown(self) -> None:
        self.session.run(_delete_all(self.store, self.threads))


def test_state_machine_matches_model(runs_target: Any) -> None:
    """Random creates/starts/renewals/cancels/finalizes/claims/deletes and clock moves agree
    with a plain-dict model."""
    with runs_target.session() as session:
        # A factory: hypothesis's parameter is named for one, though annotated as a class.
        run_state_machine_as_test(
            lambda: RunStoreMachine(session),  # type: ignore[arg-type]
            settings=settings(suppress_health_check=list(HealthCheck)),
        )


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
