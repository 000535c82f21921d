"""The event store contract for message lookups and counts: find_latest_ai_message_run_ids
(and its first-page watermark), message identity and get_message_seqs, the last visible
AI seq, count_messages and list_runs.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from runstore.errors import IncompleteMessageRunLookupError
from runstore.events.protocol import (
    AI_LOOKUP_PAGE_SIZE,
    EventRecord,
    RunEventStore,
    walk_ai_message_runs,
)

from ..events_model import (
    ai_message_event,
    fresh_id,
    message_event,
)

pytestmark = pytest.mark.runstore_contract("run event store")


BIG = AI_LOOKUP_PAGE_SIZE * 2 + 300


async def _big_thread(store: RunEventStore, thread: str) -> dict[str, str]:
    """A thread of BIG messages: AI message ``old-k`` every 97 rows; returns id -> run."""
    expected: dict[str, str] = {}
    events = []
    for i in range(BIG):
        if i % 97 == 0:
            mid = f"old-{i}"
            run = f"run-{i % 5}"
            expected[mid] = run
            events.append(message_event(thread, run, {"type": "ai", "id": mid}))
        else:
            events.append(message_event(thread, "run-h", {"type": "human", "id": f"h{i}"}, event_type="human_message"))
    for start in range(0, len(events), 500):
        await store.put_batch(events[start : start + 500], user_id=None)
    return expected


class _AppendingView:
    """Delegates to a store, but appends newer AI messages after each page is read."""

    def __init__(self, store: RunEventStore, thread: str, ids: list[str]) -> None:
        self.store, self.thread, self.ids, self.pages = store, thread, ids, 0

    async def list_messages(self, thread_id: str, **kw: Any) -> list[EventRecord]:
        got = await self.store.list_messages(thread_id, **kw)
        self.pages += 1
        await self.store.put_batch(
            [message_event(self.thread, "run-late", {"type": "ai", "id": mid}) for mid in self.ids] * 3,
            user_id=None,
        )
        return got


class _StuckView:
    """A store whose list_messages ignores before_seq: its seqs never progress."""

    def __init__(self, store: RunEventStore) -> None:
        self.store = store

    async def list_messages(self, thread_id: str, **kw: Any) -> list[EventRecord]:
        kw.pop("before_seq", None)
        return await self.store.list_messages(thread_id, **kw)


def test_find_latest_ai_message_run_ids_keeps_first_page_watermark(events_target: Any) -> None:
    """The default walk answers from the first page's snapshot while writers append."""

    async def body(store: RunEventStore) -> None:
        thread = fresh_id("hw")
        try:
            expected = await _big_thread(store, thread)
            targets = sorted(expected)
            view = _AppendingView(store, thread, targets)
            got = await walk_ai_message_runs(view.list_messages, thread, {*targets, "never"}, None)
            assert view.pages >= 3, "the walk should need several pages"
            assert got == expected, (
                "contract: find_latest_ai_message_run_ids keeps its first-page high-watermark: "
                "rows appended during the walk neither hide nor replace older answers "
                f"(got {len(got)} ids, expected {len(expected)}; mismatches: "
                f"{ {k: (got.get(k), v) for k, v in expected.items() if got.get(k) != v} })"
            )
            # The backend's own implementation, racing a writer: complete, each answer either
            # the original run or the run appended meanwhile.
            async def writer() -> None:
                for _ in range(5):
                    await store.put_batch(
                        [message_event(thread, "run-late2", {"type": "ai", "id": m}) for m in targets[:3]],
                        user_id=None,
                    )
                    await asyncio.sleep(0)

            own, _ = await asyncio.gather(
                store.find_latest_ai_message_run_ids(thread, targets, user_id=None), writer()
            )
            assert set(own) == set(targets), (
                "contract: find_latest_ai_message_run_ids is complete (every AI message id found) "
                f"while writers append; missing {sorted(set(targets) - set(own))}"
            )
            for mid, run in own.items():
                assert run in (expected[mid], "run-late", "run-late2"), (
                    f"contract: find_latest_ai_message_run_ids maps {mid} to the run of its newest AI event, got {run}"
                )
        finally:
            await store.delete_by_thread(thread, user_id=None)

    events_target.run(body)


def test_find_latest_raises_when_seqs_do_not_progress(events_target: Any) -> None:
    """A full page without a safe, strictly decreasing cursor is an error, never a partial answer."""

    async def body(store: RunEventStore) -> None:
        thread = fresh_id("stuck")
        try:
            await _big_thread(store, thread)
            with pytest.raises(IncompleteMessageRunLookupError):
                await walk_ai_message_runs(
                    _StuckView(store).list_messages, thread, {"old-0", "missing"}, None
                )
        finally:
            await store.delete_by_thread(thread, user_id=None)

    events_target.run(body)


# =====================================================================================
# Message identity and get_message_seqs
# =====================================================================================


def test_message_identity_and_get_message_seqs(events_target: Any) -> None:
    async def body(store: RunEventStore) -> None:
        thread = fresh_id("ident")
        contents: list[tuple[str, Any]] = [
            ("human_message", {"type": "human", "id": "u1__user", "content": "hi"}),  # 1 message:u1
            ("human_message", {"type": "human", "id": "u1", "content": "hi"}),  # 2 message:u1 again
            ("tool.result", {"type": "tool", "id": "tm", "tool_call_id": "call_1"}),  # 3 tool:call_1
            ("llm.ai.response", {"type": "ai", "id": "a1"}),  # 4 message:a1
            ("llm.ai.response", {"type": "ai", "data": {"type": "ai", "id": "a2"}}),  # 5 message:a2
            ("llm.ai.response", {"type": "ai", "id": "x__user"}),  # 6 message:x__user (AI keeps it)
            ("llm.ai.response", {"type": "ai", "id": "a%_\\b"}),  # 7 wildcards literal
            ("llm.ai.response", {"type": "ai", "id": "axyb"}),  # 8
            ("tool.result", {"type": "tool", "id": "a1", "tool_call_id": "call_2"}),  # 9 tool wins
            ("llm.ai.response", "message:zz as plain text"),  # 10 no identity
            ("llm.ai.response", {"type": "ai", "id": "a1"}),  # 11 later duplicate of a1
        ]
        for event_type, content in contents:
            await store.put(
                thread_id=thread, run_id="run-1", event_type=event_type, category="message",
                content=content, user_id=None,
            )
        await store.put(
            thread_id=thread, run_id="run-1", event_type="llm.ai.response", category="trace",
            content={"type": "ai", "id": "trace-only"}, user_id=None,
        )
        asked = [
            "message:u1", "message:u1__user", "tool:call_1", "message:a1", "message:a2",
            "message:x__user", "message:x", "message:a%_\\b", "message:a%", "message:a__b",
            "message:a_yb", "tool:call_2", "message:tm", "message:zz", "message:trace-only",
            "message:unknown",
        ]
        got = await store.get_message_seqs(thread, asked, user_id=None)
        expected = {
            "message:u1": 1, "tool:call_1": 3, "message:a1": 4, "message:a2": 5,
            "message:x__user": 6, "message:a%_\\b": 7, "tool:call_2": 9,
        }
        assert got == expected, (
            "contract: get_message_seqs — tool:{tool_call_id} first, else message:{id}; a human id "
            "loses a trailing __user; earliest seq wins; only message events; unknown identities "
            f"absent; LIKE wildcards match literally\n got: {got}\n expected: {expected}"
        )
        await store.delete_by_thread(thread, user_id=None)

    events_target.run(body)


def test_empty_lookups_do_no_io(events_target: Any) -> None:
    """Empty identities / message ids answer {} without touching storage (even once closed)."""

    async def body(store: RunEventStore) -> None:
        await store.close()
        assert await store.get_message_seqs("t-any", [], user_id=None) == {}, (
            "contract: get_message_seqs with empty input returns {} and does no I/O"
        )
        assert await store.find_latest_ai_message_run_ids("t-any", set(), user_id=None) == {}, (
            "contract: find_latest_ai_message_run_ids with empty input returns {} and does no I/O"
        )

    events_target.run(body)


def test_lookups_pick_the_right_event(events_target: Any) -> None:
    """find_latest_ai_message_run_ids takes the NEWEST AI message with the id (never a
    human or tool message, never a trace); get_message_seqs the EARLIEST; the last visible
    AI seq per run skips middleware callers and is the run's LAST one; empty run_ids is {}."""

    async def body(store: RunEventStore) -> None:
        thread = fresh_id("lookup")
        await store.put_batch(
            [
                ai_message_event(thread, "old", "m1"),  # 1
                ai_message_event(thread, "old", "m2"),  # 2
                ai_message_event(thread, "new", "m1"),  # 3: newer AI m1
                message_event(thread, "human-run", {"type": "human", "id": "m1"}, event_type="human_message"),  # 4
                ai_message_event(thread, "trace-run", "m1", category="trace"),  # 5
                ai_message_event(thread, "new", "m3", metadata={"caller": "lead"}),  # 6
                ai_message_event(thread, "new", "m4", metadata={"caller": "middleware:summary"}),  # 7
                ai_message_event(thread, "old", "m5"),  # 8
            ],
            user_id=None,
        )
        try:
            got = await store.find_latest_ai_message_run_ids(thread, ["m1", "m2", "nope"], user_id=None)
            assert got == {"m1": "new", "m2": "old"}, (
                "contract: find_latest_ai_message_run_ids maps each AI message id to the run of its "
                f"NEWEST AI message event (message category, type ai); got {got}"
            )
            seqs = await store.get_message_seqs(thread, ["message:m1", "message:m5"], user_id=None)
            assert seqs == {"message:m1": 1, "message:m5": 8}, (
                f"contract: get_message_seqs maps an identity to its EARLIEST message seq; got {seqs}"
            )
            last = await store.get_last_visible_ai_seq_by_run(thread, user_id=None)
            assert last == {"old": 8, "new": 6}, (
                "contract: get_last_visible_ai_seq_by_run maps each run to its LAST visible AI message "
                f"(a middleware:* caller hides one); got {last}"
            )
            assert await store.get_last_visible_ai_seq_by_run(thread, run_ids=[], user_id=None) == {}, (
                "contract: get_last_visible_ai_seq_by_run with an empty run_ids returns {}"
            )
            assert await store.count_messages(thread, user_id=None) == 7, (
                "contract: count_messages counts the thread's message events only"
            )
        finally:
            await store.delete_by_thread(thread, user_id=None)

    events_target.run(body)


def test_list_runs_counts_each_run(events_target: Any) -> None:
    """list_runs answers the thread's runs by first seq with their event and message counts
    (what a thread deletion removes from the event store), and follows deletes."""

    async def body(store: RunEventStore) -> None:
        thread = fresh_id("runs")
        await store.put_batch(
            [ai_message_event(thread, "r2", "m1"), ai_message_event(thread, "r1", "m2"),
             ai_message_event(thread, "r2", "x", category="trace", event_type="run.end")],
            user_id=None,
        )
        try:
            runs = await store.list_runs(thread, user_id=None)
            got = [(r.run_id, r.events, r.messages, r.first_seq, r.last_seq) for r in runs]
            assert got == [("r2", 2, 1, 1, 3), ("r1", 1, 1, 2, 2)], (
                f"{got} (contract: list_runs gives each run's events, messages, first and last "
                "seq, ordered by first seq)"
            )
            await store.delete_by_run(thread, "r2", user_id=None)
            assert [r.run_id for r in await store.list_runs(thread, user_id=None)] == ["r1"], (
                "contract: list_runs follows delete_by_run"
            )
            assert await store.list_runs(fresh_id("none"), user_id=None) == [], (
                "contract: a thread without events has no runs"
            )
        finally:
            await store.delete_by_thread(thread, user_id=None)

    events_target.run(body)
