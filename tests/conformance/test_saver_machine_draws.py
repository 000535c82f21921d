"""The saver state machine (`ThreadIndexSaverMachine`, full and delta, as the suite runs
it on the memory saver) draws its rare steps and checks often enough in the default
profile: deletes followed by listings and thread-index reads while the tombstone stands,
refused writes followed by a record comparison, a delete of a thread whose id another
thread's extends, forks. The default profile is derandomized, so the counts are the
same every run; a change to the machine that starves one fails here, naming it.
"""

from __future__ import annotations

import pytest

import runstore.conformance.savers_machine as savers_machine
from runstore.conformance.machines import ThreadIndexSaverMachine

from .machine_draws import assert_floors, count_draws

#: The fewest draws per run (about half of what the default profile draws).
MINIMUM = {
    "delete_thread": 46,
    "prune keep_latest": 52,
    "prune delete": 52,
    "delete_for_runs": 58,
    "copy_thread": 40,
    "put a deleted id again": 84,
    "fork (put on an older parent)": 6,
    "delete_thread of an id another live thread extends": 8,
    "list a deleted thread while its tombstone stands": 17,
    "list a thread after a delete": 27,
    "list every thread while a tombstone stands": 13,
    "invariant: a deleted thread listed against the model": 255,
    "thread index checked against the model": 815,
    "thread index checked while a tombstone stands": 241,
    "write to a deleted thread refused": 25,
    "stale write refused": 19,
    "unstorable metadata refused": 11,
}


def test_the_saver_machine_draws_its_rare_steps_in_the_default_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    machines = [type(f"Draws_{mode}", (ThreadIndexSaverMachine,), {"mode": mode}) for mode in ("full", "delta")]
    counts = count_draws(monkeypatch, savers_machine, "event", "saver", machines)
    assert_floors(counts, MINIMUM, "saver machine: ")
