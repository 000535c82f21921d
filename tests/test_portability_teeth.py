"""The no-lock-in group has teeth: a saver that drops parent links on the data it is given
back, an event store that renumbers an imported feed, and stores whose import loses the
items' times or drops a namespace label all fail it, by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.broken.teeth import Case, Outcome, assert_caught, run_cases

pytestmark = pytest.mark.timeout(600)

CASES = [
    Case("broken-import-parents", "saver_import_drops_parents.py", "saver_data_leaves",
         "contract: no lock-in: thread"),
    Case("broken-import-renumbers", "events_import_renumbers.py", "event_feeds_leave",
         "contract: no lock-in: a feed imported back keeps its seqs"),
    Case("broken-store-import-times", "store_import_mangles.py", "store_items_leave",
         "contract: no lock-in: store items imported back"),
    Case("broken-store-import-level", "store_import_mangles.py", "store_items_leave",
         "contract: no lock-in: store items imported back"),
]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    tmp: Path = tmp_path_factory.mktemp("portability-teeth")
    return run_cases("test_portability", CASES, tmp)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.backend)
def test_the_no_lock_in_group_fails_a_backend_whose_data_cannot_leave(outcomes: dict[str, Outcome], case: Case) -> None:
    assert_caught(case, outcomes[case.backend])
