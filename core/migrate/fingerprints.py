"""Canonical bytes of loaded payloads and the fingerprint of one checkpoint record:
what two sides are compared by, whatever serde encoded them."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from runstore.migrate.records import CheckpointRecord

_CANON = JsonPlusSerializer()


def _normal(value: Any) -> Any:
    if isinstance(value, Mapping):
        return [[str(k), _normal(v)] for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))]
    if isinstance(value, list | tuple):
        return [_normal(v) for v in value]
    return value


def canonical(value: Any) -> bytes:
    """Deterministic bytes of a loaded payload (mappings by sorted key)."""
    type_, data = _CANON.dumps_typed(_normal(value))
    return type_.encode() + b"\0" + bytes(data)


def fingerprint(record: CheckpointRecord, serde: Any) -> str:
    """A digest of what the checkpoint stored, independent of the serde's byte encoding
    (payloads are loaded with ``serde`` and re-encoded canonically)."""
    h = hashlib.sha256()
    h.update(repr((record.thread_id, record.checkpoint_ns, record.checkpoint_id, record.parent_id)).encode())
    h.update(canonical(serde.loads_typed((record.checkpoint.type, record.checkpoint.data))))
    h.update(canonical(serde.loads_typed((record.metadata.type, record.metadata.data))))
    # Only the values this checkpoint stored: a value carried from the parent under the same
    # version is the parent's (savers differ in whether they hand it out again).
    for channel in sorted(set(record.values) & set(record.new_versions)):
        blob = record.values[channel]
        h.update(channel.encode() + b"\0" + canonical(serde.loads_typed((blob.type, blob.data))))
    for write in record.writes:
        h.update(write.task_id.encode() + b"\0" + write.channel.encode() + b"\0")
        h.update(canonical(serde.loads_typed((write.value.type, write.value.data))))
    return h.hexdigest()
