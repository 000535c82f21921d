"""Our run of the stream bridge conformance suite, data part."""

from runstore.conformance.test_stream_data import *  # noqa: F403
