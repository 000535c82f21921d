"""The mode gate and the full -> delta migration, on every saver."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from runstore import CachedHistorySaver, CheckpointStateAccessor
from runstore.checkpoint import modes
from runstore.checkpoint.forwarding import DeltaMarkingSaver
from runstore.errors import CheckpointModeMismatchError
from runstore.plugins.memory.cache import MemoryHistoryCache

from .graphs import chat_builder, contents, thread, turn


async def _count(saver: Any, thread_id: str) -> int:
    return len([t async for t in saver.alist({"configurable": {"thread_id": thread_id}})])


async def test_full_process_refuses_delta_thread_before_any_io(saver_opener: Any) -> None:
    tid = f"t-{uuid.uuid4().hex}"
    async with saver_opener() as saver:
        graph = chat_builder("delta").compile(checkpointer=saver)
        cfg = thread(tid, "delta")
        await turn(graph, cfg, "q1")
        await turn(graph, cfg, "q2")
        before = await _count(saver, tid)
        modes.reset_checkpoint_mode_for_tests()
        acc = CheckpointStateAccessor.bind(chat_builder("full"), saver, mode="full")
        full_cfg = thread(tid, "full")
        for call in (
            lambda: acc.aget(full_cfg),
            lambda: acc.ahistory(full_cfg, 5),
            lambda: acc.aupdate(full_cfg, {"todos": []}),
            lambda: acc.arestore(full_cfg),
        ):
            with pytest.raises(CheckpointModeMismatchError) as err:
                await call()
            assert err.value.thread_id == tid, "contract: the error names the thread"
        assert await _count(saver, tid) == before, "contract: the gate fires before any write"


async def test_legacy_marker_and_langgraph_counters_count_as_delta(saver_opener: Any) -> None:
    tid = f"t-{uuid.uuid4().hex}"
    async with saver_opener() as saver:
        graph = chat_builder("full").compile(checkpointer=saver)
        cfg = {"configurable": {"thread_id": tid},
               "metadata": {"deerflow_checkpoint_channel_mode": "delta"}}
        await turn(graph, cfg, "q1")
        acc = CheckpointStateAccessor.bind(chat_builder("full"), saver, mode="full")
        with pytest.raises(CheckpointModeMismatchError):
            await acc.aget(thread(tid, "full"))


@pytest.mark.parametrize("cached", [False, True], ids=["uncached", "cached"])
async def test_full_to_delta_migration_loses_nothing(saver_opener: Any, cached: bool) -> None:
    tid = f"t-{uuid.uuid4().hex}"
    async with saver_opener() as raw_saver:
        saver = (
            CachedHistorySaver(DeltaMarkingSaver(raw_saver), MemoryHistoryCache(64))
            if cached
            else raw_saver
        )
        full = chat_builder("full").compile(checkpointer=saver)
        for q in ("q1", "q2"):
            await turn(full, thread(tid, "full"), q)
        expected = ["q1", "answer to q1", "q2", "answer to q2"]
        modes.reset_checkpoint_mode_for_tests()
        acc = CheckpointStateAccessor.bind(chat_builder("delta", 2), saver, mode="delta",
                                           snapshot_frequency=2)
        cfg = thread(tid, "delta")
        assert contents(await acc.aget(cfg)) == expected, "contract: delta reads full threads"
        delta = chat_builder("delta", 2).compile(checkpointer=saver)
        for q in ("q3", "q4", "q5", "q6"):
            await turn(delta, cfg, q)
            expected += [q, f"answer to {q}"]
            assert contents(await acc.aget(cfg)) == expected, (
                "contract: no message lost after the switch (including the first one)"
            )
        head = await saver.aget_tuple({"configurable": {"thread_id": tid}})
        assert modes.is_delta_metadata(head.metadata), "contract: delta checkpoints carry the marker"
        # every delta-era history entry still materializes
        history = await acc.ahistory(cfg)
        assert contents(history[0]) == expected
        assert contents(history[-1]) == []
        # and a full-mode process is now refused
        modes.reset_checkpoint_mode_for_tests()
        acc_full = CheckpointStateAccessor.bind(chat_builder("full"), saver, mode="full")
        with pytest.raises(CheckpointModeMismatchError):
            await acc_full.aget(thread(tid, "full"))


async def test_gate_helper_for_paths_outside_the_accessor(saver_opener: Any) -> None:
    tid = f"t-{uuid.uuid4().hex}"
    async with saver_opener() as saver:
        graph = chat_builder("delta").compile(checkpointer=saver)
        await turn(graph, thread(tid, "delta"), "q1")
        cfg = {"configurable": {"thread_id": tid}}
        await modes.acheck_thread_mode(saver, cfg, "delta")  # delta reads everything
        with pytest.raises(CheckpointModeMismatchError):
            await modes.acheck_thread_mode(saver, cfg, "full")
        await modes.acheck_thread_mode(saver, {"configurable": {"thread_id": "t-none"}}, "full")


def test_sync_gate_on_stock_memory() -> None:
    from langgraph.checkpoint.memory import InMemorySaver

    saver = InMemorySaver()
    graph = chat_builder("delta").compile(checkpointer=saver)
    tid = f"t-{uuid.uuid4().hex}"
    from langchain_core.messages import HumanMessage

    graph.invoke({"messages": [HumanMessage("q", id="q")]}, thread(tid, "delta"))
    acc = CheckpointStateAccessor.bind(chat_builder("full"), saver, mode="full")
    with pytest.raises(CheckpointModeMismatchError):
        acc.get(thread(tid, "full"))
    with pytest.raises(CheckpointModeMismatchError):
        acc.history(thread(tid, "full"), 3)
    with pytest.raises(CheckpointModeMismatchError):
        acc.update(thread(tid, "full"), {"todos": []})


@pytest.mark.parametrize("frequency", [2, 5])
async def test_cached_delta_graph_materializes_like_uncached(
    saver_opener: Any, frequency: int
) -> None:
    """Graph parity through the cache on every saver (catches write/put ordering races)."""
    tid = f"t-{uuid.uuid4().hex}"
    async with saver_opener() as raw_saver:
        cached = CachedHistorySaver(DeltaMarkingSaver(raw_saver), MemoryHistoryCache(32))
        graph = chat_builder("delta", frequency).compile(checkpointer=cached)
        plain = chat_builder("delta", frequency).compile(checkpointer=raw_saver)
        cfg = thread(tid, "delta")
        expected: list[str] = []
        for i in range(7):
            await turn(graph, cfg, f"q{i}")
            expected += [f"q{i}", f"answer to q{i}"]
            assert contents(await graph.aget_state(cfg)) == expected, (
                "contract: cached delta history equals the uncached walk"
            )
            assert contents(await plain.aget_state(cfg)) == expected
        assert cached.stats()["cache_errors"] == 0
