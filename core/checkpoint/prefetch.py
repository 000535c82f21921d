"""Delta histories read along with a thread's head, kept until LangGraph asks for them.

LangGraph loads a delta thread's latest checkpoint and, right after, asks for the
delta history of the channels that checkpoint holds no value of. A saver that can
read both in one round trip (or one worker-thread hop) keeps the second answer in a
`PrefetchStore` and hands it out when the question comes. Which channels to fetch
is `saverbase.missing_delta_channels` limited by `saverbase.worth_prefetching`.

An answer is used at most once, and only if no write that could change it started
or ended since it was read: every write runs inside `PrefetchStore.writing`, which
moves a generation counter on entry and on exit. A write names its thread when it
has one (a history is a thread's own rows, so another thread's write cannot change
it); a write that does not (a sweep, a purge of many threads) counts for every
thread. Under many concurrent threads a saver-wide counter would discard nearly
every answer: some other thread is almost always writing.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Collection, Iterator
from typing import Any

__all__ = ["PrefetchKey", "PrefetchStore"]

#: ``(thread_id, checkpoint_ns, checkpoint_id)`` of the checkpoint a history belongs to.
PrefetchKey = tuple[str, str, str]


class PrefetchStore:
    """At most `MAX_ENTRIES` prefetched histories (as undecoded rows), oldest evicted first.

    Shared by a saver and its ``with_allowlist`` copies. Rows are kept undecoded so
    every caller decodes its own objects.
    """

    MAX_ENTRIES = 64
    #: Threads whose last write is remembered; past it they are forgotten together and
    #: counted as one write of every thread (only costs a re-read).
    MAX_THREADS = 4096

    def __init__(self) -> None:
        #: Moves on every write's start and end; a reader notes it before reading.
        self.generation = 0
        self._everything = 0  # `generation` at the last write of no named thread
        self._threads: dict[str, int] = {}  # thread -> `generation` at its last write
        self._entries: OrderedDict[PrefetchKey, tuple[int, frozenset[str], Any]] = OrderedDict()

    @contextlib.contextmanager
    def writing(self, thread_id: str | None = None) -> Iterator[None]:
        """Mark a write of ``thread_id`` (``None``: of any thread) in progress: answers
        about that thread read before its end are never used."""
        self.moved(thread_id)
        try:
            yield
        finally:
            self.moved(thread_id)

    def moved(self, thread_id: str | None = None) -> None:
        """Count a start or an end of a write of ``thread_id`` (``None``: of any thread);
        `writing` does both, a hot path may call this before and after instead."""
        self.generation += 1
        if thread_id is None:
            self._everything = self.generation
            self._threads.clear()
            return
        threads = self._threads
        threads[thread_id] = self.generation
        if len(threads) > self.MAX_THREADS:
            threads.clear()
            self._everything = self.generation

    def store(
        self, key: PrefetchKey, generation: int, channels: Collection[str], rows: Any
    ) -> None:
        """Keep ``rows``, the history of ``channels`` at ``key``, read at ``generation``
        (the value of `generation` before the read started)."""
        self._entries[key] = (generation, frozenset(channels), rows)
        self._entries.move_to_end(key)
        while len(self._entries) > self.MAX_ENTRIES:
            self._entries.popitem(last=False)

    def take(self, key: PrefetchKey, channels: Collection[str]) -> Any | None:
        """The rows kept for ``key`` if they cover ``channels`` and no write of its thread
        started or ended since they were read; ``None`` otherwise. Either way the entry is gone."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        generation, held, rows = entry
        changed = max(self._everything, self._threads.get(key[0], 0))
        if changed > generation or not held.issuperset(channels):
            return None
        return rows

    def __len__(self) -> int:
        return len(self._entries)
