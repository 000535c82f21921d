"""Our run of the retention sweep-claim conformance suite."""

from runstore.conformance.test_retention_claims import *  # noqa: F403
