"""The rule areas of docs/rules.md have teeth: for each area a broken backend breaking one
rule fails the suite, its headline naming the rule (one child pytest per suite,
`tests/broken/teeth.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.broken.teeth import Case, Outcome, assert_caught, run_cases

pytestmark = pytest.mark.timeout(900)

S = "saver_rules.py"
SUITES: dict[str, list[Case]] = {
    "test_threads": [
        Case("broken-refusal-touches", S, "refused_for_a_stale_token",
             "contract: a refused write leaves the thread record as it was"),
        Case("broken-tombstone-listed", S, "deleted_thread_is_in_no_listing",
             "contract: a deleted thread is in no listing"),
        Case("broken-copy-keeps-tombstone", S, "copy_into_a_deleted_thread",
             "contract: copy_thread into a deleted thread starts its record again"),
    ],
    "test_fencing": [
        Case("broken-fence-root-only", S, "every_namespace",
             "contract: fencing: put in a subgraph namespace"),
    ],
    "test_retention": [
        Case("broken-closure-one-level", S, "reconstruction_closure",
             "retention keeps the whole reconstruction closure"),
        Case("broken-sweep-once", S, "swept_again",
             "an idle thread is swept again as max_age passes"),
        Case("broken-rescan-ignored", S, "rescan",
             "contract: rescan=True sweeps threads already swept"),
    ],
    "test_retention_claims": [
        Case("broken-sweep-claims", "saver_sweep_claims.py", "claim_holds",
             "contract: a sweep claim is exclusive"),
    ],
    "test_savers": [
        Case("broken-prefix-delete", S, "prefix_ids",
             "ids that are prefixes of other ids (or hold LIKE wildcards) name exactly one"),
        Case("broken-lenient-metadata", S, "unstorable_metadata",
             "contract: metadata no saver can store alike"),
        Case("broken-python-metadata", S, "json_form",
             "contract: metadata reads back in its JSON form"),
    ],
    "test_events": [
        Case("broken-events-prefix-delete", "events_rules.py", "prefix_ids",
             "ids that are prefixes of other ids (or hold LIKE wildcards) name exactly one"),
        Case("broken-owner-list-runs", "events_rules.py", "grouped_and_counting",
             "contract: owner_filter: list_runs counts only the owner's events"),
    ],
    "test_stream_lifetimes": [
        Case("broken-heartbeat-cadence", "streams_lifetimes.py", "heartbeats_only",
             "contract: a heartbeat only fills a silence of one interval"),
        Case("broken-run-id-stays-ended", "streams_lifetimes.py", "frees_its_run_id",
             "contract: a removed stream frees its run id"),
        Case("broken-ttl-from-first", "streams_lifetimes.py", "expires_after_stream_ttl",
             "stream_ttl_seconds counts from the last publish"),
        Case("broken-eager-position", "streams_lifetimes.py", "first_iterated",
             "contract: a subscription takes its position when it is first iterated"),
    ],
    "test_stream_data": [
        Case("broken-raw-data", "streams_raw_data.py", "one_json_form",
             "contract: stream data arrives in one JSON form on every bridge"),
    ],
}
CASES = [(suite, case) for suite, cases in SUITES.items() for case in cases]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    found: dict[str, Outcome] = {}
    for suite, cases in SUITES.items():
        tmp: Path = tmp_path_factory.mktemp(suite)
        found.update(run_cases(suite, cases, tmp, env={"RUNSTORE_CONFORMANCE_WAIT": "3"}))
    return found


@pytest.mark.parametrize(("suite", "case"), CASES, ids=lambda c: getattr(c, "backend", c))
def test_suite_fails_a_backend_breaking_one_rule(outcomes: dict[str, Outcome], suite: str, case: Case) -> None:
    assert_caught(case, outcomes[case.backend])
