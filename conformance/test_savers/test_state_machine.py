"""Random saver operations against the plain-dict model (`runstore.conformance.machines`).
"""

from __future__ import annotations

from typing import Any

import pytest

from ..machines import SaverMachine, run_machine


@pytest.mark.parametrize("mode", ["full", "delta"])
def test_state_machine_matches_model(saver_target: Any, mode: str) -> None:
    """Random saver operations (full or delta mode) agree with a plain-dict model."""
    run_machine(saver_target, type(f"SaverMachine_{mode}", (SaverMachine,), {"mode": mode}))
