"""The suite's layout: suites split by contract area still count as one suite, and
`runstore.conformance.machines` exports every state machine, subclassable."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import Phase
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

import runstore.conformance
from runstore.conformance import machines
from runstore.conformance.events_model import core, fresh_id
from runstore.conformance.machines import EventStoreMachine, run_machine
from runstore.conformance.plugin import _short_ids
from runstore.conformance.session import SUITE_ROOT, suite_module

SPLIT = SUITE_ROOT / "test_savers" / "test_list.py"


def test_a_split_suite_is_named_by_its_package() -> None:
    assert suite_module(SPLIT) == "test_savers"
    assert suite_module(SUITE_ROOT / "test_runs.py") == "test_runs"
    # Only the suite's own packages: a project's tests are named by their file.
    assert suite_module(Path("/elsewhere/test_savers/test_list.py")) == "test_list"


def test_declared_xfails_match_a_split_suite_by_module_or_by_suite() -> None:
    item = SimpleNamespace(path=SPLIT, nodeid="../x/test_savers/test_list.py::test_list_filter_before_limit[sqlite]")
    assert _short_ids(item) == [  # type: ignore[arg-type]
        "test_savers/test_list.py::test_list_filter_before_limit[sqlite]",
        "test_savers.py::test_list_filter_before_limit[sqlite]",
    ]
    flat = SimpleNamespace(path=SUITE_ROOT / "test_runs.py", nodeid="test_runs.py::test_x[sqlite]")
    assert _short_ids(flat) == ["test_runs.py::test_x[sqlite]"]  # type: ignore[arg-type]


def test_every_split_suite_is_star_importable_whole() -> None:
    for suite in ("test_savers", "test_events"):
        package = importlib.import_module(f"runstore.conformance.{suite}")
        exported = {name for name in vars(package) if name.startswith("test_") and callable(getattr(package, name))}
        defined = {
            name
            for info in pkgutil.iter_modules(package.__path__, f"{package.__name__}.")
            for name, obj in vars(importlib.import_module(info.name)).items()
            if name.startswith("test_") and inspect.isfunction(obj)
        }
        assert defined and exported == defined, f"{suite}: {sorted(defined ^ exported)}"


def _suite_modules() -> list[Any]:
    package = runstore.conformance
    found = []
    for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
        if info.name.rsplit(".", 1)[-1] in ("plugin", "report"):
            continue  # pytest plugins: importing them registers nothing we look for
        found.append(importlib.import_module(info.name))
    return found


def test_machines_exports_every_state_machine_of_the_suite() -> None:
    defined = {
        obj
        for module in _suite_modules()
        for _, obj in inspect.getmembers(module, inspect.isclass)
        if issubclass(obj, RuleBasedStateMachine)
        and obj is not RuleBasedStateMachine
        and obj.__module__ == module.__name__
    }
    exported = {getattr(machines, name) for name in machines.__all__ if inspect.isclass(getattr(machines, name))}
    assert defined == exported, (
        f"state machines not exported by runstore.conformance.machines: "
        f"{sorted(c.__qualname__ for c in defined - exported)}"
    )
    assert {c.__name__ for c in exported} == {
        "SaverMachine", "ThreadIndexSaverMachine", "EventStoreMachine", "RunStoreMachine", "StoreMachine",
        "HistoryCacheMachine",
    }


class _CountingMachine(EventStoreMachine):
    """A third party's subclass: one more rule, which keeps the model in step."""

    steps = 0

    # Text every store accepts: no NUL, no lone surrogate (those are bad input, refused).
    @rule(
        t=st.integers(0, 1),
        content=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=5),
    )
    def put_lifecycle(self, t: int, content: str) -> None:
        type(self).steps += 1
        record = self.session.run(
            self.store.put(thread_id=self.threads[t], run_id="run-sub", event_type="sub.step",
                           category="lifecycle", content=content, user_id=None)
        )
        self.model[self.threads[t]].add(core(record))


class _ForgetfulMachine(EventStoreMachine):
    """A subclass whose rule writes a message the model does not know of."""

    @rule(t=st.integers(0, 1))
    def put_unmodelled(self, t: int) -> None:
        self.session.run(
            self.store.put(thread_id=self.threads[t], run_id="run-x", event_type="ai_message",
                           category="message", content={"type": "ai", "id": fresh_id()}, user_id=None)
        )


def _memory_only(events_target: Any) -> None:
    if events_target.name != "memory":
        pytest.skip("the machines' subclassing is a property of the suite, not of a backend")


def test_a_subclass_runs_its_rules_with_the_base_rules(events_target: Any) -> None:
    _memory_only(events_target)
    _CountingMachine.steps = 0
    run_machine(events_target, _CountingMachine)
    assert _CountingMachine.steps > 0, "the subclass's rule never ran"


def test_a_subclass_keeps_the_base_invariants(events_target: Any) -> None:
    _memory_only(events_target)
    with pytest.raises(AssertionError, match="contract: "):
        # Found is enough: shrinking would only make the failure smaller.
        run_machine(events_target, _ForgetfulMachine, phases=[Phase.explicit, Phase.generate])
