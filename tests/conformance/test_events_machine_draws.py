"""The event store state machine draws its rare steps and checks often enough in the
default profile (counted over one run on the memory store): reads as one owner while
other owners' events are in the thread, `put_if_absent` of an existing key (also one
another owner wrote), a page after the last row, listings and counts after deletes. The
default profile is derandomized, so the counts are the same every run; a change to the
machine that starves one fails here, naming it.
"""

from __future__ import annotations

import pytest

import runstore.conformance.events_machine as events_machine
from runstore.conformance.machines import EventStoreMachine

from .machine_draws import assert_floors, count_draws

#: The fewest draws per run (about half of what the default profile draws).
MINIMUM = {
    "every read as one owner": 15,
    "every read as one owner, with events of others in the thread": 8,
    "put_if_absent of an existing key": 16,
    "put_if_absent of a key another owner wrote": 9,
    "list_messages: a page after the last row": 5,
    "list_events: a page after the last row": 8,
    "list_messages_by_run: a page after the last row": 8,
    "invariant: list_messages: a page after the last row": 259,
    "delete_by_run": 12,
    "delete_by_thread": 11,
    "invariant: listings and counts after a delete": 90,
}


def test_the_events_machine_draws_its_rare_steps_in_the_default_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    counts = count_draws(monkeypatch, events_machine, "hypothesis_event", "events", [EventStoreMachine])
    assert_floors(counts, MINIMUM, "event store machine: ")
