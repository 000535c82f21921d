from __future__ import annotations

import types
from collections.abc import Iterator

import pytest

import runstore
from runstore import loader
from runstore.errors import (
    BackendNotFoundError,
    DuplicateBackendError,
    MissingDriverError,
    PluginError,
)
from runstore.options import BackendOptions
from runstore.urls import BackendURL


@pytest.fixture(autouse=True)
def _fresh_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("RUNSTORE_DISABLE_PLUGINS", raising=False)
    loader.reset()
    yield
    for name, _ in list(loader._extra):
        loader.unregister_plugin(name)
    loader.reset()


def _plugin(name: str, **hooks: object) -> types.ModuleType:
    module = types.ModuleType(name)
    for hook_name, fn in hooks.items():
        setattr(module, hook_name, runstore.hookimpl(fn))  # type: ignore[arg-type]
    return module


async def _factory(url: BackendURL, options: BackendOptions) -> object:
    return ("opened", str(url))


def test_builtins_load_through_entry_points() -> None:
    backends = runstore.get_backends()
    assert {s.name for s in backends.events} >= {"memory", "jsonl", "sqlite", "postgres"}
    assert {s.name for s in backends.savers} >= {"memory", "sqlite", "postgres"}
    assert {s.name for s in backends.streams} >= {"memory", "redis"}
    sqlite = backends.events.get("sqlite")
    assert sqlite.plugin.distribution == "runstore"
    assert sqlite.plugin.version == runstore.__version__
    assert backends.savers.for_url("postgres://h/db").name == "postgres"


def test_unknown_scheme_lists_installed_backends() -> None:
    with pytest.raises(BackendNotFoundError) as info:
        runstore.get_backends().events.for_url("mongodb://h/db")
    message = str(info.value)
    assert "'mongodb'" in message and "sqlite://" in message and "jsonl://" in message


def test_registered_plugin_is_selectable() -> None:
    def runstore_register_event_stores(registry: runstore.EventStoreRegistry) -> None:
        registry.add("acme", schemes=["acme"], factory=_factory, capabilities=["durable"])

    loader.register_plugin(_plugin("acme_plugin", runstore_register_event_stores=runstore_register_event_stores))
    spec = runstore.get_backends().events.for_url("acme://x")
    assert spec.name == "acme" and spec.plugin.name == "acme_plugin"
    assert spec.capabilities == frozenset({"durable"})


def test_duplicate_name_names_both_plugins() -> None:
    def runstore_register_savers(registry: runstore.SaverRegistry) -> None:
        registry.add("memory", schemes=["mem2"], factory=_factory)

    loader.register_plugin(_plugin("copycat", runstore_register_savers=runstore_register_savers))
    with pytest.raises(DuplicateBackendError) as info:
        runstore.get_backends()
    assert "memory (runstore" in str(info.value) and "copycat" in str(info.value)


def test_duplicate_scheme_names_both_plugins() -> None:
    def runstore_register_stream_bridges(registry: runstore.StreamBridgeRegistry) -> None:
        registry.add("fastredis", schemes=["redis"], factory=_factory)

    loader.register_plugin(_plugin("fastredis_plugin", runstore_register_stream_bridges=runstore_register_stream_bridges))
    with pytest.raises(DuplicateBackendError, match=r"redis://.*'redis' from redis.*'fastredis' from fastredis_plugin"):
        runstore.get_backends()


def test_disable_plugins_env_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNSTORE_DISABLE_PLUGINS", "jsonl, redis")
    loader.reset()
    backends = runstore.get_backends()
    assert "jsonl" not in {s.name for s in backends.events}
    assert not backends.streams.serves("redis://h")
    assert backends.events.serves("memory://")


def test_disabled_plugin_frees_its_names(monkeypatch: pytest.MonkeyPatch) -> None:
    def runstore_register_stream_bridges(registry: runstore.StreamBridgeRegistry) -> None:
        registry.add("fastredis", schemes=["redis"], factory=_factory)

    monkeypatch.setenv("RUNSTORE_DISABLE_PLUGINS", "redis")
    loader.register_plugin(_plugin("fastredis_plugin", runstore_register_stream_bridges=runstore_register_stream_bridges))
    assert runstore.get_backends().streams.for_url("redis://h").name == "fastredis"


def test_misspelled_hook_fails_at_load() -> None:
    def runstore_register_saverz(registry: object) -> None:  # typo on purpose
        pass

    loader.register_plugin(_plugin("typo_plugin", runstore_register_saverz=runstore_register_saverz))
    with pytest.raises(PluginError, match="typo_plugin"):
        runstore.get_backends()


def test_unknown_capability_rejected() -> None:
    def runstore_register_event_stores(registry: runstore.EventStoreRegistry) -> None:
        registry.add("x", schemes=["x"], factory=_factory, capabilities=["teleport"])

    loader.register_plugin(_plugin("caps", runstore_register_event_stores=runstore_register_event_stores))
    with pytest.raises(PluginError, match="unknown capabilities \\['teleport'\\]"):
        runstore.get_backends()


async def test_missing_driver_names_the_extra() -> None:
    def runstore_register_event_stores(registry: runstore.EventStoreRegistry) -> None:
        registry.add(
            "needsdriver", schemes=["nd"], factory=_factory,
            drivers=["definitely_not_installed_driver"], extra="nd",
        )

    loader.register_plugin(_plugin("nd", runstore_register_event_stores=runstore_register_event_stores))
    spec = runstore.get_backends().events.for_url("nd://")
    assert spec.missing_driver() == "definitely_not_installed_driver"
    async with BackendOptions.scope() as options:
        with pytest.raises(MissingDriverError, match=r"pip install 'runstore\[nd\]'"):
            await spec.open(BackendURL.parse("nd://"), options)


def test_import_runstore_is_light() -> None:
    import subprocess
    import sys

    code = (
        "import sys, runstore; runstore.get_backends(); runstore.Settings;"
        "bad = [m for m in ('pytest', 'hypothesis', 'asyncpg', 'redis', 'aiosqlite') if m in sys.modules];"
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
