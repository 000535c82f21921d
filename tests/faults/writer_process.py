"""A writer process for the SIGKILL tests (run as a script, never collected).

Usage: writer_process.py sqlite|jsonl PATH NAME [THREAD]. Writes until killed and, after each
write returns, prints what was acknowledged, one line, flushed: ``E <seq> <content>``
per event, ``C <checkpoint_id> <value>`` per checkpoint.

- ``sqlite``: the event store and the saver on the sqlite file PATH, alternating an
  event batch of 1-5 events (thread NAME) and a checkpoint with one pending write
  (thread NAME-cp).
- ``jsonl``: the JSONL event store on the directory PATH, alternating an event batch
  of 1-5 events and a single ``put`` (thread THREAD, default NAME).

Event contents are ``NAME-<n>-<i>``: unique per process given unique names.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from pathlib import Path
from typing import Any


def _events(thread: str, name: str, n: int, size: int) -> list[dict[str, Any]]:
    return [
        {"thread_id": thread, "run_id": "r", "event_type": "e", "category": "message", "content": f"{name}-{n}-{i}"}
        for i in range(size)
    ]


async def sqlite(path: Path, name: str) -> None:
    from langgraph.checkpoint.base import empty_checkpoint

    from runstore.options import BackendOptions
    from runstore.plugins.sqlite.events import SqliteEventStore
    from runstore.plugins.sqlite.saver import SqliteSaver
    from runstore.urls import BackendURL

    url = BackendURL.for_file("sqlite", path)
    async with BackendOptions.scope() as options:
        store = await SqliteEventStore.open(url, options)
        saver = await SqliteSaver.open(url, options)
        print("ready", flush=True)
        parent = {"configurable": {"thread_id": f"{name}-cp", "checkpoint_ns": ""}}
        for n in itertools.count():
            if n % 2 == 0:
                records = await store.put_batch(_events(name, name, n, 1 + n % 5), user_id=None)
                print("\n".join(f"E {r['seq']} {r['content']}" for r in records), flush=True)
            else:
                value = f"{name}-cp-{n}"
                version = saver.get_next_version(None, None)
                checkpoint = empty_checkpoint()
                checkpoint["channel_values"] = {"a": value}
                checkpoint["channel_versions"] = {"a": version}
                parent = await saver.aput(parent, checkpoint, {"step": n}, {"a": version})
                await saver.aput_writes(parent, [("a", f"w-{value}")], "task", "")
                print(f"C {parent['configurable']['checkpoint_id']} {value}", flush=True)


async def jsonl(path: Path, name: str, thread: str | None = None) -> None:
    from runstore.options import BackendOptions
    from runstore.plugins.jsonl.events import JsonlEventStore
    from runstore.urls import BackendURL

    async with BackendOptions.scope() as options:
        store = await JsonlEventStore.open(BackendURL.for_file("jsonl", path), options)
        print("ready", flush=True)
        for n in itertools.count():
            if n % 2 == 0:
                records = await store.put_batch(_events(thread or name, name, n, 1 + n % 5), user_id=None)
            else:
                records = [await store.put(**_events(thread or name, name, n, 1)[0], user_id=None)]
            print("\n".join(f"E {r['seq']} {r['content']}" for r in records), flush=True)


if __name__ == "__main__":
    asyncio.run({"sqlite": sqlite, "jsonl": jsonl}[sys.argv[1]](Path(sys.argv[2]), *sys.argv[3:]))
