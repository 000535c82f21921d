"""Our run of the stream bridge fencing conformance suite (memory and redis by default)."""

from runstore.conformance.test_stream_fencing import *  # noqa: F403
