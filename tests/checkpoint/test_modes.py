"""Mode resolution and freezing, schemas and their adaptation, the marker."""

from __future__ import annotations

import typing
from typing import Annotated, TypedDict

import pytest
from langgraph.channels.delta import DeltaChannel
from langgraph.graph.message import add_messages

import runstore
from runstore import CheckpointModeReconfigurationError
from runstore.checkpoint import modes


def _meta(schema: type, key: str) -> tuple[object, ...]:
    return typing.get_type_hints(schema, include_extras=True)[key].__metadata__


def test_public_names_importable() -> None:
    for name in (
        "get_thread_state_schema",
        "freeze_checkpoint_channel_mode",
        "freeze_checkpoint_snapshot_frequency",
        "inject_checkpoint_mode",
        "CheckpointStateAccessor",
        "CachedHistorySaver",
        "CheckpointModeMismatchError",
    ):
        assert getattr(runstore, name) is not None


def test_freeze_first_use_then_reconfiguration_error() -> None:
    assert runstore.freeze_checkpoint_channel_mode("delta") == "delta"
    assert runstore.freeze_checkpoint_channel_mode() == "delta"
    assert runstore.freeze_checkpoint_channel_mode("delta") == "delta"
    with pytest.raises(CheckpointModeReconfigurationError):
        runstore.freeze_checkpoint_channel_mode("full")
    assert runstore.freeze_checkpoint_snapshot_frequency(5) == 5
    with pytest.raises(CheckpointModeReconfigurationError):
        runstore.freeze_checkpoint_snapshot_frequency(6)


@pytest.mark.parametrize("bad", [0, -1])
def test_non_positive_frequency_is_value_error(bad: int) -> None:
    with pytest.raises(ValueError):
        runstore.freeze_checkpoint_snapshot_frequency(bad)
    with pytest.raises(ValueError):
        runstore.get_thread_state_schema("delta", bad)


def test_resolution_order_explicit_frozen_config_default() -> None:
    assert modes.resolve_checkpoint_channel_mode() == "full"  # default
    assert modes.resolve_snapshot_frequency() == 10
    modes.set_config_settings(runstore.Settings.load({"checkpoint_channel_mode": "delta",
                                                      "checkpoint_delta": {"snapshot_frequency": 7}}, env={}))
    assert modes.resolve_checkpoint_channel_mode() == "delta"  # config
    assert modes.resolve_snapshot_frequency() == 7
    assert modes.freeze_checkpoint_channel_mode() == "delta"  # freezes from config
    modes.set_config_settings(runstore.Settings.load({}, env={}))
    assert modes.resolve_checkpoint_channel_mode() == "delta"  # frozen beats config
    assert modes.resolve_checkpoint_channel_mode("full") == "full"  # explicit beats frozen (no freeze)


async def test_open_freezes_and_rejects_a_second_mode() -> None:
    cfg = {"checkpointer": "memory://", "events": "memory://", "streams": "memory://"}
    async with runstore.open({**cfg, "checkpoint_channel_mode": "delta"}):
        pass
    assert modes.frozen_checkpoint_settings() == ("delta", 10)
    with pytest.raises(CheckpointModeReconfigurationError):
        async with runstore.open({**cfg, "checkpoint_channel_mode": "full"}):
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
    # without an explicit mode it uses (and freezes) the process mode
    runstore.inject_checkpoint_mode(cfg)
    assert modes.frozen_checkpoint_settings()[0] == "full"
