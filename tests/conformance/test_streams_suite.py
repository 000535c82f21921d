"""Our run of the stream bridge conformance suite (memory and redis by default)."""

from runstore.conformance.test_streams import *  # noqa: F403
