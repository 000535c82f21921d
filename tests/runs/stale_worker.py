"""A worker whose lease is taken over while it is paused, and what each of its writes
gets afterwards: the shared part of the takeover fencing tests, also run as a script
(the stale worker in another process)."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from runstore.errors import StaleFenceError
from runstore.worker import Lease

#: Every write a worker makes under a lease, one per store operation.
WRITES = (
    "saver.aput", "saver.aput_writes", "events.put", "events.put_batch", "events.put_if_absent",
    "streams.publish", "streams.publish_end",
)  # fmt: skip


def checkpoint() -> dict[str, Any]:
    """A fresh root checkpoint."""
    return {"v": 1, "id": str(uuid.uuid1()), "ts": "2020-01-01T00:00:00+00:00",
            "channel_values": {}, "channel_versions": {}, "versions_seen": {}}  # fmt: skip


def calls(saver: Any, lease: Lease, who: str) -> dict[str, Callable[[], Awaitable[Any]]]:
    """Each of `WRITES` as the lease's holder makes it (through the lease's config and handles)."""
    assert lease.events is not None and lease.streams is not None
    events, streams, config = lease.events, lease.streams, lease.config()
    on_head = lease.config({"configurable": {"checkpoint_ns": "", "checkpoint_id": str(uuid.uuid1())}})
    return {
        "saver.aput": lambda: saver.aput(config, checkpoint(), {}, {}),
        "saver.aput_writes": lambda: saver.aput_writes(on_head, [("n", 1)], f"{who}-task", ""),
        "events.put": lambda: events.put(event_type="step", category="trace", content=f"{who}-put", user_id=None),
        "events.put_batch": lambda: events.put_batch(
            [{"event_type": "step", "category": "trace", "content": f"{who}-batch"}], user_id=None
        ),
        "events.put_if_absent": lambda: events.put_if_absent(
            event_type="once", category="trace", content=f"{who}-once", user_id=None
        ),
        "streams.publish": lambda: streams.publish("updates", {"by": who}),
        "streams.publish_end": lambda: streams.publish_end(),
    }


async def first_writes(saver: Any, lease: Lease, who: str) -> None:
    """What a holder writes before its pause: a checkpoint, an event and a stream event."""
    todo = calls(saver, lease, who)
    for name in ("saver.aput", "events.put", "streams.publish"):
        await todo[name]()


async def attempt_all(saver: Any, lease: Lease, who: str) -> dict[str, str]:
    """Try every write; "stale" (StaleFenceError), "accepted", or the unexpected error."""
    outcomes: dict[str, str] = {}
    for name, call in calls(saver, lease, who).items():
        try:
            await call()
            outcomes[name] = "accepted"
        except StaleFenceError:
            outcomes[name] = "stale"
        except Exception as exc:  # reported to the test, which names it
            outcomes[name] = f"{type(exc).__name__}: {exc}"
    return outcomes


async def _main(saver_url: str, streams_url: str, thread_id: str, ttl: float) -> None:
    """Start a run, write, report ``started <run_id>``, pause (renewal too) until a line on
    stdin, then try every write and print the outcomes as JSON."""
    import runstore
    from runstore.worker import Worker

    async with runstore.open(
        checkpointer=saver_url, events=saver_url, runs=saver_url, streams=streams_url
    ) as stores:
        worker = Worker(stores.runs, stores.checkpointer, owner="stale", ttl=ttl, renew_every=3600,
                        streams=stores.streams, events=stores.events)  # fmt: skip
        result: dict[str, str] = {}

        async def work(held: Lease) -> None:
            await first_writes(stores.checkpointer, held, "stale")
            print(f"started {held.run['run_id']}", flush=True)
            await asyncio.to_thread(sys.stdin.readline)  # paused: no renewal, no writes
            result.update(await attempt_all(stores.checkpointer, held, "stale"))

        done = await worker.execute(await worker.start(thread_id), work)
        print(json.dumps({"outcome": done.outcome, "writes": result}), flush=True)


if __name__ == "__main__":
    asyncio.run(_main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])))
