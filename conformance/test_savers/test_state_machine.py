"""Random saver operations against the plain-dict model (`runstore.conformance.machines`).
"""

from __future__ import annotations

from typing import Any

import pytest

from ..machines import SaverMachine, ThreadIndexSaverMachine, run_machine


@pytest.mark.parametrize("mode", ["full", "delta"])
def test_state_machine_matches_model(saver_target: Any, mode: str) -> None:
    """Random saver operations (full or delta mode) agree with a plain-dict model; with
    ``thread_index``, so do the thread records, also after refused writes."""
    base = ThreadIndexSaverMachine if saver_target.has("thread_index") else SaverMachine
    run_machine(saver_target, type(f"{base.__name__}_{mode}", (base,), {"mode": mode}))
