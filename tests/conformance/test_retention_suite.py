"""Our run of the retention conformance suite."""

from runstore.conformance.test_retention import *  # noqa: F403
