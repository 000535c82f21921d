"""The checkpoint saver contract, as generated tests.

Every test takes ``saver_target`` (see `runstore.conformance.harness`). Tests that
need an optional capability are marked ``@pytest.mark.requires(...)``. Assertion
messages name the contract that broke.

Why one module of this size: pytest collects a suite per module, and one module per
kind is what ``-k test_savers``, `runstore check` and the broken-backend runner select;
the model and graph helpers live in ``savers_model``, ``savers_graph`` and
``savers_metadata``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.serde.base import maybe_add_typed_methods
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT, RESUME, SCHEDULED, _DeltaSnapshot

from runstore.errors import SyncCallOnEventLoopError

from .processes import plugins_env
from .savers_graph import (
    FREQUENCIES,
    SCENARIOS,
    GraphModel,
    agent_reply,
    build_graph,
    input_batch,
    scenario_ops,
    thread_config,
    view,
)
from .savers_metadata import metadata_and_filters, reference_match
from .savers_model import (
    COUNTERS_KEY,
    EMPTY,
    KINDS,
    MISSING_CHANNEL,
    PATHS,
    ROOT_KINDS,
    TASKS,
    NodeSpec,
    SaverModel,
    Stored,
    Tree,
    TreeSpec,
    WritesModel,
    as_metadata,
    checkpoint_trees,
    config_for,
    describe_history_mismatch,
    fold,
    make_checkpoint,
    named,
    new_checkpoint_id,
    new_thread_id,
    write_tree,
    write_tree_sync,
)
from .session import development_plugins

Saver = BaseCheckpointSaver[Any]


async def _collect(saver: Saver, config: Any, **kwargs: Any) -> list[Any]:
    return [item async for item in saver.alist(config, **kwargs)]


def _ids(items: list[Any]) -> list[str]:
    return [item.config["configurable"]["checkpoint_id"] for item in items]


def _norm_writes(writes: Any) -> list[tuple[Any, ...]]:
    return [tuple(w) for w in writes or []]


async def _check_node(
    saver: Saver,
    tree: Tree,
    index: int,
    thread_id: str | None = None,
    *,
    parent_gone: bool = False,
    writes_contract: str = (
        "pending_writes in writes_sort_key order; first write wins per (task_id, idx), special "
        "negative slots: last write wins"
    ),
) -> None:
    """get_tuple of one node matches the model: values, parent, metadata, pending writes."""
    node = tree.nodes[index]
    got = await saver.aget_tuple(tree.config(index, thread_id))
    assert got is not None, f"contract: get_tuple finds stored checkpoint {node.id} (node {index})"
    assert got.config["configurable"]["checkpoint_id"] == node.id, (
        "contract: get_tuple returns the config of the checkpoint it found"
    )
    assert got.config["configurable"].get("checkpoint_ns", "") == tree.ns, (
        named(f"node {index}: config {got.config['configurable']} (contract: get_tuple returns the "
        "config of the checkpoint it found, with its checkpoint_ns)")
    )
    if got.parent_config is not None:
        assert got.parent_config["configurable"].get("checkpoint_ns", "") == tree.ns, (
            named(f"node {index}: parent_config {got.parent_config['configurable']} (contract: "
            "parent_config names the parent in the same checkpoint_ns)")
        )
    assert got.checkpoint["channel_values"] == tree.channel_values(index), (
        named(f"node {index}: channel_values {got.checkpoint['channel_values']!r} != "
        f"{tree.channel_values(index)!r} (contract: channel_values are exactly what was put at "
        "each channel's version; a value is never carried forward from an older version)")
    )
    assert got.checkpoint["channel_versions"] == node.versions, (
        "contract: channel_versions come back as put"
    )
    expected_parent = tree.nodes[node.parent].id if node.parent is not None and not parent_gone else None
    got_parent = (got.parent_config or {}).get("configurable", {}).get("checkpoint_id")
    assert got_parent == expected_parent, (
        named(f"node {index}: parent {got_parent} != {expected_parent} (contract: parent_config is the "
        "checkpoint named by the config passed to put while it is stored, none once it was deleted)")
    )
    for key, value in node.metadata.items():
        assert got.metadata.get(key) == value, f"contract: metadata[{key!r}] round-trips"
    assert _norm_writes(got.pending_writes) == node.writes.ordered(), (
        named(f"node {index}: pending_writes {got.pending_writes!r} != {node.writes.ordered()!r} "
        f"(contract: {writes_contract})")
    )


def _check_history(tree: Tree, index: int, channels: list[str], got: Mapping[str, Any]) -> None:
    expected = tree.history(index, channels)
    normalized = {
        ch: {**dict(entry), "writes": _norm_writes(entry.get("writes"))} for ch, entry in got.items()
    }
    problem = describe_history_mismatch(tree, index, normalized, expected)
    if not problem:
        for ch in channels:
            entry = normalized.get(ch)
            exp = expected[ch]
            if entry is None or entry["writes"] != exp["writes"] or (
                ("seed" in entry, entry.get("seed")) != ("seed" in exp, exp.get("seed"))
            ):
                problem = f"channel {ch!r}: {entry!r} != {exp!r} (contract: delta history)"
                break
    assert not problem, named(f"{problem}\n{tree.spec.describe()}")


# --------------------------------------------------------------------------- basics


def test_put_then_get_roundtrip(saver_target: Any) -> None:
    """A put checkpoint comes back by id and as the latest, with metadata and values."""

    async def body(saver: Saver) -> None:
        thread = new_thread_id()
        early, first, second = new_checkpoint_id(), new_checkpoint_id(), new_checkpoint_id()
        v1 = saver.get_next_version(None, None)
        values = {"messages": ["hi", {"k": [1, 2.5, None]}], "count": 3}
        cfg = await saver.aput(
            config_for(thread),
            make_checkpoint(first, values, {"messages": v1, "count": v1}),
            as_metadata({"source": "input", "step": -1, "custom": "x"}),
            {"messages": v1, "count": v1},
        )
        assert cfg["configurable"]["checkpoint_id"] == first, (
            "contract: put returns the config of the stored checkpoint"
        )
        assert cfg["configurable"]["thread_id"] == thread
        v2 = saver.get_next_version(v1, None)
        await saver.aput(
            cfg,
            make_checkpoint(second, {**values, "count": 4}, {"messages": v1, "count": v2}),
            {"source": "loop", "step": 0},
            {"count": v2},
        )
        latest = await saver.aget_tuple(config_for(thread))
        assert latest is not None and latest.checkpoint["id"] == second, (
            "contract: get_tuple without checkpoint_id returns the latest checkpoint"
        )
        assert latest.checkpoint["channel_values"] == {**values, "count": 4}, (
            "contract: unchanged channels resolve to the value stored at their version"
        )
        assert latest.parent_config is not None
        assert latest.parent_config["configurable"]["checkpoint_id"] == first
        one = await saver.aget_tuple(config_for(thread, first))
        assert one is not None and one.checkpoint["channel_values"] == values
        assert one.metadata.get("custom") == "x" and one.metadata.get("step") == -1
        assert one.parent_config is None, "contract: a root checkpoint has no parent_config"
        assert await saver.aget_tuple(config_for(thread, new_checkpoint_id())) is None, (
            "contract: get_tuple of an unknown checkpoint id is None"
        )
        assert await saver.aget_tuple(config_for(new_thread_id())) is None, (
            "contract: get_tuple of an unknown thread is None"
        )
        other_ns = await saver.aget_tuple(config_for(thread, ns="child:1"))
        assert other_ns is None, "contract: checkpoint namespaces are separate"
        # Written last, but its id is the oldest (another process, a copy): not the latest.
        await saver.aput(config_for(thread, second), make_checkpoint(early, values, {"messages": v1, "count": v1}),
                         {"source": "loop", "step": 1}, {})
        latest = await saver.aget_tuple(config_for(thread))
        assert latest is not None and latest.checkpoint["id"] == second, (
            "contract: the latest checkpoint is the one with the highest checkpoint id, not the last "
            f"written (got {latest.checkpoint['id'] if latest else None})"
        )
        listed = _ids(await _collect(saver, config_for(thread)))
        assert listed == [second, first, early], (
            f"contract: list returns checkpoints newest first by checkpoint id, not by write order (got {listed})"
        )
        # A chain, not one step: a saver whose versions are unordered (random, hashed) must
        # fail every run, not the runs where two draws happened to come out in order.
        chain = [v1, v2]
        while len(chain) < 12:
            chain.append(saver.get_next_version(chain[-1], None))
        assert all(later > earlier for earlier, later in itertools.pairwise(chain)), (
            f"contract: get_next_version returns a version greater than the current one "
            f"({' -> '.join(map(repr, chain))}); LangGraph compares versions to see what changed"
        )

    saver_target.run(body)


def test_config_metadata_is_merged_into_checkpoint_metadata(saver_target: Any) -> None:
    """Like the stock savers (`get_checkpoint_metadata`), put merges the config's
    ``metadata`` and plain ``configurable`` values into the stored metadata; runstore's
    channel-mode marker and run ids travel this way."""

    async def body(saver: Saver) -> None:
        thread, cid = new_thread_id(), new_checkpoint_id()
        config = config_for(thread)
        config["metadata"] = {"runstore_checkpoint_channel_mode": "delta", "run_id": "run-1"}
        config["configurable"]["user_tag"] = "blue"
        config["configurable"]["__private"] = "hidden"
        await saver.aput(config, make_checkpoint(cid, {}, {}), {"source": "input", "step": -1}, {})
        got = await saver.aget_tuple(config_for(thread, cid))
        assert got is not None
        md = got.metadata
        assert md.get("runstore_checkpoint_channel_mode") == "delta" and md.get("run_id") == "run-1", (
            named(f"{md} (contract: config metadata is merged into checkpoint metadata)")
        )
        assert md.get("user_tag") == "blue", "contract: plain configurable values join the metadata"
        assert "__private" not in md and "thread_id" not in md and "checkpoint_id" not in md, (
            "contract: dunder and addressing keys stay out of the metadata"
        )
        assert md.get("source") == "input" and md.get("step") == -1
        listed = _ids(await _collect(saver, None, filter={"user_tag": "blue", "run_id": "run-1"}))
        assert cid in listed, "contract: merged metadata is searchable with list(filter=...)"

    saver_target.run(body)


def test_stored_state_is_isolated_from_callers(saver_target: Any) -> None:
    """Mutating what was put (LangGraph updates versions_seen in place) or what was read
    never changes what the saver returns next."""

    async def body(saver: Saver) -> None:
        thread, cid = new_thread_id(), new_checkpoint_id()
        v = saver.get_next_version(None, None)
        checkpoint = make_checkpoint(cid, {"items": [1, 2], "d": {"k": "v"}}, {"items": v, "d": v})
        checkpoint["versions_seen"] = {"node": {"items": v}}
        metadata: Any = {"source": "loop", "step": 1, "tags": ["a"]}
        cfg = await saver.aput(config_for(thread), checkpoint, metadata, {"items": v, "d": v})
        await saver.aput_writes(cfg, [("items", [3])], "task", "")
        checkpoint["channel_values"]["items"].append(99)
        checkpoint["channel_versions"]["items"] = "bogus"
        checkpoint["versions_seen"]["node"]["items"] = "bogus"
        metadata["tags"].append("b")

        def check(got: Any, after: str) -> None:
            assert got is not None, f"contract: get_tuple finds the checkpoint ({after})"
            checkpoint = got.checkpoint
            # Versions first: a saver holding them by reference loses the values with them.
            assert checkpoint["channel_versions"] == {"items": v, "d": v}, (
                named(f"channel_versions {checkpoint['channel_versions']!r} ({after}) (contract: stored "
                "channel_versions are isolated from the caller's objects; LangGraph updates them "
                "in place after put)")
            )
            assert checkpoint["versions_seen"] == {"node": {"items": v}}, (
                named(f"versions_seen {checkpoint['versions_seen']!r} ({after}) (contract: stored "
                "versions_seen is isolated from the caller's objects; LangGraph updates it in place)")
            )
            assert checkpoint["channel_values"] == {"items": [1, 2], "d": {"k": "v"}}, (
                named(f"channel_values {checkpoint['channel_values']!r} ({after}) (contract: stored "
                "channel_values are isolated from the caller's objects)")
            )
            assert got.metadata.get("step") == 1 and got.metadata.get("tags") == ["a"], (
                named(f"metadata {got.metadata!r} ({after}) (contract: stored metadata is isolated from "
                "the caller's objects)")
            )
            assert _norm_writes(got.pending_writes) == [("task", "items", [3])], (
                named(f"pending_writes {got.pending_writes!r} ({after}) (contract: stored writes are "
                "isolated from the caller's objects)")
            )

        first = await saver.aget_tuple(cfg)
        check(first, "after the caller mutated what it put")
        assert first is not None and first.pending_writes
        first.checkpoint["channel_values"]["items"].append(100)
        first.checkpoint["channel_values"]["d"]["k"] = "changed"
        first.checkpoint["versions_seen"]["node"]["items"] = "changed"
        first.checkpoint["channel_versions"]["d"] = "changed"
        first.metadata["step"] = 42
        first.pending_writes[0][2].append(4)
        check(await saver.aget_tuple(cfg), "after the caller mutated what it read")

    saver_target.run(body)


def test_tree_get_tuple_matches_model(saver_target: Any) -> None:
    """Every node of a generated tree reads back exactly as the model says."""
    with saver_target.session() as session:

        @given(spec=checkpoint_trees())
        def check(spec: Any) -> None:
            async def body() -> None:
                saver = session.backend
                tree = await write_tree(saver, spec)
                for i in range(len(tree.nodes)):
                    await _check_node(saver, tree, i)
                listed = _ids(await _collect(saver, config_for(tree.thread_id)))
                assert listed == sorted((n.id for n in tree.nodes), reverse=True), (
                    "contract: list returns every checkpoint of the thread, newest first"
                )

            session.run(body())

        check()


def test_list_filter_before_limit(saver_target: Any) -> None:
    """list honours thread, metadata filter, exclusive `before` and `limit` together."""
    with saver_target.session() as session:

        @given(
            steps=st.lists(st.sampled_from(["x", "y", "z"]), min_size=1, max_size=8),
            flt=st.sampled_from([None, "x", "y", "z"]),
            before=st.one_of(st.none(), st.integers(0, 8)),
            limit=st.one_of(st.none(), st.integers(0, 9)),
        )
        # Known edges: more matches than the limit, a filter the newest checkpoints miss
        # (a limit applied before the filter returns too few), `before` inside the matches.
        @example(steps=["x", "y", "x", "y", "x", "y"], flt="x", before=None, limit=2)
        @example(steps=["x", "x", "x", "y", "y"], flt="x", before=None, limit=2)
        @example(steps=["x", "y", "x", "y", "x"], flt=None, before=3, limit=None)
        def check(steps: list[str], flt: str | None, before: int | None, limit: int | None) -> None:
            async def body() -> None:
                saver = session.backend
                thread, tag = new_thread_id(), new_thread_id("tag")
                other = new_thread_id()
                ids: list[str] = []
                parent: str | None = None
                for i, kind in enumerate(steps):
                    cid = new_checkpoint_id()
                    for tid in (thread, other):
                        await saver.aput(
                            config_for(tid, parent),
                            make_checkpoint(cid, {}, {}),
                            {"source": "loop", "step": i, "kind": kind, "tag": tag},
                            {},
                        )
                    ids.append(cid)
                    parent = cid
                expected = list(reversed(ids))
                kinds = dict(zip(ids, steps, strict=True))
                kwargs: dict[str, Any] = {}
                if flt is not None:
                    kwargs["filter"] = {"kind": flt}
                    expected = [c for c in expected if kinds[c] == flt]
                if before is not None and before < len(ids):
                    kwargs["before"] = config_for(thread, ids[before])
                    expected = [c for c in expected if c < ids[before]]
                if limit is not None:
                    kwargs["limit"] = limit
                    expected = expected[:limit]
                got = _ids(await _collect(saver, config_for(thread), **kwargs))
                assert got == expected, (
                    named(f"list({kwargs}) -> {got} != {expected} (contract: list filters by metadata "
                    "equality, before is exclusive, limit caps the newest-first result)")
                )
                anywhere = _ids(await _collect(saver, None, filter={"tag": tag, "step": 0}))
                assert sorted(anywhere) == sorted([ids[0], ids[0]]), (
                    "contract: list(None, filter=...) searches every thread"
                )
                only = await _collect(saver, config_for(thread, ids[-1]))
                assert _ids(only) == [ids[-1]], (
                    "contract: list with a checkpoint_id in config returns that checkpoint only"
                )

            session.run(body())

        check()


def test_put_writes_idempotent_and_sorted(saver_target: Any) -> None:
    """put_writes: first write wins per (task_id, idx), special slots last-write-wins,
    pending_writes in writes_sort_key order."""
    # One call holds normal channels or special ones, never both: LangGraph writes a
    # task's results, an error, an interrupt or a resume in separate calls, and the stock
    # SQL savers decide first- or last-write-wins per call from that.
    normal = st.sampled_from(["messages", "other"])
    special = st.sampled_from([ERROR, INTERRUPT, RESUME, SCHEDULED])
    value = st.integers(0, 1000)
    batches = st.lists(
        st.tuples(
            st.sampled_from(TASKS),
            st.one_of(
                st.lists(st.tuples(normal, value), min_size=1, max_size=4),
                st.lists(st.tuples(special, value), min_size=1, max_size=2),
            ),
        ),
        min_size=1,
        max_size=8,
    )
    with saver_target.session() as session:

        # A task keeps one path (LangGraph derives it from the task), so each example
        # draws which path each task has.
        @given(calls=batches, paths=st.permutations(PATHS))
        # Known edges: a retried task (the first write of a slot wins), a special slot
        # written twice (the last wins), two tasks whose path order differs from id order.
        @example(calls=[("task-a", [("messages", 1), ("other", 2)]), ("task-a", [("messages", 3)]),
                        ("task-b", [(ERROR, 4)]), ("task-b", [(ERROR, 5)])],
                 paths=["", "~", "~__pregel_pull, n2", "~__pregel_pull, n1"])
        def check(calls: list[tuple[str, list[tuple[str, int]]]], paths: list[str]) -> None:
            async def body() -> None:
                saver = session.backend
                thread, cid = new_thread_id(), new_checkpoint_id()
                cfg = await saver.aput(config_for(thread), make_checkpoint(cid, {}, {}), {}, {})
                model = WritesModel()
                for task_id, writes in calls:
                    task_path = paths[TASKS.index(task_id)]
                    await saver.aput_writes(cfg, writes, task_id, task_path)
                    model.put(task_id, task_path, writes)
                got = await saver.aget_tuple(config_for(thread, cid))
                assert got is not None
                expected = model.ordered()
                actual = _norm_writes(got.pending_writes)
                if sorted(map(repr, actual)) == sorted(map(repr, expected)):
                    assert actual == expected, (
                        named(f"{actual} != {expected} (contract: pending_writes in writes_sort_key "
                        "order: task_path, task_id, idx)")
                    )
                assert actual == expected, (
                    named(f"{actual} != {expected} (contract: put_writes is first-write-wins per "
                    "(task_id, idx) for normal channels, last-write-wins for special slots)")
                )
                listed = await _collect(saver, config_for(thread))
                assert _norm_writes(listed[0].pending_writes) == expected, (
                    "contract: list returns the same pending_writes as get_tuple"
                )

            session.run(body())

        check()


def test_delete_thread(saver_target: Any) -> None:
    """delete_thread removes one thread's checkpoints and writes and nothing else."""
    with saver_target.session() as session:

        @given(spec=checkpoint_trees(max_nodes=5))
        def check(spec: Any) -> None:
            async def body() -> None:
                saver = session.backend
                doomed = await write_tree(saver, spec)
                kept = await write_tree(saver, spec)
                await saver.adelete_thread(doomed.thread_id)
                assert await saver.aget_tuple(config_for(doomed.thread_id)) is None, (
                    "contract: delete_thread removes every checkpoint of the thread"
                )
                assert await _collect(saver, config_for(doomed.thread_id)) == []
                history = await saver.aget_delta_channel_history(
                    config=doomed.config(len(doomed.nodes) - 1), channels=["a"]
                )
                assert _norm_writes(history["a"]["writes"]) == [] and "seed" not in history["a"]
                for i in range(len(kept.nodes)):
                    await _check_node(saver, kept, i)
                # Nothing of the deleted thread may come back when its ids are used again:
                # the same checkpoints, put without values or writes, read back empty.
                for node in doomed.nodes:
                    await saver.aput(
                        config_for(doomed.thread_id), make_checkpoint(node.id, {}, node.versions),
                        {"source": "loop", "step": 0}, {},
                    )
                    again = await saver.aget_tuple(config_for(doomed.thread_id, node.id))
                    assert again is not None
                    assert _norm_writes(again.pending_writes) == [], (
                        named(f"checkpoint {node.id} put again after delete_thread has pending writes "
                        f"{again.pending_writes!r} (contract: delete_thread deletes the thread's "
                        "pending writes, not only its checkpoints)")
                    )
                    assert again.checkpoint["channel_values"] == {}, (
                        named(f"checkpoint {node.id} put again after delete_thread reads values "
                        f"{again.checkpoint['channel_values']!r} it was not given (contract: "
                        "delete_thread deletes the thread's channel values (blobs) too)")
                    )
                await saver.adelete_thread(doomed.thread_id)

            session.run(body())

        check()


def test_checkpoint_namespaces_are_independent(saver_target: Any) -> None:
    """Two namespaces of one thread (a graph and its subgraph) keep separate checkpoints,
    writes, latest and delta history; delete_thread removes both."""
    with saver_target.session() as session:

        @given(outer=checkpoint_trees(max_nodes=5), inner=checkpoint_trees(max_nodes=5))
        def check(outer: Any, inner: Any) -> None:
            async def body() -> None:
                saver = session.backend
                thread = new_thread_id()
                trees = [
                    await write_tree(saver, outer, thread, ""),
                    await write_tree(saver, inner, thread, "child:1"),
                ]
                for tree in trees:
                    for i in range(len(tree.nodes)):
                        await _check_node(saver, tree, i)
                    latest = await saver.aget_tuple(config_for(thread, ns=tree.ns))
                    assert latest is not None and latest.checkpoint["id"] == tree.nodes[-1].id, (
                        "contract: the latest checkpoint is per namespace"
                    )
                    listed = _ids(await _collect(saver, config_for(thread, ns=tree.ns)))
                    assert listed == sorted((n.id for n in tree.nodes), reverse=True), (
                        "contract: list with checkpoint_ns lists that namespace only"
                    )
                    got = await saver.aget_delta_channel_history(
                        config=tree.config(tree.spec.target), channels=tree.spec.query
                    )
                    _check_history(tree, tree.spec.target, tree.spec.query, got)
                await saver.adelete_thread(thread)
                for tree in trees:
                    assert await saver.aget_tuple(config_for(thread, ns=tree.ns)) is None, (
                        "contract: delete_thread removes every namespace of the thread"
                    )

            session.run(body())

        check()


# --------------------------------------------------------------------------- delta history


def test_delta_history_parity(saver_target: Any) -> None:
    """aget_delta_channel_history equals the reference parent-link walk on generated trees."""
    with saver_target.session() as session:

        @given(spec=checkpoint_trees())
        def check(spec: Any) -> None:
            async def body() -> None:
                saver = session.backend
                tree = await write_tree(saver, spec)
                note(spec.describe())
                got = await saver.aget_delta_channel_history(
                    config=tree.config(spec.target), channels=spec.query
                )
                _check_history(tree, spec.target, spec.query, got)
                leaf = len(tree.nodes) - 1
                got_leaf = await saver.aget_delta_channel_history(
                    config=tree.config(leaf), channels=tree.spec.channels
                )
                _check_history(tree, leaf, tree.spec.channels, got_leaf)
                empty = await saver.aget_delta_channel_history(
                    config=tree.config(leaf), channels=[]
                )
                assert dict(empty) == {}, "contract: no channels requested -> empty mapping"

            session.run(body())

        check()


def test_delta_history_fork_sees_no_sibling(saver_target: Any) -> None:
    """A fork written after its sibling branch sees only its own ancestors' writes."""

    async def body(saver: Saver) -> None:
        from .savers_model import NodeSpec, TreeSpec

        nodes = [
            NodeSpec(None, {"a": "snapshot"}, [("task-a", "~", ["a"])]),
            NodeSpec(0, {"a": "delta"}, [("task-a", "~", ["a", "a"])]),  # sibling branch
            NodeSpec(1, {"a": "delta"}, [("task-b", "~", ["a"])]),
            NodeSpec(0, {"a": "delta"}, [("task-c", "~", ["a"])]),  # the fork, written last
            NodeSpec(3, {"a": "delta"}, [("task-a", "~", ["a"])]),
        ]
        tree = await write_tree(saver, TreeSpec(["a"], nodes, 4, ["a"]))
        got = await saver.aget_delta_channel_history(config=tree.config(4), channels=["a"])
        _check_history(tree, 4, ["a"], got)

    saver_target.run(body)


def test_delta_history_stops_at_plain_seed_and_snapshot(saver_target: Any) -> None:
    """Per channel the walk stops at its own nearest valued ancestor (snapshot or plain
    pre-delta value), includes that ancestor's writes and excludes the target's."""

    async def body(saver: Saver) -> None:
        from .savers_model import NodeSpec, TreeSpec

        nodes = [
            NodeSpec(None, {"a": "plain", "b": "delta"}, [("t", "~", ["a", "b"])]),
            NodeSpec(0, {"a": "delta", "b": "snapshot"}, [("t", "~", ["a", "b"])]),
            NodeSpec(1, {"a": "delta", "b": "delta"}, [("t", "~", ["a", "b"])]),
            NodeSpec(2, {"a": "delta", "b": "delta"}, [("t", "~", ["a", "b"])]),
        ]
        query = ["a", "b", MISSING_CHANNEL]
        tree = await write_tree(saver, TreeSpec(["a", "b"], nodes, 3, query))
        got = await saver.aget_delta_channel_history(config=tree.config(3), channels=query)
        _check_history(tree, 3, query, got)

    saver_target.run(body)


@pytest.mark.requires("delta_history")
def test_declared_delta_history_is_native(saver_target: Any) -> None:
    """A saver declaring `delta_history` overrides the base-class walk (sync and async)."""

    async def body(saver: Saver) -> None:
        cls = type(saver)
        assert cls.aget_delta_channel_history is not BaseCheckpointSaver.aget_delta_channel_history, (
            "contract: capability delta_history means aget_delta_channel_history is overridden"
        )
        if saver_target.has("sync_api"):
            assert (
                cls.get_delta_channel_history is not BaseCheckpointSaver.get_delta_channel_history
            ), "contract: capability delta_history means get_delta_channel_history is overridden"

    saver_target.run(body)


# --------------------------------------------------------------------------- extended API


@pytest.mark.requires("copy_thread")
def test_copy_thread_copies_whole_chain(saver_target: Any) -> None:
    """copy_thread copies every checkpoint, parent link and write; the source is untouched."""
    with saver_target.session() as session:

        @given(spec=checkpoint_trees(max_nodes=7))
        def check(spec: Any) -> None:
            async def body() -> None:
                saver = session.backend
                tree = await write_tree(saver, spec)
                target = new_thread_id("copy")
                await saver.acopy_thread(tree.thread_id, target)
                for i in range(len(tree.nodes)):
                    await _check_node(saver, tree, i, target,
                                      writes_contract="copy_thread copies every pending write")
                    await _check_node(saver, tree, i)
                got = await saver.aget_delta_channel_history(
                    config=tree.config(spec.target, target), channels=spec.query
                )
                _check_history(tree, spec.target, spec.query, got)
                assert len(await _collect(saver, config_for(target))) == len(tree.nodes), (
                    "contract: copy_thread copies the whole parent chain"
                )
                # The copy shares nothing with its source: a write on the copy (a task the
                # source never ran) never shows up on the source.
                for i in range(len(tree.nodes)):
                    await saver.aput_writes(tree.config(i, target), [("copy_only", i)], "copy-only-task")
                for i in range(len(tree.nodes)):
                    await _check_node(saver, tree, i, writes_contract=(
                        "copy_thread shares nothing with the source: a write on the copy never shows "
                        "up on the source"
                    ))

            session.run(body())

        check()


@pytest.mark.requires("prune")
def test_prune_keep_latest_keeps_delta_reconstruction(saver_target: Any) -> None:
    """prune(keep_latest) leaves the latest checkpoint reconstructing the same state and
    keeps nothing beyond what that reconstruction needs; prune(delete) drops the thread."""
    with saver_target.session() as session:

        @given(spec=checkpoint_trees(max_nodes=8))
        def check(spec: Any) -> None:
            async def body() -> None:
                saver = session.backend
                tree = await write_tree(saver, spec)
                other = await write_tree(saver, spec)
                latest = len(tree.nodes) - 1
                channels = [*spec.channels, MISSING_CHANNEL]
                before = await saver.aget_delta_channel_history(
                    config=tree.config(latest), channels=channels
                )
                await saver.aprune([tree.thread_id], strategy="keep_latest")
                head = await saver.aget_tuple(config_for(tree.thread_id))
                assert head is not None and head.checkpoint["id"] == tree.nodes[latest].id, (
                    "contract: prune keep_latest keeps the latest checkpoint"
                )
                assert head.checkpoint["channel_values"] == tree.channel_values(latest)
                assert _norm_writes(head.pending_writes) == tree.nodes[latest].writes.ordered(), (
                    "contract: prune keep_latest keeps the latest checkpoint's pending writes"
                )
                after = await saver.aget_delta_channel_history(
                    config=tree.config(latest), channels=channels
                )
                for ch in tree.unvalued(latest):
                    assert fold(after[ch]) == fold(before[ch]), (
                        named(f"channel {ch!r}: {fold(after[ch])} != {fold(before[ch])} (contract: prune "
                        "keep_latest keeps what delta reconstruction needs)")
                    )
                allowed = {tree.nodes[i].id for i in tree.needed_ancestors(latest)}
                allowed.add(tree.nodes[latest].id)
                left = set(_ids(await _collect(saver, config_for(tree.thread_id))))
                assert left <= allowed, (
                    named(f"{len(left - allowed)} checkpoint(s) survive that delta reconstruction does "
                    "not need (contract: prune keep_latest retains only the latest checkpoint)")
                )
                for i in range(len(other.nodes)):
                    await _check_node(saver, other, i)
                try:
                    await saver.aprune([other.thread_id], strategy="keep_everything")
                except ValueError:
                    pass
                else:
                    pytest.fail("contract: an unknown prune strategy raises ValueError, never a silent no-op")
                for i in range(len(other.nodes)):
                    await _check_node(saver, other, i)
                await saver.aprune([tree.thread_id], strategy="delete")
                assert await _collect(saver, config_for(tree.thread_id)) == [], (
                    "contract: prune delete removes every checkpoint"
                )
                await saver.adelete_thread(other.thread_id)

            session.run(body())

        check()


_CHILD_NEEDS_MORE_THAN_PARENT = TreeSpec(
    channels=["a", "b", "c"],
    nodes=[
        NodeSpec(None, {"a": "absent", "b": "absent", "c": "snapshot"}, [], run=1),
        NodeSpec(0, {"a": "unchanged", "b": "unchanged", "c": "ephemeral"}, [], run=0),
        NodeSpec(1, {"a": "delta", "b": "delta", "c": "delta"}, [], run=0),
        NodeSpec(2, {"a": "delta", "b": "delta", "c": "delta"}, [], run=0),
    ],
    target=0,
    query=["a"],
)


@pytest.mark.requires("delete_for_runs")
def test_delete_for_runs_is_delta_safe(saver_target: Any) -> None:
    """delete_for_runs drops the runs' checkpoints and writes, except ancestors a
    surviving checkpoint's delta reconstruction needs; survivors read back unchanged."""
    with saver_target.session() as session:

        @given(spec=checkpoint_trees(max_nodes=8, runs=3), doomed=st.sets(st.integers(0, 2)))
        # A survivor (node 2) rebuilds `c` through a surviving parent whose own walk does
        # not look for `c` (not a delta channel there) into a doomed snapshot (node 0).
        @example(spec=_CHILD_NEEDS_MORE_THAN_PARENT, doomed={1})
        def check(spec: Any, doomed: set[int]) -> None:
            async def body() -> None:
                saver = session.backend
                tree = await write_tree(saver, spec)
                survivors = [i for i, n in enumerate(spec.nodes) if n.run not in doomed]
                folds = {}
                for i in survivors:
                    hist = await saver.aget_delta_channel_history(
                        config=tree.config(i), channels=tree.unvalued(i)
                    )
                    folds[i] = {ch: fold(h) for ch, h in hist.items()}
                await saver.adelete_for_runs([tree.run_ids[r] for r in sorted(doomed)])
                needed: set[int] = set()
                for i in survivors:
                    needed |= tree.needed_ancestors(i)
                left = set(_ids(await _collect(saver, config_for(tree.thread_id))))
                for i, node in enumerate(tree.nodes):
                    if i in survivors:
                        assert node.id in left, "contract: delete_for_runs keeps other runs"
                        parent = node.parent
                        await _check_node(
                            saver, tree, i,
                            parent_gone=parent is not None and tree.nodes[parent].id not in left,
                        )
                    elif i not in needed:
                        assert node.id not in left, (
                            "contract: delete_for_runs deletes the runs' checkpoints"
                        )
                for i in survivors:
                    hist = await saver.aget_delta_channel_history(
                        config=tree.config(i), channels=tree.unvalued(i)
                    )
                    assert {ch: fold(h) for ch, h in hist.items()} == folds[i], (
                        named(f"node {i}: delta state changed (contract: delete_for_runs never breaks a "
                        "surviving checkpoint's delta reconstruction)")
                    )

            session.run(body())

        check()


# --------------------------------------------------------------------------- sync twins


@pytest.mark.requires("sync_api")
def test_sync_twins_match_async(saver_target: Any) -> None:
    """The sync twins work from a worker thread and agree with the async API; on the
    saver's own loop thread they either work or raise SyncCallOnEventLoopError."""
    with saver_target.session() as session:

        @given(spec=checkpoint_trees(max_nodes=6))
        def check(spec: Any) -> None:
            async def body() -> None:
                saver = session.backend
                tree = await asyncio.to_thread(write_tree_sync, saver, spec)
                for i in range(len(tree.nodes)):
                    await _check_node(saver, tree, i)
                    sync_tuple = await asyncio.to_thread(saver.get_tuple, tree.config(i))
                    async_tuple = await saver.aget_tuple(tree.config(i))
                    assert sync_tuple == async_tuple, "contract: get_tuple == aget_tuple"
                listed = await asyncio.to_thread(
                    lambda: list(saver.list(config_for(tree.thread_id)))
                )
                assert _ids(listed) == _ids(await _collect(saver, config_for(tree.thread_id)))
                hist = await asyncio.to_thread(
                    lambda: saver.get_delta_channel_history(
                        config=tree.config(spec.target), channels=spec.query
                    )
                )
                _check_history(tree, spec.target, spec.query, hist)
                try:
                    on_loop = saver.get_tuple(tree.config(0))
                except (SyncCallOnEventLoopError, asyncio.InvalidStateError):
                    # Refusing at once is fine (runstore's savers raise the first, LangGraph's
                    # stock async savers the second); blocking the loop would deadlock.
                    pass
                else:
                    assert on_loop == await saver.aget_tuple(tree.config(0))
                if saver_target.has("copy_thread"):
                    target = new_thread_id("copy")
                    await asyncio.to_thread(saver.copy_thread, tree.thread_id, target)
                    for i in range(len(tree.nodes)):
                        await _check_node(saver, tree, i, target,
                                          writes_contract="copy_thread (sync) copies every pending write")
                if saver_target.has("prune"):
                    await asyncio.to_thread(saver.prune, [tree.thread_id], strategy="delete")
                    assert await saver.aget_tuple(config_for(tree.thread_id)) is None
                if saver_target.has("delete_for_runs"):
                    await asyncio.to_thread(saver.delete_for_runs, tree.run_ids)
                await asyncio.to_thread(saver.delete_thread, tree.thread_id)
                assert await saver.aget_tuple(config_for(tree.thread_id)) is None, (
                    "contract: delete_thread (sync) removes the thread"
                )

            session.run(body())

        check()


# --------------------------------------------------------------------------- serde


class _RecordingSerde:
    """Wraps a serde, counts calls and scrambles bytes, like an encrypting serde would."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.dumped = 0
        self.loaded = 0
        self.objects: list[Any] = []

    def saw(self, value: Any) -> bool:
        """Whether ``value`` was dumped, alone or inside a dumped container (a saver may
        serialize a whole checkpoint or a batch of writes in one call)."""

        def holds(obj: Any, depth: int = 0) -> bool:
            if obj == value:
                return True
            if depth > 6:
                return False
            if isinstance(obj, dict):
                return any(holds(v, depth + 1) for v in obj.values())
            if isinstance(obj, list | tuple):
                return any(holds(v, depth + 1) for v in obj)
            return False

        return any(holds(obj) for obj in self.objects)

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        self.dumped += 1
        self.objects.append(obj)
        kind, data = self.inner.dumps_typed(obj)
        return f"rec+{kind}", bytes(reversed(data))

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        self.loaded += 1
        kind, raw = data
        assert kind.startswith("rec+"), (
            f"contract: stored data is what saver.serde produced (got type {kind!r})"
        )
        return self.inner.loads_typed((kind[4:], bytes(reversed(raw))))


def test_values_and_writes_go_through_saver_serde(saver_target: Any) -> None:
    """Channel values and writes are serialized with ``saver.serde`` (so encrypted serdes work)."""

    async def body(saver: Saver) -> None:
        recording = _RecordingSerde(saver.serde)
        saver.serde = maybe_add_typed_methods(recording)
        thread, cid = new_thread_id(), new_checkpoint_id()
        v1 = saver.get_next_version(None, None)
        cfg = await saver.aput(
            config_for(thread), make_checkpoint(cid, {"secret": ["s3cr3t"]}, {"secret": v1}),
            {"source": "input", "step": -1}, {"secret": v1},
        )
        await saver.aput_writes(cfg, [("secret", "w1")], "task", "")
        assert recording.saw(["s3cr3t"]), (
            "contract: channel values are serialized with saver.serde, read at call time (an "
            "encrypting serde set after opening must see them)"
        )
        assert recording.saw("w1"), (
            "contract: pending-write values are serialized with saver.serde, read at call time"
        )
        got = await saver.aget_tuple(cfg)
        assert got is not None and got.checkpoint["channel_values"] == {"secret": ["s3cr3t"]}
        assert _norm_writes(got.pending_writes) == [("task", "secret", "w1")]
        assert recording.loaded >= 2, "contract: values and writes are loaded with saver.serde"

    saver_target.run(body)


# --------------------------------------------------------------------------- durability


@pytest.mark.requires("durable")
def test_durable_reopen_keeps_data(saver_target: Any) -> None:
    """Closing and reopening the saver keeps checkpoints, writes and parent links."""
    from .savers_model import NodeSpec, TreeSpec

    spec = TreeSpec(
        ["a", "b"],
        [
            NodeSpec(None, {"a": "plain", "b": "snapshot"}, [("t", "~", ["a", "b"])]),
            NodeSpec(0, {"a": "delta", "b": "delta"}, [("t", "~", ["a"]), ("u", "", ["b"])]),
            NodeSpec(1, {"a": "delta", "b": "unchanged"}, [("t", "~", ["a", "b"])]),
            NodeSpec(0, {"a": "delta", "b": "delta"}, [("t", "~", ["a"])]),
            NodeSpec(2, {"a": "snapshot", "b": "delta"}, [("t", "~", ["a", "b"])]),
        ],
        4,
        ["a", "b", MISSING_CHANNEL],
    )

    async def write(saver: Saver) -> Tree:
        return await write_tree(saver, spec)

    tree = saver_target.run(write)

    async def read(saver: Saver) -> None:
        for i in range(len(tree.nodes)):
            await _check_node(saver, tree, i)
        got = await saver.aget_delta_channel_history(
            config=tree.config(spec.target), channels=spec.query
        )
        _check_history(tree, spec.target, spec.query, got)

    saver_target.run(read)


_CHILD = textwrap.dedent(
    """
    import asyncio, json, os, sys
    from runstore.conformance.processes import load_plugins_from_env
    load_plugins_from_env()
    from runstore.capabilities import Kind
    from runstore.conformance.harness import spec_for
    from runstore.options import BackendOptions
    from runstore.urls import BackendURL
    from runstore.conformance.savers_model import config_for, make_checkpoint

    async def main():
        url = BackendURL.parse(os.environ["RUNSTORE_SUITE_URL"])
        job = json.loads(os.environ["RUNSTORE_SUITE_JOB"])
        async with BackendOptions.scope() as options:
            saver = await spec_for(Kind.SAVER, url).open(url, options)
            v = saver.get_next_version(job["version"], None)
            cfg = await saver.aput(
                config_for(job["thread"], job["parent"]),
                make_checkpoint(job["id"], {"n": job["value"]}, {"n": v}),
                {"source": "loop", "step": 1, "writer": "child"},
                {"n": v},
            )
            await saver.aput_writes(cfg, [("n", job["value"] + 1)], "child-task", "")
            print(json.dumps({"version": v}))

    asyncio.run(main())
    """
)


@pytest.mark.requires("cross_process")
def test_cross_process_writer_is_visible(saver_target: Any, request: pytest.FixtureRequest) -> None:
    """A checkpoint and writes put by another OS process are read by this one, on an
    instance that was already open before the other process wrote."""

    async def body(saver: Saver) -> None:
        thread, root, child = new_thread_id(), new_checkpoint_id(), new_checkpoint_id()
        v1 = saver.get_next_version(None, None)
        await saver.aput(
            config_for(thread), make_checkpoint(root, {"n": 1}, {"n": v1}),
            {"source": "input", "step": -1}, {"n": v1},
        )
        env = dict(os.environ)
        env["RUNSTORE_SUITE_URL"] = saver_target.url.render(hide_password=False)
        env.update(plugins_env(development_plugins(request.config)))
        env["RUNSTORE_SUITE_JOB"] = json.dumps(
            {"thread": thread, "parent": root, "id": child, "value": 41, "version": v1}
        )
        proc = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-c", _CHILD], env=env,
            capture_output=True, text=True, timeout=120,
        )
        assert proc.returncode == 0, f"writer process failed: {proc.stderr[-2000:]}"
        got = await saver.aget_tuple(config_for(thread))
        assert got is not None and got.checkpoint["id"] == child, (
            "contract: cross_process — another process's checkpoint is visible"
        )
        assert got.checkpoint["channel_values"] == {"n": 41}
        assert _norm_writes(got.pending_writes) == [("child-task", "n", 42)]
        assert got.parent_config is not None
        assert got.parent_config["configurable"]["checkpoint_id"] == root

    saver_target.run(body)


def test_concurrent_puts_from_threads_do_not_interfere(saver_target: Any) -> None:
    """Concurrent async puts on separate threads of one saver all land."""

    async def body(saver: Saver) -> None:
        threads = [new_thread_id() for _ in range(5)]

        async def fill(thread: str) -> list[str]:
            ids, parent = [], None
            for _ in range(4):
                cid = new_checkpoint_id()
                await saver.aput(config_for(thread, parent), make_checkpoint(cid, {}, {}), {}, {})
                await saver.aput_writes(config_for(thread, cid), [("x", cid)], "t", "")
                ids.append(cid)
                parent = cid
            return ids

        results = await asyncio.gather(*(fill(t) for t in threads))
        for thread, ids in zip(threads, results, strict=True):
            got = _ids(await _collect(saver, config_for(thread)))
            assert got == list(reversed(ids)), "contract: concurrent puts on one saver all land"

    saver_target.run(body)



# --------------------------------------------------------------------------- graph parity


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_graph_parity_with_add_messages_fold(saver_target: Any, scenario: str) -> None:
    """A real StateGraph in full / delta / full->delta mode, driven by generated turns
    (append, replace by id, remove, remove-all, fork from an older checkpoint,
    update_state), materializes exactly what folding add_messages gives, at the head
    and at every earlier checkpoint."""
    with saver_target.session() as session:

        # Graph runs are expensive: fewer examples than the profile, never more.
        @settings(max_examples=min(8, settings().max_examples))
        @given(
            ops=scenario_ops(),
            frequency=st.sampled_from(FREQUENCIES),
            switch=st.integers(0, 6),
        )
        def check(ops: list[tuple[str, int]], frequency: int, switch: int) -> None:
            async def body() -> None:
                saver = session.backend
                thread = new_thread_id("graph")
                mode = "delta" if scenario == "delta" else "full"
                graphs = {m: build_graph(m, frequency, saver) for m in ("full", "delta")}
                model = GraphModel()
                heads: list[str] = []
                for step, (op, pick) in enumerate(ops):
                    if scenario == "migrate" and step == switch:
                        mode = "delta"
                    graph = graphs[mode]
                    where = f"scenario={scenario} mode={mode} frequency={frequency} step={step} op={op}"
                    if op == "update":
                        batch = input_batch("append" if pick % 2 else "replace", model, pick)
                        await graph.aupdate_state(
                            thread_config(thread, mode), {"messages": batch}, as_node="agent"
                        )
                        model.apply(batch)
                    else:
                        config = thread_config(thread, mode)
                        if op == "fork" and heads:
                            # An older point than the head, when there is one: a real fork.
                            older = heads[:-1] or heads
                            base = older[pick % len(older)]
                            model.state = list(model.at[base])
                            config = thread_config(thread, mode, base)
                        batch = input_batch(op, model, pick)
                        await graph.ainvoke({"messages": batch}, config)
                        model.apply(batch)
                        model.apply(agent_reply(model.state))
                    snap = await graph.aget_state(thread_config(thread, mode))
                    got = view(snap.values.get("messages", []))
                    assert got == view(model.state), (
                        named(f"{where}: head has {got}, folding add_messages gives {view(model.state)} "
                        "(contract: graph parity — the saver materializes exactly the add_messages fold)")
                    )
                    head = snap.config["configurable"]["checkpoint_id"]
                    model.at[head] = list(model.state)
                    heads.append(head)
                graph = graphs[mode]
                for checkpoint_id, expected in model.at.items():
                    snap = await graph.aget_state(thread_config(thread, mode, checkpoint_id))
                    got = view(snap.values.get("messages", []))
                    assert got == view(expected), (
                        named(f"scenario={scenario} frequency={frequency}: checkpoint {checkpoint_id} "
                        f"has {got}, expected {view(expected)} (contract: graph parity at earlier "
                        "checkpoints and forks — no sibling branch leaks in)")
                    )

            session.run(body())

        check()


# --------------------------------------------------------------------------- listing, filters, ids


async def _put_chain_with_metadata(
    saver: Saver, thread: str, metas: list[dict[str, Any]]
) -> list[str]:
    ids: list[str] = []
    parent: str | None = None
    for meta in metas:
        cid = new_checkpoint_id()
        await saver.aput(config_for(thread, parent), make_checkpoint(cid, {}, {}), as_metadata(meta), {})
        ids.append(cid)
        parent = cid
    return ids


@pytest.mark.requires("typed_filters")
def test_metadata_filters_follow_the_documented_rule(saver_target: Any) -> None:
    """list(filter=...) returns exactly the checkpoints the documented rule matches, on
    random nested metadata: None also matches an absent key, booleans never match numbers,
    numbers match by value (1 matches 1.0), documents whatever their key order."""
    with saver_target.session() as session:

        @given(case=metadata_and_filters())
        @example(case=([{"a": 1}, {}], {"b": None}))
        @example(case=([{"a": True}, {"a": 1}, {"a": 1.0}], {"a": 1}))
        @example(case=([{"a": {"x": 1, "y": [1, 2.5]}}], {"a": {"y": [1.0, 2.5], "x": 1.0}}))
        @example(case=([{"a": [0, {"y": False}]}], {"a": [False, {"y": 0}]}))
        def check(case: tuple[list[dict[str, Any]], dict[str, Any]]) -> None:
            metas, flt = case

            async def body() -> None:
                saver = session.backend
                thread = new_thread_id()
                ids = await _put_chain_with_metadata(saver, thread, metas)
                expected = [
                    cid for cid, meta in zip(ids, metas, strict=True) if reference_match(meta, flt)
                ][::-1]
                got = _ids(await _collect(saver, config_for(thread), filter=flt))
                assert got == expected, (
                    f"list(filter={flt!r}) over metadata {metas!r} (oldest first) -> "
                    f"{[ids.index(c) for c in got]} != {[ids.index(c) for c in expected]} "
                    "(contract: the documented metadata filter rule: None matches an absent "
                    "key or null, booleans only booleans, numbers by value, documents as JSON)"
                )

            session.run(body())

        check()


@pytest.mark.requires("global_list_order")
def test_list_without_thread_id_spans_threads_in_one_order(saver_target: Any) -> None:
    """list with config None, a config without thread_id, or only a checkpoint_ns lists
    every thread; every list is ordered by (checkpoint_id, thread_id, checkpoint_ns)
    descending, and before / limit apply to that order."""
    with saver_target.session() as session:

        @given(
            layout=st.lists(
                st.tuples(st.integers(0, 2), st.sampled_from(["", "child:1"]), st.booleans()),
                min_size=1,
                max_size=8,
            ),
            before=st.one_of(st.none(), st.integers(0, 7)),
            limit=st.one_of(st.none(), st.integers(0, 8)),
        )
        @example(layout=[(0, "", True), (1, "", True), (2, "child:1", True)], before=None, limit=None)
        def check(layout: list[tuple[int, str, bool]], before: int | None, limit: int | None) -> None:
            async def body() -> None:
                saver = session.backend
                tag = new_thread_id("tag")
                threads = sorted(new_thread_id() for _ in range(3))
                shared = new_checkpoint_id()  # one id in several threads, as copy_thread makes
                rows: set[tuple[str, str, str]] = set()
                for t, ns, same_id in layout:
                    cid = shared if same_id else new_checkpoint_id()
                    checkpoint = make_checkpoint(cid, {}, {})
                    await saver.aput(config_for(threads[t], ns=ns), checkpoint, {"tag": tag}, {})
                    rows.add((cid, threads[t], ns))
                ordered = sorted(rows, reverse=True)

                async def listed(config: Any, **kwargs: Any) -> list[tuple[str, str, str]]:
                    items = await _collect(saver, config, filter={"tag": tag}, **kwargs)
                    return [
                        (
                            i.config["configurable"]["checkpoint_id"],
                            i.config["configurable"]["thread_id"],
                            i.config["configurable"]["checkpoint_ns"],
                        )
                        for i in items
                    ]

                contract = (
                    "(contract: list orders by (checkpoint_id, thread_id, checkpoint_ns) "
                    "descending; thread_id / checkpoint_ns in the config narrow when present, "
                    "and without thread_id every thread is listed)"
                )
                configs: tuple[dict[str, Any] | None, ...] = (None, {"configurable": {}})
                for config in configs:
                    assert await listed(config) == ordered, f"list({config}) {contract}"
                only_ns = [r for r in ordered if r[2] == "child:1"]
                got = await listed({"configurable": {"checkpoint_ns": "child:1"}})
                assert got == only_ns, f"list(checkpoint_ns only) {contract}"
                one_thread = [r for r in ordered if r[1] == threads[0]]
                got = await listed({"configurable": {"thread_id": threads[0]}})
                assert got == one_thread, f"list(thread_id, no namespace) {contract}"
                expected = ordered
                kwargs: dict[str, Any] = {}
                if before is not None and before < len(ordered):
                    cut = ordered[before][0]
                    kwargs["before"] = config_for(ordered[before][1], cut)
                    expected = [r for r in expected if r[0] < cut]
                if limit is not None:
                    kwargs["limit"] = limit
                    expected = expected[:limit]
                assert await listed(None, **kwargs) == expected, (
                    f"list(None, {kwargs}) {contract}; before is exclusive, limit caps"
                )

            session.run(body())

        check()


#: Text no saver can store the same way: PostgreSQL text refuses NUL, and a lone
#: surrogate is not Unicode (sqlite and JSON encoders refuse it).
_UNSTORABLE = {"a NUL character": "bad\x00id", "a lone surrogate": "bad\ud800id"}


@pytest.mark.requires("checked_ids")
def test_unstorable_ids_are_refused_by_name_and_nothing_is_written(saver_target: Any) -> None:
    """Ids holding a NUL or a lone surrogate raise InvalidSaverInputError naming the field,
    on reads and writes, and leave the store as it was."""
    from runstore.errors import InvalidSaverInputError

    async def body(saver: Saver) -> None:
        tag = new_thread_id("tag")
        thread = new_thread_id()
        [cid] = await _put_chain_with_metadata(saver, thread, [{"tag": tag}])
        await saver.aput_writes(config_for(thread, cid), [("a", "kept")], "task")
        head = config_for(thread, cid)
        for label, bad in _UNSTORABLE.items():
            calls: list[tuple[str, Any]] = [
                (
                    "thread_id",
                    lambda bad=bad: saver.aput(
                        config_for(bad),
                        make_checkpoint(new_checkpoint_id(), {}, {}),
                        as_metadata({"tag": tag}),
                        {},
                    ),
                ),
                (
                    "checkpoint_ns",
                    lambda bad=bad: saver.aput(
                        config_for(thread, ns=bad),
                        make_checkpoint(new_checkpoint_id(), {}, {}),
                        as_metadata({"tag": tag}),
                        {},
                    ),
                ),
                (
                    "checkpoint id",
                    lambda bad=bad: saver.aput(
                        config_for(thread, cid), make_checkpoint(bad, {}, {}), as_metadata({"tag": tag}), {}
                    ),
                ),
                ("task_id", lambda bad=bad: saver.aput_writes(head, [("a", "bad")], bad)),
                ("channel", lambda bad=bad: saver.aput_writes(head, [(bad, "bad")], "task-2")),
                ("thread_id", lambda bad=bad: saver.aget_tuple(config_for(bad))),
                ("thread_id", lambda bad=bad: _collect(saver, config_for(bad))),
                ("thread_id", lambda bad=bad: saver.adelete_thread(bad)),
                (
                    "channel",
                    lambda bad=bad: saver.aget_delta_channel_history(config=head, channels=[bad]),
                ),
            ]
            for field_name, call in calls:
                with pytest.raises(InvalidSaverInputError) as raised:
                    await call()
                message = str(raised.value)
                assert field_name in message, (
                    f"{label} in {field_name}: {message!r} (contract: the error names "
                    "the field and what is accepted)"
                )
        stored = await _collect(saver, None, filter={"tag": tag})
        assert _ids(stored) == [cid], (
            "contract: a refused put writes nothing (no checkpoint, in any thread)"
        )
        assert _norm_writes(stored[0].pending_writes) == [("task", "a", "kept")], (
            "contract: refused put_writes write nothing"
        )

    saver_target.run(body)


# --------------------------------------------------------------------------- state machine

_MACHINE_CHANNELS = ("a", "b")
_MACHINE_NAMESPACES = ("", "child:1")
_FULL_KINDS = ("plain", "unchanged", "ephemeral")
#: A task keeps one path; path order differs from task id order, so a saver that drops
#: or ignores task_path sorts pending writes differently.
_MACHINE_TASK_PATHS = {"task-a": "~", "task-b": "", "task-c": "~__pregel_pull, n1"}


class SaverMachine(RuleBasedStateMachine):
    """Random saver operations checked against `SaverModel` after every step.

    Threads, two namespaces each; puts on the latest or an older parent (forks), with
    now and then a checkpoint id older than the head (written late); pending writes;
    get by id; list with thread, namespace, filter, before and limit; and, as declared,
    copy_thread, prune, delete_for_runs and the sync twins (each call picks the sync or
    the async API). ``mode`` is ``full`` (every channel stores a value or keeps its
    version) or ``delta`` (delta steps, snapshots, plain seeds).
    """

    mode = "delta"

    def __init__(self, session: Any) -> None:
        super().__init__()
        self.session = session
        self.saver: Saver = session.backend
        self.target = session.target
        self.tag = new_thread_id("machine")
        self.threads: list[str] = []
        for _ in range(2):
            self.threads.append(self.new_thread())
        self.runs = [new_thread_id("run"), new_thread_id("run")]
        self.model = SaverModel()
        self.versions: dict[tuple[str, str, str], Any] = {}
        self.late_ids = [new_checkpoint_id() for _ in range(3)]
        self.counter = itertools.count(1)
        self.sync = self.target.has("sync_api")
        #: (thread, namespace, id, operation) of every checkpoint deleted so far
        self.deleted: list[tuple[str, str, str, str]] = []
        #: the contract of the last operation, named when the invariant fails after it
        self.last_contract = "put stores the checkpoint"
        #: id -> the operation that deleted it, for checkpoints put again after a delete
        self.reput: dict[str, str] = {}

    def new_thread(self) -> str:
        """A fresh thread id that sorts after every id this machine made before. Steps pick
        from lists sorted by thread id (`deleted`), so with random ids a replay of the same
        steps could pick another item, and Hypothesis would report the failure as flaky
        data generation instead of the broken contract."""
        return new_thread_id(f"sm{len(self.threads):02d}")

    def everything(self) -> set[tuple[str, str, str]]:
        return {
            (tid, ns, cid)
            for tid, namespaces in self.model.threads.items()
            for ns, entries in namespaces.items() for cid in entries
        }

    def forget(self, before: set[tuple[str, str, str]], operation: str, contract: str) -> None:
        self.deleted += [(*key, operation) for key in sorted(before - self.everything())]
        self.last_contract = contract

    # -- calling the saver --------------------------------------------------------

    def call(self, use_sync: bool, name: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``name`` through the sync twin (from a worker thread) or the async API."""
        if use_sync and self.sync:
            method = getattr(self.saver, name)
            if name == "list":
                return self.session.run(asyncio.to_thread(lambda: list(method(*args, **kwargs))))
            return self.session.run(asyncio.to_thread(method, *args, **kwargs))
        method = getattr(self.saver, "a" + name)
        if name == "list":
            return self.session.run(_collect(self.saver, *args, **kwargs))
        return self.session.run(method(*args, **kwargs))

    def api(self, use_sync: bool) -> str:
        return "sync" if use_sync and self.sync else "async"

    def stored(self, thread: int, ns: int, pick: int) -> Stored | None:
        ids = self.model.ids(self.threads[thread], _MACHINE_NAMESPACES[ns])
        if not ids:
            return None
        return self.model.ns(self.threads[thread], _MACHINE_NAMESPACES[ns])[ids[pick % len(ids)]]

    def check_tuple(self, got: Any, thread: str, ns: str, stored: Stored, where: str) -> None:
        assert got is not None, f"{where}: contract: get_tuple finds stored checkpoint {stored.id}"
        configurable = got.config["configurable"]
        assert (configurable.get("checkpoint_id"), configurable.get("checkpoint_ns", "")) == (stored.id, ns), (
            f"{where}: contract: get_tuple returns the config of the checkpoint it found, with its "
            f"checkpoint_ns (got {configurable})"
        )
        assert got.checkpoint["channel_values"] == stored.channel_values(), (
            named(f"{where}: channel_values {got.checkpoint['channel_values']!r} != {stored.channel_values()!r} "
            "(contract: channel_values are exactly what was put at each channel's version)")
        )
        assert got.checkpoint["channel_versions"] == stored.versions, (
            f"{where}: contract: channel_versions come back as put"
        )
        parent = (got.parent_config or {}).get("configurable", {})
        if stored.parent is not None:
            assert (parent.get("checkpoint_id"), parent.get("checkpoint_ns", "")) == (stored.parent, ns), (
                named(f"{where}: parent_config {parent} (contract: parent_config names the parent checkpoint "
                f"{stored.parent} in the same thread and namespace)")
            )
        else:
            assert not parent, named(
                f"{where}: parent_config {parent} (contract: a root checkpoint, or one whose parent "
                "was deleted, has no parent_config)"
            )
        for key, value in stored.metadata.items():
            assert got.metadata.get(key) == value, f"{where}: contract: metadata[{key!r}] round-trips"
        if stored.id in self.reput:
            assert _norm_writes(got.pending_writes) == stored.writes.ordered(), (
                named(f"{where}: pending_writes {got.pending_writes!r} of a checkpoint deleted by "
                f"{self.reput[stored.id]} and put again (contract: {self.reput[stored.id]} deletes the "
                "pending writes of the checkpoints it deletes, not only the checkpoints)")
            )
        assert _norm_writes(got.pending_writes) == stored.writes.ordered(), (
            named(f"{where}: pending_writes {got.pending_writes!r} != {stored.writes.ordered()!r} (contract: "
            "pending_writes are the writes put on this checkpoint, in writes_sort_key order; first "
            "write wins per (task_id, idx); deleted and copied checkpoints share none)")
        )

    # -- writes ---------------------------------------------------------------------

    @rule(
        thread=st.integers(0, 1), ns=st.integers(0, 1), parent=st.one_of(st.none(), st.integers(0, 20)),
        kinds=st.data(), run=st.integers(0, 1), late=st.booleans(), kind=st.sampled_from(["x", "y"]),
        use_sync=st.booleans(),
    )
    def put(self, thread: int, ns: int, parent: int | None, kinds: Any, run: int, late: bool,
            kind: str, use_sync: bool) -> None:
        self.do_put(thread, ns, parent, kinds, run, late, kind, use_sync)

    @initialize(data=st.data())
    def seed(self, data: Any) -> None:
        """Every run starts from two short chains (with writes) per thread and namespace, so
        forks, namespaces and the extended operations meet real state from the first step."""
        for thread, ns, step in itertools.product((0, 1), (0, 1), range(3)):
            self.do_put(thread, ns, 0 if step else None, data, step % 2, False, "xy"[step % 2], False)
            task = TASKS[step]
            self.do_put_writes(thread, ns, 0, task, ["a", "other"], False)

    def do_put(self, thread: int, ns: int, parent: int | None, kinds: Any, run: int, late: bool,
               kind: str, use_sync: bool) -> None:
        tid, ns_name = self.threads[thread], _MACHINE_NAMESPACES[ns]
        base = self.stored(thread, ns, parent) if parent is not None else None
        options = _FULL_KINDS if self.mode == "full" else KINDS
        versions = dict(base.versions) if base else {}
        values = dict(base.values) if base else {}
        delta = set(base.delta) if base else set()
        new_versions: dict[str, Any] = {}
        for ch in _MACHINE_CHANNELS:
            choice = kinds.draw(st.sampled_from(options if base else ROOT_KINDS if self.mode == "delta"
                                                else ("plain", "ephemeral")), label=f"kind {ch}")
            if choice in ("unchanged", "absent") or (choice == "unchanged" and ch not in versions):
                continue
            delta.discard(ch)
            if choice == "delta":
                delta.add(ch)
            key = (tid, ns_name, ch)
            version = self.saver.get_next_version(self.versions.get(key), None)
            self.versions[key] = new_versions[ch] = versions[ch] = version
            marker = [next(self.counter) * 1000 + ord(ch)]
            values[ch] = (
                _DeltaSnapshot(marker) if choice == "snapshot" else marker if choice == "plain" else EMPTY
            )
        cid = self.late_ids.pop() if late and self.late_ids else new_checkpoint_id()
        if cid in self.model.ns(tid, ns_name):
            cid = new_checkpoint_id()
        metadata: dict[str, Any] = {
            "source": "loop", "step": next(self.counter), "run_id": self.runs[run],
            "tag": self.tag, "kind": kind,
        }
        if delta:
            metadata[COUNTERS_KEY] = {ch: [1, 1] for ch in sorted(delta)}
        stored = Stored(cid, base.id if base else None, versions, values, delta, self.runs[run], metadata)
        checkpoint = make_checkpoint(cid, stored.channel_values(), versions)
        got = self.call(use_sync, "put", config_for(tid, stored.parent, ns_name), checkpoint,
                        dict(metadata), new_versions)
        configurable = got["configurable"]
        assert (configurable.get("thread_id"), configurable.get("checkpoint_ns", ""),
                configurable.get("checkpoint_id")) == (tid, ns_name, cid), (
            f"contract: put ({self.api(use_sync)}) returns the config of the stored checkpoint, with "
            f"its thread_id and checkpoint_ns (got {configurable})"
        )
        self.model.add(tid, ns_name, stored)
        self.last_contract = "put stores the checkpoint in its thread and namespace only"

    @rule(
        thread=st.integers(0, 1), ns=st.integers(0, 1), pick=st.integers(0, 20),
        task=st.sampled_from(TASKS),
        channels=st.one_of(
            st.lists(st.sampled_from([*_MACHINE_CHANNELS, "other"]), min_size=1, max_size=3),
            st.just([ERROR]),  # special writes come in calls of their own, as in LangGraph
        ),
        use_sync=st.booleans(),
    )
    def put_writes(self, thread: int, ns: int, pick: int, task: str, channels: list[str],
                   use_sync: bool) -> None:
        self.do_put_writes(thread, ns, pick, task, channels, use_sync)

    def do_put_writes(self, thread: int, ns: int, pick: int, task: str, channels: list[str],
                      use_sync: bool) -> None:
        path = _MACHINE_TASK_PATHS[task]
        stored = self.stored(thread, ns, pick)
        if stored is None:
            return
        writes = [(ch, next(self.counter)) for ch in channels]
        tid, ns_name = self.threads[thread], _MACHINE_NAMESPACES[ns]
        self.call(use_sync, "put_writes", config_for(tid, stored.id, ns_name), writes, task, path)
        stored.writes.put(task, path, writes)
        self.last_contract = "put_writes adds writes to the checkpoint it names, and to no other"

    @rule(pick=st.integers(0, 20), use_sync=st.booleans())
    def put_deleted_id_again(self, pick: int, use_sync: bool) -> None:
        """A deleted checkpoint's id put again (no values, no writes) must read back empty:
        a delete empties every table, not only the checkpoints."""
        # A survivor whose parent was deleted lost that link, so bringing the parent back
        # leaves the survivor a root.
        candidates = self.deleted
        if not candidates:
            return
        tid, ns, cid, operation = candidates[pick % len(candidates)]
        self.deleted.remove((tid, ns, cid, operation))
        if cid in self.model.ns(tid, ns):
            return
        metadata = {"source": "loop", "step": next(self.counter), "run_id": self.runs[0],
                    "tag": self.tag, "kind": "x"}
        self.call(use_sync, "put", config_for(tid, None, ns), make_checkpoint(cid, {}, {}), dict(metadata), {})
        self.model.add(tid, ns, Stored(cid, None, {}, {}, set(), self.runs[0], metadata))
        self.reput[cid] = operation

    # -- reads ----------------------------------------------------------------------

    @rule(thread=st.integers(0, 1), ns=st.integers(0, 1), pick=st.one_of(st.none(), st.integers(0, 20)),
          use_sync=st.booleans())
    def get(self, thread: int, ns: int, pick: int | None, use_sync: bool) -> None:
        tid, ns_name = self.threads[thread], _MACHINE_NAMESPACES[ns]
        stored = self.model.latest(tid, ns_name) if pick is None else self.stored(thread, ns, pick)
        where = f"get_tuple ({self.api(use_sync)}, {'latest' if pick is None else 'by id'})"
        got = self.call(use_sync, "get_tuple", config_for(tid, None if pick is None or stored is None
                                                          else stored.id, ns_name))
        if stored is None:
            assert got is None, f"{where}: contract: get_tuple of an empty thread or namespace is None"
            return
        if pick is None:
            assert got is not None and got.checkpoint["id"] == stored.id, (
                f"{where}: contract: get_tuple without checkpoint_id returns the checkpoint with the "
                f"highest id ({stored.id}), not the last written (got {got.checkpoint['id'] if got else None})"
            )
        self.check_tuple(got, tid, ns_name, stored, where)

    @rule(
        thread=st.integers(0, 1), ns=st.one_of(st.none(), st.integers(0, 1)),
        kind=st.one_of(st.none(), st.sampled_from(["x", "y"])),
        before=st.one_of(st.none(), st.integers(0, 20)), limit=st.one_of(st.none(), st.integers(0, 4)),
        use_sync=st.booleans(),
    )
    def list_thread(self, thread: int, ns: int | None, kind: str | None, before: int | None,
                    limit: int | None, use_sync: bool) -> None:
        tid = self.threads[thread]
        namespaces = _MACHINE_NAMESPACES if ns is None else [_MACHINE_NAMESPACES[ns]]
        rows = [(cid, n) for n in namespaces for cid in self.model.ids(tid, n)]
        kwargs: dict[str, Any] = {}
        if kind is not None:
            kwargs["filter"] = {"kind": kind}
            rows = [(c, n) for c, n in rows if self.model.ns(tid, n)[c].metadata["kind"] == kind]
        if before is not None and ns is not None:
            stored = self.stored(thread, ns, before)
            if stored is not None:
                kwargs["before"] = config_for(tid, stored.id, namespaces[0])
                rows = [(c, n) for c, n in rows if c < stored.id]
        config = config_for(tid) if ns is None else config_for(tid, ns=namespaces[0])
        if ns is None:
            del config["configurable"]["checkpoint_ns"]
        got = self.call(use_sync, "list", config, **kwargs)
        got_rows = [(t.config["configurable"]["checkpoint_id"], t.config["configurable"].get("checkpoint_ns", ""))
                    for t in got]
        expected = sorted(rows, reverse=True)
        if ns is None:  # order across namespaces is not specified
            got_rows, expected = sorted(got_rows), sorted(expected)
        elif limit is not None:
            got_rows = [
                (t.config["configurable"]["checkpoint_id"], t.config["configurable"].get("checkpoint_ns", ""))
                for t in self.call(use_sync, "list", config, limit=limit, **kwargs)
            ]
            kwargs["limit"] = limit
            expected = expected[:limit]
        assert got_rows == expected, (
            named(f"list ({self.api(use_sync)}, thread, checkpoint_ns={'any' if ns is None else namespaces[0]!r}, "
            f"{kwargs}) -> {got_rows} != {expected} (contract: list returns the thread's checkpoints "
            "of that namespace (every namespace without checkpoint_ns), newest first by checkpoint id; "
            "filter is metadata equality, before is exclusive, limit caps the result after filtering)")
        )
        for item in got:
            cid, n = item.config["configurable"]["checkpoint_id"], item.config["configurable"].get("checkpoint_ns", "")
            if cid in self.model.ns(tid, n):
                self.check_tuple(item, tid, n, self.model.ns(tid, n)[cid], f"list ({self.api(use_sync)}) item")

    @rule(kind=st.one_of(st.none(), st.sampled_from(["x", "y"])), use_sync=st.booleans())
    def list_everywhere(self, kind: str | None, use_sync: bool) -> None:
        flt: dict[str, Any] = {"tag": self.tag}
        if kind is not None:
            flt["kind"] = kind
        got = sorted(
            (t.config["configurable"]["thread_id"], t.config["configurable"].get("checkpoint_ns", ""),
             t.config["configurable"]["checkpoint_id"])
            for t in self.call(use_sync, "list", None, filter=flt)
        )
        expected = sorted(
            (tid, n, cid)
            for tid, namespaces in self.model.threads.items() for n, entries in namespaces.items()
            for cid, s in entries.items() if kind is None or s.metadata["kind"] == kind
        )
        assert got == expected, (
            f"contract: list(None, filter=...) ({self.api(use_sync)}) returns exactly the matching "
            f"checkpoints of every thread and namespace\nfilter={flt}: found {len(got)}, the model "
            f"{len(expected)}; missing {sorted(set(expected) - set(got))[:3]}, extra "
            f"{sorted(set(got) - set(expected))[:3]}"
        )

    @rule(thread=st.integers(0, 1), ns=st.integers(0, 1), pick=st.integers(0, 20),
          channels=st.lists(st.sampled_from([*_MACHINE_CHANNELS, MISSING_CHANNEL]), min_size=1, unique=True),
          use_sync=st.booleans())
    def delta_history(self, thread: int, ns: int, pick: int, channels: list[str], use_sync: bool) -> None:
        stored = self.stored(thread, ns, pick)
        if stored is None:
            return
        tid, ns_name = self.threads[thread], _MACHINE_NAMESPACES[ns]
        got = self.call(use_sync, "get_delta_channel_history",
                        config=config_for(tid, stored.id, ns_name), channels=channels)
        expected = self.model.history(tid, ns_name, stored.id, channels)
        normalized = {ch: {**dict(e), "writes": _norm_writes(e.get("writes"))} for ch, e in got.items()}
        assert normalized == expected, (
            named(f"delta history ({self.api(use_sync)}) of {stored.id} for {channels}: {normalized} != "
            f"{expected} (contract: delta history walks parent links over what is stored, writes oldest "
            "first, seed at the nearest ancestor holding a value)")
        )

    # -- extended operations ----------------------------------------------------------

    @rule(source=st.integers(0, 1), use_sync=st.booleans())
    def copy_thread(self, source: int, use_sync: bool) -> None:
        if not self.target.has("copy_thread") or len(self.threads) >= 4:
            return
        target = self.new_thread()
        self.call(use_sync, "copy_thread", self.threads[source], target)
        self.model.copy_thread(self.threads[source], target)
        self.last_contract = (
            "copy_thread copies every checkpoint of every namespace, with its writes, into the "
            "target and leaves the source as it was"
        )
        for ch, n in itertools.product(_MACHINE_CHANNELS, _MACHINE_NAMESPACES):
            if (self.threads[source], n, ch) in self.versions:
                self.versions[(target, n, ch)] = self.versions[(self.threads[source], n, ch)]
        # The copy replaces the source in the machine's view half the time, so later steps
        # write on the copy and the source must stay as it was.
        self.threads.append(target)
        self.threads[0], self.threads[-1] = self.threads[-1], self.threads[0]

    @rule(which=st.sets(st.integers(0, 1), min_size=1), strategy=st.sampled_from(["keep_latest", "delete"]),
          use_sync=st.booleans())
    def prune(self, which: set[int], strategy: str, use_sync: bool) -> None:
        if not self.target.has("prune"):
            return
        threads = [self.threads[i] for i in sorted(which)]
        before = self.everything()
        self.call(use_sync, "prune", threads, strategy=strategy)
        for tid in threads:
            self.model.prune(tid, strategy)
        self.forget(before, "prune", "prune (keep_latest) keeps, per namespace of every thread named, exactly the latest checkpoint and the ancestors its delta reconstruction reads; prune (delete) removes the threads")

    @rule(runs=st.sets(st.integers(0, 1), min_size=1), use_sync=st.booleans())
    def delete_for_runs(self, runs: set[int], use_sync: bool) -> None:
        if not self.target.has("delete_for_runs"):
            return
        before = self.everything()
        self.call(use_sync, "delete_for_runs", [self.runs[r] for r in sorted(runs)])
        self.model.delete_for_runs({self.runs[r] for r in runs})
        self.forget(before, "delete_for_runs", "delete_for_runs deletes the runs' checkpoints in every thread and namespace, except ancestors a surviving checkpoint's delta reconstruction reads")

    @rule(thread=st.integers(0, 1), use_sync=st.booleans())
    def delete_thread(self, thread: int, use_sync: bool) -> None:
        before = self.everything()
        self.call(use_sync, "delete_thread", self.threads[thread])
        self.model.delete_thread(self.threads[thread])
        self.forget(before, "delete_thread", "delete_thread removes every namespace of the thread and nothing else")

    # -- invariants -------------------------------------------------------------------

    @invariant()
    def every_checkpoint_matches(self) -> None:
        for tid in set(self.threads) | set(self.model.threads):
            for ns in _MACHINE_NAMESPACES:
                listed = self.session.run(_collect(self.saver, config_for(tid, ns=ns)))
                assert _ids(listed) == self.model.ids(tid, ns), (
                    named(f"thread {tid} namespace {ns!r}: list -> {_ids(listed)} != {self.model.ids(tid, ns)} "
                    f"(contract: {self.last_contract})")
                )
                entries = self.model.ns(tid, ns)
                for item in listed:
                    stored = entries[item.config["configurable"]["checkpoint_id"]]
                    self.check_tuple(item, tid, ns, stored, f"thread {tid} checkpoint {stored.id} "
                                     f"(last operation: {self.last_contract})")

    def teardown(self) -> None:
        for tid in set(self.threads) | set(self.model.threads):
            self.session.run(self.saver.adelete_thread(tid))


@pytest.mark.parametrize("mode", ["full", "delta"])
def test_state_machine_matches_model(saver_target: Any, mode: str) -> None:
    """Random saver operations (full or delta mode) agree with a plain-dict model."""
    with saver_target.session() as session:
        machine = type(f"SaverMachine_{mode}", (SaverMachine,), {"mode": mode})
        # A factory: hypothesis's parameter is named for one, though annotated as a class.
        run_state_machine_as_test(
            lambda: machine(session),  # type: ignore[arg-type]
            settings=settings(suppress_health_check=list(HealthCheck)),
        )
