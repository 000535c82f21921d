"""``bulk_import`` on the built-in event stores, as a property: any feed (gaps, owners,
categories) imported in any batch split, any number of times, reads back exactly once
in seq order, and the next append follows the highest imported seq."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runstore.errors import InvalidEventError
from runstore.migrate.endpoints import open_endpoint
from runstore.urls import BackendURL

# What every store accepts: no NUL, no lone surrogate.
TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=4)
EVENT = st.fixed_dictionaries({
    "run_id": st.sampled_from(["r1", "r2"]),
    "event_type": st.sampled_from(["human", "ai", "step"]),
    "category": st.sampled_from(["message", "trace"]),
    "content": st.one_of(TEXT, st.dictionaries(st.sampled_from(["id", "content"]), TEXT)),
    "metadata": st.dictionaries(st.sampled_from(["task_id", "caller"]), TEXT, max_size=2),
    "user_id": st.sampled_from([None, "alice", "bob"]),
})  # fmt: skip
FEED = st.lists(st.tuples(st.integers(1, 60), EVENT), min_size=1, max_size=12, unique_by=lambda pair: pair[0])


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return "memory://"
    if request.param == "sqlite":
        return BackendURL.for_file("sqlite", tmp_path / "events.db").render()
    return str(request.getfixturevalue("postgres_url"))


def test_any_feed_imported_in_any_split_any_number_of_times_reads_back_once(store_url: str) -> None:
    @settings(max_examples=15, deadline=None)
    @given(feed=FEED, split=st.integers(1, 5), repeats=st.integers(1, 2))
    def prop(feed: list[tuple[int, dict[str, Any]]], split: int, repeats: int) -> None:
        thread_id = f"bulk-{uuid.uuid4().hex[:10]}"
        records = [{**event, "thread_id": thread_id, "seq": seq, "created_at": "2026-12-05T01:02:03.000004+00:00"}
                   for seq, event in feed]  # fmt: skip

        async def body() -> None:
            async with open_endpoint(store_url, ["events"]) as side:
                inserted = 0
                for _ in range(repeats):
                    for start in range(0, len(records), split):
                        inserted += await side.events.aimport_events(records[start : start + split])
                assert inserted == len(records)
                got = await side.events.aexport_events(thread_id, limit=100)
                expected = sorted(records, key=lambda r: r["seq"])
                assert [r["seq"] for r in got] == [r["seq"] for r in expected]
                for mine, theirs in zip(got, expected, strict=True):
                    assert {k: mine[k] for k in theirs} == theirs
                nxt = await side.events.put(thread_id=thread_id, run_id="r9", event_type="x", category="trace", user_id=None)
                assert nxt["seq"] == expected[-1]["seq"] + 1

        asyncio.run(body())

    prop()


async def test_an_import_with_a_bad_record_writes_nothing(store_url: str) -> None:
    async with open_endpoint(store_url, ["events"]) as side:
        good = {"thread_id": "bad-batch", "run_id": "r", "event_type": "x", "category": "trace", "content": "",
                "metadata": {}, "seq": 1, "created_at": "2026-12-05T01:02:03+00:00", "user_id": None}  # fmt: skip
        for bad, says in (({"seq": 0}, "positive integer seq"), ({"category": 7}, "category"), ({"user_id": 3}, "user_id")):
            with pytest.raises(InvalidEventError, match=says):
                await side.events.aimport_events([good, {**good, "seq": 2, **bad}])
        assert await side.events.aexport_events("bad-batch") == []
