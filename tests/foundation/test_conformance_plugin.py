"""The conformance pytest plugin: inert by default, backends from options or pyproject,
capability requirements as skips with reasons, known failures as strict xfails."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

SUITE = """
import pytest

@pytest.mark.requires("cross_process")
def test_needs_cross_process(events_target):
    pass

def test_any_events_backend(events_target):
    assert events_target.name in ("memory", "jsonl")
    assert str(events_target.url).startswith(events_target.named_url.scheme)
"""


def test_inert_without_a_backend(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*no events backend named (pass --runstore-backend URL)*"])


def test_backend_option_parametrizes_and_requirements_skip(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-rs", "-v",
        "--runstore-backend", "memory://", "--runstore-backend", "jsonl://",
    )
    result.assert_outcomes(passed=2, skipped=2)
    result.stdout.fnmatch_lines([
        "*test_any_events_backend?memory? PASSED*",
        "*test_any_events_backend?jsonl? PASSED*",
        "*events backend 'memory' does not declare capability 'cross_process'*",
    ])


def test_pyproject_backends_presets_and_strict_xfail(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    pytester.makefile(
        ".toml",
        pyproject="""
        [tool.runstore.conformance]
        backends = ["memory://"]
        presets = { files = ["jsonl://"] }
        xfail = { "test_suite.py::test_any_events_backend[[]memory[]]" = "pretend it is broken" }
        """,
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rsxX")
    # The declared known failure passes, and a strict xfail turns that into a failure.
    result.assert_outcomes(failed=1, skipped=1)
    result.stdout.fnmatch_lines(["*XPASS(strict)*declared known failure: pretend it is broken*"])

    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--runstore-preset", "files", "-v")
    result.stdout.fnmatch_lines(["*test_any_events_backend?jsonl? PASSED*"])
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--runstore-preset", "nope")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--runstore-preset 'nope'*known: files*"])


def test_unknown_project_key_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    pytester.makefile(".toml", pyproject="[tool.runstore.conformance]\nbackend = ['memory://']\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown keys ?'backend'?; accepted: backends*"])


def test_plugin_import_is_cheap() -> None:
    import subprocess
    import sys

    code = "import sys, runstore.conformance.plugin; print(sorted(m for m in ('hypothesis', 'langgraph', 'sqlalchemy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        ('"cross_proces"', "*requires('cross_proces') names no capability; known: *copy_thread, cross_process*"),
        ('"replay"', "*requires('replay') on a test of events backends; 'replay' is a capability of streams backends only*"),
    ],
)
def test_a_requires_marker_naming_no_capability_of_its_kind_is_refused(
    pytester: pytest.Pytester, marker: str, message: str
) -> None:
    pytester.makepyfile(test_suite=f"""
import pytest

@pytest.mark.requires({marker})
def test_typo(events_target):
    pass
""")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--runstore-backend", "memory://")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_every_capability_names_the_kinds_that_can_have_it() -> None:
    from runstore.capabilities import CAPABILITIES, CAPABILITY_KINDS

    assert CAPABILITY_KINDS.keys() == CAPABILITIES.keys()
