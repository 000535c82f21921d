"""`RunStoreMachine`: the run store suite's Hypothesis state machine (exported by
`runstore.conformance.machines`, where subclassing it is described).
"""

from __future__ import annotations

from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from runstore.clock import ManualClock
from runstore.runs.protocol import MULTITASK_STRATEGIES, RunStore

from .events_model import fresh_id
from .runs_model import TERMINAL, Err, RunsModel, delete_all

#: Where the state machine's clock starts: far before any real lease.
MACHINE_EPOCH = datetime(1990, 1, 1, tzinfo=UTC)


OWNERS = ["worker-a", "worker-b"]
TTLS = [1, 5, 30, 300]
FINAL_STATUSES = ["success", "error", "interrupted", "timeout", "cancelled"]


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


class RunStoreMachine(RuleBasedStateMachine):
    """Creates with each strategy, starts, renews, cancels, finalizes, claims, deletes and
    moves the clock; checks every answer and the whole store against `RunsModel`."""

    def __init__(self, session: Any) -> None:
        super().__init__()
        self.session = session
        self.target = session.target
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
        self._maybe_repeat(data, run_id)

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
        """Claim after the clock moved ``wait`` seconds (so claims mostly find expired leases),
        or, where two leases end at one instant, exactly when they become claimable."""
        tied = self._tied_expiries()
        if tied and wait != 40 and tied[0] + timedelta(seconds=grace) > self.clock():
            self.clock.set(tied[0] + timedelta(seconds=grace))
            self._claim_and_check(owner, ttl, grace, limit, "claim at a tie")
            return
        self.clock.advance(wait)
        self._claim_and_check(owner, ttl, grace, limit, "claim")

    def _claim_and_check(self, owner: str, ttl: int, grace: int, limit: int, label: str) -> None:
        now = self.clock()
        got, exc = self.call(self.store.claim_expired(owner, ttl, grace=grace, limit=limit))
        assert exc is None, f"contract: claim_expired does not raise here: {exc!r}"
        chosen = [r["run_id"] for r in got]
        candidates = self.model.claimable(grace, limit, now)
        ties = len({r["lease_expires_at"] for r in candidates}) < len(candidates)
        event(f"{label}: {min(len(chosen), 2)} runs{' (a tie)' if ties else ''}")
        assert self.model.claim_choice_ok(chosen, grace, limit, now), (
            f"contract: claim_expired takes only runs whose lease ended at least grace seconds "
            f"ago (grace={grace}, limit={limit}), the longest-expired first, exactly "
            f"min(limit, claimable) of them (equal expiry times in any order, limit may cut "
            f"through them)\n got: {chosen}\n claimable, longest-expired first: "
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
        self._maybe_repeat(data, run_id)

    def _maybe_repeat(self, data: st.DataObject, run_id: str) -> None:
        """Often, right away, let the owner of ``run_id`` repeat what it holds (what a worker
        retrying after a lost reply does); `owner_repeats_itself` checks the answer."""
        if run_id in self._repeatable() and data.draw(st.booleans(), label="repeat"):
            self._repeat(data, run_id, data.draw(st.sampled_from(TTLS), label="ttl"), "again", "boom again")

    def _start_checked(self, run_id: str, owner: str, ttl: int, now: datetime) -> None:
        got, exc = self.call(self.store.start(run_id, owner, ttl))
        expected = self.model.start(run_id, owner, ttl, now)
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
        self._maybe_repeat(data, run_id)

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

    # Ties and repeats: two leases granted at one instant end at one instant (a claim must
    # then take min(limit, claimable) of them, in any order among the tie), and an owner
    # repeating what it already holds (start, renew, finalize with its own status).

    def _tied_expiries(self) -> list[datetime]:
        ends = [r["lease_expires_at"] for r in self.model.runs.values() if r["status"] == "running"]
        return sorted({e for e in ends if ends.count(e) > 1})

    def _repeatable(self) -> list[str]:
        now = self.clock()
        return [
            r["run_id"] for r in self.model.runs.values()
            if RunsModel.live(r, now) or (r["status"] in TERMINAL and r["owner"] is not None)
        ]  # fmt: skip

    @precondition(lambda self: not any(r["status"] == "running" for r in self.model.runs.values()))
    @rule(data=st.data(), same_owner=st.booleans(), ttl=st.sampled_from(TTLS))
    def two_leases_at_one_instant(self, data: st.DataObject, same_owner: bool, ttl: int) -> None:
        """Start a run on each thread at one instant with one ttl (creating one where the
        thread has no active run): their leases end at one instant, a tie for claims."""
        now = self.clock()
        for thread, owner in zip(self.threads, OWNERS[:1] * 2 if same_owner else OWNERS, strict=True):
            active = self.model.active(thread)
            if active is None:
                run_id = f"{thread}-r{self.next_id}"
                self.next_id += 1
                got, exc = self.call(self.store.create(thread, run_id=run_id))
                expected = self.model.create(thread, run_id, "run", "reject", None, None, now)
                assert exc is None and got.run == expected[1], (
                    f"contract: create on a thread with no active run makes it the active run\n"
                    f" got: {got} / {exc!r}\n expected: {expected}"
                )
            else:
                run_id = active["run_id"]
            self._start_checked(run_id, owner, ttl, now)
        event("start: two leases ending at one instant")
        self._maybe_repeat(data, run_id)

    @precondition(lambda self: bool(self._tied_expiries()))
    @rule(
        owner=st.sampled_from(OWNERS),
        ttl=st.sampled_from(TTLS),
        grace=st.sampled_from([0, 2]),
        limit=st.sampled_from([1, 1, 2]),
    )
    def claim_a_tie(self, owner: str, ttl: int, grace: int, limit: int) -> None:
        """Claim exactly when two leases that ended at one instant become claimable (unless
        that is past): a limit of 1 cuts through the tie, and either run may be taken."""
        target = self._tied_expiries()[0] + timedelta(seconds=grace)
        if target > self.clock():
            self.clock.set(target)
        self._claim_and_check(owner, ttl, grace, limit, f"claim at a tie (limit {limit})")

    @precondition(lambda self: bool(self._repeatable()))
    @rule(
        data=st.data(),
        ttl=st.sampled_from(TTLS),
        stop_reason=st.sampled_from([None, "again"]),
        error=st.sampled_from([None, "boom again"]),
    )
    def owner_repeats_itself(self, data: st.DataObject, ttl: int, stop_reason: str | None, error: str | None) -> None:
        """The owner repeats what it already holds: ``start`` or ``renew_lease`` (heartbeat)
        under its live lease, or ``finalize`` of its finished run with the same status (with
        another stop_reason and error)."""
        run_id = data.draw(st.sampled_from(self._repeatable()), label="run_id")
        self._repeat(data, run_id, ttl, stop_reason, error)

    def _repeat(self, data: st.DataObject, run_id: str, ttl: int, stop_reason: str | None, error: str | None) -> None:
        run = self.model.runs[run_id]
        owner, status, now = run["owner"], run["status"], self.clock()
        if status == "running":
            call = data.draw(st.sampled_from(["start", "renew"]), label="call")
            if call == "start":
                got, exc = self.call(self.store.start(run_id, owner, ttl))
                expected: Any = self.model.start(run_id, owner, ttl, now)
                what = (
                    f"start({run_id!r}) repeated by its owner {owner!r} under its live lease (ttl={ttl}) "
                    "returns the run unchanged (same lease end, same token)"
                )
            else:
                got, exc = self.call(self.store.renew_lease(run_id, owner, ttl))
                got = None if got is None else tuple(got)
                expected = self.model.renew(run_id, owner, ttl, now)
                what = (
                    f"renew_lease({run_id!r}) by its owner {owner!r} under its live lease extends it "
                    f"to now + {ttl} s and answers (True, pending cancel action)"
                )
        else:
            call = "finalize"
            got, exc = self.call(
                self.store.finalize(run_id, owner, status, stop_reason=stop_reason, error=error)
            )
            expected = self.model.finalize(run_id, owner, status, stop_reason, error, now)
            what = (
                f"finalize({run_id!r}, {status!r}) repeated by its owner {owner!r} returns the stored "
                "run unchanged (the first call's stop_reason and error)"
            )
        event(f"owner repeats itself: {call}")
        assert exc is None and got == expected, f"contract: {what}\n got: {got} / {exc!r}\n expected: {expected}"
        stored, exc = self.call(self.store.get(run_id))
        assert exc is None and stored == self.model.get(run_id), (
            f"contract: {what}; the stored run afterwards\n got: {stored} / {exc!r}\n expected: {self.model.get(run_id)}"
        )

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
        self.session.run(delete_all(self.store, self.threads))
