"""The suite's Hypothesis state machines, for third parties to run and subclass.

Each machine drives one backend kind with random operations and checks every answer,
and the whole store after every step, against a plain-dict model:

- `SaverMachine` (checkpoint savers; ``mode = "full"`` or ``"delta"``) and
  `ThreadIndexSaverMachine` (the same, plus the thread index, for savers declaring it),
- `EventStoreMachine` (run event stores),
- `RunStoreMachine` (run stores),
- `StoreMachine` (long-term memory stores),
- `HistoryCacheMachine` (delta-history cache backends; its backend is ``self.cache``).

A machine is built with a `runstore.conformance.harness.BackendSession` (from
``target.session()``); its backend is ``self.saver`` or ``self.store``, the target
(for ``has(capability)``) ``self.target``, and ``self.session.run(awaitable)`` runs a
call on the backend's event loop. `run_machine` runs one as a test. A subclass keeps
every rule and invariant of its base and adds its own, for example a backend-specific
operation after which the base's invariants must still hold::

    from typing import Any

    from hypothesis import strategies as st
    from hypothesis.stateful import rule

    from runstore.conformance.machines import EventStoreMachine, run_machine


    class AcmeEventStoreMachine(EventStoreMachine):
        @rule(t=st.integers(0, 1))
        def compact(self, t: int) -> None:
            # Compaction must change no answer: the model stays as it is.
            self.session.run(self.store.compact(self.threads[t]))


    def test_acme_machine(events_target: Any) -> None:
        run_machine(events_target, AcmeEventStoreMachine)

The machines' attributes and helpers other than those named above may change between
runstore releases; rules added by a subclass should read the backend and the model
(``self.model``) only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from .events_machine import EventStoreMachine
from .harness import BackendSession, BackendTarget
from .history_cache_machine import HistoryCacheMachine
from .runs_machine import RunStoreMachine
from .savers_machine import SaverMachine, ThreadIndexSaverMachine
from .store_machine import StoreMachine

__all__ = [
    "EventStoreMachine", "HistoryCacheMachine", "RunStoreMachine", "SaverMachine", "StoreMachine", "ThreadIndexSaverMachine", "run_machine",
]


def run_machine(
    target: BackendTarget[Any],
    machine: Callable[[BackendSession[Any]], RuleBasedStateMachine],
    **overrides: Any,
) -> None:
    """Run ``machine`` (a machine class, or any callable taking a session) as a test on
    ``target``, on one session for every example, under the active Hypothesis profile with
    ``overrides`` (Hypothesis settings such as ``stateful_step_count=50``) applied."""
    with target.session() as session:
        # A factory: hypothesis's parameter is named for one, though annotated as a class.
        run_state_machine_as_test(
            lambda: machine(session),  # type: ignore[arg-type]
            settings=settings(suppress_health_check=list(HealthCheck), **overrides),
        )
