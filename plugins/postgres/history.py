"""Delta history from the id-range statement, checked against the real parent links.

LangGraph's counters say how many supersteps a checkpoint is past its snapshot; on a
linear thread those ancestors are the checkpoints just below it in id order. The
range statement (`sql.RANGE_HISTORY_SQL`, also part of the head query) returns those
candidates with their parents, a bit mask of the requested channels each holds,
their writes and the newest seed per channel. `walk_range` follows the parent links
through them; when the chain leaves the candidates or meets a holder other than the
one whose blob came back (a fork), it gives up and the recursive walk answers. The
id order is only ever a hint.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from runstore.checkpoint import codec

__all__ = ["walk_range"]


def walk_range(
    row: Mapping[str, Any], target_id: str | None, wanted: Sequence[str], prefix: str = ""
) -> list[tuple[Any, ...]] | None:
    """`HistoryRow`s from a `sql.range_walk_sql` answer (the columns of ``row`` named
    ``prefix`` + their name), or ``None`` if the range cannot answer: the chain leaves it,
    or reaches a holder whose blob was not fetched."""
    if target_id is None:
        return []  # no such checkpoint: every channel answers empty, as the walk would
    p = prefix
    links = dict(
        zip(
            row[p + "ids"] or (),
            zip(row[p + "parents"] or (), row[p + "masks"] or (), strict=True),
            strict=True,
        )
    )
    if target_id not in links:
        return None
    writes: dict[str, list[tuple[Any, ...]]] = {}
    for cid, *rest in zip(
        row[p + "w_ids"] or (),
        row[p + "w_channels"] or (),
        row[p + "w_task_ids"] or (),
        row[p + "w_paths"] or (),
        row[p + "w_idxs"] or (),
        row[p + "w_types"] or (),
        row[p + "w_blobs"] or (),
        strict=True,
    ):
        writes.setdefault(cid, []).append(tuple(rest))
    seeds = {
        ch: (cid, btype, blob)
        for ch, cid, btype, blob in zip(
            row[p + "s_channels"] or (),
            row[p + "s_ids"] or (),
            row[p + "s_types"] or (),
            row[p + "s_blobs"] or (),
            strict=True,
        )
    }
    bits = {ch: 1 << i for i, ch in enumerate(wanted)}
    need = set(wanted)
    needed = (1 << len(wanted)) - 1  # the bits of ``need``
    out: list[tuple[Any, ...]] = []
    cursor = links[target_id][0]
    depth = 1
    while cursor is not None and need:
        if cursor not in links or depth > len(links):
            return None
        parent, mask = links[cursor]
        for channel, task_id, path, idx, btype, blob in writes.get(cursor, ()):
            if channel in need:
                out.append((depth, channel, codec.HISTORY_WRITE, task_id, path, idx, btype, blob))
        if mask & needed:  # most ancestors hold none of the channels still needed
            for channel in [ch for ch in need if mask & bits[ch]]:
                seed = seeds.get(channel)
                if seed is None or seed[0] != cursor:
                    return None
                if seed[1] is not None:
                    out.append((depth, channel, codec.HISTORY_SEED, None, None, None, *seed[1:]))
                need.discard(channel)
                needed &= ~bits[channel]
        cursor = parent
        depth += 1
    return out
