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
]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    tmp: Path = tmp_path_factory.mktemp("runs-teeth")
    return run_cases("test_runs", CASES, tmp)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.backend}:{c.contract[10:40]}")
def test_suite_fails_broken_run_store(outcomes: dict[str, Outcome], case: Case) -> None:
    assert_caught(case, outcomes[case.backend])
