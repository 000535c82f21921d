"""What each layer does when full-mode and delta-mode writers share a thread, on every saver.

The rule (docs/checkpoint-modes.md, "Mixing modes on one thread"): a graph run is never
gated; whichever mode writes a checkpoint decides what that checkpoint stores, and
LangGraph rebuilds a `messages` channel from the delta history whatever its annotation, so
a full-mode graph appending to a delta thread reads the whole history and turns the thread
back to full. Only the accessor and `acheck_thread_mode` refuse a full-mode caller, and
only while the thread's head is a delta checkpoint.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

import runstore
from runstore import CheckpointStateAccessor
from runstore.checkpoint import modes
from runstore.checkpoint.forwarding import DeltaMarkingSaver, ForwardingSaver, unwrap_saver
from runstore.errors import CheckpointModeMismatchError

from .graphs import chat_builder, contents, thread, turn


async def _head(saver: Any, tid: str) -> Any:
    return await saver.aget_tuple({"configurable": {"thread_id": tid}})


def _answers(*texts: str) -> list[str]:
    return [m for q in texts for m in (q, f"answer to {q}")]


async def test_a_full_writer_on_a_delta_thread_reads_everything_and_makes_it_full(saver_opener: Any) -> None:
    tid = f"t-{uuid.uuid4().hex}"
    async with saver_opener() as saver:
        delta = chat_builder("delta", 3).compile(checkpointer=saver)
        full = chat_builder("full").compile(checkpointer=saver)
        for q in ("q1", "q2"):
            await turn(delta, thread(tid, "delta"), q)
        assert modes.is_delta_metadata((await _head(saver, tid)).metadata)

        # While the head is a delta checkpoint, the gated layers refuse a full-mode caller.
        acc_full = CheckpointStateAccessor.bind(chat_builder("full"), saver, mode="full")
        with pytest.raises(CheckpointModeMismatchError):
            await acc_full.aget(thread(tid, "full"))
        with pytest.raises(CheckpointModeMismatchError):
            await modes.acheck_thread_mode(saver, {"configurable": {"thread_id": tid}}, "full")

        # A full-mode graph run is not gated: LangGraph rebuilds `messages` from the delta
        # history, the turn appends, and the new head stores the whole list, unmarked.
        await turn(full, thread(tid, "full"), "q3")
        assert contents(await full.aget_state(thread(tid, "full"))) == _answers("q1", "q2", "q3"), (
            "contract: a full-mode graph on a delta thread reads the whole history"
        )
        head = await _head(saver, tid)
        assert not modes.is_delta_metadata(head.metadata), "contract: a full write leaves an unmarked head"
        assert [m.content for m in head.checkpoint["channel_values"]["messages"]] == _answers("q1", "q2", "q3")

        # The thread is full again: the full-mode accessor and gate accept it.
        await modes.acheck_thread_mode(saver, {"configurable": {"thread_id": tid}}, "full")
        assert contents(await acc_full.aget(thread(tid, "full"))) == _answers("q1", "q2", "q3")

        # And a delta writer takes it back (the migration path), losing nothing.
        await turn(delta, thread(tid, "delta"), "q4")
        acc_delta = CheckpointStateAccessor.bind(chat_builder("delta", 3), saver, mode="delta", snapshot_frequency=3)
        assert contents(await acc_delta.aget(thread(tid, "delta"))) == _answers("q1", "q2", "q3", "q4")
        assert modes.is_delta_metadata((await _head(saver, tid)).metadata)


def test_inject_checkpoint_mode_marks_or_unmarks_and_checks_nothing() -> None:
    marked = runstore.inject_checkpoint_mode({"configurable": {"thread_id": "t"}}, "delta")
    assert marked["metadata"] == {modes.MODE_METADATA_KEY: "delta"}
    unmarked = runstore.inject_checkpoint_mode(marked, "full")
    assert modes.MODE_METADATA_KEY not in unmarked["metadata"], "full mode strips the marker"
    assert modes.MODE_METADATA_KEY in marked["metadata"], "the given config is not changed"


def _layers(saver: Any) -> list[Any]:
    """``saver`` and every saver it forwards to, outermost first."""
    layers = [saver]
    while isinstance(layers[-1], ForwardingSaver):
        layers.append(layers[-1].inner)
    return layers


async def test_runstore_open_wraps_only_in_delta_mode_and_gates_no_graph_run(tmp_path: Path) -> None:
    """On one sqlite file: a store opened in delta mode marks every checkpoint, one opened
    in full mode hands out the bare saver, and neither refuses the other's threads."""
    url = f"sqlite:///{tmp_path / 'modes.db'}"
    delta_cfg = {"checkpoint_channel_mode": "delta", "checkpoint_delta": {"snapshot_frequency": 3}}
    cfg = {"configurable": {"thread_id": "t1"}}
    async with runstore.open(delta_cfg, checkpointer=url) as stores:
        assert any(isinstance(layer, DeltaMarkingSaver) for layer in _layers(stores.checkpointer))
        graph = chat_builder("delta", 3).compile(checkpointer=stores.checkpointer)
        await turn(graph, cfg, "q1")  # no inject_checkpoint_mode: the wrapper marks
        assert modes.is_delta_metadata((await _head(stores.checkpointer, "t1")).metadata)
    async with runstore.open({"checkpoint_channel_mode": "full"}, checkpointer=url) as stores:
        assert stores.checkpointer is unwrap_saver(stores.checkpointer), "full mode: no wrapper"
        graph = chat_builder("full").compile(checkpointer=stores.checkpointer)
        await turn(graph, cfg, "q2")
        assert contents(await graph.aget_state(cfg)) == _answers("q1", "q2")
    async with runstore.open(delta_cfg, checkpointer=url) as stores:
        graph = chat_builder("delta", 3).compile(checkpointer=stores.checkpointer)
        await turn(graph, cfg, "q3")
        assert contents(await graph.aget_state(cfg)) == _answers("q1", "q2", "q3")
