"""Delta histories read along with a thread's head, kept until LangGraph asks for them.

LangGraph loads a delta thread's latest checkpoint and, right after, asks for the
delta history of the channels that checkpoint holds no value of. A saver that can
read both in one round trip (or one worker-thread hop) keeps the second answer in a
`PrefetchStore` and hands it out when the question comes. Which channels to fetch
is `saverbase.missing_delta_channels` limited by `saverbase.worth_prefetching`.

An answer is used at most once, and only if no write of the saver started or ended
since it was read: every write runs inside `PrefetchStore.writing`, which moves a
generation counter on entry and on exit.
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

    def __init__(self) -> None:
        self.generation = 0
        self._entries: OrderedDict[PrefetchKey, tuple[int, frozenset[str], Any]] = OrderedDict()

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Mark a write in progress: answers read before its end are never used."""
        self.generation += 1
        try:
            yield
        finally:
            self.generation += 1

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
        """The rows kept for ``key`` if they cover ``channels`` and no write overlapped
        since they were read; ``None`` otherwise. Either way the entry is gone."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return None
        generation, held, rows = entry
        if generation != self.generation or not held.issuperset(channels):
            return None
        return rows

    def __len__(self) -> int:
        return len(self._entries)
