"""The delta-history cache suite has teeth: it fails deliberately broken caches
(`tests/broken/history_caches.py`), each by the test of the rule it breaks, whose
failure's headline names that rule.

Every case runs in one child pytest (`tests/broken/teeth.py`) on the suite tests that must
catch it, under the suite's default Hypothesis profile without the shrink phase.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.broken.teeth import Case, Outcome, assert_caught, run_cases

pytestmark = pytest.mark.timeout(900)

PLUGIN = "history_caches.py"
#: Each case with the rule's own test, which must be among those that fail it.
CASES = [
    (Case("broken-hc-prefix-purge", PLUGIN, "state_machine or purge_thread_removes_exactly",
          "contract: purge_thread removes exactly that thread's entries"),
     "test_purge_thread_removes_exactly_that_thread"),
    (Case("broken-hc-aliasing", PLUGIN, "state_machine or get_returns_a_copy", "contract: get returns a copy"),
     "test_get_returns_a_copy"),
    (Case("broken-hc-stale", PLUGIN, "state_machine or set_replaces", "contract: set replaces the entry at its key"),
     "test_set_replaces"),
    (Case("broken-hc-slots", PLUGIN, "may_forget_never_lie",
          "contract: a cache may forget an entry, never return a wrong one"),
     "test_a_cache_may_forget_never_lie"),
    (Case("broken-hc-process-local", PLUGIN, "across_processes",
          "contract: cross_process: an entry set in one process is a hit in another"),
     "test_history_cache_across_processes"),
]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    tmp: Path = tmp_path_factory.mktemp("history-cache-teeth")
    return run_cases("test_history_cache", [case for case, _ in CASES], tmp)


@pytest.mark.parametrize(("case", "rule_test"), CASES, ids=[case.backend for case, _ in CASES])
def test_suite_fails_broken_history_cache(outcomes: dict[str, Outcome], case: Case, rule_test: str) -> None:
    outcome = outcomes[case.backend]
    assert_caught(case, outcome)
    failed = [name for name in outcome.failures() if name.startswith(f"{rule_test}[")]
    assert failed, f"{case.backend}: the rule's own test {rule_test} did not fail: {sorted(outcome.tests)}"


def test_runstore_check_fails_each_broken_cache_by_its_rule_test(tmp_path: Path) -> None:
    """`runstore check` on every broken cache, run on the rules' tests: each backend's
    failures in the JSON report include its rule's test, in the history cache suite."""
    rule_tests = [rule_test for _, rule_test in CASES]
    out = subprocess.run(
        [sys.executable, "-m", "runstore.cli", "check", *(case.url for case, _ in CASES),
         "--plugin", str(Path(__file__).parent / "broken" / PLUGIN), "--json", "-k", " or ".join(rule_tests)],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
        env={k: v for k, v in os.environ.items() if k != "CI"},
    )
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    backends = json.loads(out.stdout)["backends"]
    for case, rule_test in CASES:
        suites = backends[f"history_cache:{case.backend}"]["suites"]
        failed = {f["test"].rsplit("::", 1)[-1].split("[")[0] for s in suites.values() for f in s["failures"]}
        # The lying slots may also collide under other tests' random thread ids: "among".
        assert set(suites) == {"history_cache"} and rule_test in failed, (
            f"{case.backend}: runstore check failed {sorted(failed)} in {sorted(suites)}; expected {rule_test} among them"
        )
