"""The long-term memory store suite has teeth: it fails deliberately broken stores, naming
the rule each breaks.

Every case runs in one child pytest (`tests/broken/teeth.py`) on the suite tests that must
catch it, under the suite's default Hypothesis profile without the shrink phase.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.broken.teeth import Case, Outcome, assert_caught, run_cases

pytestmark = pytest.mark.timeout(1800)

CASES = [
    Case("broken-store-nested-filter", "store_nested_filter.py", "state_machine or nested_filters",
         "that match the filter"),
    Case("broken-store-ttl-no-refresh", "store_ttl_no_refresh.py", "state_machine or ttl_expiry",
         "refreshing read"),
    Case("broken-store-max-depth", "store_max_depth.py", "state_machine or list_namespaces_rules",
         "cut to max_depth labels"),
    Case("broken-store-paging-repeats", "store_paging_repeats.py", "state_machine or search_pages",
         "never repeat an item"),
    Case("broken-store-process-local", "store_process_local.py", "store_across_processes",
         "a read sees the last write acknowledged in another process"),
    Case("broken-store-shared-values", "store_shared_values.py", "values_are_copies",
         "contract: a read returns a fresh copy"),
    Case("broken-store-ttl-config-ignored", "store_ttl_config_ignored.py", "ttl_config",
         "contract: an item put without a ttl is gone default_ttl minutes after its put"),
    Case("broken-store-batch-op-by-op", "store_batch_op_by_op.py", "one_bad_op",
         "contract: a batch with one bad op writes nothing"),
]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    tmp: Path = tmp_path_factory.mktemp("store-teeth")
    return run_cases("test_store", CASES, tmp)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.backend)
def test_suite_fails_broken_store(outcomes: dict[str, Outcome], case: Case) -> None:
    assert_caught(case, outcomes[case.backend])
