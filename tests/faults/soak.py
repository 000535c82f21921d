"""Soak: many short runs through an event store and a stream bridge; afterwards nothing
per-run may remain (bridge entries, tasks, Redis keys) and RSS stays flat.

Each run does what a runtime does: append events, publish to the bridge while a
subscriber follows, publish END. Every tenth run is abandoned without END (its stream
must expire), every tenth a subscriber leaves early, every tenth a late subscriber
replays a finished run and the run is cleaned up, and every tenth a subscriber waits for
a run that never starts, then leaves. Used by tests/faults/test_resources.py at a CI
size; run it by hand for the full soak:

    python -m tests.faults.soak --runs 10000 --stack embedded
    python -m tests.faults.soak --runs 10000 --stack servers

(``servers``: a throwaway PostgreSQL cluster and redis-server, tests/faults/servers.py.)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import runstore
from runstore import END, HEARTBEAT
from runstore.urls import BackendURL

#: Short lifetimes so that expiry happens within the soak (seconds), yet longer than a
#: loaded machine's pause between two calls of one run: a stream idle for
#: ``stream_ttl_seconds`` expires (its END then stands alone), and a late subscriber of an
#: expired run waits for a run that never comes.
LIFETIMES = {"late_subscriber_window_seconds": 5, "stream_ttl_seconds": 5, "heartbeat_interval_seconds": 5}
#: Generous bound of any wait in a run (a hang detector, never a timing assertion).
WAIT = 60.0
CONCURRENT = 10


def rss_bytes() -> int:
    """Resident set size of this process (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


@dataclass
class SoakResult:
    """What a soak measured."""

    runs: int
    events_written: int = 0
    events_stored: int = 0
    stream_events_acknowledged: int = 0
    stream_events_delivered: int = 0
    rss_samples: list[tuple[int, int]] = field(default_factory=list)  # (runs done, RSS bytes)
    leftovers: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


async def _run_once(stores: runstore.Stores, i: int, result: SoakResult) -> None:
    run_id, thread_id = f"run-{i}", f"thread-{i % 97}"
    bridge, events = stores.streams, stores.events
    kind = i % 10
    for n in range(2):
        await events.put(thread_id=thread_id, run_id=run_id, event_type="step", category="lifecycle",
                         content={"n": n}, user_id=None)
        result.events_written += 1

    async def follow(sub: AsyncIterator[Any], until_end: bool = True) -> int:
        got = 0
        async for item in sub:
            if item is END:
                break
            if item is not HEARTBEAT:
                got += 1
                if not until_end:
                    break
        await sub.aclose()  # type: ignore[attr-defined]
        return got

    if kind == 7:  # abandoned: never publishes END; its stream must expire
        for n in range(2):
            await bridge.publish(run_id, "values", {"n": n})
            result.stream_events_acknowledged += 1
        return
    if kind == 9:  # late subscriber, cleanup, and a subscriber to a run that never starts
        await bridge.publish(run_id, "values", {"n": 0})
        result.stream_events_acknowledged += 1
        await bridge.publish_end(run_id)
        replayed = await asyncio.wait_for(follow(bridge.subscribe(run_id)), WAIT)
        assert replayed == 1, f"run {run_id}: the late subscriber replayed {replayed} of 1 events"
        result.stream_events_delivered += replayed
        await bridge.cleanup(run_id)
        never = bridge.subscribe(f"never-{i}", heartbeat_interval=0.01)
        assert await anext(never) is HEARTBEAT
        await never.aclose()  # type: ignore[attr-defined]
        return
    follower = asyncio.ensure_future(follow(bridge.subscribe(run_id), until_end=kind != 8))
    await asyncio.sleep(0)
    for n in range(3):
        await bridge.publish(run_id, "values", {"n": n})
        result.stream_events_acknowledged += 1
    await bridge.publish_end(run_id)
    delivered = await asyncio.wait_for(follower, WAIT)
    if kind != 8:
        assert delivered == 3, f"run {run_id}: the follower saw {delivered} of 3 events"
    result.stream_events_delivered += delivered


def _per_run_state(stores: runstore.Stores) -> dict[str, int]:
    """What the bridge still holds per run."""
    bridge = stores.streams
    held = getattr(bridge, "_runs", None)
    if held is None:
        held = getattr(bridge, "_watches", {})
    return {"bridge_entries": len(held)}


async def soak(config: dict[str, Any], runs: int, *, redis_url: str | None = None, samples: int = 10) -> SoakResult:
    """Run ``runs`` runs on the stores ``config`` opens; wait for every expiry; count leftovers."""
    result = SoakResult(runs=runs)
    started = time.monotonic()
    baseline_tasks = len(asyncio.all_tasks())
    settings = {**config, "stream_bridge": {**LIFETIMES, **config.get("stream_bridge", {})}}
    async with runstore.open(settings) as stores:
        step = max(1, runs // samples)
        for first in range(0, runs, CONCURRENT):
            await asyncio.gather(*(_run_once(stores, i, result) for i in range(first, min(runs, first + CONCURRENT))))
            done = min(runs, first + CONCURRENT)
            if done % step < CONCURRENT or done == runs:
                gc.collect()
                result.rss_samples.append((done, rss_bytes()))
        # Everything per run expires within the late-subscriber window or the stream TTL.
        deadline = time.monotonic() + WAIT
        while True:
            state = _per_run_state(stores)
            keys = await _redis_keys(redis_url)
            if not state["bridge_entries"] and not keys["stream_keys"]:
                break
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        result.leftovers = {**state, **keys, "tasks_while_open": len(asyncio.all_tasks()) - baseline_tasks}
        for i in range(runs):
            stored = await stores.events.list_events(f"thread-{i % 97}", f"run-{i}", user_id=None)
            result.events_stored += len(stored)
    await asyncio.sleep(0)
    result.leftovers["tasks_after_close"] = len(asyncio.all_tasks()) - baseline_tasks
    result.leftovers.update({f"{k}_after_close": v for k, v in (await _redis_keys(redis_url)).items()})
    result.seconds = time.monotonic() - started
    return result


async def _redis_keys(url: str | None) -> dict[str, int]:
    """Keys in the (throwaway) Redis: stream keys, and keys without a TTL."""
    if url is None:
        return {"stream_keys": 0, "keys_without_ttl": 0}
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    try:
        keys = [k async for k in client.scan_iter(count=1000)]
        no_ttl = [k for k in keys if await client.pttl(k) < 0]
        return {"stream_keys": sum(1 for k in keys if b":stream:" in k), "keys_without_ttl": len(no_ttl)}
    finally:
        await client.aclose()


@contextlib.contextmanager
def stack(name: str, tmp: Path) -> Any:
    """The stores config (and Redis URL) of a stack: ``embedded`` or ``servers``."""
    if name == "embedded":
        url = BackendURL.for_file("sqlite", tmp / "soak.db").render()
        yield {"checkpointer": "memory://", "events": url, "streams": "memory://"}, None
        return
    from .servers import PostgresServer, RedisServer

    with PostgresServer() as pg, RedisServer() as rd:
        yield {"checkpointer": "memory://", "events": pg.url(), "streams": rd.url()}, rd.url()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10000)
    parser.add_argument("--stack", choices=["embedded", "servers"], default="embedded")
    args = parser.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory() as tmp, stack(args.stack, Path(tmp)) as (config, redis_url):
        result = asyncio.run(soak(config, args.runs, redis_url=redis_url))
    print(json.dumps(result.__dict__, indent=2))


if __name__ == "__main__":
    main()
