"""The thread index every runstore saver keeps: one record per thread, and how it is read.

A saver updates a thread's record in the same transaction as each write, so the
record is never behind its checkpoints (docs/threads.md). This module holds what
the savers share: the record (`ThreadInfo`), its status rule, the arguments of
``list_threads`` checked in one place (`thread_query`), and the keyset cursor.

The stored record (`THREADS`, one row per thread id) also carries columns the
retention sweeper and fenced writes use: ``touched_at`` (last write, or read when
reads refresh it), ``oldest_at`` (the oldest checkpoint's ``created_at``),
per-thread retention overrides, ``swept_at`` / ``sweep_after`` (when the sweeper last
looked and when it next must), ``claimed_until`` (a sweeper's claim on the thread),
``fence`` (the highest fencing token a write carried) and ``deleted_at`` (a tombstone:
the thread was deleted, and writes continuing its history are refused).
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import orjson
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT

from runstore.checkpoint.filters import FilterTerm, filter_terms
from runstore.clock import check_time, from_micros, system_clock, to_micros
from runstore.errors import InvalidCursorError, InvalidSaverInputError

__all__ = [
    "DEFAULT_PAGE",
    "MAX_PAGE",
    "ORDER_BY",
    "STATUSES",
    "Removed",
    "THREADS",
    "ThreadInfo",
    "ThreadPage",
    "ThreadQuery",
    "decode_cursor",
    "clock_micros",
    "encode_cursor",
    "next_cursor",
    "status_of",
    "thread_info",
    "thread_query",
]

#: The table of thread records in every SQL saver's database.
THREADS = "runstore_threads"

Status = Literal["idle", "interrupted", "error"]
#: A thread's status, from the pending writes of its latest root checkpoint: ``error``
#: when one is an error write, else ``interrupted`` when one is an interrupt, else ``idle``.
STATUSES: tuple[Status, ...] = ("idle", "interrupted", "error")
#: The special write channels that decide the status, strongest first.
STATUS_CHANNELS: tuple[tuple[str, Status], ...] = ((ERROR, "error"), (INTERRUPT, "interrupted"))
#: ``list_threads(order_by=...)``: newest first by this time, then by thread id.
ORDER_BY = ("updated_at", "created_at")
DEFAULT_PAGE = 50
MAX_PAGE = 1000


def clock_micros(clock: Any) -> int:
    """``clock()`` (a `runstore.runs.Clock`) in microseconds since the epoch, checked."""
    if clock is system_clock:
        # Every write stamps its thread's record: the wall clock read directly, the
        # same microseconds `datetime.now` floors it to, without a datetime.
        return time.time_ns() // 1000
    return to_micros(check_time(clock()))


@dataclass(frozen=True)
class Removed:
    """What a deletion removed from a saver (or, in a dry run, would remove): threads
    gone whole, checkpoint rows, pending-write rows, value (blob) rows, and their bytes."""

    threads: int = 0
    checkpoints: int = 0
    writes: int = 0
    blobs: int = 0
    bytes: int = 0

    def __add__(self, other: Removed) -> Removed:
        return Removed(
            self.threads + other.threads,
            self.checkpoints + other.checkpoints,
            self.writes + other.writes,
            self.blobs + other.blobs,
            self.bytes + other.bytes,
        )

    def __sub__(self, other: Removed) -> Removed:
        return Removed(
            self.threads - other.threads,
            self.checkpoints - other.checkpoints,
            self.writes - other.writes,
            self.blobs - other.blobs,
            self.bytes - other.bytes,
        )

    def as_dict(self) -> dict[str, int]:
        """The counts as a plain mapping."""
        return {
            "threads": self.threads,
            "checkpoints": self.checkpoints,
            "writes": self.writes,
            "blobs": self.blobs,
            "bytes": self.bytes,
        }


def status_of(channels: Iterable[str]) -> Status:
    """The status a checkpoint's pending writes on ``channels`` give its thread."""
    seen = set(channels)
    for channel, status in STATUS_CHANNELS:
        if channel in seen:
            return status
    return "idle"


@dataclass(frozen=True)
class ThreadInfo:
    """One thread as the index knows it.

    ``checkpoints`` and ``writes`` count stored rows (every namespace); ``bytes``
    approximates what they hold (sizes as written; a replaced row is not re-counted).
    ``metadata`` and ``status`` are those of the latest checkpoint of the root
    namespace (``latest_checkpoint_id``). ``retention`` holds the thread's retention
    overrides (``None``: the policy's defaults apply). ``touched_at`` is when a write
    (or ``atouch_thread``, which an app calls when a read should count) last touched the
    thread; ``idle_ttl`` counts from it.
    """

    thread_id: str
    created_at: datetime
    updated_at: datetime
    touched_at: datetime
    latest_checkpoint_id: str | None
    checkpoints: int
    writes: int
    bytes: int
    status: Status
    metadata: dict[str, Any] = field(default_factory=dict)
    retention: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form (times as ISO text)."""
        return {
            "thread_id": self.thread_id,
            "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(),
            "touched_at": self.touched_at.isoformat(),
            "latest_checkpoint_id": self.latest_checkpoint_id,
            "checkpoints": self.checkpoints,
            "writes": self.writes,
            "bytes": self.bytes,
            "status": self.status,
            "metadata": self.metadata,
            "retention": self.retention,
        }


@dataclass(frozen=True)
class ThreadPage:
    """One page of ``list_threads``; pass ``next_cursor`` back for the next (``None``: last)."""

    threads: list[ThreadInfo]
    next_cursor: str | None


def thread_info(
    thread_id: str,
    *,
    created_at: int,
    updated_at: int,
    touched_at: int,
    latest_checkpoint_id: str | None,
    checkpoints: int,
    writes: int,
    bytes: int,
    status: str,
    metadata: str | Mapping[str, Any] | None,
    retention: str | Mapping[str, Any] | None,
) -> ThreadInfo:
    """A `ThreadInfo` from stored columns (times in microseconds since the epoch, JSON as text)."""
    return ThreadInfo(
        thread_id=thread_id,
        created_at=from_micros(created_at),
        updated_at=from_micros(updated_at),
        touched_at=from_micros(touched_at),
        latest_checkpoint_id=latest_checkpoint_id,
        checkpoints=int(checkpoints),
        writes=int(writes),
        bytes=int(bytes),
        status=status if status in STATUSES else "idle",
        metadata=_json(metadata) or {},
        retention=_json(retention),
    )


def _json(value: str | bytes | Mapping[str, Any] | None) -> dict[str, Any] | None:
    if value is None:
        return None
    if isinstance(value, str | bytes):
        return orjson.loads(value)
    return dict(value)


# --------------------------------------------------------------------------- queries


@dataclass(frozen=True)
class ThreadQuery:
    """Checked ``list_threads`` arguments; times in microseconds since the epoch.

    ``after`` is the keyset position of the cursor: ``(time, thread_id)`` of the last
    thread of the previous page, in ``order_by`` order (newest first).
    """

    terms: list[FilterTerm]
    status: Status | None
    updated_after: int | None
    updated_before: int | None
    order_by: str
    limit: int
    after: tuple[int, str] | None


def thread_query(
    *,
    filter: Mapping[str, Any] | None = None,
    status: str | None = None,
    updated_after: datetime | None = None,
    updated_before: datetime | None = None,
    order_by: str = "updated_at",
    limit: int = DEFAULT_PAGE,
    cursor: str | None = None,
) -> ThreadQuery:
    """Check ``list_threads`` arguments; bad input raises `InvalidSaverInputError` naming it.

    ``updated_after`` / ``updated_before`` are exclusive bounds on ``updated_at``; a
    malformed cursor, or one made for another ``order_by``, raises `InvalidCursorError`.
    """
    if filter is not None and not isinstance(filter, Mapping):
        raise InvalidSaverInputError(
            f"filter must be a mapping of metadata keys to values, not {type(filter).__name__}"
        )
    try:
        terms = filter_terms(filter)
    except TypeError as exc:
        raise InvalidSaverInputError(str(exc)) from None
    if status is not None and status not in STATUSES:
        raise InvalidSaverInputError(
            f"status must be one of {', '.join(STATUSES)} (or None for any), not {status!r}"
        )
    if order_by not in ORDER_BY:
        raise InvalidSaverInputError(
            f"order_by must be one of {', '.join(ORDER_BY)}, not {order_by!r}"
        )
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise InvalidSaverInputError(f"limit must be an int from 1 to {MAX_PAGE}, not {limit!r}")
    after = None if cursor is None else decode_cursor(cursor, order_by)
    return ThreadQuery(
        terms=terms,
        status=status,
        updated_after=_micros(updated_after, "updated_after"),
        updated_before=_micros(updated_before, "updated_before"),
        order_by=order_by,
        limit=limit,
        after=after,
    )


def _micros(value: datetime | None, what: str) -> int | None:
    if value is None:
        return None
    try:
        return to_micros(check_time(value, what))
    except ValueError as exc:
        raise InvalidSaverInputError(str(exc)) from None


_CURSOR_VERSION = 1


def encode_cursor(order_by: str, position: tuple[int, str]) -> str:
    """An opaque cursor for the keyset position ``(time in microseconds, thread_id)``."""
    raw = orjson.dumps([_CURSOR_VERSION, order_by, position[0], position[1]])
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: Any, order_by: str) -> tuple[int, str]:
    """The keyset position in ``cursor``; `InvalidCursorError` when it is not one
    `encode_cursor` made for ``order_by``."""
    if not isinstance(cursor, str) or not cursor:
        raise InvalidCursorError(
            f"cursor must be the next_cursor string of a list_threads page, not {cursor!r}"
        )
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        version, made_for, micros, thread_id = orjson.loads(raw)
    except (binascii.Error, ValueError, TypeError, orjson.JSONDecodeError):
        raise InvalidCursorError(
            "malformed cursor; pass the next_cursor of a list_threads page unchanged"
        ) from None
    if (
        version != _CURSOR_VERSION
        or not isinstance(micros, int)
        or isinstance(micros, bool)
        or not isinstance(thread_id, str)
    ):
        raise InvalidCursorError(
            "malformed cursor; pass the next_cursor of a list_threads page unchanged"
        )
    if made_for != order_by:
        raise InvalidCursorError(
            f"this cursor pages threads ordered by {made_for!r}, not {order_by!r}; "
            "keep order_by the same across pages"
        )
    return micros, thread_id


def next_cursor(query: ThreadQuery, page: list[ThreadInfo]) -> str | None:
    """The cursor after ``page`` (``None`` when the page was not full: nothing follows)."""
    if len(page) < query.limit:
        return None
    last = page[-1]
    when = last.updated_at if query.order_by == "updated_at" else last.created_at
    return encode_cursor(query.order_by, (to_micros(when), last.thread_id))


# --------------------------------------------------------------------------- SQL pieces


def status_case(holds: Any) -> str:
    """A SQL ``CASE`` giving the status (`status_of`); ``holds(channel)`` renders a condition
    true when the latest root checkpoint has a pending write on that special channel."""
    whens = " ".join(f"WHEN {holds(channel)} THEN '{status}'" for channel, status in STATUS_CHANNELS)
    return f"CASE {whens} ELSE 'idle' END"


def stronger_status_sql(a: str, b: str) -> str:
    """A SQL ``CASE`` giving the stronger of two status expressions (error > interrupted >
    idle, the order of `STATUSES`)."""
    whens = " ".join(
        f"WHEN '{status}' IN ({a}, {b}) THEN '{status}'" for status in reversed(STATUSES[1:])
    )
    return f"CASE {whens} ELSE 'idle' END"


def backfill_sql(now: int, *, metadata_text: str, checkpoints: str, blobs: str, writes: str) -> str:
    """The statement that fills `THREADS` from the checkpoint tables of a database saved
    before the index existed (both dialects). Creation and update times are unknown
    there: they become ``now``, the migration's time (microseconds since the epoch).
    ``metadata_text`` renders the text of a checkpoint's metadata column ``x.metadata``."""
    head = (
        f"(SELECT max(h.checkpoint_id) FROM {checkpoints} h"
        " WHERE h.thread_id = c.thread_id AND h.checkpoint_ns = '')"
    )
    status = status_case(
        lambda ch: (
            f"EXISTS (SELECT 1 FROM {writes} w WHERE w.thread_id = c.thread_id"
            f" AND w.checkpoint_ns = '' AND w.checkpoint_id = {head} AND w.channel = '{ch}')"
        )
    )
    return f"""
INSERT INTO {THREADS} (thread_id, created_at, updated_at, touched_at, latest_checkpoint_id,
                       metadata, status, checkpoints, writes, bytes, oldest_at)
SELECT c.thread_id, {now}, {now}, {now}, {head},
       coalesce((SELECT x.metadata FROM {checkpoints} x WHERE x.thread_id = c.thread_id
                 AND x.checkpoint_ns = '' AND x.checkpoint_id = {head}), '{{}}'),
       {status}, c.n,
       (SELECT count(*) FROM {writes} w WHERE w.thread_id = c.thread_id),
       c.b + coalesce((SELECT sum(length(b.blob)) FROM {blobs} b WHERE b.thread_id = c.thread_id), 0)
           + coalesce((SELECT sum(length(w.blob)) FROM {writes} w WHERE w.thread_id = c.thread_id), 0),
       {now}
FROM (SELECT x.thread_id, count(*) AS n,
             sum(length(x.checkpoint) + length({metadata_text})) AS b
      FROM {checkpoints} x GROUP BY x.thread_id) c
"""


def refresh_sql(thread: str, *, metadata_text: str, checkpoints: str, blobs: str, writes: str) -> str:
    """The statement that recomputes a thread's record from its rows (counts, bytes, the
    oldest checkpoint's time, the latest root checkpoint with its metadata and status).

    ``thread`` is the dialect's placeholder for the thread id; ``metadata_text`` renders
    the text of ``x.metadata``. Used after bulk changes (a copy, a prune) where a row by
    row count is not at hand; the record of a thread no write changes concurrently.
    """
    head = (
        f"(SELECT max(h.checkpoint_id) FROM {checkpoints} h WHERE h.thread_id = {thread}"
        " AND h.checkpoint_ns = '')"
    )
    status = status_case(
        lambda ch: (
            f"EXISTS (SELECT 1 FROM {writes} w WHERE w.thread_id = {thread}"
            f" AND w.checkpoint_ns = '' AND w.checkpoint_id = {head} AND w.channel = '{ch}')"
        )
    )
    return f"""
UPDATE {THREADS} SET
    checkpoints = (SELECT count(*) FROM {checkpoints} x WHERE x.thread_id = {thread}),
    writes = (SELECT count(*) FROM {writes} x WHERE x.thread_id = {thread}),
    bytes = (SELECT coalesce(sum(length(x.checkpoint) + length({metadata_text})), 0)
             FROM {checkpoints} x WHERE x.thread_id = {thread})
          + (SELECT coalesce(sum(length(x.blob)), 0) FROM {writes} x WHERE x.thread_id = {thread})
          + (SELECT coalesce(sum(length(x.blob)), 0) FROM {blobs} x WHERE x.thread_id = {thread}),
    oldest_at = (SELECT min(x.created_at) FROM {checkpoints} x WHERE x.thread_id = {thread}),
    latest_checkpoint_id = {head},
    metadata = coalesce((SELECT x.metadata FROM {checkpoints} x WHERE x.thread_id = {thread}
                         AND x.checkpoint_ns = '' AND x.checkpoint_id = {head}), '{{}}'),
    status = {status}
WHERE thread_id = {thread}
"""


def footprint_sql(thread: str, *, metadata_text: str, checkpoints: str, blobs: str, writes: str) -> str:
    """The statement answering what a thread's rows hold: ``(checkpoints, their bytes,
    writes, their bytes, blobs, their bytes)`` (a dry run of its deletion)."""
    return f"""
SELECT (SELECT count(*) FROM {checkpoints} x WHERE x.thread_id = {thread}),
       (SELECT coalesce(sum(length(x.checkpoint) + length({metadata_text})), 0)
          FROM {checkpoints} x WHERE x.thread_id = {thread}),
       (SELECT count(*) FROM {writes} x WHERE x.thread_id = {thread}),
       (SELECT coalesce(sum(length(x.blob)), 0) FROM {writes} x WHERE x.thread_id = {thread}),
       (SELECT count(*) FROM {blobs} x WHERE x.thread_id = {thread}),
       (SELECT coalesce(sum(length(x.blob)), 0) FROM {blobs} x WHERE x.thread_id = {thread})
"""
