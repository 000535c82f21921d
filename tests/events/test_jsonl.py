"""JSONL event store specifics: layout, id validation, torn lines, seq recovery, I/O off the loop."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from runstore.errors import InvalidEventError
from runstore.options import BackendOptions
from runstore.plugins.jsonl import events as jsonl_events
from runstore.plugins.jsonl.events import JsonlEventStore
from runstore.urls import BackendURL


@pytest.fixture
async def options() -> AsyncIterator[BackendOptions]:
    async with BackendOptions.scope() as opts:
        yield opts


async def _open(root: Path, options: BackendOptions) -> JsonlEventStore:
    return await JsonlEventStore.open(BackendURL.for_file("jsonl", root), options)


def _ev(thread: str, run: str, content: object = "x", category: str = "message") -> dict[str, object]:
    return {"thread_id": thread, "run_id": run, "event_type": "ai_message", "category": category, "content": content}


async def test_layout_one_file_per_run_and_mixed_batches(tmp_path: Path, options: BackendOptions) -> None:
    store = await _open(tmp_path, options)
    records = await store.put_batch([_ev("t1", "r1"), _ev("t1", "r2"), _ev("t2", "r1"), _ev("t1", "r1")], user_id=None)
    assert [(r["thread_id"], r["seq"]) for r in records] == [("t1", 1), ("t1", 2), ("t2", 1), ("t1", 3)]
    r1 = tmp_path / "threads" / "t1" / "runs" / "r1.jsonl"
    assert r1.read_bytes().count(b"\n") == 2
    assert (tmp_path / "threads" / "t1" / "runs" / "r2.jsonl").read_bytes().count(b"\n") == 1
    assert (tmp_path / "threads" / "t2" / "runs" / "r1.jsonl").is_file()
    assert r1.read_bytes().startswith(b'{"seq":1,')


@pytest.mark.parametrize("bad", ["../x", "a/b", "..", ".", "a\\b", "x\x00y", "a..b", "t" * 300, ""])
async def test_path_ids_are_rejected(tmp_path: Path, options: BackendOptions, bad: str) -> None:
    store = await _open(tmp_path / "root", options)
    with pytest.raises(ValueError):
        await store.put(thread_id=bad, run_id="r", event_type="e", category="message", user_id=None)
    with pytest.raises(ValueError):
        await store.put(thread_id="t", run_id=bad, event_type="e", category="message", user_id=None)
    with pytest.raises(ValueError):
        await store.list_messages(bad, user_id=None)
    with pytest.raises(ValueError):
        await store.delete_by_thread(bad, user_id=None)
    with pytest.raises(InvalidEventError):
        await store.put_batch([_ev("t", "ok"), _ev("t", bad)], user_id=None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["root"], "nothing written outside the root"
    assert not (tmp_path / "root" / "threads").exists(), "a rejected batch writes nothing"


async def test_line_separators_inside_content_round_trip(tmp_path: Path, options: BackendOptions) -> None:
    store = await _open(tmp_path, options)
    weird = "a\u2028b\u2029c\u0085d\x0be\x0cf\x1cg\x1dh\x1ei\rj"
    await store.put(**_ev("t", "r", {"k\u2028": weird}), user_id=None)  # type: ignore[arg-type]
    await store.put(**_ev("t", "r", weird), user_id=None)  # type: ignore[arg-type]
    reopened = await _open(tmp_path, options)
    got = await reopened.list_messages("t", user_id=None)
    assert [r["content"] for r in got] == [{"k\u2028": weird}, weird]


async def test_torn_last_line_is_skipped_never_glued_and_seq_not_reused(tmp_path: Path, options: BackendOptions) -> None:
    store = await _open(tmp_path, options)
    await store.put_batch([_ev("t", "r", f"m{i}") for i in range(3)], user_id=None)
    path = tmp_path / "threads" / "t" / "runs" / "r.jsonl"
    # A crash mid-append: the next record (seq 4) is half written, without its "\n".
    full = path.read_bytes().split(b"\n")[0].replace(b'"seq":1', b'"seq":4')
    with open(path, "ab") as fh:
        fh.write(full[: len(full) // 2])
    reopened = await _open(tmp_path, options)
    assert [r["seq"] for r in await reopened.list_messages("t", user_id=None)] == [1, 2, 3]
    record = await reopened.put(**_ev("t", "r", "after crash"), user_id=None)  # type: ignore[arg-type]
    assert record["seq"] == 5, "seq 4 may have been handed out before the crash: never reuse it"
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and lines[-2].startswith(b'{"seq":5,'), "the new record starts a fresh line"
    got = await reopened.list_messages("t", user_id=None)
    assert [r["content"] for r in got] == ["m0", "m1", "m2", "after crash"]


async def test_torn_line_that_is_complete_json_is_not_revived(tmp_path: Path, options: BackendOptions) -> None:
    store = await _open(tmp_path, options)
    await store.put(**_ev("t", "r", "m0"), user_id=None)  # type: ignore[arg-type]
    path = tmp_path / "threads" / "t" / "runs" / "r.jsonl"
    whole = path.read_bytes().rstrip(b"\n").replace(b'"seq":1', b'"seq":2').replace(b"m0", b"ghost")
    with open(path, "ab") as fh:
        fh.write(whole)  # crashed just before the newline
    reopened = await _open(tmp_path, options)
    assert [r["content"] for r in await reopened.list_messages("t", user_id=None)] == ["m0"]
    await reopened.put(**_ev("t", "r", "next"), user_id=None)  # type: ignore[arg-type]
    again = await _open(tmp_path, options)
    contents = [r["content"] for r in await again.list_messages("t", user_id=None)]
    assert contents == ["m0", "next"], "the unacknowledged record must stay invisible"
    assert [r["seq"] for r in await again.list_messages("t", user_id=None)] == [1, 3]


async def test_seq_recovery_spans_every_run_file(tmp_path: Path, options: BackendOptions) -> None:
    store = await _open(tmp_path, options)
    await store.put_batch([_ev("t", "r1"), _ev("t", "r2"), _ev("t", "r2")], user_id=None)
    reopened = await _open(tmp_path, options)
    record = await reopened.put(**_ev("t", "r1"), user_id=None)  # type: ignore[arg-type]
    assert record["seq"] == 4


async def test_file_io_runs_off_the_event_loop(tmp_path: Path, options: BackendOptions, monkeypatch: pytest.MonkeyPatch) -> None:
    store = await _open(tmp_path, options)
    loop_thread = threading.get_ident()
    seen: list[int] = []
    real_read, real_open = Path.read_bytes, open

    def spy_read(self: Path) -> bytes:
        seen.append(threading.get_ident())
        return real_read(self)

    def spy_open(*args: object, **kwargs: object) -> object:
        seen.append(threading.get_ident())
        return real_open(*args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(Path, "read_bytes", spy_read)
    monkeypatch.setattr(jsonl_events, "open", spy_open, raising=False)
    await store.put(**_ev("t", "r"), user_id=None)  # type: ignore[arg-type]
    await store.put_if_absent(**_ev("t", "r2"), user_id=None)  # type: ignore[arg-type]
    await store.list_messages("t", user_id=None)
    await store.list_events("t", "r", user_id=None)
    await store.find_latest_ai_message_run_ids("t", ["x"], user_id=None)
    assert seen and loop_thread not in seen


async def test_failed_multi_file_append_rolls_back(tmp_path: Path, options: BackendOptions, monkeypatch: pytest.MonkeyPatch) -> None:
    store = await _open(tmp_path, options)
    await store.put_batch([_ev("t", "r1"), _ev("t", "r2")], user_id=None)
    calls = {"n": 0}
    real_fsync = os.fsync

    def failing_fsync(fd: int) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(28, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(jsonl_events.os, "fsync", failing_fsync)
    with pytest.raises(OSError):
        await store.put_batch([_ev("t", "r1", "a"), _ev("t", "r2", "b"), _ev("t", "r3", "c")], user_id=None)
    monkeypatch.setattr(jsonl_events.os, "fsync", real_fsync)
    assert [r["seq"] for r in await store.list_messages("t", user_id=None)] == [1, 2]
    assert not (tmp_path / "threads" / "t" / "runs" / "r3.jsonl").exists()
    retry = await store.put_batch([_ev("t", "r1", "a")], user_id=None)
    assert retry[0]["seq"] == 3


async def test_cancelled_writer_keeps_the_lock_until_its_worker_is_done(tmp_path: Path, options: BackendOptions, monkeypatch: pytest.MonkeyPatch) -> None:
    store = await _open(tmp_path, options)
    gate = threading.Event()
    real_append = store._append_groups

    def slow_append(groups: dict[Path, list[bytes]]) -> None:
        gate.wait(5)
        real_append(groups)

    monkeypatch.setattr(store, "_append_groups", slow_append)
    first = asyncio.create_task(store.put(**_ev("t", "r", "first"), user_id=None))  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    first.cancel()
    second = asyncio.create_task(store.put(**_ev("t", "r", "second"), user_id=None))  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    assert not second.done()
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await first
    record = await second
    assert record["seq"] == 2, "the cancelled write finished first and the next got the next seq"
    got = await store.list_messages("t", user_id=None)
    assert [r["content"] for r in got] == ["first", "second"]


async def test_find_latest_is_one_read(tmp_path: Path, options: BackendOptions, monkeypatch: pytest.MonkeyPatch) -> None:
    store = await _open(tmp_path, options)
    await store.put_batch(
        [_ev("t", f"r{i % 3}", {"type": "ai", "id": f"m{i % 4}"}) for i in range(12)], user_id=None
    )
    calls = {"n": 0}
    real = store._read_thread

    def counting(thread_id: str) -> object:
        calls["n"] += 1
        return real(thread_id)

    monkeypatch.setattr(store, "_read_thread", counting)
    got = await store.find_latest_ai_message_run_ids("t", ["m0", "m1", "m3", "zz"], user_id=None)
    assert got == {"m0": "r2", "m1": "r0", "m3": "r2"}
    assert calls["n"] == 1


async def test_url_needs_a_directory(options: BackendOptions) -> None:
    with pytest.raises(ValueError, match="directory"):
        await JsonlEventStore.open(BackendURL.parse("jsonl://"), options)
    with pytest.raises(ValueError, match="unknown option"):
        await JsonlEventStore.open(BackendURL.parse("jsonl:///x?fsync=no"), options)


CRASHING_CHILD = r"""
import asyncio, os, sys
from runstore.options import BackendOptions
from runstore.plugins.jsonl import events as jsonl_events
from runstore.plugins.jsonl.events import JsonlEventStore
from runstore.urls import BackendURL

def ev(run, content):
    return {"thread_id": "t", "run_id": run, "event_type": "ai_message", "category": "message", "content": content}

async def main():
    async with BackendOptions.scope() as options:
        store = await JsonlEventStore.open(BackendURL.for_file("jsonl", sys.argv[1]), options)
        await store.put(**ev("r1", "before"), user_id=None)
        calls = {"n": 0}
        real = os.fsync
        def crash_after_first_file(fd):
            calls["n"] += 1
            if calls["n"] == 3:  # journal, first file: then the process dies
                os._exit(17)
            real(fd)
        jsonl_events.os.fsync = crash_after_first_file
        await store.put_batch([ev("r1", "a"), ev("r1", "b"), ev("r2", "c")], user_id=None)

asyncio.run(main())
"""


async def test_crash_mid_batch_is_rolled_back_on_reopen(tmp_path: Path, options: BackendOptions) -> None:
    import subprocess
    import sys

    root = tmp_path / "events"
    proc = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", CRASHING_CHILD, str(root)], capture_output=True, text=True
    )
    assert proc.returncode == 17, proc.stderr
    r1 = root / "threads" / "t" / "runs" / "r1.jsonl"
    assert r1.read_bytes().count(b"\n") == 3, "the crash left the first file's part of the batch"
    store = await _open(root, options)
    got = await store.list_messages("t", user_id=None)
    assert [r["content"] for r in got] == ["before"], "a crashed batch is rolled back: all-or-nothing"
    again = await store.put_batch([_ev("t", "r1", "a"), _ev("t", "r2", "c")], user_id=None)
    assert [r["seq"] for r in again] == [2, 3]
    assert sorted(p.name for p in (root / ".pending").iterdir()) == [f"{store._token}.lock"]


async def test_live_instance_batches_are_not_rolled_back(tmp_path: Path, options: BackendOptions) -> None:
    first = await _open(tmp_path, options)
    await first.put_batch([_ev("t", "r1"), _ev("t", "r2")], user_id=None)
    # A journal of a live instance (as if its batch were in flight) must be left alone.
    journal = tmp_path / ".pending" / f"{first._token}-99.json"
    journal.write_bytes(b'{"files": [["threads/t/runs/r1.jsonl", 0]]}')
    second = await _open(tmp_path, options)
    assert len(await second.list_messages("t", user_id=None)) == 2
    assert journal.exists()
    journal.unlink()
    await first.close()
    await second.close()
    assert list((tmp_path / ".pending").iterdir()) == []
