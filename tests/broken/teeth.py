"""Run the conformance suite once against many broken backends and read who failed what.

A teeth case is a broken backend (registered by a plugin file in this folder), the
suite tests that must catch it (a ``-k`` expression) and the contract text its
failure must name. Starting pytest costs seconds, so every case of one kind runs in
ONE child pytest: each broken backend is named with ``--runstore-backend`` and the
``-k`` expression ORs ``(selection and backend-name)`` per case, so a backend runs
only its own tests. The child uses the suite's default Hypothesis profile, the one
`runstore check` uses, so a case proves the bug dies there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).parent


@dataclass(frozen=True)
class Case:
    """One broken backend and how the suite must fail it."""

    backend: str  # registered backend name = URL scheme
    plugin: str  # plugin file in tests/broken
    selection: str  # -k expression of the suite tests that must catch it
    contract: str  # text the failure's headline must contain
    #: texts no failure headline may contain (a misleading name: another contract, a raw
    #: KeyError, an ExceptionGroup that names nothing)
    misleading: tuple[str, ...] = ()

    @property
    def url(self) -> str:
        return f"{self.backend}://"


@dataclass
class Outcome:
    """What the child run reported for one backend: test name -> failure text (None = passed)."""

    tests: dict[str, str | None] = field(default_factory=dict)

    def failures(self) -> dict[str, str]:
        return {name: text for name, text in self.tests.items() if text is not None}


def check_names(cases: list[Case]) -> None:
    """-k matches substrings: no backend name may occur inside another one."""
    names = sorted({c.backend for c in cases})
    for a in names:
        for b in names:
            assert a == b or a not in b, f"teeth backend {a!r} is a substring of {b!r}"


#: The default profile without the shrink phase: the same derandomized examples, so the
#: same verdict, without minimizing a failure that no one reads (shrinking a state
#: machine can take longer than finding the failure). `shrink=True` runs the default
#: profile itself.
TEETH_CONFTEST = """
from hypothesis import Phase, settings

from runstore.conformance.profiles import DEFAULT_PROFILE, register_profiles

register_profiles()
settings.register_profile(
    "runstore-teeth",
    parent=settings.get_profile(DEFAULT_PROFILE),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
"""


def run_cases(
    kind: str, cases: list[Case], tmp: Path, *, env: dict[str, str] | None = None, shrink: bool = False
) -> dict[str, Outcome]:
    """Run the ``kind`` suite (``test_savers`` ...) on every case's backend; outcomes by backend."""
    check_names(cases)
    report = tmp / f"{kind}.xml"
    (tmp / "conftest.py").write_text(TEETH_CONFTEST)
    plugins = sorted({str(HERE / c.plugin) for c in cases})
    selection = " or ".join(f"(({c.selection}) and {c.backend})" for c in cases)
    cmd = [
        sys.executable, "-m", "pytest", "--pyargs", f"runstore.conformance.{kind}",
        "-c", os.devnull, "--rootdir", str(tmp), "-p", "no:cacheprovider", "-q",
        "--junitxml", str(report), "-k", selection,
    ]
    if not shrink:
        cmd += ["--hypothesis-profile", "runstore-teeth"]
    for url in sorted({c.url for c in cases}):
        cmd += ["--runstore-backend", url]
    for plugin in plugins:
        cmd += ["--runstore-plugin", plugin]
    child_env = {k: v for k, v in os.environ.items() if k != "CI"} | (env or {})
    proc = subprocess.run(cmd, cwd=tmp, env=child_env, capture_output=True, text=True, timeout=1800)
    assert report.exists(), f"the suite did not run:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    outcomes: dict[str, Outcome] = {c.backend: Outcome() for c in cases}
    for case_el in ET.parse(report).getroot().iter("testcase"):
        name = case_el.get("name", "")
        problem = case_el.find("failure")
        if problem is None:
            problem = case_el.find("error")
        if case_el.find("skipped") is not None:
            continue
        text = None
        if problem is not None:
            text = f"{problem.get('message', '')}\n{problem.text or ''}"
        for backend, outcome in outcomes.items():
            if backend in name:
                outcome.tests[name] = text
    return outcomes


def describe(outcome: Outcome) -> str:
    """A short account of a backend's run, for an assertion message."""
    lines = []
    for name, text in outcome.tests.items():
        lines.append(f"  {'FAILED' if text else 'passed'} {name}")
        if text:
            lines.append("    " + "\n    ".join(text.strip().splitlines()[:6]))
    return "\n".join(lines) or "  (no test ran)"


def assert_caught(case: Case, outcome: Outcome) -> None:
    """The case's backend failed at least one selected test, and a failure names the contract."""
    failures = outcome.failures()
    assert failures, f"the suite passed the broken backend {case.backend}:\n{describe(outcome)}"
    # The headline (what `runstore check` and a JUnit viewer show first), not only
    # somewhere in a traceback, must name the contract.
    assert any(case.contract in text.split("\n", 1)[0] for text in failures.values()), (
        f"{case.backend} failed, but no failure's headline names the contract {case.contract!r}:\n"
        f"{describe(outcome)}"
    )
    for text in failures.values():
        headline = text.split("\n", 1)[0]
        for wrong in case.misleading:
            assert wrong not in headline, (
                f"{case.backend}: a failure's headline says {wrong!r}, which misnames the broken "
                f"contract ({case.contract!r}):\n{describe(outcome)}"
            )
