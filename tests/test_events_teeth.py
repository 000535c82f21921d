"""The event store suite has teeth: it fails deliberately broken stores, naming the contract.

Every case's store runs in one child pytest (`tests/broken/teeth.py`), each on the suite
tests that must catch it, under the suite's default Hypothesis profile (derandomized;
without the shrink phase, which only minimizes a failure already found).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.broken.teeth import Case, Outcome, assert_caught, run_cases

# The first case waits for the child run of every case (a few minutes on a loaded machine).
pytestmark = pytest.mark.timeout(1800)

M = "events_mutants.py"
WALKS = "paging_walks"

CASES = [
    # Earlier broken stores, one module each.
    Case("broken-inclusive-cursor", "events_inclusive_cursor.py", "paging or state_machine",
         "contract: before_seq is exclusive"),
    Case("broken-unserialized", "events_unserialized_put_if_absent.py", "put_if_absent_race",
         "contract: put_if_absent is serialized"),
    Case("broken-batch-prefix", "events_batch_prefix.py", "all_or_nothing or bad_input",
         "contract: put_batch is all-or-nothing"),
    # paging
    Case("mut-events-by-run-after-inclusive", M, "run_paging",
         "list_messages_by_run pages one run's messages like list_messages"),
    Case("mut-events-by-run-ignores-before", M, "run_paging",
         "list_messages_by_run pages one run's messages like list_messages"),
    Case("mut-events-after-inclusive", M, WALKS, "after_seq is exclusive"),
    Case("mut-events-both-cursors-last-page", M, WALKS,
         "both cursors give the first `limit` messages strictly between"),
    Case("mut-events-no-cursor-oldest", M, WALKS, "without cursors list_messages gives the newest `limit` messages"),
    Case("mut-events-before-ignores-limit", M, WALKS, "a page holds at most `limit` messages"),
    Case("mut-events-pages-descending", M, WALKS, "ascending"),
    Case("mut-events-list-events-ignores-limit", M, "run_paging",
         "list_events gives the run's first `limit` events above after_seq"),
    Case("mut-events-list-events-limit-before-filter", M, "run_paging",
         "list_events applies event_types and task_id before the limit"),
    Case("mut-events-list-events-after-inclusive", M, "run_paging",
         "list_events gives the run's first `limit` events above after_seq (exclusive)"),
    Case("mut-events-list-events-task-ignored", M, "run_paging",
         "list_events applies event_types and task_id before the limit"),
    # lookups
    Case("mut-events-count-all-categories", M, "lookups_pick", "count_messages counts the thread's message events only"),
    Case("mut-events-find-latest-oldest", M, "lookups_pick", "NEWEST AI message event"),
    Case("mut-events-find-latest-any-type", M, "lookups_pick", "NEWEST AI message event"),
    Case("mut-events-last-visible-shows-hidden", M, "lookups_pick", "LAST visible AI message"),
    Case("mut-events-last-visible-first", M, "lookups_pick", "LAST visible AI message"),
    Case("mut-events-last-visible-empty-means-all", M, "lookups_pick", "with an empty run_ids returns {}"),
    Case("mut-events-message-seqs-latest", M, "lookups_pick", "EARLIEST message seq"),
    # deletes and seq
    Case("mut-events-seq-counter-survives-delete", M, "seq_after_deletes",
         "the next seq is the highest remaining seq + 1"),
    Case("mut-events-seq-from-count", M, "seq_after_deletes", "the next seq is the highest remaining seq + 1"),
    Case("mut-events-delete-keeps-absent-keys", M, "deletes_leave_no_index",
         "put_if_absent creates the run's (run_id, event_type) record again"),
    Case("mut-events-delete-keeps-identities", M, "deletes_leave_no_index",
         "get_message_seqs no longer finds the deleted messages"),
    Case("mut-events-delete-by-run-counts-messages", M, "deletes_leave_no_index",
         "delete_by_run returns how many events (every category)"),
    Case("mut-events-put-if-absent-per-run", M, "deletes_leave_no_index",
         "one record per (thread_id, run_id, event_type)"),
]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    tmp: Path = tmp_path_factory.mktemp("events-teeth")
    return run_cases("test_events", CASES, tmp)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.backend)
def test_suite_fails_broken_event_store(outcomes: dict[str, Outcome], case: Case) -> None:
    assert_caught(case, outcomes[case.backend])
