"""``runstore bench migrate``: `runstore migrate` against a naive copy loop, sqlite -> PostgreSQL.

The source: a sqlite file of N threads, each with about ``checkpoints`` checkpoints written
by a real delta-mode graph (snapshot frequency 10) and ``events`` events. Each case runs
in a fresh child process (so its peak RSS is its own) against a fresh PostgreSQL schema:
``runstore`` (the migrate engine, verify off: the copy alone) or ``naive`` (``alist`` +
``aput`` + ``aput_writes`` per checkpoint, the loop a team would write). Rows: checkpoints
copied, seconds, checkpoints/s, peak RSS in MB; compare within one run only.
"""

from __future__ import annotations

import asyncio
import json
import resource
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import click

from runstore.urls import BackendURL


async def _populate(path: Path, threads: int, turns: int, events: int) -> int:
    from langchain_core.messages import HumanMessage
    from langgraph.graph import END, START, StateGraph

    from runstore.checkpoint.modes import get_thread_state_schema
    from runstore.migrate.endpoints import open_endpoint

    def agent(state: Any) -> dict[str, Any]:
        from langchain_core.messages import AIMessage

        last = state["messages"][-1]
        return {"messages": [AIMessage(f"re: {last.content}", id=f"ai-{last.id}")]}

    async with open_endpoint(BackendURL.for_file("sqlite", path).render(), ["saver", "events"]) as side:
        builder: StateGraph[Any] = StateGraph(get_thread_state_schema("delta", 10))
        builder.add_node("agent", agent)
        builder.add_edge(START, "agent")
        builder.add_edge("agent", END)
        graph = builder.compile(checkpointer=side.saver)
        for n in range(threads):
            config: Any = {"configurable": {"thread_id": f"bench-{n:05d}"},
                           "metadata": {"runstore_checkpoint_channel_mode": "delta"}}  # fmt: skip
            for turn in range(turns):
                await graph.ainvoke({"messages": [HumanMessage(f"turn {turn}", id=f"h-{n}-{turn}")]}, config)
            await side.events.put_batch(
                [{"thread_id": f"bench-{n:05d}", "run_id": f"run-{i // 10}", "event_type": "step", "category": "trace",
                  "content": f"event {i}"} for i in range(events)], user_id=None)  # fmt: skip
        return sum([1 async for _ in side.saver.alist(None)])


async def _naive(source: str, destination: str) -> int:
    from runstore.migrate.endpoints import open_endpoint
    from runstore.migrate.savers import thread_ids

    copied = 0
    async with open_endpoint(source, ["saver"], create=False) as src, open_endpoint(destination, ["saver"]) as dst:
        async for thread_id in thread_ids(src.saver):
            items = [item async for item in src.saver.alist({"configurable": {"thread_id": thread_id}})]
            for item in reversed(items):
                parent = (item.parent_config or {}).get("configurable", {}).get("checkpoint_id")
                configurable = {"thread_id": thread_id, "checkpoint_ns": item.config["configurable"]["checkpoint_ns"]}
                if parent:
                    configurable["checkpoint_id"] = parent
                stored = await dst.saver.aput({"configurable": configurable}, item.checkpoint, item.metadata,
                                              item.checkpoint["channel_versions"])  # fmt: skip
                tasks: dict[str, list[Any]] = {}
                for task_id, channel, value in item.pending_writes or ():
                    tasks.setdefault(task_id, []).append((channel, value))
                for task_id, writes in tasks.items():
                    await dst.saver.aput_writes(stored, writes, task_id)
                copied += 1
    return copied


async def _runstore(source: str, destination: str, ledger: Path) -> int:
    from runstore.migrate.engine import MigrateOptions
    from runstore.migrate.transfer import run_migrate

    options = MigrateOptions(kinds=(), destination_mode="delta", verify=False, ledger=ledger)
    report = await run_migrate(source, destination, options, ["saver"])
    return report.counts["saver"].copied


async def _warm(source: str, destination: str) -> None:
    from runstore.migrate.endpoints import open_endpoint
    from runstore.migrate.transfer import run_migrate  # noqa: F401  (imported, not run)

    async with open_endpoint(source, ["saver"], create=False), open_endpoint(destination, ["saver"]):
        pass


def child(method: str, source: str, destination: str, ledger: str) -> dict[str, Any]:
    """One case in this (fresh) process: the copy's checkpoints, seconds and peak RSS."""
    # Both sides opened once before the clock starts (imports, schema): both methods are
    # timed on the copy alone.
    asyncio.run(_warm(source, destination))
    started = time.perf_counter()
    if method == "naive":
        copied = asyncio.run(_naive(source, destination))
    else:
        copied = asyncio.run(_runstore(source, destination, Path(ledger)))
    seconds = time.perf_counter() - started
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"checkpoints": copied, "seconds": seconds, "checkpoints_per_s": copied / seconds, "peak_rss_mb": peak_mb}


async def _schema(url: str, name: str, *, drop: bool) -> None:
    import asyncpg

    conn = await asyncpg.connect(BackendURL.parse(url).without_query("schema").render(hide_password=False), timeout=10)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE' if drop else f'CREATE SCHEMA "{name}"', timeout=60)
    finally:
        await conn.close(timeout=10)


@click.command("migrate")
@click.option("--threads", default="20,200", show_default=True, help="Comma-separated source sizes (threads).")
@click.option("--turns", default=17, show_default=True, help="Graph turns per thread (3 checkpoints each).")
@click.option("--events", default=100, show_default=True, help="Events per thread.")
@click.option("--postgres", "postgres_url", envvar="RUNSTORE_TEST_POSTGRES_URL", required=True,
              help="PostgreSQL URL; each case gets a fresh schema (dropped after).")  # fmt: skip
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=Path(".runstore/bench-migrate"))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True, help="JSONL rows.")
def migrate_bench_cmd(threads: str, turns: int, events: int, postgres_url: str, work_dir: Path, output: Path) -> None:
    """sqlite -> PostgreSQL: `runstore migrate` vs a naive alist/aput/aput_writes loop, checkpoints/s and peak RSS."""
    work_dir.mkdir(parents=True, exist_ok=True)
    output.parent.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex[:12]
    with output.open("a", encoding="utf-8") as out:
        for size in [int(n) for n in threads.split(",")]:
            path = work_dir / f"source-{size}-{run_id}.db"
            total = asyncio.run(_populate(path, size, turns, events))
            for method in ("runstore", "naive"):
                schema = f"bench_migrate_{run_id}_{method}_{size}"
                asyncio.run(_schema(postgres_url, schema, drop=False))
                try:
                    destination = BackendURL.parse(postgres_url).with_query(schema=schema).render(hide_password=False)
                    ledger = work_dir / f"{schema}.ledger.jsonl"
                    proc = subprocess.run(
                        [sys.executable, "-m", "runstore.bench.migrate", method,
                         BackendURL.for_file("sqlite", path).render(), destination, str(ledger)],
                        capture_output=True, text=True, timeout=3600, check=True,
                    )  # fmt: skip
                finally:
                    asyncio.run(_schema(postgres_url, schema, drop=True))
                row = {"bench": "migrate", "run_id": run_id, "method": method, "threads": size,
                       "source_checkpoints": total, "events_per_thread": events,
                       **json.loads(proc.stdout.strip().splitlines()[-1])}  # fmt: skip
                out.write(json.dumps(row) + "\n")
                out.flush()
                click.echo(json.dumps(row))
            path.unlink(missing_ok=True)


if __name__ == "__main__":
    print(json.dumps(child(*sys.argv[1:5])))
