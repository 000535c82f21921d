"""PostgreSQL server restarts and outages under a running workload (throwaway clusters).

Writers keep appending events and saving checkpoints while the server is stopped
(``pg_ctl -m fast``), crashed (``-m immediate``) or SIGKILLed, then started again on
the same data. The stores are never reopened. Checked, with counts:

- after the server returns, the next call of each store succeeds;
- nothing acknowledged before (or after) the crash is missing (the default
  ``synchronous_commit``), nothing is written twice, and a write reported as not
  written (`BackendUnavailableError` with ``write_may_have_happened=False``) is absent;
- while the server is down longer than ``operation_timeout``, calls end with
  `BackendUnavailableError` saying nothing was written, never a raw driver error.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from runstore.errors import BackendUnavailableError

from .servers import PostgresServer
from .sqlstacks import Stack, cfg, checkpoint_args, ev, open_stack

pytestmark = pytest.mark.faults

#: Generous bound of any wait in these tests (never a timing assertion).
WAIT = 60.0
EVENT_WRITERS = 3
SAVER_WRITERS = 2

FAULTS: dict[str, Callable[[PostgresServer], None]] = {
    "stop (pg_ctl -m fast)": lambda server: server.stop("fast"),
    "crash (pg_ctl -m immediate)": lambda server: server.crash(),
    "SIGKILL of every server process": lambda server: server.sigkill(),
}


@dataclass
class Ledger:
    """What the writers were told: acknowledged writes, and failures saying whether the
    write may have happened."""

    events: dict[str, int] = field(default_factory=dict)  # content -> seq
    checkpoints: dict[str, str] = field(default_factory=dict)  # checkpoint id -> value
    maybe: set[str] = field(default_factory=set)
    not_written: set[str] = field(default_factory=set)
    acks: dict[str, int] = field(default_factory=dict)  # writer -> acknowledged so far
    errors: int = 0


async def _event_writer(stack: Stack, name: str, ledger: Ledger, stop: asyncio.Event) -> None:
    counter = itertools.count()
    while not stop.is_set():
        n = next(counter)
        contents = [f"{name}-{n}-{i}" for i in range(1 + n % 3)]
        try:
            records = await stack.store.put_batch([ev(name, "r", c) for c in contents], user_id=None)
        except BackendUnavailableError as exc:
            ledger.errors += 1
            (ledger.maybe if exc.write_may_have_happened else ledger.not_written).update(contents)
            await asyncio.sleep(0.05)
            continue
        for record in records:
            ledger.events[record["content"]] = record["seq"]
        ledger.acks[name] = ledger.acks.get(name, 0) + 1


async def _saver_writer(stack: Stack, name: str, ledger: Ledger, stop: asyncio.Event) -> None:
    parent = cfg(name)
    for n in itertools.count():
        if stop.is_set():
            return
        value = f"{name}-{n}"
        try:
            saved = await stack.saver.aput(*checkpoint_args(stack.saver, parent, value, "run", n))
            await stack.saver.aput_writes(saved, [("a", f"w-{value}")], "task", "")
        except BackendUnavailableError as exc:
            ledger.errors += 1
            (ledger.maybe if exc.write_may_have_happened else ledger.not_written).add(value)
            await asyncio.sleep(0.05)
            continue
        parent = saved
        ledger.checkpoints[saved["configurable"]["checkpoint_id"]] = value
        ledger.acks[name] = ledger.acks.get(name, 0) + 1


async def _progress(ledger: Ledger, writers: list[str], more: int) -> None:
    """Wait until every writer has had ``more`` further writes acknowledged."""
    start = {w: ledger.acks.get(w, 0) for w in writers}
    for _ in range(int(WAIT / 0.01)):
        if all(ledger.acks.get(w, 0) >= start[w] + more for w in writers):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"writers stalled: {ledger.acks} (from {start})")


async def _audit(stack: Stack, ledger: Ledger, threads: list[str]) -> dict[str, int]:
    """Read the event ``threads`` and every acknowledged checkpoint back through the other
    pool; count lost and duplicated (a write reported as not written must be absent)."""
    seen: dict[str, int] = {}
    duplicated = 0
    for name in threads:
        for seq, content in (await stack.events(name, "r")).items():
            duplicated += content in seen
            seen[content] = seq
    lost = sum(1 for content, seq in ledger.events.items() if seen.get(content) != seq)
    strays = sum(1 for content in seen if content in ledger.not_written)
    for checkpoint_id, value in ledger.checkpoints.items():
        thread = value.rsplit("-", 1)[0]
        got = await stack.saver_reader.aget_tuple(cfg(thread, checkpoint_id))
        lost += got is None or got.checkpoint["channel_values"] != {"a": value}
    assert not strays, "a write reported as not written is there"
    return {"acknowledged": len(ledger.events) + len(ledger.checkpoints), "lost": lost,
            "duplicated": duplicated}


@pytest.mark.parametrize("fault", list(FAULTS))
async def test_restart_mid_workload_loses_nothing_acknowledged(
    fault: str, postgres_server: PostgresServer, fault_report: Any
) -> None:
    server = postgres_server
    cycles = 3
    writers = [f"ev{i}" for i in range(EVENT_WRITERS)] + [f"sv{i}" for i in range(SAVER_WRITERS)]
    ledger = Ledger()
    stop = asyncio.Event()
    async with open_stack("postgres", server=server, postgres={"connect_timeout_seconds": 2}) as stack:
        tasks = [
            asyncio.ensure_future(
                (_event_writer if name.startswith("ev") else _saver_writer)(stack, name, ledger, stop)
            )
            for name in writers
        ]
        try:
            for cycle in range(cycles):
                await _progress(ledger, writers, 5)
                await asyncio.to_thread(FAULTS[fault], server)
                await asyncio.sleep(0.2)  # writers meet the dead server
                await asyncio.to_thread(server.start)
                # The next call of each store succeeds, without reopening anything.
                record = await stack.store.put(**ev("probe", "r", f"probe-{cycle}"), user_id=None)
                ledger.events[record["content"]] = record["seq"]
                assert await stack.saver.aget_tuple(cfg("sv0")) is not None
                await _progress(ledger, writers, 3)
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), WAIT)
        counts = await _audit(stack, ledger, [*writers[:EVENT_WRITERS], "probe"])
        await stack.assert_settled()
    fault_report.add(f"postgres: {fault} mid-workload, restarted", trials=cycles, **counts,
                     failed_calls=ledger.errors, may_have_happened=len(ledger.maybe))
    assert counts["lost"] == counts["duplicated"] == 0


async def test_outage_longer_than_the_deadline_then_recovery(
    postgres_server: PostgresServer, fault_report: Any
) -> None:
    server = postgres_server
    async with open_stack("postgres", server=server, postgres={"operation_timeout_seconds": 1}) as stack:
        await stack.store.put(**ev("o", "r", "before"), user_id=None)
        saved = await stack.saver.aput(*checkpoint_args(stack.saver, cfg("o"), "v0", "run", 0))
        await asyncio.to_thread(server.stop)
        calls = {
            "event store put": lambda: stack.store.put(**ev("o", "r", "down"), user_id=None),
            "event store list_events": lambda: stack.store.list_events("o", "r", user_id=None),
            "saver aput": lambda: stack.saver.aput(*checkpoint_args(stack.saver, saved, "down", "run", 1)),
            "saver aget_tuple": lambda: stack.saver.aget_tuple(cfg("o")),
        }
        for name, call in calls.items():
            with pytest.raises(BackendUnavailableError) as caught:
                await asyncio.wait_for(call(), WAIT)
            assert not caught.value.write_may_have_happened, (name, str(caught.value))
            assert isinstance(caught.value.__cause__, OSError), (name, repr(caught.value.__cause__))
        await asyncio.to_thread(server.start)
        after = await stack.store.put(**ev("o", "r", "after"), user_id=None)
        assert list((await stack.events("o", "r")).values()) == ["before", "after"]
        assert after["seq"] == 2
        got = await stack.saver.aget_tuple(cfg("o"))
        assert got is not None and got.checkpoint["channel_values"] == {"a": "v0"}
    fault_report.add("postgres: server down longer than operation_timeout, then back", trials=len(calls),
                     acknowledged=3, lost=0, duplicated=0)
