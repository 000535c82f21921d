"""A separate OS process for the cross-process tests (run as a script, not collected).

Usage: race_worker.py MODE URL [THREAD RUN COROUTINES]. It prints ``ready``, waits for
a line on stdin (so every process starts its work at once), works, and prints one JSON
line with its results.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any


def _plugin_module(url: str, module: str) -> Any:
    """``runstore.plugins.<sqlite|postgres>.<module>`` for ``url``."""
    import importlib

    name = "sqlite" if url.startswith("sqlite") else "postgres"
    return importlib.import_module(f"runstore.plugins.{name}.{module}")


async def _open_store(url: str, options: Any) -> Any:
    from runstore.loader import get_backends
    from runstore.urls import BackendURL

    parsed = BackendURL.parse(url)
    return await get_backends().events.for_url(parsed).open(parsed, options)


async def race(url: str, thread: str, run: str, coroutines: int) -> dict[str, Any]:
    from runstore.options import BackendOptions

    async with BackendOptions.scope() as options:
        store = await _open_store(url, options)
        # Warm the pool so the start line is not spent connecting.
        await store.count_messages(thread, user_id=None)
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)

        async def absent(i: int) -> Any:
            record, created = await store.put_if_absent(
                thread_id=thread,
                run_id=run,
                event_type="run.start",
                category="lifecycle",
                content={"by": i},
                user_id=None,
            )
            return {
                "kind": "absent",
                "seq": record["seq"],
                "content": record["content"],
                "created": created,
            }

        async def batch(i: int) -> Any:
            records = await store.put_batch(
                [
                    {
                        "thread_id": thread,
                        "run_id": run,
                        "event_type": "chunk",
                        "category": "message",
                        "content": f"{i}-{j}",
                    }
                    for j in range(3)
                ],
                user_id=None,
            )
            return {"kind": "batch", "seqs": [r["seq"] for r in records]}

        results = await asyncio.gather(
            *(absent(i) if i % 2 == 0 else batch(i) for i in range(coroutines))
        )
        return {"results": list(results)}


async def migrate(url: str) -> dict[str, Any]:
    from runstore.options import BackendOptions
    from runstore.sql.migrations import Migration, ensure_schema
    from runstore.urls import BackendURL

    async def slow_step(conn: Any) -> None:
        # Widen the window in which a second, unserialized migrator would interleave.
        await conn.exec_driver_sql("INSERT INTO mig_log (step) VALUES ('slow')")
        await asyncio.sleep(0.3)

    migrations = [
        Migration(
            1,
            [
                "CREATE TABLE mig_a (x INTEGER)",
                "CREATE TABLE mig_log (step TEXT)",
                "INSERT INTO mig_log (step) VALUES ('1')",
            ],
        ),
        Migration(
            2,
            [
                slow_step,
                "ALTER TABLE mig_a ADD COLUMN y INTEGER",
                "INSERT INTO mig_log (step) VALUES ('2')",
            ],
        ),
    ]
    async with BackendOptions.scope() as options:
        parsed = BackendURL.parse(url)
        engine = await _plugin_module(url, "engine").shared_engine(parsed, options)
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        version = await ensure_schema(engine, "race-test", migrations)
        store = await _open_store(url, options)
        record = await store.put(
            thread_id="mig", run_id="r", event_type="e", category="message", user_id=None
        )
        return {"version": version, "seq": record["seq"]}


def main() -> None:
    mode, url, *rest = sys.argv[1:]
    if mode == "race":
        out = asyncio.run(race(url, rest[0], rest[1], int(rest[2])))
    else:
        out = asyncio.run(migrate(url))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
