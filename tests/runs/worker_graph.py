"""The graph and the worker process of the worker end-to-end test (run as a script)."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph

#: Steps the graph takes; each sleeps `STEP_SECONDS`, so a run lasts a few seconds.
STEPS = 8
STEP_SECONDS = 0.25


class State(TypedDict):
    n: int


def step(state: State) -> State:
    time.sleep(STEP_SECONDS)
    return {"n": state["n"] + 1}


def build(saver: Any) -> Any:
    """A graph that counts to `STEPS`, one checkpoint per step."""
    builder = StateGraph(State)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", lambda s: END if s["n"] >= STEPS else "step")
    return builder.compile(checkpointer=saver)


async def _main(url: str, redis: str, thread_id: str, owner: str, ttl: float) -> None:
    import runstore
    from runstore.worker import Worker

    async with runstore.open(checkpointer=url, events=url, runs=url, streams=redis) as stores:
        worker = Worker(
            stores.runs, stores.checkpointer, owner=owner, ttl=ttl, grace=0.2,
            streams=stores.streams, events=stores.events,
        )  # fmt: skip
        lease = await worker.start(thread_id)
        print(f"started {lease.run['run_id']} {lease.fence}", flush=True)
        done = await worker.execute(lease, lambda held: worker.invoke(build(stores.checkpointer), {"n": 0}, held))
        print(f"{done.outcome} {done.run['status']}", flush=True)


if __name__ == "__main__":
    url, redis, thread_id, owner, ttl = sys.argv[1:6]
    asyncio.run(_main(url, redis, thread_id, owner, float(ttl)))
