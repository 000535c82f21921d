"""`ParentWalkSaver`: ``aget_tuple`` answers kept for parent walks, once a child names them.

A saver behind LangGraph's Agent Server never sees a delta-history question: the
server's adapter forwards ``aget_tuple`` but not ``aget_delta_channel_history``, so
LangGraph's default walk loads the target checkpoint and then each parent with
``aget_tuple`` until it finds a value, and every turn walks back over the same
ancestors. A checkpoint that has a child is never rewritten (the rule
`runstore.checkpoint.cache` rests on), so its tuple can be kept and handed out again:
a walk then reads from storage only the checkpoints written since the last one.

`runstore.open` wraps a delta-mode saver in `ParentWalkSaver` (full-mode threads hold
every value, so nothing walks). Every answer is a fresh copy (a caller may change what it
gets). Writes put at a kept checkpoint through the wrapper drop it; deleting, pruning,
copying into a thread and deleting runs drop the threads' tuples. Another process
deleting a thread leaves its tuples here until evicted, reachable only by a walk from a
checkpoint of that thread, which no longer loads.
"""

from __future__ import annotations

import copy
import pickle
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple

from runstore.checkpoint.forwarding import ForwardingSaver

#: ``(thread_id, checkpoint_ns, checkpoint_id)``.
TupleKey = tuple[str, str, str]

#: Tuples kept per saver instance (a walk is at most a snapshot interval long).
DEFAULT_MAX_TUPLES = 256
#: Checkpoints remembered as having a child.
MAX_SEALED = 4096

__all__ = ["DEFAULT_MAX_TUPLES", "ParentWalkSaver", "SealedTuples", "TupleKey", "concrete_key"]


def concrete_key(config: RunnableConfig) -> TupleKey | None:
    """The key of the one checkpoint ``config`` names, or ``None`` (no ``checkpoint_id``: the head)."""
    conf = config.get("configurable") or {}
    checkpoint_id = conf.get("checkpoint_id")
    if not checkpoint_id or conf.get("thread_id") is None:
        return None
    return (str(conf["thread_id"]), str(conf.get("checkpoint_ns", "") or ""), str(checkpoint_id))


def _frozen(tup: CheckpointTuple) -> Any:
    """What is kept for ``tup``: its pickle (a round trip copies messages several times
    faster than `copy.deepcopy`), or a deep copy if it does not pickle."""
    try:
        return pickle.dumps(tup, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # an unpicklable value: keep a structural copy instead
        return _Unpicklable(copy.deepcopy(tup))


def _thawed(kept: Any) -> CheckpointTuple:
    """A fresh copy of what `_frozen` kept."""
    if isinstance(kept, _Unpicklable):
        return copy.deepcopy(kept.tup)
    return cast(CheckpointTuple, pickle.loads(kept))


class _Unpicklable:
    __slots__ = ("tup",)

    def __init__(self, tup: CheckpointTuple) -> None:
        self.tup = tup


class SealedTuples:
    """At most ``max_entries`` tuples of checkpoints known to have a child, least recently used evicted."""

    def __init__(self, max_entries: int = DEFAULT_MAX_TUPLES) -> None:
        self.max_entries = max(0, int(max_entries))
        self._sealed: OrderedDict[TupleKey, None] = OrderedDict()
        self._tuples: OrderedDict[TupleKey, Any] = OrderedDict()
        self._lock = threading.Lock()

    def seal(self, key: TupleKey) -> None:
        """Record that a child names ``key`` as its parent."""
        with self._lock:
            self._sealed[key] = None
            self._sealed.move_to_end(key)
            while len(self._sealed) > MAX_SEALED:
                self._sealed.popitem(last=False)

    def offer(self, key: TupleKey, tup: CheckpointTuple) -> None:
        """Keep ``tup`` (read for ``key``) if ``key`` has a child."""
        if not self.max_entries:
            return
        kept = _frozen(tup)
        with self._lock:
            if key not in self._sealed:
                return
            self._tuples[key] = kept
            self._tuples.move_to_end(key)
            while len(self._tuples) > self.max_entries:
                self._tuples.popitem(last=False)

    def get(self, key: TupleKey) -> CheckpointTuple | None:
        """A copy of the tuple kept for ``key``, or ``None``."""
        with self._lock:
            found = self._tuples.get(key)
            if found is None:
                return None
            self._tuples.move_to_end(key)
        return _thawed(found)

    def discard(self, key: TupleKey) -> None:
        """Drop what is kept for ``key`` (writes were put at it)."""
        with self._lock:
            self._tuples.pop(key, None)

    def forget(self, thread_ids: Iterable[str] | None) -> None:
        """Drop everything about ``thread_ids`` (``None``: every thread)."""
        with self._lock:
            if thread_ids is None:
                self._sealed.clear()
                self._tuples.clear()
                return
            gone = {str(t) for t in thread_ids}
            for store in (self._sealed, self._tuples):
                for key in [k for k in store if k[0] in gone]:
                    del store[key]

    def __len__(self) -> int:
        return len(self._tuples)


class ParentWalkSaver(ForwardingSaver):
    """Serve ``aget_tuple`` for a checkpoint that has a child from `SealedTuples`; forward
    everything else. ``walk_hits`` counts the answers that read nothing."""

    def __init__(self, inner: Any, *, max_entries: int = DEFAULT_MAX_TUPLES) -> None:
        super().__init__(inner)
        self.sealed = SealedTuples(max_entries)
        self.walk_hits = 0

    def _seen(self, tup: CheckpointTuple | None) -> None:
        parent = concrete_key(tup.parent_config) if tup is not None and tup.parent_config else None
        if parent is not None:
            self.sealed.seal(parent)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        key = concrete_key(config)
        if key is not None:
            kept = self.sealed.get(key)
            if kept is not None:
                self.walk_hits += 1
                return kept
        tup = await self.inner.aget_tuple(config)
        self._seen(tup)
        if key is not None and tup is not None:
            self.sealed.offer(key, tup)
        return tup

    async def aput(self, config: RunnableConfig, checkpoint: Any, metadata: Any, new_versions: Any) -> RunnableConfig:
        saved = await self.inner.aput(config, checkpoint, metadata, new_versions)
        parent = concrete_key(config)
        if parent is not None:
            self.sealed.seal(parent)
        return saved

    def put(self, config: RunnableConfig, checkpoint: Any, metadata: Any, new_versions: Any) -> RunnableConfig:
        saved = self.inner.put(config, checkpoint, metadata, new_versions)
        parent = concrete_key(config)
        if parent is not None:
            self.sealed.seal(parent)
        return saved

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        key = concrete_key(config)
        if key is not None:
            self.sealed.discard(key)
        await self.inner.aput_writes(config, writes, task_id, task_path)

    def put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        key = concrete_key(config)
        if key is not None:
            self.sealed.discard(key)
        self.inner.put_writes(config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str, **fence: Any) -> None:
        await self.inner.adelete_thread(thread_id, **fence)
        self.sealed.forget([thread_id])

    def delete_thread(self, thread_id: str, **fence: Any) -> None:
        self.inner.delete_thread(thread_id, **fence)
        self.sealed.forget([thread_id])

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self.inner.aprune(thread_ids, strategy=strategy)
        self.sealed.forget(thread_ids)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self.inner.prune(thread_ids, strategy=strategy)
        self.sealed.forget(thread_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self.inner.acopy_thread(source_thread_id, target_thread_id)
        self.sealed.forget([target_thread_id])

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self.inner.copy_thread(source_thread_id, target_thread_id)
        self.sealed.forget([target_thread_id])

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self.inner.adelete_for_runs(run_ids)
        self.sealed.forget(None)  # which threads those runs touched is not known here

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self.inner.delete_for_runs(run_ids)
        self.sealed.forget(None)
