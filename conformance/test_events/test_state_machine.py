"""Random event store operations against the plain-dict model (`runstore.conformance.machines`).
"""

from __future__ import annotations

from typing import Any

import pytest

from ..machines import EventStoreMachine, run_machine

pytestmark = pytest.mark.runstore_contract("run event store")


def test_state_machine_matches_model(events_target: Any) -> None:
    """Random put/put_batch/put_if_absent/reads/deletes agree with a plain-dict model."""
    run_machine(events_target, EventStoreMachine)
