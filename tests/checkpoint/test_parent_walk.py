"""`ParentWalkSaver` behind an adapter that hides the saver's own delta-history read (as
LangGraph's Agent Server's adapter does): a real delta graph reads exactly what it reads
on the bare saver, while the walk reads each sealed checkpoint from storage once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple

from runstore.checkpoint.forwarding import DeltaMarkingSaver
from runstore.checkpoint.walk import ParentWalkSaver
from runstore.plugins.memory.saver import MemorySaver

from .graphs import chat_builder, contents, thread


class HidingAdapter(BaseCheckpointSaver[Any]):
    """Forwards the core methods only: LangGraph's default parent walk answers delta history."""

    def __init__(self, inner: BaseCheckpointSaver[Any]) -> None:
        super().__init__(serde=inner.serde)
        self.inner = inner

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self.inner.aget_tuple(config)

    async def alist(self, config: Any, **kwargs: Any) -> AsyncIterator[CheckpointTuple]:
        async for item in self.inner.alist(config, **kwargs):
            yield item

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        return await self.inner.aput(config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: Any, writes: Sequence[Any], task_id: str, task_path: str = "") -> None:
        await self.inner.aput_writes(config, writes, task_id, task_path)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self.inner.adelete_for_runs(run_ids)

    def get_next_version(self, current: Any, channel: None) -> Any:
        return self.inner.get_next_version(current, channel)


class CountingSaver(MemorySaver):
    """Counts the reads that reach storage."""

    reads = 0

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        self.reads += 1
        return await super().aget_tuple(config)


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("turn"), st.integers(0, 0)),
        st.tuples(st.just("fork"), st.integers(0, 30)),  # a new input at an older checkpoint
        st.tuples(st.just("rerun"), st.integers(0, 30)),  # run an older checkpoint's tasks again
        st.tuples(st.just("delete_runs"), st.integers(0, 30)),
    ),
    min_size=1,
    max_size=14,
)


async def _apply(graph: Any, saver: Any, config: Any, op: tuple[str, int], n: int) -> list[Any]:
    kind, pick = op
    history = [s async for s in graph.aget_state_history(config)]
    older = history[pick % len(history)].config if history else config
    if kind == "turn" or not history:
        await graph.ainvoke({"messages": [HumanMessage(f"m{n}", id=f"h{n}")]}, config)
    elif kind == "fork":
        await graph.ainvoke({"messages": [HumanMessage(f"m{n}", id=f"h{n}")]}, older)
    elif kind == "rerun":
        await graph.ainvoke(None, older)
    else:
        run_id = history[pick % len(history)].metadata.get("run_id")
        if run_id:
            await saver.adelete_for_runs([str(run_id)])
    state = await graph.aget_state(config)
    return [contents(state), [contents(s) for s in [s async for s in graph.aget_state_history(config)]]]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS)
def test_walk_through_kept_tuples_reads_what_the_saver_holds(ops: list[tuple[str, int]]) -> None:
    async def main() -> None:
        counting = CountingSaver()
        walked = ParentWalkSaver(DeltaMarkingSaver(counting))
        served = chat_builder("delta", frequency=3).compile(checkpointer=HidingAdapter(walked))
        bare_saver = DeltaMarkingSaver(MemorySaver())
        bare = chat_builder("delta", frequency=3).compile(checkpointer=bare_saver)
        config = thread("t", "delta")
        for n, op in enumerate([("turn", 0), *ops]):
            got = await _apply(served, walked, config, op, n)
            want = await _apply(bare, bare_saver, config, op, n)
            assert got == want, f"after {op}"

    asyncio.run(main())


def test_each_sealed_checkpoint_is_read_once() -> None:
    """Over many turns the walk reads the head and the new checkpoints, not the whole
    stretch back to the last snapshot each time."""

    async def main() -> tuple[int, int]:
        counting = CountingSaver()
        walked = ParentWalkSaver(DeltaMarkingSaver(counting))
        graph = chat_builder("delta", frequency=50).compile(checkpointer=HidingAdapter(walked))
        config = thread("t", "delta")
        for n in range(30):
            await graph.ainvoke({"messages": [HumanMessage(f"m{n}", id=f"h{n}")]}, config)
        return counting.reads, walked.walk_hits

    reads, hits = asyncio.run(main())
    assert hits > reads, (reads, hits)
