"""The event store contract for put_if_absent: serialized with every writer of the thread,
in one process and across processes.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import random
from collections.abc import Awaitable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest

from runstore.events.protocol import RunEventStore

from ..events_model import (
    core,
    fresh_id,
)
from ..events_workers import race_worker
from ..session import development_plugins

pytestmark = pytest.mark.runstore_contract("run event store")


def _race_events(thread: str, run: str, n: int) -> list[dict[str, Any]]:
    return [
        {"thread_id": thread, "run_id": run, "event_type": "tool.result", "category": "trace", "content": {"i": i}}
        for i in range(n)
    ]


def _check_race(
    claims: list[tuple[dict[str, Any], bool]],
    batches: list[list[dict[str, Any]]],
    all_seqs: list[int],
    total: int,
    where: str,
) -> None:
    created = [c for c in claims if c[1]]
    assert len(created) == 1, (
        f"contract: put_if_absent is serialized with every writer of the thread: exactly one "
        f"racing caller creates the record ({where}; {len(created)} created)"
    )
    first = core(created[0][0])
    for record, _ in claims:
        assert core(record) == first, (
            f"contract: put_if_absent is serialized: every racing caller gets the same record ({where})"
        )
    for batch in batches:
        seqs = [r["seq"] for r in batch]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), (
            f"contract: a batch gets one contiguous seq block even under concurrency ({where}): {seqs}"
        )
    assert sorted(all_seqs) == list(range(1, total + 1)), (
        f"contract: concurrent writers get unique, gap-free seqs ({where}): {sorted(all_seqs)}"
    )


def test_put_if_absent_race_in_one_process(events_target: Any) -> None:
    """Many coroutines racing put_if_absent and put_batch on one thread."""

    async def body(store: RunEventStore) -> None:
        for round_ in range(3):
            thread = fresh_id("race")

            async def claim(i: int, thread: str = thread) -> tuple[dict[str, Any], bool]:
                return await store.put_if_absent(
                    thread_id=thread, run_id="run-1", event_type="run.end", category="lifecycle",
                    content={"by": i}, user_id=None,
                )  # type: ignore[return-value]

            async def batch(i: int, thread: str = thread) -> list[dict[str, Any]]:
                return await store.put_batch(_race_events(thread, f"b{i}", 3), user_id=None)  # type: ignore[return-value]

            jobs: list[Awaitable[Any]] = [claim(i) for i in range(12)] + [batch(i) for i in range(6)]
            random.Random(round_).shuffle(jobs)
            results = await asyncio.gather(*jobs)
            claims = [r for r in results if isinstance(r, tuple)]
            batches = [r for r in results if isinstance(r, list)]
            seqs = [claims[0][0]["seq"]]
            for i in range(6):
                seqs += [r["seq"] for r in await store.list_events(thread, f"b{i}", user_id=None)]
            _check_race(claims, batches, seqs, 1 + 6 * 3, f"round {round_}")
            extra = await store.list_events(thread, "run-1", user_id=None)
            assert len(extra) == 1, (
                "contract: put_if_absent is serialized: one record per (thread, run, event_type)"
            )
            await store.delete_by_thread(thread, user_id=None)

    events_target.run(body)


@pytest.mark.requires("cross_process")
def test_put_if_absent_race_across_processes(events_target: Any, request: pytest.FixtureRequest) -> None:
    """The same race from 4 OS processes, each opening its own instance by URL."""
    thread = fresh_id("xproc")
    url = events_target.url.render(hide_password=False)
    plugins = development_plugins(request.config)
    rounds, workers = 4, 4
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(workers)
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            futures = [
                pool.submit(race_worker, url, plugins, thread, i, rounds, barrier)
                for i in range(workers)
            ]
            results = [f.result(timeout=300) for f in futures]

    async def read_back(store: RunEventStore) -> list[int]:
        seqs: list[int] = []
        for k in range(rounds):
            seqs += [r["seq"] for r in await store.list_events(thread, f"run-{k}", user_id=None)]
        for i in range(workers):
            seqs += [r["seq"] for r in await store.list_events(thread, f"w{i}", user_id=None)]
        await store.delete_by_thread(thread, user_id=None)
        return seqs

    all_seqs = events_target.run(read_back)
    batches = [b for res in results for b in res["batches"]]
    for k in range(rounds):
        claims = [c for res in results for c in res["claims"][k]]
        created = [c for c in claims if c[1]]
        assert len(created) == 1, (
            f"contract: put_if_absent is serialized across processes (cross_process): exactly one "
            f"of {workers} processes creates run-{k}'s record ({len(created)} created)"
        )
        assert all(c[0] == created[0][0] for c in claims), (
            "contract: put_if_absent is serialized across processes: every process gets the same record"
        )
    total = rounds + workers * rounds * 2
    for batch in batches:
        assert batch == list(range(batch[0], batch[0] + len(batch))), (
            f"contract: a batch gets one contiguous seq block across processes: {batch}"
        )
    assert sorted(all_seqs) == list(range(1, total + 1)), (
        f"contract: writers in several processes get unique, gap-free seqs: {sorted(all_seqs)}"
    )
