"""What a store accepts: namespaces, keys, values and per-put TTLs, checked before any I/O.

The namespace rules are LangGraph's (a tuple of non-empty string labels, none holding a
``.``, not rooted at the reserved ``langgraph`` label), plus what no backend can store
(a NUL or a lone surrogate). Every runstore store checks with these, so a refused call
raises `InvalidStoreInputError` and writes nothing, whatever the backend.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from runstore.errors import InvalidStoreInputError
from runstore.validation import check_text, copy_json

#: The root label LangGraph keeps for itself.
RESERVED_LABEL = "langgraph"
#: The wildcard label of a `list_namespaces` prefix or suffix.
WILDCARD = "*"


def check_labels(labels: Any, what: str) -> tuple[str, ...]:
    """``labels`` as a tuple of valid namespace labels (an empty tuple is fine here)."""
    if isinstance(labels, str) or not isinstance(labels, tuple | list):
        raise InvalidStoreInputError(
            f"{what} must be a tuple of string labels, e.g. ('users', 'u1'); got {labels!r}"
        )
    for label in labels:
        if not isinstance(label, str):
            raise InvalidStoreInputError(
                f"{what} {tuple(labels)!r} holds a {type(label).__name__} label {label!r}; "
                "every label is a non-empty string"
            )
        if not label:
            raise InvalidStoreInputError(
                f"{what} {tuple(labels)!r} holds an empty label; every label is a non-empty string"
            )
        if "." in label:
            raise InvalidStoreInputError(
                f"{what} {tuple(labels)!r}: label {label!r} contains a period ('.'), which "
                "stores use to join labels; use another separator inside a label"
            )
        check_text(label, f"{what} label {label!r}", InvalidStoreInputError)
    return tuple(labels)


def check_namespace(namespace: Any) -> tuple[str, ...]:
    """A namespace an item lives in: non-empty, valid labels, not rooted at ``langgraph``."""
    labels = check_labels(namespace, "namespace")
    if not labels:
        raise InvalidStoreInputError(
            "namespace is empty; an item lives in a namespace of at least one label, e.g. ('memories',)"
        )
    if labels[0] == RESERVED_LABEL:
        raise InvalidStoreInputError(
            f"namespace {labels!r} starts with {RESERVED_LABEL!r}, which LangGraph reserves; "
            "choose another root label"
        )
    return labels


def check_key(key: Any) -> str:
    """An item's key: a string without a NUL or a lone surrogate."""
    if not isinstance(key, str):
        raise InvalidStoreInputError(f"key must be a string, not {type(key).__name__} ({key!r})")
    check_text(key, f"key {key!r}", InvalidStoreInputError)
    return key


def check_value(value: Any) -> dict[str, Any]:
    """A fresh copy of an item's value: a JSON object (a mapping with string keys)."""
    if not isinstance(value, Mapping):
        raise InvalidStoreInputError(
            f"value must be a dict (a JSON object), not {type(value).__name__}; "
            "wrap other JSON values, e.g. {'value': ...}"
        )
    copied: dict[str, Any] = copy_json(dict(value), "value", InvalidStoreInputError)
    return copied


def check_minutes(value: Any, what: str) -> float | None:
    """A TTL in minutes: ``None`` (never expires) or a positive finite number."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidStoreInputError(
            f"{what} must be a positive number of minutes or None, not {value!r}"
        )
    if value <= 0:
        raise InvalidStoreInputError(f"{what} must be a positive number of minutes or None, not {value!r}")
    return float(value)


def check_page(limit: Any, offset: Any, what: str) -> tuple[int, int]:
    """``(limit, offset)`` of a search or listing: whole numbers >= 0 (``limit=0``: an empty page)."""
    for name, number in (("limit", limit), ("offset", offset)):
        if isinstance(number, bool) or not isinstance(number, int) or number < 0:
            raise InvalidStoreInputError(f"{what} {name} must be a whole number >= 0, not {number!r}")
    return limit, offset
