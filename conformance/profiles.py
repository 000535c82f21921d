"""Hypothesis settings profiles for the suite.

``runstore-ci`` is the default everywhere (``runstore check``, ``pytest
--runstore-backend``, locally and under CI): derandomized, so the same backend gets
the same verdict on every run, with no example database to replay old failures from.
A derandomized run's examples are a fixed function of each test (Hypothesis seeds it
from the test itself), so a failure shown once is shown again by the same command.
``runstore-dev`` draws new examples each run (and keeps failing ones in the example
database) and ``runstore-nightly`` draws many more: use them to explore, not to gate.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

_SUPPRESS = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large]
#: Every profile: one failure per test, whose headline names its contract (several
#: distinct failures would surface as an ExceptionGroup that names none).
_COMMON: dict[str, object] = {
    "deadline": None,
    "suppress_health_check": _SUPPRESS,
    "print_blob": True,
    "report_multiple_bugs": False,
}

#: The profile used when none is named: deterministic, for a verdict CI can gate on.
DEFAULT_PROFILE = "runstore-ci"


def register_profiles() -> None:
    """Register the three profiles (idempotent)."""
    settings.register_profile(
        "runstore-dev",
        max_examples=30,
        stateful_step_count=30,
        # Said outright: under CI Hypothesis's own default derandomizes, and a profile
        # registered without this would inherit that and stop exploring.
        derandomize=False,
        **_COMMON,  # type: ignore[arg-type]
    )
    settings.register_profile(
        "runstore-ci",
        max_examples=30,
        stateful_step_count=30,
        derandomize=True,
        database=None,
        **_COMMON,  # type: ignore[arg-type]
    )
    settings.register_profile(
        "runstore-nightly",
        max_examples=500,
        stateful_step_count=100,
        derandomize=False,
        **_COMMON,  # type: ignore[arg-type]
    )
