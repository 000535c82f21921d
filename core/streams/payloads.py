"""What stream data may hold, and the one JSON form every bridge publishes it in.

A bridge publishes JSON: plain values (dict with string keys, list, tuple, str, int,
float, bool, None) pass as they are; what LangGraph streams emit is turned into JSON the
way the LangGraph SDK encodes it (`to_stream_json`):

- a Pydantic model (a message or message chunk, a structured output) is its
  ``model_dump(mode="json")``, e.g. ``{"type": "AIMessageChunk", "content": ..., "id": ...}``;
- a dataclass (``Interrupt``, ``Command``) is a dict of its fields; ``Send`` is
  ``{"node": ..., "arg": ...}``; a named tuple is a dict of its fields;
- a set is a list; a datetime, date or time its ISO 8601 text; a UUID or Decimal its
  text; an Enum its value; an exception ``{"error": <type name>, "message": <text>}``.

Anything else, NaN, Infinity and dict keys that are not strings are an
`InvalidStreamInputError` naming where in the data it sits; nothing is published.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import math
import uuid
from typing import Any

from runstore.errors import InvalidStreamInputError

_LEAVES = (str, int, bool, type(None))
_ACCEPTED = (
    "accepted: dict (string keys), list, tuple, str, int, finite float, bool, None, Pydantic "
    "models (messages), dataclasses (Interrupt, Command), Send, named tuples, sets, "
    "datetimes, UUIDs, Decimals, Enums and exceptions"
)


def to_stream_json(data: Any) -> Any:
    """``data`` as JSON values (the same object when it already is one); raise
    `InvalidStreamInputError` naming the place of anything that cannot be."""
    return _convert(data, "data")


def _convert(value: Any, path: str) -> Any:
    kind = type(value)
    if kind in _LEAVES:
        return value
    if kind is float:
        if not math.isfinite(value):
            raise InvalidStreamInputError(
                f"stream data must be JSON: {path} is {value!r}, and JSON has "
                "no NaN or Infinity (send null, a string or a finite number)"
            )
        return value
    if kind is dict:
        return _convert_dict(value, path)
    if kind is list or kind is tuple:
        items = [_convert(item, f"{path}[{i}]") for i, item in enumerate(value)]
        # The same object when nothing changed: plain data is not copied on every publish.
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    return _convert(_object_json(value, path), path)


def _convert_dict(value: dict[Any, Any], path: str) -> dict[str, Any]:
    changed: dict[str, Any] = {}
    for key, item in value.items():
        if type(key) is not str:
            raise InvalidStreamInputError(
                f"stream data must be JSON: {path} has the key {key!r} ({type(key).__name__}); "
                "JSON object keys are strings"
            )
        converted = _convert(item, f"{path}[{key!r}]")
        if converted is not item:
            changed[key] = converted
    return {**value, **changed} if changed else value


def _object_json(value: Any, path: str) -> Any:
    """One non-plain object as plain data (converted further by the caller)."""
    if isinstance(value, type):
        raise InvalidStreamInputError(f"stream data must be JSON: {path} is the class {value!r}; {_ACCEPTED}")
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            return dump(mode="json")
        except Exception as exc:  # pydantic's serialization error: a field with no JSON form
            raise InvalidStreamInputError(
                f"stream data must be JSON: {path} ({type(value).__qualname__}) cannot be dumped as JSON: {exc}"
            ) from exc
    if dataclasses.is_dataclass(value):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, tuple) and hasattr(value, "_asdict"):
        return dict(value._asdict())
    if isinstance(value, (set, frozenset)):
        return list(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (uuid.UUID, decimal.Decimal)):
        return str(value)
    if isinstance(value, BaseException):
        return {"error": type(value).__name__, "message": str(value)}
    if type(value).__name__ == "Send" and type(value).__module__.startswith("langgraph"):
        return {"node": value.node, "arg": value.arg}
    # A subclass of a plain type: its plain value.
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, (list, tuple)):
        return list(value)
    raise InvalidStreamInputError(
        f"stream data must be JSON: {path} is a {type(value).__module__}.{type(value).__qualname__}, "
        f"which has no JSON form; {_ACCEPTED}"
    )
