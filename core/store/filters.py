"""Search filters: what a filter may say, and the one evaluator of it in process.

A filter maps a key to a condition. The key is a top-level key of the value or a dotted
path to a nested one (``"meta.tag"``); a nested mapping without operators is the same
as dotted paths (``{"meta": {"tag": "x"}}`` is ``{"meta.tag": "x"}``: it matches as a
subset). A condition is a JSON value (equality) or a mapping of operators: ``$eq``
``$ne`` ``$gt`` ``$gte`` ``$lt`` ``$lte``. Values compare as JSON types: a bool never
equals a number, ``1`` equals ``1.0``; ``None`` equals a missing key or a null;
``$ne`` is the negation of ``$eq``. The ordering operators take a number or a string
and match only values of that kind (numbers as numbers, strings by code point).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from runstore.errors import InvalidStoreInputError
from runstore.validation import copy_json

#: The operators a filter may use, and what each means.
OPERATORS: dict[str, str] = {
    "$eq": "equal",
    "$ne": "not equal (a missing key counts as not equal)",
    "$gt": "greater than",
    "$gte": "greater than or equal",
    "$lt": "less than",
    "$lte": "less than or equal",
}
#: The operators that order values (numbers or strings only).
ORDERING = frozenset({"$gt", "$gte", "$lt", "$lte"})

_MISSING = object()


@dataclass(frozen=True)
class Condition:
    """One checked condition: the path of keys into the value, an operator, an operand."""

    path: tuple[str, ...]
    op: str
    operand: Any


def compile_filter(filter: Any) -> tuple[Condition, ...]:
    """Check ``filter`` (a mapping, or ``None`` for no filter) and return its conditions.

    A key that is empty or has an empty dotted segment, an unknown ``$`` operator, a
    mapping mixing operators with plain keys, an ordering operand that is not a number or
    a string, or an operand that is not JSON raises `InvalidStoreInputError`.
    """
    if filter is None:
        return ()
    if not isinstance(filter, Mapping):
        raise InvalidStoreInputError(
            f"filter must be a dict of key -> value or {{operator: value}}, not {type(filter).__name__}"
        )
    out: list[Condition] = []
    _walk(filter, (), out)
    return tuple(out)


def _walk(filter: Mapping[Any, Any], prefix: tuple[str, ...], out: list[Condition]) -> None:
    for key, condition in filter.items():
        if not isinstance(key, str) or not key:
            raise InvalidStoreInputError(f"filter keys are non-empty strings; got {key!r}")
        if key.startswith("$"):
            raise InvalidStoreInputError(
                f"filter key {key!r} is an operator where a value key belongs; write "
                f"{{'field': {{{key!r}: ...}}}} (operators: {', '.join(OPERATORS)})"
            )
        segments = tuple(key.split("."))
        if any(not s for s in segments):
            raise InvalidStoreInputError(
                f"filter key {key!r} has an empty segment; a nested key is written 'outer.inner'"
            )
        path = prefix + segments
        if isinstance(condition, Mapping) and condition:
            operators = [k for k in condition if isinstance(k, str) and k.startswith("$")]
            if operators and len(operators) != len(condition):
                raise InvalidStoreInputError(
                    f"filter on {'.'.join(path)!r} mixes operators with plain keys: {dict(condition)!r}"
                )
            if operators:
                for op, operand in condition.items():
                    out.append(_condition(path, op, operand))
                continue
            _walk(condition, path, out)
            continue
        out.append(_condition(path, "$eq", condition))


def _condition(path: tuple[str, ...], op: str, operand: Any) -> Condition:
    where = f"filter on {'.'.join(path)!r}"
    if op not in OPERATORS:
        raise InvalidStoreInputError(
            f"{where}: unknown operator {op!r}; accepted: {', '.join(OPERATORS)}"
        )
    if op in ORDERING and (isinstance(operand, bool) or not isinstance(operand, int | float | str)):
        raise InvalidStoreInputError(
            f"{where}: {op} takes a number or a string, not {operand!r}"
        )
    return Condition(path, op, copy_json(operand, where, InvalidStoreInputError))


def lookup(value: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    """The value at ``path`` inside ``value``, or a private sentinel when a key is missing."""
    current: Any = value
    for key in path:
        if not isinstance(current, Mapping) or key not in current:
            return _MISSING
        current = current[key]
    return current


def json_equal(a: Any, b: Any) -> bool:
    """Equality of two JSON values as JSON types: bools are not numbers, 1 == 1.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def holds(condition: Condition, value: Mapping[str, Any]) -> bool:
    """Whether the item value ``value`` satisfies one condition."""
    found = lookup(value, condition.path)
    operand = condition.operand
    if condition.op in ("$eq", "$ne"):
        equal = operand is None if found is _MISSING else json_equal(found, operand)
        return equal if condition.op == "$eq" else not equal
    comparable = (_number(found) and _number(operand)) or (
        isinstance(found, str) and isinstance(operand, str)
    )
    if not comparable:
        return False
    if condition.op == "$gt":
        return bool(found > operand)
    if condition.op == "$gte":
        return bool(found >= operand)
    if condition.op == "$lt":
        return bool(found < operand)
    return bool(found <= operand)


def matches(conditions: tuple[Condition, ...], value: Mapping[str, Any]) -> bool:
    """Whether ``value`` satisfies every condition (no conditions: always)."""
    return all(holds(c, value) for c in conditions)
