"""The streaming record model: one checkpoint or one event per record, JSON-ready.

Serde payloads stay as the ``(type tag, bytes)`` pair the source saver's serde
produced (`Blob`), so an encrypted checkpoint stays encrypted in an archive. A
checkpoint is copied as stored: in delta mode its ``messages`` channel holds only the
snapshots the saver stored, never a materialized list.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

from runstore.errors import ArchiveFormatError


@dataclass(frozen=True)
class Blob:
    """One serde payload: the type tag and the bytes ``serde.dumps_typed`` returned."""

    type: str
    data: bytes

    def to_json(self) -> list[str]:
        """``[type, base64(data)]``."""
        return [self.type, base64.b64encode(self.data).decode("ascii")]

    @classmethod
    def from_json(cls, value: Any) -> Blob:
        """The blob of a `to_json` pair (`ArchiveFormatError` on anything else)."""
        if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value)):
            raise ArchiveFormatError(f"a serde payload must be [type, base64], got {str(value)[:80]!r}")
        try:
            return cls(value[0], base64.b64decode(value[1], validate=True))
        except ValueError as exc:
            raise ArchiveFormatError(f"a serde payload is not valid base64: {exc}") from exc


@dataclass(frozen=True)
class PendingWrite:
    """One pending write of a checkpoint (special slots such as ``__error__`` included)."""

    task_id: str
    channel: str
    value: Blob


@dataclass(frozen=True)
class CheckpointRecord:
    """One stored checkpoint with everything needed to put it back under the same ids.

    ``checkpoint`` is the checkpoint dict without ``channel_values``; ``values`` holds
    the channel values the saver returned for it (in delta mode only stored snapshots);
    ``new_versions`` the channels whose blob this checkpoint stored.
    """

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_id: str | None
    checkpoint: Blob
    metadata: Blob
    values: dict[str, Blob]
    new_versions: dict[str, Any]
    writes: tuple[PendingWrite, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        """The record as JSON (archive line ``{"kind": "checkpoint", ...}``)."""
        return {
            "kind": "checkpoint",
            "thread_id": self.thread_id,
            "checkpoint_ns": self.checkpoint_ns,
            "checkpoint_id": self.checkpoint_id,
            "parent_id": self.parent_id,
            "checkpoint": self.checkpoint.to_json(),
            "metadata": self.metadata.to_json(),
            "values": {k: v.to_json() for k, v in self.values.items()},
            "new_versions": self.new_versions,
            "writes": [[w.task_id, w.channel, w.value.to_json()] for w in self.writes],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CheckpointRecord:
        """The record of a `to_json` mapping (`ArchiveFormatError` naming a missing field)."""
        try:
            return cls(
                thread_id=str(data["thread_id"]),
                checkpoint_ns=str(data["checkpoint_ns"]),
                checkpoint_id=str(data["checkpoint_id"]),
                parent_id=data["parent_id"],
                checkpoint=Blob.from_json(data["checkpoint"]),
                metadata=Blob.from_json(data["metadata"]),
                values={str(k): Blob.from_json(v) for k, v in data["values"].items()},
                new_versions=dict(data["new_versions"]),
                writes=tuple(PendingWrite(str(t), str(c), Blob.from_json(v)) for t, c, v in data["writes"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, ArchiveFormatError):
                raise
            raise ArchiveFormatError(f"a checkpoint record lacks or mangles a field: {exc!r}") from exc


#: The keys of an event record, as `runstore.events.records.EventRecord` has them.
EVENT_KEYS = ("thread_id", "run_id", "event_type", "category", "content", "metadata", "seq", "created_at")


def event_to_json(record: dict[str, Any]) -> dict[str, Any]:
    """An event record as an archive line (original ``seq``, ``created_at`` and owner kept)."""
    out = {key: record[key] for key in EVENT_KEYS}
    out["user_id"] = record.get("user_id")
    out["kind"] = "event"
    return out


def event_from_json(data: dict[str, Any]) -> dict[str, Any]:
    """The event record of an archive line (`ArchiveFormatError` naming a missing key)."""
    missing = [key for key in EVENT_KEYS if key not in data]
    if missing or not isinstance(data.get("seq"), int):
        raise ArchiveFormatError(f"an event record lacks {missing or ['an integer seq']}")
    record = {key: data[key] for key in EVENT_KEYS}
    record["user_id"] = data.get("user_id")
    return record
