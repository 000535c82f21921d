"""``runstore export`` / ``runstore import``: one versioned gzip'd JSON-lines archive that
round-trips exactly, keeps serde bytes as produced (encrypted stays encrypted), and is
refused whole when foreign, newer or cut short."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from runstore.errors import ArchiveFormatError, ArchiveVersionError
from runstore.migrate.archive import ArchiveSource
from runstore.migrate.endpoints import open_endpoint
from runstore.migrate.engine import MigrateOptions, migrate
from runstore.migrate.transfer import export, run_export, run_import
from runstore.urls import BackendURL

from .data import (
    event_view,
    graph_view,
    saver_view,
    write_events,
    write_graph_threads,
    write_namespace_and_writes,
)

KINDS = ("saver", "events")


class XorSerializer:
    """A stand-in for an encrypting serde: bytes no reader can take for the plaintext."""

    def __init__(self) -> None:
        self._inner = JsonPlusSerializer()

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        type_, data = self._inner.dumps_typed(obj)
        return "xor+" + type_, bytes(b ^ 0x5A for b in data)

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        type_, raw = data
        assert type_.startswith("xor+"), type_
        return self._inner.loads_typed((type_[4:], bytes(b ^ 0x5A for b in raw)))


def url(tmp_path: Path, name: str) -> str:
    return BackendURL.for_file("sqlite", tmp_path / name).render()


async def populate(target: str, serde: Any = None) -> None:
    async with open_endpoint(target, KINDS) as side:
        if serde is not None:
            side.saver.serde = serde
        await write_graph_threads(side.saver)
        await write_namespace_and_writes(side.saver)
        await write_events(side.events)


async def test_export_import_into_memory_and_back_round_trips_exactly(tmp_path: Path) -> None:
    source, back = url(tmp_path, "a.db"), url(tmp_path, "b.db")
    await populate(source)
    first = tmp_path / "a.archive.gz"
    counts = await run_export(source, first, None)
    assert (counts["checkpoints"], counts["events"]) == (28, 15)
    opts = MigrateOptions(kinds=KINDS, destination_mode="delta")
    async with open_endpoint("memory://", KINDS) as memory:
        archive = ArchiveSource(first, serde=memory.saver.serde)
        report = await migrate(archive, memory, opts)
        assert report.verified and not any(report.mismatches.values())
        async with open_endpoint(source, KINDS) as a:
            for thread_id, mode in (("thread-full", "full"), ("thread-delta", "delta")):
                assert await graph_view(memory.saver, thread_id, mode) == await graph_view(a.saver, thread_id, mode)
            for thread_id in ("events-only", "thread-full"):
                assert await event_view(memory.events, thread_id) == await event_view(a.events, thread_id)
    report = await run_import(first.resolve(), back, MigrateOptions(kinds=(), destination_mode="delta"), None)
    assert not any(report.mismatches.values())
    async with open_endpoint(source, KINDS) as a, open_endpoint(back, KINDS) as b:
        for thread_id in ("thread-full", "thread-delta", "thread-ns"):
            assert await saver_view(b.saver, thread_id) == await saver_view(a.saver, thread_id)
        assert await event_view(b.events, "events-only") == await event_view(a.events, "events-only")


async def test_serde_bytes_are_archived_as_produced_so_encrypted_stays_encrypted(tmp_path: Path) -> None:
    source, back = url(tmp_path, "a.db"), url(tmp_path, "b.db")
    await populate(source, XorSerializer())
    archive = tmp_path / "x.gz"
    async with open_endpoint(source, ["saver"]) as a:
        a.saver.serde = XorSerializer()
        await export(a, archive, ["saver"])
    with gzip.open(archive, "rt") as handle:
        lines = [json.loads(line) for line in handle]
    payloads = [line["checkpoint"] for line in lines if line.get("kind") == "checkpoint"]
    assert payloads and all(tag.startswith("xor+") for tag, _ in payloads)
    with gzip.open(archive, "rb") as handle:
        text = handle.read()
    assert b"delta turn 0" not in text  # no plaintext message content anywhere
    async with open_endpoint(back, ["saver"]) as b:
        b.saver.serde = XorSerializer()
        report = await migrate(ArchiveSource(archive, serde=b.saver.serde), b,
                               MigrateOptions(kinds=("saver",), destination_mode="delta"))  # fmt: skip
        assert not any(report.mismatches.values())
        assert (await graph_view(b.saver, "thread-delta", "delta"))[0][0] == ("delta-h0", "delta turn 0")


def _archive(path: Path, lines: list[dict[str, Any]]) -> Path:
    with gzip.open(path, "wt") as handle:
        for line in lines:
            handle.write(json.dumps(line) + "\n")
    return path


@pytest.mark.parametrize(
    ("lines", "error", "says"),
    [
        ([{"format": "runstore-archive", "version": 99}, {"kind": "end"}], ArchiveVersionError, "reads versions up to 2"),
        ([{"format": "something-else", "version": 1}], ArchiveFormatError, "not a runstore archive"),
        ([{"format": "runstore-archive", "version": 1, "kinds": ["events"]}], ArchiveFormatError, "cut short"),
        ([{"format": "runstore-archive", "version": 1, "kinds": ["events"]}, {"kind": "event", "thread_id": "t"},
          {"kind": "end"}], ArchiveFormatError, "event record lacks"),
    ],
)
async def test_a_bad_archive_is_refused_and_nothing_is_written(
    tmp_path: Path, lines: list[dict[str, Any]], error: type[Exception], says: str
) -> None:
    archive = _archive(tmp_path / "bad.gz", lines)
    target = tmp_path / "never.db"
    with pytest.raises(error, match=says):
        await run_import(archive, BackendURL.for_file("sqlite", target).render(), MigrateOptions(kinds=()), None)
    assert not target.exists()


async def test_a_file_that_is_not_gzip_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "plain.txt"
    path.write_text("hello\n")
    with pytest.raises(ArchiveFormatError, match="not a runstore archive"):
        ArchiveSource(path)
