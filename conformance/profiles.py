"""Hypothesis settings profiles for the suite: ``runstore-dev``, ``runstore-ci``, ``runstore-nightly``."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

_SUPPRESS = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large]


def register_profiles() -> None:
    """Register the three profiles (idempotent)."""
    settings.register_profile(
        "runstore-dev",
        max_examples=25,
        stateful_step_count=25,
        deadline=None,
        suppress_health_check=_SUPPRESS,
        print_blob=True,
    )
    settings.register_profile(
        "runstore-ci",
        max_examples=30,
        stateful_step_count=30,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=_SUPPRESS,
        print_blob=True,
    )
    settings.register_profile(
        "runstore-nightly",
        max_examples=500,
        stateful_step_count=100,
        deadline=None,
        suppress_health_check=_SUPPRESS,
        print_blob=True,
    )
