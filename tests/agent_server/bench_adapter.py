"""Turns per second and ``aget_tuple`` calls per turn on the Agent Server's storage path.

Run: ``python -m tests.agent_server.bench_adapter [--turns N] [--out FILE.jsonl]``.

The server hands a graph either its own default saver (the in-memory runtime's
``InMemorySaver``) or a custom checkpointer wrapped in its adapter
(``langgraph_api._checkpointer._adapter``), which forwards ``aget_tuple`` but not the
saver's own delta-history walk: LangGraph then walks the parent chain with
``aget_tuple``. This drives a real graph through exactly those objects, in this
process (``langgraph dev``'s HTTP layer and run queue add the same latency to every
saver: its queue polls every half second), for the default saver and runstore's
factory on sqlite and PostgreSQL, in full and delta mode, all in one run. Each row is
one (mode, backend): turns/s, ``aget_tuple`` calls per turn (what the server asks) and
the calls that reach storage per turn (under runstore's wrappers), over ``--turns``
turns on each of ``--threads`` threads. ``--dev-turns N`` adds rows timed through real
``langgraph dev`` servers (``suite: agent-server-dev``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

#: What ``langgraph dev`` puts in the server's environment (its config module reads it on import).
DEV_ENV = {
    "MIGRATIONS_PATH": "__inmem",
    "DATABASE_URI": ":memory:",
    "REDIS_URI": "fake",
    "LANGGRAPH_RUNTIME_EDITION": "inmem",
    "LANGSMITH_LANGGRAPH_API_VARIANT": "local_dev",
    "LANGSMITH_TRACING": "false",
}


def _graph(mode: str, checkpointer: Any) -> Any:
    from langchain_core.messages import AIMessage
    from langgraph.graph import END, START, StateGraph

    import runstore

    async def agent(state: dict[str, Any]) -> dict[str, Any]:
        return {"messages": [AIMessage(content=f"echo {len(state['messages'])}")]}

    builder = StateGraph(runstore.get_thread_state_schema(mode))
    builder.add_node("agent", agent)
    builder.add_edge(START, "agent")
    builder.add_edge("agent", END)
    return builder.compile(checkpointer=checkpointer)


@asynccontextmanager
async def _saver(backend: str, mode: str, url: str | None) -> AsyncIterator[tuple[Any, Any]]:
    """``(what the graph gets, the saver whose aget_tuple is counted)``."""
    if backend == "default":
        from langgraph_runtime_inmem.checkpoint import InMemorySaver

        saver = InMemorySaver()
        yield saver, saver
        return
    from langgraph_api._checkpointer._adapter import (
        CheckpointerCapabilities,
        _CustomCheckpointerAdapter,
    )

    from runstore import agent_server
    from runstore.checkpoint.forwarding import ForwardingSaver
    from runstore.checkpoint.walk import ParentWalkSaver

    os.environ["RUNSTORE_CHECKPOINTER_URL"] = str(url)
    async with agent_server.checkpointer() as inner:
        if backend.endswith("-no-walk-memo"):
            # The same saver with `ParentWalkSaver` keeping nothing: what the memo saves.
            layer: Any = inner
            while isinstance(layer, ForwardingSaver):
                if isinstance(layer, ParentWalkSaver):
                    layer.sealed.max_entries = 0
                layer = layer.inner
        adapter = _CustomCheckpointerAdapter(inner, CheckpointerCapabilities.from_type(type(inner)))
        yield adapter, inner


async def _measure(backend: str, mode: str, url: str | None, turns: int, threads: int) -> dict[str, Any]:
    from runstore.checkpoint.forwarding import unwrap_saver

    async with _saver(backend, mode, url) as (checkpointer, counted):
        calls = {"asked": 0, "read": 0}

        def count(saver: Any, what: str) -> None:
            original = saver.aget_tuple

            async def counting(config: Any) -> Any:
                calls[what] += 1
                return await original(config)

            saver.aget_tuple = counting  # the adapter and the delta walk call it by attribute

        # What the server asks the saver, and what reaches storage (under runstore's wrappers).
        count(counted, "asked")
        count(unwrap_saver(counted), "read")
        graph = _graph(mode, checkpointer)
        ids = [f"bench-{backend}-{mode}-{i}-{time.time_ns()}" for i in range(threads)]

        async def converse(thread_id: str) -> None:
            config = {"configurable": {"thread_id": thread_id}}
            for turn in range(turns):
                await graph.ainvoke({"messages": [("user", f"turn {turn}")]}, config)

        began = time.perf_counter()
        await asyncio.gather(*(converse(t) for t in ids))
        seconds = time.perf_counter() - began
        state = await graph.aget_state({"configurable": {"thread_id": ids[0]}})
        assert len(state.values["messages"]) == 2 * turns, "the bench graph lost messages"
    done = turns * threads
    return {
        "suite": "agent-server-adapter", "mode": mode, "backend": backend, "turns": done,
        "threads": threads, "seconds": round(seconds, 3), "turns_per_s": round(done / seconds, 1),
        "aget_tuple_per_turn": round(calls["asked"] / done, 2),
        "storage_reads_per_turn": round(calls["read"] / done, 2),
    }


def through_dev(turns: int, threads: int, postgres_url: str | None, root: Path) -> list[dict[str, Any]]:
    """Turns/s through real ``langgraph dev`` servers (HTTP, the dev runtime's run queue),
    one server per (mode, backend), ``threads`` threads of ``turns`` ``runs.wait`` each."""
    from langgraph_sdk import get_client

    from .server import AgentServer

    rows = []
    for mode in ("full", "delta"):
        urls: dict[str, str | None] = {"default": None, "sqlite": f"sqlite:///{root}/dev-{mode}.db"}
        if postgres_url:
            urls["postgres"] = postgres_url
        for backend, url in urls.items():
            env = {"RUNSTORE_CHECKPOINT_CHANNEL_MODE": mode, **({"RUNSTORE_CHECKPOINTER_URL": url} if url else {})}
            server = AgentServer(root / f"dev-{backend}-{mode}", runstore=backend != "default", env=env)
            started = server.start()
            try:
                async def drive(url: str = server.url) -> float:
                    client = get_client(url=url)
                    ids = [(await client.threads.create())["thread_id"] for _ in range(threads)]

                    async def converse(thread_id: str) -> None:
                        for turn in range(turns):
                            await client.runs.wait(thread_id, "agent", input={"messages": [
                                {"role": "user", "content": f"turn {turn}"}]})

                    began = time.perf_counter()
                    await asyncio.gather(*(converse(t) for t in ids))
                    return time.perf_counter() - began

                seconds = asyncio.run(drive())
            finally:
                server.stop()
            row = {"suite": "agent-server-dev", "mode": mode, "backend": backend, "turns": turns * threads,
                   "threads": threads, "seconds": round(seconds, 3),
                   "turns_per_s": round(turns * threads / seconds, 2), "server_start_s": round(started, 2)}
            print(json.dumps(row), file=sys.stderr)
            rows.append(row)
    return rows


async def main(turns: int, threads: int, postgres_url: str | None, rounds: int) -> list[dict[str, Any]]:
    rows = []
    home = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # the default saver keeps its files under ./.langgraph_api
        # Rounds interleave every configuration, so a busy machine slows them alike.
        for mode in [m for _ in range(rounds) for m in ("full", "delta")]:
            from runstore.checkpoint.modes import reset_checkpoint_mode_for_tests

            # One process measures both modes: forget the first mode's schemas (a server
            # runs one mode, read from runstore.yaml / RUNSTORE_* by its graph and factory).
            reset_checkpoint_mode_for_tests()
            os.environ["RUNSTORE_CHECKPOINT_CHANNEL_MODE"] = mode
            urls: dict[str, str | None] = {"default": None, "sqlite": f"sqlite:///{tmp}/{mode}.db"}
            if postgres_url:
                urls["postgres"] = postgres_url
            if mode == "delta":
                urls.update({f"{b}-no-walk-memo": u for b, u in list(urls.items()) if b != "default"})
            for backend, url in urls.items():
                row = await _measure(backend, mode, url, turns, threads)
                print(json.dumps(row), file=sys.stderr)
                rows.append(row)
        os.chdir(home)
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dev-turns", type=int, default=0,
                        help="also time this many turns per thread through real langgraph dev servers")
    parser.add_argument("--postgres", default=None, help="a PostgreSQL URL (a schema of its own)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    for key, value in DEV_ENV.items():
        os.environ.setdefault(key, value)
    results = asyncio.run(main(args.turns, args.threads, args.postgres, args.rounds))
    if args.dev_turns:
        with tempfile.TemporaryDirectory() as dev_root:
            results += through_dev(args.dev_turns, args.threads, args.postgres, Path(dev_root))
    by_config: dict[tuple[str, str], list[float]] = {}
    for row in results:
        if row["suite"] != "agent-server-adapter":
            continue
        by_config.setdefault((row["mode"], row["backend"]), []).append(row["turns_per_s"])
    for (mode, backend), rates in by_config.items():
        summary = {"summary": True, "mode": mode, "backend": backend, "rounds": len(rates),
                   "median_turns_per_s": round(statistics.median(rates), 1)}
        print(json.dumps(summary), file=sys.stderr)
        results.append(summary)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("".join(json.dumps(r) + "\n" for r in results))
