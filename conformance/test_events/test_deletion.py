"""The event store contract for deletes: the next seq after a delete, and a deleted run
gone from every index.
"""

from __future__ import annotations

from typing import Any

import pytest

from runstore.events.protocol import RunEventStore

from ..events_model import (
    ai_message_event,
    fresh_id,
)

pytestmark = pytest.mark.runstore_contract("run event store")


def test_seq_after_deletes_is_highest_remaining_plus_one(events_target: Any) -> None:
    """After a delete the next seq is the highest remaining seq + 1: deleting the newest
    run frees its seqs, deleting a middle run does not (no seq is handed out twice), and
    a thread deleted entirely starts again at 1."""

    async def body(store: RunEventStore) -> None:
        thread = fresh_id("seq")
        for run in ("a", "b", "c"):
            await store.put_batch([ai_message_event(thread, run, f"{run}{i}") for i in range(2)], user_id=None)
        steps = [("delete run b (middle)", "b", 7), ("delete run c (newest)", "c", 3)]
        for what, run, expected in steps:
            await store.delete_by_run(thread, run, user_id=None)
            got = await store.put(**ai_message_event(thread, "d", f"after-{run}"), user_id=None)
            assert got["seq"] == expected, (
                f"contract: after a delete the next seq is the highest remaining seq + 1 ({what}: "
                f"expected {expected}, got {got['seq']})"
            )
            await store.delete_by_run(thread, "d", user_id=None)
        await store.delete_by_thread(thread, user_id=None)
        fresh = await store.put(**ai_message_event(thread, "e", "again"), user_id=None)
        assert fresh["seq"] == 1, (
            f"contract: after a delete the next seq is the highest remaining seq + 1, so a thread "
            f"deleted entirely starts again at 1 (got {fresh['seq']})"
        )
        await store.delete_by_thread(thread, user_id=None)

    events_target.run(body)


def test_deletes_leave_no_index_behind(events_target: Any) -> None:
    """A deleted run is gone from every read: put_if_absent creates its key again,
    get_message_seqs and find_latest no longer see it, delete_by_run counts every event."""

    async def body(store: RunEventStore) -> None:
        thread = fresh_id("gone")
        await store.put_batch(
            [ai_message_event(thread, "r1", "m1"), ai_message_event(thread, "r1", "x", category="trace", event_type="run.end"),
             ai_message_event(thread, "r2", "m2")],
            user_id=None,
        )
        try:
            deleted = await store.delete_by_run(thread, "r1", user_id=None)
            assert deleted == 2, (
                f"contract: delete_by_run returns how many events (every category) it deleted; got {deleted}"
            )
            record, created = await store.put_if_absent(
                thread_id=thread, run_id="r1", event_type="run.end", category="lifecycle", user_id=None
            )
            assert created is True and record["seq"] == 4, (
                "contract: after delete_by_run, put_if_absent creates the run's (run_id, event_type) "
                f"record again (created={created}, seq={record['seq']})"
            )
            _, other_type = await store.put_if_absent(
                thread_id=thread, run_id="r1", event_type="run.start", category="lifecycle", user_id=None
            )
            assert other_type is True, (
                "contract: put_if_absent keeps one record per (thread_id, run_id, event_type): another "
                "event_type of the same run is created"
            )
            assert await store.get_message_seqs(thread, ["message:m1"], user_id=None) == {}, (
                "contract: after delete_by_run, get_message_seqs no longer finds the deleted messages"
            )
            assert await store.find_latest_ai_message_run_ids(thread, ["m1"], user_id=None) == {}, (
                "contract: after delete_by_run, find_latest_ai_message_run_ids no longer finds them"
            )
        finally:
            await store.delete_by_thread(thread, user_id=None)

    events_target.run(body)
