"""The saver conformance suite proves its teeth: it fails deliberately broken savers,
naming the contract each one breaks."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

BROKEN = Path(__file__).parent / "broken"

# Deterministic and without shrinking: the teeth only need *a* failure, named.
TEETH_CONFTEST = """
from hypothesis import HealthCheck, Phase, settings

settings.register_profile(
    "runstore-teeth",
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
"""


def _run_suite(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makeconftest(TEETH_CONFTEST)
    return pytester.runpytest_subprocess(
        "--pyargs",
        "runstore.conformance.test_savers",
        "-p",
        "no:cacheprovider",
        "--hypothesis-profile=runstore-teeth",
        "-q",
        *args,
    )

CASES = [
    pytest.param(
        "saver_id_order.py",
        "broken-id-order://",
        "fork_sees_no_sibling or delta_history_parity",
        "a fork never sees a sibling branch's writes",
        id="delta-walk-in-id-order",
    ),
    pytest.param(
        "saver_id_order.py",
        "broken-id-order://",
        "graph_parity and delta",
        "contract: graph parity",
        id="graph-parity-catches-id-order-walk",
    ),
    pytest.param(
        "saver_carry_forward.py",
        "broken-carry-forward://",
        "tree_get_tuple",
        "a value is never carried forward from an older version",
        id="get-tuple-carries-values-forward",
    ),
    pytest.param(
        "saver_naive_prune.py",
        "broken-naive-prune://",
        "prune_keep_latest",
        "prune keep_latest keeps what delta reconstruction needs",
        id="prune-drops-delta-ancestors",
    ),
    pytest.param(
        "saver_unsorted_writes.py",
        "broken-unsorted-writes://",
        "put_writes_idempotent",
        "pending_writes in writes_sort_key order",
        id="pending-writes-unsorted",
    ),
]


@pytest.mark.parametrize(("module", "url", "selection", "contract"), CASES)
def test_suite_fails_broken_saver(
    pytester: pytest.Pytester, module: str, url: str, selection: str, contract: str
) -> None:
    result = _run_suite(
        pytester, "--runstore-backend", url, "--runstore-plugin", str(BROKEN / module), "-k", selection
    )
    outcomes = result.parseoutcomes()
    output = result.stdout.str()
    assert outcomes.get("failed", 0) >= 1, f"the suite passed a broken saver ({module}):\n{output}"
    assert contract in output, f"the failure does not name the contract {contract!r}:\n{output}"


def test_suite_passes_the_memory_saver_on_the_same_selection(pytester: pytest.Pytester) -> None:
    """Control: the selections above pass on the correct saver they were broken from."""
    result = _run_suite(
        pytester,
        "--runstore-backend",
        "memory://",
        "-k",
        "fork_sees_no_sibling or delta_history_parity or tree_get_tuple or put_writes_idempotent"
        " or prune_keep_latest",
    )
    result.assert_outcomes(passed=5)
