"""The event store contract for listing: list_messages, list_messages_by_run and
list_events pages, exclusive cursors, limits, and the 64-bit range of both.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runstore.events.protocol import RunEventStore

from ..events_model import (
    BAD_INPUT,
    ai_message_event,
    core,
    fresh_id,
    message_event,
    page,
)

pytestmark = pytest.mark.runstore_contract("run event store")


def test_paging_walks_reconstruct_the_thread(events_target: Any) -> None:
    """Walking backward and forward with random limits gives every message exactly once."""
    with events_target.session() as session:
        store: RunEventStore = session.backend

        @settings(max_examples=min(settings().max_examples, 15), suppress_health_check=list(HealthCheck))
        @given(
            cats=st.lists(st.sampled_from(["message", "message", "trace", "lifecycle"]), min_size=0, max_size=40),
            data=st.data(),
        )
        def walk(cats: list[str], data: st.DataObject) -> None:
            thread = fresh_id("page")
            events = [
                {"thread_id": thread, "run_id": f"run-{i % 3}", "event_type": "ai_message",
                 "category": c, "content": {"type": "ai", "id": f"m{i}"}}
                for i, c in enumerate(cats)
            ]
            records = session.run(store.put_batch(events, user_id=None)) if events else []
            messages = [core(r) for r in records if r["category"] == "message"]
            try:
                # backward from the newest
                seen: list[dict[str, Any]] = []
                before: int | None = None
                for _ in range(len(messages) + 2):
                    limit = data.draw(st.integers(1, 7), label="backward limit")
                    got = session.run(store.list_messages(thread, limit=limit, before_seq=before, user_id=None))
                    assert len(got) <= limit, (
                        f"contract: a page holds at most `limit` messages (limit={limit}, "
                        f"before_seq={before}, got {len(got)})"
                    )
                    if before is None:
                        assert [core(r) for r in got] == page(messages, limit, None, None), (
                            "contract: without cursors list_messages gives the newest `limit` "
                            f"messages, ascending (limit={limit}; got {[r['seq'] for r in got]})"
                        )
                    if before is not None:
                        assert all(r["seq"] < before for r in got), (
                            f"contract: before_seq is exclusive (before_seq={before}, got seqs "
                            f"{[r['seq'] for r in got]})"
                        )
                    assert [r["seq"] for r in got] == sorted(r["seq"] for r in got), (
                        "contract: a message page is ascending by seq"
                    )
                    if not got:
                        break
                    seen = [core(r) for r in got] + seen
                    before = got[0]["seq"]
                assert seen == messages, (
                    "contract: walking list_messages backward with before_seq (exclusive) yields "
                    "every message exactly once, other categories interleaved"
                )
                # forward from the start
                seen = []
                after: int | None = data.draw(st.sampled_from([None, 0, -5]), label="start")
                if after is None:
                    after = 0
                for _ in range(len(messages) + 2):
                    limit = data.draw(st.integers(1, 7), label="forward limit")
                    got = session.run(store.list_messages(thread, limit=limit, after_seq=after, user_id=None))
                    assert len(got) <= limit, (
                        f"contract: a page holds at most `limit` messages (limit={limit}, "
                        f"after_seq={after}, got {len(got)})"
                    )
                    assert [r["seq"] for r in got] == sorted(r["seq"] for r in got), (
                        "contract: a message page is ascending by seq"
                    )
                    assert all(r["seq"] > after for r in got), (
                        f"contract: after_seq is exclusive (after_seq={after}, got {[r['seq'] for r in got]})"
                    )
                    if not got:
                        break
                    seen += [core(r) for r in got]
                    after = got[-1]["seq"]
                assert seen == messages, (
                    "contract: walking list_messages forward with after_seq (exclusive) yields every "
                    "message exactly once, other categories interleaved"
                )
                # both cursors together
                top = len(cats) + 2
                lo = data.draw(st.integers(-1, top), label="after_seq")
                hi = data.draw(st.integers(-1, top), label="before_seq")
                limit = data.draw(st.integers(0, 10), label="limit")
                got = session.run(
                    store.list_messages(thread, limit=limit, before_seq=hi, after_seq=lo, user_id=None)
                )
                expected = page(messages, limit, hi, lo)
                assert [core(r) for r in got] == expected, (
                    f"contract: both cursors give the first `limit` messages strictly between "
                    f"after_seq={lo} and before_seq={hi} (limit={limit}); got "
                    f"{[r['seq'] for r in got]}, expected {[r['seq'] for r in expected]}"
                )
                newest = session.run(store.list_messages(thread, limit=limit, user_id=None))
                assert [core(r) for r in newest] == page(messages, limit, None, None), (
                    "contract: without cursors list_messages gives the newest `limit` messages, ascending"
                )
                # The edges random draws can miss: a window wider than the limit.
                if len(messages) >= 2:
                    top_seq = messages[-1]["seq"] + 1
                    got = session.run(store.list_messages(thread, limit=1, user_id=None))
                    assert [core(r) for r in got] == messages[-1:], (
                        "contract: without cursors list_messages gives the newest `limit` messages "
                        f"(limit=1 gave seqs {[r['seq'] for r in got]}, newest is {messages[-1]['seq']})"
                    )
                    got = session.run(store.list_messages(thread, limit=1, before_seq=top_seq, user_id=None))
                    assert [core(r) for r in got] == messages[-1:], (
                        f"contract: a page holds at most `limit` messages: before_seq gives the last "
                        f"`limit` below it (limit=1, before_seq={top_seq}; got {[r['seq'] for r in got]})"
                    )
                    got = session.run(
                        store.list_messages(thread, limit=1, after_seq=0, before_seq=top_seq, user_id=None)
                    )
                    assert [core(r) for r in got] == messages[:1], (
                        f"contract: both cursors give the first `limit` messages strictly between "
                        f"after_seq=0 and before_seq={top_seq} (limit=1); got {[r['seq'] for r in got]}, "
                        f"expected {messages[0]['seq']}"
                    )
            finally:
                session.run(store.delete_by_thread(thread, user_id=None))

        walk()


def test_run_paging_and_limits(events_target: Any) -> None:
    """list_messages_by_run pages one run exactly like list_messages (exclusive cursors);
    list_events honours limit and after_seq, with filters applied before the limit."""

    async def body(store: RunEventStore) -> None:
        thread = fresh_id("runpage")
        events = []
        for i in range(12):
            run = "r1" if i % 3 else "r2"
            category = "message" if i % 2 else "trace"
            events.append(ai_message_event(thread, run, f"m{i}", category=category,
                              event_type="ai_message" if i % 4 else "tool.result",
                              metadata={"task_id": "t1" if i % 5 else "t2"}))
        records = await store.put_batch(events, user_id=None)
        try:
            r1 = [core(r) for r in records if r["run_id"] == "r1"]
            r1_messages = [r for r in r1 if r["category"] == "message"]
            seqs = [r["seq"] for r in r1_messages]
            for after in [None, 0, *seqs]:
                for before in [None, *seqs, 99]:
                    for limit in (1, 2, 100):
                        got = await store.list_messages_by_run(
                            thread, "r1", limit=limit, after_seq=after, before_seq=before, user_id=None
                        )
                        expected = page(r1_messages, limit, before, after)
                        assert [core(r) for r in got] == expected, (
                            f"contract: list_messages_by_run pages one run's messages like list_messages "
                            f"(limit={limit}, after_seq={after}, before_seq={before}; cursors are "
                            f"exclusive); got seqs {[r['seq'] for r in got]}, expected "
                            f"{[r['seq'] for r in expected]}"
                        )
            for limit in (1, 2, 3):
                for after in (None, r1[0]["seq"], r1[2]["seq"]):
                    got = await store.list_events(thread, "r1", limit=limit, after_seq=after, user_id=None)
                    expected = [r for r in r1 if after is None or r["seq"] > after][:limit]
                    assert [core(r) for r in got] == expected, (
                        f"contract: list_events gives the run's first `limit` events above after_seq "
                        f"(exclusive), every category (limit={limit}, after_seq={after}); got seqs "
                        f"{[r['seq'] for r in got]}, expected {[r['seq'] for r in expected]}"
                    )
                for types, task in ((["tool.result"], None), (None, "t2"), (["ai_message"], "t1")):
                    got = await store.list_events(
                        thread, "r1", event_types=types, task_id=task, limit=limit, user_id=None
                    )
                    expected = [
                        r for r in r1
                        if (types is None or r["event_type"] in types)
                        and (task is None or r["metadata"].get("task_id") == task)
                    ][:limit]
                    assert [core(r) for r in got] == expected, (
                        f"contract: list_events applies event_types and task_id before the limit "
                        f"(event_types={types}, task_id={task!r}, limit={limit}); got seqs "
                        f"{[r['seq'] for r in got]}, expected {[r['seq'] for r in expected]}"
                    )
        finally:
            await store.delete_by_thread(thread, user_id=None)

    events_target.run(body)


SEQ_MAX = 2**63 - 1
SEQ_MIN = -(2**63)


def test_cursors_and_limits_beyond_64_bits_are_rejected_everywhere(events_target: Any) -> None:
    """Seqs are signed 64-bit integers: cursors and limits outside that range are bad input."""

    async def body(store: RunEventStore) -> None:
        thread = fresh_id("range")
        await store.put_batch(
            [message_event(thread, "r", f"m{i}", event_type="human_message") for i in range(3)],
            user_id=None,
        )
        pages = {
            "list_messages": lambda **kw: store.list_messages(thread, user_id=None, **kw),
            "list_messages_by_run": lambda **kw: store.list_messages_by_run(thread, "r", user_id=None, **kw),
            "list_events": lambda **kw: store.list_events(thread, "r", user_id=None, **kw),
        }
        try:
            for name, page in pages.items():
                cursors = ("after_seq",) if name == "list_events" else ("after_seq", "before_seq")
                for cursor in cursors:
                    for value in (SEQ_MAX + 1, SEQ_MIN - 1, 2**100, -(2**100)):
                        with pytest.raises(BAD_INPUT):
                            await page(**{cursor: value})
                with pytest.raises(BAD_INPUT):
                    await page(limit=SEQ_MAX + 1)
                edge = {
                    "after_seq=SEQ_MAX": (await page(after_seq=SEQ_MAX), []),
                    "after_seq=SEQ_MIN": (len(await page(after_seq=SEQ_MIN)), 3),
                    "limit=SEQ_MAX": (len(await page(limit=SEQ_MAX)), 3),
                }
                if name != "list_events":
                    edge["before_seq=SEQ_MAX"] = (len(await page(before_seq=SEQ_MAX)), 3)
                    edge["before_seq=SEQ_MIN"] = (await page(before_seq=SEQ_MIN), [])
                for case, (got, expected) in edge.items():
                    assert got == expected, (
                        f"contract: cursors and limits at the ends of the 64-bit seq range are "
                        f"accepted and page normally ({name}({case}) gave {got!r}, expected {expected!r})"
                    )
        finally:
            await store.delete_by_thread(thread, user_id=None)

    events_target.run(body)
