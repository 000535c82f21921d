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

Why one module of this size: its parts (parent links, composing a miss from the
parent's entry, purging) all rest on the one rule above, that an entry for a concrete
checkpoint id never changes; together, the rule and every place relying on it read
as one.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, cast, runtime_checkable

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    writes_sort_key,
)

from runstore.checkpoint.forwarding import ForwardingSaver

if TYPE_CHECKING:
    from runstore.urls import BackendURL

log = logging.getLogger("runstore.checkpoint.cache")

#: How many ancestors a miss may be composed across before asking the inner saver.
DEFAULT_MAX_COMPOSE_DEPTH = 4
#: Child -> parent links remembered per saver instance.
LINK_MEMO_SIZE = 4096
#: Checkpoints whose put (and later writes) this instance remembers.
SEEN_MEMO_SIZE = 256


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


def _seed_key(checkpoint_ns: str, checkpoint_id: str, channel: str, *, held: bool = False) -> str:
    # "held": the checkpoint itself stores the value; otherwise a walk from it found it.
    return entry_key(checkpoint_ns, checkpoint_id, channel) + ("\x1fheld" if held else "\x1fseed")


class _Seen:
    """A checkpoint put through this wrapper: which channels it stores, the writes put at it.

    Writes are kept as the saver's own serializer output, so decoding them gives
    exactly what the saver would return; slots follow the saver contract
    (first write wins per ``(task_id, idx)``, special negative slots last write wins).
    """

    __slots__ = ("broken", "put_seen", "value_keys", "writes")

    def __init__(self) -> None:
        # LangGraph may put a step's writes before the checkpoint they belong to has
        # finished its own put (async durability), so an entry starts with either.
        self.put_seen = False
        self.value_keys: frozenset[str] = frozenset()
        self.writes: dict[tuple[str, int], tuple[str, str, str, tuple[str, bytes]]] = {}
        self.broken = False

    def trusted(self) -> bool:
        return self.put_seen and not self.broken

    def add(
        self, serde: Any, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str
    ) -> None:
        for i, (channel, value) in enumerate(writes):
            slot = (task_id, WRITES_IDX_MAP.get(channel, i))
            if slot[1] >= 0 and slot in self.writes:
                continue
            try:
                typed = serde.dumps_typed(value)
            except Exception:
                self.broken = True
                return
            self.writes[slot] = (task_path, task_id, channel, typed)

    def channel_writes(self, serde: Any, channel: str) -> list[Any]:
        ordered = sorted(
            (writes_sort_key(path, task_id, idx), task_id, typed)
            for (task_id, idx), (path, _, ch, typed) in self.writes.items()
            if ch == channel
        )
        return [(task_id, channel, serde.loads_typed(typed)) for _, task_id, typed in ordered]


class _Part(NamedTuple):
    """``H(checkpoint)`` for one channel without the seed value: writes + where the seed is."""

    writes: list[Any]
    seed_ref: str | None


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
            "observed": 0,
        }
        bind = getattr(cache, "bind_serde", None)
        if callable(bind):
            bind(inner.serde)
        # child -> parent links seen in put / get_tuple / list results. A checkpoint's
        # parent never changes, so this saves the target read when composing a miss.
        self._links: OrderedDict[tuple[str, str, str], tuple[str, str] | None] = OrderedDict()
        # Checkpoints put through this wrapper, with the writes later put at them.
        self._seen: OrderedDict[tuple[str, str, str], _Seen] = OrderedDict()
        # Sync twins may run on worker threads next to the event loop.
        self._memo_lock = threading.Lock()

    def stats(self) -> dict[str, int]:
        """Counters: hits, misses, composed, inner_walks, cache_errors, purges, observed.

        ``observed`` counts misses composed from writes seen going through this
        wrapper (no saver read).
        """
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
        self._forget_links(thread_ids)
        for thread_id in thread_ids:
            self._stats["purges"] += 1
            try:
                await self.cache.purge_thread(str(thread_id))
            except Exception as exc:
                self._stats["cache_errors"] += 1
                log.debug("history cache purge failed: %s", type(exc).__name__)

    def _purge_sync(self, thread_ids: Sequence[str] | None) -> None:
        self._forget_links(thread_ids)
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

    # ------------------------------------------------------------------ parent links

    def _link(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str, parent: Any) -> None:
        if parent is None:
            value: tuple[str, str] | None = None
        else:
            conf = parent.get("configurable") or {}
            parent_id = conf.get("checkpoint_id")
            if not parent_id:
                value = None
            else:
                value = (str(conf.get("checkpoint_ns", checkpoint_ns) or ""), str(parent_id))
        key = (str(thread_id), checkpoint_ns or "", str(checkpoint_id))
        with self._memo_lock:
            self._links[key] = value
            self._links.move_to_end(key)
            while len(self._links) > LINK_MEMO_SIZE:
                self._links.popitem(last=False)

    def _note(self, tup: CheckpointTuple | None) -> CheckpointTuple | None:
        if tup is not None:
            conf = tup.config.get("configurable") or {}
            self._link(
                str(conf.get("thread_id")),
                str(conf.get("checkpoint_ns", "") or ""),
                str(tup.checkpoint["id"]),
                tup.parent_config,
            )
        return tup

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._note(await self.inner.aget_tuple(config))

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        async for tup in self.inner.alist(config, filter=filter, before=before, limit=limit):
            self._note(tup)
            yield tup

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        saved = await self.inner.aput(config, checkpoint, metadata, new_versions)
        self._saw_put(config, checkpoint)
        return saved

    def _saw_put(self, config: RunnableConfig, checkpoint: Checkpoint) -> None:
        conf = config.get("configurable") or {}
        thread_id = str(conf.get("thread_id"))
        checkpoint_ns = str(conf.get("checkpoint_ns", "") or "")
        self._link(
            thread_id,
            checkpoint_ns,
            str(checkpoint["id"]),
            config if conf.get("checkpoint_id") else None,
        )
        key = (thread_id, checkpoint_ns, str(checkpoint["id"]))
        with self._memo_lock:
            seen = self._entry(key)
            if seen.put_seen:
                # A re-put of a known id: its writes so far are not ours to vouch for.
                seen.broken = True
            seen.put_seen = True
            seen.value_keys = frozenset(checkpoint["channel_values"])

    def _entry(self, key: tuple[str, str, str]) -> _Seen:
        seen = self._seen.get(key)
        if seen is None:
            seen = self._seen[key] = _Seen()
            while len(self._seen) > SEEN_MEMO_SIZE:
                self._seen.popitem(last=False)
        else:
            self._seen.move_to_end(key)
        return seen

    def _saw_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str
    ) -> None:
        conf = config.get("configurable") or {}
        if not conf.get("checkpoint_id"):
            return
        key = (
            str(conf.get("thread_id")),
            str(conf.get("checkpoint_ns", "") or ""),
            str(conf.get("checkpoint_id")),
        )
        with self._memo_lock:
            seen = self._entry(key)
            if not seen.broken:
                seen.add(self.serde, writes, task_id, task_path)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await self.inner.aput_writes(config, writes, task_id, task_path)
        self._saw_writes(config, writes, task_id, task_path)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        saved = self.inner.put(config, checkpoint, metadata, new_versions)
        self._saw_put(config, checkpoint)
        return saved

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self.inner.put_writes(config, writes, task_id, task_path)
        self._saw_writes(config, writes, task_id, task_path)

    def _forget_links(self, thread_ids: Sequence[str] | None) -> None:
        with self._memo_lock:
            if thread_ids is None:
                self._links.clear()
                self._seen.clear()
                return
            gone = {str(t) for t in thread_ids}
            for key in [k for k in self._links if k[0] in gone]:
                del self._links[key]
            for key in [k for k in self._seen if k[0] in gone]:
                del self._seen[key]

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
        channels = list(dict.fromkeys(channels))
        parts = await self._parts(thread_id, checkpoint_ns, checkpoint_id, channels, depth)
        result: dict[str, DeltaChannelHistory] = {}
        dangling: list[str] = []
        for ch in channels:
            part = parts[ch]
            entry: DeltaChannelHistory = {"writes": part.writes}
            if part.seed_ref is not None:
                record = await self._cget(thread_id, part.seed_ref)
                if record is None or "seed" not in record:
                    dangling.append(ch)  # the seed record was evicted
                    continue
                entry["seed"] = record["seed"]
            result[ch] = entry
        if dangling:
            # Rare (LRU evicted a seed its entries still point at): walk and re-store.
            walked = await self._walk_and_store(thread_id, checkpoint_ns, checkpoint_id, dangling)
            for ch in dangling:
                result[ch] = walked[ch]
        return result

    async def _parts(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        channels: Sequence[str],
        depth: int,
    ) -> dict[str, _Part]:
        """Writes + seed reference of ``H(checkpoint)`` per channel, cached or composed."""
        parts: dict[str, _Part] = {}
        missing: list[str] = []
        for ch in channels:
            record = await self._cget(thread_id, entry_key(checkpoint_ns, checkpoint_id, ch))
            if record is None:
                missing.append(ch)
            else:
                self._stats["hits"] += 1
                ref = cast(Mapping[str, Any], record).get("seed_ref")
                parts[ch] = _Part(list(record["writes"]), None if ref is None else str(ref))
        if not missing:
            return parts
        self._stats["misses"] += len(missing)
        if depth >= self.max_compose_depth:
            walked = await self._walk_and_store(thread_id, checkpoint_ns, checkpoint_id, missing)
            for ch in missing:
                parts[ch] = _Part(
                    walked[ch]["writes"],
                    _seed_key(checkpoint_ns, checkpoint_id, ch) if "seed" in walked[ch] else None,
                )
            return parts
        composed = await self._compose(thread_id, checkpoint_ns, checkpoint_id, missing, depth)
        for ch, part in composed.items():
            await self._store_part(thread_id, entry_key(checkpoint_ns, checkpoint_id, ch), part)
            parts[ch] = part
        return parts

    async def _store_part(self, thread_id: str, key: str, part: _Part) -> None:
        record: dict[str, Any] = {"writes": part.writes}
        if part.seed_ref is not None:
            record["seed_ref"] = part.seed_ref
        await self._cset(thread_id, key, record)  # type: ignore[arg-type]

    async def _walk_and_store(
        self, thread_id: str, checkpoint_ns: str, checkpoint_id: str, channels: Sequence[str]
    ) -> dict[str, DeltaChannelHistory]:
        """Ask the inner saver, store the seed once and the writes with a reference to it."""
        self._stats["inner_walks"] += 1
        found = await self.inner.aget_delta_channel_history(
            config=_cfg(thread_id, checkpoint_ns, checkpoint_id), channels=list(channels)
        )
        out: dict[str, DeltaChannelHistory] = {}
        for ch in channels:
            entry: DeltaChannelHistory = found.get(ch) or {"writes": []}
            ref = None
            if "seed" in entry:
                # The walk does not say which ancestor held the seed: key it by the target.
                ref = _seed_key(checkpoint_ns, checkpoint_id, ch)
                await self._cset(thread_id, ref, {"writes": [], "seed": entry["seed"]})
            await self._store_part(
                thread_id, entry_key(checkpoint_ns, checkpoint_id, ch), _Part(list(entry["writes"]), ref)
            )
            out[ch] = entry
        return out

    async def _compose(
        self,
        thread_id: str,
        checkpoint_ns: str,
        checkpoint_id: str,
        channels: Sequence[str],
        depth: int,
    ) -> dict[str, _Part]:
        key = (thread_id, checkpoint_ns, checkpoint_id)
        if key in self._links:
            link = self._links[key]
        else:
            target = self._note(
                await self.inner.aget_tuple(_cfg(thread_id, checkpoint_ns, checkpoint_id))
            )
            link = self._links.get(key) if target is not None else None
        if link is None:
            # Same answer as a walk: nothing above the target (or no target).
            return {ch: _Part([], None) for ch in channels}
        parent_ns, parent_id = link
        seen = self._seen.get((thread_id, parent_ns, parent_id))
        target_seen = self._seen.get(key)
        if (
            seen is not None
            and seen.trusted()
            and target_seen is not None
            and target_seen.put_seen
            and not seen.value_keys.intersection(channels)
        ):
            # Both the target and its parent were put through this wrapper, so every
            # write at the parent went through it too (LangGraph stores a step's
            # delta writes before the next checkpoint): no read needed.
            self._stats["observed"] += 1
            with self._memo_lock:
                observed = {ch: seen.channel_writes(self.serde, ch) for ch in channels}
            return await self._compose_above(thread_id, parent_ns, parent_id, observed, depth)
        parent = self._note(await self.inner.aget_tuple(_cfg(thread_id, parent_ns, parent_id)))
        if parent is None:
            return {ch: _Part([], None) for ch in channels}
        writes = parent.pending_writes or []
        stored = parent.checkpoint["channel_values"]
        result: dict[str, _Part] = {}
        above: list[str] = []
        for ch in channels:
            own = [w for w in writes if w[1] == ch]
            if ch in stored:
                # The parent holds the value: it is the seed, stored once for all descendants.
                ref = _seed_key(parent_ns, parent_id, ch, held=True)
                await self._cset(thread_id, ref, {"writes": [], "seed": stored[ch]})
                result[ch] = _Part(own, ref)
            else:
                above.append(ch)
        if above:
            result.update(
                await self._compose_above(
                    thread_id,
                    parent_ns,
                    parent_id,
                    {ch: [w for w in writes if w[1] == ch] for ch in above},
                    depth,
                )
            )
        return result

    async def _compose_above(
        self,
        thread_id: str,
        parent_ns: str,
        parent_id: str,
        own: Mapping[str, list[Any]],
        depth: int,
    ) -> dict[str, _Part]:
        """``H(child) = H(parent) + parent's own writes`` for channels the parent does not hold."""
        base = await self._parts(thread_id, parent_ns, parent_id, list(own), depth + 1)
        self._stats["composed"] += len(own)
        return {ch: _Part([*base[ch].writes, *own[ch]], base[ch].seed_ref) for ch in own}

    # ------------------------------------------------------------------ purge on delete / prune

    async def adelete_thread(self, thread_id: str, **fence: Any) -> None:
        await self.inner.adelete_thread(thread_id, **fence)
        await self._purge([thread_id])

    def delete_thread(self, thread_id: str, **fence: Any) -> None:
        self.inner.delete_thread(thread_id, **fence)
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
        self._forget_links(None)
        try:
            await self.cache.clear()
        except Exception:
            self._stats["cache_errors"] += 1

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self.inner.delete_for_runs(run_ids)
        self._purge_sync(None)


def history_cache_url(settings: Any, registry: Any) -> BackendURL | None:
    """The URL of the ``checkpoint_cache`` backend the settings name, or ``None`` when disabled.

    ``checkpoint_cache.url`` when set; else a cache of the stream bridge's scheme (redis)
    shares the bridge's server; else the named type's first scheme (``memory://``).
    """
    from runstore.urls import BackendURL

    cfg = settings.checkpoint_cache
    if cfg.max_entries <= 0:
        return None
    if cfg.url:
        return BackendURL.parse(cfg.url)
    spec = registry.history_caches.get(cfg.type)
    streams = BackendURL.parse(settings.streams)
    if streams.scheme in spec.schemes:
        return streams
    return BackendURL.parse(f"{spec.schemes[0]}://")


async def open_history_cache(
    settings: Any, options: Any, registry: Any
) -> HistoryCacheBackend | None:
    """Open the ``checkpoint_cache`` backend named by the settings, or ``None`` when disabled."""
    url = history_cache_url(settings, registry)
    if url is None:
        return None
    cache = await registry.history_caches.for_url(url).open(url, options)
    return cache


__all__ = [
    "DEFAULT_MAX_COMPOSE_DEPTH",
    "CachedHistorySaver",
    "HistoryCacheBackend",
    "entry_key",
    "history_cache_url",
    "open_history_cache",
]
