"""A migration copies every kind exactly: LangGraph answers the same on both sides
(state, history, delta history, forks), feeds keep their seqs, owners and times, and
both sides go on the same way afterwards. Real sqlite files and the PostgreSQL server."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage

from runstore.conformance.savers_graph import build_graph
from runstore.migrate.endpoints import open_endpoint
from runstore.migrate.engine import MigrateOptions, migrate
from runstore.migrate.sources import LiveSource
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
EVENT_THREADS = ("thread-full", "thread-delta", "events-only")


async def populate(url: str) -> list[str]:
    async with open_endpoint(url, KINDS) as side:
        threads = await write_graph_threads(side.saver)
        await write_namespace_and_writes(side.saver)
        await write_events(side.events)
    return threads


def options(tmp_path: Path, **changes: Any) -> MigrateOptions:
    return MigrateOptions(kinds=KINDS, destination_mode="delta", ledger=tmp_path / "ledger.jsonl", **changes)


async def assert_same(a: Any, b: Any) -> None:
    for thread_id, mode in (("thread-full", "full"), ("thread-delta", "delta")):
        assert await graph_view(b.saver, thread_id, mode) == await graph_view(a.saver, thread_id, mode)
    for thread_id in ("thread-full", "thread-delta", "thread-ns"):
        assert await saver_view(b.saver, thread_id) == await saver_view(a.saver, thread_id)
        info_a, info_b = await a.saver.aget_thread(thread_id), await b.saver.aget_thread(thread_id)
        assert (info_b.status, info_b.metadata, info_b.latest_checkpoint_id) == (
            info_a.status, info_a.metadata, info_a.latest_checkpoint_id)  # fmt: skip
    for thread_id in EVENT_THREADS:
        assert await event_view(b.events, thread_id) == await event_view(a.events, thread_id)


@pytest.fixture(params=["sqlite->sqlite", "sqlite->postgres", "postgres->sqlite"])
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    sqlite = [BackendURL.for_file("sqlite", tmp_path / name).render() for name in ("a.db", "b.db")]
    if "postgres" not in request.param:
        return sqlite[0], sqlite[1]
    postgres = request.getfixturevalue("postgres_url")
    return (sqlite[0], postgres) if request.param.startswith("sqlite") else (postgres, sqlite[1])


async def test_every_kind_both_modes_forks_namespaces_and_writes_copy_exactly(pair: tuple[str, str], tmp_path: Path) -> None:
    source, destination = pair
    await populate(source)
    async with open_endpoint(source, KINDS) as a, open_endpoint(destination, KINDS) as b:
        report = await migrate(LiveSource(a), b, options(tmp_path))
        assert report.verified and not any(report.mismatches.values())
        assert report.counts["saver"].threads == 3 and report.counts["events"].copied == 15
        await assert_same(a, b)
        # Both sides go on alike: a graph turn, an appended event (next seq after the copied ones).
        for side in (a, b):
            graph = build_graph("delta", 3, side.saver)
            config = {"configurable": {"thread_id": "thread-delta"}, "metadata": {"runstore_checkpoint_channel_mode": "delta"}}
            await graph.ainvoke({"messages": [HumanMessage("after", id="after")]}, config)
        state_a = (await graph_view(a.saver, "thread-delta", "delta"))[0]
        assert (await graph_view(b.saver, "thread-delta", "delta"))[0] == state_a
        put_a = await a.events.put(thread_id="events-only", run_id="run-3", event_type="x", category="trace", user_id=None)
        put_b = await b.events.put(thread_id="events-only", run_id="run-3", event_type="x", category="trace", user_id=None)
        assert put_a["seq"] == put_b["seq"]


async def test_a_rerun_copies_nothing_and_a_catch_up_copies_only_the_news(tmp_path: Path) -> None:
    source, destination = (BackendURL.for_file("sqlite", tmp_path / n).render() for n in ("a.db", "b.db"))
    await populate(source)
    async with open_endpoint(source, KINDS) as a, open_endpoint(destination, KINDS) as b:
        first = await migrate(LiveSource(a), b, options(tmp_path))
        assert first.pass_kind == "copy"
        again = await migrate(LiveSource(a), b, options(tmp_path))
        assert again.pass_kind == "catch-up"
        assert (again.counts["saver"].copied, again.counts["events"].copied) == (0, 0)
        # The source is still written during the copy (online cutover): the next pass takes the news.
        before = len(await saver_view(a.saver, "thread-full"))
        graph = build_graph("full", 3, a.saver)
        await graph.ainvoke({"messages": [HumanMessage("late", id="late")]}, {"configurable": {"thread_id": "thread-full"}})
        await graph.ainvoke({"messages": [HumanMessage("new", id="new")]}, {"configurable": {"thread_id": "thread-new"}})
        await a.events.put(thread_id="thread-full", run_id="run-9", event_type="human", category="message",
                           content="late", user_id=None)  # fmt: skip
        news = len(await saver_view(a.saver, "thread-full")) - before + len(await saver_view(a.saver, "thread-new"))
        # Writers and this process share a clock here: no margin, so exactly the news are read.
        catch_up = await migrate(LiveSource(a), b, options(tmp_path, watermark_margin=timedelta(0)))
        assert catch_up.pass_kind == "catch-up" and not any(catch_up.mismatches.values())
        # Only the threads written since the watermark are read (the thread index knows them).
        assert catch_up.counts["saver"].threads == 2
        assert catch_up.counts["saver"].copied == news
        assert catch_up.counts["events"].copied == 1
        await assert_same(a, b)
