"""Checkpoint channel modes: ``full`` and ``delta`` thread-state schemas, freezing, marker, gate.

In ``full`` mode ``messages`` is a plain reducer channel (`add_messages`); every
checkpoint stores the whole list. In ``delta`` mode it is a LangGraph `DeltaChannel`
whose reducer (`merge_message_writes`) equals folding `add_messages` over the writes;
checkpoints store only a snapshot every ``snapshot_frequency`` updates.

The mode and the snapshot frequency freeze on first use per process (see
`freeze_checkpoint_channel_mode`). Delta checkpoints carry the metadata marker
``runstore_checkpoint_channel_mode: "delta"``; a full-mode process refuses delta
threads (`check_checkpoint_mode`), a delta-mode process reads full threads (that is
the full -> delta migration path).
"""

from __future__ import annotations

import threading
import typing
from collections.abc import Iterable, Mapping
from functools import cache, lru_cache
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypedDict, cast

from langchain_core.messages import AnyMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.graph.message import add_messages

from ..errors import CheckpointModeMismatchError, CheckpointModeReconfigurationError, ConfigError
from .reducer import merge_message_writes
from .saverbase import DELTA_COUNTERS_KEY

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

    from ..settings import Settings

CheckpointChannelMode = Literal["full", "delta"]
MODES: tuple[CheckpointChannelMode, ...] = ("full", "delta")
DEFAULT_MODE: CheckpointChannelMode = "full"
DEFAULT_SNAPSHOT_FREQUENCY = 10

#: Metadata key written on every delta-mode checkpoint.
MODE_METADATA_KEY = "runstore_checkpoint_channel_mode"
#: Marker written by existing deployments of the runtime this layer serves.
LEGACY_MODE_METADATA_KEY = "deerflow_checkpoint_channel_mode"
#: The channel the modes are about.
MESSAGES_CHANNEL = "messages"

_lock = threading.RLock()
_frozen_mode: CheckpointChannelMode | None = None
_frozen_frequency: int | None = None
# Settings registered by runstore.open (the "config" step of resolution).
_config_settings: Settings | None = None


# --------------------------------------------------------------------------- resolution


def _validate_mode(mode: Any) -> CheckpointChannelMode:
    value = mode.lower() if isinstance(mode, str) else mode
    if value not in MODES:
        raise ConfigError(f"checkpoint_channel_mode must be one of full, delta; got {mode!r}")
    return cast(CheckpointChannelMode, value)


def _validate_frequency(frequency: Any) -> int:
    if isinstance(frequency, bool) or not isinstance(frequency, int):
        raise ValueError(f"snapshot_frequency must be a positive int, got {frequency!r}")
    if frequency <= 0:
        raise ValueError(f"snapshot_frequency must be a positive int, got {frequency}")
    return frequency


def set_config_settings(settings: Settings | None) -> None:
    """Use ``settings`` as the "config" step of mode resolution (called by `runstore.open`)."""
    global _config_settings
    with _lock:
        _config_settings = settings


def _settings_mode() -> CheckpointChannelMode | None:
    settings = _config_settings
    return None if settings is None else settings.checkpoint_channel_mode


def _settings_frequency() -> int | None:
    settings = _config_settings
    return None if settings is None else settings.checkpoint_delta.snapshot_frequency


def resolve_checkpoint_channel_mode(mode: str | None = None) -> CheckpointChannelMode:
    """Resolve the mode without freezing it: explicit -> frozen -> config -> default."""
    if mode is not None:
        return _validate_mode(mode)
    if _frozen_mode is not None:
        return _frozen_mode
    return _settings_mode() or DEFAULT_MODE


def resolve_snapshot_frequency(frequency: int | None = None) -> int:
    """Resolve the snapshot frequency without freezing it: explicit -> frozen -> config -> default."""
    if frequency is not None:
        return _validate_frequency(frequency)
    if _frozen_frequency is not None:
        return _frozen_frequency
    return _settings_frequency() or DEFAULT_SNAPSHOT_FREQUENCY


def freeze_checkpoint_channel_mode(mode: str | None = None) -> CheckpointChannelMode:
    """Resolve the process's channel mode and freeze it; return the frozen mode.

    The first call freezes (explicit value, else config, else ``full``); later calls
    return the frozen mode, and an explicit different value raises
    `CheckpointModeReconfigurationError` (restart the process to change modes).
    """
    global _frozen_mode
    with _lock:
        wanted = None if mode is None else _validate_mode(mode)
        if _frozen_mode is not None:
            if wanted is not None and wanted != _frozen_mode:
                raise CheckpointModeReconfigurationError(
                    f"checkpoint_channel_mode is frozen at {_frozen_mode!r} for this process; "
                    f"cannot switch to {wanted!r} (restart the process to change it)"
                )
            return _frozen_mode
        _frozen_mode = wanted or _settings_mode() or DEFAULT_MODE
        return _frozen_mode


def freeze_checkpoint_snapshot_frequency(frequency: int | None = None) -> int:
    """Resolve the delta snapshot frequency and freeze it; return the frozen value.

    A non-positive value raises ``ValueError``; a value different from the frozen
    one raises `CheckpointModeReconfigurationError`.
    """
    global _frozen_frequency
    with _lock:
        wanted = None if frequency is None else _validate_frequency(frequency)
        if _frozen_frequency is not None:
            if wanted is not None and wanted != _frozen_frequency:
                raise CheckpointModeReconfigurationError(
                    "checkpoint_delta.snapshot_frequency is frozen at "
                    f"{_frozen_frequency} for this process; cannot switch to {wanted} "
                    "(it must also match across processes sharing threads)"
                )
            return _frozen_frequency
        _frozen_frequency = wanted or _settings_frequency() or DEFAULT_SNAPSHOT_FREQUENCY
        return _frozen_frequency


def frozen_checkpoint_settings() -> tuple[CheckpointChannelMode | None, int | None]:
    """The frozen ``(mode, snapshot_frequency)``; ``None`` for what is not frozen yet."""
    return _frozen_mode, _frozen_frequency


def reset_checkpoint_mode_for_tests() -> None:
    """Forget the frozen mode, frequency and config settings. For tests only."""
    global _frozen_mode, _frozen_frequency, _config_settings
    with _lock:
        _frozen_mode = None
        _frozen_frequency = None
        _config_settings = None


# --------------------------------------------------------------------------- schemas

# Built dynamically; mypy only accepts literal TypedDict names.
_TypedDict: Any = TypedDict


@cache
def _messages_annotation(mode: CheckpointChannelMode, frequency: int) -> Any:
    if mode == "delta":
        return Annotated[
            list[AnyMessage],
            DeltaChannel(merge_message_writes, list, snapshot_frequency=frequency),
        ]
    return Annotated[list[AnyMessage], add_messages]


def messages_annotation(mode: str | None = None, snapshot_frequency: int | None = None) -> Any:
    """The ``messages`` field annotation for ``mode`` (resolved, not frozen)."""
    resolved = resolve_checkpoint_channel_mode(mode)
    return _messages_annotation(resolved, resolve_snapshot_frequency(snapshot_frequency))


@cache
def _thread_state_schema(mode: CheckpointChannelMode, frequency: int) -> type:
    name = "DeltaThreadState" if mode == "delta" else "FullThreadState"
    # Frequency is part of the channel identity (DeltaChannel equality), so each
    # (mode, frequency) gets one class; StateGraph dedups schemas by class.
    schema = _TypedDict(
        name if mode == "full" else f"{name}{frequency}",
        {MESSAGES_CHANNEL: _messages_annotation(mode, frequency)},
        total=False,
    )
    schema.__module__ = __name__
    return cast(type, schema)


def _is_message_field(name: str, annotation: Any) -> bool:
    if name != MESSAGES_CHANNEL:
        return False
    return bool(getattr(annotation, "__metadata__", ()))


@lru_cache(maxsize=256)
def _adapt(schema: type, mode: CheckpointChannelMode, frequency: int) -> type:
    hints = typing.get_type_hints(schema, include_extras=True)
    if not any(_is_message_field(k, v) for k, v in hints.items()):
        return schema
    fields = {
        k: (_messages_annotation(mode, frequency) if _is_message_field(k, v) else v)
        for k, v in hints.items()
    }
    adapted = _TypedDict(
        f"{getattr(schema, '__name__', 'State')}_{mode}{frequency if mode == 'delta' else ''}",
        fields,
        total=False,
    )
    adapted.__module__ = __name__
    return cast(type, adapted)


def adapt_state_schema(
    schema: type, mode: str | None = None, snapshot_frequency: int | None = None
) -> type:
    """Return ``schema`` with its ``messages`` channel declared for ``mode``.

    A schema without a reducer-annotated ``messages`` field comes back unchanged (the
    same class); otherwise a ``TypedDict`` (total=False) with the same fields and the
    mode's ``messages`` annotation. Cached by (schema, mode, frequency).
    """
    resolved = resolve_checkpoint_channel_mode(mode)
    return _adapt(schema, resolved, resolve_snapshot_frequency(snapshot_frequency))


def get_thread_state_schema(
    mode: str | None = None,
    snapshot_frequency: int | None = None,
    *,
    extra_schemas: Iterable[type] = (),
) -> type:
    """The thread-state ``TypedDict`` for ``mode``: ``messages`` plus every extra schema's fields.

    ``mode``/``snapshot_frequency`` resolve explicit -> frozen -> config -> default and
    are NOT frozen by this call (so tests and tools can build both modes). Extra
    schemas are adapted with `adapt_state_schema` and merged in; a later schema's
    field wins over an earlier one's (``messages`` always uses the mode's channel).
    """
    resolved = resolve_checkpoint_channel_mode(mode)
    frequency = resolve_snapshot_frequency(snapshot_frequency)
    extras = tuple(extra_schemas)
    if not extras:
        return _thread_state_schema(resolved, frequency)
    return _merged_schema(resolved, frequency, extras)


@lru_cache(maxsize=256)
def _merged_schema(
    mode: CheckpointChannelMode, frequency: int, extras: tuple[type, ...]
) -> type:
    fields: dict[str, Any] = {}
    for schema in extras:
        fields.update(typing.get_type_hints(_adapt(schema, mode, frequency), include_extras=True))
    fields[MESSAGES_CHANNEL] = _messages_annotation(mode, frequency)
    names = "_".join(getattr(s, "__name__", "S") for s in extras)
    merged = _TypedDict(
        f"ThreadState_{mode}{frequency if mode == 'delta' else ''}_{names}", fields, total=False
    )
    merged.__module__ = __name__
    return cast(type, merged)


def is_delta_messages_channel(channel: Any) -> bool:
    """Whether ``channel`` is a delta ``messages`` channel built by this module."""
    return isinstance(channel, DeltaChannel) and channel.reducer is merge_message_writes


# --------------------------------------------------------------------------- marker and gate


def is_delta_metadata(metadata: Mapping[str, Any] | None) -> bool:
    """Whether checkpoint ``metadata`` says the thread was written in delta mode.

    True for our marker, the legacy ``deerflow_`` marker, or LangGraph's
    ``counters_since_delta_snapshot.messages`` counters.
    """
    if not metadata:
        return False
    if metadata.get(MODE_METADATA_KEY) == "delta":
        return True
    if metadata.get(LEGACY_MODE_METADATA_KEY) == "delta":
        return True
    counters = metadata.get(DELTA_COUNTERS_KEY)
    return isinstance(counters, Mapping) and MESSAGES_CHANNEL in counters


def checkpoint_mode_of(metadata: Mapping[str, Any] | None) -> CheckpointChannelMode:
    """The mode a checkpoint was written in (no marker means ``full``)."""
    return "delta" if is_delta_metadata(metadata) else "full"


def inject_checkpoint_mode(config: RunnableConfig | None, mode: str | None = None) -> RunnableConfig:
    """Return a copy of ``config`` whose metadata carries the mode marker when ``mode`` is delta.

    LangGraph copies ``config["metadata"]`` into every checkpoint it writes, so a run
    started with this config marks its checkpoints. ``mode`` defaults to the frozen
    process mode (freezing it on first use). In full mode the config is returned
    copied but unmarked.
    """
    resolved = freeze_checkpoint_channel_mode(mode) if mode is None else _validate_mode(mode)
    out: dict[str, Any] = dict(config or {})
    metadata = dict(out.get("metadata") or {})
    if resolved == "delta":
        metadata[MODE_METADATA_KEY] = "delta"
    else:
        metadata.pop(MODE_METADATA_KEY, None)
    out["metadata"] = metadata
    return cast("RunnableConfig", out)


def mark_metadata(metadata: Mapping[str, Any], mode: str) -> dict[str, Any]:
    """Return ``metadata`` with the marker set for a delta ``mode`` (unchanged for full)."""
    out = dict(metadata)
    if _validate_mode(mode) == "delta":
        out[MODE_METADATA_KEY] = "delta"
    return out


def check_checkpoint_mode(
    metadata: Mapping[str, Any] | None, thread_id: str, mode: str | None = None
) -> None:
    """The gate: raise `CheckpointModeMismatchError` if a full-mode process meets a delta thread."""
    resolved = resolve_checkpoint_channel_mode(mode)
    if resolved == "full" and is_delta_metadata(metadata):
        raise CheckpointModeMismatchError(str(thread_id))


async def acheck_thread_mode(saver: Any, config: RunnableConfig, mode: str | None = None) -> None:
    """Run the gate on the head checkpoint of ``config``'s thread (one read; no-op in delta)."""
    resolved = resolve_checkpoint_channel_mode(mode)
    if resolved == "delta":
        return
    configurable = dict(config.get("configurable") or {})
    thread_id = configurable.get("thread_id")
    head_cfg = {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": configurable.get("checkpoint_ns", ""),
        }
    }
    head = await saver.aget_tuple(head_cfg)
    if head is not None:
        check_checkpoint_mode(head.metadata, str(thread_id), resolved)


def check_thread_mode(saver: Any, config: RunnableConfig, mode: str | None = None) -> None:
    """Sync `acheck_thread_mode`."""
    resolved = resolve_checkpoint_channel_mode(mode)
    if resolved == "delta":
        return
    configurable = dict(config.get("configurable") or {})
    thread_id = configurable.get("thread_id")
    head = saver.get_tuple(
        {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": configurable.get("checkpoint_ns", ""),
            }
        }
    )
    if head is not None:
        check_checkpoint_mode(head.metadata, str(thread_id), resolved)
