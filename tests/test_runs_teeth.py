"""The run store suite has teeth: it fails deliberately broken stores, naming the contract."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

BROKEN = Path(__file__).parent / "broken"

CASES = {
    "check-then-insert": (
        "broken-check-then-insert://",
        "runs_check_then_insert.py",
        "reject_race",
        ("contract: create with reject is atomic",),
    ),
    "unconditional-claim": (
        "broken-unconditional-claim://",
        "runs_unconditional_claim.py",
        "claim_race_in_one_process or claim_takes_only",
        (
            "contract: claim_expired takes only runs whose lease ended",
            "contract: each expired run is claimed by exactly one claimer",
        ),
    ),
    "finalize-ignores-cancel": (
        "broken-ignores-cancel://",
        "runs_finalize_ignores_cancel.py",
        "finalize_needs",
        ("contract: finalize refuses any status but cancelled/interrupted while a cancel",),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_suite_fails_broken_run_store(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    monkeypatch.setenv("CI", "true")  # the derandomized runstore-ci profile
    url, plugin, selection, contracts = CASES[case]
    result = pytester.runpytest_subprocess(
        "--pyargs", "runstore.conformance",
        "-p", "no:cacheprovider",
        "--runstore-backend", url,
        "--runstore-plugin", str(BROKEN / plugin),
        "-k", f"test_runs and ({selection})",
    )
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) >= 1, f"the suite passed a broken store ({case})"
    for contract in contracts:
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
        "-k", f"test_runs and ({selection})",
    )
    assert result.parseoutcomes().get("failed", 0) == 0
    assert result.parseoutcomes().get("passed", 0) >= 3
