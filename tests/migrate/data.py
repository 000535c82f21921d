"""Data the migration tests write and compare: real graphs in both modes, forks, a
namespace, pending writes with special slots, event feeds with owners."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import HumanMessage
from langgraph.checkpoint.base import empty_checkpoint

from runstore.conformance.savers_graph import build_graph
from runstore.migrate.savers import read_thread

THREADS = {"full": "thread-full", "delta": "thread-delta"}


async def write_graph_threads(saver: Any, *, delta: bool = True, full: bool = True, turns: int = 4, prefix: str = "") -> list[str]:
    """Run real graphs: a full-mode and a delta-mode (f=3) thread with a fork each; return the ids."""
    written = []
    for mode in ("full", "delta"):
        if (mode == "delta" and not delta) or (mode == "full" and not full):
            continue
        thread_id = prefix + THREADS[mode]
        graph = build_graph(mode, 3, saver)
        config = {"configurable": {"thread_id": thread_id}, "metadata": {"runstore_checkpoint_channel_mode": mode} if mode == "delta" else {}}
        for turn in range(turns):
            await graph.ainvoke({"messages": [HumanMessage(f"{mode} turn {turn}", id=f"{mode}-h{turn}")]}, config)
        history = [s async for s in graph.aget_state_history({"configurable": {"thread_id": thread_id}})]
        fork_at = history[len(history) // 2].config
        await graph.aupdate_state(fork_at, {"messages": [HumanMessage("forked", id=f"{mode}-fork")]})
        written.append(thread_id)
    return written


async def write_namespace_and_writes(saver: Any, thread_id: str = "thread-ns") -> None:
    """A root and a child namespace written by hand, with pending writes in special slots."""
    parent = None
    for ns in ("", "child:1"):
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"topic": f"hello {ns}"}
        checkpoint["channel_versions"] = {"topic": "1"}
        configurable: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ns}
        stored = await saver.aput({"configurable": configurable}, checkpoint, {"source": "input", "step": 0}, {"topic": "1"})
        parent = stored
        await saver.aput_writes(stored, [("topic", "next"), ("other", {"k": [1, 2]})], "task-b", "")
        await saver.aput_writes(stored, [("__error__", "boom"), ("__interrupt__", [{"value": "ask"}])], "task-a", "")
    assert parent is not None


async def write_events(store: Any, threads: tuple[str, ...] = ("thread-full", "thread-delta", "events-only")) -> None:
    """Feeds over two runs with messages and traces, two owners."""
    for thread_id in threads:
        for run in ("run-1", "run-2"):
            await store.put(thread_id=thread_id, run_id=run, event_type="human", category="message",
                            content={"id": f"{run}-m", "content": "hi"}, user_id="alice")  # fmt: skip
            await store.put(thread_id=thread_id, run_id=run, event_type="ai", category="message",
                            content={"id": f"{run}-a", "content": "hello"}, user_id="bob")  # fmt: skip
            await store.put(thread_id=thread_id, run_id=run, event_type="step", category="trace",
                            content="trace text", metadata={"task_id": "t1"}, user_id=None)  # fmt: skip
    # A gap in the seqs (a deleted run) must survive: seqs are copied, not renumbered.
    await store.delete_by_run("events-only", "run-1", user_id=None)


async def saver_view(saver: Any, thread_id: str) -> list[Any]:
    """What a thread holds, comparable across savers (records loaded with the saver's serde)."""
    out = []
    for record in await read_thread(saver, thread_id):
        load = lambda blob: saver.serde.loads_typed((blob.type, blob.data))  # noqa: E731
        checkpoint = load(record.checkpoint)
        checkpoint.pop("ts", None)
        out.append((record.checkpoint_ns, record.checkpoint_id, record.parent_id, checkpoint, load(record.metadata),
                    {k: load(v) for k, v in record.values.items()},
                    [(w.task_id, w.channel, load(w.value)) for w in record.writes]))  # fmt: skip
    return out


async def graph_view(saver: Any, thread_id: str, mode: str) -> Any:
    """What LangGraph answers for the thread: state, the whole history, the delta history."""
    graph = build_graph(mode, 3, saver)
    config = {"configurable": {"thread_id": thread_id}}
    state = await graph.aget_state(config)
    history = [(s.config["configurable"]["checkpoint_id"], [(m.id, m.content) for m in s.values.get("messages", [])],
                s.next, s.metadata.get("step")) async for s in graph.aget_state_history(config)]  # fmt: skip
    head = state.config
    delta = await saver.aget_delta_channel_history(config=head, channels=["messages"]) if mode == "delta" else {}
    delta_view = {ch: [(w[0], w[1], str(w[2])) for w in entry["writes"]] for ch, entry in delta.items()}
    return [(m.id, m.content) for m in state.values.get("messages", [])], history, delta_view


async def event_view(store: Any, thread_id: str) -> list[dict[str, Any]]:
    """Every event of the thread with seq, created_at and owner."""
    return [dict(r) for r in await store.aexport_events(thread_id, limit=10_000)]
