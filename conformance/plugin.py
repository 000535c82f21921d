"""The pytest plugin (entry point ``pytest11``): inert unless a runstore backend is named.

``--runstore-backend URL`` (repeatable) names backends; each suite test that takes
``saver_target``, ``events_target`` or ``streams_target`` runs once per named backend
of that kind. ``--runstore-plugin MODULE_OR_FILE`` loads a runstore plugin that is
not installed (handy while writing one).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest

BACKEND_OPTION = "--runstore-backend"
TARGET_FIXTURES = {"saver": "saver_target", "events": "events_target", "streams": "streams_target"}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("runstore", "runstore conformance suite")
    group.addoption(
        BACKEND_OPTION,
        action="append",
        default=[],
        metavar="URL",
        dest="runstore_backend",
        help="run the runstore conformance suite against the backend at URL (repeatable)",
    )
    group.addoption(
        "--runstore-plugin",
        action="append",
        default=[],
        metavar="MODULE",
        dest="runstore_plugin",
        help="register a runstore plugin module (dotted name or .py file) before the run",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "requires(*capabilities): run only on backends declaring these capabilities"
    )
    config.addinivalue_line("markers", "runstore_contract(name): the contract a test checks")
    for spec in config.getoption("runstore_plugin") or []:
        _register_plugin(spec)
    if named_backends(config):
        from .profiles import register_profiles

        register_profiles()
        if not config.getoption("hypothesis_profile", default=None):
            from hypothesis import settings

            from .harness import in_ci

            settings.load_profile("runstore-ci" if in_ci() else "runstore-dev")


def _register_plugin(spec: str) -> None:
    from runstore.loader import register_plugin

    if spec.endswith(".py") or os.sep in spec:
        path = Path(spec).resolve()
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        if module_spec is None or module_spec.loader is None:
            raise pytest.UsageError(f"--runstore-plugin: cannot load {spec}")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        register_plugin(module, name=path.stem)
    else:
        register_plugin(importlib.import_module(spec), name=spec)


def named_backends(config: pytest.Config) -> list[str]:
    """The backend URLs named with ``--runstore-backend``."""
    return list(config.getoption("runstore_backend") or [])


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    from runstore.capabilities import Kind
    from runstore.urls import BackendURL

    from .harness import spec_for

    urls = named_backends(metafunc.config)
    for kind_name, fixture in TARGET_FIXTURES.items():
        if fixture not in metafunc.fixturenames:
            continue
        kind = Kind(kind_name)
        params: list[Any] = []
        ids: list[str] = []
        for raw in urls:
            spec = spec_for(kind, BackendURL.parse(raw))
            if spec is None:
                continue
            ident = spec.name if spec.name not in ids else f"{spec.name}-{len(ids)}"
            params.append(raw)
            ids.append(ident)
        if not params:
            reason = f"no {kind_name} backend named (pass {BACKEND_OPTION} URL)"
            params = [pytest.param(None, marks=pytest.mark.skip(reason=reason))]
            ids = [f"no-{kind_name}-backend"]
        metafunc.parametrize(fixture, params, ids=ids, indirect=True, scope="session")


class _Provisions:
    """Session cache of provisioned URLs, one per named URL, shared by every kind."""

    def __init__(self) -> None:
        self._items: dict[str, Any] = {}

    def get(self, raw: str) -> Any:
        from runstore.urls import BackendURL

        from .harness import Provisioned

        if raw not in self._items:
            self._items[raw] = Provisioned(BackendURL.parse(raw)).__enter__()
        return self._items[raw]

    def close(self) -> None:
        while self._items:
            _, item = self._items.popitem()
            item.__exit__(None, None, None)


@pytest.fixture(scope="session")
def runstore_provisions() -> Any:
    """Provisioned (isolated) URLs for this session; dropped at the end."""
    provisions = _Provisions()
    yield provisions
    provisions.close()


def _target(request: pytest.FixtureRequest, kind_name: str, provisions: _Provisions) -> Any:
    from runstore.capabilities import Kind

    from .harness import BackendTarget, spec_for

    raw = request.param
    provisioned = provisions.get(raw)
    kind = Kind(kind_name)
    spec = spec_for(kind, provisioned.named_url)
    assert spec is not None
    return BackendTarget(kind=kind, spec=spec, url=provisioned.url, named_url=provisioned.named_url)


@pytest.fixture(scope="session")
def saver_target(request: pytest.FixtureRequest, runstore_provisions: _Provisions) -> Any:
    """The checkpoint saver under test (a `BackendTarget`)."""
    return _target(request, "saver", runstore_provisions)


@pytest.fixture(scope="session")
def events_target(request: pytest.FixtureRequest, runstore_provisions: _Provisions) -> Any:
    """The run event store under test (a `BackendTarget`)."""
    return _target(request, "events", runstore_provisions)


@pytest.fixture(scope="session")
def streams_target(request: pytest.FixtureRequest, runstore_provisions: _Provisions) -> Any:
    """The stream bridge under test (a `BackendTarget`)."""
    return _target(request, "streams", runstore_provisions)


def pytest_runtest_setup(item: pytest.Item) -> None:
    marker = item.get_closest_marker("requires")
    callspec = getattr(item, "callspec", None)
    if marker is None or callspec is None:
        return
    from runstore.capabilities import Kind
    from runstore.urls import BackendURL

    from .harness import spec_for

    for kind_name, fixture in TARGET_FIXTURES.items():
        raw = callspec.params.get(fixture)
        if raw is None:
            continue
        spec = spec_for(Kind(kind_name), BackendURL.parse(raw))
        for capability in marker.args:
            if spec is not None and not spec.has(capability):
                pytest.skip(
                    f"{kind_name} backend {spec.name!r} does not declare capability {capability!r}"
                )
