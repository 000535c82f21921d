"""Our run of the run store conformance suite (memory, sqlite, postgres by default)."""

from runstore.conformance.test_runs import *  # noqa: F403
