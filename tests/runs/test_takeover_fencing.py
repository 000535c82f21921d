"""A fenced run is fenced everywhere: once a run is taken over, the worker that lost it
is refused on its first write to every store (saver, event store, stream bridge), and
its END never ends the stream the new holder is writing. Real sqlite files, PostgreSQL
and Redis; the stale worker in this process (its renewal paused, the run store's clock
moved) and in another OS process (paused on a pipe while its lease runs out)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

import runstore
from runstore.clock import ManualClock
from runstore.streams.protocol import END, StreamEvent
from runstore.worker import COMPLETION_EVENT, Lease, Worker

from .stale_worker import WRITES, attempt_all, first_writes

pytestmark = pytest.mark.timeout(300)

SCRIPT = Path(__file__).with_name("stale_worker.py")


@pytest.fixture
def urls(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(URL of the saver, event and run stores, URL of the bridge) of the stack named by the parameter."""
    name = request.param
    if name == "sqlite":
        return f"sqlite:///{request.getfixturevalue('tmp_path') / 'runs.db'}", "memory://"
    if name == "sqlite+redis":
        return f"sqlite:///{request.getfixturevalue('tmp_path') / 'runs.db'}", request.getfixturevalue("redis_url")
    return request.getfixturevalue("postgres_url"), request.getfixturevalue("redis_url")


async def _stream(stores: Any, run_id: str) -> list[Any]:
    items = [i async for i in stores.streams.subscribe(run_id, heartbeat_interval=0.5)]
    return [i.data["by"] if isinstance(i, StreamEvent) else i for i in items]


async def _contents(stores: Any, thread: str, run_id: str) -> list[str]:
    events = await stores.events.list_events(thread, run_id, user_id=None)
    return [e["event_type"] if e["event_type"] == COMPLETION_EVENT else e["content"] for e in events]


def _check(outcomes: dict[str, str], where: str) -> None:
    assert set(outcomes) == set(WRITES), outcomes
    wrong = {name: got for name, got in outcomes.items() if got != "stale"}
    assert not wrong, f"{where}: the stale worker's first writes after the takeover went through: {wrong}"


@pytest.mark.parametrize("urls", ["sqlite", "postgres+redis"], indirect=True)
async def test_stale_worker_in_this_process_is_refused_everywhere(urls: tuple[str, str]) -> None:
    """Worker A is paused mid-run (its renewal too) until its lease has expired; worker B
    claims the run (`Worker.recover` with work) and, before writing anything, A tries each
    write: every one is refused; A's run ends as lost, B's stream and events go on."""
    url, streams = urls
    stack = f"{url.partition(':')[0]}+{streams.partition(':')[0]}"
    thread = f"t-{uuid.uuid4().hex}"
    async with runstore.open(checkpointer=url, events=url, runs=url, streams=streams) as stores:
        clock = stores.runs.clock = ManualClock(stores.runs.now())
        saver = stores.checkpointer
        a = Worker(stores.runs, saver, owner="a", ttl=30, renew_every=3600, streams=stores.streams, events=stores.events)
        b = Worker(stores.runs, saver, owner="b", ttl=30, grace=0, streams=stores.streams, events=stores.events)
        paused, taken, tried = asyncio.Event(), asyncio.Event(), asyncio.Event()
        outcomes: dict[str, str] = {}

        async def stale_work(held: Lease) -> None:
            await first_writes(saver, held, "a")
            paused.set()
            await taken.wait()  # a pause past the lease: no renewal, no writes
            outcomes.update(await attempt_all(saver, held, "a"))
            tried.set()

        async def new_work(held: Lease) -> None:
            taken.set()
            await tried.wait()  # the stale worker tries before the new holder writes anything
            await first_writes(saver, held, "b")

        lease = await a.start(thread)
        running = asyncio.ensure_future(a.execute(lease, stale_work))
        pausing = asyncio.ensure_future(paused.wait())
        await asyncio.wait({pausing, running}, return_when=asyncio.FIRST_COMPLETED)
        assert paused.is_set(), f"the stale worker ended before its pause: {running.result()}"
        clock.advance(31)
        (rescued,) = await b.recover(new_work)
        lost = await asyncio.wait_for(running, 60)

        _check(outcomes, stack)
        assert lost.outcome == "lost" and rescued.outcome == "finished", (lost, rescued)
        run_id = lease.run["run_id"]
        assert await _stream(stores, run_id) == ["a", "b", END], "only the holders' events, and B's END"
        assert await _contents(stores, thread, run_id) == ["a-put", "b-put", COMPLETION_EVENT]


@pytest.mark.parametrize("urls", ["sqlite+redis", "postgres+redis"], indirect=True)
async def test_stale_worker_in_another_process_is_refused_everywhere(urls: tuple[str, str]) -> None:
    """The stale worker runs in another OS process, paused on a pipe (its renewal too)
    while its one-second lease runs out; this process claims the run and lets it go on:
    every write it then tries is refused, and nothing of it reaches a store."""
    url, streams = urls
    stack = f"{url.partition(':')[0]}+{streams.partition(':')[0]}"
    thread = f"t-{uuid.uuid4().hex}"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(SCRIPT), url, streams, thread, "1",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(SCRIPT.parents[2])},
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        async with runstore.open(checkpointer=url, events=url, runs=url, streams=streams) as stores:
            line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode().split()
            assert line[:1] == ["started"], f"the stale worker did not start: {line} {await proc.stderr.read()!r}"
            run_id = line[1]
            b = Worker(stores.runs, stores.checkpointer, owner="b", ttl=30, grace=0,
                       streams=stores.streams, events=stores.events)  # fmt: skip
            report: dict[str, Any] = {}

            async def new_work(held: Lease) -> None:
                proc.stdin.write(b"go\n")  # type: ignore[union-attr]
                await proc.stdin.drain()  # type: ignore[union-attr]
                report.update(json.loads(await asyncio.wait_for(proc.stdout.readline(), 60)))  # type: ignore[union-attr]
                await first_writes(stores.checkpointer, held, "b")

            rescued: list[Any] = []
            for _ in range(600):  # the lease ends a second after the start
                rescued = await b.recover(new_work)
                if rescued:
                    break
                await asyncio.sleep(0.05)
            assert rescued and rescued[0].outcome == "finished", rescued
            _check(report["writes"], f"{stack}, two processes")
            assert report["outcome"] == "lost", report
            assert await _stream(stores, run_id) == ["stale", "b", END]
            assert await _contents(stores, thread, run_id) == ["stale-put", "b-put", COMPLETION_EVENT]
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
