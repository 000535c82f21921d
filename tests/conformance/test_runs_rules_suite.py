"""Our run of the run store conformance suite, rule by rule."""

from runstore.conformance.test_runs_rules import *  # noqa: F403
