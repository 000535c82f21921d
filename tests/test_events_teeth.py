"""The event store suite has teeth: it fails deliberately broken stores, naming the contract."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

BROKEN = Path(__file__).parent / "broken"

CASES = {
    "inclusive-cursor": (
        "broken-inclusive-cursor://",
        "events_inclusive_cursor.py",
        "paging or state_machine",
        "contract: before_seq is exclusive",
    ),
    "unserialized-put-if-absent": (
        "broken-unserialized://",
        "events_unserialized_put_if_absent.py",
        "put_if_absent_race",
        "contract: put_if_absent is serialized",
    ),
    "batch-prefix": (
        "broken-batch-prefix://",
        "events_batch_prefix.py",
        "all_or_nothing or bad_input",
        "contract: put_batch is all-or-nothing",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_suite_fails_broken_event_store(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    monkeypatch.setenv("CI", "true")  # the derandomized runstore-ci profile
    url, plugin, selection, contract = CASES[case]
    result = pytester.runpytest_subprocess(
        "--pyargs", "runstore.conformance",
        "-p", "no:cacheprovider",
        "--runstore-backend", url,
        "--runstore-plugin", str(BROKEN / plugin),
        "-k", f"test_events and ({selection})",
    )
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) >= 1, f"the suite passed a broken store ({case})"
    assert contract in result.stdout.str(), f"the failure output does not name {contract!r}"


def test_suite_passes_the_memory_store(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control: the same selections pass on the correct memory store."""
    monkeypatch.setenv("CI", "true")
    selection = " or ".join(f"({c[2]})" for c in CASES.values())
    result = pytester.runpytest_subprocess(
        "--pyargs", "runstore.conformance",
        "-p", "no:cacheprovider",
        "--runstore-backend", "memory://",
        "-k", f"test_events and ({selection})",
    )
    assert result.parseoutcomes().get("failed", 0) == 0
    assert result.parseoutcomes().get("passed", 0) >= 5
