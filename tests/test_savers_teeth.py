"""The saver conformance suite has teeth: it fails deliberately broken savers, naming the
contract each one breaks.

Every case's saver runs in one child pytest (`tests/broken/teeth.py`), each on the suite
tests that must catch it, under the suite's default Hypothesis profile (derandomized;
without the shrink phase, which only minimizes a failure already found).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.broken.teeth import Case, Outcome, assert_caught, run_cases

# The first case waits for the child run of every case (a few minutes on a loaded machine).
pytestmark = pytest.mark.timeout(1800)

M = "saver_mutants.py"
MACHINE = "state_machine"

CASES = [
    # Earlier broken savers, one module each.
    Case("broken-id-order", "saver_id_order.py", "fork_sees_no_sibling or delta_history_parity or graph_parity",
         "a fork never sees a sibling branch's writes"),
    Case("broken-carry-forward", "saver_carry_forward.py", "tree_get_tuple",
         "a value is never carried forward from an older version"),
    Case("broken-naive-prune", "saver_naive_prune.py", "prune_keep_latest",
         "prune keep_latest keeps what delta reconstruction needs"),
    Case("broken-unsorted-writes", "saver_unsorted_writes.py", "put_writes_idempotent",
         "pending_writes in writes_sort_key order"),
    # list
    Case("mut-saver-list-ignores-limit", M, "list_filter_before_limit", "limit caps the newest-first result"),
    Case("mut-saver-list-limit-before-filter", M, "list_filter_before_limit", "list filters by metadata equality"),
    Case("mut-saver-list-filter-ignored", M, "list_filter_before_limit", "filter",
         misleading=("ExceptionGroup",)),
    Case("mut-saver-list-before-inclusive", M, "list_filter_before_limit", "before is exclusive"),
    Case("mut-saver-list-write-order", M, "roundtrip", "the highest checkpoint id, not the last written"),
    Case("mut-saver-list-all-namespaces", M, "namespaces_are_independent",
         "list with checkpoint_ns lists that namespace only"),
    # get / put
    Case("mut-saver-returned-config-drops-ns", M, "namespaces_are_independent",
         "put returns the config of the stored checkpoint, with its thread_id and checkpoint_ns"),
    Case("mut-saver-parent-config-drops-ns", M, "namespaces_are_independent",
         "parent_config names the parent in the same checkpoint_ns"),
    Case("mut-saver-versions-by-reference", M, "isolated_from_callers",
         "stored channel_versions are isolated from the caller's objects", misleading=("KeyError",)),
    Case("mut-saver-values-skip-serde", M, "saver_serde", "channel values are serialized with saver.serde"),
    Case("mut-saver-writes-skip-serde", M, "saver_serde", "pending-write values are serialized with saver.serde"),
    Case("mut-saver-serde-bound-at-open", M, "saver_serde", "read at call time"),
    Case("mut-saver-next-version-not-increasing", M, "roundtrip",
         "get_next_version returns a version greater than the current one"),
    # writes
    Case("mut-saver-writes-last-wins", M, "put_writes_idempotent", "put_writes is first-write-wins per"),
    # deletes, copies, prune
    Case("mut-saver-delete-thread-leaves-writes", M, "test_delete_thread",
         "delete_thread deletes the thread's pending writes"),
    Case("mut-saver-delete-thread-leaves-blobs", M, "test_delete_thread",
         "delete_thread deletes the thread's channel values"),
    Case("mut-saver-delete-thread-root-ns-only", M, "namespaces_are_independent",
         "delete_thread removes every namespace of the thread"),
    Case("mut-saver-copy-shares-writes", M, "copy_thread_copies_whole_chain",
         "a write on the copy never shows up on the source"),
    Case("mut-saver-copy-root-ns-only", M, MACHINE, "copy_thread copies every checkpoint of every namespace"),
    Case("mut-saver-copy-without-writes", M, "copy_thread", "copy_thread copies every pending write"),
    Case("mut-saver-prune-root-ns-only", M, MACHINE, "prune (keep_latest) keeps, per namespace of every thread"),
    Case("mut-saver-prune-first-thread-only", M, MACHINE, "prune (keep_latest) keeps, per namespace of every thread"),
    Case("mut-saver-prune-unknown-strategy", M, "prune_keep_latest", "an unknown prune strategy raises ValueError"),
    Case("mut-saver-copy-keeps-source-thread-id", M, "copy_thread_names_the_copy",
         "copy_thread rewrites the copies' metadata thread_id"),
    Case("mut-saver-prune-refuses-delete-all", M, "agent_server_strategy_names",
         "prune accepts 'delete_all'"),
    Case("mut-saver-setup-error-untranslated", M, "unset_up_saver",
         "raises runstore.errors.SchemaNotSetUpError naming setup()"),
    Case("mut-saver-prune-leaves-writes", M, MACHINE, "prune deletes the pending writes of the checkpoints it deletes"),
    Case("mut-saver-delete-runs-first-thread-only", M, MACHINE,
         "delete_for_runs deletes the runs' checkpoints in every thread and namespace"),
    Case("mut-saver-delete-runs-leaves-writes", M, MACHINE,
         "delete_for_runs deletes the pending writes of the checkpoints it deletes"),
    Case("mut-saver-delete-runs-not-delta-safe", M, "delete_for_runs",
         "delete_for_runs never breaks a surviving checkpoint's delta reconstruction"),
    # sync twins (the async API stays correct)
    Case("mut-saver-sync-list-ignores-filter", M, MACHINE, "(sync) returns exactly the matching"),
    Case("mut-saver-sync-get-ignores-id", M, "sync_twins", "get_tuple == aget_tuple"),
    Case("mut-saver-sync-put-writes-drops-path", M, "sync_twins", "pending_writes in writes_sort_key order"),
    Case("mut-saver-sync-copy-without-writes", M, "sync_twins", "copy_thread (sync) copies every pending write"),
    Case("mut-saver-sync-delete-runs-noop", M, MACHINE,
         "delete_for_runs deletes the runs' checkpoints in every thread and namespace"),
    Case("mut-saver-sync-prune-keeps-all", M, MACHINE, "prune (keep_latest) keeps, per namespace of every thread"),
]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    tmp: Path = tmp_path_factory.mktemp("savers-teeth")
    return run_cases("test_savers", CASES, tmp)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.backend}:{c.contract[:24]}")
def test_suite_fails_broken_saver(outcomes: dict[str, Outcome], case: Case) -> None:
    assert_caught(case, outcomes[case.backend])
