"""In-process checkpoint saver (``memory://``): the full saver contract, delta-safe.

Layout per ``(thread_id, checkpoint_ns)``: checkpoint skeletons (everything but the
channel values) by id plus a sorted id list, channel value blobs keyed by
``(channel, version)`` as LangGraph's version semantics require, and pending writes per
checkpoint keyed by ``(task_id, slot)``. Channel values, writes and metadata go
through ``self.serde`` so custom and encrypted serializers behave as on disk.

Why one module of this size: the structures above (`_Namespace`, its records, blobs
and writes) and every method that reads or changes them are guarded by one lock and
share their invariants (the sorted id list matches the records, a blob stays while a
checkpoint refers to it); split apart, one invariant would be spread over several
files. The logic is in the sync methods; the async ones only call them.
"""

from __future__ import annotations

import bisect
import builtins
import functools
import random
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    PendingWrite,
    SerializerProtocol,
    get_checkpoint_id,
    get_checkpoint_metadata,
)

from runstore.checkpoint import codec
from runstore.checkpoint.filters import filter_terms, metadata_matches
from runstore.checkpoint.policy import (
    CheckpointGraph,
    RetentionPolicy,
    SweepBatch,
    ThreadSwept,
    batch_of,
    check_overrides,
    check_sweep,
    claimable,
    due,
    plan_thread,
)
from runstore.checkpoint.rules import (
    check_fence,
    check_prune_strategy,
    check_put,
    check_put_writes,
    checked_ids,
    checked_text,
    checkpoint_config,
    config_address,
    config_fence,
    history_channels,
    is_last_write_wins,
    write_slot,
)
from runstore.checkpoint.threads import (
    Removed,
    ThreadInfo,
    ThreadPage,
    clock_micros,
    next_cursor,
    status_of,
    thread_info,
    thread_query,
)
from runstore.clock import Clock, system_clock
from runstore.errors import ThreadDeletedError
from runstore.fencing import admit_fence
from runstore.standalone import Standalone
from runstore.urls import BackendURL

if TYPE_CHECKING:
    from runstore.options import BackendOptions

Typed = tuple[str, bytes]
#: (task_id, channel, serialized value, task_path)
StoredWrite = tuple[str, str, Typed, str]

F = TypeVar("F", bound=Callable[..., Any])


def _locked(method: F) -> F:
    # Sync twins may run on worker threads next to the loop; one lock keeps every
    # compound update (ids + entries + blobs) and every read consistent.
    @functools.wraps(method)
    def wrapper(self: MemorySaver, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


@dataclass
class _Entry:
    """One stored checkpoint without its channel values."""

    skeleton: dict[str, Any]
    versions: dict[str, Any]
    metadata: Typed
    parent: str | None
    run_id: Any
    # The metadata as the SQL savers store it (JSON form), for filters and the
    # delta counters (`saverbase.delta_channels`).
    stored_metadata: dict[str, Any] = field(default_factory=dict)
    # The saver's clock at the first put of this id (microseconds since the epoch).
    created_at: int = 0
    # What the entry holds, as `ThreadInfo.bytes` counts it (record and metadata).
    size: int = 0


@dataclass
class _Record:
    """A thread's index record; counts, latest checkpoint and status are read from the
    namespaces when asked (nothing here can fall behind them)."""

    created_at: int
    updated_at: int
    touched_at: int
    retention: dict[str, Any] | None = None
    swept_at: int | None = None
    sweep_after: int | None = None
    claimed_until: int | None = None
    fence: int = 0
    deleted_at: int | None = None

    def restart(self, now: int) -> None:
        """Begin a new history after a tombstone (only ``fence`` survives)."""
        self.created_at = self.updated_at = self.touched_at = now
        self.retention = self.swept_at = self.sweep_after = self.deleted_at = None
        self.claimed_until = None


@dataclass
class _Writes:
    """The pending writes of one checkpoint; sorted lazily in `writes_sort_key` order."""

    by_key: dict[tuple[str, int], StoredWrite] = field(default_factory=dict)
    _sorted: list[StoredWrite] | None = None

    def ordered(self) -> list[StoredWrite]:
        if self._sorted is None:
            self._sorted = [
                self.by_key[key]
                for key in sorted(self.by_key, key=lambda k: (self.by_key[k][3], k[0], k[1]))
            ]
        return self._sorted


@dataclass
class _Namespace:
    entries: dict[str, _Entry] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    # (channel, version) -> serialized value, or None for "version exists, no value stored"
    blobs: dict[tuple[str, Any], Typed | None] = field(default_factory=dict)
    writes: dict[str, _Writes] = field(default_factory=dict)

    def add_id(self, checkpoint_id: str) -> None:
        if checkpoint_id in self.entries:
            return
        if not self.order or checkpoint_id > self.order[-1]:
            self.order.append(checkpoint_id)
        else:
            bisect.insort(self.order, checkpoint_id)

    def latest(self) -> str | None:
        return self.order[-1] if self.order else None

    def has_value(self, checkpoint_id: str, channel: str) -> bool:
        entry = self.entries.get(checkpoint_id)
        if entry is None or channel not in entry.versions:
            return False
        return self.blobs.get((channel, entry.versions[channel])) is not None

    def valued_channels(self, checkpoint_id: str) -> set[str]:
        entry = self.entries.get(checkpoint_id)
        if entry is None:
            return set()
        return {
            ch for ch, ver in entry.versions.items() if self.blobs.get((ch, ver)) is not None
        }

    def graph(self) -> CheckpointGraph:
        """The namespace as the retention and pruning rules read it."""
        return CheckpointGraph(
            (cid, e.parent, e.run_id, e.stored_metadata, sorted(self.valued_channels(cid)),
             e.versions, e.created_at)
            for cid, e in self.entries.items()
        )

    def remove(self, doomed: set[str]) -> None:
        if not doomed:
            return
        for checkpoint_id in doomed:
            self.entries.pop(checkpoint_id, None)
            self.writes.pop(checkpoint_id, None)
        self.order = [cid for cid in self.order if cid not in doomed]
        # A parent that can no longer be loaded is not named (docs/threads.md).
        for entry in self.entries.values():
            if entry.parent in doomed:
                entry.parent = None
        # Blobs are shared by version across checkpoints: keep what survivors reference.
        referenced = {
            (ch, ver) for entry in self.entries.values() for ch, ver in entry.versions.items()
        }
        for key in [key for key in self.blobs if key not in referenced]:
            del self.blobs[key]

    def copy(self) -> _Namespace:
        clone = _Namespace(
            entries={
                cid: _Entry(
                    skeleton=_copy_skeleton(e.skeleton),
                    versions=dict(e.versions),
                    metadata=e.metadata,
                    stored_metadata=e.stored_metadata,
                    parent=e.parent,
                    run_id=e.run_id,
                    created_at=e.created_at,
                    size=e.size,
                )
                for cid, e in self.entries.items()
            },
            order=list(self.order),
            blobs=dict(self.blobs),
        )
        for cid, writes in self.writes.items():
            clone.writes[cid] = _Writes(by_key=dict(writes.by_key))
        return clone


def _copy_skeleton(skeleton: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(skeleton)
    out["channel_versions"] = dict(skeleton.get("channel_versions", {}))
    out["versions_seen"] = {k: dict(v) for k, v in skeleton.get("versions_seen", {}).items()}
    if isinstance(out.get("pending_sends"), list):
        out["pending_sends"] = list(out["pending_sends"])
    if isinstance(out.get("updated_channels"), list):
        out["updated_channels"] = list(out["updated_channels"])
    return out


class MemorySaver(BaseCheckpointSaver[str], Standalone):
    """In-process LangGraph checkpoint saver with copy, prune, delete-for-runs and a native
    delta-history walk. Sync twins are safe on any thread (nothing here blocks)."""

    #: The thread index's clock (created/updated times); tests set a `ManualClock`.
    clock: Clock = staticmethod(system_clock)

    def __init__(self, *, serde: SerializerProtocol | None = None) -> None:
        super().__init__(serde=serde)
        self._threads: dict[str, dict[str, _Namespace]] = {}
        self._records: dict[str, _Record] = {}
        self._lock = threading.RLock()

    @classmethod
    async def open(cls, url: BackendURL, options: BackendOptions) -> MemorySaver:
        """Open a fresh, empty saver for ``memory://`` (no URL options accepted)."""
        url.check_options(set())
        saver = cls()
        options.on_close(saver.aclose)
        return saver

    async def aclose(self) -> None:
        """Drop everything stored."""
        self._threads.clear()
        self._records.clear()

    # ------------------------------------------------------------------ helpers

    def _ns(self, thread_id: str, checkpoint_ns: str) -> _Namespace | None:
        namespaces = self._threads.get(thread_id)
        return namespaces.get(checkpoint_ns) if namespaces is not None else None

    def _tuple(
        self, thread_id: str, checkpoint_ns: str, ns: _Namespace, checkpoint_id: str
    ) -> CheckpointTuple:
        entry = ns.entries[checkpoint_id]
        loads = self.serde.loads_typed
        values: dict[str, Any] = {}
        for channel, version in entry.versions.items():
            blob = ns.blobs.get((channel, version))
            if blob is not None:
                values[channel] = loads(blob)
        checkpoint = _copy_skeleton(entry.skeleton)
        checkpoint["channel_values"] = values
        writes = ns.writes.get(checkpoint_id)
        pending: list[PendingWrite] = (
            [(tid, ch, loads(v)) for tid, ch, v, _ in writes.ordered()] if writes else []
        )
        return CheckpointTuple(
            config=checkpoint_config(thread_id, checkpoint_ns, checkpoint_id),
            checkpoint=checkpoint,  # type: ignore[arg-type]
            metadata=loads(entry.metadata),
            parent_config=(
                checkpoint_config(thread_id, checkpoint_ns, entry.parent)
                if entry.parent
                else None
            ),
            pending_writes=pending,
        )

    # ------------------------------------------------------------------ sync API

    @_locked
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (or the thread's latest), with its pending writes."""
        thread_id, checkpoint_ns, checkpoint_id = config_address(config)
        ns = self._ns(thread_id, checkpoint_ns)
        if ns is None:
            return None
        checkpoint_id = checkpoint_id or ns.latest()
        if checkpoint_id is None or checkpoint_id not in ns.entries:
            return None
        return self._tuple(thread_id, checkpoint_ns, ns, checkpoint_id)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Matching checkpoints ordered by (checkpoint id, thread, namespace) descending
        (docs/savers.md, "Listing")."""
        terms = filter_terms(filter)
        candidates = self._list_candidates(config, before)
        if limit is not None and limit <= 0:
            return
        remaining = limit
        for thread_id, checkpoint_ns, checkpoint_id in candidates:
            with self._lock:
                ns = self._ns(thread_id, checkpoint_ns)
                entry = ns.entries.get(checkpoint_id) if ns is not None else None
                if ns is None or entry is None:
                    continue
                if not metadata_matches(entry.stored_metadata, terms):
                    continue
                item = self._tuple(thread_id, checkpoint_ns, ns, checkpoint_id)
            yield item
            if remaining is not None:
                remaining -= 1
                if remaining <= 0:
                    return

    @_locked
    def _list_candidates(
        self, config: RunnableConfig | None, before: RunnableConfig | None
    ) -> builtins.list[tuple[str, str, str]]:
        configurable = (config or {}).get("configurable") or {}
        if configurable.get("thread_id") is not None:
            thread = checked_text(configurable["thread_id"], "config['configurable']['thread_id']")
            thread_ids = [thread]
        else:
            thread_ids = list(self._threads)
        only_ns = configurable.get("checkpoint_ns")
        if only_ns is not None:
            only_ns = checked_text(only_ns, "checkpoint_ns", empty_ok=True)
        only_id = configurable.get("checkpoint_id")
        if only_id:
            only_id = checked_text(only_id, "checkpoint_id")
        before_id = get_checkpoint_id(before) if before else None
        if before_id:
            before_id = checked_text(before_id, "before checkpoint_id")
        # (checkpoint_id, thread_id, checkpoint_ns): the order every saver lists in.
        found: builtins.list[tuple[str, str, str]] = []
        for thread_id in thread_ids:
            for checkpoint_ns, ns in self._threads.get(thread_id, {}).items():
                if only_ns is not None and checkpoint_ns != only_ns:
                    continue
                if only_id:
                    if only_id in ns.entries and (not before_id or only_id < before_id):
                        found.append((only_id, thread_id, checkpoint_ns))
                    continue
                ids = ns.order
                if before_id:
                    ids = ids[: bisect.bisect_left(ids, before_id)]
                found.extend((cid, thread_id, checkpoint_ns) for cid in ids)
        found.sort(reverse=True)
        return [(thread_id, ns_name, cid) for cid, thread_id, ns_name in found]

    @_locked
    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store ``checkpoint`` as a child of the checkpoint ``config`` names (if any)."""
        thread_id, checkpoint_ns, parent, checkpoint_id = check_put(
            config, checkpoint, new_versions
        )
        fence = config_fence(config)
        full_metadata = get_checkpoint_metadata(config, metadata)
        # Raises for metadata JSON cannot hold, before anything is stored.
        metadata_text = codec.metadata_text(codec.merged_metadata(config, metadata))
        stored_metadata = orjson.loads(metadata_text)
        now = clock_micros(self.clock)
        record = self._touch(thread_id, now, starts=parent is None, fence=fence)
        record.updated_at = max(record.updated_at, now)
        ns = self._threads.setdefault(thread_id, {}).setdefault(checkpoint_ns, _Namespace())
        values = checkpoint.get("channel_values") or {}
        dumps = self.serde.dumps_typed
        for channel, version in new_versions.items():
            ns.blobs[(channel, version)] = dumps(values[channel]) if channel in values else None
        skeleton = _copy_skeleton({k: v for k, v in checkpoint.items() if k != "channel_values"})
        # A value whose version is not new normally has its blob already; a hand-written
        # checkpoint may not, and what was put must come back.
        for channel, value in values.items():
            version = skeleton["channel_versions"].get(channel)
            if (
                version is not None
                and channel not in new_versions
                and (channel, version) not in ns.blobs
            ):
                ns.blobs[(channel, version)] = dumps(value)
        run_id = stored_metadata.get("run_id")
        previous = ns.entries.get(checkpoint_id)
        ns.add_id(checkpoint_id)
        record_bytes = dumps(skeleton)
        ns.entries[checkpoint_id] = _Entry(
            skeleton=skeleton,
            versions=skeleton["channel_versions"],
            metadata=dumps(full_metadata),
            parent=parent,
            run_id=None if run_id is None else str(run_id),
            stored_metadata=stored_metadata,
            created_at=now if previous is None else previous.created_at,
            size=len(record_bytes[1]) + len(metadata_text),
        )
        return checkpoint_config(thread_id, checkpoint_ns, checkpoint_id)

    @_locked
    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's writes: first write wins per (task_id, idx), special slots replace."""
        thread_id, checkpoint_ns, checkpoint_id, task_id, task_path = check_put_writes(
            config, writes, task_id, task_path
        )
        fence = config_fence(config)
        if not writes:
            return
        self._touch(thread_id, clock_micros(self.clock), starts=False, fence=fence)
        ns = self._threads.setdefault(thread_id, {}).setdefault(checkpoint_ns, _Namespace())
        stored = ns.writes.get(checkpoint_id)
        if stored is None:
            stored = ns.writes[checkpoint_id] = _Writes()
        dumps = self.serde.dumps_typed
        changed = False
        for idx, (channel, value) in enumerate(writes):
            slot = write_slot(channel, idx)
            key = (task_id, slot)
            if key in stored.by_key and not is_last_write_wins(slot):
                continue
            stored.by_key[key] = (task_id, channel, dumps(value), task_path)
            changed = True
        if changed:
            stored._sorted = None

    def _touch(self, thread_id: str, now: int, *, starts: bool, fence: int | None) -> _Record:
        """The thread's record for a write at ``now``; a write carrying a stale ``fence``
        is refused, and so is a write that does not start a history (``starts``: a put
        without a parent) on a deleted thread."""
        record = self._records.get(thread_id)
        if fence is not None:
            _check_fence(thread_id, record, fence)
        if record is None:
            record = self._records[thread_id] = _Record(now, now, now)
        elif record.deleted_at is not None:
            if not starts:
                raise ThreadDeletedError(thread_id)
            record.restart(now)
        record.touched_at = max(record.touched_at, now)
        if fence is not None:
            record.fence = fence
        return record

    def _fenced(self, thread_id: str, fence: int, now: int) -> None:
        """Raise the thread's fence to ``fence`` (compare and set under the saver's lock);
        `StaleFenceError` if it already holds a higher token."""
        record = self._records.get(thread_id)
        _check_fence(thread_id, record, fence)
        if record is None:
            record = self._records[thread_id] = _Record(now, now, now)
        record.fence = fence

    @_locked
    def delete_thread(self, thread_id: str, *, fence: int | None = None) -> None:
        """Delete every checkpoint and write of ``thread_id``; the thread keeps a tombstone
        that refuses late writes. With ``fence``, refused (`StaleFenceError`) if the thread
        has seen a newer token."""
        thread_id = checked_text(thread_id, "thread_id")
        if fence is not None:
            self._fenced(thread_id, check_fence(fence), clock_micros(self.clock))
        self._purge([thread_id], dry_run=False)

    @_locked
    def fence_thread(self, thread_id: str, fence: int) -> None:
        """Raise the thread's fence to ``fence`` without writing anything else: from now on
        writes carrying an older token are refused. `StaleFenceError` if it holds a newer one."""
        self._fenced(checked_text(thread_id, "thread_id"), check_fence(fence), clock_micros(self.clock))

    def _purge(self, thread_ids: Sequence[str], *, dry_run: bool) -> Removed:
        now = clock_micros(self.clock)
        removed = Removed()
        for thread_id in thread_ids:
            namespaces = self._threads.get(thread_id, {})
            live = self._info(thread_id) is not None
            removed += Removed(int(live)) + _footprint(namespaces.values())
            if dry_run:
                continue
            self._threads.pop(thread_id, None)
            record = self._records.get(thread_id)
            if record is not None:
                record.restart(now)
                record.deleted_at = now
        return removed

    @_locked
    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy the whole of ``source_thread_id`` (every checkpoint, blob and write) into
        ``target_thread_id``; on an id present in both, the source's copy wins."""
        source = self._threads.get(checked_text(source_thread_id, "source_thread_id"))
        target_id = checked_text(target_thread_id, "target_thread_id")
        if not source:
            return
        now = clock_micros(self.clock)
        record = self._records.get(target_id)
        if record is None or record.deleted_at is not None:
            self._records[target_id] = _Record(now, now, now, fence=record.fence if record else 0)
        else:
            record.updated_at = max(record.updated_at, now)
            record.touched_at = max(record.touched_at, now)
        target = self._threads.setdefault(target_id, {})
        for checkpoint_ns, ns in source.items():
            clone = ns.copy()
            existing = target.get(checkpoint_ns)
            if existing is None:
                target[checkpoint_ns] = clone
                continue
            for cid, entry in clone.entries.items():
                existing.add_id(cid)
                existing.entries[cid] = entry
            existing.blobs.update(clone.blobs)
            existing.writes.update(clone.writes)

    @_locked
    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest``: per namespace keep the latest checkpoint, its writes and every
        ancestor its delta reconstruction reads (for each delta channel the metadata counters
        name that holds no value there); ``delete``: drop the threads."""
        check_prune_strategy(strategy)
        for thread_id in checked_ids(thread_ids, "thread_ids"):
            if strategy == "delete":
                self._purge([thread_id], dry_run=False)
                continue
            for ns in self._threads.get(thread_id, {}).values():
                latest = ns.latest()
                if latest is None:
                    continue
                keep = {latest, *ns.graph().needed(latest)}
                ns.remove(set(ns.entries) - keep)

    @_locked
    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) whose metadata ``run_id`` is in
        ``run_ids``, except ancestors a surviving checkpoint's delta reconstruction reads."""
        wanted = set(checked_ids(run_ids, "run_ids"))
        if not wanted:
            return
        for thread_id in list(self._threads):
            namespaces = self._threads[thread_id]
            for checkpoint_ns in list(namespaces):
                ns = namespaces[checkpoint_ns]
                doomed = {cid for cid, e in ns.entries.items() if e.run_id in wanted}
                if not doomed:
                    continue
                graph = ns.graph()
                for cid in ns.entries:
                    if cid not in doomed:
                        doomed.difference_update(graph.needed(cid))
                ns.remove(doomed)
                if not ns.entries and not ns.writes:
                    del namespaces[checkpoint_ns]
            if not namespaces:
                del self._threads[thread_id]

    @_locked
    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Per channel: writes from the target's parent back to the nearest ancestor holding
        a value (that ancestor's own writes included), oldest first, plus that value as seed."""
        if not channels:
            return {}
        history_channels(channels)
        thread_id, checkpoint_ns, checkpoint_id = config_address(config)
        ns = self._ns(thread_id, checkpoint_ns)
        collected: dict[str, list[tuple[str, Typed]]] = {ch: [] for ch in channels}
        seeds: dict[str, Typed] = {}
        if ns is not None:
            target_id = checkpoint_id or ns.latest()
            target = ns.entries.get(target_id) if target_id else None
            remaining = set(channels)
            current = target.parent if target is not None else None
            visited: set[str] = set()
            while current is not None and remaining and current not in visited:
                visited.add(current)
                entry = ns.entries.get(current)
                if entry is None:
                    break
                writes = ns.writes.get(current)
                if writes is not None:
                    # Newest checkpoint first, each reversed; flipped once at the end.
                    for tid, ch, value, _ in reversed(writes.ordered()):
                        if ch in remaining:
                            collected[ch].append((tid, value))
                for ch in list(remaining):
                    version = entry.versions.get(ch)
                    if version is None:
                        continue
                    blob = ns.blobs.get((ch, version))
                    if blob is not None:
                        seeds[ch] = blob
                        remaining.discard(ch)
                current = entry.parent
        loads = self.serde.loads_typed
        result: dict[str, DeltaChannelHistory] = {}
        for ch in channels:
            history: DeltaChannelHistory = {
                "writes": [(tid, ch, loads(value)) for tid, value in reversed(collected[ch])]
            }
            if ch in seeds:
                history["seed"] = loads(seeds[ch])
            result[ch] = history
        return result

    # ------------------------------------------------------------------ retention

    @_locked
    def set_thread_retention(self, thread_id: str, overrides: Mapping[str, Any] | None) -> None:
        """Store retention overrides with the thread (``None`` clears them; docs/threads.md)."""
        text = check_overrides(overrides)
        thread = checked_text(thread_id, "thread_id")
        now = clock_micros(self.clock)
        record = self._records.get(thread)
        if record is not None and record.deleted_at is not None:
            raise ThreadDeletedError(thread)
        if record is None:
            record = self._records[thread] = _Record(now, now, now)
        record.retention = None if text is None else orjson.loads(text)
        record.swept_at = None

    async def aset_thread_retention(
        self, thread_id: str, overrides: Mapping[str, Any] | None
    ) -> None:
        """Async `set_thread_retention`."""
        self.set_thread_retention(thread_id, overrides)

    @_locked
    def touch_thread(self, thread_id: str) -> bool:
        """Count a read as activity: ``touched_at`` (where ``idle_ttl`` counts from) becomes
        now; whether the thread exists."""
        record = self._records.get(checked_text(thread_id, "thread_id"))
        if record is None or record.deleted_at is not None:
            return False
        record.touched_at = max(record.touched_at, clock_micros(self.clock))
        return True

    async def atouch_thread(self, thread_id: str) -> bool:
        """Async `touch_thread`."""
        return self.touch_thread(thread_id)

    async def asweep(
        self,
        policy: RetentionPolicy,
        *,
        after: str | None = None,
        limit: int = 100,
        dry_run: bool = False,
        claim_seconds: float = 300.0,
        rescan: bool = False,
        thread_ids: Sequence[str] | None = None,
    ) -> SweepBatch:
        """One bounded batch of a retention sweep (the SQL savers' contract: claims up to
        ``limit`` threads after ``after`` and applies ``policy`` to each live one)."""
        claim = check_sweep(policy, limit, claim_seconds)
        only = None if thread_ids is None else checked_ids(thread_ids, "thread_ids")
        now = clock_micros(self.clock)
        until = None if dry_run else now + claim
        claimed = self._sweep_claim(policy, now, after, limit, until, rescan, only)
        swept = [self._sweep_thread(t, policy, now, dry_run) for t, gone in claimed if not gone]
        return batch_of(claimed, swept, limit)

    @_locked
    def _sweep_claim(
        self,
        policy: RetentionPolicy,
        now: int,
        after: str | None,
        limit: int,
        until: int | None,
        rescan: bool,
        only: Sequence[str] | None,
    ) -> builtins.list[tuple[str, bool]]:
        claimed: builtins.list[tuple[str, bool]] = []
        pool = self._records if only is None else [t for t in set(only) if t in self._records]
        for thread_id in sorted(t for t in pool if after is None or t > after):
            record = self._records[thread_id]
            if not claimable(record.claimed_until, now):
                continue
            if record.deleted_at is not None:
                wanted = record.swept_at is None
            else:
                namespaces = self._threads.get(thread_id, {}).values()
                created = [e.created_at for ns in namespaces for e in ns.entries.values()]
                wanted = due(
                    policy,
                    now,
                    has_overrides=record.retention is not None,
                    touched_at=record.touched_at,
                    checkpoints=len(created),
                    oldest_at=min(created, default=None),
                    swept_at=record.swept_at,
                    sweep_after=record.sweep_after,
                    rescan=rescan,
                )
            if wanted:
                if until is not None:
                    record.claimed_until = until
                claimed.append((thread_id, record.deleted_at is not None))
                if len(claimed) == limit:
                    break
        return claimed

    @_locked
    def _sweep_thread(
        self, thread_id: str, policy: RetentionPolicy, now: int, dry_run: bool
    ) -> ThreadSwept | None:
        record = self._records.get(thread_id)
        if record is None or self._info(thread_id) is None:
            return None
        namespaces = self._threads.get(thread_id, {})
        plan = plan_thread(
            lambda: {name: ns.graph() for name, ns in namespaces.items()},
            policy.overridden(record.retention),
            now=now,
            touched_at=record.touched_at,
        )
        if plan.expire:
            return ThreadSwept(thread_id, True, self._purge([thread_id], dry_run=dry_run))
        removed = Removed()
        for name, gone in plan.doomed.items():
            ns = namespaces[name] if not dry_run else namespaces[name].copy()
            before = _footprint([ns])
            ns.remove(set(gone))
            removed += before - _footprint([ns])
        if not dry_run:
            record.swept_at, record.sweep_after = now, plan.sweep_after
            record.claimed_until = None
        return ThreadSwept(thread_id, False, removed)

    @_locked
    def purge_threads(self, thread_ids: Sequence[str], *, dry_run: bool = False) -> Removed:
        """`delete_thread` for several threads, answering what went (a dry run only counts)."""
        return self._purge(checked_ids(thread_ids, "thread_ids"), dry_run=dry_run)

    async def apurge_threads(self, thread_ids: Sequence[str], *, dry_run: bool = False) -> Removed:
        """Async `purge_threads`."""
        return self.purge_threads(thread_ids, dry_run=dry_run)

    @_locked
    def finish_cleanup(self, thread_ids: Sequence[str]) -> None:
        """Mark deleted threads whose events and stream keys are gone as done (the sweeper)."""
        now = clock_micros(self.clock)
        for thread_id in checked_ids(thread_ids, "thread_ids"):
            record = self._records.get(thread_id)
            if record is not None and record.deleted_at is not None:
                record.swept_at, record.claimed_until = now, None

    async def afinish_cleanup(self, thread_ids: Sequence[str]) -> None:
        """Async `finish_cleanup`."""
        self.finish_cleanup(thread_ids)

    # ------------------------------------------------------------------ thread index

    def _info(self, thread_id: str) -> ThreadInfo | None:
        """The thread's `ThreadInfo`, computed from its namespaces (``None``: not live)."""
        record = self._records.get(thread_id)
        namespaces = self._threads.get(thread_id)
        if record is None or record.deleted_at is not None or not namespaces:
            return None
        checkpoints = sum(len(ns.entries) for ns in namespaces.values())
        if not checkpoints:
            return None
        root = namespaces.get("")
        head = root.latest() if root is not None else None
        metadata: dict[str, Any] = {}
        status = "idle"
        if root is not None and head is not None:
            metadata = root.entries[head].stored_metadata
            head_writes = root.writes.get(head)
            if head_writes is not None:
                status = status_of(w[1] for w in head_writes.by_key.values())
        footprint = _footprint(namespaces.values())
        return thread_info(
            thread_id,
            created_at=record.created_at,
            updated_at=record.updated_at,
            touched_at=record.touched_at,
            latest_checkpoint_id=head,
            checkpoints=checkpoints,
            writes=footprint.writes,
            bytes=footprint.bytes,
            status=status,
            metadata=metadata,
            retention=record.retention,
        )

    @_locked
    def get_thread(self, thread_id: str) -> ThreadInfo | None:
        """The thread's index record, or ``None`` if it has no checkpoint (or was deleted)."""
        return self._info(checked_text(thread_id, "thread_id"))

    @_locked
    def list_threads(
        self,
        *,
        filter: Mapping[str, Any] | None = None,
        status: str | None = None,
        updated_after: Any = None,
        updated_before: Any = None,
        order_by: str = "updated_at",
        limit: int = 50,
        cursor: str | None = None,
    ) -> ThreadPage:
        """One page of threads, newest first by ``order_by`` (docs/threads.md)."""
        query = thread_query(
            filter=filter,
            status=status,
            updated_after=updated_after,
            updated_before=updated_before,
            order_by=order_by,
            limit=limit,
            cursor=cursor,
        )
        keyed: list[tuple[tuple[int, str], str]] = []
        for thread_id, record in self._records.items():
            if record.deleted_at is not None:
                continue
            if query.updated_after is not None and record.updated_at <= query.updated_after:
                continue
            if query.updated_before is not None and record.updated_at >= query.updated_before:
                continue
            key = (record.updated_at if order_by == "updated_at" else record.created_at, thread_id)
            if query.after is not None and key >= query.after:
                continue
            keyed.append((key, thread_id))
        keyed.sort(reverse=True)
        threads: list[ThreadInfo] = []
        for _, thread_id in keyed:
            info = self._info(thread_id)
            if info is None or (query.status is not None and info.status != query.status):
                continue
            if not metadata_matches(info.metadata, query.terms):
                continue
            threads.append(info)
            if len(threads) == query.limit:
                break
        return ThreadPage(threads, next_cursor(query, threads))

    async def aget_thread(self, thread_id: str) -> ThreadInfo | None:
        """Async `get_thread`."""
        return self.get_thread(thread_id)

    async def alist_threads(self, **kwargs: Any) -> ThreadPage:
        """Async `list_threads` (same keyword arguments)."""
        return self.list_threads(**kwargs)

    def get_next_version(self, current: str | None, channel: None) -> str:
        """A string version: a zero-padded counter (orders versions) plus a random tail."""
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(str(current).split(".", 1)[0])
        return f"{number + 1:032d}.{random.getrandbits(53):016d}"

    # ------------------------------------------------------------------ async API
    # Nothing here waits on I/O, so the async methods run the sync ones inline.

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Async `get_tuple`."""
        return self.get_tuple(config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Async `list`."""
        for item in self.list(config, filter=filter, before=before, limit=limit):
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Async `put`."""
        return self.put(config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Async `put_writes`."""
        self.put_writes(config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str, *, fence: int | None = None) -> None:
        """Async `delete_thread`."""
        self.delete_thread(thread_id, fence=fence)

    async def afence_thread(self, thread_id: str, fence: int) -> None:
        """Async `fence_thread`."""
        self.fence_thread(thread_id, fence)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Async `copy_thread`."""
        self.copy_thread(source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Async `prune`."""
        self.prune(thread_ids, strategy=strategy)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Async `delete_for_runs`."""
        self.delete_for_runs(run_ids)

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Async `get_delta_channel_history`."""
        return self.get_delta_channel_history(config=config, channels=channels)


def _check_fence(thread_id: str, record: _Record | None, fence: int) -> None:
    """`StaleFenceError` if the thread has seen a token newer than ``fence``."""
    admit_fence(fence, record.fence if record is not None else 0, thread_id=thread_id)


def _footprint(namespaces: Iterable[_Namespace]) -> Removed:
    """The rows and bytes namespaces hold, counted as the SQL savers count them."""
    checkpoints = writes = blobs = size = 0
    for ns in namespaces:
        checkpoints += len(ns.entries)
        size += sum(e.size for e in ns.entries.values())
        for stored in ns.writes.values():
            writes += len(stored.by_key)
            size += sum(len(w[2][1]) for w in stored.by_key.values())
        for blob in ns.blobs.values():
            if blob is not None:
                blobs += 1
                size += len(blob[1])
    return Removed(0, checkpoints, writes, blobs, size)
