"""The run event store protocol: an append-only, seq-ordered feed per thread.

DRAFT by the lead: signatures are fixed; the events owner refines docstrings and
the default implementations.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, NotRequired, TypedDict

from .owner import AUTO, UserId

MAX_EVENT_TYPE_LENGTH = 32
MAX_CATEGORY_LENGTH = 16
MESSAGE_CATEGORY = "message"


class EventRecord(TypedDict):
    """One stored event, as every backend returns it."""

    thread_id: str
    run_id: str
    event_type: str
    category: str
    content: str | dict[str, Any] | list[Any]
    metadata: dict[str, Any]
    seq: int
    created_at: str
    user_id: NotRequired[str | None]


class RunEventStore(ABC):
    """Append-only event feed per thread; see the module docs for the full contract."""

    #: Capabilities are declared at registration; this mirrors them for introspection.
    capabilities: ClassVar[frozenset[str]] = frozenset()

    @abstractmethod
    async def put(
        self,
        *,
        thread_id: str,
        run_id: str,
        event_type: str,
        category: str,
        content: str | dict[str, Any] | list[Any] = "",
        metadata: Mapping[str, Any] | None = None,
        created_at: str | None = None,
        user_id: UserId = AUTO,
    ) -> EventRecord:
        """Append one event and return its record with the assigned ``seq``."""

    @abstractmethod
    async def put_batch(
        self, events: Sequence[Mapping[str, Any]], *, user_id: UserId = AUTO
    ) -> list[EventRecord]:
        """Append events all-or-nothing; each thread's events get one contiguous seq block."""

    @abstractmethod
    async def put_if_absent(
        self,
        *,
        thread_id: str,
        run_id: str,
        event_type: str,
        category: str,
        content: str | dict[str, Any] | list[Any] = "",
        metadata: Mapping[str, Any] | None = None,
        created_at: str | None = None,
        user_id: UserId = AUTO,
    ) -> tuple[EventRecord, bool]:
        """Write unless (thread, run, event_type) exists; return (record, created)."""

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
        """A page of ``message`` events, ascending, with exclusive cursors."""

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
        """A run's events ascending, optionally filtered by type and ``metadata.task_id``."""

    @abstractmethod
    async def list_messages_by_run(
        self,
        thread_id: str,
        run_id: str,
        *,
        limit: int = 500,
        after_seq: int | None = None,
        user_id: UserId = AUTO,
    ) -> list[EventRecord]:
        """A run's ``message`` events ascending."""

    @abstractmethod
    async def count_messages(self, thread_id: str, *, user_id: UserId = AUTO) -> int:
        """How many ``message`` events the thread holds."""

    @abstractmethod
    async def get_last_visible_ai_seq_by_run(
        self, thread_id: str, *, user_id: UserId = AUTO
    ) -> dict[str, int]:
        """For each run of the thread, the seq of its last visible AI message."""

    @abstractmethod
    async def get_message_seqs(
        self, thread_id: str, identities: Iterable[str], *, user_id: UserId = AUTO
    ) -> dict[str, int]:
        """Map message identities to the earliest seq holding them; unknown ones are absent."""

    async def find_latest_ai_message_run_ids(
        self, thread_id: str, message_ids: Iterable[str], *, user_id: UserId = AUTO
    ) -> dict[str, str]:
        """Map AI message ids to the run of their latest event (complete or error)."""
        raise NotImplementedError

    @abstractmethod
    async def delete_by_thread(self, thread_id: str, *, user_id: UserId = AUTO) -> int:
        """Delete the thread's events; return how many."""

    @abstractmethod
    async def delete_by_run(self, thread_id: str, run_id: str, *, user_id: UserId = AUTO) -> int:
        """Delete one run's events; return how many."""

    async def close(self) -> None:
        """Release resources; the store is unusable afterwards."""
