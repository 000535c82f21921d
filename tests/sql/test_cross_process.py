"""Cross-process serialization: put_if_absent/put_batch races and concurrent migrations."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from pathlib import Path
from typing import Any

from runstore.options import BackendOptions
from runstore.urls import BackendURL

from .conftest import open_engine, store_class

WORKER = Path(__file__).with_name("race_worker.py")
PROCESSES = 4


async def run_workers(*args: str, count: int = PROCESSES) -> list[dict[str, Any]]:
    """Start ``count`` worker processes, release them together, and collect their JSON."""
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            str(WORKER),
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for _ in range(count)
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 120)
            if line.strip() != b"ready":
                _, err = await proc.communicate()
                raise AssertionError(f"worker failed to start: {line!r} {err.decode()[-3000:]}")
        outs = await asyncio.gather(*(p.communicate(b"go\n") for p in procs))
    except BaseException:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
        raise
    results = []
    for proc, (out, err) in zip(procs, outs, strict=True):
        assert proc.returncode == 0, err.decode()[-3000:]
        results.append(json.loads(out.decode().strip().splitlines()[-1]))
    return results


async def test_put_if_absent_race_across_processes(db_url: str) -> None:
    thread, run = f"t-{uuid.uuid4().hex[:8]}", "r"
    coroutines = 8
    outs = await run_workers("race", db_url, thread, run, str(coroutines))
    results = [r for out in outs for r in out["results"]]
    absent = [r for r in results if r["kind"] == "absent"]
    assert sum(r["created"] for r in absent) == 1, (
        "contract: put_if_absent creates exactly one record"
    )
    assert len({(r["seq"], json.dumps(r["content"])) for r in absent}) == 1, (
        "contract: every put_if_absent caller receives the one created record"
    )
    batches = [r["seqs"] for r in results if r["kind"] == "batch"]
    for seqs in batches:
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), (
            "contract: a batch is one contiguous block"
        )
    all_seqs = sorted([s for b in batches for s in b] + [absent[0]["seq"]])
    assert all_seqs == list(range(1, len(all_seqs) + 1)), "contract: seqs are unique and gap-free"
    async with BackendOptions.scope() as options:
        store = await store_class(db_url).open(BackendURL.parse(db_url), options)
        stored = await store.list_events(thread, run, limit=10_000, user_id=None)
    assert [r["seq"] for r in stored] == all_seqs


async def test_concurrent_migrations_from_two_processes(db_url: str) -> None:
    outs = await run_workers("migrate", db_url, count=2)
    assert [o["version"] for o in outs] == [2, 2]
    assert sorted(o["seq"] for o in outs) == [1, 2]
    async with BackendOptions.scope() as options:
        engine = await open_engine(db_url, options)
        async with engine.connect() as conn:
            steps = [r[0] for r in await conn.exec_driver_sql("SELECT step FROM mig_log")]
            versions = dict(
                (
                    await conn.exec_driver_sql(
                        "SELECT component, version FROM runstore_schema_versions"
                    )
                ).all()
            )
    assert sorted(steps) == ["1", "2", "slow"], "each migration step ran exactly once"
    assert versions == {"race-test": 2, "events": 3}
