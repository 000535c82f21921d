"""The event store contract for owners: ``user_id=AUTO`` needs an owner_scope, and a
backend declaring ``owner_filter`` scopes every read and delete to the owner.
"""

from __future__ import annotations

from typing import Any

import pytest

from runstore.errors import OwnerContextMissingError
from runstore.events.owner import owner_scope
from runstore.events.protocol import RunEventStore, RunSummary

from ..events_model import (
    check_owner,
    fresh_id,
)

pytestmark = pytest.mark.runstore_contract("run event store")


def test_user_id_auto_without_owner_context_fails(events_target: Any) -> None:
    """``user_id=AUTO`` (the default) needs an owner_scope on every backend, reads and writes."""

    async def body(store: RunEventStore) -> None:
        thread = fresh_id("auto")
        with pytest.raises(OwnerContextMissingError):
            await store.put(thread_id=thread, run_id="r", event_type="a", category="message")
        with pytest.raises(OwnerContextMissingError):
            await store.put_batch([{"thread_id": thread, "run_id": "r", "event_type": "a", "category": "m"}])
        with pytest.raises(OwnerContextMissingError):
            await store.list_messages(thread)
        with pytest.raises(OwnerContextMissingError):
            await store.delete_by_thread(thread)
        with owner_scope(None):
            await store.put(thread_id=thread, run_id="r", event_type="a", category="message")
            assert await store.count_messages(thread) == 1
            assert await store.delete_by_thread(thread) == 1

    events_target.run(body)


@pytest.mark.requires("owner_filter")
def test_owner_filter(events_target: Any) -> None:
    """Declared ``owner_filter``: the owner is stored on writes and filters every read and delete."""

    async def body(store: RunEventStore) -> None:
        thread = fresh_id("own")
        with owner_scope("alice"):
            a1 = await store.put(thread_id=thread, run_id="r1", event_type="ai_message", category="message",
                                 content={"type": "ai", "id": "ma"})
        b1 = await store.put(thread_id=thread, run_id="r1", event_type="ai_message", category="message",
                             content={"type": "ai", "id": "mb"}, user_id="bob")
        (n1,) = await store.put_batch(
            [{"thread_id": thread, "run_id": "r2", "event_type": "ai_message", "category": "message",
              "content": {"type": "ai", "id": "mn"}}], user_id=None,
        )
        check_owner(events_target, a1, "alice")
        check_owner(events_target, b1, "bob")
        check_owner(events_target, n1, None)
        alice = await store.list_messages(thread, user_id="alice")
        assert [r["seq"] for r in alice] == [a1["seq"]], "contract: owner_filter: list_messages shows only the owner's events"
        everyone = await store.list_messages(thread, user_id=None)
        assert len(everyone) == 3, "contract: owner_filter: user_id=None disables the filter"
        with owner_scope("bob"):
            assert await store.count_messages(thread) == 1, "contract: owner_filter: AUTO reads the owner_scope"
            assert [r["seq"] for r in await store.list_events(thread, "r1")] == [b1["seq"]]
            assert [r["seq"] for r in await store.list_messages_by_run(thread, "r1")] == [b1["seq"]]
            assert await store.get_message_seqs(thread, ["message:ma", "message:mb"]) == {"message:mb": b1["seq"]}
            assert await store.find_latest_ai_message_run_ids(thread, ["ma", "mb"]) == {"mb": "r1"}
            assert await store.get_last_visible_ai_seq_by_run(thread) == {"r1": b1["seq"]}
        assert await store.count_messages(thread, user_id="carol") == 0
        existing, created = await store.put_if_absent(
            thread_id=thread, run_id="r1", event_type="ai_message", category="message", user_id="carol",
        )
        assert created is False and existing["seq"] == a1["seq"], (
            "contract: put_if_absent's existence check ignores the owner (one record per "
            "(thread, run, event_type))"
        )
        assert await store.delete_by_run(thread, "r1", user_id="bob") == 1, (
            "contract: owner_filter: deletes remove only the owner's events"
        )
        assert await store.count_messages(thread, user_id=None) == 2
        assert await store.delete_by_thread(thread, user_id="alice") == 1
        assert await store.delete_by_thread(thread, user_id=None) == 1

    events_target.run(body)


@pytest.mark.requires("owner_filter")
def test_owner_filter_scopes_grouped_and_counting_reads(events_target: Any) -> None:
    """Declared ``owner_filter``: list_runs (its runs, event and message counts, first and
    last seq), count_messages and get_last_visible_ai_seq_by_run count only the owner's
    events, with ``user_id`` given and through an owner_scope; ``None`` counts everyone's."""

    async def body(store: RunEventStore) -> None:
        thread = fresh_id("own")

        async def put(owner: str | None, run: str, category: str, mid: str) -> int:
            record = await store.put(thread_id=thread, run_id=run, event_type="ai_message",
                                     category=category, content={"type": "ai", "id": mid}, user_id=owner)
            return int(record["seq"])

        a1 = await put("alice", "r1", "message", "a1")
        a2 = await put("alice", "r1", "trace", "a2")
        b1 = await put("bob", "r1", "message", "b1")
        b2 = await put("bob", "r2", "message", "b2")
        n1 = await put(None, "r3", "message", "n1")
        expected = {
            "alice": [RunSummary("r1", 2, 1, a1, a2)],
            "bob": [RunSummary("r1", 1, 1, b1, b1), RunSummary("r2", 1, 1, b2, b2)],
            "carol": [],
            None: [RunSummary("r1", 3, 2, a1, b1), RunSummary("r2", 1, 1, b2, b2),
                   RunSummary("r3", 1, 1, n1, n1)],
        }
        for owner, runs in expected.items():
            got = list(await store.list_runs(thread, user_id=owner))
            assert got == runs, (
                f"contract: owner_filter: list_runs counts only the owner's events (user_id={owner!r})\n"
                f" got:      {got}\n expected: {runs}"
            )
            messages = sum(r.messages for r in runs)
            count = await store.count_messages(thread, user_id=owner)
            assert count == messages, (
                f"contract: owner_filter: count_messages counts only the owner's messages "
                f"(user_id={owner!r}: {count} != {messages})"
            )
            if owner is not None:
                with owner_scope(owner):
                    assert list(await store.list_runs(thread)) == runs, (
                        "contract: owner_filter: list_runs with user_id=AUTO reads the owner_scope"
                    )
        last = {"alice": {"r1": a1}, "bob": {"r1": b1, "r2": b2}, "carol": {}}
        for owner, seqs in last.items():
            got_last = await store.get_last_visible_ai_seq_by_run(thread, user_id=owner)
            assert got_last == seqs, (
                f"contract: owner_filter: get_last_visible_ai_seq_by_run sees only the owner's "
                f"events (user_id={owner!r}: {got_last} != {seqs})"
            )
        await store.delete_by_thread(thread, user_id=None)

    events_target.run(body)
