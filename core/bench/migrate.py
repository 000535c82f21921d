"""``runstore bench migrate``: `runstore migrate` against a naive copy loop, sqlite -> PostgreSQL.

The source: a sqlite file per size of ``threads`` threads, each with ``turns`` turns of a
real delta-mode graph (snapshot frequency 10, three checkpoints a turn) and ``events``
events. Each case runs in a fresh child process (so its peak RSS is its own) against a
fresh PostgreSQL schema, dropped after:

- ``runstore``: the migrate engine, verify off (the copy alone is timed), then the
  destination's checkpoint count checked against the source's;
- ``naive``: ``alist`` + ``aput`` + ``aput_writes`` per checkpoint, the loop a team would write;
- ``resume``: ``runstore migrate`` in a grandchild, SIGKILLed at a random point (after a
  random number of threads is recorded done, plus a random delay), then the same
  migration run again with its verify on; the row counts the rows the destination
  misses or holds beyond the source (``missing``, ``duplicated``) and the threads the
  verify found differing (``mismatched``).

Rows: checkpoints copied, seconds, checkpoints/s, peak RSS; compare within one run only.
"""

from __future__ import annotations

import asyncio
import os
import random
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from runstore.bench.runner import RunOptions
from runstore.urls import BackendURL

METHODS = ("runstore", "naive", "resume")
#: Runstore settings (``--set KEY=VALUE``), applied to the source and the destination.
Settings = Mapping[str, Any]
#: Graph runs in flight while a source is built (their writes share sqlite's group commits).
POPULATE_CONCURRENCY = 16


async def populate(path: Path, threads: int, turns: int, events: int) -> int:
    """Build the source file: ``threads`` delta-mode threads of ``turns`` turns and
    ``events`` events each; the number of checkpoints written."""
    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.graph import END, START, StateGraph

    from runstore.checkpoint.modes import get_thread_state_schema
    from runstore.migrate.endpoints import open_endpoint

    def agent(state: Any) -> dict[str, Any]:
        last = state["messages"][-1]
        return {"messages": [AIMessage(f"re: {last.content}", id=f"ai-{last.id}")]}

    async with open_endpoint(BackendURL.for_file("sqlite", path).render(), ["saver", "events"]) as side:
        builder: StateGraph[Any] = StateGraph(get_thread_state_schema("delta", 10))
        builder.add_node("agent", agent)
        builder.add_edge(START, "agent")
        builder.add_edge("agent", END)
        graph = builder.compile(checkpointer=side.saver)
        gate = asyncio.Semaphore(POPULATE_CONCURRENCY)

        async def thread(n: int) -> None:
            async with gate:
                thread_id = f"bench-{n:05d}"
                config: Any = {"configurable": {"thread_id": thread_id},
                               "metadata": {"runstore_checkpoint_channel_mode": "delta"}}  # fmt: skip
                for turn in range(turns):
                    await graph.ainvoke({"messages": [HumanMessage(f"turn {turn}", id=f"h-{n}-{turn}")]}, config)
                await side.events.put_batch(
                    [{"thread_id": thread_id, "run_id": f"run-{i // 10}", "event_type": "step", "category": "trace",
                      "content": f"event {i}"} for i in range(events)], user_id=None)  # fmt: skip

        await asyncio.gather(*(thread(n) for n in range(threads)))
        return await _checkpoint_count(side.saver)


async def _naive(source: str, destination: str, settings: Settings) -> int:
    from runstore.migrate.endpoints import open_endpoint
    from runstore.migrate.savers import thread_ids

    copied = 0
    async with (open_endpoint(source, ["saver"], create=False, settings=settings) as src,
                open_endpoint(destination, ["saver"], settings=settings) as dst):  # fmt: skip
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


async def _runstore(source: str, destination: str, ledger: Path, settings: Settings, *, verify: bool = False) -> Any:
    from runstore.migrate.engine import MigrateOptions
    from runstore.migrate.transfer import run_migrate

    options = MigrateOptions(kinds=(), destination_mode="delta", verify=verify, ledger=ledger, settings=settings)
    return await run_migrate(source, destination, options, ["saver"])


async def _open_both(source: str, destination: str, settings: Settings) -> None:
    """Open both sides once before a clock starts (imports, the destination's schema)."""
    from runstore.migrate.endpoints import open_endpoint
    from runstore.migrate.transfer import run_migrate  # noqa: F401  (imported, not run)

    async with (open_endpoint(source, ["saver"], create=False, settings=settings),
                open_endpoint(destination, ["saver"], settings=settings)):  # fmt: skip
        pass


async def _schema(url: str, name: str, *, drop: bool) -> None:
    import asyncpg

    conn = await asyncpg.connect(BackendURL.parse(url).without_query("schema").render(hide_password=False), timeout=10)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE' if drop else f'CREATE SCHEMA "{name}"', timeout=60)
    finally:
        await conn.close(timeout=10)


async def _row_keys(url: str) -> tuple[set[tuple[Any, ...]], dict[str, int]]:
    """Every stored row's key of a runstore SQL saver, and each thread's indexed checkpoint count."""
    from runstore.migrate.endpoints import open_endpoint
    from runstore.migrate.savers import thread_ids

    keys: set[tuple[Any, ...]] = set()
    counts: dict[str, int] = {}
    async with open_endpoint(url, ["saver"], create=False) as side:
        ids = [t async for t in thread_ids(side.saver)]
        for start in range(0, len(ids), 64):
            for rows in await side.saver.aexport_thread_rows(ids[start : start + 64]):
                keys.update(("c", *row[:3]) for row in rows.checkpoints)
                keys.update(("b", *row[:4]) for row in rows.blobs)
                keys.update(("w", *row[:5]) for row in rows.writes)
        for thread_id in ids:
            info = await side.saver.aget_thread(thread_id)
            counts[thread_id] = info.checkpoints if info is not None else 0
    return keys, counts


def _resume(case: dict[str, Any], source: str, destination: str, ledger: Path) -> dict[str, Any]:
    """SIGKILL a migration at a random point, run it again with its verify, count the damage."""
    rng = random.Random(int(case.get("seed", 1)))
    done_before_kill = rng.randint(1, max(1, int(case["threads"]) - 1))
    extra_delay = rng.uniform(0.0, 0.05)
    child = subprocess.Popen([sys.executable, "-m", "runstore.bench.migrate"], stdin=subprocess.PIPE,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    assert child.stdin is not None
    # The URLs go on stdin: a password never reaches a process's argv.
    child.stdin.write(orjson.dumps({"source": source, "destination": destination, "ledger": str(ledger),
                                    "settings": case.get("settings") or {}}))  # fmt: skip
    child.stdin.close()
    started = time.perf_counter()
    killed = False
    while child.poll() is None:
        text = ledger.read_text(encoding="utf-8") if ledger.exists() else ""
        if text.count('"done": "saver"') >= done_before_kill:
            time.sleep(extra_delay)
            os.killpg(child.pid, signal.SIGKILL)
            killed = True
            break
        time.sleep(0.002)
    child.wait()
    killed_after = time.perf_counter() - started
    done_at_kill = ledger.read_text(encoding="utf-8").count('"done": "saver"') if ledger.exists() else 0
    report = asyncio.run(_runstore(source, destination, ledger, case.get("settings") or {}, verify=True))
    theirs, their_counts = asyncio.run(_row_keys(source))
    mine, my_counts = asyncio.run(_row_keys(destination))
    duplicated = len(mine - theirs) + sum(1 for t, n in my_counts.items() if their_counts.get(t) != n)
    return {
        "killed": killed and child.returncode == -signal.SIGKILL,
        "killed_after_s": killed_after,
        "threads_done_at_kill": done_at_kill,
        "killed_mid_copy": killed and done_at_kill < int(case["threads"]),
        "resumed_checkpoints": report.counts["saver"].copied,
        "missing": len(theirs - mine),
        "duplicated": duplicated,
        "mismatched": len(report.mismatches.get("saver", [])),
    }


async def _checkpoint_count(saver: Any) -> int:
    """The checkpoints a saver holds, summed over its thread index (nothing decoded)."""
    total, cursor = 0, None
    while True:
        page = await saver.alist_threads(limit=500, cursor=cursor)
        total += sum(info.checkpoints for info in page.threads)
        if (cursor := page.next_cursor) is None:
            return total


async def _dest_checkpoints(destination: str, settings: Settings) -> int:
    from runstore.migrate.endpoints import open_endpoint

    async with open_endpoint(destination, ["saver"], create=False, settings=settings) as side:
        return await _checkpoint_count(side.saver)


def _peak_rss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


async def run_migrate_case(case: dict[str, Any]) -> dict[str, Any]:
    """One case (worker entry): a fresh schema, the copy timed, its result row."""
    postgres = case["postgres_url"]
    schema = f"bench_migrate_{os.getpid()}_{case['case_index']}"
    await _schema(postgres, schema, drop=False)
    work = Path(case["work_dir"])
    await asyncio.to_thread(work.mkdir, parents=True, exist_ok=True)
    ledger = work / "ledger.jsonl"
    try:
        destination = BackendURL.parse(postgres).with_query(schema=schema).render(hide_password=False)
        source, method = case["source_url"], case["method"]
        # --set KEY=VALUE: both sides open with it, as every runstore backend of the other benches does.
        settings: Settings = case.get("settings") or {}
        await _open_both(source, destination, settings)
        if method == "resume":
            # Blocking waits and asyncio.run inside: off this loop.
            result = await asyncio.to_thread(_resume, case, source, destination, ledger)
            ok = result["killed"] and not (result["missing"] or result["duplicated"] or result["mismatched"])
            return {"status": "ok" if ok else "failed", **result,
                    **({} if ok else {"error": "the resumed copy is not exactly the source (or no kill happened)"})}  # fmt: skip
        started = time.perf_counter()
        if method == "naive":
            copied = await _naive(source, destination, settings)
        else:
            copied = (await _runstore(source, destination, ledger, settings)).counts["saver"].copied
        seconds = time.perf_counter() - started
        rss = _peak_rss_bytes()
        held = await _dest_checkpoints(destination, settings)
        out = {"checkpoints": copied, "seconds": seconds, "checkpoints_per_s": copied / seconds,
               "peak_rss_bytes": rss, "dest_checkpoints": held}  # fmt: skip
        if held != case["source_checkpoints"]:
            return {**out, "status": "failed", "error": f"destination holds {held} of {case['source_checkpoints']}"}
        return out
    finally:
        await _schema(postgres, schema, drop=True)


def run_migrate_bench(*, sizes: Sequence[int], turns: int, events: int, methods: Sequence[str],
                      naive_max_threads: int | None, output: Path, options: RunOptions, repetitions: int,
                      argv: Sequence[str], reporter: Any) -> Any:  # fmt: skip
    """Build each size's source once, then run every method on it, ``repetitions`` times
    (alternating the order); ``resume`` runs at the smallest size only."""
    from runstore.bench.runner import CaseRunner

    params = {"threads": list(sizes), "turns": turns, "events": events, "methods": list(methods),
              "naive_max_threads": naive_max_threads, "repetitions": repetitions}  # fmt: skip
    runner = CaseRunner("migrate", output, options, argv=argv, params=params, reporter=reporter)
    plan = [(size, m) for size in sizes for m in methods if m != "resume" or size == min(sizes)]
    runner.reporter.start(repetitions * len(plan))
    try:
        for size in sizes:
            path = runner.work_root / f"source-{size}.db"
            runner.reporter.warn(f"building the source: {size} threads x {turns} turns (not timed)")
            total = asyncio.run(populate(path, size, turns, events))
            for rep in range(repetitions):
                order = [m for s, m in plan if s == size]
                for method in order if rep % 2 == 0 else order[::-1]:
                    case = {"case_id": f"{method}|{size}|r{rep}", "method": method, "threads": size, "turns": turns,
                            "events_per_thread": events, "source_checkpoints": total, "repetition": rep,
                            "seed": rep + 1}  # fmt: skip
                    if method == "naive" and naive_max_threads is not None and size > naive_max_threads:
                        reason = f"naive loop not run above --naive-max-threads {naive_max_threads}"
                        runner.emit([runner.row(case, {"status": "skipped", "error": reason, "profiled": False})])
                        continue
                    row = runner.execute(case, {"source_url": BackendURL.for_file("sqlite", path).render()})
                    if row.get("status") != "ok":
                        runner.reporter.warn(f"{row['case_id']}: {row.get('status')}: {row.get('error')}")
                    runner.emit([row])
            if not options.keep_files:
                path.unlink(missing_ok=True)
    finally:
        outcome = runner.close()
    return outcome


def _resume_child() -> None:
    """The migration a ``resume`` case kills: URLs and ledger read from stdin."""
    given = orjson.loads(sys.stdin.buffer.read())
    asyncio.run(_runstore(given["source"], given["destination"], Path(given["ledger"]), given.get("settings") or {}))


if __name__ == "__main__":
    _resume_child()
