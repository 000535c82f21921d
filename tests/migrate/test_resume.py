"""A migration killed with SIGKILL part-way continues with the same command and ends
with exactly one copy of everything (counted by the verify and by plain counts)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from langchain_core.messages import HumanMessage

from runstore.conformance.savers_graph import build_graph
from runstore.migrate.endpoints import open_endpoint
from runstore.migrate.engine import MigrateOptions
from runstore.migrate.transfer import run_migrate
from runstore.urls import BackendURL

from .data import event_view, saver_view

THREADS = 200


def kill_part_way(command: list[str], ledger: Path, cwd: Path, done: str = '"done": "saver"',
                  *, count: int = 3) -> tuple[int, str]:
    """Run ``command``; SIGKILL it once the ledger records ``count`` threads (lines ``done``)
    done (mid-thread, as it happens)."""
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=cwd, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and child.poll() is None:
            if ledger.exists() and ledger.read_text().count(done) >= count:
                os.kill(child.pid, signal.SIGKILL)
                break
            time.sleep(0.005)
    finally:
        _, stderr = child.communicate(timeout=60)
    return child.returncode, stderr


async def test_sigkill_then_rerun_gives_exactly_one_copy(tmp_path: Path) -> None:
    source = BackendURL.for_file("sqlite", tmp_path / "a.db").render()
    destination = BackendURL.for_file("sqlite", tmp_path / "b.db").render()
    ids = [f"t{n:03d}" for n in range(THREADS)]
    async with open_endpoint(source, ["saver", "events"]) as side:
        graph = build_graph("delta", 3, side.saver)
        for thread_id in ids:
            config = {"configurable": {"thread_id": thread_id}, "metadata": {"runstore_checkpoint_channel_mode": "delta"}}
            for turn in range(3):
                await graph.ainvoke({"messages": [HumanMessage(f"{thread_id} {turn}", id=f"{thread_id}-{turn}")]}, config)
            await side.events.put_batch([{"thread_id": thread_id, "run_id": "r", "event_type": "human", "category": "message",
                                          "content": str(n)} for n in range(5)], user_id=None)  # fmt: skip
    ledger = tmp_path / "ledger.jsonl"
    command = [sys.executable, "-m", "runstore.cli", "migrate", source, destination, "--mode", "delta",
               "--ledger", str(ledger), "--json"]  # fmt: skip
    returncode, stderr = kill_part_way(command, ledger, tmp_path)
    assert returncode == -signal.SIGKILL, f"the child ended on its own first: {stderr}"
    done_before = ledger.read_text().count('"done": "saver"')
    assert 3 <= done_before < THREADS

    report = await run_migrate(source, destination, MigrateOptions(kinds=(), destination_mode="delta", ledger=ledger), None)
    assert (report.pass_kind, report.pass_number) == ("resume", 1) and report.verified and not any(report.mismatches.values())
    assert report.counts["saver"].threads <= THREADS - done_before
    again = await run_migrate(source, destination, MigrateOptions(kinds=(), destination_mode="delta", ledger=ledger), None)
    assert again.pass_kind == "catch-up"
    assert (again.counts["saver"].copied, again.counts["events"].copied) == (0, 0)
    async with open_endpoint(source, ["saver", "events"]) as a, open_endpoint(destination, ["saver", "events"]) as b:
        for thread_id in ids:
            theirs, mine = await saver_view(a.saver, thread_id), await saver_view(b.saver, thread_id)
            assert [c[1] for c in mine] == [c[1] for c in theirs]  # each checkpoint once
            assert [e["seq"] for e in await event_view(b.events, thread_id)] == [1, 2, 3, 4, 5]
