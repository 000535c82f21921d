"""In-process LRU cache of delta history (``checkpoint_cache.type: memory``).

Entries are copied on write and on read: LangGraph hands a replayed seed list and
message objects straight to the caller's state, and a caller mutating them must
never change what the next reader gets. The copy is a pickle round trip: an entry
is pickled when stored and unpickled on every read. Measured here, unpickling
messages is faster than a structural copy (about 4 us per message, vs about 26 us
for the checkpoint serializer's decode), and the stored bytes are invisible to the
garbage collector, so a full cache does not slow down gen-2 collections. Only this
process's own objects are ever unpickled. A value that cannot be pickled is kept
as a structural copy instead.
"""

from __future__ import annotations

import copy
import pickle
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

if TYPE_CHECKING:
    from langgraph.checkpoint.base import DeltaChannelHistory

    from runstore.options import BackendOptions
    from runstore.urls import BackendURL


class MemoryHistoryCache:
    """LRU of at most ``max_entries`` history entries, keyed by (thread, entry key)."""

    def __init__(self, max_entries: int = 128) -> None:
        self.max_entries = max(1, int(max_entries))
        self._entries: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._by_thread: dict[str, set[str]] = {}
        self._lock = threading.Lock()

    @classmethod
    async def open(cls, url: BackendURL, options: BackendOptions) -> MemoryHistoryCache:
        """Open from ``memory://`` and ``checkpoint_cache.max_entries``."""
        url.check_options(set())
        return cls(options.settings.checkpoint_cache.max_entries)

    def __len__(self) -> int:
        return len(self._entries)

    async def get(self, thread_id: str, key: str) -> DeltaChannelHistory | None:
        with self._lock:
            entry = self._entries.get((thread_id, key))
            if entry is None:
                return None
            self._entries.move_to_end((thread_id, key))
        return _thaw(entry)

    async def set(self, thread_id: str, key: str, entry: DeltaChannelHistory) -> None:
        stored = _freeze(entry)
        with self._lock:
            self._entries[(thread_id, key)] = stored
            self._entries.move_to_end((thread_id, key))
            self._by_thread.setdefault(thread_id, set()).add(key)
            while len(self._entries) > self.max_entries:
                (old_thread, old_key), _ = self._entries.popitem(last=False)
                keys = self._by_thread.get(old_thread)
                if keys is not None:
                    keys.discard(old_key)
                    if not keys:
                        del self._by_thread[old_thread]

    def purge_thread_sync(self, thread_id: str) -> None:
        """Drop every entry of ``thread_id`` (usable from sync saver calls)."""
        with self._lock:
            for key in self._by_thread.pop(thread_id, ()):
                self._entries.pop((thread_id, key), None)

    async def purge_thread(self, thread_id: str) -> None:
        self.purge_thread_sync(thread_id)

    def clear_sync(self) -> None:
        """Drop everything."""
        with self._lock:
            self._entries.clear()
            self._by_thread.clear()

    async def clear(self) -> None:
        self.clear_sync()

    async def close(self) -> None:
        self.clear_sync()

    def stats(self) -> dict[str, Any]:
        """Size and bound of the LRU."""
        return {"entries": len(self._entries), "max_entries": self.max_entries}


_ATOMIC = frozenset({str, bytes, int, float, bool, type(None)})


def _copy(value: Any) -> Any:
    """A copy sharing nothing mutable with ``value`` (what a cache reader may change).

    Dispatches on the exact type first: history entries are mostly lists of tuples
    of messages whose fields are strings, ``None`` and small dicts and lists.
    """
    kind = type(value)
    if kind in _ATOMIC:
        return value
    if kind is list:
        return [_copy(v) for v in value]
    if kind is dict:
        return {k: _copy(v) for k, v in value.items()}
    if kind is tuple:
        return tuple([_copy(v) for v in value])
    if isinstance(value, BaseModel):
        clone = value.model_copy()  # shallow: a new __dict__ whose values we replace
        fields = clone.__dict__
        for name, field_value in fields.items():
            if type(field_value) not in _ATOMIC:
                fields[name] = _copy(field_value)
        return clone
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # NamedTuple (_DeltaSnapshot)
        return kind(*[_copy(v) for v in value])
    return copy.deepcopy(value)


class _Unpicklable:
    """A stored entry that could not be pickled: kept as a structural copy."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _freeze(entry: Any) -> Any:
    try:
        return pickle.dumps(entry, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        return _Unpicklable(_copy(entry))


def _thaw(stored: Any) -> Any:
    if isinstance(stored, _Unpicklable):
        return _copy(stored.value)
    return pickle.loads(stored)  # our own bytes, written by _freeze in this process
