"""Savers declaring ``bulk_import`` (sqlite, PostgreSQL) copy threads as stored rows:
rows unchanged (delta mode included), the thread index's times and records as the
source's, insert-if-absent on a partial copy, and a SIGKILLed copy resumed exactly.
Real sqlite files and the PostgreSQL server (a fresh schema per test)."""

from __future__ import annotations

import random
import signal
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from runstore.checkpoint.bulk import ThreadRows
from runstore.conformance.savers_graph import build_graph
from runstore.migrate import engine
from runstore.migrate.endpoints import Endpoint, open_endpoint
from runstore.migrate.engine import MigrateOptions, migrate
from runstore.migrate.savers import bulk_pair
from runstore.migrate.sources import LiveSource
from runstore.migrate.transfer import run_migrate
from runstore.urls import BackendURL

from .data import saver_view, write_graph_threads, write_namespace_and_writes
from .test_resume import kill_part_way

THREADS = ("thread-full", "thread-delta", "thread-ns")


def options(tmp_path: Path, **changes: Any) -> MigrateOptions:
    return MigrateOptions(kinds=("saver",), destination_mode="delta", ledger=tmp_path / "ledger.jsonl", **changes)


async def populate(saver: Any) -> None:
    await write_graph_threads(saver)
    await write_namespace_and_writes(saver)
    await saver.aset_thread_retention("thread-full", {"keep_last": 7})


def record(info: Any) -> tuple[Any, ...]:
    """The thread index's record, bytes aside (each backend measures its JSON text)."""
    return (info.created_at, info.updated_at, info.touched_at, info.latest_checkpoint_id, info.checkpoints,
            info.writes, info.status, info.metadata, info.retention)  # fmt: skip


def stored(rows: ThreadRows) -> tuple[Any, ...]:
    return tuple(sorted(map(tuple, part)) for part in (rows.checkpoints, rows.blobs, rows.writes))


@pytest.fixture(params=["sqlite->sqlite", "sqlite->postgres", "postgres->sqlite"])
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    sqlite = [BackendURL.for_file("sqlite", tmp_path / name).render() for name in ("a.db", "b.db")]
    if "postgres" not in request.param:
        return sqlite[0], sqlite[1]
    postgres = request.getfixturevalue("postgres_url")
    return (sqlite[0], postgres) if request.param.startswith("sqlite") else (postgres, sqlite[1])


async def test_rows_are_copied_as_stored_with_the_thread_index_times(pair: tuple[str, str], tmp_path: Path) -> None:
    source, destination = pair
    async with open_endpoint(source, ["saver"]) as a:
        await populate(a.saver)
    async with open_endpoint(source, ["saver"]) as a, open_endpoint(destination, ["saver"]) as b:
        assert bulk_pair(a.saver, b.saver) is not None
        report = await migrate(LiveSource(a), b, options(tmp_path))
        assert report.verified and not any(report.mismatches.values())
        assert report.counts["saver"].threads == 3 and report.counts["saver"].present == 0
        for theirs, mine in zip(await a.saver.aexport_thread_rows(THREADS), await b.saver.aexport_thread_rows(THREADS),
                                strict=True):  # fmt: skip
            # Delta snapshots, blobs and writes (special slots too) exactly as the source stored them.
            assert stored(mine) == stored(theirs)
            assert (mine.created_at, mine.updated_at, mine.touched_at) == (theirs.created_at, theirs.updated_at,
                                                                            theirs.touched_at)  # fmt: skip
        for thread_id in THREADS:
            info_a, info_b = await a.saver.aget_thread(thread_id), await b.saver.aget_thread(thread_id)
            assert record(info_b) == record(info_a)
            if source.startswith("sqlite") and destination.startswith("sqlite"):
                assert info_b.bytes == info_a.bytes
            assert await saver_view(b.saver, thread_id) == await saver_view(a.saver, thread_id)
        assert (await b.saver.aget_thread("thread-ns")).status == "error"  # its __error__ write, kept
        # A finished migration copies nothing, and the records keep the source's times.
        again = await migrate(LiveSource(a), b, options(tmp_path))
        assert again.counts["saver"].copied == 0
        assert record(await b.saver.aget_thread("thread-delta")) == record(await a.saver.aget_thread("thread-delta"))


async def change_source(saver: Any) -> dict[str, int]:
    """New checkpoints on two threads, one of them a fork; return how many each gained."""
    before = {t: len(await saver_view(saver, t)) for t in THREADS}
    delta_config = {"configurable": {"thread_id": "thread-delta"},
                    "metadata": {"runstore_checkpoint_channel_mode": "delta"}}  # fmt: skip
    await build_graph("delta", 3, saver).ainvoke({"messages": [HumanMessage("catch up", id="delta-late")]}, delta_config)
    graph = build_graph("full", 3, saver)
    history = [s async for s in graph.aget_state_history({"configurable": {"thread_id": "thread-full"}})]
    await graph.aupdate_state(history[2].config, {"messages": [HumanMessage("late fork", id="full-late-fork")]})
    return {t: len(await saver_view(saver, t)) - before[t] for t in THREADS}


async def test_a_catch_up_pass_imports_the_threads_it_copied_as_rows(pair: tuple[str, str], tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    source, destination = pair
    async with open_endpoint(source, ["saver"]) as a:
        await populate(a.saver)
    async with open_endpoint(source, ["saver"]) as a, open_endpoint(destination, ["saver"]) as b:
        first = await migrate(LiveSource(a), b, options(tmp_path, watermark_margin=timedelta(0)))
        assert first.verified and first.counts["saver"].threads == 3
        gained = await change_source(a.saver)
        assert gained["thread-delta"] > 0 and gained["thread-full"] == 1 and gained["thread-ns"] == 0
        compared: list[str] = []
        imported: list[str] = []
        per_checkpoint = engine._copy_saver_thread
        bulk_import = b.saver.aimport_thread_rows

        async def spy_compare(*args: Any) -> None:
            compared.append(args[5])
            await per_checkpoint(*args)

        async def spy_import(threads: Any) -> Any:
            imported.extend(rows.thread_id for rows in threads)
            return await bulk_import(threads)

        monkeypatch.setattr(engine, "_copy_saver_thread", spy_compare)
        monkeypatch.setattr(b.saver, "aimport_thread_rows", spy_import)
        second = await migrate(LiveSource(a), b, options(tmp_path, watermark_margin=timedelta(0)))
        assert second.pass_kind == "catch-up" and second.verified and not any(second.mismatches.values())
        # Every changed thread went through the import alone: no checkpoint-by-checkpoint compare.
        assert compared == [] and sorted(imported) == ["thread-delta", "thread-full"]
        assert second.counts["saver"].copied == sum(gained.values())
        assert second.counts["saver"].writes >= 1 and not second.counts["saver"].conflicts
        for thread_id in THREADS:
            assert record(await b.saver.aget_thread(thread_id)) == record(await a.saver.aget_thread(thread_id))
            assert await saver_view(b.saver, thread_id) == await saver_view(a.saver, thread_id)
        for theirs, mine in zip(await a.saver.aexport_thread_rows(THREADS), await b.saver.aexport_thread_rows(THREADS),
                                strict=True):  # fmt: skip
            assert stored(mine) == stored(theirs)


@pytest.fixture(params=["sqlite", "postgres"])
def destination(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return str(request.getfixturevalue("postgres_url"))
    return BackendURL.for_file("sqlite", tmp_path / "b.db").render()


async def test_an_import_inserts_only_what_is_absent(destination: str, tmp_path: Path) -> None:
    source = BackendURL.for_file("sqlite", tmp_path / "a.db").render()
    kind = "sqlite" if destination.startswith("sqlite") else "postgres"
    async with open_endpoint(source, ["saver"]) as a, open_endpoint(destination, ["saver"]) as b:
        await populate(a.saver)
        [whole] = await a.saver.aexport_thread_rows(["thread-delta"])
        half = ThreadRows(whole.thread_id, 1, 2, 3, None, 0, whole.checkpoints[::2], whole.blobs[::2], whole.writes[::2])
        [first] = await b.saver.aimport_thread_rows([half])
        assert (first.checkpoints, first.writes) == (len(half.checkpoints), len(half.writes))
        assert (await b.saver.aget_thread("thread-delta")).checkpoints == len(half.checkpoints)
        # The rest of a partial copy goes in; what is there stays once.
        [rest] = await b.saver.aimport_thread_rows([whole])
        assert (rest.checkpoints, rest.writes) == (len(whole.checkpoints) - len(half.checkpoints),
                                                   len(whole.writes) - len(half.writes))  # fmt: skip
        [again] = await b.saver.aimport_thread_rows([whole])
        assert (again.checkpoints, again.writes) == (0, 0)
        info_a, info_b = await a.saver.aget_thread("thread-delta"), await b.saver.aget_thread("thread-delta")
        assert record(info_b) == record(info_a)
        assert await saver_view(b.saver, "thread-delta") == await saver_view(a.saver, "thread-delta")
        assert await b.saver.aheld_thread_ids(["thread-delta", "thread-full"]) == {"thread-delta"}
        # A migration over the partial copy (a thread it did not begin: compared first) completes it.
        await b.saver.aimport_thread_rows([half] if kind == "sqlite" else [])
        report = await migrate(LiveSource(a), b, options(tmp_path))
        assert report.verified and not any(report.mismatches.values()) and not report.counts["saver"].conflicts


async def test_savers_without_bulk_import_or_another_serde_take_the_generic_path(tmp_path: Path) -> None:
    source = BackendURL.for_file("sqlite", tmp_path / "a.db").render()
    async with open_endpoint(source, ["saver"]) as a:
        await populate(a.saver)
        memory = Endpoint("memory", saver=InMemorySaver())
        assert bulk_pair(a.saver, memory.saver) is None
        report = await migrate(LiveSource(a), memory, options(tmp_path))
        assert report.verified and not any(report.mismatches.values())
        held = [len(await saver_view(a.saver, t)) for t in THREADS]
        assert report.counts["saver"].copied == sum(held)
        # Bytes another serde stored must be loaded and written again through it.
        async with open_endpoint(BackendURL.for_file("sqlite", tmp_path / "c.db").render(), ["saver"]) as c:
            assert bulk_pair(a.saver, c.saver) is not None
            c.saver.serde = JsonPlusSerializer(pickle_fallback=True)
            assert bulk_pair(a.saver, c.saver) is None


async def test_a_sigkilled_bulk_copy_into_postgres_resumes_to_exactly_one_copy(tmp_path: Path, postgres_url: str) -> None:
    source = BackendURL.for_file("sqlite", tmp_path / "a.db").render()
    ids = [f"t{n:03d}" for n in range(320)]
    async with open_endpoint(source, ["saver"]) as side:
        graph = build_graph("delta", 3, side.saver)
        for thread_id in ids:
            config = {"configurable": {"thread_id": thread_id}, "metadata": {"runstore_checkpoint_channel_mode": "delta"}}
            for turn in range(2):
                await graph.ainvoke({"messages": [HumanMessage(f"{thread_id} {turn}", id=f"{thread_id}-{turn}")]}, config)
    ledger = tmp_path / "ledger.jsonl"
    # The URL of the fresh schema has no password (the test server trusts local users).
    command = [sys.executable, "-m", "runstore.cli", "migrate", source, postgres_url, "--mode", "delta",
               "--kinds", "saver", "--ledger", str(ledger), "--no-verify", "--json"]  # fmt: skip
    # Threads finish in batches of 32, three batches in flight: a kill point in the first
    # third leaves six batches or more still to commit, so the child cannot finish first.
    returncode, stderr = kill_part_way(command, ledger, tmp_path, count=random.randint(1, len(ids) // 3))
    assert returncode == -signal.SIGKILL, f"the child ended on its own first: {stderr}"
    done_before = ledger.read_text().count('"done": "saver"')
    assert 1 <= done_before < len(ids)
    report = await run_migrate(source, postgres_url, MigrateOptions(kinds=(), destination_mode="delta", ledger=ledger),
                               ["saver"])  # fmt: skip
    assert report.pass_kind == "resume" and report.verified and not any(report.mismatches.values())
    async with open_endpoint(source, ["saver"]) as a, open_endpoint(postgres_url, ["saver"]) as b:
        for start in range(0, len(ids), 50):
            chunk = ids[start : start + 50]
            for theirs, mine in zip(await a.saver.aexport_thread_rows(chunk), await b.saver.aexport_thread_rows(chunk),
                                    strict=True):  # fmt: skip
                assert stored(mine) == stored(theirs)  # nothing missing, nothing twice
        for thread_id in ids[:: 17]:
            assert record(await b.saver.aget_thread(thread_id)) == record(await a.saver.aget_thread(thread_id))


async def test_a_catch_up_adds_late_writes_on_a_checkpoint_it_copied_without_a_conflict(pair: tuple[str, str],
                                                                                       tmp_path: Path) -> None:  # fmt: skip
    source, destination = pair
    async with open_endpoint(source, ["saver"]) as a, open_endpoint(destination, ["saver"]) as b:
        await populate(a.saver)
        first = await migrate(LiveSource(a), b, options(tmp_path, watermark_margin=timedelta(0)))
        assert first.verified
        # A task finishing after the copy: its write lands on a checkpoint the destination
        # already holds (then a new checkpoint, so the thread index lists the thread).
        head = await a.saver.aget_tuple({"configurable": {"thread_id": "thread-ns", "checkpoint_ns": ""}})
        await a.saver.aput_writes(head.config, [("topic", "late")], "task-c", "")
        await write_namespace_and_writes(a.saver)
        second = await migrate(LiveSource(a), b, options(tmp_path, watermark_margin=timedelta(0)))  # on-conflict fail
        assert second.verified and not any(second.mismatches.values()) and not second.counts["saver"].conflicts
        assert await saver_view(b.saver, "thread-ns") == await saver_view(a.saver, "thread-ns")
        assert record(await b.saver.aget_thread("thread-ns")) == record(await a.saver.aget_thread("thread-ns"))


async def test_a_catch_up_copies_a_late_write_that_came_alone(pair: tuple[str, str], tmp_path: Path) -> None:
    """A pending write after a pass, with no new checkpoint, moves only the thread's
    ``touched_at``: the catch-up still finds the thread and copies the write."""
    source, destination = pair
    async with open_endpoint(source, ["saver"]) as a, open_endpoint(destination, ["saver"]) as b:
        await populate(a.saver)
        assert (await migrate(LiveSource(a), b, options(tmp_path, watermark_margin=timedelta(0)))).verified
        head = await a.saver.aget_tuple({"configurable": {"thread_id": "thread-ns", "checkpoint_ns": ""}})
        await a.saver.aput_writes(head.config, [("topic", "alone")], "task-late", "")
        second = await migrate(LiveSource(a), b, options(tmp_path, watermark_margin=timedelta(0)))
        assert second.verified and not any(second.mismatches.values()), second.mismatches
        assert await saver_view(b.saver, "thread-ns") == await saver_view(a.saver, "thread-ns")

