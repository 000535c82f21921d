"""The event store contract for bad input: every write and read checks its arguments,
refuses with a clear error, writes nothing, and checks a call in one order.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from runstore.errors import OwnerContextMissingError
from runstore.events.protocol import RunEventStore

from ..events_model import (
    BAD_INPUT,
    GOOD,
    core,
    fresh_id,
)

pytestmark = pytest.mark.runstore_contract("run event store")


BAD_EVENTS: dict[str, dict[str, Any]] = {
    "event_type over 32 chars": {"event_type": "e" * 33},
    "empty event_type": {"event_type": ""},
    "category over 16 chars": {"category": "c" * 17},
    "content of a non-JSON type": {"content": object()},
    "content as an int": {"content": 5},
    "content holding a set": {"content": {"a": {1, 2}}},
    "content holding bytes": {"content": [b"raw"]},
    "NaN in content": {"content": {"x": float("nan")}},
    "infinity in metadata": {"metadata": {"x": float("inf")}},
    "lone surrogate in content": {"content": "bad \ud800 text"},
    "lone surrogate in a content key": {"content": {"\udfff": 1}},
    "lone surrogate in event_type": {"event_type": "x\ud800"},
    "non-str content key": {"content": {1: "a"}},
    "metadata not a dict": {"metadata": ["a"]},
    "naive created_at": {"created_at": "2026-01-01T00:00:00"},
    "created_at not ISO-8601": {"created_at": "yesterday"},
    "run_id not a str": {"run_id": 7},
    "empty run_id": {"run_id": ""},
    "created_at before year 1 in UTC": {"created_at": "0001-01-01T00:00:00+05:00"},
    "created_at after year 9999 in UTC": {"created_at": "9999-12-31T23:59:59-05:00"},
}


@pytest.mark.parametrize("case", sorted(BAD_EVENTS))
def test_bad_input_is_a_clear_error_and_writes_nothing(events_target: Any, case: str) -> None:
    async def body(store: RunEventStore) -> None:
        thread = fresh_id("bad")
        event: dict[str, Any] = {"thread_id": thread, **GOOD, **BAD_EVENTS[case]}
        with pytest.raises(BAD_INPUT) as info:
            await store.put(**event, user_id=None)
        assert str(info.value), f"contract: bad input ({case}) raises an error that says what is wrong"
        with pytest.raises(BAD_INPUT):
            await store.put_if_absent(**event, user_id=None)
        good = {"thread_id": thread, **GOOD}
        with pytest.raises(BAD_INPUT):
            await store.put_batch([good, good, event], user_id=None)
        count = await store.count_messages(thread, user_id=None)
        events = await store.list_events(thread, "run-1", user_id=None)
        assert count == 0 and events == [], (
            f"contract: put_batch is all-or-nothing: a rejected batch ({case}) writes nothing "
            f"(found {len(events)} events)"
        )

    events_target.run(body)


def test_put_batch_unknown_key_is_rejected(events_target: Any) -> None:
    async def body(store: RunEventStore) -> None:
        thread = fresh_id("keys")
        good = {"thread_id": thread, **GOOD}
        for extra in ({"seq": 5}, {"user_id": "u"}, {"colour": "red"}):
            with pytest.raises(BAD_INPUT):
                await store.put_batch([good, {**good, **extra}], user_id=None)
        with pytest.raises(BAD_INPUT):
            await store.put_batch([{"thread_id": thread, "run_id": "r"}], user_id=None)
        assert await store.list_events(thread, "run-1", user_id=None) == [], (
            "contract: put_batch is all-or-nothing: unknown or missing keys reject the whole batch"
        )

    events_target.run(body)


IDS = [
    "../escape", "a/b", "/abs", "a\\b", "..", ".", "x'; DROP TABLE run_events; --",
    "100%_done\\", 'quote"d', "ünï 🙂 code", "new\nline", "tab\tand space", "a" * 200,
]


@pytest.mark.parametrize("ident", IDS, ids=lambda s: repr(s)[:24])
def test_ids_with_metacharacters_round_trip_or_fail_clearly(events_target: Any, ident: str) -> None:
    async def body(store: RunEventStore) -> None:
        for thread, run in ((f"{ident}", "run-1"), (fresh_id("meta"), ident)):
            try:
                record = await store.put(
                    thread_id=thread, run_id=run, event_type="ai_message", category="message",
                    content={"type": "ai", "id": "m"}, user_id=None,
                )
            except BAD_INPUT as exc:
                assert str(exc), "contract: a rejected id gets an error that says why"
                continue
            assert (record["thread_id"], record["run_id"]) == (thread, run), (
                "contract: ids round-trip faithfully"
            )
            listed = await store.list_events(thread, run, user_id=None)
            assert [core(r) for r in listed] == [core(record)], (
                f"contract: an accepted id ({ident!r}) round-trips faithfully through list_events"
            )
            messages = await store.list_messages(thread, user_id=None)
            assert core(record) in [core(r) for r in messages], (
                "contract: an accepted id round-trips faithfully through list_messages"
            )
            assert await store.delete_by_thread(thread, user_id=None) >= 1

    events_target.run(body)


def test_over_long_id_is_rejected(events_target: Any) -> None:
    async def body(store: RunEventStore) -> None:
        with pytest.raises(BAD_INPUT):
            await store.put(thread_id="t" * 300, run_id="r", event_type="a", category="message", user_id=None)
        with pytest.raises(BAD_INPUT):
            await store.put(thread_id=fresh_id(), run_id="r" * 300, event_type="a", category="message", user_id=None)

    events_target.run(body)


def test_read_arguments_are_validated(events_target: Any) -> None:
    async def body(store: RunEventStore) -> None:
        thread = fresh_id("args")
        with pytest.raises(BAD_INPUT):
            await store.list_messages(thread, limit=-1, user_id=None)
        with pytest.raises(BAD_INPUT):
            await store.list_events(thread, "r", event_types="abc", user_id=None)
        assert await store.list_messages(thread, limit=0, user_id=None) == [], "contract: limit=0 is an empty page"

    events_target.run(body)


async def _expect(call: Callable[[], Awaitable[Any]], errors: Any, contract: str) -> None:
    try:
        got = await call()
    except errors:
        return
    except Exception as exc:
        raise AssertionError(f"{contract} (raised {type(exc).__name__}: {exc})") from exc
    raise AssertionError(f"{contract} (returned {got!r})")


def test_calls_are_checked_in_one_order(events_target: Any) -> None:
    """Every backend checks a call in one order: its arguments (in signature order), then the
    owner, then answers that need no I/O return, then the store must be open."""

    async def body(store: RunEventStore) -> None:
        bad = ""  # not a thread id
        thread = fresh_id("order")
        no_io: dict[str, Callable[[], Awaitable[Any]]] = {
            "get_message_seqs(bad thread, [])": lambda: store.get_message_seqs(bad, [], user_id=None),
            "find_latest_ai_message_run_ids(bad thread, [])": lambda: store.find_latest_ai_message_run_ids(
                bad, [], user_id=None
            ),
            "get_last_visible_ai_seq_by_run(bad thread, run_ids=[])": lambda: (
                store.get_last_visible_ai_seq_by_run(bad, run_ids=[], user_id=None)
            ),
            "list_events(bad thread, event_types=[])": lambda: store.list_events(
                bad, "r", event_types=[], user_id=None
            ),
            "list_messages(bad thread, limit=0)": lambda: store.list_messages(bad, limit=0, user_id=None),
            "list_messages_by_run(bad run, limit=0)": lambda: store.list_messages_by_run(
                thread, bad, limit=0, user_id=None
            ),
            "list_messages(limit=0, after_seq='1')": lambda: store.list_messages(
                thread, limit=0, after_seq="1", user_id=None  # type: ignore[arg-type]
            ),
        }
        for name, call in no_io.items():
            await _expect(call, BAD_INPUT, f"contract: arguments are checked before an answer that needs no I/O: {name} is bad input")
        # No owner_scope is set: user_id=AUTO (the default) cannot be resolved.
        before_owner: dict[str, Callable[[], Awaitable[Any]]] = {
            "get_message_seqs(bad thread)": lambda: store.get_message_seqs(bad, ["message:a"]),
            "count_messages(bad thread)": lambda: store.count_messages(bad),
            "delete_by_run(bad run)": lambda: store.delete_by_run(thread, bad),
            "put(empty event_type)": lambda: store.put(
                thread_id=thread, run_id="r", event_type="", category="message"
            ),
            "put_batch(bad thread)": lambda: store.put_batch(
                [{"thread_id": bad, "run_id": "r", "event_type": "e", "category": "message"}]
            ),
        }
        for name, call in before_owner.items():
            await _expect(call, BAD_INPUT, f"contract: arguments are checked before the owner: {name} without an owner context is bad input")
        empty_without_owner: dict[str, Callable[[], Awaitable[Any]]] = {
            "get_message_seqs(thread, [])": lambda: store.get_message_seqs(thread, []),
            "find_latest_ai_message_run_ids(thread, [])": lambda: store.find_latest_ai_message_run_ids(thread, []),
            "list_messages(thread, limit=0)": lambda: store.list_messages(thread, limit=0),
            "put_batch([])": lambda: store.put_batch([]),
        }
        for name, call in empty_without_owner.items():
            await _expect(call, OwnerContextMissingError, f"contract: the owner is resolved before an answer that needs no I/O: {name} without an owner context fails")
        await store.close()
        empty_answers: dict[str, tuple[Any, Any]] = {
            "get_message_seqs(thread, [])": (await store.get_message_seqs(thread, [], user_id=None), {}),
            "find_latest_ai_message_run_ids(thread, [])": (
                await store.find_latest_ai_message_run_ids(thread, [], user_id=None), {}
            ),
            "get_last_visible_ai_seq_by_run(run_ids=[])": (
                await store.get_last_visible_ai_seq_by_run(thread, run_ids=[], user_id=None), {}
            ),
            "list_messages(limit=0)": (await store.list_messages(thread, limit=0, user_id=None), []),
            "list_events(event_types=[])": (
                await store.list_events(thread, "r", event_types=[], user_id=None), []
            ),
            "put_batch([])": (await store.put_batch([], user_id=None), []),
        }
        for name, (got, expected) in empty_answers.items():
            assert got == expected, (
                f"contract: an answer that needs no I/O is given even by a closed store ({name} gave {got!r})"
            )
        await _expect(
            lambda: store.list_messages(bad, user_id=None), BAD_INPUT,
            "contract: arguments are checked before the store: bad input to a closed store is bad input",
        )
        await _expect(
            lambda: store.get_message_seqs(thread, []), OwnerContextMissingError,
            "contract: the owner is resolved before the store: a closed store still needs an owner context",
        )
        for name, call in {
            "count_messages": lambda: store.count_messages(thread, user_id=None),
            "list_messages": lambda: store.list_messages(thread, user_id=None),
            "put": lambda: store.put(thread_id=thread, run_id="r", event_type="e", category="message", user_id=None),
            "delete_by_thread": lambda: store.delete_by_thread(thread, user_id=None),
        }.items():
            await _expect(call, RuntimeError, f"contract: a call that needs I/O on a closed store raises RuntimeError ({name})")

    events_target.run(body)
