"""Child process of test_server_prune.py: the Agent Server's checkpointer loading and its
gRPC ``Checkpointer.Prune`` servicer, in a process whose environment is what
``langgraph dev`` sets (the server's config module reads it on import).

Prints one JSON line: checkpoints left per thread after each prune.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any
from unittest.mock import Mock


async def _chain(saver: Any, thread_id: str, length: int) -> None:
    from langgraph.checkpoint.base import empty_checkpoint

    config: Any = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    for step in range(length):
        config = await saver.aput(config, empty_checkpoint(), {"source": "loop", "step": step}, {})


async def _count(saver: Any, thread_id: str) -> int:
    return len([c async for c in saver.alist({"configurable": {"thread_id": thread_id}})])


async def main() -> dict[str, Any]:
    from langgraph_api._checkpointer import _adapter
    from langgraph_api.grpc.servicers.checkpointer import CheckpointerServicerImpl
    from langgraph_grpc_common.proto import checkpointer_pb2

    strategy = checkpointer_pb2.PruneRequest.PruneStrategy
    await _adapter.collect_checkpointer_from_env()  # reads LANGGRAPH_CHECKPOINTER's path
    saver = await _adapter.get_checkpointer()
    out: dict[str, Any] = {"saver": type(saver._inner).__name__}
    try:
        await _chain(saver, "kept", 3)
        await _chain(saver, "doomed", 3)
        servicer = CheckpointerServicerImpl()
        for name, thread_id in (("KEEP_LATEST", "kept"), ("DELETE_ALL", "doomed")):
            request = checkpointer_pb2.PruneRequest(thread_ids=[thread_id], strategy=getattr(strategy, name))
            try:
                # A servicer context: the servicer asks for its code only when the call fails.
                await servicer.Prune(request, Mock(**{"code.return_value": None}))
            except Exception as exc:
                out[name] = f"{type(exc).__name__}: {exc}"
                continue
            out[name] = {t: await _count(saver, t) for t in ("kept", "doomed")}
    finally:
        await _adapter.exit_checkpointer()
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main())), file=sys.stdout)
