"""The run event store protocol: an append-only, seq-ordered feed of events per thread.

Contract (every backend, same answers; DESIGN §4 and docs/events.md):

* A record is an `EventRecord` dict. ``seq`` is per thread, starts at 1 and strictly
  increases; threads are independent. ``put_batch`` gives each thread's events of the
  batch one contiguous seq block, in input order.
* Writes validate everything before touching storage (`runstore.records`): a bad
  event raises `InvalidEventError` and nothing is written. ``put_batch`` is
  all-or-nothing: a failure leaves nothing that a retry would duplicate.
* ``put_if_absent`` keeps one record per ``(thread_id, run_id, event_type)``; its
  check-and-write is serialized with every other writer of the thread (across
  processes for backends declaring ``cross_process``).
* Cursors are exclusive. Without cursors a message page is the newest ``limit`` rows;
  ``before_seq`` gives the last ``limit`` rows below it, ``after_seq`` the first
  ``limit`` rows above it, and both together the first ``limit`` rows of the window
  strictly between them. Pages are always ascending.
* ``user_id``: `AUTO` (the default, reads AND writes) takes the owner from
  `runstore.owner_scope` and raises `OwnerContextMissingError` when none is set; a
  string is the owner; ``None`` means no owner. Backends declaring ``owner_filter``
  store the owner on writes, filter every read and delete by it, and return it as
  the record's ``user_id``; other backends resolve the argument the same way (so a
  missing context still fails) and then ignore it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, NotRequired, TypedDict

from .errors import IncompleteMessageRunLookupError
from .owner import AUTO, UserId

MAX_EVENT_TYPE_LENGTH = 32
MAX_CATEGORY_LENGTH = 16
MESSAGE_CATEGORY = "message"
TRACE_CATEGORY = "trace"
#: Event types whose ``message`` events are AI messages (``ai_message`` is the legacy name).
AI_MESSAGE_EVENT_TYPES: tuple[str, ...] = ("llm.ai.response", "ai_message")
#: An AI message whose ``metadata.caller`` starts with this is hidden from users.
HIDDEN_CALLER_PREFIX = "middleware:"
#: Page size of the default `RunEventStore.find_latest_ai_message_run_ids` walk.
AI_LOOKUP_PAGE_SIZE = 1000

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


class RunEventStore(ABC):
    """Append-only event feed per thread; the module docstring states the full contract."""

    #: Capabilities are declared at registration; this mirrors them for introspection.
    capabilities: ClassVar[frozenset[str]] = frozenset()

    # -- writes ---------------------------------------------------------------------

    @abstractmethod
    async def put(
        self,
        *,
        thread_id: str,
        run_id: str,
        event_type: str,
        category: str,
        content: EventContent = "",
        metadata: Mapping[str, Any] | None = None,
        created_at: str | None = None,
        user_id: UserId = AUTO,
    ) -> EventRecord:
        """Append one event and return its record with the assigned ``seq``.

        ``created_at`` defaults to now (UTC); a given value must be timezone-aware
        ISO-8601 and is returned normalized to UTC. ``category == "trace"`` content
        longer than ``run_events.max_trace_content`` UTF-8 bytes is cut and marked.
        """

    @abstractmethod
    async def put_batch(
        self, events: Sequence[Mapping[str, Any]], *, user_id: UserId = AUTO
    ) -> list[EventRecord]:
        """Append events all-or-nothing and return their records in input order.

        Each mapping takes exactly `put`'s keyword arguments except ``user_id`` (one
        owner per batch); an unknown or missing key rejects the whole batch. Each
        thread's events get one contiguous seq block. An empty batch does no I/O.
        """

    @abstractmethod
    async def put_if_absent(
        self,
        *,
        thread_id: str,
        run_id: str,
        event_type: str,
        category: str,
        content: EventContent = "",
        metadata: Mapping[str, Any] | None = None,
        created_at: str | None = None,
        user_id: UserId = AUTO,
    ) -> tuple[EventRecord, bool]:
        """Write unless ``(thread_id, run_id, event_type)`` exists; return ``(record, created)``.

        The existence check ignores the owner. The check and the write are serialized
        with every other writer of the thread, so concurrent callers all receive the
        one record that was created.
        """

    # -- reads ----------------------------------------------------------------------

    @abstractmethod
    async def list_messages(
        self,
        thread_id: str,
        *,
        limit: int = 50,
        before_seq: int | None = None,
        after_seq: int | None = None,
        user_id: UserId = AUTO,
    ) -> list[EventRecord]:
        """A page of the thread's ``message`` events, ascending, with exclusive cursors.

        No cursor: the newest ``limit``; ``before_seq``: the last ``limit`` below it;
        ``after_seq``: the first ``limit`` above it; both: the first ``limit`` strictly
        between them. ``limit=0`` is an empty page; a negative limit is an error.
        """

    @abstractmethod
    async def list_events(
        self,
        thread_id: str,
        run_id: str,
        *,
        event_types: Sequence[str] | None = None,
        task_id: str | None = None,
        limit: int = 500,
        after_seq: int | None = None,
        user_id: UserId = AUTO,
    ) -> list[EventRecord]:
        """The first ``limit`` events of a run above ``after_seq``, ascending, every category.

        ``event_types`` keeps only those types (``[]`` keeps nothing, ``None`` all);
        ``task_id`` keeps events whose ``metadata["task_id"]`` equals it. Both filters
        apply before the limit.
        """

    @abstractmethod
    async def list_messages_by_run(
        self,
        thread_id: str,
        run_id: str,
        *,
        limit: int = 500,
        after_seq: int | None = None,
        before_seq: int | None = None,
        user_id: UserId = AUTO,
    ) -> list[EventRecord]:
        """A page of one run's ``message`` events, paged exactly like `list_messages`."""

    @abstractmethod
    async def count_messages(self, thread_id: str, *, user_id: UserId = AUTO) -> int:
        """How many ``message`` events the thread holds."""

    @abstractmethod
    async def get_last_visible_ai_seq_by_run(
        self,
        thread_id: str,
        *,
        run_ids: Iterable[str] | None = None,
        user_id: UserId = AUTO,
    ) -> dict[str, int]:
        """For each run, the seq of its last visible AI message; runs without one are absent.

        A visible AI message is a ``message`` event whose type is in
        `AI_MESSAGE_EVENT_TYPES` and whose ``metadata["caller"]`` is not a string
        starting with `HIDDEN_CALLER_PREFIX` (`runstore.records.is_visible_ai_message`).
        ``run_ids`` limits the answer to those runs (empty: ``{}`` without I/O).
        """

    @abstractmethod
    async def get_message_seqs(
        self, thread_id: str, identities: Iterable[str], *, user_id: UserId = AUTO
    ) -> dict[str, int]:
        """Map message identities to the earliest seq of a ``message`` event holding them.

        Identities are those of `runstore.message_identity` applied to the event's
        content. Unknown identities are absent; empty input returns ``{}`` without I/O.
        """

    async def find_latest_ai_message_run_ids(
        self, thread_id: str, message_ids: Iterable[str], *, user_id: UserId = AUTO
    ) -> dict[str, str]:
        """Map AI message ids to the run of their newest AI message event (complete or error).

        A candidate is a ``message`` event whose content is a dict of type ``"ai"``
        (flat or under ``data``) with a non-empty ``run_id``. Empty input does no I/O.
        This default walks `list_messages` backward in pages of `AI_LOOKUP_PAGE_SIZE`
        from the first page's high-watermark (rows appended meanwhile are ignored) and
        raises `IncompleteMessageRunLookupError` when a full page yields no safe,
        strictly decreasing cursor. A missing key means "no AI event" only after a
        normal return.
        """
        from .records import ai_message_match, normalize_message_ids

        pending = normalize_message_ids(message_ids)
        if not pending:
            return {}
        result: dict[str, str] = {}
        before_seq: int | None = None
        high_watermark: int | None = None
        while pending:
            page = await self.list_messages(
                thread_id, limit=AI_LOOKUP_PAGE_SIZE, before_seq=before_seq, user_id=user_id
            )
            if not page:
                break
            seqs: list[int] = []
            for event in page:
                seq = event.get("seq") if isinstance(event, Mapping) else None
                if not isinstance(seq, int) or isinstance(seq, bool):
                    if len(page) >= AI_LOOKUP_PAGE_SIZE:
                        raise IncompleteMessageRunLookupError(
                            f"thread {thread_id!r}: a full page of messages holds a row without "
                            "an integer seq, so no safe backward cursor exists"
                        )
                    continue
                seqs.append(seq)
            if high_watermark is None and seqs:
                high_watermark = max(seqs)
            for event in reversed(page):
                seq = event.get("seq")
                # Rows above the first page's high-watermark (or at/above the cursor) were
                # not part of the snapshot this walk started from.
                if not isinstance(seq, int) or (high_watermark is not None and seq > high_watermark):
                    continue
                if before_seq is not None and seq >= before_seq:
                    continue
                match = ai_message_match(event, pending)
                if match is None:
                    continue
                message_id, run_id = match
                result[message_id] = run_id
                pending.discard(message_id)
                if not pending:
                    break
            if not pending or len(page) < AI_LOOKUP_PAGE_SIZE:
                break
            next_before = min(seqs)
            if before_seq is not None and next_before >= before_seq:
                raise IncompleteMessageRunLookupError(
                    f"thread {thread_id!r}: the message walk could not form a strictly "
                    f"decreasing cursor (page below {before_seq} starts at {next_before})"
                )
            before_seq = next_before
        return result

    # -- deletes --------------------------------------------------------------------

    @abstractmethod
    async def delete_by_thread(self, thread_id: str, *, user_id: UserId = AUTO) -> int:
        """Delete the thread's events (only the owner's, under ``owner_filter``); return how many."""

    @abstractmethod
    async def delete_by_run(self, thread_id: str, run_id: str, *, user_id: UserId = AUTO) -> int:
        """Delete one run's events (only the owner's, under ``owner_filter``); return how many."""

    async def close(self) -> None:
        """Release resources; idempotent. The store is unusable afterwards."""
        return None
