"""Our run of the long-term memory store conformance suite (every default backend serving the store kind)."""

from runstore.conformance.test_store import *  # noqa: F403
