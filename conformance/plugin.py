"""The pytest plugin (entry point ``pytest11``): inert unless a runstore backend is named.

``--runstore-backend URL`` (repeatable) names backends; each suite test that takes
``saver_target``, ``events_target``, ``streams_target``, ``runs_target``, ``store_target`` or
``history_cache_target`` runs once per named backend of that kind. ``--runstore-plugin MODULE_OR_FILE`` loads a runstore plugin that is
not installed (handy while writing one); ``--runstore-timeout SECONDS`` bounds each
phase of every suite test (`runstore.conformance.bounds`).
"""

from __future__ import annotations

import fnmatch
import pkgutil
import sys
from pathlib import Path
from typing import Any

import pytest

from .bounds import BoundsPlugin
from .headlines import HeadlinesPlugin
from .session import (
    BACKEND_OPTION,
    TARGET_FIXTURES,
    Provisions,
    backend_ids,
    close_provisions,
    development_plugins,
    named_backends,
    project_settings,
    provisions_of,
    resolve_backends,
    suite_module,
    suite_timeout,
)


def _rewrite_suite_helpers() -> None:
    # The suite's helper modules (models, strategies, state machines) assert too; have
    # pytest rewrite them so failures show the values. Only modules not imported yet
    # can be rewritten (the package itself, this plugin and what it imports already are).
    package = sys.modules[__package__ or "runstore.conformance"]
    names = [
        f"{package.__name__}.{info.name}"
        for info in pkgutil.iter_modules(package.__path__)
        if not info.name.startswith("test_")
    ]
    pytest.register_assert_rewrite(*[n for n in names if n not in sys.modules])


_rewrite_suite_helpers()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("runstore", "runstore conformance suite")
    group.addoption(
        BACKEND_OPTION,
        action="append",
        default=[],
        metavar="URL",
        dest="runstore_backend",
        help="run the runstore conformance suite against the backend at URL (repeatable); "
        "KINDS=URL (e.g. streams=memory://) limits it to those kinds",
    )
    group.addoption(
        "--runstore-preset",
        action="append",
        default=[],
        metavar="NAME",
        dest="runstore_preset",
        help="add the backends of a preset from [tool.runstore.conformance.presets]",
    )
    group.addoption(
        "--runstore-config",
        default=None,
        metavar="PYPROJECT",
        dest="runstore_config",
        help="read [tool.runstore.conformance] from this file (default: ./pyproject.toml)",
    )
    group.addoption(
        "--runstore-plugin",
        action="append",
        default=[],
        metavar="MODULE",
        dest="runstore_plugin",
        help="register a runstore plugin module (dotted name or .py file) before the run",
    )
    group.addoption(
        "--runstore-timeout",
        default=None,
        metavar="SECONDS",
        dest="runstore_timeout",
        help="bound each phase of every suite test (default 300, or `timeout` in "
        "[tool.runstore.conformance]; 0 = none); a test past it fails naming what it waited for",
    )
    group.addoption(
        "--runstore-allow-unreachable",
        action="store_true",
        default=False,
        dest="runstore_allow_unreachable",
        help="skip (instead of failing the run) the tests of a backend whose server cannot be reached",
    )


# First, so our Hypothesis profiles exist before Hypothesis's own plugin loads the one
# named by --hypothesis-profile.
@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "requires(*capabilities): run only on backends declaring these capabilities"
    )
    config.addinivalue_line("markers", "runstore_contract(name): the contract a test checks")
    for spec in development_plugins(config):
        _register_plugin(spec)
    resolve_backends(config)
    if named_backends(config):
        config.pluginmanager.register(BoundsPlugin(suite_timeout(config), TARGET_FIXTURES), "runstore-bounds")
        # Before the reporters (runstore check's, JUnit) read the headline.
        config.pluginmanager.register(HeadlinesPlugin(), "runstore-headlines")
    requested = config.getoption("hypothesis_profile", default=None)
    if named_backends(config):
        from .preflight import check_configuration

        check_configuration(config)
    if named_backends(config) or str(requested).startswith("runstore-"):
        from .profiles import register_profiles

        register_profiles()
    if named_backends(config):
        from .preflight import check_profile

        check_profile(config, requested)
    if named_backends(config) and not requested:
        from hypothesis import settings

        from .profiles import DEFAULT_PROFILE

        settings.load_profile(DEFAULT_PROFILE)


def _register_plugin(spec: str) -> None:
    from runstore.errors import PluginError
    from runstore.loader import register_plugin_spec

    try:
        register_plugin_spec(spec)
    except PluginError as exc:
        raise pytest.UsageError(f"--runstore-plugin: {exc}") from None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    for kind_name, fixture in TARGET_FIXTURES.items():
        if fixture not in metafunc.fixturenames:
            continue
        named = backend_ids(metafunc.config, kind_name)
        params: list[Any] = list(named)
        ids = list(named.values())
        if not params:
            reason = f"no {kind_name} backend named (pass {BACKEND_OPTION} URL)"
            params = [pytest.param(None, marks=pytest.mark.skip(reason=reason))]
            ids = [f"no-{kind_name}-backend"]
        metafunc.parametrize(fixture, params, ids=ids, indirect=True, scope="session")


def pytest_unconfigure(config: pytest.Config) -> None:
    close_provisions(config)


@pytest.fixture(scope="session")
def runstore_provisions(request: pytest.FixtureRequest) -> Any:
    """Provisioned (isolated) URLs for this session; dropped when pytest exits."""
    return provisions_of(request.config)


def _target(request: pytest.FixtureRequest, kind_name: str, provisions: Provisions) -> Any:
    from runstore.capabilities import Kind

    from .harness import BackendTarget, spec_for

    raw = request.param
    provisioned = provisions.get(raw)
    kind = Kind(kind_name)
    spec = spec_for(kind, provisioned.named_url)
    assert spec is not None
    return BackendTarget(kind=kind, spec=spec, url=provisioned.url, named_url=provisioned.named_url)


@pytest.fixture(scope="session")
def saver_target(request: pytest.FixtureRequest, runstore_provisions: Provisions) -> Any:
    """The checkpoint saver under test (a `BackendTarget`)."""
    return _target(request, "saver", runstore_provisions)


@pytest.fixture(scope="session")
def events_target(request: pytest.FixtureRequest, runstore_provisions: Provisions) -> Any:
    """The run event store under test (a `BackendTarget`)."""
    return _target(request, "events", runstore_provisions)


@pytest.fixture(scope="session")
def streams_target(request: pytest.FixtureRequest, runstore_provisions: Provisions) -> Any:
    """The stream bridge under test (a `BackendTarget`)."""
    return _target(request, "streams", runstore_provisions)


@pytest.fixture(scope="session")
def runs_target(request: pytest.FixtureRequest, runstore_provisions: Provisions) -> Any:
    """The run store under test (a `BackendTarget`)."""
    return _target(request, "runs", runstore_provisions)


@pytest.fixture(scope="session")
def store_target(request: pytest.FixtureRequest, runstore_provisions: Provisions) -> Any:
    """The long-term memory store under test (a `BackendTarget`)."""
    return _target(request, "store", runstore_provisions)


@pytest.fixture(scope="session")
def history_cache_target(request: pytest.FixtureRequest, runstore_provisions: Provisions) -> Any:
    """The delta-history cache backend under test (a `BackendTarget`)."""
    return _target(request, "history_cache", runstore_provisions)


def pytest_runtest_setup(item: pytest.Item) -> None:
    # Every requires marker counts (the module's, the class's, the test's own): the closest
    # alone would let a test's requires("cross_process") drop its module's requires("fencing").
    required = list(dict.fromkeys(c for marker in item.iter_markers("requires") for c in marker.args))
    callspec = getattr(item, "callspec", None)
    if not required or callspec is None:
        return
    from runstore.capabilities import Kind
    from runstore.urls import BackendURL

    from .harness import spec_for

    for kind_name, fixture in TARGET_FIXTURES.items():
        raw = callspec.params.get(fixture)
        if raw is None:
            continue
        spec = spec_for(Kind(kind_name), BackendURL.parse(raw))
        for capability in required:
            if spec is not None and not spec.has(capability):
                pytest.skip(
                    f"{kind_name} backend {spec.name!r} does not declare capability {capability!r}"
                )


def _short_ids(item: pytest.Item) -> list[str]:
    """``test_runs.py::TestPaging::test_walk[memory]`` whatever the rootdir or install path.

    A test of a suite split into a package has two: ``test_events/test_paging.py::...``
    and its suite's module name, ``test_events.py::...``, which declared xfails written
    before the split name.
    """
    path = Path(str(getattr(item, "path", item.nodeid.split("::")[0])))
    rest = item.nodeid.split("::")[1:]
    suite = suite_module(path)
    if suite == path.stem:
        return ["::".join([path.name, *rest])]
    return ["::".join([f"{suite}/{path.name}", *rest]), "::".join([f"{suite}.py", *rest])]


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Any:
    # Around every other implementation (-k and -m deselect in theirs): before, note
    # whether suite tests were collected at all; after, check what the selection left
    # and open each backend it needs once (the preflight).
    from .preflight import after_selection, note_collected

    note_collected(config, items)
    result = yield
    _declared_xfails(config, items)
    after_selection(config, items)
    return result


def pytest_runtest_call(item: pytest.Item) -> None:
    from .preflight import note_ran

    note_ran(item)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from .preflight import check_something_ran

    check_something_ran(session)


def _declared_xfails(config: pytest.Config, items: list[pytest.Item]) -> None:
    declared: dict[str, str] = project_settings(config).get("xfail", {})
    if not declared:
        return
    for item in items:
        names = [*_short_ids(item), item.nodeid]
        for pattern, reason in declared.items():
            if any(fnmatch.fnmatchcase(name, pattern) for name in names):
                item.add_marker(pytest.mark.xfail(strict=True, reason=f"declared known failure: {reason}"))
                break
