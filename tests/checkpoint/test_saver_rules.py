"""The rules every saver shares: metadata filters, missing delta channels, accepted ids."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from runstore.checkpoint import codec
from runstore.checkpoint.filters import filter_terms, json_equal, metadata_matches
from runstore.checkpoint.rules import (
    checked_text,
    config_address,
    missing_delta_channels,
    reconstruction_ancestors,
)
from runstore.errors import InvalidSaverInputError

STORED = codec.stored_json(
    {
        "n": None,
        "t": True,
        "one": 1,
        "half": 0.5,
        "s": "x",
        "doc": {"b": [1, 2.0], "a": None},
        "tup": (1, 2),
        "when": datetime.datetime(2024, 1, 2, 3, 4, 5),
        "big": 2**70,
    }
)


@pytest.mark.parametrize(
    ("flt", "expected"),
    [
        ({}, True),
        ({"n": None}, True),
        ({"absent": None}, True),
        ({"s": None}, False),
        ({"t": True}, True),
        ({"t": 1}, False),
        ({"one": True}, False),
        ({"one": 1.0}, True),
        ({"half": 0.5}, True),
        ({"one": "1"}, False),
        ({"s": "x"}, True),
        ({"doc": {"a": None, "b": [1.0, 2]}}, True),
        ({"doc": {"b": [1, 2]}}, False),
        ({"doc": {"a": None, "b": [True, 2]}}, False),
        ({"tup": [1, 2]}, True),
        ({"tup": (1, 2)}, True),
        ({"when": datetime.datetime(2024, 1, 2, 3, 4, 5)}, True),
        ({"when": "2024-01-02T03:04:05"}, True),
        ({"big": 2**70}, True),
        ({"big": str(2**70)}, True),
        ({"one": float("nan")}, False),
        ({"absent": float("inf")}, False),
        ({"absent": 1}, False),
        ({"s": "x", "one": 2}, False),
    ],
)
def test_filter_rule(flt: dict[str, Any], expected: bool) -> None:
    """The documented filter rule (docs/savers.md) on values in their stored form."""
    assert metadata_matches(STORED, filter_terms(flt)) is expected


def test_filter_keys_must_be_text() -> None:
    with pytest.raises(TypeError, match="strings"):
        filter_terms({1: "x"})  # type: ignore[dict-item]


def test_json_equal_is_structural() -> None:
    assert json_equal({"a": [1, {"b": 2}]}, {"a": [1.0, {"b": 2}]})
    assert not json_equal([1, 2], [2, 1])
    assert not json_equal({"a": 1}, {"a": 1, "b": None})
    assert not json_equal(None, False)
    assert not json_equal(0, False)


def test_missing_delta_channels_needs_a_version() -> None:
    """A delta channel named in the counters but never written has no version: it is
    empty and its reconstruction reads no ancestor. Only unknown versions (rows stored
    before versions were kept) assume one."""
    metadata = {"counters_since_delta_snapshot": {"m": [1, 1], "never": [1, 1], "held": [1, 1]}}
    assert missing_delta_channels(metadata, {"m": "2", "held": "1"}, {"held"}) == ["m"]
    assert missing_delta_channels(metadata, None, {"held"}) == ["m", "never"]
    assert missing_delta_channels({}, {"m": "1"}, set()) == []


def test_an_unversioned_delta_channel_keeps_no_ancestor() -> None:
    """The rule a saver prunes by: ignoring versions would keep the whole chain."""
    parents = {"c": "b", "b": "a", "a": None}
    metadata = {"counters_since_delta_snapshot": {"never": [2, 2]}}
    missing = missing_delta_channels(metadata, {}, set())
    assert reconstruction_ancestors("c", missing, parents.get, lambda _: set()) == []
    ignoring_versions = missing_delta_channels(metadata, None, set())
    assert reconstruction_ancestors("c", ignoring_versions, parents.get, lambda _: set()) == [
        "b",
        "a",
    ]


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"configurable": {}}, "thread_id"),
        ({"configurable": {"thread_id": ""}}, "thread_id"),
        ({"configurable": {"thread_id": "a\x00b"}}, "thread_id"),
        ({"configurable": {"thread_id": "a\ud800"}}, "thread_id"),
        ({"configurable": {"thread_id": "t", "checkpoint_ns": "\udfff"}}, "checkpoint_ns"),
        ({"configurable": {"thread_id": "t", "checkpoint_id": "x\x00"}}, "checkpoint_id"),
    ],
)
def test_config_address_names_the_bad_field(config: Any, field: str) -> None:
    with pytest.raises(InvalidSaverInputError, match=field):
        config_address(config)


def test_config_address_accepts_plain_ids() -> None:
    assert config_address({"configurable": {"thread_id": 7}}) == ("7", "", None)
    assert config_address(
        {"configurable": {"thread_id": "t", "checkpoint_ns": "sub:1", "checkpoint_id": "c"}}
    ) == ("t", "sub:1", "c")
    assert checked_text("", "ns", empty_ok=True) == ""


@pytest.mark.parametrize(
    ("metadata", "refused"),
    [
        ({"a": {"b": "x\x00"}}, True),
        ({"k\x00": 1}, True),
        ({"a": ["\\u0000"]}, False),
        ({"a": "\\\\u0000"}, False),
        ({"a": ["bad\ud800"]}, True),
        ({"a": 2**70, "b": {"c": -(2**64)}}, False),
    ],
)
def test_metadata_no_saver_can_store_is_refused(metadata: dict[str, Any], refused: bool) -> None:
    """Nested NUL (PostgreSQL JSON refuses it) and lone surrogates (no JSON encoder takes
    them) are refused up front; big integers are stored as text."""
    if refused:
        with pytest.raises(InvalidSaverInputError, match="metadata"):
            codec.metadata_text(metadata)
    else:
        assert codec.metadata_text(metadata).startswith("{")


def _holding_itself() -> list[Any]:
    value: list[Any] = []
    value.append(value)
    return value


@pytest.mark.parametrize(
    ("metadata", "says"),
    [
        ({"a": "x\ud800"}, "lone surrogate"),
        ({"a": {(1, 2): 3}}, "dict key of type tuple"),
        ({"a": {1: "x", "1": "y"}}, "two keys of one dict, 1 and '1'"),
        ({"a": {None: 1, float("nan"): 2}}, "are both 'null'"),
        ({"a": _holding_itself(), "b": 2**70}, "refers to itself"),
        ({"a": _holding_itself()}, "refers to itself"),
    ],
)
def test_metadata_with_no_json_form_says_what_and_what_is_accepted(metadata: dict[str, Any], says: str) -> None:
    """Each refusal names its cause and the accepted values, never a raw TypeError or
    RecursionError (whichever error orjson meets first)."""
    with pytest.raises(InvalidSaverInputError, match="accepted") as caught:
        codec.metadata_text(metadata)
    assert says in str(caught.value)


def test_big_ints_anywhere_the_walk_reaches_are_text() -> None:
    """Ints beyond 64 bits in sets, tuples and keys are stored as text, not refused."""
    stored = codec.stored_json({"s": {2**70, 1}, "t": (2**64,), "k": {2**65: 1}})
    assert stored == {"s": [1, str(2**70)], "t": [str(2**64)], "k": {str(2**65): 1}}


def test_filter_value_with_no_json_form_is_refused_naming_the_key() -> None:
    with pytest.raises(InvalidSaverInputError, match="'when'"):
        filter_terms({"when": {(1,): 2}})


@pytest.mark.parametrize(
    ("versions", "bad"),
    [
        ({"messages": "0001.5", "é": "2"}, None),
        ({"a\x00": "1"}, "channel name"),
        ({"é\ud800": "1"}, "channel name"),
        ({"a": "1\x00"}, "version of channel 'a'"),
        ({"a": 3, "b": 4.5}, None),
    ],
)
def test_check_channels(versions: dict[str, Any], bad: str | None) -> None:
    from runstore.checkpoint.rules import check_channels

    if bad is None:
        check_channels(versions, "channel_versions")
    else:
        with pytest.raises(InvalidSaverInputError, match=bad):
            check_channels(versions, "channel_versions")
