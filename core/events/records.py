"""What a run event record is, and the input validation every event store shares.

`EventRecord` and the names and limits it is checked against live here;
`runstore.events.protocol` (the store protocol) builds on this module, never the reverse.
Every backend (memory, JSONL, the SQL stores, third-party ones) funnels its writes
through `prepare_event` / `prepare_batch` and its read arguments through the
``check_*`` helpers (through `RunEventStore`'s call preamble), so all of them accept
and reject exactly the same inputs and return identical records. Validation happens
before any I/O: a rejected call writes nothing.

Why one module of this size: it is the whole input contract of the event stores, in
small sections (scalars, JSON values, encoding, prepared events, read arguments,
record predicates); one module is what every store, built-in or third-party, imports
to accept exactly the same inputs.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NotRequired, TypedDict

from runstore.errors import InvalidEventError
from runstore.events.identity import ai_message_id
from runstore.validation import (
    MAX_ID_BYTES,
    _copy_json,
    check_text,
    copy_json_value,
    dumps,
    truncate_utf8,
    validate_metadata,
)

MAX_EVENT_TYPE_LENGTH = 32
MAX_CATEGORY_LENGTH = 16
MESSAGE_CATEGORY = "message"
TRACE_CATEGORY = "trace"
#: Event types whose ``message`` events are AI messages (``ai_message`` is the legacy name).
AI_MESSAGE_EVENT_TYPES: tuple[str, ...] = ("llm.ai.response", "ai_message")
#: An AI message whose ``metadata.caller`` starts with this is hidden from users.
HIDDEN_CALLER_PREFIX = "middleware:"

EventContent = str | dict[str, Any] | list[Any]


class EventRecord(TypedDict):
    """One stored event, as every backend returns it.

    ``user_id`` is present on backends declaring ``owner_filter`` (the owner the event
    was written with, ``None`` for none) and may be absent elsewhere.
    """

    thread_id: str
    run_id: str
    event_type: str
    category: str
    content: EventContent
    metadata: dict[str, Any]
    seq: int
    created_at: str
    user_id: NotRequired[str | None]


#: The keys a `RunEventStore.put_batch` event mapping may carry.
BATCH_KEYS = frozenset(
    {"thread_id", "run_id", "event_type", "category", "content", "metadata", "created_at"}
)
REQUIRED_BATCH_KEYS = frozenset({"thread_id", "run_id", "event_type", "category"})
#: Metadata markers set on trace content that was cut to ``run_events.max_trace_content``.
TRUNCATED_MARKER = "content_truncated"
ORIGINAL_LENGTH_MARKER = "original_byte_length"

#: The range of a seq, a cursor and a page limit: a signed 64-bit integer (SQL BIGINT).
SEQ_MIN = -(2**63)
SEQ_MAX = 2**63 - 1

#: Checks a thread or run id: ``(value, "thread_id") -> value`` or `InvalidEventError`.
IdCheck = Callable[[Any, str], str]




# -- scalars ----------------------------------------------------------------------








def validate_id(value: Any, what: str = "id") -> str:
    """Check a thread or run id: a non-empty str of at most `MAX_ID_BYTES` UTF-8 bytes."""
    if not isinstance(value, str):
        raise InvalidEventError(f"{what} must be a str, not {type(value).__name__}")
    if not value:
        raise InvalidEventError(f"{what} must be a non-empty string")
    check_text(value, what)
    if len(value.encode("utf-8")) > MAX_ID_BYTES:
        raise InvalidEventError(f"{what} is longer than {MAX_ID_BYTES} UTF-8 bytes")
    return value


def _validate_name(value: Any, what: str, limit: int) -> str:
    if not isinstance(value, str):
        raise InvalidEventError(f"{what} must be a str, not {type(value).__name__}")
    if not value or len(value) > limit:
        raise InvalidEventError(
            f"{what} must be 1 to {limit} characters long, got {len(value)}: {value[:40]!r}"
        )
    check_text(value, what)
    return value


def validate_event_type(value: Any) -> str:
    """Check an event type: a str of 1 to `MAX_EVENT_TYPE_LENGTH` characters."""
    return _validate_name(value, "event_type", MAX_EVENT_TYPE_LENGTH)


def validate_category(value: Any) -> str:
    """Check a category: a str of 1 to `MAX_CATEGORY_LENGTH` characters."""
    return _validate_name(value, "category", MAX_CATEGORY_LENGTH)


# -- JSON values ----------------------------------------------------------------------





def validate_content(content: Any) -> EventContent:
    """Check event content (a str, or a JSON object/array) and return a private copy."""
    if isinstance(content, str):
        check_text(content, "content")
        return content
    if isinstance(content, dict | list):
        return _copy_json(content, "content", 0)
    raise InvalidEventError(
        f"content must be a str, a dict (JSON object) or a list (JSON array), "
        f"not {type(content).__name__}"
    )




def normalize_created_at(value: Any) -> str:
    """Return ``created_at`` as UTC ISO-8601; ``None`` is now. Naive or unparsable values fail."""
    if value is None:
        return datetime.now(UTC).isoformat()
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise InvalidEventError(
                f"created_at {value[:64]!r} is not ISO-8601; "
                "use e.g. 2026-01-02T03:04:05.123456+00:00"
            ) from None
    else:
        raise InvalidEventError(
            f"created_at must be an ISO-8601 str (or an aware datetime), not {type(value).__name__}"
        )
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise InvalidEventError(
            f"created_at {value!s:.64} has no timezone; give an offset such as +00:00 or Z"
        )
    try:
        return parsed.astimezone(UTC).isoformat()
    except OverflowError:
        raise InvalidEventError(
            f"created_at {value!s:.64} falls outside the years 1 to 9999 once converted to "
            "UTC; accepted: an aware ISO-8601 time between 0001-01-01T00:00:00+00:00 and "
            "9999-12-31T23:59:59.999999+00:00"
        ) from None


# -- encoding -------------------------------------------------------------------------










# -- prepared events ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PreparedEvent:
    """A validated, normalized event ready to be stored (everything but ``seq`` and owner)."""

    thread_id: str
    run_id: str
    event_type: str
    category: str
    content: EventContent
    metadata: dict[str, Any]
    created_at: str

    @property
    def content_is_json(self) -> bool:
        """Whether the content is a JSON object/array (stored encoded) rather than a str."""
        return not isinstance(self.content, str)

    def content_text(self) -> str:
        """The content as stored text: the str itself, or its JSON encoding."""
        return self.content if isinstance(self.content, str) else dumps(self.content)

    def to_record(
        self, seq: int, *, owner: str | None = None, with_owner: bool = False
    ) -> EventRecord:
        """Build the record returned to callers (fresh containers; ``user_id`` if ``with_owner``)."""
        record: EventRecord = {
            "thread_id": self.thread_id,
            "run_id": self.run_id,
            "event_type": self.event_type,
            "category": self.category,
            "content": copy_json_value(self.content),
            "metadata": copy_json_value(self.metadata),
            "seq": seq,
            "created_at": self.created_at,
        }
        if with_owner:
            record["user_id"] = owner
        return record




def copy_record(record: EventRecord) -> EventRecord:
    """A copy of a stored record whose containers the caller may mutate freely."""
    out = dict(record)
    out["content"] = copy_json_value(record["content"])
    out["metadata"] = copy_json_value(record["metadata"])
    return out  # type: ignore[return-value]


def prepare_event(
    *,
    thread_id: Any,
    run_id: Any,
    event_type: Any,
    category: Any,
    content: Any = "",
    metadata: Any = None,
    created_at: Any = None,
    max_trace_content: int = 10240,
    check_id: IdCheck = validate_id,
) -> PreparedEvent:
    """Validate and normalize one event; trace content over ``max_trace_content`` bytes is cut.

    Fields are checked in signature order; ``check_id`` checks the two ids (a store
    with stricter ids passes its own). A cut ``trace`` event gets
    ``metadata[content_truncated] = True`` and ``metadata[original_byte_length]``
    (UTF-8 bytes of the str, or of the JSON encoding of structured content, which then
    becomes the cut JSON text).
    """
    thread_id = check_id(thread_id, "thread_id")
    run_id = check_id(run_id, "run_id")
    event_type = validate_event_type(event_type)
    category = validate_category(category)
    content = validate_content(content)
    meta = validate_metadata(metadata)
    created = normalize_created_at(created_at)
    if category == TRACE_CATEGORY:
        text = content if isinstance(content, str) else dumps(content)
        cut, original = truncate_utf8(text, max_trace_content)
        if original > max_trace_content:
            content = cut
            meta[TRUNCATED_MARKER] = True
            meta[ORIGINAL_LENGTH_MARKER] = original
    return PreparedEvent(thread_id, run_id, event_type, category, content, meta, created)


def prepare_batch(
    events: Any, *, max_trace_content: int = 10240, check_id: IdCheck = validate_id
) -> list[PreparedEvent]:
    """Validate a whole `RunEventStore.put_batch` input before anything is written.

    Keys must come from `BATCH_KEYS` (``user_id`` is per batch, not per event) and
    include `REQUIRED_BATCH_KEYS`; the error names the offending event index.
    """
    if isinstance(events, str | bytes | Mapping) or not isinstance(events, Sequence | Iterable):
        raise InvalidEventError(
            f"put_batch takes a list of event dicts, not {type(events).__name__}"
        )
    prepared: list[PreparedEvent] = []
    for index, event in enumerate(events):
        if not isinstance(event, Mapping):
            raise InvalidEventError(
                f"put_batch event #{index} must be a dict, not {type(event).__name__}"
            )
        unknown = sorted(str(k) for k in set(event) - BATCH_KEYS)
        if unknown:
            hint = " (pass user_id= to put_batch itself)" if "user_id" in unknown else ""
            raise InvalidEventError(
                f"put_batch event #{index} has unknown key(s) {', '.join(unknown)}{hint}; "
                f"accepted: {', '.join(sorted(BATCH_KEYS))}"
            )
        missing = sorted(REQUIRED_BATCH_KEYS - set(event))
        if missing:
            raise InvalidEventError(
                f"put_batch event #{index} lacks required key(s) {', '.join(missing)}"
            )
        try:
            prepared.append(
                prepare_event(**event, max_trace_content=max_trace_content, check_id=check_id)
            )
        except InvalidEventError as exc:
            raise InvalidEventError(f"put_batch event #{index}: {exc}") from None
    return prepared


# -- read arguments -------------------------------------------------------------------


def check_limit(limit: Any) -> int:
    """Check a page ``limit``: an int from 0 to `SEQ_MAX`."""
    if not isinstance(limit, int) or isinstance(limit, bool):
        raise InvalidEventError(f"limit must be an int, not {type(limit).__name__}")
    if limit < 0:
        raise InvalidEventError(f"limit must be >= 0, got {limit}")
    if limit > SEQ_MAX:
        raise InvalidEventError(
            f"limit must be at most {SEQ_MAX} (a signed 64-bit integer), got {limit}"
        )
    return limit


def check_cursor(value: Any, name: str) -> int | None:
    """Check a seq cursor (``before_seq`` / ``after_seq``): ``None`` or an int in the seq range."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidEventError(f"{name} must be an int or None, not {type(value).__name__}")
    if not SEQ_MIN <= value <= SEQ_MAX:
        raise InvalidEventError(
            f"{name} must be None or an int from {SEQ_MIN} to {SEQ_MAX} (seqs are signed "
            f"64-bit integers), got {value}"
        )
    return value


def check_event_types(event_types: Any) -> frozenset[str] | None:
    """Check ``event_types``: ``None`` (no filter) or a collection of str (``[]`` matches nothing)."""
    if event_types is None:
        return None
    if isinstance(event_types, str | bytes) or not isinstance(event_types, Iterable):
        raise InvalidEventError(
            f"event_types must be a list of str or None, not {type(event_types).__name__}"
        )
    types = frozenset(event_types)
    for item in types:
        if not isinstance(item, str):
            raise InvalidEventError(f"event_types holds a {type(item).__name__}; give str values")
    return types


def check_task_id(task_id: Any) -> str | None:
    """Check a ``task_id`` filter: ``None`` or a str."""
    if task_id is not None and not isinstance(task_id, str):
        raise InvalidEventError(f"task_id must be a str or None, not {type(task_id).__name__}")
    return task_id


def check_page(limit: Any, before_seq: Any, after_seq: Any) -> tuple[int, int | None, int | None]:
    """Check a page request: ``limit`` and its exclusive ``before_seq`` / ``after_seq`` cursors."""
    return (
        check_limit(limit),
        check_cursor(before_seq, "before_seq"),
        check_cursor(after_seq, "after_seq"),
    )


def check_run_filter(
    event_types: Any, task_id: Any, limit: Any, after_seq: Any
) -> tuple[frozenset[str] | None, str | None, int, int | None]:
    """Check `RunEventStore.list_events`' filters: event types, task id, limit and cursor."""
    return (
        check_event_types(event_types),
        check_task_id(task_id),
        check_limit(limit),
        check_cursor(after_seq, "after_seq"),
    )


def normalize_identities(identities: Any) -> set[str]:
    """The non-empty str identities of a `get_message_seqs` call (a bare str is an error)."""
    if isinstance(identities, str | bytes):
        raise InvalidEventError("identities must be a collection of str, not a single str")
    return {i for i in identities if isinstance(i, str) and i}


def normalize_message_ids(message_ids: Any) -> set[str]:
    """The non-empty str ids of a `find_latest_ai_message_run_ids` call (a bare str is an error)."""
    if isinstance(message_ids, str | bytes):
        raise InvalidEventError("message_ids must be a collection of str, not a single str")
    return {i for i in message_ids if isinstance(i, str) and i}


def normalize_run_ids(run_ids: Any) -> set[str] | None:
    """``None`` (all runs) or the set of str run ids (a bare str is an error)."""
    if run_ids is None:
        return None
    if isinstance(run_ids, str | bytes):
        raise InvalidEventError("run_ids must be a collection of str, not a single str")
    return {r for r in run_ids if isinstance(r, str)}


# -- record predicates ----------------------------------------------------------------


def is_visible_ai_message(record: Mapping[str, Any]) -> bool:
    """Whether a record is a user-visible AI message (see `get_last_visible_ai_seq_by_run`)."""
    if record.get("category") != MESSAGE_CATEGORY:
        return False
    if record.get("event_type") not in AI_MESSAGE_EVENT_TYPES:
        return False
    metadata = record.get("metadata")
    caller = metadata.get("caller") if isinstance(metadata, Mapping) else None
    return not (isinstance(caller, str) and caller.startswith(HIDDEN_CALLER_PREFIX))


def ai_message_match(record: Any, message_ids: set[str]) -> tuple[str, str] | None:
    """``(message_id, run_id)`` if ``record`` is an AI message event for one of ``message_ids``."""
    if not isinstance(record, Mapping) or record.get("category") != MESSAGE_CATEGORY:
        return None
    run_id = record.get("run_id")
    if not isinstance(run_id, str) or not run_id:
        return None
    message_id = ai_message_id(record.get("content"))
    if message_id is None or message_id not in message_ids:
        return None
    return message_id, run_id


def select_page(
    rows: Sequence[EventRecord],
    *,
    limit: int,
    before_seq: int | None = None,
    after_seq: int | None = None,
    newest_first_without_cursor: bool = True,
) -> list[EventRecord]:
    """Apply the paging contract to ``rows`` (ascending by seq); the reference for every backend."""
    seqs = [r["seq"] for r in rows]
    lo = 0 if after_seq is None else bisect.bisect_right(seqs, after_seq)
    hi = len(rows) if before_seq is None else bisect.bisect_left(seqs, before_seq)
    if hi <= lo or limit <= 0:
        return []
    if after_seq is not None or not newest_first_without_cursor:
        return list(rows[lo : min(hi, lo + limit)])
    return list(rows[max(lo, hi - limit) : hi])


def select_run_events(
    records: Iterable[EventRecord],
    *,
    limit: int,
    after_seq: int | None = None,
    event_types: frozenset[str] | None = None,
    task_id: str | None = None,
) -> list[EventRecord]:
    """The first ``limit`` of a run's records (ascending) that pass `list_events`' filters.

    Arguments are already checked (`check_limit`, `check_event_types`, ...); ``task_id``
    matches ``metadata.task_id`` and is applied before the limit.
    """
    out: list[EventRecord] = []
    if limit == 0 or event_types == frozenset():
        return out
    for record in records:
        if after_seq is not None and record["seq"] <= after_seq:
            continue
        if event_types is not None and record["event_type"] not in event_types:
            continue
        if task_id is not None and record["metadata"].get("task_id") != task_id:
            continue
        out.append(record)
        if len(out) >= limit:
            break
    return out
