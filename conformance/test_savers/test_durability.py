"""The saver contract across instances, processes and threads: reopening keeps the data,
another process's writes are visible, concurrent puts all land.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from ..processes import plugins_env
from ..savers_checks import (
    Saver,
    check_history,
    check_node,
    checkpoint_ids,
    collect,
    norm_writes,
)
from ..savers_model import (
    MISSING_CHANNEL,
    Tree,
    config_for,
    make_checkpoint,
    new_checkpoint_id,
    new_thread_id,
    write_tree,
)
from ..session import development_plugins


@pytest.mark.requires("durable")
def test_durable_reopen_keeps_data(saver_target: Any) -> None:
    """Closing and reopening the saver keeps checkpoints, writes and parent links."""
    from ..savers_model import NodeSpec, TreeSpec

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
            await check_node(saver, tree, i)
        got = await saver.aget_delta_channel_history(
            config=tree.config(spec.target), channels=spec.query
        )
        check_history(tree, spec.target, spec.query, got)

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
        assert norm_writes(got.pending_writes) == [("child-task", "n", 42)]
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
            got = checkpoint_ids(await collect(saver, config_for(thread)))
            assert got == list(reversed(ids)), "contract: concurrent puts on one saver all land"

    saver_target.run(body)
