"""Cancellation of JSONL event store writes at every cancel point (tests/faults/cancel.py).

Each write path (``put``, ``put_batch``, ``put_if_absent``, ``delete_by_thread``,
``delete_by_run``) is cancelled at its k-th suspension for every k. After every trial
the cancelled call left all of its effect or none, everything acknowledged is there
exactly once, no batch journal is left pending, and the next write commits. At the
end the directory is reopened by a fresh store (what is on disk, not in memory) and
every acknowledged event is read back.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runstore.options import BackendOptions
from runstore.urls import BackendURL

from .cancel import Outcome, cancel_at, every_cancel_point
from .sqlstacks import Tally, ev

pytestmark = pytest.mark.faults

_ids = itertools.count()


async def test_jsonl_writes_cancelled_at_every_suspension(tmp_path: Path, fault_report: Any) -> None:
    from runstore.plugins.jsonl.events import JOURNAL_DIR, JsonlEventStore

    url = BackendURL.for_file("jsonl", tmp_path / "events")
    acknowledged: dict[tuple[str, str], dict[int, str]] = {}  # (thread, run) -> seq -> content

    async def contents(store: Any, thread: str, run: str) -> dict[int, str]:
        return {r["seq"]: r["content"] for r in await store.list_events(thread, run, limit=10_000, user_id=None)}

    async with BackendOptions.scope() as options:
        store = await JsonlEventStore.open(url, options)

        def settled() -> None:
            journal = tmp_path / "events" / JOURNAL_DIR
            left = [p.name for p in journal.glob("*.json")] if journal.exists() else []
            assert not left, f"batch journals left pending: {left}"

        # name: (events written first, the call, the contents of run "r" after all of it)
        Case = tuple[int, Callable[[str], Any], Callable[[str, set[str]], set[str]]]
        cases: dict[str, Case] = {
            "put": (2, lambda t: store.put(**ev(t, "r", "x0"), user_id=None), lambda t, b: b | {"x0"}),
            "put_batch": (2, lambda t: store.put_batch([ev(t, "r", f"x{i}") for i in range(200)], user_id=None),
                          lambda t, b: b | {f"x{i}" for i in range(200)}),
            "put_if_absent": (2, lambda t: store.put_if_absent(**ev(t, "r", "start", "run_start"), user_id=None),
                              lambda t, b: b | {"start"}),
            "delete_by_run": (3, lambda t: store.delete_by_run(t, "r", user_id=None), lambda t, b: set()),
            "delete_by_thread": (3, lambda t: store.delete_by_thread(t, user_id=None), lambda t, b: set()),
        }
        for name, (first, make, complete) in cases.items():
            tally = Tally()

            async def trial(
                k: int, name: str = name, first: int = first, make: Any = make,
                complete: Callable[[str, set[str]], set[str]] = complete, tally: Tally = tally,
            ) -> Outcome[Any]:
                thread = f"t{next(_ids)}"
                written = await store.put_batch([ev(thread, "r", f"a{i}") for i in range(first)], user_id=None)
                kept = await store.put(**ev(thread, "keep", "k"), user_id=None)
                before = {r["content"] for r in written}
                outcome = await cancel_at(lambda: make(thread), k)
                settled()
                assert outcome.error is None or outcome.cancelled, outcome.error
                done = not outcome.cancelled
                after = set((await contents(store, thread, "r")).values())
                whole = complete(thread, before)
                assert after in (before, whole), f"{name} left a partial state: {sorted(after)[:10]}"
                if done:
                    assert after == whole, "a call that returned has committed"
                others = await contents(store, thread, "keep")
                if name == "delete_by_thread":
                    assert set(others.values()) in (set(), {"k"}) and (not others) == (not after), "one delete"
                else:
                    assert others == {kept["seq"]: "k"}, "another run is untouched"
                # The next write commits after everything there.
                record = await store.put(**ev(thread, "r", "after"), user_id=None)
                now = await contents(store, thread, "r")
                assert now[record["seq"]] == "after" and record["seq"] == max(now)
                acknowledged[(thread, "r")] = now
                tally.trials += 1
                tally.completed += done
                tally.acknowledged += first + 2 + ((len(whole - before) or 1) if done else 0)
                return outcome

            await every_cancel_point(trial)
            tally.report(fault_report, f"jsonl: event store {name} cancelled")

    # What is on disk: a fresh store on the directory reads back every acknowledged event.
    lost = 0
    async with BackendOptions.scope() as options:
        reopened = await JsonlEventStore.open(url, options)
        for (thread, run), expected in acknowledged.items():
            got = await contents(reopened, thread, run)
            lost += sum(1 for seq, content in expected.items() if got.get(seq) != content)
    assert lost == 0, f"{lost} acknowledged events missing after reopening"
