"""The saver contract for the sync twins (capability ``sync_api``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given

from runstore.errors import SyncCallOnEventLoopError

from ..savers_checks import (
    check_history,
    check_node,
    checkpoint_ids,
    collect,
)
from ..savers_model import (
    checkpoint_trees,
    config_for,
    new_thread_id,
    write_tree_sync,
)


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
                    await check_node(saver, tree, i)
                    sync_tuple = await asyncio.to_thread(saver.get_tuple, tree.config(i))
                    async_tuple = await saver.aget_tuple(tree.config(i))
                    assert sync_tuple == async_tuple, "contract: get_tuple == aget_tuple"
                listed = await asyncio.to_thread(
                    lambda: list(saver.list(config_for(tree.thread_id)))
                )
                assert checkpoint_ids(listed) == checkpoint_ids(await collect(saver, config_for(tree.thread_id)))
                hist = await asyncio.to_thread(
                    lambda: saver.get_delta_channel_history(
                        config=tree.config(spec.target), channels=spec.query
                    )
                )
                check_history(tree, spec.target, spec.query, hist)
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
                        await check_node(saver, tree, i, target,
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
