"""Our run of the event-store fencing conformance suite."""

from runstore.conformance.test_event_fencing import *  # noqa: F403
