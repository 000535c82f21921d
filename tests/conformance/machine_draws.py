"""Count what a conformance state machine labels with `hypothesis.event` over one run of
the default profile (as `runstore check` runs it), for the draws tests."""

from __future__ import annotations

import collections
from typing import Any

import pytest
from hypothesis import settings

from runstore.capabilities import Kind
from runstore.conformance.harness import BackendTarget, spec_for
from runstore.conformance.machines import run_machine
from runstore.conformance.profiles import DEFAULT_PROFILE, register_profiles
from runstore.urls import BackendURL


def count_draws(
    monkeypatch: pytest.MonkeyPatch, module: Any, name: str, kind: str, machines: list[Any], url: str = "memory://"
) -> collections.Counter[str]:
    """Run each of ``machines`` once on ``url`` under the default profile and count the
    labels it passes to ``module.name`` (its `hypothesis.event`)."""
    counts: collections.Counter[str] = collections.Counter()

    def count(label: Any, payload: Any = "") -> None:
        counts[str(label)] += 1

    monkeypatch.setattr(module, name, count)
    register_profiles()
    profile = settings.get_profile(DEFAULT_PROFILE)
    parsed = BackendURL.parse(url)
    spec = spec_for(Kind(kind), parsed)
    assert spec is not None
    target: BackendTarget[Any] = BackendTarget(kind=Kind(kind), spec=spec, url=parsed, named_url=parsed)
    for machine in machines:
        run_machine(
            target, machine, max_examples=profile.max_examples,
            stateful_step_count=profile.stateful_step_count, derandomize=profile.derandomize, database=None,
        )  # fmt: skip
    return counts


def assert_floors(counts: collections.Counter[str], minimum: dict[str, int], prefix: str = "") -> None:
    """Every label of ``minimum`` (after ``prefix``) was drawn at least that often."""
    starved = {label: counts[prefix + label] for label, least in minimum.items() if counts[prefix + label] < least}
    assert not starved, f"transitions drawn less than {minimum} per run: {starved}\nall draws: {dict(counts)}"
