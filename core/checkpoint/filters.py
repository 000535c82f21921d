"""The ``alist(filter=...)`` rule every runstore saver applies, in one place.

Metadata is stored as JSON (`codec.stored_json`): values JSON cannot hold are
stored as their ``str``, tuples and sets as arrays, integers outside the signed 64-bit
range as text, NaN and infinities as ``null``. A filter is a mapping of top-level
metadata keys to wanted values, and a checkpoint matches when every key matches:

* ``None`` matches a missing key or JSON ``null``;
* ``True``/``False`` match the same JSON boolean, never a number;
* a number matches a JSON number of equal value (``1`` matches ``1.0``); NaN and
  infinities match nothing;
* a string matches the equal JSON string;
* any other value is first put in the stored form (so a tuple is an array, a
  ``datetime`` its ISO text), then compared as a JSON document: arrays element by
  element in order, objects with the same keys whatever their order, and inside
  them the scalar rules above except that ``null`` matches only ``null``.

Numbers: integers and floats compare by exact value, except that an integer beyond
±2**53 and a float may compare differently on PostgreSQL (which reads JSON numbers
as decimals) than elsewhere; JSON itself does not promise to keep such numbers.

`filter_terms` turns a filter into `FilterTerm`s that SQL savers render in their
dialect; `metadata_matches` evaluates the same terms in Python (the memory saver).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from runstore.checkpoint.codec import (
    ACCEPTED_JSON,
    INT64_MAX,
    INT64_MIN,
    UnstorableJSONError,
    dump_json,
    stored_json,
)
from runstore.errors import InvalidSaverInputError

__all__ = ["FilterTerm", "filter_terms", "json_equal", "metadata_matches"]

TermKind = Literal["null", "bool", "number", "text", "json", "never"]


@dataclass(frozen=True, slots=True)
class FilterTerm:
    """One filter condition on the top-level metadata key ``key``, dialect-neutral.

    ``kind`` says how the stored JSON value compares with ``value``: ``null`` (missing
    or JSON null), ``bool`` (the same JSON boolean), ``number`` (a JSON number of equal
    value), ``text`` (the equal JSON string), ``json`` (an object or array equal as a
    document, see `json_equal`; ``json_type`` is ``object`` or ``array`` and
    `json_text` its canonical JSON) or ``never`` (matches nothing: NaN, infinity).
    """

    key: str
    kind: TermKind
    value: Any
    json_type: str | None = None

    @property
    def json_text(self) -> str:
        """``value`` as canonical JSON text (sorted keys, compact), for ``json`` terms."""
        return dump_json(self.value)


def filter_terms(filter: Mapping[str, Any] | None) -> list[FilterTerm]:
    """The terms of ``filter``, one per key; raises `TypeError` for a key that is not a str
    and `InvalidSaverInputError` for a value with no stored form (`codec.dump_json`)."""
    terms: list[FilterTerm] = []
    for key, value in (filter or {}).items():
        if not isinstance(key, str):
            raise TypeError(f"metadata filter keys must be strings, not {type(key).__name__}")
        terms.append(_term(key, value))
    return terms


def _term(key: str, value: Any) -> FilterTerm:
    if value is None:
        return FilterTerm(key, "null", None)
    if isinstance(value, bool):
        return FilterTerm(key, "bool", value, "true" if value else "false")
    if isinstance(value, float) and not math.isfinite(value):
        return FilterTerm(key, "never", None)
    if isinstance(value, float) or (isinstance(value, int) and INT64_MIN <= value <= INT64_MAX):
        return FilterTerm(key, "number", value)
    if isinstance(value, str):
        return FilterTerm(key, "text", value, "text")
    try:
        stored = stored_json(value)
    except UnstorableJSONError as exc:
        raise InvalidSaverInputError(
            f"metadata filter value for {key!r} has no JSON form: {exc}; {ACCEPTED_JSON}"
        ) from exc
    if isinstance(stored, dict):
        return FilterTerm(key, "json", stored, "object")
    if isinstance(stored, list):
        return FilterTerm(key, "json", stored, "array")
    return _term(key, stored)


def json_equal(stored: Any, wanted: Any) -> bool:
    """Whether two decoded JSON values are equal under the filter rule (see module doc)."""
    if isinstance(stored, bool) or isinstance(wanted, bool):
        return isinstance(stored, bool) and isinstance(wanted, bool) and stored == wanted
    if isinstance(stored, int | float) and isinstance(wanted, int | float):
        return stored == wanted
    if isinstance(stored, str) and isinstance(wanted, str):
        return stored == wanted
    if isinstance(stored, list) and isinstance(wanted, list):
        return len(stored) == len(wanted) and all(
            json_equal(a, b) for a, b in zip(stored, wanted, strict=True)
        )
    if isinstance(stored, dict) and isinstance(wanted, dict):
        return stored.keys() == wanted.keys() and all(
            json_equal(stored[k], wanted[k]) for k in stored
        )
    return stored is None and wanted is None


def metadata_matches(metadata: Mapping[str, Any], terms: list[FilterTerm]) -> bool:
    """Whether stored-form ``metadata`` (`codec.stored_json`) satisfies every term."""
    return all(_term_matches(metadata, term) for term in terms)


def _term_matches(metadata: Mapping[str, Any], term: FilterTerm) -> bool:
    if term.kind == "null":
        return metadata.get(term.key) is None
    if term.kind == "never" or term.key not in metadata:
        return False
    return json_equal(metadata[term.key], term.value)
