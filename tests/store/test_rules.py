"""The rules every runstore store shares (runstore.store): namespaces, values, filters,
TTL arithmetic, index fields and the batch plan."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from langgraph.store.base import GetOp, ListNamespacesOp, MatchCondition, PutOp, SearchOp

from runstore.errors import InvalidStoreInputError
from runstore.store import (
    Get,
    IndexRules,
    ListNamespaces,
    Put,
    TTLRules,
    check_namespace,
    check_op,
    check_value,
    compile_filter,
    cosine,
    expired,
    expiry,
    list_namespaces,
    matches,
    plan_batch,
    texts_to_embed,
)


@pytest.mark.parametrize(
    ("namespace", "says"),
    [
        ((), "empty"),
        (("a", ""), "empty label"),
        (("a.b",), "period"),
        (("langgraph", "x"), "reserves"),
        (("a", 1), "int label"),
        ("ab", "tuple"),
        (("a\x00",), "NUL"),
    ],
)
def test_bad_namespaces_say_what_is_wrong(namespace: Any, says: str) -> None:
    with pytest.raises(InvalidStoreInputError, match=says):
        check_namespace(namespace)


def test_values_are_json_objects_copied() -> None:
    value = {"a": [1, {"b": None}]}
    copied = check_value(value)
    assert copied == value and copied is not value and copied["a"] is not value["a"]
    for bad in ([1], "x", {"a": float("inf")}, {1: "x"}, {"a": {1, 2}}):
        with pytest.raises(InvalidStoreInputError):
            check_value(bad)


def test_filters_normalize_dotted_and_nested_keys_alike() -> None:
    assert compile_filter({"meta.tag": "x"}) == compile_filter({"meta": {"tag": "x"}})
    (condition,) = compile_filter({"meta": {"level": {"$gte": 2}}})
    assert (condition.path, condition.op, condition.operand) == (("meta", "level"), "$gte", 2)


@pytest.mark.parametrize(
    "bad",
    [{"a": {"$regex": "x"}}, {"a": {"$gt": [1]}}, {"a": {"$gt": True}}, {"$eq": 1}, {"a..b": 1},
     {"a": {"$eq": 1, "b": 2}}, [("a", 1)], {"": 1}],
)
def test_bad_filters_are_refused(bad: Any) -> None:
    with pytest.raises(InvalidStoreInputError):
        compile_filter(bad)


VALUE = {"n": 10, "f": 1.0, "s": "10", "b": True, "none": None, "meta": {"tag": "red"}, "l": [1, 2]}


@pytest.mark.parametrize(
    ("filter", "hit"),
    [
        ({"n": 10.0}, True),
        ({"f": 1}, True),
        ({"b": 1}, False),
        ({"f": True}, False),
        ({"missing": None}, True),
        ({"none": None}, True),
        ({"missing": {"$ne": 1}}, True),
        ({"n": {"$ne": 10}}, False),
        ({"n": {"$gt": 9, "$lt": 11}}, True),
        ({"s": {"$gt": 9}}, False),
        ({"s": {"$gte": "1"}}, True),
        ({"b": {"$gt": 0}}, False),
        ({"missing": {"$lt": 1}}, False),
        ({"meta.tag": "red"}, True),
        ({"meta": {"tag": "blue"}}, False),
        ({"meta": {"$eq": {"tag": "red"}}}, True),
        ({"l": [1, 2]}, True),
        ({"l": [1, 2.0, 3]}, False),
        ({"meta.tag.deeper": None}, True),
    ],
)
def test_filter_evaluation(filter: dict[str, Any], hit: bool) -> None:
    assert matches(compile_filter(filter), VALUE) is hit


@given(st.integers(-5, 5), st.integers(-5, 5))
def test_ne_is_the_negation_of_eq(a: int, b: int) -> None:
    value = {"x": a}
    assert matches(compile_filter({"x": {"$ne": b}}), value) is not matches(compile_filter({"x": b}), value)


def test_ttl_config_and_arithmetic() -> None:
    rules = TTLRules.of({"default_ttl": 5, "refresh_on_read": False, "sweep_interval_minutes": 1})
    assert (rules.default_ttl, rules.refresh_on_read) == (5.0, False)
    now = datetime(2020, 1, 1, tzinfo=UTC)
    at = expiry(now, 1.5)
    assert at == now + timedelta(seconds=90) and expiry(now, None) is None
    assert not expired(at, at - timedelta(microseconds=1)) and expired(at, at) and not expired(None, at)
    for bad in ({"default_ttl": 0}, {"refresh_on_read": "yes"}, {"nope": 1}, {"default_ttl": float("nan")}):
        with pytest.raises(InvalidStoreInputError):
            TTLRules.of(bad)


def test_index_fields_a_put_names_must_exist() -> None:
    rules = IndexRules.of({"dims": 2, "embed": lambda texts: [[1.0, 0.0] for _ in texts], "fields": ["text"]})
    assert rules is not None
    assert texts_to_embed({"other": "x"}, None, rules) == [], "the store's own fields are skipped when absent"
    assert texts_to_embed({"text": "hi", "tags": ["a", "b"]}, ("tags[*]",), rules) == [("tags[*].0", "a"), ("tags[*].1", "b")]
    assert texts_to_embed({"text": "hi"}, False, rules) == []
    with pytest.raises(InvalidStoreInputError, match="'title'"):
        texts_to_embed({"text": "hi"}, ("title",), rules)
    with pytest.raises(InvalidStoreInputError, match="dims"):
        IndexRules.of({"dims": 0, "embed": lambda t: t})


def test_cosine() -> None:
    assert cosine([1.0, 0.0], [[2.0, 0.0], [0.0, 3.0], [0.0, 0.0], [-1.0, 0.0]]) == [1.0, 0.0, 0.0, -1.0]


def test_ops_are_checked_and_planned_in_order() -> None:
    ns = ("a",)
    ops = [check_op(op) for op in [
        PutOp(ns, "k", {"v": 1}), PutOp(ns, "k", {"v": 2}), PutOp(ns, "j", None),
        GetOp(ns, "k"), SearchOp(ns, {"v": 2}), PutOp(ns, "k", None),
        ListNamespacesOp((MatchCondition("prefix", ns),), max_depth=1),
    ]]
    runs = plan_batch(ops)
    assert [[position for position, _ in run] for run in runs] == [[1, 2], [3, 4], [5], [6]]
    assert isinstance(runs[0][0][1], Put) and runs[0][0][1].value == {"v": 2}
    assert isinstance(runs[1][0][1], Get) and isinstance(runs[3][0][1], ListNamespaces)
    with pytest.raises(InvalidStoreInputError, match="max_depth"):
        check_op(ListNamespacesOp(max_depth=0))
    with pytest.raises(InvalidStoreInputError, match="GetOp"):
        check_op("get")  # type: ignore[arg-type]


def test_namespace_listing_rules() -> None:
    spaces = [("a", "b", "c"), ("a", "b", "d", "e"), ("a", "c"), ("x",)]
    op = check_op(ListNamespacesOp((MatchCondition("prefix", ("a", "*")),), max_depth=2, limit=10))
    assert isinstance(op, ListNamespaces)
    assert list_namespaces(spaces, op) == [("a", "b"), ("a", "c")]
    op = check_op(ListNamespacesOp((MatchCondition("suffix", ("*", "e")),), limit=10))
    assert isinstance(op, ListNamespaces)
    assert list_namespaces(spaces, op) == [("a", "b", "d", "e")]
