"""Our run of the thread index and retention conformance suites."""

from runstore.conformance.test_threads import *  # noqa: F403
