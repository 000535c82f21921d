"""Mode resolution and freezing, schemas and their adaptation, the marker."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Annotated, TypedDict

import pytest
from langgraph.channels.delta import DeltaChannel
from langgraph.graph.message import add_messages

import runstore
from runstore.checkpoint import modes
from runstore.checkpoint.modes import (
    freeze_checkpoint_channel_mode,
    freeze_checkpoint_snapshot_frequency,
)
from runstore.errors import CheckpointModeError, CheckpointModeReconfigurationError


def _meta(schema: type, key: str) -> tuple[object, ...]:
    return typing.get_type_hints(schema, include_extras=True)[key].__metadata__


def test_public_names_importable() -> None:
    for name in ("get_thread_state_schema", "inject_checkpoint_mode", "CheckpointStateAccessor", "CachedHistorySaver"):
        assert name in runstore.__all__ and getattr(runstore, name) is not None
    # Former top-level names still answer, with a warning naming their module.
    for name in ("freeze_checkpoint_channel_mode", "freeze_checkpoint_snapshot_frequency", "CheckpointModeMismatchError"):
        with pytest.warns(DeprecationWarning, match=name):
            assert getattr(runstore, name) is not None


def test_freeze_first_use_then_reconfiguration_error() -> None:
    assert freeze_checkpoint_channel_mode("delta") == "delta"
    assert freeze_checkpoint_channel_mode() == "delta"
    assert freeze_checkpoint_channel_mode("delta") == "delta"
    with pytest.raises(CheckpointModeReconfigurationError):
        freeze_checkpoint_channel_mode("full")
    assert freeze_checkpoint_snapshot_frequency(5) == 5
    with pytest.raises(CheckpointModeReconfigurationError):
        freeze_checkpoint_snapshot_frequency(6)


@pytest.mark.parametrize("bad", [0, -1])
def test_non_positive_frequency_is_value_error(bad: int) -> None:
    with pytest.raises(ValueError):
        freeze_checkpoint_snapshot_frequency(bad)
    with pytest.raises(ValueError):
        runstore.get_thread_state_schema("delta", bad)


def test_resolution_order_explicit_frozen_open_stores_config_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("RUNSTORE_CONFIG", "RUNSTORE_CHECKPOINT_CHANNEL_MODE"):
        monkeypatch.delenv(name, raising=False)
    assert modes.resolve_checkpoint_channel_mode() == "full"  # default
    assert modes.resolve_snapshot_frequency() == 10
    monkeypatch.setenv("RUNSTORE_CHECKPOINT_CHANNEL_MODE", "delta")
    assert modes.resolve_checkpoint_channel_mode() == "delta"  # environment / YAML
    settings = runstore.Settings.load(
        {"checkpoint_channel_mode": "full", "checkpoint_delta": {"snapshot_frequency": 7}}, env={}
    )
    modes.reset_checkpoint_mode_for_tests()
    modes.enter_open(settings)
    assert modes.resolve_checkpoint_channel_mode() == "full"  # open stores beat configuration
    assert modes.resolve_snapshot_frequency() == 7
    assert modes.resolve_checkpoint_channel_mode("delta") == "delta"  # explicit beats all
    modes.leave_open(settings)
    assert modes.freeze_checkpoint_channel_mode("full") == "full"
    assert modes.resolve_checkpoint_channel_mode() == "full"  # frozen beats configuration
    assert modes.frozen_checkpoint_settings() == ("full", None)


_MEMORY = {"checkpointer": "memory://", "events": "memory://", "streams": "memory://"}


async def test_a_second_open_may_choose_another_mode() -> None:
    async with runstore.open({**_MEMORY, "checkpoint_channel_mode": "delta"}) as stores:
        assert modes.resolve_checkpoint_channel_mode() == "delta"
        assert stores.thread_state_schema() is runstore.get_thread_state_schema("delta", 10)
    assert modes.frozen_checkpoint_settings() == (None, None), "opening freezes nothing"
    async with runstore.open({**_MEMORY, "checkpoint_channel_mode": "full"}) as stores:
        schema = runstore.get_thread_state_schema()
        assert schema is runstore.get_thread_state_schema("full")
        acc = runstore.CheckpointStateAccessor.bind(None, stores.checkpointer)
        assert acc.mode == "full"
    async with runstore.open(
        {**_MEMORY, "checkpoint_channel_mode": "delta", "checkpoint_delta": {"snapshot_frequency": 4}}
    ) as stores:
        acc = runstore.CheckpointStateAccessor.bind(None, stores.checkpointer)
        assert (acc.mode, acc.snapshot_frequency) == ("delta", 4), "the accessor takes the saver's mode"


async def test_overlapping_opens_with_two_modes_need_an_explicit_mode() -> None:
    async with runstore.open({**_MEMORY, "checkpoint_channel_mode": "delta"}) as delta:
        async with runstore.open({**_MEMORY, "checkpoint_channel_mode": "full"}) as full:
            with pytest.raises(CheckpointModeError, match="pass mode="):
                runstore.get_thread_state_schema()
            assert runstore.CheckpointStateAccessor.bind(None, delta.checkpointer).mode == "delta"
            assert runstore.CheckpointStateAccessor.bind(None, full.checkpointer).mode == "full"
        assert modes.resolve_checkpoint_channel_mode() == "delta"


async def test_schema_before_open_never_silently_mismatches(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("RUNSTORE_CONFIG", "RUNSTORE_CHECKPOINT_CHANNEL_MODE"):
        monkeypatch.delenv(name, raising=False)
    # the mode configured where a no-argument runstore.open() reads it: the schema follows it
    (tmp_path / "runstore.yaml").write_text("checkpoint_channel_mode: delta\ncheckpointer: memory://\n")
    early = runstore.get_thread_state_schema()
    assert early is runstore.get_thread_state_schema("delta", 10)
    async with runstore.open() as stores:
        assert stores.thread_state_schema() is early
    # the mode given only to runstore.open: the early schema was the other mode's, so it is an error
    (tmp_path / "runstore.yaml").unlink()
    modes.reset_checkpoint_mode_for_tests()
    early = runstore.get_thread_state_schema()
    assert early is runstore.get_thread_state_schema("full")
    with pytest.raises(CheckpointModeError, match=r"'full'.*before any stores were open.*'delta/10'"):
        async with runstore.open({**_MEMORY, "checkpoint_channel_mode": "delta"}):
            pass
    assert not modes._open, "a refused open leaves nothing registered"
    # matching stores accept it, and later opens are free again
    async with runstore.open({**_MEMORY, "checkpoint_channel_mode": "full"}):
        pass
    async with runstore.open({**_MEMORY, "checkpoint_channel_mode": "delta"}):
        pass


async def test_an_explicit_freeze_still_refuses_another_mode() -> None:
    freeze_checkpoint_channel_mode("delta")
    with pytest.raises(CheckpointModeReconfigurationError):
        async with runstore.open({**_MEMORY, "checkpoint_channel_mode": "full"}):
            pass


def test_schemas_per_mode_and_cached() -> None:
    full = runstore.get_thread_state_schema("full")
    delta = runstore.get_thread_state_schema("delta", 3)
    assert runstore.get_thread_state_schema("delta", 3) is delta
    assert add_messages in _meta(full, "messages")
    (channel,) = _meta(delta, "messages")
    assert isinstance(channel, DeltaChannel) and channel.snapshot_frequency == 3
    assert modes.frozen_checkpoint_settings() == (None, None), "explicit args never freeze"


class Middleware(TypedDict, total=False):
    messages: Annotated[list, add_messages]
    todos: list[str]


class NoMessages(TypedDict, total=False):
    title: str


def test_adapt_extra_schema() -> None:
    adapted = modes.adapt_state_schema(Middleware, "delta", 4)
    assert modes.adapt_state_schema(Middleware, "delta", 4) is adapted
    assert isinstance(_meta(adapted, "messages")[0], DeltaChannel)
    assert "todos" in typing.get_type_hints(adapted)
    assert modes.adapt_state_schema(NoMessages, "delta", 4) is NoMessages
    merged = runstore.get_thread_state_schema("delta", 4, extra_schemas=[Middleware, NoMessages])
    assert set(typing.get_type_hints(merged)) == {"messages", "todos", "title"}


def test_marker_detection() -> None:
    assert modes.is_delta_metadata({"runstore_checkpoint_channel_mode": "delta"})
    assert modes.is_delta_metadata({"deerflow_checkpoint_channel_mode": "delta"})
    assert modes.is_delta_metadata({"counters_since_delta_snapshot": {"messages": [1, 1]}})
    assert not modes.is_delta_metadata({"counters_since_delta_snapshot": {"other": [1, 1]}})
    assert not modes.is_delta_metadata({"source": "loop"})
    assert not modes.is_delta_metadata(None)


def test_inject_checkpoint_mode() -> None:
    cfg = {"configurable": {"thread_id": "t"}, "metadata": {"a": 1}}
    out = runstore.inject_checkpoint_mode(cfg, "delta")
    assert out["metadata"] == {"a": 1, "runstore_checkpoint_channel_mode": "delta"}
    assert cfg["metadata"] == {"a": 1}, "input config untouched"
    assert "runstore_checkpoint_channel_mode" not in runstore.inject_checkpoint_mode(out, "full")["metadata"]
    # without an explicit mode it uses the resolved mode and freezes nothing
    runstore.inject_checkpoint_mode(cfg)
    assert modes.frozen_checkpoint_settings() == (None, None)
