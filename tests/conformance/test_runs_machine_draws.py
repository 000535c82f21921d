"""The run store state machine draws its rare transitions often enough to find a bug in
the default profile: counted over one run of it (as `runstore check` runs it) on the
memory store. The default profile is derandomized, so the counts are the same every run;
a change to the machine that starves a transition fails here, naming it.
"""

from __future__ import annotations

import collections
from typing import Any

import pytest
from hypothesis import settings

import runstore.conformance.runs_machine as runs_machine
from runstore.capabilities import Kind
from runstore.conformance.harness import BackendTarget, spec_for
from runstore.conformance.machines import RunStoreMachine, run_machine
from runstore.conformance.profiles import DEFAULT_PROFILE, register_profiles
from runstore.urls import BackendURL

#: The fewest draws per run of the machine (labels as `runs_machine` reports them).
MINIMUM = {
    "start: two leases ending at one instant": 10,
    "a claim with a tie among the claimable runs": 5,
    "owner repeats itself: start": 3,
    "owner repeats itself: renew": 3,
    "owner repeats itself: finalize": 3,
    "finalize again (another worker, other status): RunFinishedError": 3,
    "boundary: expiry +0 s": 1,
}


def _label(label: str) -> str:
    if label.startswith("claim") and "(a tie)" in label:
        return "a claim with a tie among the claimable runs"
    return label


def test_the_machine_draws_ties_and_repeats_in_the_default_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    counts: collections.Counter[str] = collections.Counter()

    def count(label: Any, payload: Any = "") -> None:
        counts[_label(str(label))] += 1

    monkeypatch.setattr(runs_machine, "event", count)
    register_profiles()
    profile = settings.get_profile(DEFAULT_PROFILE)
    url = BackendURL.parse("memory://")
    spec = spec_for(Kind("runs"), url)
    assert spec is not None
    target: BackendTarget[Any] = BackendTarget(kind=Kind("runs"), spec=spec, url=url, named_url=url)
    run_machine(
        target, RunStoreMachine, max_examples=profile.max_examples,
        stateful_step_count=profile.stateful_step_count, derandomize=profile.derandomize, database=None,
    )  # fmt: skip
    starved = {label: counts[label] for label, least in MINIMUM.items() if counts[label] < least}
    assert not starved, f"transitions drawn less than {MINIMUM} per run: {starved}\nall draws: {dict(counts)}"
