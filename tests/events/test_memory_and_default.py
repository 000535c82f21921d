"""MemoryEventStore indexes and the default find_latest_ai_message_run_ids walk."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from runstore.errors import IncompleteMessageRunLookupError
from runstore.events.protocol import AI_LOOKUP_PAGE_SIZE, walk_ai_message_runs
from runstore.options import BackendOptions
from runstore.plugins.memory.events import MemoryEventStore
from runstore.urls import BackendURL


@pytest.fixture
async def store() -> AsyncIterator[MemoryEventStore]:
    async with BackendOptions.scope() as options:
        yield await MemoryEventStore.open(BackendURL.parse("memory://"), options)


def _ev(run: str, content: Any, category: str = "message", event_type: str = "ai_message") -> dict[str, Any]:
    return {"thread_id": "t", "run_id": run, "event_type": event_type, "category": category, "content": content}


async def test_indexes_follow_deletes(store: MemoryEventStore) -> None:
    await store.put_batch(
        [_ev("r1", {"type": "ai", "id": "a"}), _ev("r2", {"type": "ai", "id": "a"}), _ev("r1", "x", "trace")],
        user_id=None,
    )
    assert await store.get_message_seqs("t", ["message:a"], user_id=None) == {"message:a": 1}
    assert await store.delete_by_run("t", "r1", user_id=None) == 2
    assert await store.get_message_seqs("t", ["message:a"], user_id=None) == {"message:a": 2}
    assert [r["seq"] for r in await store.list_messages("t", user_id=None)] == [2]
    assert (await store.put_if_absent(**_ev("r1", "again"), user_id=None))[1] is True
    assert (await store.put(**_ev("r3", "z"), user_id=None))["seq"] == 4
    assert await store.delete_by_thread("t", user_id=None) == 3
    assert (await store.put(**_ev("r3", "z"), user_id=None))["seq"] == 1, "a deleted thread starts over"


async def test_message_pages_use_the_index(store: MemoryEventStore) -> None:
    await store.put_batch([_ev("r", str(i), "message" if i % 3 else "trace") for i in range(3000)], user_id=None)
    thread = store._threads["t"]
    assert len(thread.messages) == 2000 and len(thread.runs["r"]) == 3000
    page = await store.list_messages("t", limit=3, before_seq=10, user_id=None)
    assert [r["seq"] for r in page] == [6, 8, 9]


class _FakeStore:
    """Only what the default walk touches: list_messages."""

    def __init__(self, rows: list[dict[str, Any]], *, stuck: bool = False) -> None:
        self.rows, self.stuck, self.calls = rows, stuck, 0

    async def list_messages(self, thread_id: str, *, limit: int, before_seq: int | None, user_id: Any) -> list[dict[str, Any]]:
        self.calls += 1
        rows = self.rows if self.stuck or before_seq is None else [r for r in self.rows if r["seq"] < before_seq]
        return rows[-limit:]


def _ai(seq: int, mid: str, run: str = "r") -> dict[str, Any]:
    return {"seq": seq, "category": "message", "run_id": run, "content": {"type": "ai", "id": mid}}


async def test_default_walk_pages_backward() -> None:
    rows = [_ai(i, f"m{i % 1500}", f"r{i}") for i in range(1, 2601)]
    fake = _FakeStore(rows)
    got = await walk_ai_message_runs(fake.list_messages, "t", {"m1", "m1499", "zz"}, None)
    assert got == {"m1": "r1501", "m1499": "r1499"}
    assert fake.calls == 3


async def test_default_walk_raises_without_progress() -> None:
    fake = _FakeStore([_ai(i, "x") for i in range(1, AI_LOOKUP_PAGE_SIZE + 5)], stuck=True)
    with pytest.raises(IncompleteMessageRunLookupError, match="strictly decreasing"):
        await walk_ai_message_runs(fake.list_messages, "t", {"nope"}, None)


async def test_default_walk_raises_on_full_page_without_int_seqs() -> None:
    rows = [{**_ai(i, "x"), "seq": str(i)} for i in range(AI_LOOKUP_PAGE_SIZE)]
    with pytest.raises(IncompleteMessageRunLookupError, match="integer seq"):
        await walk_ai_message_runs(_FakeStore(rows).list_messages, "t", {"nope"}, None)


async def test_default_walk_empty_input_does_nothing() -> None:
    fake = _FakeStore([])
    assert await walk_ai_message_runs(fake.list_messages, "t", set(), None) == {}
    assert fake.calls == 0
