"""Our run of the event store conformance suite (memory, jsonl, sqlite, postgres by default)."""

from runstore.conformance.test_events import *  # noqa: F403
