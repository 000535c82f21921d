"""The saver contract for copying and deleting: delete_thread, copy_thread, prune and
delete_for_runs, each leaving what delta reconstruction still needs.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ..savers_checks import (
    check_history,
    check_node,
    checkpoint_ids,
    collect,
    norm_writes,
)
from ..savers_model import (
    MISSING_CHANNEL,
    NodeSpec,
    TreeSpec,
    checkpoint_trees,
    config_for,
    fold,
    make_checkpoint,
    named,
    new_checkpoint_id,
    new_thread_id,
    write_tree,
)


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
                assert await collect(saver, config_for(doomed.thread_id)) == []
                history = await saver.aget_delta_channel_history(
                    config=doomed.config(len(doomed.nodes) - 1), channels=["a"]
                )
                assert norm_writes(history["a"]["writes"]) == [] and "seed" not in history["a"]
                for i in range(len(kept.nodes)):
                    await check_node(saver, kept, i)
                # Nothing of the deleted thread may come back when its ids are used again:
                # the same checkpoints, put without values or writes, read back empty.
                for node in doomed.nodes:
                    await saver.aput(
                        config_for(doomed.thread_id), make_checkpoint(node.id, {}, node.versions),
                        {"source": "loop", "step": 0}, {},
                    )
                    again = await saver.aget_tuple(config_for(doomed.thread_id, node.id))
                    assert again is not None
                    assert norm_writes(again.pending_writes) == [], (
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
                    await check_node(saver, tree, i, target,
                                      writes_contract="copy_thread copies every pending write")
                    await check_node(saver, tree, i)
                got = await saver.aget_delta_channel_history(
                    config=tree.config(spec.target, target), channels=spec.query
                )
                check_history(tree, spec.target, spec.query, got)
                assert len(await collect(saver, config_for(target))) == len(tree.nodes), (
                    "contract: copy_thread copies the whole parent chain"
                )
                # The copy shares nothing with its source: a write on the copy (a task the
                # source never ran) never shows up on the source.
                for i in range(len(tree.nodes)):
                    await saver.aput_writes(tree.config(i, target), [("copy_only", i)], "copy-only-task")
                for i in range(len(tree.nodes)):
                    await check_node(saver, tree, i, writes_contract=(
                        "copy_thread shares nothing with the source: a write on the copy never shows "
                        "up on the source"
                    ))

            session.run(body())

        check()


@pytest.mark.requires("copy_thread")
def test_copy_thread_names_the_copy_in_metadata(saver_target: Any) -> None:
    """copy_thread rewrites the copies' metadata ``thread_id`` to the target in every
    namespace (LangGraph's Agent Server stores it there and filters a thread's history by
    it); the other metadata, the writes and the source stay as they were."""
    with saver_target.session() as session:

        @given(depths=st.lists(st.integers(1, 3), min_size=1, max_size=3))
        def check(depths: list[int]) -> None:
            async def body() -> None:
                saver = session.backend
                source, target = new_thread_id("src"), new_thread_id("copy")
                for n, depth in enumerate(depths):
                    ns = "" if n == 0 else f"child{n}:{new_thread_id('task')}"
                    parent, version = None, None
                    for step in range(depth):
                        cid = new_checkpoint_id()
                        version = saver.get_next_version(version, None)
                        metadata = {"source": "loop", "step": step, "thread_id": source, "graph_id": "agent"}
                        await saver.aput(
                            config_for(source, parent, ns), make_checkpoint(cid, {"a": step}, {"a": version}),
                            metadata, {"a": version},
                        )
                        await saver.aput_writes(config_for(source, cid, ns), [("a", f"w{step}")], f"task-{step}")
                        parent = cid
                await saver.acopy_thread(source, target)
                copied = await collect(saver, {"configurable": {"thread_id": target}})
                assert len(copied) == sum(depths), "contract: copy_thread copies every checkpoint of every namespace"
                for item in copied:
                    ns = item.config["configurable"].get("checkpoint_ns", "")
                    assert item.metadata.get("thread_id") == target, (
                        named(f"copied checkpoint in namespace {ns!r} has metadata thread_id "
                        f"{item.metadata.get('thread_id')!r} (contract: copy_thread rewrites the copies' "
                        "metadata thread_id to the target thread, in every namespace)")
                    )
                    assert item.metadata.get("graph_id") == "agent" and item.metadata.get("source") == "loop", (
                        "contract: copy_thread keeps the rest of the copied metadata"
                    )
                    assert [w[1:] for w in norm_writes(item.pending_writes)] == [
                        ("a", f"w{item.metadata['step']}")
                    ], "contract: copy_thread copies every pending write"
                found = await collect(saver, {"configurable": {"thread_id": target}}, filter={"thread_id": target})
                assert len(found) == len(copied), (
                    named(f"list(filter={{'thread_id': <copy>}}) finds {len(found)} of {len(copied)} copied "
                    "checkpoints (contract: copy_thread rewrites the copies' metadata thread_id to the target "
                    "thread, in every namespace)")
                )
                for item in await collect(saver, {"configurable": {"thread_id": source}}):
                    assert item.metadata.get("thread_id") == source, (
                        "contract: copy_thread leaves the source's metadata unchanged"
                    )
                await saver.adelete_thread(source)
                await saver.adelete_thread(target)

            session.run(body())

        check()


@pytest.mark.requires("prune")
def test_prune_accepts_the_agent_server_strategy_names(saver_target: Any) -> None:
    """prune takes ``delete_all`` (what LangGraph's Agent Server sends) as ``delete``, and
    refuses an unknown strategy with a ValueError naming the accepted ones."""
    with saver_target.session() as session:

        @given(spec=checkpoint_trees(max_nodes=4))
        def check(spec: Any) -> None:
            async def body() -> None:
                saver = session.backend
                doomed = await write_tree(saver, spec)
                kept = await write_tree(saver, spec)
                try:
                    await saver.aprune([doomed.thread_id], strategy="delete_all")
                except ValueError as exc:
                    pytest.fail(named(f"prune(strategy='delete_all') raised {exc!r} (contract: prune accepts "
                                      "'delete_all', the name LangGraph's Agent Server sends, as 'delete')"))
                assert await collect(saver, config_for(doomed.thread_id)) == [], (
                    "contract: prune accepts 'delete_all', the name LangGraph's Agent Server sends, as 'delete'"
                )
                for i in range(len(kept.nodes)):
                    await check_node(saver, kept, i)
                try:
                    await saver.aprune([kept.thread_id], strategy="keep_none")
                except ValueError as exc:
                    message = str(exc)
                    assert all(name in message for name in ("keep_latest", "delete")), (
                        named(f"the error was {message!r} (contract: an unknown prune strategy raises "
                              "ValueError naming the accepted strategies)")
                    )
                else:
                    pytest.fail("contract: an unknown prune strategy raises ValueError, never a silent no-op")
                for i in range(len(kept.nodes)):
                    await check_node(saver, kept, i)
                await saver.adelete_thread(kept.thread_id)

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
                assert norm_writes(head.pending_writes) == tree.nodes[latest].writes.ordered(), (
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
                left = set(checkpoint_ids(await collect(saver, config_for(tree.thread_id))))
                assert left <= allowed, (
                    named(f"{len(left - allowed)} checkpoint(s) survive that delta reconstruction does "
                    "not need (contract: prune keep_latest retains only the latest checkpoint)")
                )
                for i in range(len(other.nodes)):
                    await check_node(saver, other, i)
                try:
                    await saver.aprune([other.thread_id], strategy="keep_everything")
                except ValueError:
                    pass
                else:
                    pytest.fail("contract: an unknown prune strategy raises ValueError, never a silent no-op")
                for i in range(len(other.nodes)):
                    await check_node(saver, other, i)
                await saver.aprune([tree.thread_id], strategy="delete")
                assert await collect(saver, config_for(tree.thread_id)) == [], (
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
                left = set(checkpoint_ids(await collect(saver, config_for(tree.thread_id))))
                for i, node in enumerate(tree.nodes):
                    if i in survivors:
                        assert node.id in left, "contract: delete_for_runs keeps other runs"
                        parent = node.parent
                        await check_node(
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
