"""No lock-in: what the suite writes leaves the backend under test and comes back.

Savers (through LangGraph's API, so every saver takes part): real graphs in full and
delta mode with a fork, a child namespace and pending writes in special slots are
copied into the memory reference, which must answer exactly like the backend (state,
history, delta history, pending writes), then copied back into the backend under new
thread ids, which must answer the same again; savers declaring ``bulk_import`` export
their rows and import them back. Event stores declaring ``bulk_import``:
a feed with a gap is exported into the memory reference and imported back, seqs,
times, owners and all. Stores declaring ``bulk_import``: namespaces at several depths,
nested values and TTL items exported into the memory reference answer the same there
(get, filtered search page by page, list_namespaces) and imported back under another
root keep their keys, values, times and TTL state. See docs/migrate.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.base import empty_checkpoint

from runstore.migrate.endpoints import open_endpoint
from runstore.migrate.savers import read_thread, write_record

from .events_model import fresh_id
from .savers_graph import build_graph

pytestmark = pytest.mark.runstore_contract("no lock-in")

#: Threads copied back into the backend get this prefix.
BACK = "imported-"


async def _write(saver: Any, prefix: str) -> dict[str, str]:
    """Graph threads in both modes with a fork, and a hand-written namespace with special slots."""
    threads = {}
    for mode in ("full", "delta"):
        thread_id = f"{prefix}-{mode}"
        graph = build_graph(mode, 3, saver)
        metadata = {"runstore_checkpoint_channel_mode": "delta"} if mode == "delta" else {}
        config: Any = {"configurable": {"thread_id": thread_id}, "metadata": metadata}
        for turn in range(4):
            await graph.ainvoke({"messages": [HumanMessage(f"{mode} {turn}", id=f"{mode}-{turn}")]}, config)
        history = [s async for s in graph.aget_state_history({"configurable": {"thread_id": thread_id}})]
        await graph.aupdate_state(history[len(history) // 2].config, {"messages": [HumanMessage("fork", id="fork")]})
        threads[thread_id] = mode
    thread_id = f"{prefix}-ns"
    for ns in ("", "child:1"):
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"topic": f"hello {ns}"}
        checkpoint["channel_versions"] = {"topic": "1"}
        stored = await saver.aput({"configurable": {"thread_id": thread_id, "checkpoint_ns": ns}}, checkpoint,
                                  {"source": "input", "step": 0}, {"topic": "1"})  # fmt: skip
        await saver.aput_writes(stored, [("topic", "next")], "task-b", "")
        await saver.aput_writes(stored, [("__error__", "boom"), ("__interrupt__", [{"value": "ask"}])], "task-a", "")
    threads[thread_id] = "full"
    return threads


async def _view(saver: Any, thread_id: str, mode: str) -> Any:
    """What LangGraph and the saver answer for a thread, without its id."""
    graph = build_graph(mode, 3, saver)
    config: Any = {"configurable": {"thread_id": thread_id}}
    history = []
    async for snap in graph.aget_state_history(config):
        parent = (snap.parent_config or {}).get("configurable", {}).get("checkpoint_id")
        history.append((snap.config["configurable"]["checkpoint_id"], parent,
                        [(m.id, m.content) for m in snap.values.get("messages", [])]))  # fmt: skip
    delta: Any = {}
    if mode == "delta" and history:
        head = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": history[0][0]}}
        found = await saver.aget_delta_channel_history(config=head, channels=["messages"])
        delta = {ch: [(w[0], w[1], str(w[2])) for w in entry["writes"]] for ch, entry in found.items()}
    tuples = []
    for ns in ("", "child:1"):
        got = await saver.aget_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ns}})
        if got is not None:
            tuples.append((ns, got.checkpoint["id"], got.checkpoint["channel_values"].get("topic"),
                           sorted(got.pending_writes or [])))  # fmt: skip
    return history, delta, tuples


async def _copy(source: Any, destination: Any, thread_id: str, new_id: str) -> None:
    for record in await read_thread(source, thread_id):
        await write_record(destination, dataclasses.replace(record, thread_id=new_id), source.serde)


def test_saver_data_leaves_for_the_memory_reference_and_comes_back(saver_target: Any) -> None:
    """The suite's threads copied into the memory reference answer exactly as on the
    backend, and copied back into the backend answer the same again."""

    async def body(saver: Any) -> None:
        threads = await _write(saver, fresh_id("lockin"))
        async with open_endpoint("memory://", ["saver"]) as memory:
            for thread_id, mode in threads.items():
                original = await _view(saver, thread_id, mode)
                await _copy(saver, memory.saver, thread_id, thread_id)
                assert await _view(memory.saver, thread_id, mode) == original, (
                    f"contract: no lock-in: thread {thread_id!r} ({mode}) copied into the memory reference "
                    "answers differently (state, history, parent links, delta history or pending writes)"
                )
                await _copy(memory.saver, saver, thread_id, BACK + thread_id)
                assert await _view(saver, BACK + thread_id, mode) == original, (
                    f"contract: no lock-in: thread {thread_id!r} ({mode}) imported back into the backend answers "
                    "differently (state, history, parent links, delta history or pending writes)"
                )

    saver_target.run(body)


@pytest.mark.requires("bulk_import")
def test_saver_rows_leave_as_stored_and_come_back(saver_target: Any) -> None:
    """A saver declaring ``bulk_import`` exports the suite's threads as stored rows; a
    deleted thread imported back from them answers as before, with its record's times,
    and a second import inserts nothing."""

    async def body(saver: Any) -> None:
        threads = await _write(saver, fresh_id("lockin-rows"))
        ids = list(threads)
        before = {t: (await _view(saver, t, m), await saver.aget_thread(t)) for t, m in threads.items()}
        exported = await saver.aexport_thread_rows(ids)
        assert [rows.thread_id for rows in exported] == ids, "contract: no lock-in: every live thread exports"
        for thread_id in ids:
            await saver.adelete_thread(thread_id)
        assert await saver.aheld_thread_ids(ids) == set()
        imported = await saver.aimport_thread_rows(exported)
        assert [(i.checkpoints, i.writes) for i in imported] == [(len(r.checkpoints), len(r.writes)) for r in exported]
        for thread_id, mode in threads.items():
            view, info = before[thread_id]
            assert await _view(saver, thread_id, mode) == view, (
                f"contract: no lock-in: thread {thread_id!r} ({mode}) imported from its stored rows answers "
                "differently (state, history, parent links, delta history or pending writes)"
            )
            again = await saver.aget_thread(thread_id)
            assert (again.created_at, again.updated_at, again.status, again.checkpoints, again.writes) == (
                info.created_at, info.updated_at, info.status, info.checkpoints, info.writes
            ), f"contract: no lock-in: thread {thread_id!r}'s record after an import differs from the exported one"
        twice = await saver.aimport_thread_rows(exported)
        assert all(i.checkpoints == i.writes == 0 for i in twice), "contract: no lock-in: a second import inserts nothing"

    saver_target.run(body)


@pytest.mark.requires("bulk_import")
def test_event_feeds_leave_for_the_memory_reference_and_come_back(events_target: Any) -> None:
    """A feed with a gap exported into the memory reference and imported back keeps every
    seq, created_at, owner and category."""

    async def body(store: Any) -> None:
        thread_id = fresh_id("lockin-events")
        for run in ("r1", "r2", "r3"):
            await store.put(thread_id=thread_id, run_id=run, event_type="human", category="message",
                            content={"id": f"{run}-m", "content": "hi"}, user_id="alice")  # fmt: skip
            await store.put(thread_id=thread_id, run_id=run, event_type="step", category="trace", content="t", user_id=None)
        await store.delete_by_run(thread_id, "r2", user_id=None)
        feed = await store.aexport_events(thread_id, limit=100)
        async with open_endpoint("memory://", ["events"]) as memory:
            await memory.events.aimport_events(feed)
            copied = await memory.events.aexport_events(thread_id, limit=100)
            assert [dict(r) for r in copied] == [dict(r) for r in feed], (
                "contract: no lock-in: a feed exported into the memory reference must keep every seq, created_at, "
                "owner and category"
            )
            back = [{**record, "thread_id": BACK + thread_id} for record in copied]
            await store.aimport_events(back)
            again = [{**r, "thread_id": thread_id} for r in await store.aexport_events(BACK + thread_id, limit=100)]
            assert again == [dict(r) for r in feed], (
                "contract: no lock-in: a feed imported back keeps its seqs (gaps included), created_at, owner "
                "and category"
            )
            assert await store.aimport_events(back) == 0, "contract: no lock-in: importing a feed twice inserts nothing"
        nxt = await store.put(thread_id=BACK + thread_id, run_id="r4", event_type="x", category="trace", user_id=None)
        assert nxt["seq"] == feed[-1]["seq"] + 1, (
            "contract: no lock-in: after an import the next seq follows the highest imported seq"
        )

    events_target.run(body)


@pytest.mark.requires("bulk_import")
def test_runs_leave_for_the_memory_reference_and_come_back(runs_target: Any) -> None:
    """A thread's runs (finished, running, queued) exported into the memory reference and
    imported back are the same runs, with their fencing counter."""

    async def body(store: Any) -> None:
        thread_id = fresh_id("lockin-runs")
        done = await store.create(thread_id=thread_id, kind="run", idempotency_key=fresh_id("key"))
        await store.start(done.run["run_id"], "w", 30)
        await store.finalize(done.run["run_id"], "w", "success")
        running = await store.create(thread_id=thread_id, kind="run")
        await store.start(running.run["run_id"], "w", 30)
        await store.create(thread_id=thread_id, kind="wait", multitask_strategy="enqueue")
        exported = await store.aexport_runs(thread_id)
        async with open_endpoint("memory://", ["runs"]) as memory:
            assert await memory.runs.aimport_runs([exported]) == 3
            assert await memory.runs.aexport_runs(thread_id) == exported, (
                "contract: no lock-in: runs exported into the memory reference keep every field and the counter"
            )
            assert await memory.runs.list_by_thread(thread_id) == await store.list_by_thread(thread_id)
        copied = {**exported, "thread_id": BACK + thread_id,
                  "runs": [{**run, "thread_id": BACK + thread_id, "run_id": BACK + run["run_id"],
                            "idempotency_key": None} for run in exported["runs"]]}  # fmt: skip
        assert await store.aimport_runs([copied]) == 3
        assert await store.aimport_runs([copied]) == 0, "contract: no lock-in: importing runs twice inserts nothing"
        back = await store.aexport_runs(BACK + thread_id)
        assert back == copied, "contract: no lock-in: runs imported back keep every field and the fencing counter"

    runs_target.run(body)


#: Where the store test's items sit below its root label (depths 1 to 3).
_STORE_NAMESPACES = (("a",), ("a", "b"), ("a", "b", "c"), ("z",))


async def _store_records(store: Any, root: tuple[str, ...]) -> list[dict[str, Any]]:
    """Every record below ``root``, namespaces in order (the store's bulk export)."""
    records: list[dict[str, Any]] = []
    after: tuple[str, ...] = root
    while True:
        page = await store.aexport_namespaces(after=after, limit=50)
        mine = [ns for ns in page if tuple(ns[: len(root)]) == root]
        for namespace in mine:
            records.extend(await store.aexport_items(namespace, limit=1000))
        if len(page) < 50 or len(mine) < len(page):
            return records
        after = page[-1]


async def _store_view(store: Any, root: tuple[str, ...]) -> Any:
    """What the store answers below ``root``, with ``root`` cut off every namespace."""
    cut = len(root)
    out: list[Any] = [[ns[cut:] for ns in await store.alist_namespaces(prefix=root, limit=100)]]
    for namespace in _STORE_NAMESPACES:
        for key in ("k0", "k1", "k2", "missing"):
            item = await store.aget((*root, *namespace), key, refresh_ttl=False)
            out.append(None if item is None else (item.key, item.value, item.created_at, item.updated_at))
    for offset in (0, 2, 4, 6):
        found = await store.asearch(root, filter={"meta.kind": "note"}, limit=2, offset=offset, refresh_ttl=False)
        out.append([(tuple(i.namespace)[cut:], i.key, i.value, i.created_at, i.updated_at) for i in found])
    return out


@pytest.mark.requires("bulk_import")
def test_store_items_leave_for_the_memory_reference_and_come_back(store_target: Any) -> None:
    """Items at several namespace depths, nested values and TTLs exported into the memory
    reference answer the same there, and imported back keep their times and TTL state."""

    async def body(store: Any) -> None:
        root = (fresh_id("lockin-store"),)
        for depth, namespace in enumerate(_STORE_NAMESPACES):
            for n in range(3):
                value = {"n": n, "meta": {"kind": "note" if n != 1 else "fact", "depth": depth, "tags": ["x"] * n}}
                await store.aput((*root, *namespace), f"k{n}", value, ttl=(90.0 if n == 2 else None))
        records = await _store_records(store, root)
        assert len(records) == 12, f"contract: no lock-in: the store exports every live item once ({len(records)} of 12)"
        original = await _store_view(store, root)
        async with open_endpoint("memory://", ["store"]) as memory:
            if hasattr(store, "clock"):
                memory.store.clock = store.clock
            assert await memory.store.aimport_items(records) == 12, (
                "contract: no lock-in: store items exported into the memory reference are each written once"
            )
            assert await _store_view(memory.store, root) == original, (
                "contract: no lock-in: store items exported into the memory reference must answer the same "
                "(namespaces, gets with their times, filtered search pages)"
            )
            assert await _store_records(memory.store, root) == records, (
                "contract: no lock-in: store items exported into the memory reference keep their times and TTL state"
            )
            back_root = (BACK + root[0],)
            back = [{**r, "namespace": [*back_root, *r["namespace"][1:]]} for r in await _store_records(memory.store, root)]
        assert await store.aimport_items(back) == 12, (
            "contract: no lock-in: store items imported back are each written once (12 records into fresh namespaces)"
        )
        again = [{**r, "namespace": [*root, *r["namespace"][1:]]} for r in await _store_records(store, back_root)]
        assert again == records, (
            "contract: no lock-in: store items imported back keep their namespaces, keys, values, created_at, "
            "updated_at, ttl and expiry"
        )
        assert await _store_view(store, back_root) == original, (
            "contract: no lock-in: store items imported back answer the same (namespaces, gets, search pages)"
        )
        assert await store.aimport_items(back) == 0, "contract: no lock-in: importing store items twice writes nothing"

    store_target.run(body)
