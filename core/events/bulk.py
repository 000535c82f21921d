"""``bulk_import`` for event stores: every thread's feed read whole, written back with its seqs.

The protocol's `RunEventStore.put` assigns the next seq, so a copy through it would
renumber a feed and invalidate the cursors clients hold. A store declaring the
``bulk_import`` capability implements `BulkEventStore`: it lists its thread ids, reads
a thread's events across owners in seq order, and inserts records under their
original ``seq``, ``created_at`` and owner, skipping seqs the thread already holds
(insert-if-absent), in one transaction per call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from runstore.events.records import EventRecord, PreparedEvent, prepare_event, validate_id

#: No trace content is cut again on import: what the source kept is copied whole.
_NO_CUT = 2**62


@runtime_checkable
class BulkEventStore(Protocol):
    """The methods a store declaring ``bulk_import`` writes (`runstore migrate` calls them)."""

    async def aexport_thread_ids(self, *, after: str | None = None, limit: int = 500) -> list[str]:
        """Up to ``limit`` thread ids holding events, ascending, after ``after``."""
        ...

    async def aexport_events(
        self, thread_id: str, *, after_seq: int | None = None, limit: int = 500
    ) -> list[EventRecord]:
        """The thread's first ``limit`` events above ``after_seq`` in seq order, every owner
        and category, each with ``user_id``."""
        ...

    async def aimport_events(self, records: Sequence[Mapping[str, Any]]) -> int:
        """Insert ``records`` under their own seqs unless the thread already holds that seq;
        one transaction; return how many were inserted."""
        ...


def prepare_import(record: Mapping[str, Any]) -> tuple[PreparedEvent, int, str | None]:
    """Validate one record to import: the prepared event, its seq and its owner.

    Raises `InvalidEventError` naming the field, as `RunEventStore.put` would.
    """
    from runstore.errors import InvalidEventError

    seq = record.get("seq")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq <= 0:
        raise InvalidEventError(f"an imported event needs a positive integer seq, got {seq!r}")
    owner = record.get("user_id")
    if owner is not None and not isinstance(owner, str):
        raise InvalidEventError(f"an imported event's user_id must be a str or None, got {owner!r}")
    prepared = prepare_event(
        thread_id=record.get("thread_id"),
        run_id=record.get("run_id"),
        event_type=record.get("event_type"),
        category=record.get("category"),
        content=record.get("content", ""),
        metadata=record.get("metadata"),
        created_at=record.get("created_at"),
        max_trace_content=_NO_CUT,
        check_id=validate_id,
    )
    return prepared, seq, owner
