"""The retention contract (capability ``retention``), as generated tests.

A saver declaring ``retention`` applies a `RetentionPolicy` in claimed batches
(``asweep``): it removes what ``keep_last`` and ``max_age`` allow, expires threads idle
past ``idle_ttl`` whole, and never removes what a resume or a kept checkpoint's delta
reconstruction needs; a dry run reports what a real sweep removes and changes nothing
(docs/threads.md). Assertion messages name the contract that broke.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.serde.types import INTERRUPT, RESUME

from runstore.checkpoint.policy import RetentionPolicy, SweepBatch
from runstore.clock import ManualClock
from runstore.errors import InvalidSaverInputError, ThreadDeletedError

from .savers_model import (
    Tree,
    checkpoint_trees,
    config_for,
    fold,
    make_checkpoint,
    named,
    new_checkpoint_id,
    new_thread_id,
    write_tree,
)

Saver = BaseCheckpointSaver[Any]
START = datetime(2030, 1, 1, tzinfo=UTC)

pytestmark = pytest.mark.requires("retention")


class TickingClock(ManualClock):
    """A clock one second later at every reading: every put gets its own time."""

    def __call__(self) -> datetime:
        return self.advance(1)


async def sweep_all(saver: Saver, policy: RetentionPolicy, **kwargs: Any) -> list[SweepBatch]:
    """Every batch of one sweep pass."""
    batches: list[SweepBatch] = []
    after = None
    while True:
        batch = await saver.asweep(policy, after=after, **kwargs)  # type: ignore[attr-defined]
        batches.append(batch)
        if batch.cursor is None:
            return batches
        after = batch.cursor


async def _ids(saver: Saver, thread: str, ns: str | None = None) -> set[str]:
    """The stored checkpoint ids of a thread (of one namespace, or of all)."""
    configurable = {"thread_id": thread} if ns is None else {"thread_id": thread, "checkpoint_ns": ns}
    return {
        t.config["configurable"]["checkpoint_id"]
        async for t in saver.alist({"configurable": configurable})
    }


async def _state(saver: Saver, tree: Tree, index: int) -> tuple[Any, ...]:
    """What loading one checkpoint gives: values, metadata, pending writes and the fold of
    each delta channel's history (what LangGraph rebuilds the channel from)."""
    got = await saver.aget_tuple(tree.config(index))
    assert got is not None
    channels = tree.unvalued(index)
    history = await saver.aget_delta_channel_history(config=tree.config(index), channels=channels)
    return (
        got.checkpoint["channel_values"],
        {k: v for k, v in got.metadata.items() if k != "writes"},
        [tuple(w) for w in got.pending_writes or []],
        {ch: fold(h) for ch, h in history.items()},
    )


async def _parent_id(saver: Saver, config: Any) -> str | None:
    """The checkpoint id ``parent_config`` of the checkpoint at ``config`` names."""
    got = await saver.aget_tuple(config)
    assert got is not None
    return (got.parent_config or {}).get("configurable", {}).get("checkpoint_id")


def _closure(tree: Tree, keep: set[int]) -> set[int]:
    """``keep`` and, until closed, every ancestor a kept node's reconstruction reads."""
    out: set[int] = set()
    todo = list(keep)
    while todo:
        i = todo.pop()
        if i not in out:
            out.add(i)
            todo.extend(tree.needed_ancestors(i))
    return out


policies = st.builds(
    lambda keep_last, aged: (RetentionPolicy(keep_last=keep_last, max_age=60 if aged else None), aged),
    st.one_of(st.none(), st.integers(1, 4)),
    st.booleans(),
)


def test_retention_keeps_resumes_and_delta_reconstruction(saver_target: Any) -> None:
    """On generated histories (forks, delta channels snapshotted at random points, pending
    writes, interrupts on the head, a subgraph namespace) and random policies, a sweep
    keeps exactly the newest ``keep_last`` (none past ``max_age``), the head of every
    namespace and what their delta reconstruction reads; every kept checkpoint loads to
    the same values, metadata, pending writes and delta history as before."""
    with saver_target.session() as session:

        @given(
            spec=checkpoint_trees(max_nodes=8),
            child=st.one_of(st.none(), checkpoint_trees(max_nodes=4)),
            policy_aged=policies,
            interrupts=st.lists(st.sampled_from([INTERRUPT, RESUME]), max_size=3),
        )
        def check(spec: Any, child: Any, policy_aged: Any, interrupts: list[str]) -> None:
            policy, aged = policy_aged

            async def body() -> None:
                saver = session.backend
                clock = TickingClock(START)
                saver.clock = clock
                thread = new_thread_id()
                trees = [await write_tree(saver, spec, thread)]
                if child is not None:
                    trees.append(await write_tree(saver, child, thread, "child:1"))
                root = trees[0]
                head = max(range(len(root.nodes)), key=lambda i: root.nodes[i].id)
                for i, channel in enumerate(interrupts):
                    # A human-in-the-loop chain: interrupts and resume values on the head.
                    await saver.aput_writes(root.config(head), [(channel, f"v{i}")], f"hitl{i}", "")
                    root.nodes[head].writes.put(f"hitl{i}", "", [(channel, f"v{i}")])
                before = {
                    (t.ns, i): await _state(saver, t, i) for t in trees for i in range(len(t.nodes))
                }
                if aged:
                    clock.advance(3600)
                note(f"policy={policy} aged={aged}")
                dry = await sweep_all(saver, policy, dry_run=True, thread_ids=[thread])
                assert {t.ns: await _ids(saver, thread, t.ns) for t in trees} == {
                    t.ns: {n.id for n in t.nodes} for t in trees
                }, "contract: a dry run removes nothing"
                batches = await sweep_all(saver, policy, thread_ids=[thread])
                assert sum((b.removed for b in batches[1:]), batches[0].removed) == sum(
                    (b.removed for b in dry[1:]), dry[0].removed
                ), "contract: a dry run reports what the sweep removes"
                for tree in trees:
                    ids = [n.id for n in tree.nodes]
                    order = sorted(range(len(ids)), key=lambda i: ids[i])
                    newest = set(order if policy.keep_last is None else order[-policy.keep_last :])
                    wanted = {order[-1]} if aged else newest | {order[-1]}
                    expected = {ids[i] for i in _closure(tree, wanted)}
                    left = await _ids(saver, thread, tree.ns)
                    missing = expected - left
                    assert not missing, named(
                        f"namespace {tree.ns!r}: {len(missing)} checkpoint(s) gone that the policy "
                        "keeps or a kept checkpoint's delta reconstruction reads (contract: "
                        "retention never deletes a needed delta ancestor)"
                    )
                    assert left <= expected, (
                        f"namespace {tree.ns!r}: {sorted(left - expected)} kept (contract: a sweep "
                        "removes what keep_last / max_age allow)"
                    )
                    for i, node in enumerate(tree.nodes):
                        if node.id not in left:
                            continue
                        now = await _state(saver, tree, i)
                        was = before[(tree.ns, i)]
                        assert now[2] == was[2], named(
                            f"namespace {tree.ns!r} node {i}: pending writes {now[2]} != {was[2]} "
                            "(contract: retention keeps a kept checkpoint's pending writes: the "
                            "interrupts and resume values a resume needs)"
                        )
                        assert now[3] == was[3], named(
                            f"namespace {tree.ns!r} node {i}: delta history {now[3]} != {was[3]} "
                            "(contract: retention never breaks a kept checkpoint's delta "
                            "reconstruction)"
                        )
                        assert now[:2] == was[:2], (
                            f"namespace {tree.ns!r} node {i}: values changed (contract: every "
                            "kept checkpoint loads to the same values)"
                        )
                        parent = tree.nodes[node.parent].id if node.parent is not None else None
                        expected_parent = parent if parent in left else None
                        got_parent = await _parent_id(saver, tree.config(i))
                        assert got_parent == expected_parent, named(
                            f"namespace {tree.ns!r} node {i}: parent {got_parent} != "
                            f"{expected_parent} (contract: a kept checkpoint names its parent while "
                            "it is stored, and no parent once it was removed)"
                        )
                info = await saver.aget_thread(thread)
                assert info is not None and info.latest_checkpoint_id == root.nodes[head].id, (
                    "contract: the thread record names the same latest checkpoint after a sweep"
                )
                assert info.checkpoints == len(await _ids(saver, thread)), (
                    "contract: a sweep keeps the thread record's counts exact"
                )
                await saver.adelete_thread(thread)

            session.run(body())

        check()


def test_a_kept_checkpoint_whose_parent_went_has_no_parent(saver_target: Any) -> None:
    """After a sweep (``keep_last`` or ``max_age``), the oldest kept checkpoint of a chain
    reads back as a root (no ``parent_config``), from ``get_tuple`` and ``list`` alike: a
    parent that cannot be loaded is never named. Links between kept checkpoints stay."""

    async def body(saver: Saver) -> None:
        clock = TickingClock(START)
        saver.clock = clock  # type: ignore[attr-defined]
        chains: dict[str, list[str]] = {}
        for thread in (new_thread_id(), new_thread_id()):
            parent = None
            chains[thread] = []
            for _ in range(5):
                cid = new_checkpoint_id()
                await saver.aput(config_for(thread, parent), make_checkpoint(cid, {}, {}), {}, {})
                chains[thread].append(cid)
                parent = cid
        kept_last, aged = chains
        await sweep_all(saver, RetentionPolicy(keep_last=2), thread_ids=[kept_last])
        clock.advance(3600)
        await sweep_all(saver, RetentionPolicy(max_age=60), thread_ids=[aged])
        for thread, kept in ((kept_last, chains[kept_last][-2:]), (aged, chains[aged][-1:])):
            assert await _ids(saver, thread) == set(kept)
            expected = [None, *kept[:-1]]
            got = [await _parent_id(saver, config_for(thread, cid)) for cid in kept]
            assert got == expected, named(
                f"get_tuple parents {got} != {expected} (contract: a kept checkpoint whose "
                "parent a sweep removed has no parent_config)"
            )
            listed = {
                t.checkpoint["id"]: (t.parent_config or {}).get("configurable", {}).get("checkpoint_id")
                async for t in saver.alist(config_for(thread))
            }
            assert listed == dict(zip(kept, expected, strict=True)), named(
                f"list parents {listed} (contract: a kept checkpoint whose parent a sweep "
                "removed has no parent_config)"
            )
            await saver.adelete_thread(thread)

    saver_target.run(body)


def test_idle_threads_expire_whole(saver_target: Any) -> None:
    """A thread idle past ``idle_ttl`` goes whole: every checkpoint and write, a tombstone
    refusing late writes, and it is handed to the sweeper's cleanup until marked done;
    a thread written meanwhile stays; a dry run reports the same and changes nothing."""

    async def body(saver: Saver) -> None:
        clock = ManualClock(START)
        saver.clock = clock  # type: ignore[attr-defined]
        idle, busy = new_thread_id(), new_thread_id()
        for thread in (idle, busy):
            parent = None
            for _ in range(3):
                cid = new_checkpoint_id()
                await saver.aput(config_for(thread, parent), make_checkpoint(cid, {"a": 1}, {"a": "1"}), {}, {"a": "1"})
                parent = cid
            await saver.aput_writes(config_for(thread, parent), [("a", 2)], "task", "")
        clock.advance(50)
        await saver.aput(
            config_for(busy, parent), make_checkpoint(new_checkpoint_id(), {}, {}), {}, {}
        )
        clock.advance(60)
        # A timedelta is accepted (documented); the field is typed as the seconds it becomes.
        policy = RetentionPolicy(idle_ttl=timedelta(seconds=100))  # type: ignore[arg-type]
        only = [idle, busy]
        dry = await sweep_all(saver, policy, dry_run=True, thread_ids=only)
        assert [t.thread_id for b in dry for t in b.threads if t.expired] == [idle]
        assert await saver.aget_thread(idle) is not None, "contract: a dry run changes nothing"  # type: ignore[attr-defined]
        [batch] = await sweep_all(saver, policy, thread_ids=only)
        expired = {t.thread_id: t for t in batch.threads}
        assert expired[idle].expired and expired[idle].removed.threads == 1, (
            "contract: a thread idle past idle_ttl expires"
        )
        dry_idle = [t for b in dry for t in b.threads if t.thread_id == idle]
        assert dry_idle[0].removed == expired[idle].removed, (
            "contract: a dry run reports what the sweep removes"
        )
        assert (expired[idle].removed.checkpoints, expired[idle].removed.writes) == (3, 1), (
            "contract: expiry removes the whole thread"
        )
        assert busy not in expired or not expired[busy].expired, (
            "contract: a thread written within idle_ttl does not expire"
        )
        assert batch.cleanup == [idle], "contract: an expired thread is handed to cleanup"
        assert await saver.aget_thread(idle) is None  # type: ignore[attr-defined]
        assert await _ids(saver, idle) == set()
        with pytest.raises(ThreadDeletedError):
            await saver.aput_writes(config_for(idle, "x"), [("a", 1)], "late", "")
        [again] = await sweep_all(saver, policy, thread_ids=only)
        assert again.cleanup == [idle], "contract: cleanup is handed out again until marked done"
        await saver.afinish_cleanup([idle])  # type: ignore[attr-defined]
        [done] = await sweep_all(saver, policy, thread_ids=only)
        assert done.cleanup == [] and not done.threads, "contract: finished cleanups stay done"
        await saver.adelete_thread(busy)

    saver_target.run(body)


def test_a_touch_restarts_the_idle_ttl(saver_target: Any) -> None:
    """``atouch_thread`` (a read the app counts as activity) restarts ``idle_ttl`` like a
    write; an unknown or deleted thread answers False."""

    async def body(saver: Saver) -> None:
        clock = ManualClock(START)
        saver.clock = clock  # type: ignore[attr-defined]
        thread = new_thread_id()
        await saver.aput(config_for(thread), make_checkpoint(new_checkpoint_id(), {}, {}), {}, {})
        policy = RetentionPolicy(idle_ttl=100)
        clock.advance(90)
        assert await saver.atouch_thread(thread) is True  # type: ignore[attr-defined]
        assert await saver.atouch_thread(new_thread_id()) is False  # type: ignore[attr-defined]
        clock.advance(90)
        [kept] = await sweep_all(saver, policy, thread_ids=[thread])
        assert not any(t.expired for t in kept.threads), "contract: atouch_thread restarts idle_ttl"
        clock.advance(20)
        [gone] = await sweep_all(saver, policy, thread_ids=[thread])
        assert [t.expired for t in gone.threads] == [True], "contract: the TTL runs from the touch"
        assert await saver.atouch_thread(thread) is False  # type: ignore[attr-defined]

    saver_target.run(body)


def test_overrides_stored_with_the_thread(saver_target: Any) -> None:
    """Per-thread overrides win over the policy (``None`` lifts a limit), read back with
    the thread, survive a sweep, and bad overrides raise InvalidSaverInputError."""

    async def body(saver: Saver) -> None:
        saver.clock = ManualClock(START)  # type: ignore[attr-defined]
        threads = [new_thread_id() for _ in range(3)]
        for thread in threads:
            parent = None
            for _ in range(5):
                cid = new_checkpoint_id()
                await saver.aput(config_for(thread, parent), make_checkpoint(cid, {}, {}), {}, {})
                parent = cid
        await saver.aset_thread_retention(threads[1], {"keep_last": None})  # type: ignore[attr-defined]
        await saver.aset_thread_retention(threads[2], {"keep_last": 1})  # type: ignore[attr-defined]
        info = await saver.aget_thread(threads[2])  # type: ignore[attr-defined]
        assert info.retention == {"keep_last": 1}, "contract: overrides read back with the thread"
        await sweep_all(saver, RetentionPolicy(keep_last=3), thread_ids=threads)
        counts = [len(await _ids(saver, t)) for t in threads]
        assert counts == [3, 5, 1], f"{counts} (contract: per-thread overrides win)"
        for bad in ({"keep_last": 0}, {"keep": 1}, {"max_age": -1}, {"idle_ttl": "1d"}, [1]):
            with pytest.raises(InvalidSaverInputError):
                await saver.aset_thread_retention(threads[0], bad)  # type: ignore[attr-defined]
        early = new_thread_id()
        await saver.aset_thread_retention(early, {"max_age": 60})  # type: ignore[attr-defined]
        await saver.aput(config_for(early), make_checkpoint(new_checkpoint_id(), {}, {}), {}, {})
        got = await saver.aget_thread(early)  # type: ignore[attr-defined]
        assert got is not None and got.retention == {"max_age": 60.0} and got.checkpoints == 1, (
            "contract: overrides set before a thread's first checkpoint stay with it"
        )
        await saver.adelete_thread(early)
        await saver.aset_thread_retention(threads[2], None)  # type: ignore[attr-defined]
        assert (await saver.aget_thread(threads[2])).retention is None  # type: ignore[attr-defined]
        await saver.adelete_thread(threads[0])
        with pytest.raises(ThreadDeletedError):
            await saver.aset_thread_retention(threads[0], {"keep_last": 2})  # type: ignore[attr-defined]
        for thread in threads[1:]:
            await saver.adelete_thread(thread)

    saver_target.run(body)


def _hitl_graph(mode: str, frequency: int, saver: Saver) -> Any:
    """A chat graph whose review step asks a human twice (two interrupts in one node)."""
    from langchain_core.messages import HumanMessage
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt

    from runstore.checkpoint.modes import get_thread_state_schema

    from .savers_graph import agent_reply

    def agent(state: Any) -> dict[str, Any]:
        return {"messages": agent_reply(state.get("messages") or [])}

    def review(state: Any) -> dict[str, Any]:
        first = interrupt(f"ok? ({len(state['messages'])})")
        second = interrupt(f"sure? {first}")
        return {"messages": [HumanMessage(f"{first}/{second}", id=f"r-{first}-{second}")]}

    builder: StateGraph[Any] = StateGraph(get_thread_state_schema(mode, frequency))
    builder.add_node("agent", agent)
    builder.add_node("review", review)
    builder.add_edge(START, "agent")
    builder.add_edge("agent", "review")
    builder.add_edge("review", END)
    return builder.compile(checkpointer=saver)


def test_resume_after_retention_behaves_like_before(saver_target: Any) -> None:
    """A human-in-the-loop thread (two interrupts per turn, full and delta channels at
    random snapshot frequencies) swept with ``keep_last`` after every step resumes exactly
    like an unswept twin: the same interrupts, the same final messages."""
    from langchain_core.messages import HumanMessage
    from langgraph.types import Command

    from .savers_graph import FREQUENCIES, thread_config, view

    with saver_target.session() as session:

        @settings(max_examples=min(6, settings().max_examples), deadline=None)
        @given(
            mode=st.sampled_from(["full", "delta"]),
            frequency=st.sampled_from(FREQUENCIES),
            keep_last=st.integers(1, 3),
            turns=st.integers(1, 3),
        )
        def check(mode: str, frequency: int, keep_last: int, turns: int) -> None:
            async def body() -> None:
                saver = session.backend
                graph = _hitl_graph(mode, frequency, saver)
                swept, twin = new_thread_id("hitl"), new_thread_id("hitl")
                policy = RetentionPolicy(keep_last=keep_last)
                seen: dict[str, list[Any]] = {swept: [], twin: []}
                for turn in range(turns):
                    steps: list[Any] = [
                        {"messages": [HumanMessage(f"hi {turn}", id=f"h{turn}")]},
                        Command(resume=f"a{turn}"),
                        Command(resume=f"b{turn}"),
                    ]
                    for step in steps:
                        for thread in (swept, twin):
                            out = await graph.ainvoke(step, thread_config(thread, mode))
                            seen[thread].append(
                                [i.value for i in out.get("__interrupt__", [])]
                            )
                        await sweep_all(saver, policy, thread_ids=[swept])
                assert seen[swept] == seen[twin], named(
                    f"interrupts {seen[swept]} != {seen[twin]} (contract: a resume after "
                    "retention behaves like one before: the human-in-the-loop chain resumes)"
                )
                got = await graph.aget_state(thread_config(swept, mode))
                want = await graph.aget_state(thread_config(twin, mode))
                assert view(got.values["messages"]) == view(want.values["messages"]), named(
                    "final messages differ (contract: a resume after retention behaves like "
                    "one before)"
                )
                left = await _ids(saver, swept, "")
                # (A delta thread keeps what its head rebuilds from: maybe everything.)
                assert len(left) < len(await _ids(saver, twin, "")) or mode == "delta", (
                    "contract: keep_last removed older checkpoints"
                )
                await saver.adelete_thread(swept)
                await saver.adelete_thread(twin)

            session.run(body())

        check()


def test_a_kept_checkpoint_keeps_the_whole_reconstruction_closure(saver_target: Any) -> None:
    """Three delta channels snapshotted at different steps of one chain: the head rebuilds
    one channel from two ancestors, and those ancestors rebuild the others from further
    back. ``keep_last=1`` keeps that whole closure (every checkpoint a kept one's delta
    reconstruction reads, again and again), loading as before, and removes the rest."""
    from .savers_model import NodeSpec, TreeSpec

    every = [("task-a", "", ["a", "b", "c"])]
    spec = TreeSpec(
        channels=["a", "b", "c"],
        nodes=[
            NodeSpec(None, {"a": "plain", "b": "plain", "c": "plain"}, every),
            NodeSpec(0, {"a": "snapshot", "b": "snapshot", "c": "snapshot"}, every),
            NodeSpec(1, {"a": "delta", "b": "delta", "c": "snapshot"}, every),
            NodeSpec(2, {"a": "snapshot", "b": "delta", "c": "delta"}, every),
            NodeSpec(3, {"a": "delta", "b": "delta", "c": "delta"}, every),
            NodeSpec(4, {"a": "delta", "b": "snapshot", "c": "snapshot"}, every),
        ],
        target=5,
        query=["a", "b", "c"],
    )

    async def body(saver: Saver) -> None:
        saver.clock = TickingClock(START)  # type: ignore[attr-defined]
        thread = new_thread_id()
        tree = await write_tree(saver, spec, thread)
        head = max(range(len(tree.nodes)), key=lambda i: tree.nodes[i].id)
        closure = _closure(tree, {head})
        assert closure == {1, 2, 3, 4, 5}, f"the suite's own premise: closure {closure}"
        before = {i: await _state(saver, tree, i) for i in closure}
        await sweep_all(saver, RetentionPolicy(keep_last=1), thread_ids=[thread])
        left = await _ids(saver, thread)
        missing = sorted(i for i in closure if tree.nodes[i].id not in left)
        assert not missing, named(
            f"nodes {missing} of the chain 0..5 gone (head 5 rebuilds a from 4 and 3; 4 rebuilds "
            "b from 3, 2 and 1) (contract: retention keeps the whole reconstruction closure of "
            "every kept checkpoint)"
        )
        for i in sorted(closure):
            assert await _state(saver, tree, i) == before[i], named(
                f"node {i} loads differently after the sweep (contract: retention keeps the "
                "whole reconstruction closure of every kept checkpoint)"
            )
        assert tree.nodes[0].id not in left, (
            "contract: a sweep removes what keep_last allows (node 0: nothing kept reads it)"
        )
        await saver.adelete_thread(thread)

    saver_target.run(body)


def test_an_idle_thread_is_swept_again_as_time_passes(saver_target: Any) -> None:
    """No write after the first sweep: as ``max_age`` passes for each older checkpoint, the
    next sweep removes it (a checkpoint exactly ``max_age`` old stays, one microsecond
    older goes); as ``idle_ttl`` passes, the next sweep expires the thread (exactly
    ``idle_ttl`` idle is expired, one microsecond less is not). The sweep's own "due
    again" bookkeeping brings the thread back; nothing else touches it."""

    async def body(saver: Saver) -> None:
        clock = ManualClock(START)
        saver.clock = clock  # type: ignore[attr-defined]
        thread, idle = new_thread_id(), new_thread_id()
        ids = []
        parent = None
        for step in range(4):  # created at +0, +5, +10, +15 s
            cid = new_checkpoint_id()
            await saver.aput(config_for(thread, parent), make_checkpoint(cid, {"a": step}, {}), {}, {})
            ids.append(cid)
            parent = cid
            if step < 3:
                clock.advance(5)
        aged = RetentionPolicy(max_age=10)
        micro = timedelta(microseconds=1)
        steps = [
            (timedelta(0), set(ids[1:]), "at +15 s the checkpoint of +0 is past max_age=10, +5 is exactly 10 s old"),
            (micro, set(ids[2:]), "one microsecond later +5 is past max_age"),
            (timedelta(seconds=5) - micro, set(ids[2:]), "at +20 s +10 is exactly max_age old"),
            (micro, set(ids[3:]), "one microsecond later +10 is past max_age; the head always stays"),
        ]
        for delta, expected, when in steps:
            clock.advance(delta.total_seconds())
            await sweep_all(saver, aged, thread_ids=[thread])
            left = await _ids(saver, thread)
            assert left == expected, named(
                f"{when}: {len(left)} checkpoints left, {len(expected)} expected (contract: an idle "
                "thread is swept again as max_age passes for more of its checkpoints)"
            )
        # idle_ttl: the thread is due again when it expires, with no write in between.
        clock.set(START)
        await saver.aput(config_for(idle), make_checkpoint(new_checkpoint_id(), {}, {}), {}, {})
        await saver.aput(config_for(idle), make_checkpoint(new_checkpoint_id(), {}, {}), {}, {})
        ttl = RetentionPolicy(keep_last=1, idle_ttl=60)
        await sweep_all(saver, ttl, thread_ids=[idle])  # trims to one, not idle yet
        clock.advance(60 - 1e-6)
        await sweep_all(saver, ttl, thread_ids=[idle])
        assert await saver.aget_thread(idle) is not None, (  # type: ignore[attr-defined]
            "contract: a thread idle one microsecond less than idle_ttl is not expired"
        )
        clock.advance(1e-6)
        await sweep_all(saver, ttl, thread_ids=[idle])
        assert await saver.aget_thread(idle) is None, named(  # type: ignore[attr-defined]
            "contract: an idle thread is swept again and expires once idle_ttl passes (idle exactly "
            "idle_ttl, no write since its last sweep)"
        )
        await saver.adelete_thread(thread)

    saver_target.run(body)


def test_a_rescan_sweeps_threads_already_swept_under_a_changed_policy(saver_target: Any) -> None:
    """A thread swept under one policy and not written since is swept under a stricter
    one at once when the sweep asks ``rescan=True`` (a changed policy reaching threads
    already swept: docs/threads.md "Several sweepers")."""

    async def body(saver: Saver) -> None:
        clock = ManualClock(START)
        saver.clock = clock  # type: ignore[attr-defined]
        thread = new_thread_id()
        ids: list[str] = []
        parent = None
        for step in range(4):
            cid = new_checkpoint_id()
            await saver.aput(config_for(thread, parent), make_checkpoint(cid, {"a": step}, {}), {}, {})
            ids.append(cid)
            parent = cid
            clock.advance(1)
        await sweep_all(saver, RetentionPolicy(keep_last=3), thread_ids=[thread])
        assert await _ids(saver, thread) == set(ids[1:]), "contract: a sweep keeps the keep_last newest"
        clock.advance(1)
        await sweep_all(saver, RetentionPolicy(keep_last=1), thread_ids=[thread], rescan=True)
        left = await _ids(saver, thread)
        assert left == {ids[-1]}, named(
            f"{len(left)} checkpoints left, 1 expected (contract: rescan=True sweeps threads already "
            "swept, under the changed policy, with no write since)"
        )
        await saver.adelete_thread(thread)

    saver_target.run(body)
