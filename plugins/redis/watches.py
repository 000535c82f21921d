"""What a Redis stream bridge knows of the streams its process follows: one `Watch` per
stream (a hole-free cache of its latest entries, shared by the local subscribers) and
one `Cursor` per subscriber, plus the decoding of stream entries.

The bridge's waker fills the watches (`runstore.plugins.redis.streams`); a subscriber
takes cached entries only when they continue its own position without a hole.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import islice
from typing import Any

import orjson

from runstore.streams.protocol import END, Notifier, StreamEvent, StreamItem


def entry_seq(entry_id: bytes | str) -> int:
    """The sequence of an entry id ``0-<seq>``."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.partition("-")[2] or 0)


def entry_item(entry_id: bytes, fields: dict[bytes, bytes]) -> StreamItem:
    """The `StreamEvent` (or END) a stream entry holds."""
    if b"end" in fields:
        return END
    return StreamEvent(entry_id.decode(), fields[b"e"].decode(), orjson.loads(fields[b"d"]))


def entry_fields(flat: Sequence[bytes]) -> dict[bytes, bytes]:
    """An entry's flat field list as a mapping."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


class Watch:
    """What this process knows of one followed stream, shared by its local subscribers."""

    __slots__ = ("cache", "error", "group", "key", "latest", "news", "recheck", "refs")

    def __init__(self, key: bytes, maxsize: int, group: Any = None) -> None:
        self.key = key
        self.group = group  # which waker reads this stream (see RedisStreamBridge._group)
        self.latest = 0  # highest sequence seen in the stream so far
        self.cache: deque[tuple[int, StreamItem]] = deque(maxlen=maxsize + 1)
        self.refs = 0
        self.error: BaseException | None = None
        self.recheck = 0  # bumped when the stream may have been removed or lost
        self.news = Notifier()

    def notify(self) -> None:
        """Wake the stream's local subscribers."""
        self.news.notify()

    def observe(self, last_seq: int, before: int) -> None:
        """Record the newest sequence a snapshot saw; ``before`` is `latest` when it was sent.

        Only a stream that went back behind what was known before the snapshot was
        recreated: entries cached while it was out (a publish in the same pipeline,
        the reader) are newer than the snapshot, not signs of a new stream.
        """
        if last_seq < before:
            # Lost (server restart without persistence) or deleted and published again:
            # what the cache holds belongs to the old stream.
            self.cache.clear()
            self.latest = last_seq
        else:
            self.latest = max(self.latest, last_seq)

    def add(self, entries: Sequence[tuple[bytes, Sequence[bytes]]]) -> bool:
        """Take entries the waker read (flat field lists); True if any was new.

        Entries this process published are usually cached already (`put` from the
        publish reply): those are skipped before being decoded.
        """
        added = False
        for entry_id, flat in entries:
            seq = entry_seq(entry_id)
            if self.cache and seq <= self.cache[-1][0]:
                continue
            self.put(seq, entry_item(entry_id, entry_fields(flat)))
            added = True
        return added

    def put(self, seq: int, item: StreamItem) -> None:
        """Cache one entry; the cache stays a hole-free run of sequences (a hole empties it,
        and a follower that needs what is missing reads a snapshot)."""
        cache = self.cache
        if cache:
            last = cache[-1][0]
            if seq <= last:
                return
            if seq != last + 1:
                cache.clear()
        cache.append((seq, item))
        if seq > self.latest:
            self.latest = seq

    def after(self, pos: int) -> list[tuple[int, StreamItem]] | None:
        """Cached entries right after ``pos``, or ``None`` when the cache cannot prove them."""
        if not self.cache or not self.cache[0][0] <= pos + 1 <= self.cache[-1][0]:
            return None
        return list(islice(self.cache, pos + 1 - self.cache[0][0], None))


class Cursor:
    """One subscriber's position in a followed stream."""

    __slots__ = ("outages", "pos", "requested", "seen")

    def __init__(self) -> None:
        self.pos = 0
        self.requested: str | None = None
        self.seen = False  # the stream existed while we followed it
        self.outages = 0  # connection failures counted when the cursor last saw the stream
