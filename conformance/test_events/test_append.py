"""The event store contract for put and put_batch: seqs, all-or-nothing batches, what a
record holds (normalized, isolated, cut trace content), round trips and durability.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from runstore.events.protocol import RunEventStore

from ..events_model import (
    BAD_INPUT,
    GOOD,
    core,
    fresh_id,
    message_event,
)

pytestmark = pytest.mark.runstore_contract("run event store")


def test_put_batch_is_all_or_nothing_and_retry_is_clean(events_target: Any) -> None:
    async def body(store: RunEventStore) -> None:
        a, b = fresh_id("aon"), fresh_id("aon")
        batch = [
            {"thread_id": a, **GOOD, "content": "a1"},
            {"thread_id": b, **GOOD, "content": "b1"},
            {"thread_id": a, **GOOD, "content": "a2"},
            {"thread_id": b, **GOOD, "event_type": "x" * 40},
        ]
        with pytest.raises(BAD_INPUT):
            await store.put_batch(batch, user_id=None)
        for thread in (a, b):
            left = await store.list_messages(thread, limit=100, user_id=None)
            assert left == [], (
                f"contract: put_batch is all-or-nothing: a failed batch leaves no prefix behind "
                f"(found {[r['content'] for r in left]})"
            )
        batch[3] = {"thread_id": b, **GOOD, "content": "b2"}
        got = await store.put_batch(batch, user_id=None)
        assert [(r["thread_id"], r["seq"]) for r in got] == [(a, 1), (b, 1), (a, 2), (b, 2)], (
            "contract: put_batch is all-or-nothing: a retry after a failure starts each thread at "
            f"seq 1 and duplicates nothing (got {[(r['thread_id'][-4:], r['seq']) for r in got]})"
        )
        for thread in (a, b):
            await store.delete_by_thread(thread, user_id=None)

    events_target.run(body)


def test_concurrent_readers_never_see_half_a_batch(events_target: Any) -> None:
    """Readers racing batch writers see each batch entirely or not at all."""

    async def body(store: RunEventStore) -> None:
        thread = fresh_id("vis")
        done = False

        async def writer(i: int) -> None:
            for k in range(4):
                await store.put_batch(
                    [message_event(thread, f"w{i}-{k}", {"type": "ai", "id": f"{i}-{k}-{j}"}) for j in range(4)],
                    user_id=None,
                )
                await asyncio.sleep(0)

        async def reader() -> int:
            looks = 0
            while not done or looks == 0:
                rows = await store.list_messages(thread, limit=10_000, user_id=None)
                per_run: dict[str, int] = {}
                for r in rows:
                    per_run[r["run_id"]] = per_run.get(r["run_id"], 0) + 1
                half = {run: n for run, n in per_run.items() if n != 4}
                assert not half, (
                    f"contract: put_batch is all-or-nothing: a concurrent reader saw part of a batch {half}"
                )
                looks += 1
                await asyncio.sleep(0)
            return looks

        readers = [asyncio.ensure_future(reader()) for _ in range(2)]
        await asyncio.gather(*(writer(i) for i in range(3)))
        done = True
        await asyncio.gather(*readers)
        assert await store.count_messages(thread, user_id=None) == 3 * 4 * 4
        await store.delete_by_thread(thread, user_id=None)

    events_target.run(body)


def test_large_and_unusual_content_round_trips(events_target: Any) -> None:
    """A 10 MB message, U+2028/U+0085 line separators and limits at the edge round-trip."""

    async def body(store: RunEventStore) -> None:
        thread = fresh_id("big")
        cases: list[dict[str, Any]] = [
            {"content": "x" * (10 * 1024 * 1024)},
            {"content": {"type": "ai", "id": "big", "content": "é" * (5 * 1024 * 1024)}},
            {"content": "line\u2028sep\u2029para\u0085nel\r\nwin\x0bvt\x0cff\x1cfs end"},
            {"content": ["\u2028", {"k\u2028": "v\u0085"}], "metadata": {"s": "\u2029"}},
            {"content": {"n": 2**63 - 1, "m": -(2**63), "f": 1.5e300, "z": -0.0, "t": True, "u": None}},
            {"event_type": "e" * 32, "category": "c" * 16, "content": ""},
        ]
        try:
            for i, case in enumerate(cases):
                event = {"thread_id": thread, "run_id": f"run-{i}", "event_type": "ai_message",
                         "category": "message", **case}
                try:
                    record = await store.put(**event, user_id=None)
                except BAD_INPUT as exc:
                    assert i == 0 or i == 1, f"contract: valid content must be accepted (case {i}: {exc})"
                    continue
                got = await store.list_events(thread, f"run-{i}", user_id=None)
                assert len(got) == 1 and core(got[0]) == core(record), (
                    f"contract: content round-trips faithfully (case {i})"
                )
                assert got[0]["content"] == case["content"], f"contract: content round-trips faithfully (case {i})"
        finally:
            await store.delete_by_thread(thread, user_id=None)

    events_target.run(body)


def test_created_at_at_the_ends_of_the_calendar_round_trips(events_target: Any) -> None:
    async def body(store: RunEventStore) -> None:
        thread = fresh_id("calendar")
        ends = {
            "0001-01-01T00:00:00+00:00": "0001-01-01T00:00:00+00:00",
            "0001-01-01T05:00:00+05:00": "0001-01-01T00:00:00+00:00",
            "9999-12-31T23:59:59.999999Z": "9999-12-31T23:59:59.999999+00:00",
        }
        try:
            for given, normalized in ends.items():
                record = await store.put(
                    thread_id=thread, run_id="r", event_type="e", category="lifecycle",
                    created_at=given, user_id=None,
                )
                assert record["created_at"] == normalized, (
                    f"contract: created_at {given} is accepted and normalized to UTC "
                    f"(got {record['created_at']})"
                )
            stored = [r["created_at"] for r in await store.list_events(thread, "r", user_id=None)]
            assert stored == list(ends.values()), f"contract: created_at round-trips (got {stored})"
        finally:
            await store.delete_by_thread(thread, user_id=None)

    events_target.run(body)


def test_records_are_normalized_and_isolated(events_target: Any) -> None:
    async def body(store: RunEventStore) -> None:
        thread = fresh_id("norm")
        content: dict[str, Any] = {"type": "ai", "id": "m", "nested": {"a": [1, 2]}}
        meta = {"task_id": "t1"}
        record = await store.put(
            thread_id=thread, run_id="r", event_type="ai_message", category="message",
            content=content, metadata=meta, created_at="2026-03-04T05:06:07.5+02:00", user_id=None,
        )
        assert record["created_at"] == "2026-03-04T03:06:07.500000+00:00", (
            f"contract: created_at is returned normalized to UTC ISO-8601 (got {record['created_at']})"
        )
        content["nested"]["a"].append(3)
        meta["task_id"] = "changed"
        record_content = record["content"]
        assert isinstance(record_content, dict), "contract: JSON content comes back as it was put"
        record_content["id"] = "mutated"
        record["metadata"]["x"] = 1
        again = await store.list_events(thread, "r", user_id=None)
        assert again[0]["content"] == {"type": "ai", "id": "m", "nested": {"a": [1, 2]}}, (
            "contract: a store keeps its own copy; mutating inputs or returned records changes nothing"
        )
        assert again[0]["metadata"] == {"task_id": "t1"}, "contract: a store keeps its own copy of metadata"
        plain = await store.put(thread_id=thread, run_id="r", event_type="x", category="lifecycle", user_id=None)
        assert plain["metadata"] == {} and plain["content"] == "", (
            "contract: metadata defaults to {} (never None) and content to ''"
        )
        from datetime import datetime

        parsed = datetime.fromisoformat(plain["created_at"])
        assert parsed.utcoffset() is not None, "contract: created_at is timezone-aware ISO-8601"
        assert await store.list_events(thread, "r", event_types=[], user_id=None) == [], (
            "contract: event_types=[] matches nothing"
        )
        assert await store.delete_by_thread(thread, user_id=None) == 2

    events_target.run(body)


def test_unknown_threads_are_empty(events_target: Any) -> None:
    async def body(store: RunEventStore) -> None:
        thread = fresh_id("none")
        assert await store.list_messages(thread, user_id=None) == []
        assert await store.list_events(thread, "r", user_id=None) == []
        assert await store.list_messages_by_run(thread, "r", user_id=None) == []
        assert await store.count_messages(thread, user_id=None) == 0
        assert await store.get_last_visible_ai_seq_by_run(thread, user_id=None) == {}
        assert await store.get_message_seqs(thread, ["message:a"], user_id=None) == {}
        assert await store.find_latest_ai_message_run_ids(thread, ["a"], user_id=None) == {}
        assert await store.delete_by_run(thread, "r", user_id=None) == 0, "contract: deletes return counts"
        assert await store.delete_by_thread(thread, user_id=None) == 0, "contract: deletes return counts"

    events_target.run(body)


def test_trace_content_is_cut_and_marked(events_target: Any) -> None:
    async def body(store: RunEventStore) -> None:
        thread = fresh_id("trace")
        long_text = "ab€" * 20  # 100 bytes; the cut at 50 falls inside a 3-byte character
        record = await store.put(
            thread_id=thread, run_id="r", event_type="trace.step", category="trace",
            content=long_text, metadata={"k": 1}, user_id=None,
        )
        assert record["content"] == long_text.encode()[:50].decode("utf-8", "ignore"), (
            "contract: trace content over run_events.max_trace_content bytes is cut on a "
            f"character boundary (got {record['content']!r})"
        )
        assert record["metadata"] == {"k": 1, "content_truncated": True, "original_byte_length": 100}, (
            "contract: cut trace content is marked with content_truncated and original_byte_length"
        )
        structured = await store.put(
            thread_id=thread, run_id="r", event_type="trace.step", category="trace",
            content={"blob": "z" * 80}, user_id=None,
        )
        assert isinstance(structured["content"], str) and len(structured["content"].encode()) <= 50, (
            "contract: cut structured trace content becomes its JSON text, cut"
        )
        assert structured["metadata"]["original_byte_length"] == len('{"blob":"' + "z" * 80 + '"}')
        short = await store.put(
            thread_id=thread, run_id="r", event_type="trace.step", category="message",
            content="m" * 100, user_id=None,
        )
        assert short["content"] == "m" * 100 and short["metadata"] == {}, (
            "contract: only category=trace content is cut"
        )
        stored = await store.list_events(thread, "r", user_id=None)
        assert [core(r) for r in stored] == [core(record), core(structured), core(short)], (
            "contract: the cut record is what is stored"
        )
        await store.delete_by_thread(thread, user_id=None)

    events_target.run(body, settings={"run_events": {"max_trace_content": 50}})


@pytest.mark.requires("durable")
def test_durable_data_survives_reopen(events_target: Any) -> None:
    """Declared ``durable``: closing and reopening keeps every event and the seq counter."""
    thread = fresh_id("dur")

    async def write(store: RunEventStore) -> list[dict[str, Any]]:
        return await store.put_batch(  # type: ignore[return-value]
            [{"thread_id": thread, "run_id": f"r{i % 2}", "event_type": "ai_message", "category": "message",
              "content": {"type": "ai", "id": f"m{i}"}} for i in range(5)],
            user_id=None,
        )

    written = events_target.run(write)

    async def reopen(store: RunEventStore) -> None:
        got = await store.list_messages(thread, user_id=None)
        assert [core(r) for r in got] == [core(r) for r in written], (
            "contract: durable backends keep every event across close and reopen"
        )
        nxt = await store.put(thread_id=thread, run_id="r9", event_type="a", category="message", user_id=None)
        assert nxt["seq"] == 6, f"contract: durable backends recover seq on reopen and never reuse one (got {nxt['seq']})"
        await store.delete_by_thread(thread, user_id=None)

    events_target.run(reopen)
