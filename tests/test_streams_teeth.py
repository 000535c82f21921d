"""The stream bridge suite has teeth: it fails deliberately broken bridges, naming the contract.

Every case's bridge runs in one child pytest (`tests/broken/teeth.py`), each on the
suite tests that must catch it, under the suite's default Hypothesis profile.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.broken.teeth import Case, Outcome, assert_caught, run_cases

# The first case waits for the child run of every case (a few minutes on a loaded machine).
pytestmark = pytest.mark.timeout(1800)

MUTANTS = "streams_mutants.py"

CASES = [
    Case("broken-drop-end", "streams_drop_end.py", "end_survives", "END survives a full buffer"),
    Case("broken-skip-evicted", "streams_skip_evicted.py", "gap", "a StreamGap"),
    Case("broken-ignore-heartbeat", "streams_ignore_heartbeat_override.py", "heartbeat_override",
         "contract: the per-subscription heartbeat override applies"),
    Case("broken-any-run-id", "streams_lenient_input.py", "run_id_must",
         "contract: a run id is a non-empty string"),
    Case("broken-nan-to-null", "streams_lenient_input.py", "nan_and_infinity",
         "contract: NaN and Infinity in data are an InvalidStreamInputError"),
    Case("mut-streams-exists-for-waiting-subscriber", MUTANTS, "stream_exists_and_cleanup",
         "stream_exists is false for a run that only has a subscriber waiting"),
    Case("mut-streams-exists-after-subscriber-left", MUTANTS, "stream_exists_and_cleanup",
         "a subscriber that stops waiting for a run that never started leaves no stream"),
    Case("mut-streams-trusts-future-cursor", MUTANTS, "cursor_newer_than_newest",
         "a cursor newer than the newest event"),
    Case("mut-streams-never-heartbeats", MUTANTS, "heartbeat or malformed_cursor or newer_than_newest",
         "an idle subscription yields HEARTBEAT", misleading=("malformed cursor", "newer than the newest")),
    Case("mut-streams-gap-without-cursor", MUTANTS, "older_than_window",
         "(requested, earliest and latest available ids)"),
    Case("mut-streams-cursor-inclusive", MUTANTS, "replay_from_every_cursor",
         "resumes right after itself"),
    Case("mut-streams-malformed-cursor-replays", MUTANTS, "malformed_cursor",
         "starts at the live tail: no replay"),
    Case("mut-streams-delayed-cleanup-silent", MUTANTS, "cleanup_with_delay",
         "removed by a delayed cleanup gets END"),
    Case("mut-streams-cleanup-delay-first-wins", MUTANTS, "cleanup_with_delay",
         "cleanup(delay=0.1) removes the stream after the delay"),
]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    # A broken bridge makes the suite wait for what never comes; keep that wait short.
    tmp: Path = tmp_path_factory.mktemp("streams-teeth")
    return run_cases("test_streams", CASES, tmp, env={"RUNSTORE_CONFORMANCE_WAIT": "2"})


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.backend)
def test_suite_fails_broken_stream_bridge(outcomes: dict[str, Outcome], case: Case) -> None:
    assert_caught(case, outcomes[case.backend])
