"""Per-thread digests both sides of a migration are compared by (``--verify``).

A saver thread's digest covers its history (every checkpoint of every namespace: ids,
parent links, the checkpoint, metadata, stored channel values, pending writes in the
order the saver returns them) and its materialized state (for a delta thread, the
delta-channel history of each namespace's head as the saver's walk answers it). An
event thread's digest covers every event with its seq, created_at and owner.
Payloads are compared as loaded values re-encoded canonically, so two serdes (or an
encrypting one with fresh nonces) that hold the same values agree.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver

from runstore.checkpoint.rules import delta_channels
from runstore.migrate.fingerprints import canonical, fingerprint
from runstore.migrate.records import CheckpointRecord


def saver_thread_digest(records: Iterable[CheckpointRecord], serde: Any, history: Mapping[str, Any]) -> str:
    """The digest of one saver thread from its records (any order) and its heads' delta history."""
    h = hashlib.sha256()
    for fp in sorted(fingerprint(record, serde) for record in records):
        h.update(fp.encode())
    for ns in sorted(history):
        h.update(ns.encode() + b"\0" + canonical(history[ns]))
    return h.hexdigest()


async def delta_history(saver: BaseCheckpointSaver[Any], records: list[CheckpointRecord]) -> dict[str, Any]:
    """Per namespace whose head is a delta checkpoint: the saver's delta-channel history there."""
    heads: dict[str, CheckpointRecord] = {}
    for record in records:
        current = heads.get(record.checkpoint_ns)
        if current is None or record.checkpoint_id > current.checkpoint_id:
            heads[record.checkpoint_ns] = record
    out: dict[str, Any] = {}
    for ns, head in heads.items():
        metadata = saver.serde.loads_typed((head.metadata.type, head.metadata.data))
        channels = delta_channels(metadata)
        if not channels:
            continue
        config = {"configurable": {"thread_id": head.thread_id, "checkpoint_ns": ns, "checkpoint_id": head.checkpoint_id}}
        found = await saver.aget_delta_channel_history(config=config, channels=list(channels))  # type: ignore[arg-type]
        out[ns] = {channel: dict(entry) for channel, entry in found.items()}
    return out


async def saver_digest(saver: BaseCheckpointSaver[Any], thread_id: str, *, with_history: bool = True) -> str:
    """The digest of ``thread_id`` as ``saver`` holds it (``with_history``: and its heads'
    delta history as the saver's walk answers)."""
    from runstore.migrate.savers import read_thread

    records = await read_thread(saver, thread_id)
    history = await delta_history(saver, records) if with_history else {}
    return saver_thread_digest(records, saver.serde, history)


_EVENT_FIELDS = ("seq", "run_id", "event_type", "category", "content", "metadata", "created_at", "user_id")


class EventDigest:
    """A thread's event digest fed page by page (seq order)."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()

    def update(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Add events in seq order."""
        for record in records:
            self._hash.update(canonical({key: record.get(key) for key in _EVENT_FIELDS}))

    def hexdigest(self) -> str:
        """The digest so far."""
        return self._hash.hexdigest()


def events_digest(records: Iterable[Mapping[str, Any]]) -> str:
    """The digest of one thread's events (seq order as given)."""
    digest = EventDigest()
    digest.update(records)
    return digest.hexdigest()
