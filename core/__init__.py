"""runstore: pluggable storage backends for LangGraph agent runtimes.

This namespace holds what an application uses: opening stores, the protocols of the
kinds, the owner scope, checkpoint modes, server-sent events, the thread index and
the errors it most often catches. Every exception is in ``runstore.errors``; what a
plugin author needs is in ``runstore.hookspecs`` (``hookimpl``), ``runstore.registry``,
``runstore.urls`` (``BackendURL``) and ``runstore.options`` (``BackendOptions``).
Names load on first access, so ``import runstore`` stays cheap and never imports
pytest or hypothesis.
"""

from __future__ import annotations

import warnings
from importlib import import_module
from typing import TYPE_CHECKING, Any

from runstore import moved as _moved

__version__ = "0.1.0"

_moved.install()

# name -> module that defines it
_EXPORTS: dict[str, str] = {
    # opening stores
    "open": "runstore.stores",
    "Stores": "runstore.stores",
    "open_sync": "runstore.sync",
    "SyncStores": "runstore.sync",
    "Settings": "runstore.settings",
    # the kinds' protocols
    "RunEventStore": "runstore.events",
    "EventRecord": "runstore.events",
    "StreamBridge": "runstore.streams",
    "StreamEvent": "runstore.streams",
    "END": "runstore.streams",
    "HEARTBEAT": "runstore.streams",
    "RunStore": "runstore.runs",
    "RunRecord": "runstore.runs",
    "ManualClock": "runstore.clock",
    # who reads and writes events
    "AUTO": "runstore.events.owner",
    "owner_scope": "runstore.events.owner",
    "current_owner": "runstore.events.owner",
    # checkpoints
    "inject_checkpoint_mode": "runstore.checkpoint.modes",
    "get_thread_state_schema": "runstore.checkpoint.modes",
    "CheckpointStateAccessor": "runstore.checkpoint.accessor",
    "CachedHistorySaver": "runstore.checkpoint.cache",
    "RetentionPolicy": "runstore.checkpoint.policy",
    "ThreadInfo": "runstore.checkpoint.threads",
    "ThreadPage": "runstore.checkpoint.threads",
    # server-sent events
    "open_sse_stream": "runstore.endpoints",
    "sse_stream": "runstore.streams.sse",
    "SSE_HEADERS": "runstore.streams.sse",
    "SSE_MEDIA_TYPE": "runstore.streams.sse",
    # the errors an application catches most (all of them: runstore.errors)
    "RunstoreError": "runstore.errors",
    "ConfigError": "runstore.errors",
    "BackendNotFoundError": "runstore.errors",
    "MissingDriverError": "runstore.errors",
    "BackendUnavailableError": "runstore.errors",
    "StaleFenceError": "runstore.errors",
    "LeaseLostError": "runstore.errors",
}

# Names this namespace gave before it was curated: they still work for one release,
# with a DeprecationWarning naming the module to import them from.
_FORMER: dict[str, str] = {
    "BackendOptions": "runstore.options",
    "BackendURL": "runstore.urls",
    "hookimpl": "runstore.hookspecs",
    "hookspec": "runstore.hookspecs",
    "get_backends": "runstore.loader",
    "register_plugin": "runstore.loader",
    "BackendSpec": "runstore.registry",
    "SaverRegistry": "runstore.registry",
    "EventStoreRegistry": "runstore.registry",
    "StreamBridgeRegistry": "runstore.registry",
    "HistoryCacheRegistry": "runstore.registry",
    "RunStoreRegistry": "runstore.registry",
    "SettingsRegistry": "runstore.registry",
    "Kind": "runstore.capabilities",
    "CAPABILITIES": "runstore.capabilities",
    "StreamGap": "runstore.streams",
    "parse_event_id": "runstore.streams",
    "sse_frames": "runstore.streams.sse",
    "sse_frame": "runstore.streams.sse",
    "message_identity": "runstore.events.identity",
    "CreateResult": "runstore.runs",
    "system_clock": "runstore.clock",
    "freeze_checkpoint_channel_mode": "runstore.checkpoint.modes",
    "freeze_checkpoint_snapshot_frequency": "runstore.checkpoint.modes",
    "unwrap_saver": "runstore.checkpoint.forwarding",
    **{
        name: "runstore.errors"
        for name in (
            "StreamEndedError", "InvalidStreamInputError", "InvalidEventError", "RunError",
            "InvalidRunError", "RunNotFoundError", "RunExistsError", "IdempotencyConflictError",
            "ThreadBusyError", "LeaseHeldError", "RunStateError", "RunQueuedError",
            "RunAlreadyStartedError", "RunFinishedError", "CancelPendingError", "BackendRefusedError",
            "PluginError", "DuplicateBackendError", "InvalidURLError", "OwnerContextMissingError",
            "IncompleteMessageRunLookupError", "CheckpointModeError", "CheckpointModeMismatchError",
            "CheckpointModeReconfigurationError", "SyncCallOnEventLoopError",
            "InvalidSaverInputError", "InvalidCursorError", "UndeclaredChannelError",
            "StoreNotOpenedError", "ThreadDeletedError",
        )
    },
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        module = _FORMER.get(name)
        if module is None:
            raise AttributeError(f"module 'runstore' has no attribute {name!r}")
        warnings.warn(
            f"runstore.{name} is deprecated; import it from {module} "
            "(the old name is removed in the next release)",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(import_module(module), name)
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def plugin_settings_sections() -> Any:
    """The settings sections installed plugins declare (discovers the plugins on first use).

    `runstore.settings` reads sections through this function so that configuration never
    imports plugin discovery; the package root is where the two meet.
    """
    from runstore.loader import get_backends

    return get_backends().settings


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from runstore.checkpoint.accessor import CheckpointStateAccessor
    from runstore.checkpoint.cache import CachedHistorySaver
    from runstore.checkpoint.modes import get_thread_state_schema, inject_checkpoint_mode
    from runstore.checkpoint.policy import RetentionPolicy
    from runstore.checkpoint.threads import ThreadInfo, ThreadPage
    from runstore.clock import ManualClock
    from runstore.endpoints import open_sse_stream
    from runstore.errors import (
        BackendNotFoundError,
        BackendUnavailableError,
        ConfigError,
        LeaseLostError,
        MissingDriverError,
        RunstoreError,
        StaleFenceError,
    )
    from runstore.events.owner import AUTO, current_owner, owner_scope
    from runstore.events.protocol import EventRecord, RunEventStore
    from runstore.runs.protocol import RunRecord, RunStore
    from runstore.settings import Settings
    from runstore.stores import Stores, open
    from runstore.streams.protocol import END, HEARTBEAT, StreamBridge, StreamEvent
    from runstore.streams.sse import SSE_HEADERS, SSE_MEDIA_TYPE, sse_stream
    from runstore.sync import SyncStores, open_sync
