"""How the in-process saver keeps its data: per ``(thread_id, checkpoint_ns)`` a
`Namespace` (checkpoint skeletons by id plus a sorted id list, channel value blobs
keyed by ``(channel, version)``, pending writes per checkpoint keyed by ``(task_id,
slot)``), and a `ThreadRecord` per thread for the thread index and retention.

The saver (`runstore.plugins.memory.saver`) and its thread records
(`runstore.plugins.memory.threads`) change these only under the saver's one lock
(`locked`), which keeps their invariants: the sorted id list matches the entries, and a
blob stays while a checkpoint refers to it.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from runstore.checkpoint.policy import CheckpointGraph
from runstore.checkpoint.threads import Removed
from runstore.fencing import admit_fence

Typed = tuple[str, bytes]
#: (task_id, channel, serialized value, task_path)
StoredWrite = tuple[str, str, Typed, str]

F = TypeVar("F", bound=Callable[..., Any])


def locked(method: F) -> F:
    """Run ``method`` holding its object's ``_lock`` (the saver's one lock)."""

    # Sync twins may run on worker threads next to the loop; one lock keeps every
    # compound update (ids + entries + blobs) and every read consistent.
    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


@dataclass
class Entry:
    """One stored checkpoint without its channel values."""

    skeleton: dict[str, Any]
    versions: dict[str, Any]
    # The metadata's stored JSON text (`codec.metadata_text`), the SQL savers' column:
    # reads decode it, so every saver returns the same JSON form.
    metadata: str
    parent: str | None
    run_id: Any
    # That text decoded, for filters and the delta counters (`rules.delta_channels`);
    # never handed to callers.
    stored_metadata: dict[str, Any] = field(default_factory=dict)
    # The saver's clock at the first put of this id (microseconds since the epoch).
    created_at: int = 0
    # What the entry holds, as `ThreadInfo.bytes` counts it (record and metadata).
    size: int = 0


@dataclass
class ThreadRecord:
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
class PendingWrites:
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
class Namespace:
    entries: dict[str, Entry] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    # (channel, version) -> serialized value, or None for "version exists, no value stored"
    blobs: dict[tuple[str, Any], Typed | None] = field(default_factory=dict)
    writes: dict[str, PendingWrites] = field(default_factory=dict)

    def add_id(self, checkpoint_id: str) -> None:
        if checkpoint_id in self.entries:
            return
        if not self.order or checkpoint_id > self.order[-1]:
            self.order.append(checkpoint_id)
        else:
            bisect.insort(self.order, checkpoint_id)

    def latest(self) -> str | None:
        return self.order[-1] if self.order else None

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

    def copy(self) -> Namespace:
        clone = Namespace(
            entries={
                cid: Entry(
                    skeleton=copy_skeleton(e.skeleton),
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
            clone.writes[cid] = PendingWrites(by_key=dict(writes.by_key))
        return clone


def copy_skeleton(skeleton: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(skeleton)
    out["channel_versions"] = dict(skeleton.get("channel_versions", {}))
    out["versions_seen"] = {k: dict(v) for k, v in skeleton.get("versions_seen", {}).items()}
    if isinstance(out.get("pending_sends"), list):
        out["pending_sends"] = list(out["pending_sends"])
    if isinstance(out.get("updated_channels"), list):
        out["updated_channels"] = list(out["updated_channels"])
    return out


def check_record_fence(thread_id: str, record: ThreadRecord | None, fence: int) -> None:
    """`StaleFenceError` if the thread has seen a token newer than ``fence``."""
    admit_fence(fence, record.fence if record is not None else 0, thread_id=thread_id)


def footprint(namespaces: Iterable[Namespace]) -> Removed:
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
