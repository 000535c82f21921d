"""Every refused migration names what was wrong and what is accepted, and writes nothing;
``--on-conflict skip`` and ``overwrite`` choose the other outcomes; a dry run writes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage

from runstore.conformance.savers_graph import build_graph
from runstore.errors import (
    KindNotServedError,
    MigrationConflictError,
    MigrationModeError,
    SameBackendError,
)
from runstore.migrate.endpoints import open_endpoint
from runstore.migrate.engine import MigrateOptions, migrate
from runstore.migrate.sources import LiveSource
from runstore.migrate.transfer import run_migrate
from runstore.urls import BackendURL

from .data import event_view, saver_view, write_events, write_graph_threads

KINDS = ("saver", "events")


def url(tmp_path: Path, name: str) -> str:
    return BackendURL.for_file("sqlite", tmp_path / name).render()


async def populate(target: str) -> None:
    async with open_endpoint(target, KINDS) as side:
        await write_graph_threads(side.saver)
        await write_events(side.events)


async def test_the_same_store_on_both_sides_is_refused(tmp_path: Path) -> None:
    a = url(tmp_path, "a.db")
    await populate(a)
    spelled_otherwise = "sqlite:///" + str(tmp_path / "." / "a.db")
    with pytest.raises(SameBackendError, match="the same store"):
        await run_migrate(a, spelled_otherwise, MigrateOptions(kinds=()), None)


async def test_delta_threads_into_a_full_mode_destination_are_refused_before_it_is_created(tmp_path: Path) -> None:
    a, b = url(tmp_path, "a.db"), url(tmp_path, "b.db")
    await populate(a)
    with pytest.raises(MigrationModeError, match="--mode delta") as caught:
        await run_migrate(a, b, MigrateOptions(kinds=(), destination_mode="full"), None)
    assert "other way round is allowed" in str(caught.value)
    assert not (tmp_path / "b.db").exists()
    # full -> delta is the documented path: full threads copied into a delta destination.
    full_only = url(tmp_path, "full.db")
    async with open_endpoint(full_only, ["saver"]) as side:
        await write_graph_threads(side.saver, delta=False)
    report = await run_migrate(full_only, url(tmp_path, "c.db"), MigrateOptions(kinds=(), destination_mode="delta"), ["saver"])
    assert report.counts["saver"].copied > 0 and not any(report.mismatches.values())


@pytest.mark.parametrize(
    ("source", "destination", "kinds", "says"),
    [
        ("a", "redis://127.0.0.1:6379/0", ["saver"], "no saver backend serves redis://"),
        ("a", "jsonl:///{tmp}/b.db", ["events"], "does not declare bulk_import"),
        ("langgraph+sqlite:///{tmp}/a.db", "b", ["events"], "holds checkpoints and store items only"),
        ("a", "b", ["streams"], "not a kind migrate moves"),
    ],
)
async def test_a_kind_one_side_cannot_serve_is_refused(tmp_path: Path, source: str, destination: str,
                                                       kinds: list[str], says: str) -> None:  # fmt: skip
    await populate(url(tmp_path, "a.db"))

    def resolve(name: str) -> str:
        return url(tmp_path, f"{name}.db") if len(name) == 1 else name.replace("/{tmp}", str(tmp_path))

    with pytest.raises(KindNotServedError, match=says):
        await run_migrate(resolve(source), resolve(destination), MigrateOptions(kinds=(), destination_mode="delta"), kinds)
    assert not (tmp_path / "b.db").exists()


async def _conflicting_destination(b: str) -> None:
    async with open_endpoint(b, KINDS) as side:
        graph = build_graph("full", 3, side.saver)
        await graph.ainvoke({"messages": [HumanMessage("other content", id="o")]}, {"configurable": {"thread_id": "thread-full"}})
        await side.events.put(thread_id="events-only", run_id="x", event_type="human", category="message", user_id=None)


async def test_a_destination_thread_with_other_content_fails_and_nothing_is_written(tmp_path: Path) -> None:
    a, b = url(tmp_path, "a.db"), url(tmp_path, "b.db")
    await populate(a)
    await _conflicting_destination(b)
    async with open_endpoint(b, KINDS) as side:
        before = await saver_view(side.saver, "thread-full"), await event_view(side.events, "events-only")
    with pytest.raises(MigrationConflictError, match="thread-full") as caught:
        await run_migrate(a, b, MigrateOptions(kinds=(), destination_mode="delta", ledger=tmp_path / "l"), None)
    assert "--on-conflict skip" in str(caught.value) and caught.value.thread_ids == ["thread-full"]
    async with open_endpoint(b, KINDS) as side:
        assert (await saver_view(side.saver, "thread-full"), await event_view(side.events, "events-only")) == before
        assert await saver_view(side.saver, "thread-delta") == []
        assert await event_view(side.events, "thread-delta") == []


async def test_on_conflict_skip_leaves_those_threads_and_overwrite_replaces_them(tmp_path: Path) -> None:
    a, b = url(tmp_path, "a.db"), url(tmp_path, "b.db")
    await populate(a)
    await _conflicting_destination(b)
    async with open_endpoint(a, KINDS) as src, open_endpoint(b, KINDS) as dst:
        kept = await saver_view(dst.saver, "thread-full")
        skip = await migrate(LiveSource(src), dst, MigrateOptions(kinds=KINDS, on_conflict="skip", destination_mode="delta"))
        assert skip.counts["saver"].conflicts == ["thread-full"] and skip.counts["events"].conflicts == ["events-only"]
        assert not any(skip.mismatches.values())  # skipped threads are left out of the verify
        assert await saver_view(dst.saver, "thread-full") == kept
        assert await saver_view(dst.saver, "thread-delta") == await saver_view(src.saver, "thread-delta")
        over = await migrate(LiveSource(src), dst, MigrateOptions(kinds=KINDS, on_conflict="overwrite", destination_mode="delta"))
        assert over.counts["saver"].conflicts == ["thread-full"] and not any(over.mismatches.values())
        assert await saver_view(dst.saver, "thread-full") == await saver_view(src.saver, "thread-full")
        assert await event_view(dst.events, "events-only") == await event_view(src.events, "events-only")


async def test_a_dry_run_counts_and_writes_nothing(tmp_path: Path) -> None:
    a, b = url(tmp_path, "a.db"), url(tmp_path, "b.db")
    await populate(a)
    await _conflicting_destination(b)
    async with open_endpoint(a, KINDS) as src, open_endpoint(b, KINDS) as dst:
        before = await saver_view(dst.saver, "thread-full")
        report = await migrate(LiveSource(src), dst, MigrateOptions(kinds=KINDS, dry_run=True, destination_mode="delta",
                                                                    ledger=tmp_path / "ledger"))  # fmt: skip
        assert report.dry_run and report.counts["saver"].conflicts == ["thread-full"]
        assert report.counts["saver"].copied > 0 and report.counts["events"].copied > 0
        assert await saver_view(dst.saver, "thread-delta") == [] and await saver_view(dst.saver, "thread-full") == before
    assert not (tmp_path / "ledger").exists()


async def test_a_dry_run_into_a_file_not_there_yet_creates_nothing(tmp_path: Path) -> None:
    a = url(tmp_path, "a.db")
    await populate(a)
    report = await run_migrate(a, url(tmp_path, "new.db"), MigrateOptions(kinds=(), dry_run=True, destination_mode="delta",
                                                                          ledger=tmp_path / "ledger"), None)  # fmt: skip
    assert report.counts["saver"].copied > 0 and report.destination.endswith("new.db")
    assert not (tmp_path / "new.db").exists() and not (tmp_path / "ledger").exists()
