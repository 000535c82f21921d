"""Quick timing of `SqliteSaver` against LangGraph's stock `AsyncSqliteSaver` (not a test).

Run: ``.venv/bin/python tests/savers/bench_sqlite_saver.py [--turns 200] [--repeat 3]``.
A real `StateGraph` takes one human and one AI message of 128 bytes per turn, in full
and delta mode; also times delta history at 1000 ancestors against the base-class
walk on the same saver. Prints medians; `runstore bench checkpoint` is the real bench.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import START, StateGraph

from runstore.checkpoint.modes import get_thread_state_schema
from runstore.options import BackendOptions
from runstore.plugins.sqlite.saver import SqliteSaver
from runstore.settings import Settings
from runstore.urls import BackendURL


def build(saver: Any, mode: str) -> Any:
    schema = get_thread_state_schema(mode, 10)

    async def agent(state: dict[str, Any]) -> dict[str, Any]:
        return {"messages": [AIMessage(content="a" * 128, id=str(uuid.uuid4()))]}

    builder = StateGraph(schema)
    builder.add_node("agent", agent)
    builder.add_edge(START, "agent")
    return builder.compile(checkpointer=saver)


async def turns(saver: Any, mode: str, n: int) -> float:
    graph = build(saver, mode)
    config = {"configurable": {"thread_id": str(uuid.uuid4())}}
    start = time.perf_counter()
    for _ in range(n):
        await graph.ainvoke(
            {"messages": [HumanMessage(content="h" * 128, id=str(uuid.uuid4()))]}, config
        )
    elapsed = time.perf_counter() - start
    state = await graph.aget_state(config)
    assert len(state.values["messages"]) == 2 * n, len(state.values["messages"])
    return n / elapsed


async def ours(path: Path, synchronous: str = "normal") -> tuple[SqliteSaver, BackendOptions]:
    options = BackendOptions(settings=Settings().merged({"sqlite": {"synchronous": synchronous}}))
    saver = await SqliteSaver.open(BackendURL.for_file("sqlite", path), options)
    return saver, options


async def stock(path: Path) -> tuple[Any, Any]:
    import aiosqlite
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    conn = await aiosqlite.connect(str(path))
    saver = AsyncSqliteSaver(conn)
    await saver.setup()
    return saver, conn


async def one_round(n: int, tmp: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for mode in ("full", "delta"):
        saver, conn = await stock(tmp / f"stock-{mode}-{uuid.uuid4().hex}.db")
        try:
            out[f"stock/{mode}"] = await turns(saver, mode, n)
        finally:
            await conn.close()
        for sync in ("normal", "full"):
            saver2, options = await ours(tmp / f"ours-{mode}-{sync}-{uuid.uuid4().hex}.db", sync)
            try:
                out[f"ours-{sync}/{mode}"] = await turns(saver2, mode, n)
            finally:
                await options.aclose()
    return out


async def history(n_ancestors: int, tmp: Path) -> dict[str, float]:
    """Delta history at ``n_ancestors`` (snapshot frequency above it): native vs base walk."""
    saver, options = await ours(tmp / f"hist-{uuid.uuid4().hex}.db")
    try:
        schema = get_thread_state_schema("delta", n_ancestors * 10)

        async def agent(state: dict[str, Any]) -> dict[str, Any]:
            return {"messages": [AIMessage(content="a" * 128, id=str(uuid.uuid4()))]}

        builder = StateGraph(schema)
        builder.add_node("agent", agent)
        builder.add_edge(START, "agent")
        graph = builder.compile(checkpointer=saver)
        config = {"configurable": {"thread_id": str(uuid.uuid4())}}
        # 3 checkpoints per turn
        for _ in range(n_ancestors // 3 + 1):
            await graph.ainvoke(
                {"messages": [HumanMessage(content="h" * 128, id=str(uuid.uuid4()))]}, config
            )
        native, base = [], []
        for _ in range(5):
            t0 = time.perf_counter()
            a = await saver.aget_delta_channel_history(config=config, channels=["messages"])
            native.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            b = await BaseCheckpointSaver.aget_delta_channel_history(
                saver, config=config, channels=["messages"]
            )
            base.append(time.perf_counter() - t0)
            assert a == b
        return {
            "native_ms": statistics.median(native) * 1000,
            "base_ms": statistics.median(base) * 1000,
        }
    finally:
        await options.aclose()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip-turns", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        if not args.skip_turns:
            rounds = [await one_round(args.turns, tmp) for _ in range(args.repeat)]
            med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
            for key, value in med.items():
                print(f"{key:22s} {value:8.1f} turns/s")
            for mode in ("full", "delta"):
                for sync in ("normal", "full"):
                    ratio = med[f"ours-{sync}/{mode}"] / med[f"stock/{mode}"]
                    print(f"ratio {mode} (ours synchronous={sync} / stock): {ratio:.2f}x")
        for n in (100, 1000):
            h = await history(n, tmp)
            print(
                f"delta history @{n}: native {h['native_ms']:.2f} ms, base walk "
                f"{h['base_ms']:.2f} ms, speedup {h['base_ms'] / h['native_ms']:.1f}x"
            )


if __name__ == "__main__":
    asyncio.run(main())
