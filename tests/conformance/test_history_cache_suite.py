"""Our run of the delta-history cache conformance suite (every default backend serving the history_cache kind)."""

from runstore.conformance.test_history_cache import *  # noqa: F403
