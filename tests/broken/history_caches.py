"""Broken delta-history caches: each is runstore's memory cache with one rule broken. The
history-cache suite must fail each, naming the rule (tests/test_history_cache_teeth.py).

- ``broken-hc-prefix-purge``: ``purge_thread("t1")`` also drops ``t10`` (ids matched by prefix).
- ``broken-hc-aliasing``: keeps the entry ``set`` was given and returns it itself (no copies).
- ``broken-hc-stale``: ``set`` over an existing entry is ignored once it was read (a read cache
  in front of the store that nothing invalidates).
- ``broken-hc-slots``: direct-mapped, one slot per ``hash(thread, key) % max_entries``, read
  without checking whose entry the slot holds (eviction that lies).
- ``broken-hc-process-local``: the in-process cache declaring ``cross_process``.
"""

from __future__ import annotations

import pickle
import zlib
from typing import Any

from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory.cache import MemoryHistoryCache
from runstore.registry import HistoryCacheRegistry
from runstore.urls import BackendURL


class PrefixPurgeCache(MemoryHistoryCache):
    def purge_thread_sync(self, thread_id: str) -> None:
        # BUG (on purpose): every thread whose id starts with thread_id.
        for other in [t for t in self._by_thread if t.startswith(thread_id)]:
            super().purge_thread_sync(other)


class AliasingCache(MemoryHistoryCache):
    def __init__(self, max_entries: int = 128) -> None:
        super().__init__(max_entries)
        self._objects: dict[tuple[str, str], Any] = {}

    async def set(self, thread_id: str, key: str, entry: Any) -> None:
        await super().set(thread_id, key, entry)
        self._objects[(thread_id, key)] = entry  # BUG (on purpose): the caller's object

    async def get(self, thread_id: str, key: str) -> Any:
        if await super().get(thread_id, key) is None:
            return None
        return self._objects.get((thread_id, key))


class StaleCache(MemoryHistoryCache):
    def __init__(self, max_entries: int = 128) -> None:
        super().__init__(max_entries)
        self._read: set[tuple[str, str]] = set()

    async def get(self, thread_id: str, key: str) -> Any:
        got = await super().get(thread_id, key)
        if got is not None:
            self._read.add((thread_id, key))
        return got

    async def set(self, thread_id: str, key: str, entry: Any) -> None:
        if (thread_id, key) in self._read and (thread_id, key) in self._entries:
            return  # BUG (on purpose): what was read is never replaced
        await super().set(thread_id, key, entry)

    def purge_thread_sync(self, thread_id: str) -> None:
        super().purge_thread_sync(thread_id)
        self._read = {slot for slot in self._read if slot[0] != thread_id}

    def clear_sync(self) -> None:
        super().clear_sync()
        self._read.clear()


class SlotsCache(MemoryHistoryCache):
    def __init__(self, max_entries: int = 128) -> None:
        super().__init__(max_entries)
        self._slots: dict[int, bytes] = {}
        self._written: dict[str, set[int]] = {}

    def _slot(self, thread_id: str, key: str) -> int:
        return zlib.crc32(f"{thread_id}\x00{key}".encode()) % self.max_entries

    async def set(self, thread_id: str, key: str, entry: Any) -> None:
        slot = self._slot(thread_id, key)
        self._slots[slot] = pickle.dumps(entry)
        self._written.setdefault(thread_id, set()).add(slot)

    async def get(self, thread_id: str, key: str) -> Any:
        # BUG (on purpose): whoever's entry the slot holds.
        raw = self._slots.get(self._slot(thread_id, key))
        return None if raw is None else pickle.loads(raw)

    def purge_thread_sync(self, thread_id: str) -> None:
        for slot in self._written.pop(thread_id, set()):
            self._slots.pop(slot, None)

    def clear_sync(self) -> None:
        self._slots.clear()
        self._written.clear()


def _opener(cls: type[MemoryHistoryCache]) -> Any:
    async def _open(url: BackendURL, options: BackendOptions) -> MemoryHistoryCache:
        return cls(options.settings.checkpoint_cache.max_entries)

    return _open


BROKEN: dict[str, tuple[type[MemoryHistoryCache], list[str]]] = {
    "broken-hc-prefix-purge": (PrefixPurgeCache, ["cache_max_entries"]),
    "broken-hc-aliasing": (AliasingCache, ["cache_max_entries"]),
    "broken-hc-stale": (StaleCache, ["cache_max_entries"]),
    "broken-hc-slots": (SlotsCache, []),
    "broken-hc-process-local": (MemoryHistoryCache, ["cache_max_entries", "cross_process"]),
}


@hookimpl
def runstore_register_history_caches(registry: HistoryCacheRegistry) -> None:
    for name, (cls, capabilities) in BROKEN.items():
        registry.add(name, schemes=[name], factory=_opener(cls), capabilities=capabilities)
