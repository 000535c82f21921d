"""Our run of the fenced-write conformance suite."""

from runstore.conformance.test_fencing import *  # noqa: F403
