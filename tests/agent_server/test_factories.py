"""The factories in `runstore.agent_server` without a server: what they read and open."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from runstore import agent_server
from runstore.checkpoint.forwarding import unwrap_saver
from runstore.checkpoint.walk import ParentWalkSaver
from runstore.errors import ConfigError
from runstore.plugins.sqlite.saver import SqliteSaver


async def test_checkpointer_opens_the_configured_saver_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "server.db"
    monkeypatch.setenv("RUNSTORE_CHECKPOINTER_URL", f"sqlite:///{db}")
    monkeypatch.setenv("RUNSTORE_EVENTS_URL", f"sqlite:///{tmp_path}/events.db")
    monkeypatch.setenv("RUNSTORE_CHECKPOINT_CHANNEL_MODE", "delta")
    async with agent_server.checkpointer() as saver:
        assert isinstance(saver, ParentWalkSaver)
        assert isinstance(unwrap_saver(saver), SqliteSaver)
        await saver.aget_tuple({"configurable": {"thread_id": "t"}})
    tables = {r[0] for r in sqlite3.connect(db).execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "runstore_checkpoints" in tables and "runstore_runs" not in tables
    assert not (tmp_path / "events.db").exists(), "only the checkpointer kind is opened"


def test_settings_for_selects_one_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNSTORE_EVENTS_URL", "memory://")
    monkeypatch.setenv("RUNSTORE_STORE_URL", "memory://")
    assert agent_server.settings_for("store").selected_kinds() == ("store",)
    assert agent_server.checkpointer_settings().selected_kinds() == ("checkpointer",)


def test_store_config_comes_from_the_server_environment() -> None:
    section = {"path": "runstore.agent_server.store", "ttl": {"default_ttl": 5.0}}
    assert agent_server.server_store_config({"LANGGRAPH_STORE": json.dumps(section)}) == (None, {"default_ttl": 5.0})
    assert agent_server.server_store_config({}) == (None, None)
    with pytest.raises(ConfigError, match="LANGGRAPH_STORE"):
        agent_server.server_store_config({"LANGGRAPH_STORE": "{not json"})


async def test_store_applies_the_server_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LANGGRAPH_STORE", json.dumps({"ttl": {"default_ttl": 5.0}}))
    monkeypatch.setenv("RUNSTORE_STORE_URL", "memory://")
    async with agent_server.store() as store:
        assert store.ttl_config is not None and store.ttl_config.get("default_ttl") == 5.0
        await store.aput(("users",), "k", {"v": 1})
        item = await store.aget(("users",), "k")
        assert item is not None and item.value == {"v": 1}
