"""`CachedHistorySaver`: a delta-history cache in front of any checkpoint saver.

``aget_delta_channel_history(config, channels)`` is what every delta-mode read of
a thread costs (LangGraph replays the writes since the last snapshot). Its answer
for a concrete checkpoint id never changes: it depends only on that checkpoint's
ancestors, and LangGraph never rewrites a checkpoint that has a child. So entries
are keyed by ``(thread_id, checkpoint_ns, checkpoint_id, channel)`` and are never
invalidated; deleting or pruning a thread purges its entries as hygiene.

A miss is composed from the parent's entry when the parent is cached (or can be
composed within ``max_compose_depth`` hops): ``H(t) = H(parent) + parent's writes``,
or ``seed = parent's value`` when the parent holds one. Otherwise the inner saver
walks (SQL savers do that in one round trip). A cache backend that fails degrades
to the uncached walk, never to an error.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, DeltaChannelHistory

from .forwarding import ForwardingSaver

log = logging.getLogger("runstore.checkpoint.cache")

#: How many ancestors a miss may be composed across before asking the inner saver.
DEFAULT_MAX_COMPOSE_DEPTH = 4


@runtime_checkable
class HistoryCacheBackend(Protocol):
    """Where `CachedHistorySaver` keeps entries (``checkpoint_cache.type`` picks one).

    ``key`` is ``"{checkpoint_ns}\\x1f{checkpoint_id}\\x1f{channel}"`` within a thread.
    ``get`` returns ``None`` on a miss; backends must never return a shared mutable
    object and should degrade to a miss on their own errors.
    """

    async def get(self, thread_id: str, key: str) -> DeltaChannelHistory | None: ...

    async def set(self, thread_id: str, key: str, entry: DeltaChannelHistory) -> None: ...

    async def purge_thread(self, thread_id: str) -> None: ...

    async def clear(self) -> None: ...

    async def close(self) -> None: ...


def entry_key(checkpoint_ns: str, checkpoint_id: str, channel: str) -> str:
    """The key of one cached history entry inside a thread."""
    return f"{checkpoint_ns}\x1f{checkpoint_id}\x1f{channel}"


def _cfg(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": checkpoint_ns,
            "checkpoint_id": checkpoint_id,
        }
    }


class CachedHistorySaver(ForwardingSaver):
    """Wrap ``inner`` so delta history reads are served from ``cache`` when possible.

    Every other saver method is delegated unchanged. ``stats()`` reports hits,
    misses, composed entries, inner walks and cache errors.
    """

    def __init__(
        self,
        inner: BaseCheckpointSaver[Any],
        cache: HistoryCacheBackend,
        *,
        max_compose_depth: int = DEFAULT_MAX_COMPOSE_DEPTH,
    ) -> None:
        super().__init__(inner)
        self.cache = cache
        self.max_compose_depth = max(0, int(max_compose_depth))
        self._stats = {
            "hits": 0,
            "misses": 0,
            "composed": 0,
            "inner_walks": 0,
            "cache_errors": 0,
            "purges": 0,
        }
        bind = getattr(cache, "bind_serde", None)
        if callable(bind):
            bind(inner.serde)

    def stats(self) -> dict[str, int]:
        """Counters since creation: hits, misses, composed, inner_walks, cache_errors, purges."""
        return dict(self._stats)

    # ------------------------------------------------------------------ cache access that never fails

    async def _cget(self, thread_id: str, key: str) -> DeltaChannelHistory | None:
        try:
            return await self.cache.get(thread_id, key)
        except Exception as exc:  # a cache outage must never become an error
            self._stats["cache_errors"] += 1
            log.debug("history cache get failed: %s", type(exc).__name__)
            return None

    async def _cset(self, thread_id: str, key: str, entry: DeltaChannelHistory) -> None:
        try:
            await self.cache.set(thread_id, key, entry)
        except Exception as exc:
            self._stats["cache_errors"] += 1
            log.debug("history cache set failed: %s", type(exc).__name__)

    async def _purge(self, thread_ids: Sequence[str]) -> None:
        for thread_id in thread_ids:
            self._stats["purges"] += 1
            try:
                await self.cache.purge_thread(str(thread_id))
            except Exception as exc:
                self._stats["cache_errors"] += 1
                log.debug("history cache purge failed: %s", type(exc).__name__)

    def _purge_sync(self, thread_ids: Sequence[str] | None) -> None:
        # Sync saver calls cannot await an async backend; a backend may offer a sync
        # purge (memory does). Otherwise entries stay unreachable: ids are never reused.
        purge = getattr(self.cache, "purge_thread_sync", None)
        clear = getattr(self.cache, "clear_sync", None)
        try:
            if thread_ids is None:
                if callable(clear):
                    clear()
            elif callable(purge):
                for thread_id in thread_ids:
                    self._stats["purges"] += 1
                    purge(str(thread_id))
        except Exception:
            self._stats["cache_errors"] += 1

    # ------------------------------------------------------------------ history

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        if not channels:
            return {}
        configurable = config.get("configurable") or {}
        thread_id = configurable.get("thread_id")
        checkpoint_ns = configurable.get("checkpoint_ns", "") or ""
        checkpoint_id = configurable.get("checkpoint_id")
        if thread_id is None:
            return await self.inner.aget_delta_channel_history(config=config, channels=channels)
        thread_id = str(thread_id)
        if not checkpoint_id:
            # Resolve "the head" to an immutable id; only ids are cacheable.
            head = await self.inner.aget_tuple(config)
            if head is None:
                return await self.inner.aget_delta_channel_history(
                    config=config, channels=channels
                )
            checkpoint_id = head.checkpoint["id"]
            checkpoint_ns = head.config["configurable"].get("checkpoint_ns", checkpoint_ns)
        return await self._history(thread_id, checkpoint_ns, str(checkpoint_id), channels, 0)

    async def _history(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        channels: Sequence[str],
        depth: int,
    ) -> dict[str, DeltaChannelHistory]:
        result: dict[str, DeltaChannelHistory] = {}
        missing: list[str] = []
        for channel in dict.fromkeys(channels):
            entry = await self._cget(thread_id, entry_key(checkpoint_ns, checkpoint_id, channel))
            if entry is None:
                missing.append(channel)
            else:
                self._stats["hits"] += 1
                result[channel] = entry
        if not missing:
            return result
        self._stats["misses"] += len(missing)
        composed = await self._compose(thread_id, checkpoint_ns, checkpoint_id, missing, depth)
        for channel, entry in composed.items():
            await self._cset(thread_id, entry_key(checkpoint_ns, checkpoint_id, channel), entry)
            result[channel] = entry
        return result

    async def _inner_walk(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str, channels: Sequence[str]
    ) -> dict[str, DeltaChannelHistory]:
        self._stats["inner_walks"] += 1
        found = await self.inner.aget_delta_channel_history(
            config=_cfg(thread_id, checkpoint_ns, checkpoint_id), channels=list(channels)
        )
        return {ch: found.get(ch, {"writes": []}) for ch in channels}

    async def _compose(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        channels: Sequence[str],
        depth: int,
    ) -> dict[str, DeltaChannelHistory]:
        if depth >= self.max_compose_depth:
            return await self._inner_walk(thread_id, checkpoint_ns, checkpoint_id, channels)
        target = await self.inner.aget_tuple(_cfg(thread_id, checkpoint_ns, checkpoint_id))
        if target is None or target.parent_config is None:
            # Same answer as a walk: nothing above the target.
            return {ch: {"writes": []} for ch in channels}
        parent_conf = target.parent_config["configurable"]
        parent_id = str(parent_conf["checkpoint_id"])
        parent_ns = parent_conf.get("checkpoint_ns", checkpoint_ns) or ""
        parent = await self.inner.aget_tuple(_cfg(thread_id, parent_ns, parent_id))
        if parent is None:
            return {ch: {"writes": []} for ch in channels}
        writes = parent.pending_writes or []
        stored = parent.checkpoint["channel_values"]
        result: dict[str, DeltaChannelHistory] = {}
        above: list[str] = []
        for ch in channels:
            if ch in stored:
                result[ch] = {"writes": [w for w in writes if w[1] == ch], "seed": stored[ch]}
            else:
                above.append(ch)
        if above:
            base = await self._history(thread_id, parent_ns, parent_id, above, depth + 1)
            for ch in above:
                entry = base[ch]
                out: DeltaChannelHistory = {
                    "writes": [*entry["writes"], *(w for w in writes if w[1] == ch)]
                }
                if "seed" in entry:
                    out["seed"] = entry["seed"]
                result[ch] = out
            self._stats["composed"] += len(above)
        return result

    # ------------------------------------------------------------------ purge on delete / prune

    async def adelete_thread(self, thread_id: str) -> None:
        await self.inner.adelete_thread(thread_id)
        await self._purge([thread_id])

    def delete_thread(self, thread_id: str) -> None:
        self.inner.delete_thread(thread_id)
        self._purge_sync([thread_id])

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self.inner.aprune(thread_ids, strategy=strategy)
        await self._purge(list(thread_ids))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self.inner.prune(thread_ids, strategy=strategy)
        self._purge_sync(list(thread_ids))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self.inner.acopy_thread(source_thread_id, target_thread_id)
        await self._purge([target_thread_id])

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self.inner.copy_thread(source_thread_id, target_thread_id)
        self._purge_sync([target_thread_id])

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self.inner.adelete_for_runs(run_ids)
        # The threads those runs touched are unknown here: drop everything.
        try:
            await self.cache.clear()
        except Exception:
            self._stats["cache_errors"] += 1

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self.inner.delete_for_runs(run_ids)
        self._purge_sync(None)

    async def aclose_cache(self) -> None:
        """Close the cache backend (the inner saver is closed by whoever opened it)."""
        try:
            await self.cache.close()
        except Exception:
            self._stats["cache_errors"] += 1


async def open_history_cache(
    settings: Any, options: Any, registry: Any
) -> HistoryCacheBackend | None:
    """Open the ``checkpoint_cache`` backend named by the settings, or ``None`` when disabled."""
    from ..urls import BackendURL

    cfg = settings.checkpoint_cache
    if cfg.max_entries <= 0:
        return None
    if cfg.url:
        url = BackendURL.parse(cfg.url)
        spec = registry.history_caches.for_url(url)
    else:
        spec = registry.history_caches.get(cfg.type)
        # A redis cache without its own URL shares the stream bridge's server.
        streams = BackendURL.parse(settings.streams)
        if streams.scheme in spec.schemes:
            url = streams
        else:
            url = BackendURL.parse(f"{spec.schemes[0]}://")
    cache = await spec.open(url, options)
    return cache


__all__ = [
    "DEFAULT_MAX_COMPOSE_DEPTH",
    "CachedHistorySaver",
    "HistoryCacheBackend",
    "entry_key",
    "open_history_cache",
]
