"""What a suite session was asked to run, read once from the options and the project.

The named backends and the test id of each, the project's ``[tool.runstore.conformance]``
section, the plugins to load, the per-test bound and the session's provisioned URLs.
The pytest plugin's hooks, the preflight and the report all read them from here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

if TYPE_CHECKING:
    from runstore.cli.check import ProjectConfig

T = TypeVar("T")

BACKEND_OPTION = "--runstore-backend"
#: The folder of the suite's modules; a suite split by contract area is a package in it.
SUITE_ROOT = Path(__file__).resolve().parent
#: Suite kind -> the fixture a test of that kind takes.
TARGET_FIXTURES = {
    "saver": "saver_target",
    "events": "events_target",
    "streams": "streams_target",
    "runs": "runs_target",
    "store": "store_target",
    "history_cache": "history_cache_target",
}


def suite_module(path: str | Path) -> str:
    """The suite module a test file belongs to, as users name it: ``test_savers`` for
    ``test_savers/test_list.py`` (a suite split into a package), else the file's own name."""
    file = Path(path).resolve()
    if file.parent.parent == SUITE_ROOT and file.parent.name.startswith("test_"):
        return file.parent.name
    return file.stem


def per_session(config: pytest.Config, name: str, make: Callable[[], T]) -> T:
    """The session's one ``make()``, kept on ``config`` as ``name``: made on first use."""
    value = getattr(config, name, None)
    if value is None:
        value = make()
        setattr(config, name, value)
    return value


def project_settings(config: pytest.Config) -> dict[str, Any]:
    """``[tool.runstore.conformance]`` of the plugin project under test (empty if none):
    the file ``--runstore-config`` names, else ./pyproject.toml (`runstore.check.ProjectConfig`)."""
    return _project(config).settings


def _project(config: pytest.Config) -> ProjectConfig:
    from runstore.cli.check import read_project_config
    from runstore.errors import ConfigError

    def read() -> ProjectConfig:
        try:
            return read_project_config(config.getoption("runstore_config"), option="--runstore-config")
        except ConfigError as exc:
            raise pytest.UsageError(str(exc)) from None

    return per_session(config, "_runstore_project", read)


def development_plugins(config: pytest.Config) -> list[str]:
    """The plugin modules to load here and in every process the suite starts.

    ``[tool.runstore.conformance].plugins`` (files relative to that pyproject) then
    ``--runstore-plugin`` (files relative to the working directory), each once: naming a
    plugin in both places loads it once. Files are given as absolute paths.
    """
    from runstore.loader import normalize_plugin_spec

    named = [
        *_project(config).plugins(),
        *(normalize_plugin_spec(s, Path.cwd()) for s in config.getoption("runstore_plugin") or []),
    ]
    return list(dict.fromkeys(named))


def resolve_backends(config: pytest.Config) -> None:
    """Settle the named backends: ``--runstore-backend`` and presets, else the project's ``backends``."""
    from runstore.errors import ConfigError

    project = _project(config)
    urls = list(config.getoption("runstore_backend") or [])
    try:
        urls += project.preset_backends(
            config.getoption("runstore_preset") or [], option="--runstore-preset"
        )
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from exc
    if not urls:
        urls = list(project.settings.get("backends", []))
    config.option.runstore_backend = urls


def named_backends(config: pytest.Config) -> list[str]:
    """The backend entries named with ``--runstore-backend`` (``URL`` or ``KINDS=URL``)."""
    return list(config.getoption("runstore_backend") or [])


def split_kinds(entry: str) -> tuple[frozenset[str] | None, str]:
    """`runstore.check.split_backend_entry`, reporting a bad entry as a usage error."""
    from runstore.cli.check import split_backend_entry
    from runstore.errors import ConfigError

    try:
        return split_backend_entry(entry)
    except ConfigError as exc:
        raise pytest.UsageError(f"{BACKEND_OPTION}: {exc}") from None


def backend_ids(config: pytest.Config, kind_name: str) -> dict[str, str]:
    """The named backends of one kind, in order: raw URL -> test id (the backend's name,
    suffixed when two URLs of the kind share one). Reports label rows with these ids."""
    from runstore.capabilities import Kind
    from runstore.urls import BackendURL

    from .harness import spec_for

    out: dict[str, str] = {}
    for entry in named_backends(config):
        only, raw = split_kinds(entry)
        spec = spec_for(Kind(kind_name), BackendURL.parse(raw))
        if spec is None or (only is not None and kind_name not in only) or raw in out:
            continue
        taken = set(out.values())
        out[raw] = spec.name if spec.name not in taken else f"{spec.name}-{len(out)}"
    return out


def suite_timeout(config: pytest.Config) -> float:
    """The per-phase bound of a suite test: ``--runstore-timeout``, else pyproject, else the default."""
    from .bounds import DEFAULT_TIMEOUT, parse_timeout

    option = config.getoption("runstore_timeout")
    try:
        if option is not None:
            return parse_timeout(option, "--runstore-timeout")
        return parse_timeout(
            project_settings(config).get("timeout", DEFAULT_TIMEOUT),
            "[tool.runstore.conformance] timeout",
        )
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


class Provisions:
    """Session cache of provisioned URLs, one per named URL, shared by every kind."""

    def __init__(self) -> None:
        self._items: dict[str, Any] = {}

    def get(self, raw: str) -> Any:
        """The provisioned (isolated) URL for the named URL ``raw``, provisioned on first use."""
        from runstore.urls import BackendURL

        from .harness import Provisioned

        if raw not in self._items:
            self._items[raw] = Provisioned(BackendURL.parse(raw)).enter()
        return self._items[raw]

    def close(self) -> None:
        """Drop every provisioned URL (schemas, key prefixes, files)."""
        while self._items:
            _, item = self._items.popitem()
            item.__exit__(None, None, None)


def provisions_of(config: pytest.Config) -> Provisions:
    """The session's provisioned URLs (the preflight provisions them before any test runs)."""
    return per_session(config, "_runstore_provisions", Provisions)


def close_provisions(config: pytest.Config) -> None:
    """Drop the session's provisioned URLs, if any were made."""
    provisions = getattr(config, "_runstore_provisions", None)
    if provisions is not None:
        provisions.close()
