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

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, cast

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

__all__ = [
    "BlobRow",
    "CheckpointRow",
    "EncodedCheckpoint",
    "EncodedWrites",
    "FilterTerm",
    "HISTORY_SEED",
    "HISTORY_WRITE",
    "HistoryRow",
    "WriteRow",
    "assemble_delta_history",
    "checkpoint_config",
    "decode_checkpoint",
    "decode_metadata",
    "decode_writes",
    "dump_json",
    "encode_blob",
    "encode_checkpoint",
    "encode_metadata",
    "encode_writes",
    "metadata_filter_terms",
    "next_version",
    "version_text",
]


class CheckpointRow(NamedTuple):
    """One checkpoint record, in the column order of the SQL savers' ``INSERT``."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    run_id: str | None
    type: str
    checkpoint: bytes
    metadata: str
    value_versions: str


class BlobRow(NamedTuple):
    """One serialized channel value, keyed by ``(thread_id, checkpoint_ns, channel, version)``."""

    thread_id: str
    checkpoint_ns: str
    channel: str
    version: str
    type: str
    blob: bytes


class WriteRow(NamedTuple):
    """One pending write, keyed by ``(thread_id, checkpoint_ns, checkpoint_id, task_id, idx)``."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    task_id: str
    idx: int
    task_path: str
    channel: str
    type: str
    value: bytes


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


@dataclass(frozen=True, slots=True)
class FilterTerm:
    """One ``alist(filter=...)`` condition on a top-level metadata key, dialect-neutral.

    ``kind`` says how to compare the stored JSON value with ``value``:
    ``null`` (key missing or JSON null), ``bool`` (JSON true/false), ``number``
    (JSON integer or real, numerically equal), ``text`` (JSON string equal),
    ``json`` (object/array whose canonical JSON text, see `dump_json`, equals
    ``value``). ``json_type`` is the JSON type name the value must have
    (``object``/``array`` for ``json``), or None.
    """

    key: str
    kind: Literal["null", "bool", "number", "text", "json"]
    value: Any
    json_type: str | None = None


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


def checkpoint_config(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> RunnableConfig:
    """The config that names one stored checkpoint."""
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": checkpoint_ns,
            "checkpoint_id": checkpoint_id,
        }
    }


def _json_default(obj: Any) -> Any:
    if isinstance(obj, set | frozenset):
        return sorted(obj, key=repr)
    # Metadata must stay queryable JSON; anything else is stored as its text.
    return str(obj)


def dump_json(value: Any) -> str:
    """Canonical JSON text (sorted keys, compact): stored metadata and ``json`` filter values."""
    return orjson.dumps(
        value,
        default=_json_default,
        option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS,
    ).decode()


def _merged_metadata(config: RunnableConfig, metadata: CheckpointMetadata) -> dict[str, Any]:
    merged = dict(get_checkpoint_metadata(config, metadata))
    # LangGraph's legacy "writes" metadata is not part of the contract; the stock
    # savers drop it too.
    merged.pop("writes", None)
    return merged


def encode_metadata(config: RunnableConfig, metadata: CheckpointMetadata) -> str:
    """Metadata as stored: LangGraph's config-merged metadata, as canonical JSON text."""
    return dump_json(_merged_metadata(config, metadata))


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
    configurable = config["configurable"]
    thread_id = str(configurable["thread_id"])
    checkpoint_ns = str(configurable.get("checkpoint_ns") or "")
    parent_id = configurable.get("checkpoint_id")
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
                version = f"@{checkpoint['id']}"
                blobs.append(encode_blob(serde, thread_id, checkpoint_ns, channel, version, value))
            else:
                carried[channel] = version_text(version)
                carried_values[channel] = value
        value_versions[channel] = version_text(version)

    merged = _merged_metadata(config, metadata)
    meta_text = dump_json(merged)
    run_id = merged.get("run_id")
    row = CheckpointRow(
        thread_id,
        checkpoint_ns,
        str(checkpoint["id"]),
        str(parent_id) if parent_id else None,
        str(run_id) if run_id is not None else None,
        type_,
        data,
        meta_text,
        dump_json(value_versions),
    )
    return EncodedCheckpoint(
        row=row,
        blobs=blobs,
        carried=carried,
        carried_values=carried_values,
        config=checkpoint_config(thread_id, checkpoint_ns, str(checkpoint["id"])),
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
    record = dict(serde.loads_typed((type, checkpoint)))
    record["channel_values"] = {
        channel: serde.loads_typed((btype, blob)) for channel, btype, blob in blobs
    }
    parent_config = (
        checkpoint_config(thread_id, checkpoint_ns, parent_checkpoint_id)
        if parent_checkpoint_id
        else None
    )
    return CheckpointTuple(
        config=checkpoint_config(thread_id, checkpoint_ns, checkpoint_id),
        checkpoint=cast(Checkpoint, record),
        metadata=decode_metadata(metadata),
        parent_config=parent_config,
        pending_writes=decode_writes(serde, writes or ()),
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
    configurable = config["configurable"]
    thread_id = str(configurable["thread_id"])
    checkpoint_ns = str(configurable.get("checkpoint_ns") or "")
    checkpoint_id = str(configurable["checkpoint_id"])
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


def metadata_filter_terms(filter: Mapping[str, Any] | None) -> list[FilterTerm]:
    """Translate ``alist(filter=...)`` into dialect-neutral terms, one per key.

    A filter matches a checkpoint whose metadata has every key equal to the given
    value (top-level keys, like LangGraph's ``InMemorySaver``); ``None`` matches a
    missing key or JSON null; booleans match JSON booleans only; dicts and lists
    compare as whole JSON documents.
    """
    terms: list[FilterTerm] = []
    for key, value in (filter or {}).items():
        if not isinstance(key, str):
            raise TypeError(f"metadata filter keys must be strings, not {type(key).__name__}")
        if value is None:
            terms.append(FilterTerm(key, "null", None))
        elif isinstance(value, bool):
            terms.append(FilterTerm(key, "bool", value, "true" if value else "false"))
        elif isinstance(value, int | float):
            terms.append(FilterTerm(key, "number", value))
        elif isinstance(value, str):
            terms.append(FilterTerm(key, "text", value, "text"))
        elif isinstance(value, Mapping):
            terms.append(FilterTerm(key, "json", dump_json(dict(value)), "object"))
        elif isinstance(value, list | tuple):
            terms.append(FilterTerm(key, "json", dump_json(list(value)), "array"))
        else:
            terms.append(FilterTerm(key, "text", str(value), "text"))
    return terms
