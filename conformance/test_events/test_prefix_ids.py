"""Ids that are prefixes of other ids (``t1`` / ``t10``, ``r1`` / ``r10``) and ids holding
SQL ``LIKE`` wildcards (``t_``) name exactly one thread or run in every event store call:
reads, counts, run lists and deletes. Assertion messages name the contract that broke.
"""

from __future__ import annotations

from typing import Any

import pytest

from runstore.events.protocol import RunEventStore

from ..events_model import fresh_id

__all__ = ["test_prefix_ids_name_one_thread_and_run_in_every_call"]

pytestmark = pytest.mark.runstore_contract("run event store")

CONTRACT = "contract: ids that are prefixes of other ids (or hold LIKE wildcards) name exactly one"


async def _view(store: RunEventStore, thread: str, runs: list[str]) -> dict[str, Any]:
    return {
        "messages": [r["content"] for r in await store.list_messages(thread, limit=100, user_id=None)],
        "count": await store.count_messages(thread, user_id=None),
        "runs": [r.run_id for r in await store.list_runs(thread, user_id=None)],
        "events": {
            run: [r["content"] for r in await store.list_events(thread, run, user_id=None)] for run in runs
        },
        "by_run": {
            run: [r["content"] for r in await store.list_messages_by_run(thread, run, user_id=None)]
            for run in runs
        },
    }


def test_prefix_ids_name_one_thread_and_run_in_every_call(events_target: Any) -> None:
    """Threads ``t``, ``t0``, ``t_``, ``tx`` each hold runs ``r``, ``r0``, ``r_``, ``rx``:
    every read of one thread or run sees only its own events; delete_by_run(``t``, ``r``)
    and delete_by_thread(``t_``) remove only what they name."""

    async def body(store: RunEventStore) -> None:
        base, run = fresh_id("t"), fresh_id("r")
        threads = [base, base + "0", base + "_", base + "x"]
        runs = [run, run + "0", run + "_", run + "x"]
        for thread in threads:
            for r in runs:
                await store.put(thread_id=thread, run_id=r, event_type="ai_message", category="message",
                                content=f"{thread}|{r}", user_id=None)
        views = {}
        for thread in threads:
            view = await _view(store, thread, runs)
            expected = [f"{thread}|{r}" for r in runs]
            assert view["messages"] == expected and view["count"] == 4, (
                f"{CONTRACT} thread: list_messages / count_messages({thread!r}) saw {view['messages']}"
            )
            assert view["runs"] == runs, f"{CONTRACT} run: list_runs({thread!r}) gave {view['runs']}"
            for r in runs:
                assert view["events"][r] == view["by_run"][r] == [f"{thread}|{r}"], (
                    f"{CONTRACT} run: list_events / list_messages_by_run({thread!r}, {r!r}) saw "
                    f"{view['events'][r]} / {view['by_run'][r]}"
                )
            views[thread] = view
        deleted = await store.delete_by_run(base, run, user_id=None)
        assert deleted == 1, f"{CONTRACT} run: delete_by_run({base!r}, {run!r}) deleted {deleted} events"
        deleted = await store.delete_by_thread(base + "_", user_id=None)
        assert deleted == 4, f"{CONTRACT} thread: delete_by_thread({base + '_'!r}) deleted {deleted} events"
        for thread in (base + "0", base + "x"):
            assert await _view(store, thread, runs) == views[thread], (
                f"{CONTRACT} thread: a delete of another thread or run changed {thread!r}"
            )
        rest = await _view(store, base, runs)
        assert rest["runs"] == runs[1:], f"{CONTRACT} run: delete_by_run removed {rest['runs']}"
        deleted = await store.delete_by_thread(base, user_id=None)
        assert deleted == 3, f"{CONTRACT} thread: delete_by_thread({base!r}) deleted {deleted} events"
        for thread in (base + "0", base + "x"):
            assert await _view(store, thread, runs) == views[thread], (
                f"{CONTRACT} thread: delete_by_thread({base!r}) changed {thread!r}"
            )
        for thread in threads:
            await store.delete_by_thread(thread, user_id=None)

    events_target.run(body)
