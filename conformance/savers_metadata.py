"""Checkpoint metadata and ``alist`` filters for the saver suite, and the reference rule.

`reference_match` is written from the documented rule (docs/savers.md, "Metadata
filters"), independently of `runstore.checkpoint.filters`, so the suite checks the
implementations against the words rather than against themselves; `JSON_FORMS` and
`NO_JSON_FORM` are the stored forms and refusals the docs list, written out. The generated
metadata holds only values JSON keeps as they are (no tuples, NaN or integers
beyond ±2**53, whose comparison with floats JSON leaves open), so the reference
can read it as put.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import math
import uuid
from typing import Any

from hypothesis import strategies as st

#: Top-level metadata keys: few, so filters hit stored keys and miss absent ones.
KEYS = ("a", "b", "c", "d")
_SAFE_INT = 2**53

# No NUL (savers refuse it in nested metadata: PostgreSQL cannot store it) and no
# lone surrogates (not Unicode: no JSON encoder accepts them).
_text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=4)
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-_SAFE_INT, _SAFE_INT)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([0, 1, -1, 0.0, -0.0, 1.0, 1.5, True, False, "", "1", "a"])
    | _text
)
json_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(KEYS) | _text, inner, max_size=3),
    max_leaves=6,
)
metadata = st.dictionaries(st.sampled_from(KEYS), json_values, max_size=4)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _equal(stored: Any, wanted: Any) -> bool:
    """JSON equality as documented: booleans only equal booleans, numbers by value,
    arrays in order, objects whatever their key order, null only null."""
    if isinstance(stored, bool) or isinstance(wanted, bool):
        return type(stored) is bool and type(wanted) is bool and stored is wanted
    if _number(stored) or _number(wanted):
        return _number(stored) and _number(wanted) and stored == wanted
    if isinstance(wanted, list | tuple):
        return (
            isinstance(stored, list)
            and len(stored) == len(wanted)
            and all(_equal(s, w) for s, w in zip(stored, wanted, strict=True))
        )
    if isinstance(wanted, dict):
        return (
            isinstance(stored, dict)
            and set(stored) == set(wanted)
            and all(_equal(stored[k], wanted[k]) for k in wanted)
        )
    return type(stored) is type(wanted) and stored == wanted


def reference_match(stored: dict[str, Any], filter: dict[str, Any]) -> bool:
    """Whether metadata ``stored`` matches ``filter`` under the documented rule
    (``None`` also matches an absent key)."""
    return all(
        stored.get(key) is None if wanted is None else key in stored and _equal(stored[key], wanted)
        for key, wanted in filter.items()
    )


def _variant(draw: Any, value: Any) -> Any:
    """``value`` or a value the rule says is equal or close to it (the cases that differ
    between Python equality, JSON text and SQL): a number as int/float, a boolean as
    a number, an object with its keys in another order."""
    if isinstance(value, bool):
        return draw(st.sampled_from([value, int(value), float(value), not value]))
    if _number(value):
        options = [value, -value if value else 1]
        if isinstance(value, float) and value.is_integer() and abs(value) <= _SAFE_INT:
            options.append(int(value))
        if isinstance(value, int) and abs(value) <= _SAFE_INT:
            options += [float(value), bool(value)]
        return draw(st.sampled_from(options))
    if isinstance(value, list):
        return [_variant(draw, v) for v in value]
    if isinstance(value, dict):
        keys = list(value)
        return {k: _variant(draw, value[k]) for k in reversed(keys)}
    return value


def _filter_for(draw: Any, stored: list[dict[str, Any]]) -> dict[str, Any]:
    """A filter drawn from ``stored`` metadata (so it often matches), perturbed, plus
    sometimes a ``None`` for an absent key or an unrelated value."""
    source = draw(st.sampled_from(stored)) if stored else {}
    keys = draw(st.lists(st.sampled_from(KEYS), max_size=3, unique=True))
    out: dict[str, Any] = {}
    for key in keys:
        choice = draw(st.sampled_from(["same", "same", "none", "other"]))
        if choice == "same" and key in source:
            out[key] = _variant(draw, source[key])
        elif choice == "none":
            out[key] = None
        else:
            out[key] = draw(json_values)
    return out


@st.composite
def metadata_and_filters(draw: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Metadata of a few checkpoints and a filter drawn from them (`_filter_for`)."""
    stored = draw(st.lists(metadata, min_size=1, max_size=5))
    return stored, _filter_for(draw, stored)


class _Color(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class _Point:
    x: int
    y: list[int]


class _Model:
    """Stands for any other object (a pydantic model, say): stored as its ``str``."""

    def __str__(self) -> str:
        return "Model(a=1)"


_UUID = uuid.UUID("12345678-1234-5678-1234-567812345678")

#: Metadata values and the JSON form every saver reads back (docs/savers.md, "Rows"),
#: written out here rather than computed, so the suite checks the words.
JSON_FORMS: dict[str, tuple[Any, Any]] = {
    "an int beyond 64 bits": (2**64, "18446744073709551616"),
    "a negative int beyond 64 bits": (-(2**63) - 1, "-9223372036854775809"),
    "the largest 64-bit int": (2**63 - 1, 2**63 - 1),
    "NaN": (math.nan, None),
    "infinity": (math.inf, None),
    "minus infinity": (-math.inf, None),
    "a naive datetime": (datetime.datetime(2024, 1, 2, 3, 4, 5, 6), "2024-01-02T03:04:05.000006"),
    "an aware datetime": (
        datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone(datetime.timedelta(hours=2))),
        "2024-01-02T03:04:05+02:00",
    ),
    "a date": (datetime.date(2024, 1, 2), "2024-01-02"),
    "a UUID": (_UUID, "12345678-1234-5678-1234-567812345678"),
    "bytes": (b"ab", "b'ab'"),
    "a tuple": ((1, "a", (2,)), [1, "a", [2]]),
    "a set": ({3, 1, 2}, [1, 2, 3]),
    "an int beyond 64 bits in a set": ({2**70}, ["1180591620717411303424"]),
    "a dict with non-str keys": ({1: "a", "n": {2: 3, None: 4}}, {"1": "a", "n": {"2": 3, "null": 4}}),
    "an Enum": (_Color.RED, "red"),
    "a Decimal": (decimal.Decimal("1.50"), "1.50"),
    "a dataclass": (_Point(1, [2]), {"x": 1, "y": [2]}),
    "another object": (_Model(), "Model(a=1)"),
}
#: Filtering by these matches nothing (the filter rule: NaN and infinities never match).
UNMATCHABLE = {"NaN", "infinity", "minus infinity"}


def _self_holding() -> list[Any]:
    value: list[Any] = []
    value.append(value)
    return value


#: Metadata values with no JSON form every saver stores alike: refused with
#: `InvalidSaverInputError` saying what is wrong and what is accepted.
NO_JSON_FORM: dict[str, Any] = {
    "a dict key with no JSON text (a tuple)": {(1, 2): 3},
    "two dict keys with one JSON text (1 and '1')": {1: "a", "1": "b"},
    "a list holding itself": _self_holding(),
}


def same_json(got: Any, expected: Any) -> bool:
    """``got`` equals the decoded JSON value ``expected``, types included (a bool is not
    an int, a tuple not a list), objects whatever their key order."""
    if type(got) is not type(expected):
        return False
    if isinstance(expected, list):
        return len(got) == len(expected) and all(
            same_json(g, e) for g, e in zip(got, expected, strict=True)
        )
    if isinstance(expected, dict):
        return got.keys() == expected.keys() and all(same_json(got[k], expected[k]) for k in expected)
    return bool(got == expected)
