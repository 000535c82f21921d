"""The store state machine draws its rare steps and checks often enough in the default
profile (counted over one run on the memory store): deletes of live items and the
searches and namespace listings after them (also over a namespace a delete emptied),
expiry on the machine's clock and the listings over an expired, unswept item, nested
filters, paging through items tied on updated_at. The default profile is derandomized,
so the counts are the same every run; a change to the machine that starves one fails
here, naming it.
"""

from __future__ import annotations

import pytest

import runstore.conformance.store_machine as store_machine
from runstore.conformance.machines import StoreMachine

from .machine_draws import assert_floors, count_draws

#: The fewest draws per run (about half of what the default profile draws, at least 1).
MINIMUM = {
    "delete of a live item": 5,
    "search after a delete": 2,
    "search over a namespace a delete emptied": 1,
    "list_namespaces after a delete": 4,
    "list_namespaces over a namespace a delete emptied": 3,
    "invariant: search and list_namespaces after a delete": 40,
    "invariant: search and list_namespaces over a namespace a delete emptied": 40,
    "advance expires an item": 4,
    "invariant: search and list_namespaces over an expired, unswept item": 15,
    "a nested filter": 17,
    "pages through items tied on updated_at": 1,
    "invariant: pages through items tied on updated_at": 6,
}


def test_the_store_machine_draws_its_rare_steps_in_the_default_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    counts = count_draws(monkeypatch, store_machine, "event", "store", [StoreMachine])
    assert_floors(counts, MINIMUM, "store machine: ")
