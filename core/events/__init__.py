"""The run event store wing: the protocol, what a record is, and the SQL store.

``runstore.events`` gives the protocol (`RunEventStore`) and the record types; the
parts live in ``protocol`` (the store contract and its call preamble), ``records``
(events, prepared events and read-argument checks), ``identity`` (message identity),
``owner`` (the owner scope), ``schema`` and ``sql`` (the dialect-neutral SQL store).
"""

from __future__ import annotations

from runstore.events.protocol import (
    AI_LOOKUP_PAGE_SIZE,
    Lookup,
    Page,
    RunEventStore,
    RunFilter,
    RunSummary,
    Target,
    summarize_runs,
    walk_ai_message_runs,
)
from runstore.events.records import (
    MESSAGE_CATEGORY,
    TRACE_CATEGORY,
    EventContent,
    EventRecord,
    PreparedEvent,
)

__all__ = [
    "AI_LOOKUP_PAGE_SIZE",
    "EventContent",
    "EventRecord",
    "Lookup",
    "MESSAGE_CATEGORY",
    "Page",
    "PreparedEvent",
    "RunEventStore",
    "RunFilter",
    "RunSummary",
    "TRACE_CATEGORY",
    "Target",
    "summarize_runs",
    "walk_ai_message_runs",
]
