"""The run store suite has teeth: it fails deliberately broken stores, naming the contract.

Every case's store runs in one child pytest (`tests/broken/teeth.py`), each on the suite
tests that must catch it, under the suite's default Hypothesis profile (derandomized;
without the shrink phase, which only minimizes a failure already found).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.broken.teeth import Case, Outcome, assert_caught, run_cases

pytestmark = pytest.mark.timeout(1800)

CLAIM = "claim_race_in_one_process or claim_takes_only"

CASES = [
    Case("broken-check-then-insert", "runs_check_then_insert.py", "reject_race",
         "contract: create with reject is atomic"),
    # A claim without a condition on the lease breaks two contracts; each is named.
    Case("broken-unconditional-claim", "runs_unconditional_claim.py", CLAIM,
         "contract: claim_expired takes only runs whose lease ended"),
    Case("broken-unconditional-claim", "runs_unconditional_claim.py", CLAIM,
         "contract: each expired run is claimed by exactly one claimer"),
    Case("broken-ignores-cancel", "runs_finalize_ignores_cancel.py", "finalize_needs",
         "contract: finalize refuses any status but cancelled/interrupted while a cancel"),
    # The state machine's rare transitions: a claim where two leases ended at one instant,
    # and an owner repeating what it holds (start, heartbeat, finalize with its status).
    Case("broken-claim-whole-tie", "runs_rules.py", "state_machine",
         "exactly min(limit, claimable) of them (equal expiry times in any order, limit may cut"),
    Case("broken-restart-regrants", "runs_rules.py", "state_machine",
         "returns the run unchanged (same lease end, same token)"),
    Case("broken-heartbeat-noop", "runs_rules.py", "state_machine",
         "under its live lease extends it to now + "),
    Case("broken-refinalize-refuses", "runs_rules.py", "state_machine",
         "returns the stored run unchanged (the first call's stop_reason and error)"),
]

R = "runs_rules.py"
RULE_CASES = [
    Case("broken-renew-at-expiry", R, "boundaries",
         "contract: a lease is over at exactly lease_expires_at: a renewal at that instant fails"),
    Case("broken-claim-strict-cutoff", R, "boundaries",
         "contract: claim_expired takes a lease that ended exactly grace seconds ago"),
    Case("broken-refinalize-overwrites", R, "stays_finished",
         "(anything but its owner repeating its status) is refused"),
    Case("broken-list-ignores-limit", R, "list_by_thread_arguments",
         "at most limit of them (filter first)"),
    Case("broken-list-first-status", R, "list_by_thread_arguments",
         "contract: list_by_thread({'status': ['pending', 'success']})"),
    Case("broken-shared-metadata", R, "records_are_copies",
         "contract: a run store keeps its own copy of the metadata given to create"),
]

#: A correct store that claims equal expiry times in another order: the suite must pass it.
TIES = Case("ties-descending", R, "state_machine or claim", "")
RULE_TIES = Case("ties-descending", R, "ties_in_any_order or boundaries", "")


@pytest.fixture(scope="module")
def rule_outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    tmp: Path = tmp_path_factory.mktemp("runs-rules-teeth")
    return run_cases("test_runs_rules", [*RULE_CASES, RULE_TIES], tmp)


@pytest.mark.parametrize("case", RULE_CASES, ids=lambda c: c.backend)
def test_suite_fails_run_store_breaking_a_rule(rule_outcomes: dict[str, Outcome], case: Case) -> None:
    assert_caught(case, rule_outcomes[case.backend])


@pytest.mark.parametrize("suite", ["test_runs", "test_runs_rules"])
def test_suite_passes_a_store_that_breaks_ties_differently(
    outcomes: dict[str, Outcome], rule_outcomes: dict[str, Outcome], suite: str
) -> None:
    outcome = (outcomes if suite == "test_runs" else rule_outcomes)[TIES.backend]
    assert outcome.tests, "no test ran on the tie-breaking store"
    assert not outcome.failures(), f"the suite failed a correct store (ties in another order): {outcome.failures()}"


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    tmp: Path = tmp_path_factory.mktemp("runs-teeth")
    return run_cases("test_runs", [*CASES, TIES], tmp)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.backend}:{c.contract[10:40]}")
def test_suite_fails_broken_run_store(outcomes: dict[str, Outcome], case: Case) -> None:
    assert_caught(case, outcomes[case.backend])
