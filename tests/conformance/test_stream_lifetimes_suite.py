"""Our run of the stream lifetime conformance suite (memory and redis by default)."""

from runstore.conformance.test_stream_lifetimes import *  # noqa: F403
