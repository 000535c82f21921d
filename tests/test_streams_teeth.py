"""The stream bridge suite has teeth: it fails deliberately broken bridges, naming the contract."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

BROKEN = Path(__file__).parent / "broken"

#: case -> (URL, plugin file, -k selection, contract named in the failure)
CASES = {
    "drop-end": (
        "broken-drop-end://",
        "streams_drop_end.py",
        "end_survives",
        "contract: END never takes a data slot, so it survives a full buffer",
    ),
    "skip-evicted": (
        "broken-skip-evicted://",
        "streams_skip_evicted.py",
        "gap",
        "never a silent skip",
    ),
    "ignore-heartbeat-override": (
        "broken-ignore-heartbeat://",
        "streams_ignore_heartbeat_override.py",
        "heartbeat_override",
        "contract: the per-subscription heartbeat override applies",
    ),
}


def _run_suite(pytester: pytest.Pytester, url: str, selection: str, *plugin: str) -> pytest.RunResult:
    extra = ["--runstore-plugin", plugin[0]] if plugin else []
    return pytester.runpytest_subprocess(
        "--pyargs", "runstore.conformance",
        "-p", "no:cacheprovider",
        "--runstore-backend", url,
        *extra,
        "-k", f"test_streams and ({selection})",
    )


@pytest.fixture(autouse=True)
def _short_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    # A broken bridge makes the suite wait for what never comes; keep that wait short.
    monkeypatch.setenv("RUNSTORE_CONFORMANCE_WAIT", "2")


@pytest.mark.parametrize("case", sorted(CASES))
def test_suite_fails_broken_stream_bridge(pytester: pytest.Pytester, case: str) -> None:
    url, plugin, selection, contract = CASES[case]
    result = _run_suite(pytester, url, selection, str(BROKEN / plugin))
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) >= 1, f"the stream suite passed a broken bridge ({case})"
    assert contract in result.stdout.str(), f"the failure output does not name {contract!r}"


def test_suite_passes_the_memory_bridge(pytester: pytest.Pytester) -> None:
    """Control: the same selections pass on the correct memory bridge."""
    selection = " or ".join(f"({c[2]})" for c in CASES.values())
    result = _run_suite(pytester, "memory://", selection)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0, result.stdout.str()[-3000:]
    assert outcomes.get("passed", 0) >= 5
