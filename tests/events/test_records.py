"""Unit tests of the shared event validation (runstore.events.records) and message identity."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runstore.errors import InvalidEventError
from runstore.events.identity import ai_message_id, message_identity
from runstore.events.records import (
    BATCH_KEYS,
    check_cursor,
    check_event_types,
    check_limit,
    normalize_created_at,
    prepare_batch,
    prepare_event,
    select_page,
    validate_content,
    validate_id,
)
from runstore.validation import MAX_ID_BYTES, truncate_utf8

BASE = {"thread_id": "t", "run_id": "r", "event_type": "e", "category": "message"}


def test_invalid_event_error_is_value_and_type_error() -> None:
    assert issubclass(InvalidEventError, ValueError) and issubclass(InvalidEventError, TypeError)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (float("nan"), "str, a dict"),
        ({"a": float("nan")}, "NaN"),
        ({"a": float("-inf")}, "NaN or Infinity"),
        ("x\ud800", "lone surrogate"),
        ({"k": ["\udc00"]}, "lone surrogate"),
        ({1: 2}, "keys must be str"),
        ({"a": (1, 2)}, "tuple"),
        ({"a": {1, 2}}, "set"),
        ([b"x"], "bytes"),
        ({"a": 2**64}, "64-bit"),
        ("a\x00b", "NUL"),
        (None, "content must be"),
    ],
)
def test_bad_content_names_what_is_accepted(content: object, needle: str) -> None:
    with pytest.raises(InvalidEventError, match=needle):
        prepare_event(**BASE, content=content)


def test_self_reference_is_rejected_not_recursed_forever() -> None:
    loop: dict[str, object] = {}
    loop["me"] = loop
    with pytest.raises(InvalidEventError, match="deeper"):
        validate_content(loop)


def test_content_is_copied() -> None:
    original = {"a": [1, {"b": 2}]}
    copied = validate_content(original)
    assert copied == original
    assert copied is not original and copied["a"] is not original["a"]  # type: ignore[index]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("event_type", "x" * 33),
        ("event_type", ""),
        ("category", "y" * 17),
        ("category", 3),
        ("thread_id", ""),
        ("thread_id", "t" * (MAX_ID_BYTES + 1)),
        ("run_id", "é" * (MAX_ID_BYTES // 2 + 1)),
        ("run_id", None),
    ],
)
def test_bad_scalars(field: str, value: object) -> None:
    with pytest.raises(InvalidEventError, match=field):
        prepare_event(**{**BASE, field: value})


def test_limits_are_inclusive() -> None:
    event = prepare_event(**{**BASE, "event_type": "x" * 32, "category": "y" * 16, "thread_id": "t" * MAX_ID_BYTES})
    assert len(event.event_type) == 32 and len(event.category) == 16


def test_metadata_defaults_and_validation() -> None:
    assert prepare_event(**BASE).metadata == {}
    assert prepare_event(**BASE, metadata={"a": 1}).metadata == {"a": 1}
    with pytest.raises(InvalidEventError, match="metadata"):
        prepare_event(**BASE, metadata=[1])


def test_created_at_normalized_to_utc() -> None:
    assert normalize_created_at("2026-01-01T02:00:00+02:00") == "2026-01-01T00:00:00+00:00"
    assert normalize_created_at("2026-01-01T00:00:00Z") == "2026-01-01T00:00:00+00:00"
    assert normalize_created_at(None).endswith("+00:00")
    for bad in ("2026-01-01T00:00:00", "soon", 12):
        with pytest.raises(InvalidEventError, match="created_at"):
            normalize_created_at(bad)


@given(st.text(), st.integers(min_value=1, max_value=40))
def test_truncate_utf8_cuts_on_a_character_boundary(text: str, limit: int) -> None:
    text = text.encode("utf-8", "replace").decode("utf-8", "replace")
    cut, original = truncate_utf8(text, limit)
    assert original == len(text.encode("utf-8", "surrogatepass"))
    assert len(cut.encode()) <= limit
    assert text.startswith(cut)
    if original <= limit:
        assert cut == text
    else:  # at most one (<= 4 byte) character was dropped at the cut
        assert limit - len(cut.encode()) < 4


def test_trace_truncation_marks_metadata() -> None:
    event = prepare_event(**{**BASE, "category": "trace"}, content="€" * 10, max_trace_content=10)
    assert event.content == "€€€"
    assert event.metadata == {"content_truncated": True, "original_byte_length": 30}
    structured = prepare_event(**{**BASE, "category": "trace"}, content={"a": "x" * 20}, max_trace_content=10)
    assert structured.content == '{"a":"xxxx'
    untouched = prepare_event(**BASE, content="€" * 10, max_trace_content=10)
    assert untouched.content == "€" * 10 and untouched.metadata == {}


def test_batch_keys() -> None:
    good = dict(BASE)
    assert len(prepare_batch([good, good])) == 2
    assert prepare_batch([]) == []
    with pytest.raises(InvalidEventError, match="unknown key"):
        prepare_batch([good, {**good, "seq": 1}])
    with pytest.raises(InvalidEventError, match="put_batch itself"):
        prepare_batch([{**good, "user_id": "u"}])
    with pytest.raises(InvalidEventError, match="lacks required"):
        prepare_batch([{"thread_id": "t"}])
    with pytest.raises(InvalidEventError, match="#1"):
        prepare_batch([good, {**good, "event_type": "x" * 40}])
    with pytest.raises(InvalidEventError, match="list of event dicts"):
        prepare_batch(good)
    assert {"content", "metadata", "created_at"} <= BATCH_KEYS


def test_read_argument_checks() -> None:
    assert check_limit(0) == 0
    for bad in (-1, True, 1.5, "3"):
        with pytest.raises(InvalidEventError):
            check_limit(bad)
    assert check_cursor(None, "after_seq") is None
    with pytest.raises(InvalidEventError, match="before_seq"):
        check_cursor("1", "before_seq")
    assert check_event_types(None) is None
    assert check_event_types([]) == frozenset()
    with pytest.raises(InvalidEventError):
        check_event_types("abc")


def test_validate_id_accepts_metacharacters() -> None:
    for ident in ("a/b", "x'; DROP TABLE t; --", "%_\\", "ünï 🙂"):
        assert validate_id(ident) == ident


@given(
    st.lists(st.integers(1, 60), unique=True).map(sorted),
    st.integers(0, 10),
    st.one_of(st.none(), st.integers(-2, 62)),
    st.one_of(st.none(), st.integers(-2, 62)),
)
def test_select_page_matches_the_plain_reading(seqs: list[int], limit: int, before: int | None, after: int | None) -> None:
    rows = [{"seq": s} for s in seqs]
    window = [r for r in rows if (before is None or r["seq"] < before) and (after is None or r["seq"] > after)]
    expected = window[:limit] if after is not None else (window[-limit:] if limit else [])
    assert select_page(rows, limit=limit, before_seq=before, after_seq=after) == expected  # type: ignore[arg-type]


# -- identity ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "identity"),
    [
        ({"type": "tool", "id": "x", "tool_call_id": "c1"}, "tool:c1"),
        ({"type": "tool", "id": "x", "tool_call_id": ""}, "message:x"),
        ({"type": "human", "id": "a__user"}, "message:a"),
        ({"type": "ai", "id": "a__user"}, "message:a__user"),
        ({"type": "human", "data": {"type": "human", "id": "b__user"}}, "message:b"),
        ({"type": "ai", "data": {"id": "c"}}, "message:c"),
        ({"lc": 1, "type": "constructor", "id": ["langchain", "HumanMessage"], "kwargs": {"id": "d__user"}}, "message:d"),
        ({"type": "ai"}, None),
        ({"type": "ai", "id": ""}, None),
        ("message:x", None),
        (["x"], None),
        (None, None),
    ],
)
def test_message_identity(message: object, identity: str | None) -> None:
    assert message_identity(message) == identity


def test_message_identity_of_langchain_objects() -> None:
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    assert message_identity(HumanMessage("hi", id="h__user")) == "message:h"
    assert message_identity(AIMessage("hi", id="a")) == "message:a"
    assert message_identity(ToolMessage("r", tool_call_id="call", id="t")) == "tool:call"


def test_ai_message_id() -> None:
    assert ai_message_id({"type": "ai", "id": "a"}) == "a"
    assert ai_message_id({"type": "ai", "data": {"type": "ai", "id": "b"}}) == "b"
    assert ai_message_id({"type": "human", "id": "a"}) is None
    assert ai_message_id("ai") is None


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: check_cursor(2**63, "after_seq"), r"after_seq must be None or an int from -9223372036854775808 to 9223372036854775807.*got 9223372036854775808"),
        (lambda: check_cursor(-(2**63) - 1, "before_seq"), r"before_seq must be None or an int from"),
        (lambda: check_limit(2**63), r"limit must be at most 9223372036854775807"),
        (lambda: normalize_created_at("0001-01-01T00:00:00+05:00"), r"created_at 0001-01-01T00:00:00\+05:00 falls outside the years 1 to 9999 once converted to UTC; accepted: .*0001-01-01T00:00:00\+00:00 and 9999-12-31T23:59:59.999999\+00:00"),
        (lambda: normalize_created_at("9999-12-31T23:59:59-05:00"), r"created_at 9999-12-31T23:59:59-05:00 falls outside"),
    ],
)
def test_values_beyond_what_storage_holds_name_the_field_and_range(call: Any, match: str) -> None:
    with pytest.raises(InvalidEventError, match=match):
        call()


def test_the_ends_of_the_ranges_are_accepted() -> None:
    assert check_cursor(2**63 - 1, "after_seq") == 2**63 - 1
    assert check_cursor(-(2**63), "before_seq") == -(2**63)
    assert check_limit(2**63 - 1) == 2**63 - 1
    assert normalize_created_at("0001-01-01T05:00:00+05:00") == "0001-01-01T00:00:00+00:00"
