"""Fenced saver writes (capability ``fencing``), as generated tests.

A write whose config carries ``configurable.runstore_fence`` (a run store lease's
fencing token) is refused with `StaleFenceError`, and stores nothing, once the thread
has seen a newer token (from a write or ``afence_thread``); the check is one step with
the write. A write without a token behaves as before (docs/runs.md, "Fenced writes").
Assertion messages name the contract that broke.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver

from runstore.checkpoint.rules import FENCE_KEY
from runstore.errors import InvalidSaverInputError

from .fencing_workers import (
    Attempt,
    fenced_config,
    fresh_writer,
    landed,
    refused_as_stale,
    stale_writer,
    write_once,
)
from .savers_model import config_for, make_checkpoint, new_checkpoint_id, new_thread_id
from .session import development_plugins

Saver = BaseCheckpointSaver[Any]

pytestmark = pytest.mark.requires("fencing")



async def _root(saver: Saver, thread: str, fence: int | None = 1) -> str:
    cid = new_checkpoint_id()
    config = config_for(thread) if fence is None else fenced_config(thread, fence)
    await saver.aput(config, make_checkpoint(cid, {}, {}), {}, {})
    return cid


async def _snapshot(saver: Saver, thread: str) -> list[tuple[str, list[Any]]]:
    """The thread's checkpoints (ids) with their pending writes, newest first."""
    out = []
    async for item in saver.alist(config_for(thread)):
        writes = sorted((w[0], w[1], repr(w[2])) for w in item.pending_writes or [])
        out.append((item.config["configurable"]["checkpoint_id"], writes))
    return out


def test_stale_token_is_refused_and_writes_nothing(saver_target: Any) -> None:
    """put, put_writes and delete_thread carrying an older token than the thread has seen
    raise StaleFenceError and change nothing; equal and newer tokens, and writes without
    a token, go through."""

    async def body(saver: Saver) -> None:
        thread = new_thread_id()
        root = await _root(saver, thread, fence=1)
        child = new_checkpoint_id()
        await saver.aput(fenced_config(thread, 3, root), make_checkpoint(child, {}, {}), {}, {})
        before = await _snapshot(saver, thread)
        raised = await refused_as_stale(
            saver.aput(
                fenced_config(thread, 2, child),
                make_checkpoint(new_checkpoint_id(), {}, {}),
                {},
                {},
            ),
            "put",
        )
        assert (raised.fence, raised.current, raised.thread_id) == (2, 3, thread), (
            "contract: StaleFenceError names the thread, the stale token and the thread's fence; "
            f"got {raised!r}"
        )
        await refused_as_stale(
            saver.aput_writes(fenced_config(thread, 1, child), [("x", 1)], "late", ""), "put_writes"
        )
        await refused_as_stale(saver.adelete_thread(thread, fence=2), "delete_thread")  # type: ignore[call-arg]
        assert await _snapshot(saver, thread) == before, (
            "contract: a write refused for a stale token stores nothing (put, put_writes, "
            "delete_thread)"
        )
        # The current token, a newer one, and no token at all are accepted.
        await saver.aput_writes(fenced_config(thread, 3, child), [("x", 3)], "same", "")
        await saver.aput_writes(fenced_config(thread, 4, child), [("x", 4)], "newer", "")
        await saver.aput_writes(config_for(thread, child), [("x", 0)], "unfenced", "")
        tasks = {w[0] for w in (await _snapshot(saver, thread))[0][1]}
        assert tasks == {"same", "newer", "unfenced"}, (
            "contract: writes carrying the thread's current or a newer token, and writes "
            f"without a token, are stored; got tasks {sorted(tasks)}"
        )
        await refused_as_stale(
            saver.aput_writes(fenced_config(thread, 3, child), [("x", 5)], "older", ""),
            "put_writes",
        )
        await saver.adelete_thread(thread, fence=4)  # type: ignore[call-arg]
        assert await _snapshot(saver, thread) == [], "contract: a fenced delete_thread deletes"
        await refused_as_stale(
            saver.aput(
                fenced_config(thread, 3), make_checkpoint(new_checkpoint_id(), {}, {}), {}, {}
            ),
            "put",
        )
        assert await _snapshot(saver, thread) == [], (
            "contract: the fence survives delete_thread: a stale write does not start the thread again"
        )

    saver_target.run(body)


def test_fence_thread_closes_older_tokens_out(saver_target: Any) -> None:
    """afence_thread raises the fence without writing; older tokens are refused from then on,
    also on a thread that has no checkpoint yet; lowering it is refused."""

    async def body(saver: Saver) -> None:
        thread, empty = new_thread_id(), new_thread_id()
        root = await _root(saver, thread, fence=1)
        before = await _snapshot(saver, thread)
        await saver.afence_thread(thread, 5)  # type: ignore[attr-defined]
        assert await _snapshot(saver, thread) == before, (
            "contract: afence_thread writes no checkpoint"
        )
        await refused_as_stale(
            saver.aput_writes(fenced_config(thread, 4, root), [("x", 1)], "t", ""), "put_writes"
        )
        await refused_as_stale(saver.afence_thread(thread, 4), "afence_thread")  # type: ignore[attr-defined]
        await saver.afence_thread(empty, 7)  # type: ignore[attr-defined]
        assert await saver.aget_tuple(config_for(empty)) is None, (
            "contract: afence_thread on a thread without checkpoints creates none"
        )
        await refused_as_stale(
            saver.aput(
                fenced_config(empty, 6), make_checkpoint(new_checkpoint_id(), {}, {}), {}, {}
            ),
            "put",
        )
        await saver.aput(
            fenced_config(empty, 7), make_checkpoint(new_checkpoint_id(), {}, {}), {}, {}
        )

    saver_target.run(body)


def _ns_config(thread: str, fence: int, checkpoint_id: str | None, ns: str) -> Any:
    config = config_for(thread, checkpoint_id, ns)
    config["configurable"][FENCE_KEY] = fence
    return config


async def _ns_snapshot(saver: Saver, thread: str, ns: str) -> list[tuple[str, list[Any]]]:
    """One namespace's checkpoints (ids) with their pending writes, newest first."""
    out = []
    async for item in saver.alist(config_for(thread, None, ns)):
        writes = sorted((w[0], w[1], repr(w[2])) for w in item.pending_writes or [])
        out.append((item.config["configurable"]["checkpoint_id"], writes))
    return out


def test_stale_token_is_refused_in_every_namespace(saver_target: Any) -> None:
    """The fence is the thread's, whatever ``checkpoint_ns`` a write names: a subgraph's
    put and pending writes (in a namespace that holds checkpoints and in a new one)
    carrying a token one below the newest are refused and store nothing, and a newer
    token carried by a subgraph write fences the root namespace too."""

    async def body(saver: Saver) -> None:
        thread = new_thread_id()
        root = await _root(saver, thread, fence=3)
        sub = new_checkpoint_id()
        await saver.aput(_ns_config(thread, 3, None, "child:1"), make_checkpoint(sub, {}, {}), {}, {})
        before = {ns: await _ns_snapshot(saver, thread, ns) for ns in ("", "child:1", "child:2")}
        await refused_as_stale(
            saver.aput(_ns_config(thread, 2, sub, "child:1"), make_checkpoint(new_checkpoint_id(), {}, {}), {}, {}),
            "put in a subgraph namespace (checkpoint_ns='child:1')",
        )
        await refused_as_stale(
            saver.aput(_ns_config(thread, 2, None, "child:2"), make_checkpoint(new_checkpoint_id(), {}, {}), {}, {}),
            "the first put of a new subgraph namespace (checkpoint_ns='child:2')",
        )
        await refused_as_stale(
            saver.aput_writes(_ns_config(thread, 2, sub, "child:1"), [("x", 1)], "late", ""),
            "put_writes in a subgraph namespace (checkpoint_ns='child:1')",
        )
        after = {ns: await _ns_snapshot(saver, thread, ns) for ns in before}
        assert after == before, (
            "contract: fencing: a subgraph write refused for a stale token stores nothing"
        )
        # A newer token arriving through a subgraph write raises the thread's fence.
        await saver.aput_writes(_ns_config(thread, 5, sub, "child:1"), [("x", 5)], "newer", "")
        await refused_as_stale(
            saver.aput_writes(fenced_config(thread, 4, root), [("x", 4)], "old", ""),
            "put_writes in the root namespace after a subgraph write carried a newer token",
        )
        await refused_as_stale(
            saver.aput(fenced_config(thread, 4, root), make_checkpoint(new_checkpoint_id(), {}, {}), {}, {}),
            "put in the root namespace after a subgraph write carried a newer token",
        )

    saver_target.run(body)


@pytest.mark.parametrize("bad", [0, -1, True, 1.0, "3", 2**63])
def test_bad_token_is_an_input_error(saver_target: Any, bad: Any) -> None:
    """A token that is not an int from 1 to 2**63-1 raises InvalidSaverInputError naming the
    config key; nothing is written."""

    async def body(saver: Saver) -> None:
        thread = new_thread_id()
        with pytest.raises(InvalidSaverInputError, match="runstore_fence"):
            await saver.aput(
                fenced_config(thread, bad), make_checkpoint(new_checkpoint_id(), {}, {}), {}, {}
            )
        assert await saver.aget_tuple(config_for(thread)) is None, (
            "contract: a put with a malformed token stores nothing"
        )

    saver_target.run(body)


def test_sync_twins_are_fenced(saver_target: Any) -> None:
    """The synchronous put/put_writes/delete_thread refuse a stale token like the async ones."""
    saver_target.require("sync_api")

    async def body(saver: Saver) -> None:
        thread = new_thread_id()
        root = await _root(saver, thread, fence=2)
        before = await _snapshot(saver, thread)
        await refused_as_stale(
            asyncio.to_thread(
                saver.put,
                fenced_config(thread, 1, root),
                make_checkpoint(new_checkpoint_id(), {}, {}),
                {},
                {},
            ),
            "put (sync)",
        )
        await refused_as_stale(
            asyncio.to_thread(
                saver.put_writes, fenced_config(thread, 1, root), [("x", 1)], "t", ""
            ),
            "put_writes (sync)",
        )
        await refused_as_stale(
            # fence= is runstore's extension of LangGraph's delete_thread (capability fencing).
            asyncio.to_thread(saver.delete_thread, thread, fence=1),  # type: ignore[call-arg]
            "delete_thread (sync)",
        )
        assert await _snapshot(saver, thread) == before, "contract: sync twins refuse stale tokens"

    saver_target.run(body)


def test_fenced_graph_run(saver_target: Any) -> None:
    """A LangGraph graph run with the token in its config is fenced end to end: after a newer
    token, a run with the old one fails with StaleFenceError and leaves the thread as it was."""
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph

    class State(TypedDict):
        n: int

    def step(state: State) -> State:
        return {"n": state["n"] + 1}

    async def body(saver: Saver) -> None:
        builder = StateGraph(State)
        builder.add_node("step", step)
        builder.add_edge(START, "step")
        builder.add_edge("step", END)
        graph = builder.compile(checkpointer=saver)
        thread = new_thread_id()
        out = await graph.ainvoke({"n": 1}, fenced_config(thread, 1))
        assert out == {"n": 2}
        before = await _snapshot(saver, thread)
        await saver.afence_thread(thread, 2)  # type: ignore[attr-defined]
        await refused_as_stale(graph.ainvoke({"n": 10}, fenced_config(thread, 1)), "a graph run")
        assert await _snapshot(saver, thread) == before, (
            "contract: a graph run carrying a stale token stores no checkpoint and no write"
        )
        out = await graph.ainvoke({"n": 10}, fenced_config(thread, 2))
        assert out == {"n": 11}, "contract: the current token's run proceeds"

    saver_target.run(body)


def _check_race(old: list[Attempt], new: list[Attempt], seen: list[str], where: str) -> None:
    """``seen``: what had landed right after the newer token's first write was acknowledged."""
    odd = [a for a in old + new if a[2] not in ("ok", "stale")]
    assert not odd, f"a racing writer failed unexpectedly ({where}): {odd[:3]}"
    assert all(a[2] == "ok" for a in new), (
        f"contract: writes carrying the newest token are never refused ({where}): {new}"
    )
    after_new = [a for a in old if a[2] == "ok" and a[3] not in set(seen)]
    assert not after_new, (
        f"contract: fencing: no write carrying a stale token lands after a newer token was "
        f"written ({where}): {len(after_new)} acknowledged writes of the stale token were not "
        f"stored when the newer token's first write was acknowledged, e.g. attempt {after_new[0][0]}"
    )
    late = [a for a in old if a[1] and a[2] == "ok"]
    assert not late, (
        f"contract: fencing: no write carrying a stale token lands after a newer token was "
        f"written ({where}): {len(late)} landed, e.g. attempt {late[0][0]}"
    )
    first_refused = next((a[0] for a in old if a[2] == "stale"), None)
    after = [a for a in old if first_refused is not None and a[0] > first_refused and a[2] == "ok"]
    assert not after, (
        f"contract: fencing: once a token is refused it stays refused ({where}): attempt "
        f"{after[0][0] if after else ''} landed after attempt {first_refused} was refused"
    )


def _check_stored(
    stored: list[tuple[str, list[Any]]],
    root: str,
    old: list[Attempt],
    new: list[Attempt],
    where: str,
) -> None:
    acked = {a[3] for a in old + new if a[2] == "ok"}
    ids = {cid for cid, _ in stored}
    tasks = {w[0] for cid, writes in stored if cid == root for w in writes}
    landed = (ids - {root}) | tasks
    assert landed == acked, (
        f"contract: fencing: exactly the acknowledged writes are stored ({where}): "
        f"refused but stored {sorted(landed - acked)[:5]}, acknowledged but missing "
        f"{sorted(acked - landed)[:5]}"
    )


async def _race_round(saver: Saver, yields: int, where: str) -> None:
    """One in-process race: the newer writer starts after ``yields`` turns of the loop."""
    thread = new_thread_id()
    root = await _root(saver, thread, fence=1)
    fenced = asyncio.Event()

    async def old_writer() -> list[Attempt]:
        attempts: list[Attempt] = []
        refused = i = 0
        while refused < 6 and i < 2000:
            after = fenced.is_set()
            outcome, wrote = await write_once(saver, thread, root, 1, i, "old")
            attempts.append((i, after, outcome, wrote))
            refused += outcome != "ok"
            i += 1
            await asyncio.sleep(0)
        return attempts

    async def new_writer() -> tuple[list[Attempt], list[str]]:
        attempts: list[Attempt] = []
        seen: list[str] = []
        for _ in range(yields):
            await asyncio.sleep(0)
        for i in range(11):
            outcome, wrote = await write_once(saver, thread, root, 2, i, "new")
            attempts.append((i, True, outcome, wrote))
            if i == 0:
                fenced.set()
                seen = await landed(saver, thread, root)
        return attempts, seen

    old, (new, seen) = await asyncio.gather(old_writer(), new_writer())
    _check_race(old, new, seen, where)
    _check_stored(await _snapshot(saver, thread), root, old, new, where)


def test_fence_race_in_one_process(saver_target: Any) -> None:
    """A writer with token 1 keeps writing while another writes with token 2: no write of
    token 1 lands after token 2's first write was acknowledged."""

    async def body(saver: Saver) -> None:
        for round_ in range(3):
            await _race_round(saver, 3 + round_ * 5, f"coroutines, round {round_}")

    saver_target.run(body)


@pytest.mark.requires("cross_process")
def test_fence_race_across_processes(saver_target: Any, request: pytest.FixtureRequest) -> None:
    """Two OS processes write one thread, the second with a newer token after a head start
    of the first: no write of the older token that began after the newer token's first
    write was acknowledged lands, and exactly the acknowledged writes are stored."""
    url = saver_target.url.render(hide_password=False)
    plugins = development_plugins(request.config)
    ctx = multiprocessing.get_context("spawn")
    for head_start in (0.0, 0.2):
        thread = new_thread_id()
        root = saver_target.run(lambda saver, t=thread: _root(saver, t, fence=1))
        with ctx.Manager() as manager:
            fenced, wrote, barrier = manager.Event(), manager.Event(), manager.Barrier(2)
            with ProcessPoolExecutor(max_workers=2, mp_context=ctx) as pool:
                old_f = pool.submit(
                    stale_writer, url, plugins, thread, root, 1, fenced, wrote, barrier
                )
                new_f = pool.submit(
                    fresh_writer, url, plugins, thread, root, 2, fenced, wrote, barrier, head_start
                )
                old, (new, seen) = old_f.result(timeout=300), new_f.result(timeout=300)
        where = f"2 processes, head start {head_start}s"
        _check_race(old, new, seen, where)
        assert any(a[2] == "ok" for a in old), (
            f"the stale writer never wrote before the newer token ({where}); the race proves nothing"
        )
        stored = saver_target.run(lambda saver, t=thread: _snapshot(saver, t))
        _check_stored(stored, root, old, new, where)
