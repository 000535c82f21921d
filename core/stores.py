"""`runstore.open`: one entry point that opens a checkpointer, an event store, a bridge and a run store."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .loader import get_backends
from .options import BackendOptions
from .registry import Backends
from .settings import Settings

if TYPE_CHECKING:
    from langgraph.checkpoint.base import BaseCheckpointSaver

    from .events import RunEventStore
    from .runs import RunStore
    from .streams import StreamBridge

log = logging.getLogger("runstore")


@dataclass(frozen=True)
class Stores:
    """The stores of a runtime, opened together by `runstore.open`."""

    checkpointer: BaseCheckpointSaver[Any]
    events: RunEventStore
    streams: StreamBridge
    runs: RunStore
    settings: Settings


@asynccontextmanager
async def open(
    config: Mapping[str, Any] | str | os.PathLike[str] | Settings | None = None,
    *,
    checkpointer: str | None = None,
    events: str | None = None,
    streams: str | None = None,
    runs: str | None = None,
    backends: Backends | None = None,
) -> AsyncIterator[Stores]:
    """Open the configured stores; everything opened is closed when the block exits.

    ``config`` is a mapping shaped like ``runstore.yaml``, a path to such a file, or
    `Settings`; the keywords pick a backend URL per kind and win over ``config``.
    With nothing configured you get the embedded default: one sqlite file under
    ``.runstore/`` for checkpoints, events and runs, and an in-process memory bridge.
    """
    settings = Settings.load(
        config, checkpointer=checkpointer, events=events, streams=streams, runs=runs
    )
    registry = backends or get_backends()
    # Resolve every backend before opening any, so a bad URL opens nothing.
    saver_spec = registry.savers.for_url(settings.checkpointer)
    events_spec = registry.events.for_url(settings.events)
    streams_spec = registry.streams.for_url(settings.streams)
    runs_spec = registry.runs.for_url(settings.runs)
    _apply_checkpoint_mode(settings)
    async with BackendOptions.scope(settings) as options:
        saver = await saver_spec.open(settings.url("checkpointer"), options)
        saver = await _wrap_checkpointer(saver, options, registry)
        event_store = await events_spec.open(settings.url("events"), options)
        options.on_close(event_store.close)
        bridge = await streams_spec.open(settings.url("streams"), options)
        options.on_close(bridge.close)
        run_store = await runs_spec.open(settings.url("runs"), options)
        options.on_close(run_store.close)
        log.debug(
            "runstore opened checkpointer=%s events=%s streams=%s runs=%s",
            settings.url("checkpointer"),
            settings.url("events"),
            settings.url("streams"),
            settings.url("runs"),
        )
        yield Stores(
            checkpointer=saver, events=event_store, streams=bridge, runs=run_store, settings=settings
        )


def _apply_checkpoint_mode(settings: Settings) -> None:
    """Freeze the checkpoint channel mode and snapshot frequency from the settings.

    The settings' values count as explicit: a process already frozen at another
    mode or frequency raises `CheckpointModeReconfigurationError`.
    """
    from .checkpoint import modes

    modes.freeze_checkpoint_channel_mode(settings.checkpoint_channel_mode)
    modes.freeze_checkpoint_snapshot_frequency(settings.checkpoint_delta.snapshot_frequency)
    # Only settings that passed the freeze become the "config" step (and the source
    # of hot-reloadable values such as accessor_graph_max).
    modes.set_config_settings(settings)


async def _wrap_checkpointer(
    saver: BaseCheckpointSaver[Any], options: BackendOptions, registry: Backends
) -> BaseCheckpointSaver[Any]:
    """Wrap the saver in the delta history cache when the settings ask for one.

    Only in delta mode (full-mode checkpoints store every value, so nothing ever
    asks for delta history): the saver is wrapped in `DeltaMarkingSaver` (the mode
    marker on every checkpoint) and, unless ``checkpoint_cache.max_entries`` is 0,
    in `CachedHistorySaver`. Full mode returns the saver unwrapped.
    """
    settings = options.settings
    if settings.checkpoint_channel_mode != "delta":
        return saver
    from .checkpoint.cache import CachedHistorySaver, open_history_cache
    from .checkpoint.forwarding import DeltaMarkingSaver

    # Every delta checkpoint carries the mode marker, whoever runs the graph.
    marked = DeltaMarkingSaver(saver)
    cache = await open_history_cache(settings, options, registry)
    if cache is None:
        return marked
    options.on_close(cache.close)
    return CachedHistorySaver(marked, cache)
