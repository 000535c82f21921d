"""Broken savers, one realistic bug each, for the saver suite's teeth tests.

Each class subclasses the correct `MemorySaver` and breaks one rule of
docs/savers.md (the docstring names it). The plugin registers every class under
``mut-saver-<name>://`` with the capabilities the memory saver declares, so the
suite runs every test on it; `tests/test_savers_teeth.py` requires the named
failure for each.
"""

from __future__ import annotations

import copy
import sqlite3
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
)

from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory import saver as memory
from runstore.plugins.memory.layout import Namespace
from runstore.plugins.memory.saver import MemorySaver
from runstore.registry import SaverRegistry
from runstore.urls import BackendURL

CAPABILITIES = [
    "copy_thread", "prune", "delete_for_runs", "delta_history", "sync_api",
    "typed_filters", "global_list_order", "checked_ids",
]
MUTANTS: dict[str, type[MemorySaver]] = {}


def mutant(name: str) -> Any:
    """Register a broken saver class as ``mut-saver-<name>``."""

    def register(cls: type[MemorySaver]) -> type[MemorySaver]:
        MUTANTS[f"mut-saver-{name}"] = cls
        return cls

    return register


# --------------------------------------------------------------------------- list


@mutant("list-ignores-limit")
class ListIgnoresLimit(MemorySaver):
    """list() returns every match whatever ``limit`` says."""

    def list(self, config: Any, *, filter: Any = None, before: Any = None, limit: Any = None) -> Any:
        return super().list(config, filter=filter, before=before, limit=None)


@mutant("list-limit-before-filter")
class ListLimitBeforeFilter(MemorySaver):
    """list() takes the newest ``limit`` checkpoints first, then filters them."""

    def list(self, config: Any, *, filter: Any = None, before: Any = None, limit: Any = None) -> Any:
        items = list(super().list(config, before=before, limit=limit))
        return iter([
            i for i in items
            if not filter or all(i.metadata.get(k) == v for k, v in filter.items())
        ])


@mutant("list-filter-ignored")
class ListFilterIgnored(MemorySaver):
    """list() ignores ``filter`` (every checkpoint matches)."""

    def list(self, config: Any, *, filter: Any = None, before: Any = None, limit: Any = None) -> Any:
        return super().list(config, before=before, limit=limit)


@mutant("list-before-inclusive")
class ListBeforeInclusive(MemorySaver):
    """``before`` includes the checkpoint it names."""

    def _list_candidates(self, config: Any, before: Any) -> list[tuple[str, str, str]]:
        out = super()._list_candidates(config, before)
        before_id = get_checkpoint_id(before) if before else None
        configurable = (config or {}).get("configurable") or {}
        if before_id and "thread_id" in configurable:
            ns = self._ns(configurable["thread_id"], configurable.get("checkpoint_ns", ""))
            if ns is not None and before_id in ns.entries:
                out.insert(0, (configurable["thread_id"], configurable.get("checkpoint_ns", ""), before_id))
        return out


@mutant("list-write-order")
class ListInWriteOrder(MemorySaver):
    """Checkpoint ids are kept in the order they were written, so ``latest`` and
    ``list`` follow write order instead of checkpoint id order."""

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        with self._lock:
            out = super().put(config, checkpoint, metadata, new_versions)
            configurable = config["configurable"]
            ns = self._ns(configurable["thread_id"], configurable.get("checkpoint_ns", ""))
            assert ns is not None
            ns.order.remove(checkpoint["id"])
            ns.order.append(checkpoint["id"])
            return out


@mutant("list-all-namespaces")
class ListAllNamespaces(MemorySaver):
    """list() with a ``checkpoint_ns`` lists every namespace of the thread."""

    def _list_candidates(self, config: Any, before: Any) -> list[tuple[str, str, str]]:
        if config and "checkpoint_ns" in config.get("configurable", {}):
            configurable = dict(config["configurable"])
            configurable.pop("checkpoint_ns")
            config = {**config, "configurable": configurable}
        return super()._list_candidates(config, before)


# --------------------------------------------------------------------------- get / put


@mutant("returned-config-drops-ns")
class ReturnedConfigDropsNamespace(MemorySaver):
    """put() returns a config without ``checkpoint_ns`` (LangGraph then writes a
    subgraph's next checkpoint into the root namespace)."""

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        out = super().put(config, checkpoint, metadata, new_versions)
        out["configurable"]["checkpoint_ns"] = ""
        return out


@mutant("parent-config-drops-ns")
class ParentConfigDropsNamespace(MemorySaver):
    """get_tuple's ``parent_config`` always names the root namespace."""

    def _tuple(self, thread_id: str, checkpoint_ns: str, ns: Namespace, checkpoint_id: str) -> Any:
        found = super()._tuple(thread_id, checkpoint_ns, ns, checkpoint_id)
        if found.parent_config is not None:
            found.parent_config["configurable"]["checkpoint_ns"] = ""
        return found


@mutant("versions-by-reference")
class VersionsByReference(MemorySaver):
    """channel_versions and versions_seen are kept by reference: LangGraph mutates
    them in place after put, and the stored checkpoint changes with them."""

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        with self._lock:
            out = super().put(config, checkpoint, metadata, new_versions)
            configurable = config["configurable"]
            ns = self._ns(configurable["thread_id"], configurable.get("checkpoint_ns", ""))
            assert ns is not None
            entry = ns.entries[checkpoint["id"]]
            entry.skeleton["channel_versions"] = checkpoint["channel_versions"]
            entry.skeleton["versions_seen"] = checkpoint["versions_seen"]
            entry.versions = checkpoint["channel_versions"]
            return out

    def _tuple(self, thread_id: str, checkpoint_ns: str, ns: Namespace, checkpoint_id: str) -> Any:
        found = super()._tuple(thread_id, checkpoint_ns, ns, checkpoint_id)
        entry = ns.entries[checkpoint_id]
        found.checkpoint["channel_versions"] = entry.skeleton["channel_versions"]
        found.checkpoint["versions_seen"] = entry.skeleton["versions_seen"]
        return found


class _PassThroughValues:
    """A serde stand-in: anything but metadata dicts is deep-copied, not serialized."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def dumps_typed(self, obj: Any) -> tuple[str, Any]:
        if isinstance(obj, dict) and "step" in obj:  # the metadata: still serialized
            return self.inner.dumps_typed(obj)
        return ("copy", copy.deepcopy(obj))

    def loads_typed(self, data: tuple[str, Any]) -> Any:
        if data[0] == "copy":
            return copy.deepcopy(data[1])
        return self.inner.loads_typed(data)


class _BypassSerde(MemorySaver):
    """Runs the methods a subclass names with `_PassThroughValues` instead of ``saver.serde``."""

    def _bypassing(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        real = self.serde
        self.serde = _PassThroughValues(real)  # type: ignore[assignment]
        try:
            return method(*args, **kwargs)
        finally:
            self.serde = real

    def _tuple(self, thread_id: str, checkpoint_ns: str, ns: Namespace, checkpoint_id: str) -> Any:
        return self._bypassing(super()._tuple, thread_id, checkpoint_ns, ns, checkpoint_id)

    def get_delta_channel_history(self, *, config: Any, channels: Any) -> Any:
        return self._bypassing(super().get_delta_channel_history, config=config, channels=channels)


@mutant("values-skip-serde")
class ValuesSkipSerde(_BypassSerde):
    """Channel values are deep-copied instead of going through ``saver.serde``
    (an encrypting serde then stores them in the clear)."""

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        return self._bypassing(super().put, config, checkpoint, metadata, new_versions)


@mutant("writes-skip-serde")
class WritesSkipSerde(_BypassSerde):
    """Pending-write values are deep-copied instead of going through ``saver.serde``."""

    def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        self._bypassing(super().put_writes, config, writes, task_id, task_path)


@mutant("serde-bound-at-open")
class SerdeBoundAtOpen(MemorySaver):
    """The serializer is captured when the saver is created; replacing
    ``saver.serde`` later (an encrypting serde set by the app) has no effect."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._frozen = self.serde

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        return self._with_frozen(super().put, config, checkpoint, metadata, new_versions)

    def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        self._with_frozen(super().put_writes, config, writes, task_id, task_path)

    def _tuple(self, thread_id: str, checkpoint_ns: str, ns: Namespace, checkpoint_id: str) -> Any:
        return self._with_frozen(super()._tuple, thread_id, checkpoint_ns, ns, checkpoint_id)

    def _with_frozen(self, method: Any, *args: Any) -> Any:
        current = self.serde
        self.serde = self._frozen
        try:
            return method(*args)
        finally:
            self.serde = current


@mutant("next-version-not-increasing")
class NextVersionNotIncreasing(MemorySaver):
    """get_next_version returns a scrambled version, not one greater than the current
    (LangGraph compares versions to decide what a node has seen). The scramble is a
    fixed permutation, so the bug shows on the same call every run (a random one was
    caught only when two draws came out of order)."""

    def get_next_version(self, current: Any, channel: None) -> str:
        previous = 0 if current is None else int(str(current).split(".")[0]) % 1000
        return f"{((previous + 1) * 389) % 1000:032d}.{previous}"


# --------------------------------------------------------------------------- writes


@mutant("writes-last-wins")
class WritesLastWins(MemorySaver):
    """put_writes replaces an existing ``(task_id, idx)`` write (a retried task
    overwrites what the first attempt recorded)."""

    def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        with self._lock:
            configurable = config["configurable"]
            ns = self._threads.setdefault(configurable["thread_id"], {}).setdefault(
                configurable.get("checkpoint_ns", ""), Namespace()
            )
            stored = ns.writes.get(configurable["checkpoint_id"])
            if stored is not None:
                for idx, (channel, _) in enumerate(writes):
                    stored.by_key.pop((task_id, memory.write_slot(channel, idx)), None)
            super().put_writes(config, writes, task_id, task_path)


# --------------------------------------------------------------------------- deletes


@mutant("delete-thread-leaves-writes")
class DeleteThreadLeavesWrites(MemorySaver):
    """delete_thread deletes checkpoints and blobs but leaves pending writes behind."""

    def delete_thread(self, thread_id: str, *, fence: int | None = None) -> None:
        with self._lock:
            for ns in self._threads.get(thread_id, {}).values():
                writes = dict(ns.writes)
                ns.remove(set(ns.entries))
                ns.writes = writes


@mutant("delete-thread-leaves-blobs")
class DeleteThreadLeavesBlobs(MemorySaver):
    """delete_thread deletes checkpoints and writes but leaves channel blobs behind."""

    def delete_thread(self, thread_id: str, *, fence: int | None = None) -> None:
        with self._lock:
            for ns in self._threads.get(thread_id, {}).values():
                ns.entries.clear()
                ns.order.clear()
                ns.writes.clear()


@mutant("delete-thread-root-ns-only")
class DeleteThreadRootNamespaceOnly(MemorySaver):
    """delete_thread deletes the root namespace only; subgraph checkpoints remain."""

    def delete_thread(self, thread_id: str, *, fence: int | None = None) -> None:
        with self._lock:
            self._threads.get(thread_id, {}).pop("", None)


@mutant("copy-shares-writes")
class CopySharesWrites(MemorySaver):
    """copy_thread shares the pending-writes containers between source and copy, so
    a write put on the copy also shows up on the source."""

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        with self._lock:
            super().copy_thread(source_thread_id, target_thread_id)
            for ns_name, ns in self._threads.get(source_thread_id, {}).items():
                self._threads[target_thread_id][ns_name].writes = ns.writes


@mutant("copy-root-ns-only")
class CopyRootNamespaceOnly(MemorySaver):
    """copy_thread copies the root namespace only."""

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        with self._lock:
            source = self._threads.get(source_thread_id, {})
            if "" in source:
                self._threads.setdefault(target_thread_id, {})[""] = source[""].copy()


@mutant("copy-without-writes")
class CopyWithoutWrites(MemorySaver):
    """copy_thread copies checkpoints and blobs but no pending writes."""

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        with self._lock:
            super().copy_thread(source_thread_id, target_thread_id)
            for ns in self._threads.get(target_thread_id, {}).values():
                ns.writes.clear()


@mutant("copy-keeps-source-thread-id")
class CopyKeepsSourceThreadId(MemorySaver):
    """copy_thread copies the metadata verbatim: the copies' ``thread_id`` still names the
    source, so the Agent Server's history of the copy (filtered by it) is empty."""

    def _rename_thread(self, ns: Namespace, source: str, target: str) -> None:
        return None


@mutant("prune-root-ns-only")
class PruneRootNamespaceOnly(MemorySaver):
    """prune touches the root namespace only; subgraph checkpoints are never pruned."""

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        with self._lock:
            saved = {t: {k: v for k, v in self._threads.get(t, {}).items() if k} for t in thread_ids}
            super().prune(thread_ids, strategy=strategy)
            for thread_id, rest in saved.items():
                if rest:
                    self._threads.setdefault(thread_id, {}).update(rest)


@mutant("prune-first-thread-only")
class PruneFirstThreadOnly(MemorySaver):
    """prune handles only the first of the thread ids it is given."""

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        super().prune(list(thread_ids)[:1], strategy=strategy)


@mutant("prune-unknown-strategy")
class PruneUnknownStrategyIsNoop(MemorySaver):
    """prune with an unknown strategy silently does nothing instead of raising."""

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        if strategy in ("keep_latest", "delete"):
            super().prune(thread_ids, strategy=strategy)


@mutant("prune-refuses-delete-all")
class PruneRefusesDeleteAll(MemorySaver):
    """prune knows only ``keep_latest`` and ``delete``: ``delete_all``, which LangGraph's
    Agent Server sends, is refused."""

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        if strategy == "delete_all":
            raise ValueError("unknown prune strategy 'delete_all'; accepted: keep_latest, delete")
        super().prune(thread_ids, strategy=strategy)


@mutant("setup-error-untranslated")
class SetupErrorUntranslated(MemorySaver):
    """Opened without migrations (``from_conn_string`` without ``setup()``), it lets the
    driver's missing-table error through instead of a runstore error naming ``setup()``."""

    needs_setup = False

    async def setup(self) -> None:
        self.needs_setup = False

    def _missing_table(self) -> None:
        if self.needs_setup:
            raise sqlite3.OperationalError("no such table: checkpoints")

    async def aget_tuple(self, config: Any) -> Any:
        self._missing_table()
        return await super().aget_tuple(config)

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        self._missing_table()
        return await super().aput(config, checkpoint, metadata, new_versions)


@mutant("prune-leaves-writes")
class PruneLeavesWrites(MemorySaver):
    """prune(keep_latest) deletes checkpoints but keeps the pending writes of the
    deleted ones."""

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        with self._lock:
            saved = {
                (t, name): dict(ns.writes)
                for t in thread_ids for name, ns in self._threads.get(t, {}).items()
            }
            super().prune(thread_ids, strategy=strategy)
            for (t, name), writes in saved.items():
                ns = self._threads.get(t, {}).get(name)
                if ns is not None:
                    for cid, w in writes.items():
                        ns.writes.setdefault(cid, w)


@mutant("delete-runs-first-thread-only")
class DeleteForRunsFirstThreadOnly(MemorySaver):
    """delete_for_runs stops after the first thread that held one of the runs."""

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        with self._lock:
            wanted = set(run_ids)
            for thread_id in list(self._threads):
                if any(e.run_id in wanted for ns in self._threads[thread_id].values()
                       for e in ns.entries.values()):
                    keep = {t: v for t, v in self._threads.items() if t != thread_id}
                    self._threads = {thread_id: self._threads[thread_id]}
                    super().delete_for_runs(run_ids)
                    self._threads.update(keep)
                    return


@mutant("delete-runs-leaves-writes")
class DeleteForRunsLeavesWrites(MemorySaver):
    """delete_for_runs deletes the runs' checkpoints but keeps their pending writes."""

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        with self._lock:
            saved = {
                (t, name): dict(ns.writes)
                for t, nss in self._threads.items() for name, ns in nss.items()
            }
            super().delete_for_runs(run_ids)
            for (t, name), writes in saved.items():
                ns = self._threads.setdefault(t, {}).setdefault(name, Namespace())
                for cid, w in writes.items():
                    ns.writes.setdefault(cid, w)


@mutant("delete-runs-not-delta-safe")
class DeleteForRunsNotDeltaSafe(MemorySaver):
    """delete_for_runs deletes every checkpoint of the runs, including ancestors a
    surviving checkpoint rebuilds its delta channels from."""

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        with self._lock:
            wanted = set(run_ids)
            for namespaces in self._threads.values():
                for ns in namespaces.values():
                    ns.remove({cid for cid, e in ns.entries.items() if e.run_id in wanted})


# --------------------------------------------------------------------------- sync API


class _AsyncFromCorrectSync(MemorySaver):
    """The async API keeps using MemorySaver's correct sync code; only the sync twin
    named by a subclass is broken."""

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return MemorySaver.get_tuple(self, config)

    async def alist(
        self, config: Any, *, filter: Any = None, before: Any = None, limit: Any = None
    ) -> AsyncIterator[CheckpointTuple]:
        for item in MemorySaver.list(self, config, filter=filter, before=before, limit=limit):
            yield item

    async def aput(
        self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return MemorySaver.put(self, config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        MemorySaver.put_writes(self, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str, *, fence: int | None = None) -> None:
        MemorySaver.delete_thread(self, thread_id, fence=fence)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        MemorySaver.copy_thread(self, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        MemorySaver.prune(self, thread_ids, strategy=strategy)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        MemorySaver.delete_for_runs(self, run_ids)

    async def aget_delta_channel_history(self, *, config: Any, channels: Any) -> Any:
        return MemorySaver.get_delta_channel_history(self, config=config, channels=channels)


@mutant("sync-list-ignores-filter")
class SyncListIgnoresFilterAndLimit(_AsyncFromCorrectSync):
    """The sync ``list`` twin ignores ``filter``, ``before`` and ``limit``."""

    def list(self, config: Any, *, filter: Any = None, before: Any = None, limit: Any = None) -> Iterator[CheckpointTuple]:
        return MemorySaver.list(self, config)


@mutant("sync-get-ignores-id")
class SyncGetIgnoresId(_AsyncFromCorrectSync):
    """The sync ``get_tuple`` twin returns the latest checkpoint whatever id is asked."""

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        configurable = dict(config["configurable"])
        configurable.pop("checkpoint_id", None)
        return MemorySaver.get_tuple(self, {**config, "configurable": configurable})


@mutant("sync-put-writes-drops-path")
class SyncPutWritesDropsPath(_AsyncFromCorrectSync):
    """The sync ``put_writes`` twin drops ``task_path`` (writes then sort differently)."""

    def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        MemorySaver.put_writes(self, config, writes, task_id, "")


@mutant("sync-copy-without-writes")
class SyncCopyWithoutWrites(_AsyncFromCorrectSync):
    """The sync ``copy_thread`` twin copies no pending writes."""

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        MemorySaver.copy_thread(self, source_thread_id, target_thread_id)
        for ns in self._threads.get(target_thread_id, {}).values():
            ns.writes.clear()


@mutant("sync-delete-runs-noop")
class SyncDeleteForRunsNoop(_AsyncFromCorrectSync):
    """The sync ``delete_for_runs`` twin does nothing."""

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        return None


@mutant("sync-prune-keeps-all")
class SyncPruneKeepsAll(_AsyncFromCorrectSync):
    """The sync ``prune`` twin ignores ``keep_latest`` (keeps every checkpoint)."""

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        if strategy == "delete":
            MemorySaver.prune(self, thread_ids, strategy=strategy)


def _factory(cls: type[MemorySaver]) -> Any:
    async def open_mutant(url: BackendURL, options: BackendOptions) -> MemorySaver:
        saver = cls()
        if isinstance(saver, SetupErrorUntranslated):
            saver.needs_setup = not options.migrate
        return saver

    return open_mutant


@hookimpl
def runstore_register_savers(registry: SaverRegistry) -> None:
    for name, cls in MUTANTS.items():
        registry.add(name, schemes=[name], factory=_factory(cls), capabilities=CAPABILITIES)
