"""A sqlite writer process for the SIGKILL tests (run as a script, never collected).

Usage: sqlite_writer.py PATH NAME. Opens the event store and the saver on the sqlite
file PATH and writes until killed, alternating an event batch of 1-5 events (thread
NAME) and a checkpoint with one pending write (thread NAME-cp). After each write
returns it prints what was acknowledged, one line, flushed:
``E <seq> <content>`` per event, ``C <checkpoint_id> <value>`` per checkpoint.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from pathlib import Path


async def main(path: Path, name: str) -> None:
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
                events = [
                    {"thread_id": name, "run_id": "r", "event_type": "e", "category": "message",
                     "content": f"{name}-{n}-{i}"}
                    for i in range(1 + n % 5)
                ]
                records = await store.put_batch(events, user_id=None)
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


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2]))
