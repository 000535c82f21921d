"""Quick timing: runstore PostgresSaver vs LangGraph's stock AsyncPostgresSaver.

Not a test (no thresholds; pytest does not collect it). Run:

    .venv/bin/python tests/savers/timing_postgres_saver.py [full|delta] [turns] [repeats] [on|off]

The last argument is ``postgres.saver_synchronous_commit`` for our saver (default on).

Each case runs a real one-node StateGraph (1 human + 1 AI 128-byte message per turn)
in a fresh schema and prints turns/s (median of repeats), plus delta-history cost at
1000 ancestors: our one-query walk vs the base-class walk on the same saver.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import uuid
from typing import Any

import asyncpg

BASE = "postgresql://postgres@127.0.0.1:5432/test"


async def _schema() -> str:
    name = "timing_" + uuid.uuid4().hex[:10]
    conn = await asyncpg.connect(BASE)
    try:
        await conn.execute(f'CREATE SCHEMA "{name}"')
    finally:
        await conn.close()
    return name


async def _drop(name: str) -> None:
    conn = await asyncpg.connect(BASE)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    finally:
        await conn.close()


async def _turns(saver: Any, mode: str, turns: int, freq: int) -> float:
    from langchain_core.messages import HumanMessage

    from runstore.bench.checkpoint import build_graph, delta_config, make_payloads

    payloads = make_payloads(7, turns, 128)
    graph = build_graph(mode, freq, payloads, saver)
    config = delta_config({"configurable": {"thread_id": uuid.uuid4().hex}}, mode)
    start = time.perf_counter()
    for turn in range(turns):
        await graph.ainvoke(
            {"messages": [HumanMessage(content=payloads[turn][0], id=f"human-{turn:06d}")]},
            config,
        )
    elapsed = time.perf_counter() - start
    state = await graph.aget_state(config)
    assert len(state.values["messages"]) == 2 * turns, len(state.values["messages"])
    return turns / elapsed


async def run_ours(mode: str, turns: int, freq: int, sync_commit: str = "on") -> float:
    from runstore.options import BackendOptions
    from runstore.plugins.postgres.saver import PostgresSaver
    from runstore.settings import Settings
    from runstore.urls import BackendURL

    settings = Settings().merged({"postgres": {"saver_synchronous_commit": sync_commit}})
    schema = await _schema()
    try:
        async with BackendOptions.scope(settings) as options:
            saver = await PostgresSaver.open(BackendURL.parse(f"{BASE}?schema={schema}"), options)
            return await _turns(saver, mode, turns, freq)
    finally:
        await _drop(schema)


async def run_stock(mode: str, turns: int, freq: int) -> float:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    schema = await _schema()
    try:
        dsn = f"{BASE}?options=-csearch_path%3D{schema}"
        async with AsyncPostgresSaver.from_conn_string(dsn) as saver:
            await saver.setup()
            return await _turns(saver, mode, turns, freq)
    finally:
        await _drop(schema)


async def delta_walk(ancestors: int) -> tuple[float, float]:
    """Seconds for our native walk and the base-class walk over ``ancestors`` checkpoints."""
    from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint

    from runstore.options import BackendOptions
    from runstore.plugins.postgres.saver import PostgresSaver
    from runstore.urls import BackendURL

    schema = await _schema()
    try:
        async with BackendOptions.scope() as options:
            saver = await PostgresSaver.open(BackendURL.parse(f"{BASE}?schema={schema}"), options)
            config: Any = {"configurable": {"thread_id": "walk", "checkpoint_ns": ""}}
            version = None
            for i in range(ancestors + 1):
                cp = empty_checkpoint()
                version = saver.get_next_version(version, None)
                if i == 0:
                    cp["channel_values"] = {"messages": ["seed"]}
                cp["channel_versions"] = {"messages": version}
                config = await saver.aput(config, cp, {"step": i}, {"messages": version})
                await saver.aput_writes(config, [("messages", f"m{i}")], f"task{i}")
            ours, base = [], []
            for _ in range(3):
                t = time.perf_counter()
                a = await saver.aget_delta_channel_history(config=config, channels=["messages"])
                ours.append(time.perf_counter() - t)
                t = time.perf_counter()
                b = await BaseCheckpointSaver.aget_delta_channel_history(
                    saver, config=config, channels=["messages"]
                )
                base.append(time.perf_counter() - t)
                assert a == b, "walks disagree"
            return statistics.median(ours), statistics.median(base)
    finally:
        await _drop(schema)


async def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "full"
    turns = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    sync_commit = sys.argv[4] if len(sys.argv) > 4 else "on"
    freq = 10
    if mode == "delta":
        from runstore.bench.checkpoint import freeze_mode

        freeze_mode("delta", freq)
    stock, ours = [], []
    for _ in range(repeats):
        stock.append(await run_stock(mode, turns, freq))
        ours.append(await run_ours(mode, turns, freq, sync_commit))
    s, o = statistics.median(stock), statistics.median(ours)
    print(
        f"{mode} (synchronous_commit={sync_commit}): stock AsyncPostgresSaver {s:.1f} turns/s  runstore PostgresSaver {o:.1f} "
        f"turns/s  ratio {o / s:.2f}x  (runs stock={[round(x) for x in stock]} "
        f"ours={[round(x) for x in ours]})"
    )
    if mode == "full":
        native, walk = await delta_walk(1000)
        print(
            f"delta history @1000 ancestors: native {native * 1000:.1f} ms, base walk "
            f"{walk * 1000:.1f} ms, speedup {walk / native:.1f}x"
        )


if __name__ == "__main__":
    asyncio.run(main())
