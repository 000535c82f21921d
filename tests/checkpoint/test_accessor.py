"""CheckpointStateAccessor: history limits, mutation graph, fallback, graph cache, resume/rollback."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from runstore import CheckpointStateAccessor
from runstore.checkpoint.forwarding import ForwardingSaver
from runstore.errors import CheckpointModeError, UndeclaredChannelError

from .graphs import chat_builder, contents, thread, turn

MODES = ["full", "delta"]


class CountingSaver(ForwardingSaver):
    """Records the ``limit`` of every alist call."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.limits: list[Any] = []

    async def alist(self, config: Any, *, filter: Any = None, before: Any = None, limit: Any = None):  # type: ignore[override]
        self.limits.append(limit)
        async for item in self.inner.alist(config, filter=filter, before=before, limit=limit):
            yield item


async def _chat(mode: str, saver: Any, turns: int = 3) -> tuple[Any, dict[str, Any]]:
    tid = f"t-{uuid.uuid4().hex}"
    graph = chat_builder(mode).compile(checkpointer=saver)
    cfg = thread(tid, mode)
    for i in range(turns):
        await turn(graph, cfg, f"q{i}")
    return graph, cfg


@pytest.mark.parametrize("mode", MODES)
async def test_history_limits(mode: str) -> None:
    saver = CountingSaver(InMemorySaver())
    _, cfg = await _chat(mode, saver)
    acc = CheckpointStateAccessor.bind(chat_builder(mode), saver, mode=mode, snapshot_frequency=3)
    saver.limits.clear()
    assert await acc.ahistory(cfg, 0) == [], "contract: limit=0 is empty"
    assert saver.limits == [], "limit=0 does no I/O"
    everything = await acc.ahistory(cfg, None)
    assert len(everything) == 3 * 3, "contract: None is unlimited"
    two = await acc.ahistory(cfg, 2)
    assert [s.config for s in two] == [s.config for s in everything[:2]]
    assert 2 in saver.limits, "contract: the limit is pushed down to the saver"
    with pytest.raises(ValueError):
        await acc.ahistory(cfg, -1)
    assert contents(everything[0]) == ["q0", "answer to q0", "q1", "answer to q1", "q2", "answer to q2"]


@pytest.mark.parametrize("mode", MODES)
async def test_update_replaces_wholesale_and_keeps_extra_channels(mode: str) -> None:
    saver = InMemorySaver()
    _, cfg = await _chat(mode, saver)
    # bound WITHOUT the middleware schema: todos still survives (it is on the thread)
    acc = CheckpointStateAccessor.bind(None, saver, mode=mode, snapshot_frequency=3)
    head_before = await saver.aget_tuple(cfg)
    new_cfg = await acc.aupdate(cfg, {"messages": [HumanMessage("only", id="o")]}, as_node="editor")
    after = await acc.aget(cfg)
    assert contents(after) == ["only"], "contract: Overwrite replaces the reducer channel"
    raw = await saver.aget_tuple(cfg)
    assert raw.checkpoint["channel_values"].get("todos") == ["t1", "t3", "t5"], (
        "contract: channels from extra schemas survive a mutation"
    )
    assert after.next == (), "contract: the restored head schedules no task"
    assert raw.parent_config["configurable"]["checkpoint_id"] == head_before.checkpoint["id"], (
        "contract: parent links are never broken"
    )
    assert new_cfg["configurable"]["checkpoint_id"] == raw.checkpoint["id"]
    # the real graph continues normally from the mutated head
    graph = chat_builder(mode).compile(checkpointer=saver)
    await turn(graph, cfg, "next")
    assert contents(await acc.aget(cfg)) == ["only", "next", "answer to next"]


async def test_full_mode_falls_back_to_raw_read_delta_refuses() -> None:
    saver = InMemorySaver()
    _, cfg = await _chat("full", saver)

    def broken_factory() -> Any:
        raise RuntimeError("middleware import failed")

    acc = CheckpointStateAccessor.bind(broken_factory, saver, mode="full")
    snap = await acc.aget(cfg)
    assert contents(snap)[-1] == "answer to q2", "full mode degrades to a raw saver read"
    assert snap.values["todos"] == ["t1", "t3", "t5"]
    assert len(await acc.ahistory(cfg, 2)) == 2
    delta_acc = CheckpointStateAccessor(
        broken_factory, saver, mode="delta", snapshot_frequency=3
    )
    with pytest.raises(CheckpointModeError, match="no raw fallback"):
        await delta_acc.aget(cfg)


async def test_graph_cache_bound_is_reread() -> None:
    saver = InMemorySaver()
    bound = {"max": 3}
    acc = CheckpointStateAccessor.bind(None, saver, mode="full", graph_cache_max=lambda: bound["max"])
    cfg = thread(f"t-{uuid.uuid4().hex}", "full")
    for i in range(5):
        await acc.aupdate(cfg, {"messages": [HumanMessage(str(i), id=str(i))]}, as_node=f"n{i}")
    assert acc.cached_graph_count() == 3
    bound["max"] = 1
    await acc.aupdate(cfg, {"messages": []}, as_node="last")
    assert acc.cached_graph_count() == 1, "accessor_graph_max is re-read at each eviction check"


def test_sync_api_on_stock_memory() -> None:
    saver = InMemorySaver()
    graph = chat_builder("delta").compile(checkpointer=saver)
    cfg = thread(f"t-{uuid.uuid4().hex}", "delta")
    graph.invoke({"messages": [HumanMessage("q", id="q")]}, cfg)
    acc = CheckpointStateAccessor.bind(chat_builder("delta"), saver, mode="delta", snapshot_frequency=3)
    assert contents(acc.get(cfg)) == ["q", "answer to q"]
    assert len(acc.history(cfg, 1)) == 1 and acc.history(cfg, 0) == []
    acc.update(cfg, {"todos": ["x"]})
    assert acc.get(cfg).values["todos"] == ["x"]


async def _rollback_scenario(acc: Any, graph: Any, cfg: dict[str, Any]) -> None:
    await turn(graph, cfg, "q1")
    pre_run = (await acc.aget(cfg)).config  # captured before the run
    await turn(graph, cfg, "bad")
    assert "answer to bad" in contents(await acc.aget(cfg))
    await acc.arollback(pre_run)
    await turn(graph, cfg, "good")


@pytest.mark.parametrize("mode", MODES)
async def test_rollback_superseded_answer_never_reappears(mode: str, saver_opener: Any) -> None:
    expected = ["q1", "answer to q1", "good", "answer to good"]
    cfg = thread(f"t-{uuid.uuid4().hex}", mode)
    async with saver_opener() as saver:
        graph = chat_builder(mode).compile(checkpointer=saver)
        acc = CheckpointStateAccessor.bind(chat_builder(mode), saver, mode=mode, snapshot_frequency=3)
        await _rollback_scenario(acc, graph, cfg)
        assert contents(await acc.aget(cfg)) == expected
        if mode == "delta":
            ids = [t.checkpoint["id"] async for t in saver.alist(cfg)]
            parents = [t.parent_config async for t in saver.alist(cfg)]
            linked = {p["configurable"]["checkpoint_id"] for p in parents if p}
            assert len(set(ids) - linked) == 1, "contract: delta rollback keeps one line (no fork)"
    async with saver_opener() as saver:  # reload from storage
        acc = CheckpointStateAccessor.bind(chat_builder(mode), saver, mode=mode, snapshot_frequency=3)
        assert contents(await acc.aget(cfg)) == expected, (
            "contract: the superseded answer never reappears after a reload"
        )
        assert all("answer to bad" not in contents(s) for s in (await acc.ahistory(cfg, 2)))


@pytest.mark.parametrize("mode", MODES)
async def test_resume_from_older_checkpoint(mode: str) -> None:
    saver = InMemorySaver()
    graph = chat_builder(mode).compile(checkpointer=saver)
    acc = CheckpointStateAccessor.bind(chat_builder(mode), saver, mode=mode, snapshot_frequency=3)
    cfg = thread(f"t-{uuid.uuid4().hex}", mode)
    await turn(graph, cfg, "q1")
    older = (await acc.aget(cfg)).config
    await turn(graph, cfg, "q2")
    run_cfg = await acc.aprepare_resume(older)
    if mode == "full":
        assert run_cfg["configurable"]["checkpoint_id"] == older["configurable"]["checkpoint_id"]
    else:
        assert "checkpoint_id" not in run_cfg["configurable"], "delta resumes on the head"
    await graph.ainvoke({"messages": [HumanMessage("q2b", id="h-q2b")]}, run_cfg)
    assert contents(await acc.aget(cfg)) == ["q1", "answer to q1", "q2b", "answer to q2b"]


@pytest.mark.parametrize("mode", MODES)
async def test_update_of_an_undeclared_key_is_refused(mode: str, saver_opener: Any) -> None:
    cfg = thread(f"t-{uuid.uuid4().hex}", mode)
    async with saver_opener() as saver:
        graph = chat_builder(mode).compile(checkpointer=saver)
        await turn(graph, cfg, "q1")
        acc = CheckpointStateAccessor.bind(chat_builder(mode), saver, mode=mode, snapshot_frequency=3)
        head = (await acc.aget(cfg)).config["configurable"]["checkpoint_id"]
        with pytest.raises(UndeclaredChannelError) as caught:
            await acc.aupdate(cfg, {"title": "x", "todos": ["kept"]}, as_node="editor")
        assert caught.value.key == "title"
        assert {"messages", "todos"} <= set(caught.value.declared)
        assert "'title'" in str(caught.value) and "messages" in str(caught.value)
        after = await acc.aget(cfg)
        assert after.config["configurable"]["checkpoint_id"] == head, "nothing was written"
        assert "title" not in (await graph.aget_state(cfg)).values
        # a declared key writes and reads back, through the accessor and the graph alike
        await acc.aupdate(cfg, {"todos": ["kept"]}, as_node="editor")
        assert (await acc.aget(cfg)).values["todos"] == ["kept"]
        assert (await graph.aget_state(cfg)).values["todos"] == ["kept"]
