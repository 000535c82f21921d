"""The fencing suites have teeth: they fail savers that ignore the token or check it apart
from the write, and an event store that checks it apart from the append, naming the
contract (one child pytest per suite, `tests/broken/teeth.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.broken.teeth import Case, Outcome, assert_caught, run_cases

pytestmark = pytest.mark.timeout(900)

F = "saver_fencing.py"
CASES = [
    Case("broken-fence-ignored", F, "stale_token_is_refused",
         "fencing: put carrying a stale token is refused with StaleFenceError"),
    Case("broken-fence-check-then-write", F, "fence_race_in_one_process",
         "fencing: no write carrying a stale token lands after a newer token was written"),
]


EVENT_CASES = [
    Case("broken-fence-check-then-append", "events_fence_check_then_append.py",
         "fence_race_in_one_process",
         "fencing: no append carrying a stale token lands after a newer token was written"),
]


@pytest.fixture(scope="module")
def event_outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    tmp: Path = tmp_path_factory.mktemp("event-fencing-teeth")
    return run_cases("test_event_fencing", EVENT_CASES, tmp)


@pytest.mark.parametrize("case", EVENT_CASES, ids=lambda c: c.backend)
def test_suite_fails_broken_fenced_event_store(event_outcomes: dict[str, Outcome], case: Case) -> None:
    assert_caught(case, event_outcomes[case.backend])


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    tmp: Path = tmp_path_factory.mktemp("fencing-teeth")
    return run_cases("test_fencing", CASES, tmp)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.backend)
def test_suite_fails_broken_fenced_saver(outcomes: dict[str, Outcome], case: Case) -> None:
    assert_caught(case, outcomes[case.backend])
