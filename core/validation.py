"""Input validation every kind shares: text, ids' byte limit, JSON values and their encoding.

Stores check arguments with these before any I/O, so a rejected call writes nothing and
every backend accepts and refuses exactly the same values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import orjson

from runstore.errors import InvalidEventError, RunstoreError

#: Longest thread/run id, in UTF-8 bytes (a JSONL run file name must stay under 255 bytes).
MAX_ID_BYTES = 200


#: Deepest nesting of JSON content/metadata accepted (orjson itself stops at 255).
MAX_JSON_DEPTH = 128


_INT_MIN = -(2**63)


_INT_MAX = 2**64 - 1  # orjson's range


def check_text(
    value: str, what: str, error: type[RunstoreError] = InvalidEventError
) -> None:
    """Raise ``error`` naming ``what`` if ``value`` holds a NUL or a lone surrogate."""
    if "\x00" in value:
        raise error(
            f"{what} contains a NUL character (\\x00), which no backend can store "
            "(PostgreSQL text rejects it); remove or escape it"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise error(
            f"{what} contains a lone surrogate (not valid Unicode text); "
            "only strings that encode to UTF-8 are accepted"
        ) from None


_ACCEPTED_JSON = "str, int, finite float, bool, None, list and dict with str keys"


def _copy_json(
    value: Any, where: str, depth: int, error: type[RunstoreError] = InvalidEventError
) -> Any:
    """Return a fresh copy of a JSON value, rejecting anything JSON cannot round-trip."""
    if depth > MAX_JSON_DEPTH:
        raise error(
            f"{where} nests deeper than {MAX_JSON_DEPTH} levels (or refers to itself)"
        )
    if isinstance(value, str):
        check_text(value, where, error)
        return value
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if not _INT_MIN <= value <= _INT_MAX:
            raise error(f"{where} holds an integer outside the 64-bit range: {value}")
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise error(
                f"{where} holds {value!r}; JSON has no NaN or Infinity, use a finite number or None"
            )
        return float(value)
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise error(
                    f"{where} has a {type(key).__name__} key {key!r}; JSON object keys must be str"
                )
            check_text(key, f"a key of {where}", error)
            out[key] = _copy_json(item, f"{where}[{key!r}]", depth + 1, error)
        return out
    if isinstance(value, list):
        return [_copy_json(item, f"{where}[{i}]", depth + 1, error) for i, item in enumerate(value)]
    raise error(
        f"{where} holds a {type(value).__name__}, which is not JSON; accepted: {_ACCEPTED_JSON}"
    )


def validate_metadata(metadata: Any) -> dict[str, Any]:
    """Check metadata (a mapping of JSON values, or ``None`` for ``{}``) and return a copy."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise InvalidEventError(
            f"metadata must be a dict (JSON object) or None, not {type(metadata).__name__}"
        )
    return _copy_json(dict(metadata), "metadata", 0)


def copy_json(value: Any, where: str, error: type[RunstoreError]) -> Any:
    """A fresh copy of the JSON value ``value``, or ``error`` naming ``where`` and what is wrong."""
    return _copy_json(value, where, 0, error)


def dumps(value: Any) -> str:
    """Encode already-validated JSON data with orjson, as text."""
    return orjson.dumps(value).decode("utf-8")


def dumps_bytes(value: Any) -> bytes:
    """Encode already-validated JSON data with orjson, as UTF-8 bytes."""
    return orjson.dumps(value)


def loads(data: str | bytes) -> Any:
    """Decode JSON text or bytes with orjson."""
    return orjson.loads(data)


def truncate_utf8(text: str, max_bytes: int) -> tuple[str, int]:
    """Cut ``text`` to at most ``max_bytes`` UTF-8 bytes on a character boundary.

    Returns ``(text, original_byte_length)``; the text is unchanged when it fits.
    """
    raw = text.encode("utf-8")
    if len(raw) <= max_bytes:
        return text, len(raw)
    # errors="ignore" only drops the one partial character left at the cut.
    return raw[:max_bytes].decode("utf-8", errors="ignore"), len(raw)


def copy_json_value(value: Any) -> Any:
    """A deep copy of validated JSON data (lists and dicts only; scalars are immutable)."""
    if isinstance(value, dict):
        return {k: copy_json_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [copy_json_value(v) for v in value]
    return value
