"""The fencing suites have teeth: they fail savers that ignore the token or check it apart
from the write, event stores that check it apart from the append or ignore a grant's
fence, and stream bridges that let a stale publish or END through, naming the contract
(one child pytest per suite, `tests/broken/teeth.py`)."""

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
    Case("broken-fence-thread-ignored", "events_fence_thread_ignored.py", "grant_fences_the_thread",
         "fencing: put after fence_thread with a newer token carrying a stale token is refused"),
]

S = "streams_fencing.py"
STREAM_CASES = [
    Case("broken-stream-fence-ignored", S, "grant_fences_the_run",
         "fencing: a publish after fence_stream with a newer token carrying a stale token is refused"),
    Case("broken-stream-stale-end", S, "grant_fences_the_run",
         "fencing: a stale END (publish_end) carrying a stale token is refused"),
    Case("broken-stream-float-fence", S, "fence_stream_rules",
         "fencing: a publish one below the newest token at 2**63-1 carrying a stale token is refused"),
    Case("broken-stream-check-then-publish", S, "fence_race_in_one_process",
         "fencing: no publish of a stale token lands after the newer grant"),
]


@pytest.fixture(scope="module")
def stream_outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    tmp: Path = tmp_path_factory.mktemp("stream-fencing-teeth")
    return run_cases("test_stream_fencing", STREAM_CASES, tmp, env={"RUNSTORE_CONFORMANCE_WAIT": "2"})


@pytest.mark.parametrize("case", STREAM_CASES, ids=lambda c: c.backend)
def test_suite_fails_broken_fenced_stream_bridge(stream_outcomes: dict[str, Outcome], case: Case) -> None:
    assert_caught(case, stream_outcomes[case.backend])


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
