"""In-process checkpoint saver (``memory://``): the full saver contract, delta-safe.

Layout per ``(thread_id, checkpoint_ns)``: checkpoint skeletons (everything but the
channel values) by id plus a sorted id list, channel value blobs keyed by
``(channel, version)`` as LangGraph's version semantics require, and pending writes per
checkpoint keyed by ``(task_id, slot)``. Channel values and writes go through
``self.serde`` so custom and encrypted serializers behave as on disk; metadata is kept
as the SQL savers' JSON text (`codec.metadata_text`) and read back decoded, so every
built-in saver returns the same values (docs/savers.md, "Rows").

The structures (`runstore.plugins.memory.layout`) and every method that reads or
changes them are guarded by the saver's one lock (`layout.locked`); the thread index,
retention and purges are `runstore.plugins.memory.threads.ThreadRecords`, a base
class. The logic is in the sync methods; the async ones only call them.
"""

from __future__ import annotations

import bisect
import builtins
import random
import threading
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

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
)

from runstore.checkpoint import codec
from runstore.checkpoint.filters import filter_terms, metadata_matches
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
    renamed_thread_metadata,
    write_slot,
)
from runstore.checkpoint.threads import (
    clock_micros,
)
from runstore.clock import Clock, system_clock
from runstore.errors import ThreadDeletedError
from runstore.standalone import Standalone
from runstore.urls import BackendURL

from .layout import (
    Entry,
    Namespace,
    PendingWrites,
    ThreadRecord,
    Typed,
    check_record_fence,
    copy_skeleton,
    locked,
)
from .threads import ThreadRecords

if TYPE_CHECKING:
    from runstore.options import BackendOptions


class MemorySaver(ThreadRecords, BaseCheckpointSaver[str], Standalone):
    """In-process LangGraph checkpoint saver with copy, prune, delete-for-runs and a native
    delta-history walk. Sync twins are safe on any thread (nothing here blocks).

    Examples:

    ```python
    import asyncio
    from typing import TypedDict

    from langgraph.graph import START, StateGraph

    from runstore.plugins.memory.saver import MemorySaver


    class State(TypedDict):
        count: int


    builder = StateGraph(State)
    builder.add_node("add_one", lambda state: {"count": state["count"] + 1})
    builder.add_edge(START, "add_one")


    async def main() -> None:
        async with MemorySaver.from_conn_string("memory://") as saver:
            graph = builder.compile(checkpointer=saver)
            config = {"configurable": {"thread_id": "thread-1"}}
            print(await graph.ainvoke({"count": 1}, config))  # {'count': 2}
            saved = await saver.aget_tuple(config)
            print(saved.checkpoint["channel_values"])  # {'count': 2}


    asyncio.run(main())
    ```
    """

    #: The thread index's clock (created/updated times); tests set a `ManualClock`.
    clock: Clock = staticmethod(system_clock)

    def __init__(self, *, serde: SerializerProtocol | None = None) -> None:
        super().__init__(serde=serde)
        self._threads: dict[str, dict[str, Namespace]] = {}
        self._records: dict[str, ThreadRecord] = {}
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

    def _ns(self, thread_id: str, checkpoint_ns: str) -> Namespace | None:
        namespaces = self._threads.get(thread_id)
        return namespaces.get(checkpoint_ns) if namespaces is not None else None

    def _tuple(
        self, thread_id: str, checkpoint_ns: str, ns: Namespace, checkpoint_id: str
    ) -> CheckpointTuple:
        entry = ns.entries[checkpoint_id]
        loads = self.serde.loads_typed
        values: dict[str, Any] = {}
        for channel, version in entry.versions.items():
            blob = ns.blobs.get((channel, version))
            if blob is not None:
                values[channel] = loads(blob)
        checkpoint = copy_skeleton(entry.skeleton)
        checkpoint["channel_values"] = values
        writes = ns.writes.get(checkpoint_id)
        pending: list[PendingWrite] = (
            [(tid, ch, loads(v)) for tid, ch, v, _ in writes.ordered()] if writes else []
        )
        return CheckpointTuple(
            config=checkpoint_config(thread_id, checkpoint_ns, checkpoint_id),
            checkpoint=checkpoint,  # type: ignore[arg-type]
            metadata=codec.decode_metadata(entry.metadata),
            parent_config=(
                checkpoint_config(thread_id, checkpoint_ns, entry.parent)
                if entry.parent
                else None
            ),
            pending_writes=pending,
        )

    # ------------------------------------------------------------------ sync API

    @locked
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

    @locked
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

    @locked
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
        # Raises for metadata no saver can store alike, before anything is stored.
        metadata_text = codec.metadata_text(codec.merged_metadata(config, metadata))
        stored_metadata = orjson.loads(metadata_text)
        now = clock_micros(self.clock)
        record = self._touch(thread_id, now, starts=parent is None, fence=fence)
        record.updated_at = max(record.updated_at, now)
        ns = self._threads.setdefault(thread_id, {}).setdefault(checkpoint_ns, Namespace())
        values = checkpoint.get("channel_values") or {}
        dumps = self.serde.dumps_typed
        for channel, version in new_versions.items():
            ns.blobs[(channel, version)] = dumps(values[channel]) if channel in values else None
        skeleton = copy_skeleton({k: v for k, v in checkpoint.items() if k != "channel_values"})
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
        ns.entries[checkpoint_id] = Entry(
            skeleton=skeleton,
            versions=skeleton["channel_versions"],
            metadata=metadata_text,
            parent=parent,
            run_id=None if run_id is None else str(run_id),
            stored_metadata=stored_metadata,
            created_at=now if previous is None else previous.created_at,
            size=len(record_bytes[1]) + len(metadata_text),
        )
        return checkpoint_config(thread_id, checkpoint_ns, checkpoint_id)

    @locked
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
        ns = self._threads.setdefault(thread_id, {}).setdefault(checkpoint_ns, Namespace())
        stored = ns.writes.get(checkpoint_id)
        if stored is None:
            stored = ns.writes[checkpoint_id] = PendingWrites()
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

    def _touch(self, thread_id: str, now: int, *, starts: bool, fence: int | None) -> ThreadRecord:
        """The thread's record for a write at ``now``; a write carrying a stale ``fence``
        is refused, and so is a write that does not start a history (``starts``: a put
        without a parent) on a deleted thread."""
        record = self._records.get(thread_id)
        if fence is not None:
            check_record_fence(thread_id, record, fence)
        if record is None:
            record = self._records[thread_id] = ThreadRecord(now, now, now)
        elif record.deleted_at is not None:
            if not starts:
                raise ThreadDeletedError(thread_id)
            record.restart(now)
        record.touched_at = max(record.touched_at, now)
        # Written since its last sweep whatever the clocks say (the sqlite saver's rule).
        record.swept_at = None
        if fence is not None:
            record.fence = fence
        return record

    def _fenced(self, thread_id: str, fence: int, now: int) -> None:
        """Raise the thread's fence to ``fence`` (compare and set under the saver's lock);
        `StaleFenceError` if it already holds a higher token."""
        record = self._records.get(thread_id)
        check_record_fence(thread_id, record, fence)
        if record is None:
            record = self._records[thread_id] = ThreadRecord(now, now, now)
        record.fence = fence

    @locked
    def delete_thread(self, thread_id: str, *, fence: int | None = None) -> None:
        """Delete every checkpoint and write of ``thread_id``; the thread keeps a tombstone
        that refuses late writes. With ``fence``, refused (`StaleFenceError`) if the thread
        has seen a newer token."""
        thread_id = checked_text(thread_id, "thread_id")
        if fence is not None:
            self._fenced(thread_id, check_fence(fence), clock_micros(self.clock))
        self._purge([thread_id], dry_run=False)

    @locked
    def fence_thread(self, thread_id: str, fence: int) -> None:
        """Raise the thread's fence to ``fence`` without writing anything else: from now on
        writes carrying an older token are refused. `StaleFenceError` if it holds a newer one."""
        self._fenced(checked_text(thread_id, "thread_id"), check_fence(fence), clock_micros(self.clock))

    @locked
    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy the whole of ``source_thread_id`` (every checkpoint, blob and write) into
        ``target_thread_id``, the copies' metadata ``thread_id`` naming the target; on an id
        present in both, the source's copy wins."""
        source = self._threads.get(checked_text(source_thread_id, "source_thread_id"))
        target_id = checked_text(target_thread_id, "target_thread_id")
        if not source:
            return
        now = clock_micros(self.clock)
        record = self._records.get(target_id)
        if record is None or record.deleted_at is not None:
            self._records[target_id] = ThreadRecord(now, now, now, fence=record.fence if record else 0)
        else:
            record.updated_at = max(record.updated_at, now)
            record.touched_at = max(record.touched_at, now)
            record.swept_at = None
        target = self._threads.setdefault(target_id, {})
        for checkpoint_ns, ns in source.items():
            clone = ns.copy()
            self._rename_thread(clone, source_thread_id, target_id)
            existing = target.get(checkpoint_ns)
            if existing is None:
                target[checkpoint_ns] = clone
                continue
            for cid, entry in clone.entries.items():
                existing.add_id(cid)
                existing.entries[cid] = entry
            existing.blobs.update(clone.blobs)
            existing.writes.update(clone.writes)

    def _rename_thread(self, ns: Namespace, source: str, target: str) -> None:
        """Point the copied entries' metadata at the copy (`renamed_thread_metadata`): LangGraph's
        server filters a thread's history by it."""
        for entry in ns.entries.values():
            stored = renamed_thread_metadata(entry.stored_metadata, source, target)
            if stored is None:
                continue
            entry.stored_metadata = stored
            entry.metadata = codec.metadata_text(stored)
            entry.size += len(target) - len(source)

    @locked
    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest``: per namespace keep the latest checkpoint, its writes and every
        ancestor its delta reconstruction reads (for each delta channel the metadata counters
        name that holds no value there); ``delete``: drop the threads."""
        strategy = check_prune_strategy(strategy)
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

    @locked
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

    @locked
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


