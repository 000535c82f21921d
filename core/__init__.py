"""runstore: pluggable storage backends for LangGraph agent runtimes.

Everything public is importable from here; heavy modules load on first access so
``import runstore`` stays cheap and never imports pytest or hypothesis.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> module (relative to this package) that defines it
_EXPORTS: dict[str, str] = {
    # selection
    "open": ".stores",
    "Stores": ".stores",
    "open_sync": ".sync",
    "SyncStores": ".sync",
    "Settings": ".settings",
    "BackendOptions": ".options",
    "BackendURL": ".urls",
    # plugins
    "hookimpl": ".hookspecs",
    "hookspec": ".hookspecs",
    "get_backends": ".loader",
    "register_plugin": ".loader",
    "BackendSpec": ".registry",
    "SaverRegistry": ".registry",
    "EventStoreRegistry": ".registry",
    "StreamBridgeRegistry": ".registry",
    "HistoryCacheRegistry": ".registry",
    "RunStoreRegistry": ".registry",
    "SettingsRegistry": ".registry",
    "Kind": ".capabilities",
    "CAPABILITIES": ".capabilities",
    # protocols and their types
    "RunEventStore": ".events",
    "EventRecord": ".events",
    "StreamBridge": ".streams",
    "StreamEvent": ".streams",
    "StreamGap": ".streams",
    "HEARTBEAT": ".streams",
    "END": ".streams",
    "StreamEndedError": ".streams",
    "InvalidStreamInputError": ".streams",
    "parse_event_id": ".streams",
    "sse_stream": ".sse",
    "open_sse_stream": ".sse",
    "sse_frames": ".sse",
    "sse_frame": ".sse",
    "SSE_MEDIA_TYPE": ".sse",
    "SSE_HEADERS": ".sse",
    "AUTO": ".owner",
    "owner_scope": ".owner",
    "current_owner": ".owner",
    "message_identity": ".identity",
    "InvalidEventError": ".records",
    "RunStore": ".runs",
    "RunRecord": ".runs",
    "CreateResult": ".runs",
    "ManualClock": ".runs",
    "system_clock": ".runs",
    "RunError": ".runs",
    "InvalidRunError": ".runs",
    "RunNotFoundError": ".runs",
    "RunExistsError": ".runs",
    "IdempotencyConflictError": ".runs",
    "ThreadBusyError": ".runs",
    "LeaseHeldError": ".runs",
    "RunStateError": ".runs",
    "RunQueuedError": ".runs",
    "RunAlreadyStartedError": ".runs",
    "RunFinishedError": ".runs",
    "LeaseLostError": ".runs",
    "CancelPendingError": ".runs",
    # checkpoint modes, accessor and cache
    "get_thread_state_schema": ".checkpoint.modes",
    "freeze_checkpoint_channel_mode": ".checkpoint.modes",
    "freeze_checkpoint_snapshot_frequency": ".checkpoint.modes",
    "inject_checkpoint_mode": ".checkpoint.modes",
    "CheckpointStateAccessor": ".checkpoint.accessor",
    "CachedHistorySaver": ".checkpoint.cache",
    "unwrap_saver": ".checkpoint.forwarding",
    # errors
    "RunstoreError": ".errors",
    "ConfigError": ".errors",
    "BackendNotFoundError": ".errors",
    "MissingDriverError": ".errors",
    "BackendUnavailableError": ".errors",
    "BackendRefusedError": ".errors",
    "PluginError": ".errors",
    "DuplicateBackendError": ".errors",
    "InvalidURLError": ".errors",
    "OwnerContextMissingError": ".errors",
    "IncompleteMessageRunLookupError": ".errors",
    "CheckpointModeError": ".errors",
    "CheckpointModeMismatchError": ".errors",
    "CheckpointModeReconfigurationError": ".errors",
    "SyncCallOnEventLoopError": ".errors",
    "InvalidSaverInputError": ".errors",
    "InvalidCursorError": ".errors",
    "UndeclaredChannelError": ".errors",
    "StoreNotOpenedError": ".errors",
    "ThreadDeletedError": ".errors",
    "StaleFenceError": ".errors",
    # the thread index
    "RetentionPolicy": ".checkpoint.retention",
    "ThreadInfo": ".checkpoint.threads",
    "ThreadPage": ".checkpoint.threads",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'runstore' has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from runstore.capabilities import CAPABILITIES, Kind
    from runstore.checkpoint.forwarding import unwrap_saver
    from runstore.checkpoint.retention import RetentionPolicy
    from runstore.checkpoint.threads import ThreadInfo, ThreadPage
    from runstore.errors import (
        BackendNotFoundError,
        BackendRefusedError,
        BackendUnavailableError,
        CheckpointModeError,
        CheckpointModeMismatchError,
        CheckpointModeReconfigurationError,
        ConfigError,
        DuplicateBackendError,
        IncompleteMessageRunLookupError,
        InvalidCursorError,
        InvalidSaverInputError,
        InvalidURLError,
        MissingDriverError,
        OwnerContextMissingError,
        PluginError,
        RunstoreError,
        StaleFenceError,
        StoreNotOpenedError,
        SyncCallOnEventLoopError,
        ThreadDeletedError,
        UndeclaredChannelError,
    )
    from runstore.events import EventRecord, RunEventStore
    from runstore.hookspecs import hookimpl, hookspec
    from runstore.identity import message_identity
    from runstore.loader import get_backends, register_plugin
    from runstore.options import BackendOptions
    from runstore.owner import AUTO, current_owner, owner_scope
    from runstore.registry import (
        BackendSpec,
        EventStoreRegistry,
        HistoryCacheRegistry,
        RunStoreRegistry,
        SaverRegistry,
        SettingsRegistry,
        StreamBridgeRegistry,
    )
    from runstore.runs import (
        CancelPendingError,
        CreateResult,
        IdempotencyConflictError,
        InvalidRunError,
        LeaseHeldError,
        LeaseLostError,
        ManualClock,
        RunAlreadyStartedError,
        RunError,
        RunExistsError,
        RunFinishedError,
        RunNotFoundError,
        RunQueuedError,
        RunRecord,
        RunStateError,
        RunStore,
        ThreadBusyError,
        system_clock,
    )
    from runstore.settings import Settings
    from runstore.sse import (
        SSE_HEADERS,
        SSE_MEDIA_TYPE,
        open_sse_stream,
        sse_frame,
        sse_frames,
        sse_stream,
    )
    from runstore.stores import Stores, open
    from runstore.streams import (
        END,
        HEARTBEAT,
        InvalidStreamInputError,
        StreamBridge,
        StreamEndedError,
        StreamEvent,
        StreamGap,
        parse_event_id,
    )
    from runstore.sync import SyncStores, open_sync
    from runstore.urls import BackendURL
