"""Our run of the no-lock-in group on the built-in backends and the reference peers."""

from runstore.conformance.test_portability import *  # noqa: F403
