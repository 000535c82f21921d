"""Rows <-> LangGraph checkpoint objects, shared by the SQL checkpoint savers.

The codec knows nothing about SQL dialects or drivers. A saver turns a `put` into
rows with `encode_checkpoint`, a `put_writes` into rows with `encode_writes`, and
reads them back with `decode_checkpoint`, `decode_writes` and
`assemble_delta_history`. Every value a user wrote goes through the saver's serde
(``dumps_typed``/``loads_typed``), so encrypting serdes keep working.

Storage model (one table each, keyed as shown):

* checkpoint record ``(thread_id, checkpoint_ns, checkpoint_id)``: the checkpoint
  without ``channel_values`` (serde-encoded), the parent id, metadata as JSON text
  with sorted keys (for SQL filters), the ``run_id`` lifted out of the metadata, and
  ``value_versions``: JSON ``{channel: version}`` of exactly the channels whose
  value the checkpoint holds. Loading reads only those channels, so a value is
  never carried forward from an older version.
* blob ``(thread_id, checkpoint_ns, channel, version)``: one channel value.
* write ``(thread_id, checkpoint_ns, checkpoint_id, task_id, idx)``: one pending
  write; normal writes are first-write-wins, the special negative indexes of
  ``WRITES_IDX_MAP`` last-write-wins.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import orjson
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    PendingWrite,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from runstore.checkpoint.rules import check_put, check_put_writes, checkpoint_config
from runstore.errors import InvalidSaverInputError

__all__ = [
    "ACCEPTED_JSON",
    "BLOBS",
    "CHECKPOINTS",
    "WRITES",
    "BlobRow",
    "CheckpointRow",
    "EncodedCheckpoint",
    "EncodedWrites",
    "HISTORY_SEED",
    "HISTORY_WRITE",
    "HistoryRow",
    "WriteRow",
    "assemble_delta_history",
    "decode_checkpoint",
    "decode_metadata",
    "decode_writes",
    "dump_json",
    "encode_blob",
    "encode_checkpoint",
    "encode_writes",
    "merged_metadata",
    "metadata_text",
    "next_version",
    "stored_json",
    "UnstorableJSONError",
    "version_text",
]


#: The tables of every runstore SQL saver (prefixed: they coexist with the stock
#: LangGraph savers' tables and with the event store's in one database).
CHECKPOINTS = "runstore_checkpoints"
BLOBS = "runstore_checkpoint_blobs"
WRITES = "runstore_checkpoint_writes"


class CheckpointRow(NamedTuple):
    """One row of `CHECKPOINTS`; field names and order are the table's columns."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    run_id: str | None
    type: str
    checkpoint: bytes
    metadata: str
    value_versions: str
    channel_versions: str


class BlobRow(NamedTuple):
    """One row of `BLOBS`: a serialized channel value keyed by
    ``(thread_id, checkpoint_ns, channel, version)``."""

    thread_id: str
    checkpoint_ns: str
    channel: str
    version: str
    type: str
    blob: bytes


class WriteRow(NamedTuple):
    """One row of `WRITES`: a pending write keyed by
    ``(thread_id, checkpoint_ns, checkpoint_id, task_id, idx)``."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    task_id: str
    idx: int
    task_path: str
    channel: str
    type: str
    blob: bytes


@dataclass(frozen=True, slots=True)
class EncodedCheckpoint:
    """What one ``put`` stores.

    ``blobs`` are the values of channels listed in ``new_versions``. ``carried`` maps
    the channels that hold a value but were not in ``new_versions`` to their version:
    their blob normally exists already (same channel, same version); a saver checks
    and, only when it is missing, stores `encode_blob` of ``carried_values[channel]``.
    """

    row: CheckpointRow
    blobs: list[BlobRow]
    carried: dict[str, str]
    carried_values: dict[str, Any]
    config: RunnableConfig


@dataclass(frozen=True, slots=True)
class EncodedWrites:
    """Rows of one ``put_writes``: ``first_wins`` must not overwrite, ``last_wins`` must."""

    first_wins: list[WriteRow]
    last_wins: list[WriteRow]


#: `HistoryRow.kind` of a pending write of an ancestor.
HISTORY_WRITE = 0
#: `HistoryRow.kind` of the seed (stored value) of the nearest ancestor holding one.
HISTORY_SEED = 1


class HistoryRow(NamedTuple):
    """One row of a delta-history query.

    ``depth`` counts parent links from the target (parent = 1). For a write, the
    task fields are set; for a seed they may be anything (``None``).
    """

    depth: int
    channel: str
    kind: int
    task_id: str | None
    task_path: str | None
    idx: int | None
    type: str
    value: bytes


def version_text(version: str | int | float) -> str:
    """The stored (text) form of a channel version."""
    return version if isinstance(version, str) else str(version)


def next_version(current: str | int | float | None) -> str:
    """A new channel version after ``current``: zero-padded counter plus a random fraction.

    Same shape as the stock savers' versions, so threads can move between savers.
    """
    import random

    if current is None:
        counter = 0
    elif isinstance(current, int | float):
        counter = int(current)
    else:
        counter = int(current.split(".", 1)[0])
    return f"{counter + 1:032}.{random.random():016}"


#: Integers JSON metadata keeps as numbers; others are stored as their text.
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
_JSON_OPTIONS = orjson.OPT_SORT_KEYS
#: orjson's nesting limit, which the slow path's walk keeps too (so a value that refers
#: to itself is refused there as well, not a `RecursionError`).
_MAX_DEPTH = 254
#: What stored metadata (and a filter value) may hold, for error messages.
ACCEPTED_JSON = (
    "accepted: dicts, lists, tuples and sets of str, int, float, bool and None, plus "
    "values stored as their JSON form (datetime/date/time as ISO text, UUID as text, an "
    "Enum as its value, a dataclass as an object, an integer beyond 64 bits and any other "
    "object as its str); dict keys: str, int, float, bool, None, datetime, date, time, "
    "UUID or Enum, distinct once written as JSON text"
)


class UnstorableJSONError(ValueError):
    """A value has no JSON form every saver stores alike; the message says what is wrong."""


def _json_default(obj: Any) -> Any:
    if isinstance(obj, set | frozenset):
        return [_bounded(v, 1) for v in sorted(obj, key=repr)]
    # Metadata must stay queryable JSON; anything else is stored as its text.
    return str(obj)


def _key_text(key: Any) -> str:
    """The JSON text orjson writes for a non-str dict key."""
    try:
        text = orjson.dumps({key: 0}, option=orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError:
        if isinstance(key, int) and not isinstance(key, bool):
            return str(key)  # beyond 64 bits: its digits, as a value of that size
        raise UnstorableJSONError(
            f"a dict key of type {type(key).__name__} ({key!r:.60}) has no JSON text"
        ) from None
    return cast(str, next(iter(orjson.loads(text))))


def _bounded(value: Any, depth: int) -> Any:
    """``value`` ready for orjson: ints outside the signed 64-bit range and non-str dict
    keys replaced by their text; `UnstorableJSONError` for keys that collide as text."""
    if depth > _MAX_DEPTH:
        raise UnstorableJSONError(f"it is nested more than {_MAX_DEPTH} levels deep or refers to itself")
    if isinstance(value, int) and not isinstance(value, bool):
        return value if INT64_MIN <= value <= INT64_MAX else str(value)
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        keys: dict[str, Any] = {}
        for k, v in value.items():
            text = k if isinstance(k, str) else _key_text(k)
            if text in out:
                raise UnstorableJSONError(
                    f"two keys of one dict, {keys[text]!r:.60} and {k!r:.60}, are both "
                    f"{text!r} as JSON text"
                )
            keys[text] = k
            out[text] = _bounded(v, depth + 1)
        return out
    if isinstance(value, list | tuple):
        return [_bounded(v, depth + 1) for v in value]
    return value


def dump_json(value: Any) -> str:
    """Canonical JSON text (sorted keys, compact) of stored metadata and filter documents.

    Values JSON cannot hold become their ``str``; integers outside the signed 64-bit
    range become their text (every SQL dialect can compare those numbers exactly);
    non-str dict keys become their JSON text. Raises `UnstorableJSONError` for what has
    no such form: a lone surrogate, a key with no text or two keys with the same text,
    nesting beyond 254 levels (or a value holding itself).
    """
    try:
        # Strict: str keys and 53-bit ints take one pass; the rest takes the walk below.
        return orjson.dumps(
            value, default=_json_default, option=_JSON_OPTIONS | orjson.OPT_STRICT_INTEGER
        ).decode()
    except orjson.JSONEncodeError as exc:
        reason = str(exc)
    if "surrogates" not in reason and "Recursion" not in reason:
        try:
            return orjson.dumps(
                _bounded(value, 0), default=_json_default, option=_JSON_OPTIONS | orjson.OPT_NON_STR_KEYS
            ).decode()
        except orjson.JSONEncodeError as exc:
            reason = str(exc)
    raise UnstorableJSONError(_unstorable_reason(reason))


def _unstorable_reason(orjson_error: str) -> str:
    """What an orjson error says is wrong, in the words of the saver docs."""
    if "surrogates" in orjson_error:
        return "a string holds a lone surrogate (not valid Unicode)"
    if "Recursion" in orjson_error:
        return f"it is nested more than {_MAX_DEPTH} levels deep or refers to itself"
    if "64-bit" in orjson_error:
        # Only inside what orjson writes natively: the walk reaches dicts, lists, tuples, sets.
        return (
            "an integer beyond 64 bits inside a dataclass (dicts, lists, tuples and sets "
            "store such integers as text)"
        )
    return f"a value could not be written as JSON nor as its str ({orjson_error})"


def stored_json(value: Any) -> Any:
    """``value`` as it comes back from the stored JSON (see `dump_json`)."""
    return orjson.loads(dump_json(value))


#: A JSON-escaped NUL (``\u0000`` not itself behind an escaped backslash).
_ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def metadata_text(merged: Mapping[str, Any]) -> str:
    """The stored JSON text of merged metadata (`dump_json`), the same on every saver.

    Raises `InvalidSaverInputError` saying what is wrong and what is accepted for
    metadata no saver can store alike: what `dump_json` refuses, and a NUL character
    (PostgreSQL JSON refuses it; LangGraph already strips NUL from top-level string values).
    """
    try:
        text = dump_json(merged)
    except UnstorableJSONError as exc:
        raise InvalidSaverInputError(f"metadata cannot be stored as JSON: {exc}; {ACCEPTED_JSON}") from exc
    if "\\u0000" in text and _ESCAPED_NUL.search(text):
        raise InvalidSaverInputError(
            "metadata contains a NUL character (\\x00) in a key or string, which no saver "
            "can store alike (PostgreSQL JSON rejects it); remove or escape it"
        )
    return text


def merged_metadata(config: RunnableConfig, metadata: CheckpointMetadata) -> dict[str, Any]:
    """The metadata a put stores: LangGraph's config-merged metadata without ``writes``."""
    merged = dict(get_checkpoint_metadata(config, metadata))
    # LangGraph's legacy "writes" metadata is not part of the contract; the stock
    # savers drop it too.
    merged.pop("writes", None)
    return merged


def decode_metadata(text: str | bytes | None) -> CheckpointMetadata:
    """Metadata back from its stored JSON text."""
    if not text:
        return cast(CheckpointMetadata, {})
    return cast(CheckpointMetadata, orjson.loads(text))


def encode_blob(
    serde: SerializerProtocol,
    thread_id: str,
    checkpoint_ns: str,
    channel: str,
    version: str | int | float,
    value: Any,
) -> BlobRow:
    """Serialize one channel value with the saver's serde."""
    type_, data = serde.dumps_typed(value)
    return BlobRow(thread_id, checkpoint_ns, channel, version_text(version), type_, data)


def encode_checkpoint(
    serde: SerializerProtocol,
    config: RunnableConfig,
    checkpoint: Checkpoint,
    metadata: CheckpointMetadata,
    new_versions: ChannelVersions,
) -> EncodedCheckpoint:
    """Turn one ``put`` into a checkpoint record and the blobs of its new channel versions."""
    thread_id, checkpoint_ns, parent_id, checkpoint_id = check_put(config, checkpoint, new_versions)
    values: Mapping[str, Any] = checkpoint.get("channel_values") or {}
    versions: Mapping[str, Any] = checkpoint.get("channel_versions") or {}

    record = {k: v for k, v in checkpoint.items() if k != "channel_values"}
    type_, data = serde.dumps_typed(record)

    blobs: list[BlobRow] = []
    for channel, new_version in new_versions.items():
        if channel in values:
            blobs.append(
                encode_blob(serde, thread_id, checkpoint_ns, channel, new_version, values[channel])
            )
    value_versions: dict[str, str] = {}
    carried: dict[str, str] = {}
    carried_values: dict[str, Any] = {}
    for channel, value in values.items():
        version: str | int | float | None = new_versions.get(channel)
        if version is None:
            version = versions.get(channel)
            if version is None:
                # A value without a version cannot be keyed; LangGraph never does this,
                # but hand-written checkpoints may. Key it by the checkpoint id.
                version = f"@{checkpoint_id}"
                blobs.append(encode_blob(serde, thread_id, checkpoint_ns, channel, version, value))
            else:
                carried[channel] = version_text(version)
                carried_values[channel] = value
        value_versions[channel] = version_text(version)

    merged = merged_metadata(config, metadata)
    meta_text = metadata_text(merged)
    run_id = merged.get("run_id")
    row = CheckpointRow(
        thread_id,
        checkpoint_ns,
        checkpoint_id,
        parent_id,
        str(run_id) if run_id is not None else None,
        type_,
        data,
        meta_text,
        dump_json(value_versions),
        dump_json({channel: version_text(v) for channel, v in versions.items()}),
    )
    return EncodedCheckpoint(
        row=row,
        blobs=blobs,
        carried=carried,
        carried_values=carried_values,
        config=checkpoint_config(thread_id, checkpoint_ns, checkpoint_id),
    )


def decode_checkpoint(
    serde: SerializerProtocol,
    *,
    thread_id: str,
    checkpoint_ns: str,
    checkpoint_id: str,
    parent_checkpoint_id: str | None,
    type: str,
    checkpoint: bytes,
    metadata: str | bytes | None,
    blobs: Iterable[tuple[str, str, bytes]],
    writes: Iterable[Sequence[Any]] | None,
) -> CheckpointTuple:
    """Rebuild a `CheckpointTuple` from its record, blob rows and write rows.

    ``blobs`` are ``(channel, type, blob)`` rows for the record's ``value_versions``
    (a saver joins on them, so only held channels come back). ``writes`` are rows
    as accepted by `decode_writes`.
    """
    loads = serde.loads_typed
    record: Checkpoint = dict(loads((type, checkpoint)))  # type: ignore[assignment]
    record["channel_values"] = {channel: loads((btype, blob)) for channel, btype, blob in blobs}
    parent_config = (
        checkpoint_config(thread_id, checkpoint_ns, parent_checkpoint_id)
        if parent_checkpoint_id
        else None
    )
    return CheckpointTuple(
        checkpoint_config(thread_id, checkpoint_ns, checkpoint_id),
        record,
        decode_metadata(metadata),
        parent_config,
        decode_writes(serde, writes) if writes else [],
    )


def encode_writes(
    serde: SerializerProtocol,
    config: RunnableConfig,
    writes: Sequence[tuple[str, Any]],
    task_id: str,
    task_path: str = "",
) -> EncodedWrites:
    """Turn one ``put_writes`` into rows, split by conflict policy.

    Special channels (``WRITES_IDX_MAP``: error, scheduled, interrupt, resume) get
    their fixed negative index and replace an earlier row; every other write keeps
    its position as index and never replaces an earlier row for the same task.
    """
    thread_id, checkpoint_ns, checkpoint_id, task_id, task_path = check_put_writes(
        config, writes, task_id, task_path
    )
    first: list[WriteRow] = []
    last: list[WriteRow] = []
    for position, (channel, value) in enumerate(writes):
        special = WRITES_IDX_MAP.get(channel)
        type_, data = serde.dumps_typed(value)
        row = WriteRow(
            thread_id,
            checkpoint_ns,
            checkpoint_id,
            task_id,
            position if special is None else special,
            task_path,
            channel,
            type_,
            data,
        )
        (first if special is None else last).append(row)
    return EncodedWrites(first_wins=first, last_wins=last)


def decode_writes(serde: SerializerProtocol, rows: Iterable[Sequence[Any]]) -> list[PendingWrite]:
    """Pending writes from ``(task_id, channel, type, value, task_path, idx)`` rows.

    Returned in `writes_sort_key` order (task_path, task_id, idx), whatever the row order.
    """
    ordered = sorted(rows, key=lambda r: writes_sort_key(r[4] or "", r[0], r[5]))
    return [(r[0], r[1], serde.loads_typed((r[2], r[3]))) for r in ordered]


def assemble_delta_history(
    serde: SerializerProtocol,
    channels: Sequence[str],
    rows: Iterable[Sequence[Any]],
) -> dict[str, DeltaChannelHistory]:
    """Build ``get_delta_channel_history``'s answer from the rows of one ancestor query.

    ``rows`` are `HistoryRow`-shaped: for each requested channel, the writes of every
    ancestor from the parent (depth 1) up to and including the nearest ancestor that
    holds a value, plus one seed row for that ancestor. The query must not return the
    target's own writes (depth 0) nor anything beyond the seed; this function trusts
    that, orders writes oldest first (deepest first, `writes_sort_key` within one
    checkpoint) and answers every requested channel.
    """
    wanted = set(channels)
    seeds: dict[str, Any] = {}
    grouped: dict[str, list[Sequence[Any]]] = {}
    for row in rows:
        channel = row[1]
        if channel not in wanted:
            continue
        if row[2] == HISTORY_SEED:
            seeds[channel] = serde.loads_typed((row[6], row[7]))
        else:
            grouped.setdefault(channel, []).append(row)
    result: dict[str, DeltaChannelHistory] = {}
    for channel in channels:
        found = grouped.get(channel, ())
        ordered = sorted(
            found, key=lambda r: (-r[0], *writes_sort_key(r[4] or "", r[3] or "", r[5] or 0))
        )
        entry: DeltaChannelHistory = {
            "writes": [(r[3], channel, serde.loads_typed((r[6], r[7]))) for r in ordered]
        }
        if channel in seeds:
            entry["seed"] = seeds[channel]
        result[channel] = entry
    return result

