"""Cancellation of SQL event store and saver writes at every cancel point (tests/faults/cancel.py).

Each write path is cancelled at its k-th suspension for every k (a caller's
cancellation can land nowhere else), on sqlite and on PostgreSQL, warm (a leased
connection) and cold (connecting). After every trial:

- everything acknowledged is visible from another connection (another store or
  saver on its own pool), exactly once;
- the cancelled call left all of its effect or none;
- nothing is left half done: no session inside a transaction, no advisory lock held
  (PostgreSQL), the file's write lock free (sqlite);
- the next calls of the same store and saver commit.

The saver's ``aput``/``aput_writes`` go through its group commit: their callers are
also cancelled at each suspension of the batch that carries their op, which must then
commit whole. The PostgreSQL runs share one throwaway cluster per module (nothing here
stops it) so pg_stat_activity and pg_locks show only this test's sessions.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from runstore.conformance.harness import service_unavailable

from .cancel import Outcome, batch_acting_at, cancel_at, every_cancel_point
from .servers import PostgresServer, ServerUnavailable
from .sqlstacks import Stack, Tally, cfg, checkpoint_args, ev, open_stack, put_chain, snapshot

pytestmark = pytest.mark.faults

_ids = itertools.count()
BATCH = 1000


@pytest.fixture(scope="module")
def cluster() -> Iterator[PostgresServer]:
    """One throwaway PostgreSQL cluster for the module (each test: a fresh schema)."""
    try:
        server = PostgresServer()
    except ServerUnavailable as exc:
        service_unavailable("a throwaway PostgreSQL cluster", exc)
        raise
    with server:
        yield server


@pytest.fixture(params=["sqlite", "postgres"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _stack(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    server = request.getfixturevalue("cluster") if kind == "postgres" else None
    return open_stack(kind, server=server, tmp_path=tmp_path)


def _ok(outcome: Outcome[Any]) -> bool:
    """Whether the call completed (cancellation came too late); any other error fails."""
    if outcome.error is not None and not outcome.cancelled:
        raise AssertionError(f"the call failed instead of being cancelled: {outcome.error!r}") from outcome.error
    return not outcome.cancelled


async def _sweep(stack: Stack, trial: Callable[[int], Awaitable[Outcome[Any]]]) -> int:
    async def wrapped(k: int) -> Outcome[Any]:
        outcome = await trial(k)
        await stack.assert_settled()
        return outcome

    return await every_cancel_point(wrapped)


# -- event stores ----------------------------------------------------------------------


async def _after(stack: Stack, thread: str, acked: dict[int, str], tally: Tally) -> None:
    """The writers still commit: one more event and one more checkpoint, read back elsewhere."""
    record = await stack.store.put(**ev(thread, "r", f"after-{thread}"), user_id=None)
    acked[record["seq"]] = record["content"]
    saved = await stack.saver.aput(*checkpoint_args(stack.saver, cfg(thread), f"cp-{thread}", "run", 0))
    got = await stack.saver_reader.aget_tuple(saved)
    tally.acknowledged += 2
    assert got is not None and got.checkpoint["channel_values"] == {"a": f"cp-{thread}"}, "a checkpoint after the cancel was lost"


def _check_events(tally: Tally, seen: dict[int, str], acked: dict[int, str], cancelled: set[str], done: bool) -> None:
    contents = list(seen.values())
    tally.trials += 1
    tally.completed += done
    tally.acknowledged += len(acked)
    tally.lost += sum(1 for seq, content in acked.items() if seen.get(seq) != content)
    tally.duplicated += len(contents) - len(set(contents))
    assert {s: c for s, c in seen.items() if c not in cancelled} == {
        s: c for s, c in acked.items() if c not in cancelled
    }, "acknowledged events are all there, nothing else"
    present = cancelled & set(contents)
    assert present in (set(), cancelled), f"partial write: {len(present)} of {len(cancelled)} events"
    if done:
        assert present == cancelled, "a call that returned has committed"


@pytest.mark.parametrize("cold", [False, True], ids=["leased", "connecting"])
async def test_put_batch_and_put_cancelled_at_every_suspension(
    kind: str, cold: bool, request: pytest.FixtureRequest, tmp_path: Path, fault_report: Any
) -> None:
    if cold and kind == "sqlite":
        pytest.skip("sqlite holds its connections for the store's life: nothing to connect")
    async with _stack(kind, request, tmp_path) as stack:
        # Connecting adds the same cancel points to every call: one call kind covers them.
        for size in (1,) if cold else (BATCH, 1):
            tally = Tally()

            async def trial(k: int, size: int = size, tally: Tally = tally) -> Outcome[Any]:
                thread = f"t{next(_ids)}"
                first = await stack.store.put_batch([ev(thread, "r", f"a{i}") for i in range(3)], user_id=None)
                acked = {r["seq"]: r["content"] for r in first}
                batch = [ev(thread, "r", f"x{i}") for i in range(size)]
                if cold:
                    await stack.go_cold()
                if size == 1:
                    outcome = await cancel_at(lambda: stack.store.put(**batch[0], user_id=None), k)
                    await stack.assert_settled()  # at once: a cancelled call has settled
                    returned = [outcome.result] if _ok(outcome) else []
                else:
                    outcome = await cancel_at(lambda: stack.store.put_batch(batch, user_id=None), k)
                    await stack.assert_settled()  # at once: a cancelled call has settled
                    returned = outcome.result if _ok(outcome) else []
                acked.update({r["seq"]: r["content"] for r in returned or []})
                await _after(stack, thread, acked, tally)
                seen = await stack.events(thread, "r")
                _check_events(tally, seen, acked, {e["content"] for e in batch}, _ok(outcome))
                return outcome

            await _sweep(stack, trial)
            name = "put_batch" if size > 1 else "put"
            tally.report(fault_report, f"{kind}: event store {name} cancelled ({'connecting' if cold else 'leased'})")
            assert tally.lost == tally.duplicated == 0


async def test_postgres_appends_cancelled_at_every_suspension_of_their_transaction(
    request: pytest.FixtureRequest, tmp_path: Path, fault_report: Any
) -> None:
    """put_batch on PostgreSQL runs in the event store's shared append transaction: its
    caller, cancelled at each suspension of that transaction (next to another caller's
    append), returns only once the transaction has ended, and the call is whole in it."""
    async with _stack("postgres", request, tmp_path) as stack:
        driver = stack.store._driver
        appends = driver._appends
        real_run_batch = appends._run_batch
        tally = Tally()

        async def trial(k: int) -> Outcome[Any]:
            thread, other = f"a{next(_ids)}", f"b{next(_ids)}"
            mine = [ev(thread, "r", f"m{i}") for i in range(3)]
            theirs = [ev(other, "r", f"o{i}") for i in range(2)]
            batches: list[Outcome[Any]] = []
            caller = asyncio.ensure_future(stack.store.put_batch(mine, user_id=None))
            other_call = asyncio.ensure_future(stack.store.put_batch(theirs, user_id=None))

            appends._run_batch = batch_acting_at(real_run_batch, k, caller.cancel, batches)
            try:
                result = (await asyncio.gather(caller, return_exceptions=True))[0]
                await stack.assert_settled()  # at once: the transaction has ended
            finally:
                await appends.wait_idle()
                appends._run_batch = real_run_batch
            assert len(batches) == 1, "both appends went out in one transaction"
            cancelled = isinstance(result, asyncio.CancelledError)
            assert cancelled == (k <= batches[0].suspensions)
            await other_call
            seen = await stack.events(thread, "r")
            assert list(seen.values()) == ["m0", "m1", "m2"], "taken into the transaction: committed whole"
            assert list((await stack.events(other, "r")).values()) == ["o0", "o1"]
            tally.trials += 1
            tally.completed += not cancelled
            tally.acknowledged += 2 + (not cancelled) * 3
            return Outcome(cancelled=False, suspensions=batches[0].suspensions)

        await _sweep(stack, trial)
        tally.report(fault_report, "postgres: event store put_batch cancelled (its append transaction running)")
        assert tally.lost == tally.duplicated == 0


async def test_put_if_absent_cancelled_at_every_suspension(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, fault_report: Any
) -> None:
    async with _stack(kind, request, tmp_path) as stack:
        tally = Tally()

        async def trial(k: int) -> Outcome[Any]:
            thread = f"t{next(_ids)}"
            key = ev(thread, "r", "start", event_type="run_start")
            outcome = await cancel_at(lambda: stack.store.put_if_absent(**key, user_id=None), k)
            await stack.assert_settled()  # at once: a cancelled call has settled
            acked: dict[int, str] = {}
            if _ok(outcome):
                record, created = outcome.result
                assert created, "the key was absent"
                acked[record["seq"]] = "start"
            record, created = await stack.store.put_if_absent(**key, user_id=None)
            if not created:
                assert _ok(outcome) or record["content"] == "start"
            acked[record["seq"]] = "start"
            await _after(stack, thread, acked, tally)
            seen = await stack.events(thread, "r")
            tally.trials += 1
            tally.completed += _ok(outcome)
            tally.acknowledged += 1
            starts = [s for s, c in seen.items() if c == "start"]
            tally.duplicated += len(starts) - 1
            tally.lost += sum(1 for s, c in acked.items() if seen.get(s) != c)
            assert len(starts) == 1, f"one winner per key: {seen}"
            return outcome

        await _sweep(stack, trial)
        tally.report(fault_report, f"{kind}: event store put_if_absent cancelled")
        assert tally.lost == tally.duplicated == 0


async def test_deletes_cancelled_at_every_suspension(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, fault_report: Any
) -> None:
    async with _stack(kind, request, tmp_path) as stack:
        for by_run in (False, True):
            tally = Tally()

            async def trial(k: int, by_run: bool = by_run, tally: Tally = tally) -> Outcome[Any]:
                thread = f"t{next(_ids)}"
                doomed = await stack.store.put_batch([ev(thread, "r", f"d{i}") for i in range(5)], user_id=None)
                kept = await stack.store.put_batch([ev(thread, "keep", f"k{i}") for i in range(5)], user_id=None)
                if by_run:
                    call = lambda: stack.store.delete_by_run(thread, "r", user_id=None)  # noqa: E731
                else:
                    call = lambda: stack.store.delete_by_thread(thread, user_id=None)  # noqa: E731
                outcome = await cancel_at(call, k)
                await stack.assert_settled()  # at once: a cancelled call has settled
                done = _ok(outcome)
                if done:
                    assert outcome.result == (5 if by_run else 10)
                acked: dict[int, str] = {}
                await _after(stack, thread, acked, tally)
                gone = await stack.events(thread, "r")
                others = await stack.events(thread, "keep")
                tally.trials += 1
                tally.completed += done
                tally.acknowledged += done
                left = {c for c in gone.values() if c.startswith("d")}
                assert left in (set(), {r["content"] for r in doomed}), f"partial delete: {left}"
                if by_run:
                    assert others == {r["seq"]: r["content"] for r in kept}, "another run's events are untouched"
                else:
                    assert set(others.values()) in (set(), {r["content"] for r in kept}), "partial delete"
                    assert (not left) == (not others), "one transaction deletes both runs"
                if done:
                    tally.lost += bool(left)
                    assert not left, "a delete that returned has committed"
                assert gone.get(next(iter(acked))) == next(iter(acked.values()))
                return outcome

            await _sweep(stack, trial)
            name = "delete_by_run" if by_run else "delete_by_thread"
            tally.report(fault_report, f"{kind}: event store {name} cancelled")
            assert tally.lost == 0


# -- savers ----------------------------------------------------------------------------


def _commits(saver: Any) -> Any:
    """The saver's group-commit queue."""
    return saver._commits if hasattr(saver, "_commits") else saver._state.file.queue


async def _carried_value_survives(saver: Any, reader: Any, thread: str, version: str) -> None:
    """A checkpoint carrying channel ``a`` at the version a (maybe) deleted checkpoint had
    must still read its value: a saver that skips storing values it believes stored must
    not believe it after a delete that may have committed."""
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"a": "carried"}
    checkpoint["channel_versions"] = {"a": version}
    saved = await saver.aput(cfg(thread), checkpoint, {"step": 9}, {})
    got = await reader.aget_tuple(saved)
    assert got is not None and got.checkpoint["channel_values"].get("a") in ("carried", "v3"), got


async def test_saver_deletes_copy_and_prune_cancelled_at_every_suspension(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, fault_report: Any
) -> None:
    async with _stack(kind, request, tmp_path) as stack:
        saver, reader = stack.saver, stack.saver_reader
        cases: dict[str, Callable[[str], Any]] = {
            "adelete_thread": lambda t: saver.adelete_thread(t),
            "acopy_thread": lambda t: saver.acopy_thread(t, f"{t}-copy"),
            "aprune": lambda t: saver.aprune([t]),
            "adelete_for_runs": lambda t: saver.adelete_for_runs([f"r1-{t}"]),
        }
        for name, make in cases.items():
            tally = Tally()

            async def trial(
                k: int, name: str = name, make: Callable[[str], Any] = make, tally: Tally = tally
            ) -> Outcome[Any]:
                thread = f"s{next(_ids)}"
                runs = [f"r1-{thread}", f"r1-{thread}", f"r2-{thread}", f"r2-{thread}"]
                await put_chain(saver, thread, ["v0", "v1", "v2", "v3"], runs)
                before = await snapshot(reader, thread)
                head = await reader.aget_tuple(cfg(thread))
                version = head.checkpoint["channel_versions"]["a"]
                outcome = await cancel_at(lambda: make(thread), k)
                await stack.assert_settled()  # at once: a cancelled call has settled
                done = _ok(outcome)
                after = await snapshot(reader, thread)
                target = after
                if name == "adelete_thread":
                    expected = []
                elif name == "acopy_thread":
                    target, expected = await snapshot(reader, f"{thread}-copy"), before
                    assert after == before
                elif name == "aprune":
                    expected = before[:1]
                else:
                    expected = before[:2]
                untouched = [] if name == "acopy_thread" else before
                assert target in (untouched, expected), f"{name} left a partial state: {target}"
                if done:
                    assert target == expected, "a call that returned has committed"
                if name == "adelete_thread":
                    await _carried_value_survives(saver, reader, thread, version)
                # The saver still commits, and what it acknowledges is visible elsewhere.
                ids = await put_chain(saver, f"{thread}-next", ["n0", "n1"])
                got = await snapshot(reader, f"{thread}-next")
                tally.trials += 1
                tally.completed += done
                tally.acknowledged += 4 + 2 + done
                tally.lost += [g[0] for g in got] != ids[::-1]
                return outcome

            await _sweep(stack, trial)
            tally.report(fault_report, f"{kind}: saver {name} cancelled")
            assert tally.lost == 0


async def test_saver_puts_cancelled_while_queued_or_in_their_batch(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, fault_report: Any
) -> None:
    """aput and aput_writes: the caller is cancelled at each of its own suspensions and at
    each suspension of the batch running its op next to another caller's (committed
    whole, with the other's). Alone on an idle saver, its op is either queued (withdrawn
    when cancelled: absent) or, where the queue runs a lone op inline in its caller's
    task (PostgreSQL, sqlite), run there: a cancel leaves it whole or absent."""
    async with _stack(kind, request, tmp_path) as stack:
        saver, reader = stack.saver, stack.saver_reader
        commits = _commits(saver)
        real_run_batch = commits._run_batch
        inline = commits._inline_key is not None
        for writes in (False, True):
            for in_batch in (False, True):
                tally = Tally()

                async def trial(
                    k: int, writes: bool = writes, in_batch: bool = in_batch, tally: Tally = tally
                ) -> Outcome[Any]:
                    thread = f"g{next(_ids)}"
                    [head] = await put_chain(saver, thread, ["v0"])
                    other = f"{thread}-other"

                    def mine() -> Awaitable[Any]:
                        if writes:
                            return saver.aput_writes(cfg(thread, head), [("a", "mine"), ("b", "mine")], "t2", "")
                        return saver.aput(*checkpoint_args(saver, cfg(thread, head), "mine", "run", 1))

                    if not in_batch:
                        outcome = await cancel_at(mine, k)
                        await stack.assert_settled()  # at once: a cancelled call has settled
                        done = _ok(outcome)
                    else:
                        batch_outcome: list[Outcome[Any]] = []
                        # Theirs is an op of the same kind as mine: a saver may batch
                        # by kind (the PostgreSQL saver batches by statement).
                        other_head = None
                        if writes:
                            [other_head] = await put_chain(saver, other, ["o0"])
                        # A third caller's op holds the queue (its batch waits on a gate),
                        # so mine and theirs queue behind it and go out in one batch.
                        gate = asyncio.Event()

                        async def gated(ops: list[Any]) -> Any:
                            await gate.wait()
                            return await real_run_batch(ops)

                        commits._run_batch = gated
                        try:
                            blocker = asyncio.ensure_future(
                                saver.aput(*checkpoint_args(saver, cfg(f"{thread}-blocker"), "b", "run", 0))
                            )
                            # Polled: the queue's state has no event to wait on.
                            while (not commits.busy or commits._queue) and not blocker.done():  # noqa: ASYNC110
                                await asyncio.sleep(0)
                            caller = asyncio.ensure_future(mine())
                            theirs = asyncio.ensure_future(
                                saver.aput_writes(cfg(other, other_head), [("a", "theirs")], "t3", "")
                                if writes
                                else saver.aput(*checkpoint_args(saver, cfg(other), "theirs", "run", 0))
                            )
                            while len(commits._queue) < 2 and not (caller.done() or theirs.done()):  # noqa: ASYNC110
                                await asyncio.sleep(0)
                            commits._run_batch = batch_acting_at(
                                real_run_batch, k, caller.cancel, batch_outcome
                            )
                            gate.set()
                            await blocker
                            result = await asyncio.gather(caller, return_exceptions=True)
                            await commits.wait_idle()
                        finally:
                            gate.set()
                            commits._run_batch = real_run_batch
                        assert len(batch_outcome) == 1, "both ops went out in one batch"
                        cancelled = isinstance(result[0], asyncio.CancelledError)
                        outcome = Outcome(cancelled=False, result=None if cancelled else result[0],
                                          suspensions=batch_outcome[0].suspensions)
                        assert cancelled == (k <= outcome.suspensions)
                        await theirs
                        done = not cancelled
                    got = await reader.aget_tuple(cfg(thread))
                    assert got is not None
                    if writes:
                        pending = sorted((w[1], w[2]) for w in got.pending_writes or [])
                        has_mine = [p for p in pending if p[1] == "mine"]
                        assert has_mine in ([], [("a", "mine"), ("b", "mine")]), f"partial writes: {pending}"
                        present = bool(has_mine)
                    else:
                        present = got.checkpoint["channel_values"] == {"a": "mine"}
                        if present:
                            assert got.metadata["step"] == 1
                        else:
                            assert got.config["configurable"]["checkpoint_id"] == head
                    if in_batch:
                        assert present, "an op taken into a batch commits with it, whoever stopped waiting"
                        theirs_got = await reader.aget_tuple(cfg(other))
                        assert theirs_got is not None
                        if writes:
                            assert ("t3", "a", "theirs") in (theirs_got.pending_writes or [])
                        else:
                            assert theirs_got.checkpoint["channel_values"] == {"a": "theirs"}
                    elif done:
                        assert present, "a call that returned has committed"
                    elif not inline:
                        assert not present, "an op withdrawn while queued never runs"
                    tally.trials += 1
                    tally.completed += done
                    tally.acknowledged += 2 + done + 2 * in_batch + 2 * (in_batch and writes)
                    tally.lost += done and not present
                    ids = await put_chain(saver, f"{thread}-next", ["n0"])
                    assert (await reader.aget_tuple(cfg(f"{thread}-next", ids[0]))) is not None
                    return outcome

                await _sweep(stack, trial)
                name = "aput_writes" if writes else "aput"
                where = "its batch running" if in_batch else ("run alone" if inline else "queued")
                tally.report(fault_report, f"{kind}: saver {name} cancelled ({where})")
                assert tally.lost == 0


async def test_sqlite_cancelled_write_has_settled_when_the_cancel_returns(tmp_path: Path, fault_report: Any) -> None:
    """A sqlite write runs on its connection's worker thread, which cannot be interrupted:
    a caller cancelled while its write waits behind other work on that thread gets its
    CancelledError only once the write has ended, never before it lands."""
    async with open_stack("sqlite", tmp_path=tmp_path) as stack:
        writer = stack.store._driver._commits._writer  # the file's writer, shared with the saver
        gate = threading.Event()
        busy = asyncio.ensure_future(writer.run(lambda _conn: gate.wait(60)))
        await asyncio.sleep(0)  # the worker runs the gate first; the write queues behind it
        asyncio.get_running_loop().call_later(0.05, gate.set)
        batch = [ev("blocked", "r", f"x{i}") for i in range(BATCH)]
        outcome = await cancel_at(lambda: stack.store.put_batch(batch, user_id=None), 1)
        assert outcome.cancelled
        now = await stack.events("blocked", "r")
        await stack.assert_settled()
        await busy
        await writer.run(lambda _conn: None)  # everything queued on the worker has run
        assert await stack.events("blocked", "r") == now, "nothing lands after the cancelled call returned"
        assert len(now) in (0, BATCH)
        fault_report.add("sqlite: event store put_batch cancelled behind other work", trials=1,
                         acknowledged=0, lost=0, duplicated=0, completed_anyway=int(bool(now)))


# -- run stores ------------------------------------------------------------------------


def _by_id(runs: list[Any]) -> dict[str, Any]:
    return {r["run_id"]: r for r in runs}


async def test_run_store_writes_cancelled_at_every_suspension(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, fault_report: Any
) -> None:
    """Every run store write, cancelled at each of its caller's suspensions: the thread's
    runs are as before the call or as after all of it, read from another pool; settled at
    once (no session in a transaction, no row lock held); the next writes commit."""
    from runstore.clock import ManualClock

    async with _stack(kind, request, tmp_path) as stack:
        runs, reader = await stack.open_runs()
        clock = ManualClock()
        runs.clock = clock

        async def started(thread: str, ttl: float = 3600) -> None:
            await runs.create(thread, run_id=f"{thread}-a")
            await runs.start(f"{thread}-a", "w", ttl)

        async def with_queued(thread: str) -> None:
            await started(thread)
            await runs.create(thread, run_id=f"{thread}-b", multitask_strategy="enqueue")

        async def expired(thread: str) -> None:
            await started(thread, ttl=1)
            clock.advance(10)

        async def nothing(thread: str) -> None:
            return None

        # name: (set up the thread, the call, whether the runs show all of its effect)
        Check = Callable[[str, dict[str, Any]], bool]
        cases: dict[str, tuple[Callable[[str], Awaitable[None]], Callable[[str], Any], Check]] = {
            "create": (nothing, lambda t: runs.create(t, run_id=f"{t}-a"),
                       lambda t, r: r[f"{t}-a"]["status"] == "pending" and r[f"{t}-a"]["active"]),
            "start": (lambda t: runs.create(t, run_id=f"{t}-a"), lambda t: runs.start(f"{t}-a", "w", 3600),
                      lambda t, r: r[f"{t}-a"]["status"] == "running" and r[f"{t}-a"]["fence"] is not None),
            "renew_lease": (started, lambda t: runs.renew_lease(f"{t}-a", "w", 7200),
                            lambda t, r: r[f"{t}-a"]["lease_expires_at"] > clock() + timedelta(seconds=3600)),
            "request_cancel": (started, lambda t: runs.request_cancel(f"{t}-a", "rollback"),
                               lambda t, r: r[f"{t}-a"]["cancel_action"] == "rollback"),
            "finalize": (with_queued, lambda t: runs.finalize(f"{t}-a", "w", "success"),
                         lambda t, r: r[f"{t}-a"]["status"] == "success" and r[f"{t}-b"]["active"]),
            "claim_expired": (expired, lambda t: runs.claim_expired("w2", 3600, grace=0),
                              lambda t, r: r[f"{t}-a"]["owner"] == "w2" and r[f"{t}-a"]["fence"] == 2),
            "delete": (with_queued, lambda t: runs.delete(f"{t}-a"),
                       lambda t, r: f"{t}-a" not in r and r[f"{t}-b"]["active"]),
        }
        for name, (setup, make, complete) in cases.items():
            tally = Tally()

            async def trial(
                k: int, name: str = name, setup: Any = setup, make: Any = make, complete: Check = complete,
                tally: Tally = tally,
            ) -> Outcome[Any]:
                thread = f"r{next(_ids)}"
                await setup(thread)
                before = await reader.list_by_thread(thread)
                outcome = await cancel_at(lambda: make(thread), k)
                await stack.assert_settled()  # at once: a cancelled call has settled
                done = _ok(outcome)
                after = await reader.list_by_thread(thread)
                whole = complete(thread, _by_id(after))
                assert whole or after == before, f"{name} left a partial state: {after}"
                if done:
                    assert whole, "a call that returned has committed"
                # The store still commits, and what it acknowledges is visible elsewhere.
                created = await runs.create(f"{thread}-next", run_id=f"{thread}-next")
                assert created is not None and await reader.get(f"{thread}-next") is not None
                tally.trials += 1
                tally.completed += done
                tally.acknowledged += 1 + done
                tally.extra["whole_when_cancelled"] = tally.extra.get("whole_when_cancelled", 0) + (
                    whole and not done)
                return outcome

            await _sweep(stack, trial)
            tally.report(fault_report, f"{kind}: run store {name} cancelled")
