"""Our run of the checkpoint saver conformance suite (backends from tests/conftest.py)."""

from runstore.conformance.test_savers import *  # noqa: F403
