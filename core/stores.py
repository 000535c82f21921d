"""`runstore.open`: one entry point that opens a checkpointer, an event store, a bridge, a run
store and a long-term memory store."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from runstore.errors import StoreNotOpenedError
from runstore.loader import get_backends
from runstore.options import BackendOptions
from runstore.registry import Backends
from runstore.settings import URL_KEYS, Settings

if TYPE_CHECKING:
    from langgraph.checkpoint.base import BaseCheckpointSaver
    from langgraph.store.base import BaseStore

    from runstore.events.protocol import RunEventStore
    from runstore.runs.protocol import RunStore
    from runstore.streams.protocol import StreamBridge

log = logging.getLogger("runstore")


@dataclass(frozen=True)
class Stores:
    """The stores of a runtime, opened together by `runstore.open`.

    Only the kinds that were asked for (keywords, ``config``, YAML, environment) are
    open; using another one raises `StoreNotOpenedError` saying how to open it.
    """

    settings: Settings
    _checkpointer: BaseCheckpointSaver[Any] | None = None
    _events: RunEventStore | None = None
    _streams: StreamBridge | None = None
    _runs: RunStore | None = None
    _store: BaseStore | None = None

    def _get(self, kind: str) -> Any:
        value = getattr(self, f"_{kind}")
        if value is None:
            what = "long-term memory store" if kind == "store" else f"{kind} store"
            raise StoreNotOpenedError(
                f"no {what} was opened: runstore.open opens only the kinds it is given "
                f"(here: {', '.join(self.opened)}); pass {kind}=URL, or set {kind}: in the config"
            )
        return value

    @property
    def opened(self) -> tuple[str, ...]:
        """The kinds this call opened, e.g. ``("checkpointer",)``."""
        return tuple(k for k in URL_KEYS if getattr(self, f"_{k}") is not None)

    @property
    def checkpointer(self) -> BaseCheckpointSaver[Any]:
        """The checkpoint saver (in delta mode behind wrappers; `unwrap_saver` reaches it)."""
        return cast("BaseCheckpointSaver[Any]", self._get("checkpointer"))

    @property
    def events(self) -> RunEventStore:
        """The run event store."""
        return cast("RunEventStore", self._get("events"))

    @property
    def streams(self) -> StreamBridge:
        """The stream bridge."""
        return cast("StreamBridge", self._get("streams"))

    @property
    def runs(self) -> RunStore:
        """The run store."""
        return cast("RunStore", self._get("runs"))

    @property
    def store(self) -> BaseStore:
        """The long-term memory store (LangGraph ``BaseStore``): hand it to
        ``builder.compile(checkpointer=stores.checkpointer, store=stores.store)``."""
        return cast("BaseStore", self._get("store"))

    def thread_state_schema(self, *, extra_schemas: Iterable[type] = ()) -> type:
        """`runstore.get_thread_state_schema` for these stores' checkpoint mode and frequency."""
        from runstore.checkpoint.modes import get_thread_state_schema

        return get_thread_state_schema(
            self.settings.checkpoint_channel_mode,
            self.settings.checkpoint_delta.snapshot_frequency,
            extra_schemas=extra_schemas,
        )


@asynccontextmanager
async def open(
    config: Mapping[str, Any] | str | os.PathLike[str] | Settings | None = None,
    *,
    checkpointer: str | None = None,
    events: str | None = None,
    streams: str | None = None,
    runs: str | None = None,
    store: str | None = None,
    store_index: Mapping[str, Any] | None = None,
    store_ttl: Mapping[str, Any] | None = None,
    backends: Backends | None = None,
) -> AsyncIterator[Stores]:
    """Open the configured stores; everything opened is closed when the block exits.

    ``config`` is a mapping shaped like ``runstore.yaml``, a path to such a file, or
    `Settings`; the keywords pick a backend URL per kind and win over ``config``.
    Only the kinds given a URL (here or in the YAML file / environment) are opened.
    With none given you get the embedded default: one sqlite file under
    ``.runstore/`` for checkpoints, events and runs, and an in-process memory bridge
    and memory store.

    ``store_index`` (LangGraph's ``IndexConfig``: ``dims``, ``embed``, ``fields``) turns on
    the store's semantic search and ``store_ttl`` (``TTLConfig``) its expiry; both are
    Python objects (an embeddings function), so they are arguments, not settings.
    """
    settings = Settings.load(
        config, checkpointer=checkpointer, events=events, streams=streams, runs=runs, store=store
    )
    registry = backends or get_backends()
    kinds = settings.selected_kinds()
    # Resolve every backend before opening any, so a bad URL opens nothing.
    specs = {
        kind: getattr(registry, _REGISTRY[kind]).for_url(getattr(settings, kind)) for kind in kinds
    }
    from runstore.checkpoint import modes

    if "checkpointer" in kinds:
        # Checked before anything opens: a conflict with a frozen mode opens nothing.
        modes.enter_open(settings)
    try:
        opened: dict[str, Any] = {}
        async with BackendOptions.scope(settings) as options:
            if store_index is not None or store_ttl is not None:
                from runstore.store.base import STORE_CONFIG_KEY

                options.provide(STORE_CONFIG_KEY, (store_index, store_ttl))
            for kind, spec in specs.items():
                backend = await spec.open(settings.url(kind), options)  # type: ignore[arg-type]
                if kind == "checkpointer":
                    backend = await _wrap_checkpointer(backend, options, registry)
                opened[kind] = backend
            log.debug(
                "runstore opened %s",
                " ".join(f"{kind}={settings.url(kind)}" for kind in kinds),  # type: ignore[arg-type]
            )
            stores = Stores(settings, *(opened.get(kind) for kind in URL_KEYS))
            modes.remember_savers(settings, _saver_chain(stores._checkpointer))
            yield stores
    finally:
        modes.leave_open(settings)


_REGISTRY = {
    "checkpointer": "savers",
    "events": "events",
    "streams": "streams",
    "runs": "runs",
    "store": "stores",
}


def _saver_chain(saver: BaseCheckpointSaver[Any] | None) -> list[Any]:
    """``saver`` and every saver under its wrappers (each answers for the stores' mode)."""
    from runstore.checkpoint.forwarding import ForwardingSaver

    chain: list[Any] = []
    while saver is not None:
        chain.append(saver)
        saver = saver.inner if isinstance(saver, ForwardingSaver) else None
    return chain


async def _wrap_checkpointer(
    saver: BaseCheckpointSaver[Any], options: BackendOptions, registry: Backends
) -> BaseCheckpointSaver[Any]:
    """Wrap a delta-mode saver in the mode marker and, where it pays, the history cache.

    Only in delta mode (full-mode checkpoints store every value, so nothing ever
    asks for delta history): the saver is wrapped in `DeltaMarkingSaver` (the mode
    marker on every checkpoint) and then in `CachedHistorySaver` when the cache is on
    for it: ``checkpoint_cache.enabled`` is ``on``, or ``auto`` and the saver's class
    does not set ``history_cache_helps = False``; ``max_entries: 0`` turns it off.
    Full mode returns the saver unwrapped. `unwrap_saver` reaches the saver.
    """
    settings = options.settings
    if settings.checkpoint_channel_mode != "delta":
        return saver
    from runstore.checkpoint.cache import CachedHistorySaver, open_history_cache
    from runstore.checkpoint.forwarding import DeltaMarkingSaver

    # Every delta checkpoint carries the mode marker, whoever runs the graph.
    marked = DeltaMarkingSaver(saver)
    wanted = settings.checkpoint_cache.enabled
    if wanted == "off" or (wanted == "auto" and not getattr(saver, "history_cache_helps", True)):
        return marked
    cache = await open_history_cache(settings, options, registry)
    if cache is None:
        return marked
    return CachedHistorySaver(marked, cache)
