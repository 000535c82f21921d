"""`runstore.open`: the embedded default, explicit URLs, errors, and closing everything."""

from __future__ import annotations

import importlib.util
import logging
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

import runstore
from runstore import loader
from runstore.checkpoint.forwarding import unwrap_saver
from runstore.errors import BackendNotFoundError, MissingDriverError, StoreNotOpenedError
from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.registry import StreamBridgeRegistry
from runstore.urls import BackendURL


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    for name in ("RUNSTORE_CHECKPOINTER_URL", "RUNSTORE_EVENTS_URL", "RUNSTORE_STREAMS_URL",
                 "RUNSTORE_RUNS_URL", "RUNSTORE_STORE_URL", "RUNSTORE_CONFIG", "RUNSTORE_DISABLE_PLUGINS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    from runstore.checkpoint.modes import reset_checkpoint_mode_for_tests

    reset_checkpoint_mode_for_tests()
    before = {name for name, _ in loader._extra}  # the session's plugins stay registered
    yield
    reset_checkpoint_mode_for_tests()
    for name, _ in list(loader._extra):
        if name not in before:
            loader.unregister_plugin(name)
    loader.reset()


async def test_embedded_default_is_one_sqlite_file_and_memory_bridge(tmp_path: Path) -> None:
    async with runstore.open() as stores:
        assert type(stores.checkpointer).__name__ in ("SqliteSaver", "CachedHistorySaver")
        assert type(stores.events).__name__ == "SqliteEventStore"
        assert type(stores.streams).__name__ == "MemoryStreamBridge"
        assert type(stores.runs).__name__ == "SqliteRunStore"
        await stores.runs.create("t", run_id="r")
        record = await stores.events.put(
            thread_id="t", run_id="r", event_type="note", category="message", content="hi", user_id=None
        )
        assert record["seq"] == 1
    assert (tmp_path / ".runstore" / "runstore.db").is_file()
    async with runstore.open() as stores:
        assert await stores.events.count_messages("t", user_id=None) == 1
        assert [r["run_id"] for r in await stores.runs.list_by_thread("t")] == ["r"]


async def test_explicit_urls_and_config_mapping() -> None:
    async with runstore.open(
        {"stream_bridge": {"queue_maxsize": 4}},
        checkpointer="memory://", events="memory://", streams="memory://", runs="memory://",
    ) as stores:
        assert type(stores.runs).__name__ == "MemoryRunStore"
        assert type(stores.checkpointer).__name__ in ("MemorySaver", "CachedHistorySaver")
        assert type(stores.events).__name__ == "MemoryEventStore"
        assert stores.settings.stream_bridge.queue_maxsize == 4


async def test_environment_selects_backends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNSTORE_EVENTS_URL", "memory://")
    monkeypatch.setenv("RUNSTORE_CHECKPOINTER_URL", "memory://")
    monkeypatch.setenv("RUNSTORE_RUNS_URL", "memory://")
    async with runstore.open() as stores:
        assert type(stores.events).__name__ == "MemoryEventStore"
        assert type(stores.runs).__name__ == "MemoryRunStore"


async def test_yaml_file_selects_backends(tmp_path: Path) -> None:
    (tmp_path / "runstore.yaml").write_text("checkpointer: memory://\nevents: memory://\nruns: memory://\n")
    async with runstore.open() as stores:
        assert type(stores.events).__name__ == "MemoryEventStore"
        assert type(stores.runs).__name__ == "MemoryRunStore"
    assert not (tmp_path / ".runstore").exists()


async def test_unknown_scheme_opens_nothing(tmp_path: Path) -> None:
    with pytest.raises(BackendNotFoundError, match=r"'nosuch'.*memory://"):
        async with runstore.open(streams="nosuch://x"):
            pass
    assert not (tmp_path / ".runstore").exists(), "a bad URL must fail before anything is opened"


async def test_missing_driver_names_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "asyncpg" else real(name, *a)
    )
    with pytest.raises(MissingDriverError, match=r"pip install 'runstore\[postgres\]'"):
        async with runstore.open(checkpointer="memory://", events="postgresql://u@h/db"):
            pass


async def test_password_never_leaks(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    url = "postgresql://runstore:sup3rsecret@127.0.0.1:1/nodb"
    with pytest.raises(Exception) as info:
        async with runstore.open(checkpointer="memory://", events=url):
            pass
    assert "sup3rsecret" not in str(info.value)
    assert "sup3rsecret" not in repr(info.value)
    assert "sup3rsecret" not in caplog.text


async def test_everything_opened_is_closed_even_on_error() -> None:
    closed: list[str] = []

    class Bridge:
        async def close(self) -> None:
            closed.append("bridge")

    async def open_bridge(url: BackendURL, options: BackendOptions) -> Bridge:
        options.on_close(lambda: closed.append("pool"))
        return Bridge()

    def runstore_register_stream_bridges(registry: StreamBridgeRegistry) -> None:
        registry.add("closing", schemes=["closing"], factory=open_bridge)

    plugin = types.ModuleType("closing_plugin")
    plugin.runstore_register_stream_bridges = hookimpl(runstore_register_stream_bridges)  # type: ignore[attr-defined]
    loader.register_plugin(plugin)
    with pytest.raises(RuntimeError, match="boom"):
        async with runstore.open(checkpointer="memory://", events="memory://", streams="closing://"):
            raise RuntimeError("boom")
    assert closed == ["bridge", "pool"]


async def test_only_the_kinds_asked_for_are_opened(tmp_path: Path, postgres_url: str) -> None:
    async with runstore.open(checkpointer=postgres_url) as stores:
        assert stores.opened == ("checkpointer",)
        assert type(stores.checkpointer).__name__ == "PostgresSaver", "full mode: the saver itself"
        for kind in ("events", "streams", "runs"):
            with pytest.raises(StoreNotOpenedError, match=rf"no {kind} store.*{kind}=URL"):
                getattr(stores, kind)
    assert not (tmp_path / ".runstore").exists(), "naming other URLs never creates the default file"


async def test_configured_kinds_count_as_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNSTORE_EVENTS_URL", "memory://")
    (tmp_path / "runstore.yaml").write_text("streams: memory://\n")
    async with runstore.open(checkpointer="memory://") as stores:
        assert stores.opened == ("checkpointer", "events", "streams")
        assert type(stores.events).__name__ == "MemoryEventStore"
    assert not (tmp_path / ".runstore").exists()
    settings = runstore.Settings(runs="memory://")  # built directly: a non-default URL is asked for
    async with runstore.open(settings) as stores:
        assert stores.opened == ("runs",)


async def test_the_saver_behind_the_delta_wrappers(postgres_url: str) -> None:
    async with runstore.open({"checkpoint_channel_mode": "delta"}, checkpointer=postgres_url) as stores:
        assert type(stores.checkpointer).__name__ != "PostgresSaver"
        inner = unwrap_saver(stores.checkpointer)
        assert type(inner).__name__ == "PostgresSaver"
        assert unwrap_saver(inner) is inner
