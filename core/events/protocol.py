"""The run event store protocol: an append-only, seq-ordered feed of events per thread.

Contract (every backend, same answers; docs/events.md):

* A record is an `EventRecord` dict. ``seq`` is per thread, starts at 1 and strictly
  increases; threads are independent. ``put_batch`` gives each thread's events of the
  batch one contiguous seq block, in input order.
* Writes validate everything before touching storage (`runstore.events.records`): a bad
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
* Fenced writes (capability ``fencing``): ``put``, ``put_batch`` and ``put_if_absent``
  take ``fence=`` (a run store lease's token). A store declaring ``fencing`` keeps per
  thread the highest token a write carried and refuses an older one with
  `StaleFenceError` (nothing written), in the same step as the write; other stores
  check the argument and ignore it. Without a token a write is not checked.
  `RunEventStore.fence_thread` raises a thread's fence without writing an event: the
  worker calls it as soon as it takes a lease, so the first stale append after a
  takeover is refused.
* Every call is checked in one order (the preamble, `RunEventStore` helpers such as
  `RunEventStore._page_call`): (1) its arguments, in signature order; (2) the owner;
  (3) a call whose answer needs no I/O (empty lookup input, ``limit=0``, an empty
  batch, ``event_types=[]``, ``run_ids=[]``) returns it; (4) anything else on a closed
  store raises `RuntimeError`. So bad input is an input error even without an owner
  context or on a closed store, and empty answers stay available after ``close``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple

from runstore.errors import IncompleteMessageRunLookupError
from runstore.events.owner import AUTO, UserId, resolve_owner
from runstore.events.records import (
    AI_MESSAGE_EVENT_TYPES,
    HIDDEN_CALLER_PREFIX,
    MAX_CATEGORY_LENGTH,
    MAX_EVENT_TYPE_LENGTH,
    MESSAGE_CATEGORY,
    TRACE_CATEGORY,
    EventContent,
    EventRecord,
    PreparedEvent,
    ai_message_match,
    check_page,
    check_run_filter,
    normalize_message_ids,
    prepare_batch,
    prepare_event,
    validate_id,
)
from runstore.fencing import check_fence

__all__ = [
    "AI_LOOKUP_PAGE_SIZE",
    "AI_MESSAGE_EVENT_TYPES",
    "HIDDEN_CALLER_PREFIX",
    "MAX_CATEGORY_LENGTH",
    "MAX_EVENT_TYPE_LENGTH",
    "MESSAGE_CATEGORY",
    "RunSummary",
    "summarize_runs",
    "TRACE_CATEGORY",
    "EventContent",
    "EventRecord",
    "Lookup",
    "Page",
    "RunEventStore",
    "RunFilter",
    "Target",
    "walk_ai_message_runs",
]

#: Page size of the default `RunEventStore.find_latest_ai_message_run_ids` walk.
AI_LOOKUP_PAGE_SIZE = 1000


class Target(NamedTuple):
    """A thread (or one run of it) and the owner: `count_messages`, the deletes."""

    thread_id: str
    run_id: str | None
    owner: str | None


class Page(NamedTuple):
    """A checked page request: `list_messages`, `list_messages_by_run` (``limit`` > 0)."""

    thread_id: str
    run_id: str | None
    owner: str | None
    limit: int
    before_seq: int | None
    after_seq: int | None


class RunFilter(NamedTuple):
    """A checked `list_events` request that can match something."""

    thread_id: str
    run_id: str
    owner: str | None
    event_types: frozenset[str] | None
    task_id: str | None
    limit: int
    after_seq: int | None


class Lookup(NamedTuple):
    """A checked lookup by keys (identities, message ids, run ids); ``keys=None``: all runs."""

    thread_id: str
    owner: str | None
    keys: set[str] | None


class RunSummary(NamedTuple):
    """One run of a thread as `RunEventStore.list_runs` counts it."""

    run_id: str
    events: int
    messages: int
    first_seq: int
    last_seq: int


def summarize_runs(records: Iterable[EventRecord]) -> list[RunSummary]:
    """Per-run counts of ``records`` (any order), ordered by each run's first seq."""
    runs: dict[str, list[int]] = {}
    for record in records:
        entry = runs.setdefault(record["run_id"], [0, 0, record["seq"], record["seq"]])
        entry[0] += 1
        entry[1] += record["category"] == MESSAGE_CATEGORY
        entry[2] = min(entry[2], record["seq"])
        entry[3] = max(entry[3], record["seq"])
    return sorted((RunSummary(run, *counts) for run, counts in runs.items()), key=lambda r: r.first_seq)


class RunEventStore(ABC):
    """Append-only event feed per thread; the module docstring states the full contract."""

    #: Capabilities are declared at registration; this mirrors them for introspection.
    capabilities: ClassVar[frozenset[str]] = frozenset()

    # -- the call preamble ------------------------------------------------------------
    #
    # Every store checks a call with these helpers, so every store checks it in the one
    # order the module docstring states. A ``*_call`` helper returns ``None`` when the
    # answer needs no I/O (the caller returns the empty answer) and otherwise the
    # checked arguments, having made sure the store is open.

    def _check_id(self, value: Any, what: str) -> str:
        """Check a thread or run id (a store whose ids have more rules overrides this)."""
        return validate_id(value, what)

    def _check_open(self) -> None:
        """Raise `RuntimeError` if the store is closed (stores that can close override this)."""
        return None

    def _resolve(self, user_id: UserId, *, io: bool) -> str | None:
        """Steps 2 and 4 of the preamble: the owner, then (for a call doing I/O) an open store."""
        owner = resolve_owner(user_id)
        if io:
            self._check_open()
        return owner

    def _write_call(
        self,
        max_trace_content: int,
        thread_id: Any,
        run_id: Any,
        event_type: Any,
        category: Any,
        content: Any,
        metadata: Any,
        created_at: Any,
        user_id: UserId,
        fence: Any = None,
    ) -> tuple[PreparedEvent, str | None]:
        """The preamble of `put` / `put_if_absent` (arguments in their order): event and owner."""
        prepared = prepare_event(
            thread_id=thread_id,
            run_id=run_id,
            event_type=event_type,
            category=category,
            content=content,
            metadata=metadata,
            created_at=created_at,
            max_trace_content=max_trace_content,
            check_id=self._check_id,
        )
        if fence is not None:
            check_fence(fence)
        return prepared, self._resolve(user_id, io=True)

    def _batch_call(
        self, events: Any, user_id: UserId, *, max_trace_content: int, fence: Any = None
    ) -> tuple[list[PreparedEvent], str | None] | None:
        """The preamble of `put_batch`: the validated events and their owner (``None``: empty)."""
        prepared = prepare_batch(events, max_trace_content=max_trace_content, check_id=self._check_id)
        if fence is not None:
            check_fence(fence)
        owner = self._resolve(user_id, io=bool(prepared))
        return (prepared, owner) if prepared else None

    def _target_call(self, thread_id: Any, run_id: Any, user_id: UserId) -> Target:
        """The preamble of `count_messages` and the deletes (``run_id=None``: the whole thread)."""
        thread = self._check_id(thread_id, "thread_id")
        run = None if run_id is None else self._check_id(run_id, "run_id")
        return Target(thread, run, self._resolve(user_id, io=True))

    def _page_call(
        self,
        thread_id: Any,
        run_id: Any,
        limit: Any,
        before_seq: Any,
        after_seq: Any,
        user_id: UserId,
    ) -> Page | None:
        """The preamble of a message page (``run_id=None``: the whole thread; ``None``: limit 0)."""
        thread = self._check_id(thread_id, "thread_id")
        run = None if run_id is None else self._check_id(run_id, "run_id")
        limit, before, after = check_page(limit, before_seq, after_seq)
        owner = self._resolve(user_id, io=limit > 0)
        return Page(thread, run, owner, limit, before, after) if limit > 0 else None

    def _run_filter_call(
        self,
        thread_id: Any,
        run_id: Any,
        event_types: Any,
        task_id: Any,
        limit: Any,
        after_seq: Any,
        user_id: UserId,
    ) -> RunFilter | None:
        """The preamble of `list_events` (``None``: ``limit=0`` or ``event_types=[]``)."""
        thread = self._check_id(thread_id, "thread_id")
        run = self._check_id(run_id, "run_id")
        types, task, limit, after = check_run_filter(event_types, task_id, limit, after_seq)
        empty = limit == 0 or types == frozenset()
        owner = self._resolve(user_id, io=not empty)
        return None if empty else RunFilter(thread, run, owner, types, task, limit, after)

    def _lookup_call(
        self,
        thread_id: Any,
        keys: Any,
        normalize: Callable[[Any], set[str] | None],
        user_id: UserId,
    ) -> Lookup | None:
        """The preamble of a lookup by keys, normalized by ``normalize`` (``None``: no keys)."""
        thread = self._check_id(thread_id, "thread_id")
        wanted = normalize(keys)
        empty = wanted is not None and not wanted
        owner = self._resolve(user_id, io=not empty)
        return None if empty else Lookup(thread, owner, wanted)

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
        fence: int | None = None,
    ) -> EventRecord:
        """Append one event and return its record with the assigned ``seq``.

        ``created_at`` defaults to now (UTC); a given value must be timezone-aware
        ISO-8601 and is returned normalized to UTC. ``category == "trace"`` content
        longer than ``run_events.max_trace_content`` UTF-8 bytes is cut and marked.
        """

    @abstractmethod
    async def put_batch(
        self,
        events: Sequence[Mapping[str, Any]],
        *,
        user_id: UserId = AUTO,
        fence: int | None = None,
    ) -> list[EventRecord]:
        """Append events all-or-nothing and return their records in input order.

        Each mapping takes exactly `put`'s keyword arguments except ``user_id`` and
        ``fence`` (one owner and one token per batch, checked on every thread of it); an
        unknown or missing key rejects the whole batch. Each
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
        fence: int | None = None,
    ) -> tuple[EventRecord, bool]:
        """Write unless ``(thread_id, run_id, event_type)`` exists; return ``(record, created)``.

        The existence check ignores the owner. The check and the write are serialized
        with every other writer of the thread, so concurrent callers all receive the
        one record that was created.
        """

    async def fence_thread(self, thread_id: str, fence: int) -> None:
        """Raise the thread's fence to ``fence`` without writing an event: from now on an
        append carrying an older token is refused. `StaleFenceError` if the thread has
        already seen a newer token.

        A store declaring ``fencing`` overrides this with the compare-and-set its fenced
        appends run (atomic with every append of the thread); this default, for stores
        that do not fence, checks the arguments and changes nothing."""
        self._check_id(thread_id, "thread_id")
        check_fence(fence)
        self._check_open()

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

        Identities are those of `message_identity` applied to the event's
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
        call = self._lookup_call(thread_id, message_ids, normalize_message_ids, user_id)
        if call is None or call.keys is None:
            return {}
        return await walk_ai_message_runs(self.list_messages, call.thread_id, call.keys, call.owner)

    @abstractmethod
    async def list_runs(self, thread_id: str, *, user_id: UserId = AUTO) -> list[RunSummary]:
        """The thread's runs with their event and message counts, by first seq (the
        owner's events only, under ``owner_filter``)."""

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


async def walk_ai_message_runs(
    list_messages: Callable[..., Awaitable[list[EventRecord]]],
    thread_id: str,
    pending: set[str],
    owner: str | None,
) -> dict[str, str]:
    """The default `RunEventStore.find_latest_ai_message_run_ids` walk over ``list_messages``.

    Arguments are already checked (``pending``: the non-empty message ids, consumed).
    Walks backward from the first page's high-watermark, so rows appended meanwhile
    are ignored, and raises `IncompleteMessageRunLookupError` when a full page yields
    no safe, strictly decreasing cursor.
    """
    result: dict[str, str] = {}
    before_seq: int | None = None
    high_watermark: int | None = None
    while pending:
        page = await list_messages(
            thread_id, limit=AI_LOOKUP_PAGE_SIZE, before_seq=before_seq, user_id=owner
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
