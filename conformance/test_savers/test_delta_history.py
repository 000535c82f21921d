"""The saver contract for delta channel history: the parent-link walk, forks, where a
channel's walk stops, and what declaring ``delta_history`` promises.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, note
from langgraph.checkpoint.base import BaseCheckpointSaver

from ..savers_checks import (
    Saver,
    check_history,
)
from ..savers_model import (
    MISSING_CHANNEL,
    checkpoint_trees,
    write_tree,
)


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
                check_history(tree, spec.target, spec.query, got)
                leaf = len(tree.nodes) - 1
                got_leaf = await saver.aget_delta_channel_history(
                    config=tree.config(leaf), channels=tree.spec.channels
                )
                check_history(tree, leaf, tree.spec.channels, got_leaf)
                empty = await saver.aget_delta_channel_history(
                    config=tree.config(leaf), channels=[]
                )
                assert dict(empty) == {}, "contract: no channels requested -> empty mapping"

            session.run(body())

        check()


def test_delta_history_fork_sees_no_sibling(saver_target: Any) -> None:
    """A fork written after its sibling branch sees only its own ancestors' writes."""

    async def body(saver: Saver) -> None:
        from ..savers_model import NodeSpec, TreeSpec

        nodes = [
            NodeSpec(None, {"a": "snapshot"}, [("task-a", "~", ["a"])]),
            NodeSpec(0, {"a": "delta"}, [("task-a", "~", ["a", "a"])]),  # sibling branch
            NodeSpec(1, {"a": "delta"}, [("task-b", "~", ["a"])]),
            NodeSpec(0, {"a": "delta"}, [("task-c", "~", ["a"])]),  # the fork, written last
            NodeSpec(3, {"a": "delta"}, [("task-a", "~", ["a"])]),
        ]
        tree = await write_tree(saver, TreeSpec(["a"], nodes, 4, ["a"]))
        got = await saver.aget_delta_channel_history(config=tree.config(4), channels=["a"])
        check_history(tree, 4, ["a"], got)

    saver_target.run(body)


def test_delta_history_stops_at_plain_seed_and_snapshot(saver_target: Any) -> None:
    """Per channel the walk stops at its own nearest valued ancestor (snapshot or plain
    pre-delta value), includes that ancestor's writes and excludes the target's."""

    async def body(saver: Saver) -> None:
        from ..savers_model import NodeSpec, TreeSpec

        nodes = [
            NodeSpec(None, {"a": "plain", "b": "delta"}, [("t", "~", ["a", "b"])]),
            NodeSpec(0, {"a": "delta", "b": "snapshot"}, [("t", "~", ["a", "b"])]),
            NodeSpec(1, {"a": "delta", "b": "delta"}, [("t", "~", ["a", "b"])]),
            NodeSpec(2, {"a": "delta", "b": "delta"}, [("t", "~", ["a", "b"])]),
        ]
        query = ["a", "b", MISSING_CHANNEL]
        tree = await write_tree(saver, TreeSpec(["a", "b"], nodes, 3, query))
        got = await saver.aget_delta_channel_history(config=tree.config(3), channels=query)
        check_history(tree, 3, query, got)

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
