"""A pytest plugin that streams one JSON line per test outcome, for `runstore check`.

Loaded with ``-p runstore.conformance.report --runstore-report FILE``; the parent
process tails FILE to draw progress and the final matrix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

import pytest

from runstore.capabilities import Kind
from runstore.urls import BackendURL

from .harness import spec_for
from .session import TARGET_FIXTURES, backend_ids, per_session, suite_module, suite_timeout


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("runstore").addoption(
        "--runstore-report", metavar="FILE", dest="runstore_report", default=None,
        help="append one JSON line per test outcome to FILE",
    )


class _Reporter:
    def __init__(self, path: Path) -> None:
        self._fh: IO[str] = path.open("a", encoding="utf-8")

    def emit(self, **record: Any) -> None:
        self._fh.write(json.dumps(record, default=str) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


_reporter: _Reporter | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _reporter
    path = config.getoption("runstore_report")
    if path:
        _reporter = _Reporter(Path(path))


def pytest_unconfigure(config: pytest.Config) -> None:
    global _reporter
    if _reporter is not None:
        _reporter.close()
        _reporter = None


def pytest_collection_finish(session: pytest.Session) -> None:
    if _reporter is not None:
        _reporter.emit(type="collected", count=len(session.items))


def _label_ids(config: pytest.Config) -> dict[tuple[str, str], str]:
    return per_session(config, "_runstore_label_ids", lambda: {
        (kind, raw): ident
        for kind in TARGET_FIXTURES
        for raw, ident in backend_ids(config, kind).items()
    })


def _describe(item: pytest.Item) -> dict[str, Any]:
    callspec = getattr(item, "callspec", None)
    kind = url = backend = None
    if callspec is not None:
        for kind_name, fixture in TARGET_FIXTURES.items():
            if fixture in callspec.params:
                kind, url = kind_name, callspec.params[fixture]
                # The id the test was parametrized with, whole: a name may hold '-'.
                backend = _label_ids(item.config).get((kind_name, url)) if url else None
                break
    test_module, test_class = getattr(item, "module", None), getattr(item, "cls", None)
    # A suite split into modules by contract area is still one suite (one matrix column).
    module = suite_module(item.path) if test_module else ""
    cls = test_class.__name__ if test_class else ""
    suite = module.removeprefix("test_") + (f".{cls.removeprefix('Test')}" if cls else "")
    requires = sorted({c for m in item.iter_markers("requires") for c in m.args})
    return {
        "nodeid": item.nodeid, "name": getattr(item, "originalname", item.name), "kind": kind,
        "url": url, "backend": backend, "suite": suite, "requires": requires,
    }


def pytest_sessionstart(session: pytest.Session) -> None:
    if _reporter is None:
        return
    config = session.config
    seed = config.getoption("hypothesis_seed", default=None)
    profile = derandomized = None
    try:
        from hypothesis import settings

        from .profiles import DEFAULT_PROFILE

        profile = config.getoption("hypothesis_profile", default=None) or DEFAULT_PROFILE
        derandomized = bool(settings.get_profile(profile).derandomize)
    except Exception:  # Hypothesis missing or the profile unknown: the preflight said so
        pass
    backends = {}
    for kind in TARGET_FIXTURES:
        for raw, ident in backend_ids(config, kind).items():
            spec = spec_for(Kind(kind), BackendURL.parse(raw))
            if spec is not None:
                backends[f"{kind}:{ident}"] = {
                    "kind": kind, "name": spec.name, "url": raw,
                    "capabilities": sorted(spec.capabilities),
                }
    _reporter.emit(
        type="session", profile=profile, seed=seed, derandomized=derandomized,
        timeout=suite_timeout(config), backends=backends,
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if _reporter is None:
        return report
    failed_setup_or_call = report.failed and report.when in ("setup", "call")
    if report.when == "call" or report.skipped or failed_setup_or_call or (
        report.failed and report.when == "teardown"
    ):
        outcome = report.outcome
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.skipped else "xpassed"
        reason = None
        if report.skipped and isinstance(report.longrepr, tuple):
            reason = report.longrepr[2].removeprefix("Skipped: ")
        message = None
        if report.failed:
            message = getattr(report.longrepr, "reprcrash", None)
            message = message.message if message is not None else str(report.longrepr)[-2000:]
        _reporter.emit(
            type="result",
            outcome=outcome,
            when=report.when,
            duration=round(report.duration, 4),
            reason=reason,
            message=message,
            **_describe(item),
        )
    return report


@pytest.hookimpl(wrapper=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> Any:
    # The last line, after every other implementation settled the exit status: without
    # it the parent knows the run was killed before it finished.
    result = yield
    if _reporter is not None:
        _reporter.emit(type="finished", exitstatus=int(session.exitstatus))
    return result
