"""MemorySaver specifics beyond the conformance suite, and the saverbase helpers."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.serde.base import CipherProtocol
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from runstore.checkpoint import modes
from runstore.checkpoint.rules import (
    is_last_write_wins,
    reconstruction_ancestors,
    worth_prefetching,
    write_slot,
)
from runstore.conformance.savers_graph import build_graph, view
from runstore.conformance.savers_model import config_for, make_checkpoint, new_checkpoint_id
from runstore.errors import InvalidURLError, SyncCallOnEventLoopError
from runstore.options import BackendOptions
from runstore.plugins.memory.saver import MemorySaver
from runstore.twins import ensure_off_loop, run_sync
from runstore.urls import BackendURL


@pytest.fixture(autouse=True)
def _reset_modes() -> Any:
    yield
    modes.reset_checkpoint_mode_for_tests()


async def _open(url: str = "memory://") -> MemorySaver:
    async with BackendOptions.scope() as options:
        return await MemorySaver.open(BackendURL.parse(url), options)


async def test_open_rejects_url_options() -> None:
    with pytest.raises(InvalidURLError, match="accepts: no options"):
        await _open("memory://?pool=3")


def test_versions_are_increasing_strings() -> None:
    saver = MemorySaver()
    first = saver.get_next_version(None, None)
    second = saver.get_next_version(first, None)
    assert isinstance(first, str) and isinstance(second, str)
    assert first < second
    assert saver.get_next_version(7, None).startswith(f"{8:032d}.")  # type: ignore[arg-type]


async def _chat(saver: MemorySaver, mode: str, frequency: int, thread: str, turns: int) -> Any:
    graph = build_graph(mode, frequency, saver)
    config = {"configurable": {"thread_id": thread}}
    for i in range(turns):
        await graph.ainvoke({"messages": [HumanMessage(f"m{i}", id=f"h{i}")]}, config)
    return graph, config


@pytest.mark.parametrize("frequency", [3, 100])
async def test_prune_keep_latest_on_a_delta_graph_keeps_the_state(frequency: int) -> None:
    saver = MemorySaver()
    graph, config = await _chat(saver, "delta", frequency, "t1", 7)
    before = view((await graph.aget_state(config)).values["messages"])
    total = len([c async for c in saver.alist(config)])
    await saver.aprune(["t1"])
    after = view((await graph.aget_state(config)).values["messages"])
    assert after == before and len(after) == 14
    kept = len([c async for c in saver.alist(config)])
    assert kept < total if frequency < 7 else kept <= total
    # The thread keeps working after the prune.
    await graph.ainvoke({"messages": [HumanMessage("again", id="h-again")]}, config)
    assert len((await graph.aget_state(config)).values["messages"]) == 16


async def test_prune_keep_latest_on_a_full_graph_keeps_one_checkpoint() -> None:
    saver = MemorySaver()
    graph, config = await _chat(saver, "full", 10, "t1", 4)
    before = view((await graph.aget_state(config)).values["messages"])
    await saver.aprune(["t1"])
    assert len([c async for c in saver.alist(config)]) == 1
    assert view((await graph.aget_state(config)).values["messages"]) == before


async def test_prune_rejects_unknown_strategy() -> None:
    with pytest.raises(ValueError, match="keep_latest, delete"):
        await MemorySaver().aprune(["t"], strategy="oldest")


async def test_delete_for_runs_rolls_back_the_last_run() -> None:
    saver = MemorySaver()
    graph = build_graph("delta", 100, saver)
    config: Any = {"configurable": {"thread_id": "t"}}
    await graph.ainvoke({"messages": [HumanMessage("a", id="a")]}, {**config, "run_id": None})
    first_head = (await graph.aget_state(config)).config["configurable"]["checkpoint_id"]
    run = "00000000-0000-4000-8000-000000000001"
    await graph.ainvoke(
        {"messages": [HumanMessage("b", id="b")]},
        {**config, "metadata": {"run_id": run}},
    )
    assert len((await graph.aget_state(config)).values["messages"]) == 4
    await saver.adelete_for_runs([run])
    state = await graph.aget_state(config)
    assert state.config["configurable"]["checkpoint_id"] == first_head
    assert [m.id for m in state.values["messages"]] == ["a", "ai-a"]


async def test_copy_thread_into_an_existing_thread_merges() -> None:
    saver = MemorySaver()
    a, b = new_checkpoint_id(), new_checkpoint_id()
    await saver.aput(config_for("src"), make_checkpoint(a, {}, {}), {"step": 1}, {})
    await saver.aput(config_for("dst"), make_checkpoint(b, {}, {}), {"step": 2}, {})
    await saver.acopy_thread("src", "dst")
    assert [c.checkpoint["id"] async for c in saver.alist(config_for("dst"))] == [b, a]


class _XorCipher(CipherProtocol):
    def encrypt(self, plaintext: bytes) -> tuple[str, bytes]:
        return "xor", bytes(x ^ 0x5A for x in plaintext)

    def decrypt(self, ciphername: str, ciphertext: bytes) -> bytes:
        assert ciphername == "xor"
        return bytes(x ^ 0x5A for x in ciphertext)


async def test_encrypted_serde_round_trips_and_stores_ciphertext() -> None:
    saver = MemorySaver(serde=EncryptedSerializer(_XorCipher(), JsonPlusSerializer()))
    cid = new_checkpoint_id()
    v = saver.get_next_version(None, None)
    cfg = await saver.aput(
        config_for("t"), make_checkpoint(cid, {"k": "secret-value"}, {"k": v}), {}, {"k": v}
    )
    await saver.aput_writes(cfg, [("k", "secret-write")], "task")
    stored = saver._threads["t"][""]
    assert all(b"secret" not in blob[1] for blob in stored.blobs.values() if blob is not None)
    got = await saver.aget_tuple(cfg)
    assert got is not None
    assert got.checkpoint["channel_values"] == {"k": "secret-value"}
    assert got.pending_writes == [("task", "k", "secret-write")]


def test_write_slots() -> None:
    assert write_slot("messages", 3) == 3
    assert write_slot("__error__", 3) == -1
    assert is_last_write_wins(write_slot("__interrupt__", 0))
    assert not is_last_write_wins(0)


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        (None, True),
        ({}, True),
        ({"counters_since_delta_snapshot": {"m": [3, 256]}}, True),
        ({"counters_since_delta_snapshot": {"m": [3, 257]}}, False),
        ({"counters_since_delta_snapshot": {"a": [1, 2], "m": [900, 1400]}}, False),
        ({"counters_since_delta_snapshot": {"m": "junk"}}, True),
        ({"counters_since_delta_snapshot": [1, 2]}, True),
    ],
)
def test_worth_prefetching_reads_supersteps_since_the_snapshot(
    metadata: dict[str, Any] | None, expected: bool
) -> None:
    assert worth_prefetching(metadata) is expected


def test_reconstruction_ancestors_stop_per_channel() -> None:
    parents = {"d": "c", "c": "b", "b": "a", "a": None}
    valued = {"a": {"x", "y"}, "b": {"y"}, "c": set(), "d": set()}
    chain = reconstruction_ancestors("d", ["x", "y"], parents.get, lambda i: valued[i])
    assert chain == ["c", "b", "a"]
    assert reconstruction_ancestors("d", ["y"], parents.get, lambda i: valued[i]) == ["c", "b"]
    assert reconstruction_ancestors("d", [], parents.get, lambda i: valued[i]) == []


async def test_ensure_off_loop_raises_on_the_loop_thread_only() -> None:
    loop = asyncio.get_running_loop()
    with pytest.raises(SyncCallOnEventLoopError, match=r"await Saver\.aget_tuple"):
        ensure_off_loop(loop, "get_tuple", "Saver")
    await asyncio.to_thread(ensure_off_loop, loop, "get_tuple", "Saver")
    ensure_off_loop(None, "get_tuple", "Saver")


async def test_run_sync_runs_on_the_saver_loop_from_another_thread() -> None:
    loop = asyncio.get_running_loop()

    async def where() -> int:
        return threading.get_ident()

    ident = await asyncio.to_thread(run_sync, loop, where, "get_tuple", "Saver")
    assert ident == threading.get_ident()
    with pytest.raises(SyncCallOnEventLoopError):
        run_sync(loop, where, "get_tuple", "Saver")


def test_run_sync_refuses_a_stopped_loop() -> None:
    loop = asyncio.new_event_loop()
    try:

        async def nothing() -> None:
            return None

        with pytest.raises(RuntimeError, match="not running"):
            run_sync(loop, nothing, "get_tuple", "Saver")
    finally:
        loop.close()


def test_sync_twins_from_many_threads_stay_consistent() -> None:
    saver = MemorySaver()
    errors: list[BaseException] = []

    def writer(thread: str) -> None:
        try:
            parent = None
            for _ in range(150):
                cid = new_checkpoint_id()
                saver.put(config_for(thread, parent), make_checkpoint(cid, {}, {}), {}, {})
                saver.put_writes(config_for(thread, cid), [("x", 1), ("y", 2)], "t")
                parent = cid
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def reader() -> None:
        try:
            for _ in range(60):
                for item in saver.list(None, limit=50):
                    assert item.pending_writes is not None
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    workers = [threading.Thread(target=writer, args=(f"t{i}",)) for i in range(4)]
    workers += [threading.Thread(target=reader) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors, errors
    for i in range(4):
        assert len(list(saver.list(config_for(f"t{i}")))) == 150


async def test_a_carried_value_without_a_stored_blob_is_kept() -> None:
    saver = MemorySaver()
    cid = new_checkpoint_id()
    v = saver.get_next_version(None, None)
    cfg = await saver.aput(config_for("t"), make_checkpoint(cid, {"k": [1]}, {"k": v}), {}, {})
    got = await saver.aget_tuple(cfg)
    assert got is not None and got.checkpoint["channel_values"] == {"k": [1]}
