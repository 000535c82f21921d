"""Broken savers, each breaking one rule of the thread index, retention or fencing the
way a careful author might. The suite must fail each by the rule's name:

- ``broken-refusal-touches``: a write refused for a stale token has already moved the
  thread's ``touched_at`` (the record is touched before the fence is checked);
- ``broken-tombstone-listed``: a metadata-filtered ``list_threads`` still shows a
  deleted thread (the filtered query forgot the tombstone);
- ``broken-fence-root-only``: the fence is checked only for root-namespace writes
  (``checkpoint_ns == ""``), so a stale worker's subgraph checkpoints land;
- ``broken-closure-one-level``: retention keeps what each kept checkpoint reads, but not
  what those ancestors read in turn;
- ``broken-sweep-once``: a sweep forgets when the thread is due again, so an idle
  thread is never swept again as ``max_age`` passes;
- ``broken-prefix-delete``: ``delete_thread("t1")`` also deletes ``t10`` (a prefix match);
- ``broken-copy-keeps-tombstone``: ``copy_thread`` into a deleted thread copies the rows
  but leaves the tombstone standing, so the copy is neither indexed nor writable;
- ``broken-rescan-ignored``: a sweep takes ``rescan=True`` and ignores it, so a changed
  policy reaches a thread already swept only at its next write;
- ``broken-lenient-metadata``: metadata no saver can store alike (a lone surrogate, a
  nested NUL) is cleaned up and stored instead of refused;
- ``broken-python-metadata``: metadata is kept through the serde, as put, so it reads
  back as Python objects (NaN, a datetime, a UUID) where the SQL savers return its JSON
  form.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_metadata,
)

from runstore.checkpoint.policy import RetentionPolicy, ThreadSwept
from runstore.checkpoint.rules import FENCE_KEY
from runstore.checkpoint.threads import Removed, ThreadPage
from runstore.errors import InvalidSaverInputError
from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory.layout import Namespace, Typed, footprint
from runstore.plugins.memory.saver import MemorySaver
from runstore.registry import SaverRegistry
from runstore.urls import BackendURL

CAPABILITIES = [
    "copy_thread", "prune", "delete_for_runs", "delta_history", "sync_api", "thread_index",
    "retention", "fencing", "typed_filters", "global_list_order", "checked_ids",
]


class RefusalTouchesSaver(MemorySaver):
    def _touch(self, thread_id: str, now: int, *, starts: bool, fence: int | None) -> Any:
        record = self._records.get(thread_id)
        if record is not None:
            # BUG (on purpose): the record is touched before the fence is checked.
            record.touched_at = max(record.touched_at, now)
        return super()._touch(thread_id, now, starts=starts, fence=fence)


class TombstoneListedSaver(MemorySaver):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._ghosts: dict[str, Any] = {}

    def delete_thread(self, thread_id: str, *, fence: int | None = None) -> None:
        info = self._info(thread_id)
        super().delete_thread(thread_id, fence=fence)
        if info is not None:
            self._ghosts[thread_id] = info

    def list_threads(self, **kwargs: Any) -> ThreadPage:
        page = super().list_threads(**kwargs)
        flt = kwargs.get("filter")
        if not flt or kwargs.get("cursor"):
            return page
        # BUG (on purpose): the metadata-filtered query does not skip tombstones.
        ghosts = [g for g in self._ghosts.values() if all(g.metadata.get(k) == v for k, v in flt.items())]
        return ThreadPage([*page.threads, *ghosts], page.next_cursor)


class FenceRootOnlySaver(MemorySaver):
    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        return super().put(_root_fenced(config), checkpoint, metadata, new_versions)

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                   task_path: str = "") -> None:
        super().put_writes(_root_fenced(config), writes, task_id, task_path)


def _root_fenced(config: RunnableConfig) -> RunnableConfig:
    configurable = dict(config.get("configurable") or {})
    if configurable.get("checkpoint_ns", ""):
        # BUG (on purpose): the fence is a column of root checkpoints only.
        configurable.pop(FENCE_KEY, None)
    return {**config, "configurable": configurable}


class ClosureOneLevelSaver(MemorySaver):
    def _sweep_thread(self, thread_id: str, policy: RetentionPolicy, now: int, dry_run: bool) -> ThreadSwept | None:
        with self._lock:
            record = self._records.get(thread_id)
            if record is None or self._info(thread_id) is None:
                return None
            removed = Removed()
            for ns in self._threads[thread_id].values():
                graph = ns.graph()
                ids = sorted(graph.parent)
                newest = set(ids if policy.keep_last is None else ids[-policy.keep_last:]) | {ids[-1]}
                keep = set(newest)
                for cid in newest:
                    # BUG (on purpose): the kept checkpoints' own ancestors, not theirs in turn.
                    keep.update(graph.needed(cid))
                target = ns.copy() if dry_run else ns
                before = footprint([target])
                target.remove(set(ids) - keep)
                removed += before - footprint([target])
            if not dry_run:
                record.swept_at, record.claimed_until = now, None
            return ThreadSwept(thread_id, False, removed)


class SweepOnceSaver(MemorySaver):
    def _sweep_thread(self, thread_id: str, policy: RetentionPolicy, now: int, dry_run: bool) -> ThreadSwept | None:
        swept = super()._sweep_thread(thread_id, policy, now, dry_run)
        record = self._records.get(thread_id)
        if record is not None and not dry_run:
            # BUG (on purpose): "swept since its last write" is all the sweep remembers.
            record.sweep_after = None
        return swept


class PrefixDeleteSaver(MemorySaver):
    def delete_thread(self, thread_id: str, *, fence: int | None = None) -> None:
        super().delete_thread(thread_id, fence=fence)
        # BUG (on purpose): WHERE thread_id LIKE :thread_id || '%'.
        for other in [t for t in self._threads if t.startswith(thread_id) and t != thread_id]:
            super().delete_thread(other)


def _cleaned(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, dict):
        return {_cleaned(k): _cleaned(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_cleaned(v) for v in value]
    return value


class LenientMetadataSaver(MemorySaver):
    def put(
        self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        try:
            return super().put(config, checkpoint, metadata, new_versions)
        except InvalidSaverInputError as exc:
            if "metadata" not in str(exc):
                raise
            # BUG (on purpose): what no saver can store is cleaned up and stored, not refused.
            return super().put(config, checkpoint, _cleaned(metadata), new_versions)


class PythonMetadataSaver(MemorySaver):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._as_put: dict[tuple[str, str, str], Typed] = {}

    def put(
        self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        # BUG (on purpose): metadata goes through the serde as put, not the SQL savers' JSON
        # (where msgpack cannot, an int beyond 64 bits, the JSON form is kept).
        try:
            typed: Typed | None = self.serde.dumps_typed(get_checkpoint_metadata(config, metadata))
        except TypeError:
            typed = None
        stored = super().put(config, checkpoint, metadata, new_versions)
        c = stored["configurable"]
        if typed is not None:
            self._as_put[(c["thread_id"], c["checkpoint_ns"], c["checkpoint_id"])] = typed
        return stored

    def _tuple(self, thread_id: str, checkpoint_ns: str, ns: Namespace, checkpoint_id: str) -> CheckpointTuple:
        found = super()._tuple(thread_id, checkpoint_ns, ns, checkpoint_id)
        typed = self._as_put.get((thread_id, checkpoint_ns, checkpoint_id))
        return found if typed is None else found._replace(metadata=self.serde.loads_typed(typed))


class CopyKeepsTombstoneSaver(MemorySaver):
    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        before = self._records.get(target_thread_id)
        deleted_at = None if before is None else before.deleted_at
        super().copy_thread(source_thread_id, target_thread_id)
        if deleted_at is not None and target_thread_id in self._records:
            self._records[target_thread_id].deleted_at = deleted_at  # BUG (on purpose): tombstone kept


class RescanIgnoredSaver(MemorySaver):
    async def asweep(self, policy: RetentionPolicy, **kwargs: Any) -> Any:
        kwargs["rescan"] = False  # BUG (on purpose): the changed policy waits for a write
        return await super().asweep(policy, **kwargs)


SAVERS: dict[str, type[MemorySaver]] = {
    "broken-refusal-touches": RefusalTouchesSaver,
    "broken-tombstone-listed": TombstoneListedSaver,
    "broken-fence-root-only": FenceRootOnlySaver,
    "broken-closure-one-level": ClosureOneLevelSaver,
    "broken-sweep-once": SweepOnceSaver,
    "broken-prefix-delete": PrefixDeleteSaver,
    "broken-lenient-metadata": LenientMetadataSaver,
    "broken-python-metadata": PythonMetadataSaver,
    "broken-rescan-ignored": RescanIgnoredSaver,
    "broken-copy-keeps-tombstone": CopyKeepsTombstoneSaver,
}


def _factory(cls: type[MemorySaver]) -> Any:
    async def open_saver(url: BackendURL, options: BackendOptions) -> MemorySaver:
        return cls()

    return open_saver


@hookimpl
def runstore_register_savers(registry: SaverRegistry) -> None:
    for name, cls in SAVERS.items():
        registry.add(name, schemes=[name], factory=_factory(cls), capabilities=CAPABILITIES)

