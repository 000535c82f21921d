from __future__ import annotations

import dataclasses
import importlib.metadata
import sys
import tomllib
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import runstore
from runstore import loader
from runstore.errors import (
    BackendNotFoundError,
    DuplicateBackendError,
    MissingDriverError,
    PluginError,
)
from runstore.hookspecs import hookimpl
from runstore.loader import get_backends
from runstore.options import BackendOptions
from runstore.registry import (
    EventStoreRegistry,
    PluginInfo,
    SaverRegistry,
    SettingsRegistry,
    StreamBridgeRegistry,
)
from runstore.settings import Settings, bounds
from runstore.urls import BackendURL


@pytest.fixture(autouse=True)
def _fresh_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("RUNSTORE_DISABLE_PLUGINS", raising=False)
    monkeypatch.delenv("RUNSTORE_PLUGINS", raising=False)
    # Each test starts with the installed plugins only; the session's own (the reference
    # peers --runstore-plugin registered) come back afterwards for the conformance files
    # this worker runs later.
    session = list(loader._extra)
    for name, _ in session:
        loader.unregister_plugin(name)
    loader.reset()
    yield
    for name, _ in list(loader._extra):
        loader.unregister_plugin(name)
    for name, plugin in session:
        loader.register_plugin(plugin, name=name)
    loader.reset()


def _plugin(name: str, **hooks: object) -> types.ModuleType:
    module = types.ModuleType(name)
    for hook_name, fn in hooks.items():
        setattr(module, hook_name, hookimpl(fn))  # type: ignore[arg-type]
    return module


async def _factory(url: BackendURL, options: BackendOptions) -> object:
    return ("opened", str(url))


def test_builtins_load_through_entry_points() -> None:
    backends = get_backends()
    assert {s.name for s in backends.events} >= {"memory", "jsonl", "sqlite", "postgres"}
    assert {s.name for s in backends.savers} >= {"memory", "sqlite", "postgres"}
    assert {s.name for s in backends.streams} >= {"memory", "redis"}
    sqlite = backends.events.get("sqlite")
    assert sqlite.plugin.distribution == "runstore"
    assert sqlite.plugin.version == runstore.__version__
    assert backends.savers.for_url("postgres://h/db").name == "postgres"


def test_unknown_scheme_lists_installed_backends() -> None:
    with pytest.raises(BackendNotFoundError) as info:
        get_backends().events.for_url("mongodb://h/db")
    message = str(info.value)
    assert "'mongodb'" in message and "sqlite://" in message and "jsonl://" in message


def test_registered_plugin_is_selectable() -> None:
    def runstore_register_event_stores(registry: EventStoreRegistry) -> None:
        registry.add("acme", schemes=["acme"], factory=_factory, capabilities=["durable"])

    loader.register_plugin(_plugin("acme_plugin", runstore_register_event_stores=runstore_register_event_stores))
    spec = get_backends().events.for_url("acme://x")
    assert spec.name == "acme" and spec.plugin.name == "acme_plugin"
    assert spec.capabilities == frozenset({"durable"})


def test_duplicate_name_names_both_plugins() -> None:
    def runstore_register_savers(registry: SaverRegistry) -> None:
        registry.add("memory", schemes=["mem2"], factory=_factory)

    loader.register_plugin(_plugin("copycat", runstore_register_savers=runstore_register_savers))
    with pytest.raises(DuplicateBackendError) as info:
        get_backends()
    assert "memory (runstore" in str(info.value) and "copycat" in str(info.value)


def test_duplicate_scheme_names_both_plugins() -> None:
    def runstore_register_stream_bridges(registry: StreamBridgeRegistry) -> None:
        registry.add("fastredis", schemes=["redis"], factory=_factory)

    loader.register_plugin(_plugin("fastredis_plugin", runstore_register_stream_bridges=runstore_register_stream_bridges))
    with pytest.raises(DuplicateBackendError, match=r"redis://.*'redis' from redis.*'fastredis' from fastredis_plugin"):
        get_backends()


def test_disable_plugins_env_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNSTORE_DISABLE_PLUGINS", "jsonl, redis")
    loader.reset()
    backends = get_backends()
    assert "jsonl" not in {s.name for s in backends.events}
    assert not backends.streams.serves("redis://h")
    assert backends.events.serves("memory://")


def test_disabled_plugin_frees_its_names(monkeypatch: pytest.MonkeyPatch) -> None:
    def runstore_register_stream_bridges(registry: StreamBridgeRegistry) -> None:
        registry.add("fastredis", schemes=["redis"], factory=_factory)

    monkeypatch.setenv("RUNSTORE_DISABLE_PLUGINS", "redis")
    loader.register_plugin(_plugin("fastredis_plugin", runstore_register_stream_bridges=runstore_register_stream_bridges))
    assert get_backends().streams.for_url("redis://h").name == "fastredis"


def test_misspelled_hook_fails_at_load() -> None:
    def runstore_register_saverz(registry: object) -> None:  # typo on purpose
        pass

    loader.register_plugin(_plugin("typo_plugin", runstore_register_saverz=runstore_register_saverz))
    with pytest.raises(PluginError, match="typo_plugin"):
        get_backends()


def test_unknown_capability_rejected() -> None:
    def runstore_register_event_stores(registry: EventStoreRegistry) -> None:
        registry.add("x", schemes=["x"], factory=_factory, capabilities=["teleport"])

    loader.register_plugin(_plugin("caps", runstore_register_event_stores=runstore_register_event_stores))
    with pytest.raises(PluginError, match="unknown capabilities \\['teleport'\\]"):
        get_backends()


async def test_missing_driver_names_the_extra() -> None:
    def runstore_register_event_stores(registry: EventStoreRegistry) -> None:
        registry.add(
            "needsdriver", schemes=["nd"], factory=_factory,
            drivers=["definitely_not_installed_driver"], extra="nd",
        )

    loader.register_plugin(_plugin("nd", runstore_register_event_stores=runstore_register_event_stores))
    spec = get_backends().events.for_url("nd://")
    assert spec.missing_driver() == "definitely_not_installed_driver"
    async with BackendOptions.scope() as options:
        with pytest.raises(MissingDriverError, match=r"pip install 'runstore\[nd\]'"):
            await spec.open(BackendURL.parse("nd://"), options)


def test_each_plugin_gets_a_view_scoped_to_it() -> None:
    seen: list[object] = []

    def runstore_register_event_stores(registry: EventStoreRegistry) -> None:
        seen.append(registry)
        registry.add("viewed", schemes=["viewed"], factory=_factory)

    loader.register_plugin(_plugin("viewer", runstore_register_event_stores=runstore_register_event_stores))
    backends = get_backends()
    (view,) = seen
    assert isinstance(view, EventStoreRegistry) and view.plugin.name == "viewer"
    assert not hasattr(view, "for_url"), "a plugin's view adds; it does not expose the table"
    assert backends.events.get("viewed").plugin.name == "viewer"
    assert backends.events.get("memory").plugin.name == "memory", "other plugins keep their names"


@dataclasses.dataclass(frozen=True)
class _AcmeSettings:
    region: str = "eu"
    retries: int = dataclasses.field(default=3, metadata=bounds(0, 10))


def _settings_plugin(name: str, section: str, schema: type) -> types.ModuleType:
    def runstore_register_settings(registry: SettingsRegistry) -> None:
        registry.add(section, schema, description="acme knobs")

    return _plugin(name, runstore_register_settings=runstore_register_settings)


def test_a_plugin_declares_a_settings_section() -> None:
    loader.register_plugin(_settings_plugin("acme_settings", "acme", _AcmeSettings))
    section = get_backends().settings.get("acme")
    assert section is not None and section.schema is _AcmeSettings
    assert section.plugin.name == "acme_settings" and section.description == "acme knobs"
    builtin = {s.name: s.plugin.name for s in get_backends().settings}
    assert builtin["sqlite"] == "sqlite" and builtin["postgres"] == "postgres"


@dataclasses.dataclass
class _Mutable:
    x: int = 1


@dataclasses.dataclass(frozen=True)
class _ListValued:
    hosts: list = dataclasses.field(default_factory=list)


@pytest.mark.parametrize(
    ("section", "schema", "error", "match"),
    [
        ("Acme", _AcmeSettings, PluginError, "lowercase letters"),
        ("acme__x", _AcmeSettings, PluginError, "single underscores"),
        ("acme", dict, PluginError, "must be a dataclass"),
        ("acme", _Mutable, PluginError, "frozen=True"),
        ("sqlite", _AcmeSettings, DuplicateBackendError, r"'sqlite': sqlite \(runstore.*bad_settings"),
    ],
)
def test_bad_settings_sections_fail_at_load(section: str, schema: type, error: type, match: str) -> None:
    loader.register_plugin(_settings_plugin("bad_settings", section, schema))
    with pytest.raises(error, match=match):
        get_backends()


@pytest.mark.parametrize(
    ("section", "schema", "match"),
    [
        ("run_events", _AcmeSettings, "'run_events', which is a built-in key"),
        ("acme", _ListValued, "key 'hosts' has type <class 'list'>; accepted: int, float, str"),
    ],
)
def test_settings_sections_runstore_cannot_read_fail_at_first_use(
    section: str, schema: type, match: str
) -> None:
    loader.register_plugin(_settings_plugin("odd_settings", section, schema))
    with pytest.raises(PluginError, match=match):
        Settings.load({"acme": {}}, env={})


def test_import_runstore_is_light() -> None:
    import subprocess
    import sys

    code = (
        "import sys, runstore; from runstore.loader import get_backends; get_backends(); runstore.Settings;"
        "bad = [m for m in ('pytest', 'hypothesis', 'asyncpg', 'redis', 'aiosqlite') if m in sys.modules];"
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


# -- factories named "module:attr" -----------------------------------------------------

LAZY_BACKEND = """
class LazyStore:
    @classmethod
    async def open(cls, url, options):
        store = cls()
        store.url = str(url)
        return store
"""


@pytest.fixture
def lazy_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A module on sys.path that nothing has imported yet."""
    name = f"runstore_lazy_{id(tmp_path):x}"
    (tmp_path / f"{name}.py").write_text(LAZY_BACKEND)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


async def test_a_factory_named_by_string_is_imported_on_first_open(lazy_module: str) -> None:
    def runstore_register_event_stores(registry: EventStoreRegistry) -> None:
        registry.add("lazy", schemes=["lazy"], factory=f"{lazy_module}:LazyStore.open")

    loader.register_plugin(_plugin("lazy_plugin", runstore_register_event_stores=runstore_register_event_stores))
    spec = get_backends().events.get("lazy")
    assert spec.factory == f"{lazy_module}:LazyStore.open"
    assert lazy_module not in sys.modules, "registering must not import the backend module"
    async with BackendOptions.scope() as options:
        store: Any = await spec.open(BackendURL.parse("lazy://x"), options)
    assert type(store).__name__ == "LazyStore" and store.url == "lazy://x"
    assert lazy_module in sys.modules


@pytest.mark.parametrize("factory", ["acme.open", "acme:", ":open", "acme:Store..open", "a b:c", 42, None])
def test_a_malformed_factory_is_refused_at_registration(factory: object) -> None:
    def runstore_register_event_stores(registry: EventStoreRegistry) -> None:
        registry.add("odd", schemes=["odd"], factory=factory)  # type: ignore[arg-type]

    loader.register_plugin(_plugin("odd_plugin", runstore_register_event_stores=runstore_register_event_stores))
    with pytest.raises(PluginError, match=r"events backend 'odd' from plugin odd_plugin: factory must be .*'package.module:attr'"):
        get_backends()


@pytest.mark.parametrize(
    ("factory", "cause"),
    [
        ("runstore_no_such_module_xyz:Store.open", ImportError),
        ("runstore.plugins.memory.events:NoSuchStore.open", AttributeError),
    ],
)
async def test_a_factory_that_cannot_be_imported_fails_at_open_naming_it(
    factory: str, cause: type[BaseException]
) -> None:
    def runstore_register_event_stores(registry: EventStoreRegistry) -> None:
        registry.add("ghost", schemes=["ghost"], factory=factory)

    loader.register_plugin(_plugin("ghost_plugin", runstore_register_event_stores=runstore_register_event_stores))
    spec = get_backends().events.get("ghost")  # listing works: nothing is imported yet
    async with BackendOptions.scope() as options:
        with pytest.raises(PluginError, match=f"'ghost' from plugin ghost_plugin: cannot import its factory '{factory}'") as info:
            await spec.open(BackendURL.parse("ghost://"), options)
    assert isinstance(info.value.__cause__, cause)


def test_a_factory_naming_something_not_callable_fails_at_open() -> None:
    def runstore_register_event_stores(registry: EventStoreRegistry) -> None:
        registry.add("const", schemes=["const"], factory="runstore.loader:ENTRY_POINT_GROUP")

    loader.register_plugin(_plugin("const_plugin", runstore_register_event_stores=runstore_register_event_stores))
    with pytest.raises(PluginError, match="names 'runstore', which is not callable"):
        get_backends().events.get("const").opener()


def test_every_built_in_backend_names_its_factory() -> None:
    """No wrapper functions: each built-in entry names its backend class's ``open``."""
    builtins = [s for s in get_backends().all() if s.plugin.distribution == "runstore"]
    assert len(builtins) >= 15
    for spec in builtins:
        assert isinstance(spec.factory, str) and spec.factory.endswith(".open"), spec
        opener: Any = spec.opener()
        assert opener.__self__.__module__ == spec.factory.partition(":")[0], spec


# -- RUNSTORE_PLUGINS: the allow-list ---------------------------------------------------


def _plugin_names() -> set[str]:
    """The plugins loaded (a blocked name is listed by pluggy with no plugin)."""
    return {name for name, plugin in loader.get_plugin_manager().list_name_plugin() if plugin is not None}


def test_the_allow_list_loads_only_the_plugins_it_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNSTORE_PLUGINS", "memory, sqlite")
    loader.reset()
    backends = get_backends()
    assert _plugin_names() == {"memory", "sqlite"}
    assert {s.name for s in backends.events} == {"memory", "sqlite"}
    assert not backends.streams.serves("redis://h") and not backends.savers.serves("postgres://h/db")
    assert {s.name for s in backends.settings} == {"sqlite"}


def test_the_allow_list_names_a_plugin_that_is_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNSTORE_PLUGINS", "memory,acme")
    loader.reset()
    with pytest.raises(PluginError, match=r"RUNSTORE_PLUGINS names 'acme', which is not installed; the runstore plugins found: jsonl, memory, postgres, redis, sqlite"):
        get_backends()


def test_disabling_wins_over_the_allow_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNSTORE_PLUGINS", "memory,sqlite")
    monkeypatch.setenv("RUNSTORE_DISABLE_PLUGINS", "sqlite")
    loader.reset()
    assert _plugin_names() == {"memory"}


def test_the_allow_list_may_name_a_plugin_registered_in_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    def runstore_register_event_stores(registry: EventStoreRegistry) -> None:
        registry.add("acme", schemes=["acme"], factory=_factory)

    monkeypatch.setenv("RUNSTORE_PLUGINS", "memory,acme_plugin")
    loader.register_plugin(_plugin("acme_plugin", runstore_register_event_stores=runstore_register_event_stores))
    assert _plugin_names() == {"memory", "acme_plugin"}
    assert get_backends().events.for_url("acme://").plugin.name == "acme_plugin"


# -- the built-in plugins without entry-point metadata ----------------------------------


def test_builtin_list_matches_the_entry_points_pyproject_declares() -> None:
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert pyproject["project"]["entry-points"]["runstore"] == loader.BUILTIN_PLUGINS


def _hide_metadata(monkeypatch: pytest.MonkeyPatch, *keep: importlib.metadata.EntryPoint) -> None:
    """Entry points as in a source tree on PYTHONPATH: runstore's own are absent."""
    def entry_points(**params: Any) -> importlib.metadata.EntryPoints:
        assert params == {"group": loader.ENTRY_POINT_GROUP}
        return importlib.metadata.EntryPoints(keep)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    loader.reset()


def test_builtins_are_found_without_entry_point_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    _hide_metadata(monkeypatch)
    backends = get_backends()
    assert _plugin_names() == set(loader.BUILTIN_PLUGINS)
    assert {s.name for s in backends.savers} == {"memory", "sqlite", "postgres"}
    assert {s.name for s in backends.events} == {"memory", "jsonl", "sqlite", "postgres"}
    assert backends.streams.for_url("redis://h").plugin == PluginInfo("redis", "runstore", runstore.__version__)


def test_the_fallback_keeps_third_party_plugins_and_the_env_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    # A third party's entry point that loads a built-in module under its own name.
    third = importlib.metadata.EntryPoint("thirdparty", "runstore.plugins.jsonl", loader.ENTRY_POINT_GROUP)
    _hide_metadata(monkeypatch, third)
    monkeypatch.setenv("RUNSTORE_DISABLE_PLUGINS", "redis")
    loader.reset()
    # The jsonl module is registered once, as "thirdparty"; redis stays disabled.
    assert _plugin_names() == {"thirdparty", "memory", "sqlite", "postgres"}
    assert get_backends().events.get("jsonl").plugin.name == "thirdparty"
    monkeypatch.setenv("RUNSTORE_PLUGINS", "memory,thirdparty")
    loader.reset()
    assert _plugin_names() == {"thirdparty", "memory"}


def test_builtins_are_registered_once_when_their_entry_points_are_present() -> None:
    eps = {ep.name: ep for ep in importlib.metadata.entry_points(group=loader.ENTRY_POINT_GROUP)}
    assert {eps[name].dist.name for name in loader.BUILTIN_PLUGINS} == {"runstore"}  # type: ignore[union-attr]
    pm = loader.get_plugin_manager()
    loaded = [plugin for _, plugin in pm.list_name_plugin()]
    assert len(loaded) == len({id(p) for p in loaded}), "a module registered under two names"
    for name, module in loader.BUILTIN_PLUGINS.items():
        assert pm.get_plugin(name) is sys.modules[module]
    assert get_backends().savers.get("memory").plugin.distribution == "runstore"
