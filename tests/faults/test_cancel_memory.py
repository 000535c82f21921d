"""The memory backends' writes never suspend, so a cancellation lands before or after a
whole call, never inside it (tests/faults/cancel.py counts the suspension points; the
memory stream bridge has its own test in test_cancel_streams.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from runstore.options import BackendOptions
from runstore.urls import BackendURL

from .cancel import suspensions
from .sqlstacks import cfg, checkpoint_args, ev, put_chain

pytestmark = pytest.mark.faults


async def test_memory_writes_have_no_cancel_point(fault_report: Any) -> None:
    from runstore.plugins.memory.events import MemoryEventStore
    from runstore.plugins.memory.runs import MemoryRunStore
    from runstore.plugins.memory.saver import MemorySaver

    url = BackendURL.parse("memory://")
    async with BackendOptions.scope() as options:
        store = await MemoryEventStore.open(url, options)
        saver = await MemorySaver.open(url, options)
        runs = await MemoryRunStore.open(url, options)
        ids = await put_chain(saver, "s", ["v0", "v1"], ["r1", "r2"])
        head = cfg("s", ids[-1])
        await runs.create("busy", run_id="b")
        calls: dict[str, Callable[[], Awaitable[Any]]] = {
            "event store put": lambda: store.put(**ev("t", "r", "x"), user_id=None),
            "event store put_batch": lambda: store.put_batch([ev("t", "r", f"y{i}") for i in range(5)], user_id=None),
            "event store put_if_absent": lambda: store.put_if_absent(**ev("t", "r", "s", "run_start"), user_id=None),
            "event store delete_by_run": lambda: store.delete_by_run("t", "r", user_id=None),
            "event store delete_by_thread": lambda: store.delete_by_thread("t", user_id=None),
            "saver aput": lambda: saver.aput(*checkpoint_args(saver, head, "v2", "r2", 2)),
            "saver aput_writes": lambda: saver.aput_writes(head, [("a", "w")], "task", ""),
            "saver acopy_thread": lambda: saver.acopy_thread("s", "s-copy"),
            "saver aprune": lambda: saver.aprune(["s-copy"]),
            "saver adelete_for_runs": lambda: saver.adelete_for_runs(["r1"]),
            "saver adelete_thread": lambda: saver.adelete_thread("s"),
            "run store create": lambda: runs.create("t", run_id="a"),
            "run store start": lambda: runs.start("a", "w", 60),
            "run store renew_lease": lambda: runs.renew_lease("a", "w", 60),
            "run store request_cancel": lambda: runs.request_cancel("a"),
            "run store finalize": lambda: runs.finalize("a", "w", "cancelled"),
            "run store claim_expired": lambda: runs.claim_expired("w2", 60, grace=0),
            "run store delete": lambda: runs.delete("b"),
        }
        points = {name: await suspensions(call) for name, call in calls.items()}
    assert points == dict.fromkeys(calls, 0), points
    fault_report.add("memory: event store, saver and run store writes (no cancel point)", trials=len(calls),
                     acknowledged=len(calls), lost=0, duplicated=0)
