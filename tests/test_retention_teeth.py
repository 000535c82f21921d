"""The retention suite has teeth: it fails savers whose retention drops an interrupted
checkpoint's pending writes or a needed delta ancestor, or leaves a kept checkpoint
naming a removed parent, naming the contract (one child pytest, `tests/broken/teeth.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.broken.teeth import Case, Outcome, assert_caught, run_cases

pytestmark = pytest.mark.timeout(900)

R = "saver_retention.py"
CASES = [
    Case("broken-retention-writes", R, "keeps_resumes_and_delta or resume_after_retention",
         "retention keeps a kept checkpoint's pending writes"),
    Case("broken-retention-ancestor", R, "keeps_resumes_and_delta",
         "retention never deletes a needed delta ancestor"),
    Case("broken-retention-parent", R, "parent_went", "has no parent_config"),
]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    tmp: Path = tmp_path_factory.mktemp("retention-teeth")
    return run_cases("test_retention", CASES, tmp)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.backend)
def test_suite_fails_broken_retention(outcomes: dict[str, Outcome], case: Case) -> None:
    assert_caught(case, outcomes[case.backend])
