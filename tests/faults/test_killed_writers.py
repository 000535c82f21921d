"""Writer processes SIGKILLed mid-write lose nothing they acknowledged (sqlite, JSONL).

sqlite: several OS processes write one file at once (event batches and checkpoints);
each is SIGKILLed after a random number of acknowledged writes, most likely inside a
transaction, then a second round of writers reopens the file the killed ones left.
JSONL (one process per directory): a writer is SIGKILLed, the next one reopens the
directory it left, several times. Afterwards every write a process acknowledged
(printed after the call returned) is there exactly once, the files are sound
(sqlite's ``PRAGMA integrity_check``), and new writes commit.
"""

from __future__ import annotations

import asyncio
import random
import signal
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

from runstore.options import BackendOptions
from runstore.plugins.sqlite.events import SqliteEventStore
from runstore.plugins.sqlite.saver import SqliteSaver
from runstore.urls import BackendURL

from .sqlstacks import cfg, ev

pytestmark = pytest.mark.faults

WRITER = Path(__file__).with_name("writer_process.py")
#: Generous bound of any wait in these tests (never a timing assertion).
WAIT = 120.0
PROCESSES = 3
ROUNDS = 2


async def _writer(
    mode: str, path: Path, name: str, kill_after: int, acked: dict[str, list[str]], *extra: str
) -> int:
    """Run one writer process (``mode``: sqlite or jsonl), SIGKILL it after ``kill_after``
    acknowledged writes; return how many it acknowledged (every line it printed before dying)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(WRITER), mode, str(path), name, *extra,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    lines: list[str] = []
    try:
        first = await asyncio.wait_for(proc.stdout.readline(), WAIT)
        if first.strip() != b"ready":
            raise AssertionError(f"writer failed: {first!r} {(await proc.stderr.read()).decode()[-3000:]}")
        writes = 0
        while writes < kill_after:
            line = (await asyncio.wait_for(proc.stdout.readline(), WAIT)).decode().strip()
            if not line:
                raise AssertionError(f"writer died: {(await proc.stderr.read()).decode()[-3000:]}")
            lines.append(line)
            # A batch or a put prints one line per event, the first ending in -0; a checkpoint one line.
            writes += line.startswith("C") or line.endswith("-0")
        proc.send_signal(signal.SIGKILL)
        rest, _ = await asyncio.wait_for(proc.communicate(), WAIT)
        lines.extend(rest.decode().split("\n"))
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == -signal.SIGKILL
    for line in filter(None, lines):
        kind, key, value = line.split(" ", 2)
        acked.setdefault(kind, []).append(f"{key} {value}")
    return writes


async def test_sigkilled_writers_lose_nothing_acknowledged(tmp_path: Path, fault_report: Any) -> None:
    path = tmp_path / "killed.db"
    rng = random.Random(12)
    acked: dict[str, list[str]] = {}
    names = []
    for round_ in range(ROUNDS):
        batch = [f"w{round_}-{i}" for i in range(PROCESSES)]
        names += batch
        await asyncio.gather(*(_writer("sqlite", path, name, rng.randint(3, 25), acked) for name in batch))

    def integrity() -> str:
        with sqlite3.connect(path) as conn:
            return str(conn.execute("PRAGMA integrity_check").fetchone()[0])

    assert await asyncio.to_thread(integrity) == "ok"
    url = BackendURL.for_file("sqlite", path)
    lost = duplicated = 0
    async with BackendOptions.scope() as options:
        store = await SqliteEventStore.open(url, options)
        saver = await SqliteSaver.open(url, options)
        contents: list[str] = []
        seqs: dict[str, int] = {}
        for name in names:
            for record in await store.list_events(name, "r", limit=100_000, user_id=None):
                contents.append(record["content"])
                seqs[record["content"]] = record["seq"]
        duplicated += len(contents) - len(set(contents))
        for item in acked.get("E", []):
            seq, content = item.split(" ", 1)
            lost += seqs.get(content) != int(seq)
        for item in acked.get("C", []):
            checkpoint_id, value = item.split(" ", 1)
            got = await saver.aget_tuple(cfg(value.rsplit("-cp-", 1)[0] + "-cp", checkpoint_id))
            lost += got is None or got.checkpoint["channel_values"] != {"a": value}
            assert got is None or [w[2] for w in got.pending_writes or []] in ([], [f"w-{value}"])
        # The file works for new writers.
        record = await store.put(**ev("after", "r", "after"), user_id=None)
        assert [r["seq"] for r in await store.list_events("after", "r", user_id=None)] == [record["seq"]]
    acknowledged = len(acked.get("E", [])) + len(acked.get("C", []))
    fault_report.add("sqlite: writer processes SIGKILLed mid-write (event store and saver)",
                     trials=len(names), acknowledged=acknowledged, lost=lost, duplicated=duplicated)
    assert lost == duplicated == 0


async def test_sigkilled_jsonl_writers_lose_nothing_acknowledged(tmp_path: Path, fault_report: Any) -> None:
    from runstore.plugins.jsonl.events import JsonlEventStore

    root = tmp_path / "events"
    rng = random.Random(7)
    acked: dict[str, list[str]] = {}
    kills = 6
    for k in range(kills):  # each process reopens what the killed one left, on the same thread
        await _writer("jsonl", root, f"j{k}", rng.randint(3, 25), acked, "j")
    lost = duplicated = 0
    async with BackendOptions.scope() as options:
        store = await JsonlEventStore.open(BackendURL.for_file("jsonl", root), options)
        records = await store.list_events("j", "r", limit=100_000, user_id=None)
        contents = [r["content"] for r in records]
        seqs = {r["content"]: r["seq"] for r in records}
        duplicated = len(contents) - len(set(contents))
        for item in acked.get("E", []):
            seq, content = item.split(" ", 1)
            lost += seqs.get(content) != int(seq)
        assert [r["seq"] for r in records] == sorted({r["seq"] for r in records}), "ascending, each seq once"
        # The directory works for new writes, after every seq ever handed out.
        record = await store.put(**ev("j", "r", "after"), user_id=None)
        assert record["seq"] > max(seqs.values(), default=0)
        assert (await store.list_events("j", "r", limit=100_000, user_id=None))[-1]["content"] == "after"
    fault_report.add("jsonl: writer process SIGKILLed mid-write, the next one reopening its directory",
                     trials=kills, acknowledged=len(acked.get("E", [])), lost=lost, duplicated=duplicated)
    assert lost == duplicated == 0
