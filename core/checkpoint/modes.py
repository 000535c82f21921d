"""Checkpoint channel modes: ``full`` and ``delta`` thread-state schemas, freezing, marker, gate.

In ``full`` mode ``messages`` is a plain reducer channel (`add_messages`); every
checkpoint stores the whole list. In ``delta`` mode it is a LangGraph `DeltaChannel`
whose reducer (`merge_message_writes`) equals folding `add_messages` over the writes;
checkpoints store only a snapshot every ``snapshot_frequency`` updates.

The mode and the snapshot frequency belong to the stores: `runstore.open` registers
its settings while its block is open, and a call that names no mode uses them (else
what the YAML file / environment configure, else ``full``). Nothing freezes
implicitly; `freeze_checkpoint_channel_mode` pins a mode for the process. Delta
checkpoints carry the metadata marker
``runstore_checkpoint_channel_mode: "delta"``; a full-mode process refuses delta
threads (`check_checkpoint_mode`), a delta-mode process reads full threads (that is
the full -> delta migration path).
"""

from __future__ import annotations

import threading
import typing
import weakref
from collections.abc import Iterable, Mapping
from functools import cache, lru_cache
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypedDict, cast

from langchain_core.messages import AnyMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.graph.message import add_messages

from runstore.checkpoint.reducer import merge_message_writes
from runstore.checkpoint.rules import DELTA_COUNTERS_KEY
from runstore.errors import (
    CheckpointModeError,
    CheckpointModeMismatchError,
    CheckpointModeReconfigurationError,
    ConfigError,
)

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

    from runstore.settings import Settings

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
# Set only by explicit freeze_* calls: a permanent choice for the process.
_frozen_mode: CheckpointChannelMode | None = None
_frozen_frequency: int | None = None
# Settings of the runstore.open blocks currently open, innermost last.
_open: list[Settings] = []
# What an unspecified-mode call resolved while no stores were open (and from where).
_implicit: tuple[CheckpointChannelMode, int, str] | None = None
# The saver objects runstore.open returned, with the (mode, frequency) they were opened for.
_saver_modes: weakref.WeakKeyDictionary[Any, tuple[CheckpointChannelMode, int]] = (
    weakref.WeakKeyDictionary()
)


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


def _pair(settings: Settings) -> tuple[CheckpointChannelMode, int]:
    return settings.checkpoint_channel_mode, settings.checkpoint_delta.snapshot_frequency


def current_settings() -> Settings | None:
    """The settings of the innermost open `runstore.open` block (``None`` outside one)."""
    return _open[-1] if _open else None


def _from_open_stores() -> tuple[CheckpointChannelMode, int] | None:
    pairs = {_pair(settings) for settings in _open}
    if len(pairs) > 1:
        shown = ", ".join(f"{m} (snapshot_frequency {f})" for m, f in sorted(pairs))
        raise CheckpointModeError(
            f"runstore.open blocks with different checkpoint modes are open ({shown}); "
            "pass mode= (and snapshot_frequency=) explicitly, or use the stores' own "
            "stores.thread_state_schema()"
        )
    return next(iter(pairs), None)


def _configured() -> tuple[CheckpointChannelMode, int, str]:
    """The mode a `runstore.open()` without arguments would use: YAML file, environment, default."""
    from runstore.settings import Settings

    settings = Settings.load()
    changed = _pair(settings) != (DEFAULT_MODE, DEFAULT_SNAPSHOT_FREQUENCY)
    return (*_pair(settings), "the YAML file / environment" if changed else "the defaults")


def _resolve_pair() -> tuple[CheckpointChannelMode, int]:
    """Frozen -> open stores -> configuration (recorded, so `runstore.open` can check it)."""
    global _implicit
    with _lock:
        if _frozen_mode is not None and _frozen_frequency is not None:
            return _frozen_mode, _frozen_frequency
        found = _from_open_stores()
        if found is None:
            mode, frequency, source = _configured()
            found = (_frozen_mode or mode, _frozen_frequency or frequency)
            _implicit = (*found, source)
        return _frozen_mode or found[0], _frozen_frequency or found[1]


def resolve_checkpoint_channel_mode(mode: str | None = None) -> CheckpointChannelMode:
    """Resolve the mode without freezing it: explicit -> frozen -> open stores -> YAML/env -> default."""
    if mode is not None:
        return _validate_mode(mode)
    return _resolve_pair()[0]


def resolve_snapshot_frequency(frequency: int | None = None) -> int:
    """Resolve the snapshot frequency like `resolve_checkpoint_channel_mode`."""
    if frequency is not None:
        return _validate_frequency(frequency)
    return _resolve_pair()[1]


def saver_mode(saver: Any) -> tuple[CheckpointChannelMode, int] | None:
    """The ``(mode, snapshot_frequency)`` ``saver`` was opened for by `runstore.open` (else None)."""
    try:
        return _saver_modes.get(saver)
    except TypeError:  # not weak-referenceable or unhashable: not one of ours
        return None


def enter_open(settings: Settings) -> None:
    """Register the settings of a `runstore.open` block being entered.

    Raises `CheckpointModeReconfigurationError` if an explicit freeze chose another mode
    or frequency, and `CheckpointModeError` if a call before any stores were open already
    handed out the other mode's schema or config (the silent mismatch this prevents).
    """
    global _implicit
    mode, frequency = _pair(settings)
    with _lock:
        if _frozen_mode is not None and _frozen_mode != mode:
            raise CheckpointModeReconfigurationError(
                f"checkpoint_channel_mode is frozen at {_frozen_mode!r} for this process "
                f"(freeze_checkpoint_channel_mode); cannot open stores in {mode!r}"
            )
        if _frozen_frequency is not None and _frozen_frequency != frequency:
            raise CheckpointModeReconfigurationError(
                f"checkpoint_delta.snapshot_frequency is frozen at {_frozen_frequency} for this "
                f"process (freeze_checkpoint_snapshot_frequency); cannot open stores with {frequency}"
            )
        if _implicit is not None:
            seen_mode, seen_frequency, source = _implicit
            if seen_mode != mode or (mode == "delta" and seen_frequency != frequency):
                seen = seen_mode if seen_mode == "full" else f"delta/{seen_frequency}"
                wanted = mode if mode == "full" else f"delta/{frequency}"
                raise CheckpointModeError(
                    f"a thread-state schema or config for checkpoint mode {seen!r} (from "
                    f"{source}) was handed out before any stores were open, but these stores are "
                    f"{wanted!r}; call get_thread_state_schema() inside the runstore.open block "
                    "(or stores.thread_state_schema()), or pass mode= explicitly"
                )
            _implicit = None
        _open.append(settings)


def remember_savers(settings: Settings, savers: Iterable[Any]) -> None:
    """Record that ``savers`` (what `runstore.open` returned, wrappers and inner) serve ``settings``' mode."""
    with _lock:
        for saver in savers:
            try:
                _saver_modes[saver] = _pair(settings)
            except TypeError:  # not weak-referenceable: the accessor falls back to resolution
                pass


def leave_open(settings: Settings) -> None:
    """Unregister the settings of a `runstore.open` block that exited."""
    with _lock:
        for index in range(len(_open) - 1, -1, -1):
            if _open[index] is settings:
                del _open[index]
                break


def freeze_checkpoint_channel_mode(mode: str | None = None) -> CheckpointChannelMode:
    """Freeze the process's channel mode for good; return it.

    Nothing freezes implicitly: call this to pin one mode for the process. The first
    call freezes (explicit value, else what the open stores or the configuration say,
    else ``full``); later calls return the frozen mode, and an explicit different value
    raises `CheckpointModeReconfigurationError` (restart the process to change modes).
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
        _frozen_mode = wanted or _resolve_pair()[0]
        return _frozen_mode


def freeze_checkpoint_snapshot_frequency(frequency: int | None = None) -> int:
    """Freeze the delta snapshot frequency for good; return it (see `freeze_checkpoint_channel_mode`).

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
        _frozen_frequency = wanted or _resolve_pair()[1]
        return _frozen_frequency


def frozen_checkpoint_settings() -> tuple[CheckpointChannelMode | None, int | None]:
    """The frozen ``(mode, snapshot_frequency)``; ``None`` for what is not frozen."""
    return _frozen_mode, _frozen_frequency


def reset_checkpoint_mode_for_tests() -> None:
    """Forget the frozen mode and frequency, open stores and implicit resolutions. For tests only."""
    global _frozen_mode, _frozen_frequency, _implicit
    with _lock:
        _frozen_mode = None
        _frozen_frequency = None
        _implicit = None
        _open.clear()


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




def inject_checkpoint_mode(config: RunnableConfig | None, mode: str | None = None) -> RunnableConfig:
    """Return a copy of ``config`` whose metadata carries the mode marker when ``mode`` is delta.

    LangGraph copies ``config["metadata"]`` into every checkpoint it writes, so a run
    started with this config marks its checkpoints. ``mode`` defaults to the mode of the
    open stores (`resolve_checkpoint_channel_mode`; nothing is frozen). In full mode the
    config is returned copied but unmarked.
    """
    resolved = resolve_checkpoint_channel_mode(mode)
    out: dict[str, Any] = dict(config or {})
    metadata = dict(out.get("metadata") or {})
    if resolved == "delta":
        metadata[MODE_METADATA_KEY] = "delta"
    else:
        metadata.pop(MODE_METADATA_KEY, None)
    out["metadata"] = metadata
    return cast("RunnableConfig", out)




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
