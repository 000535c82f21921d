"""A linear-time message reducer for `DeltaChannel` equal to folding `add_messages`.

`DeltaChannel` hands its reducer the accumulated state plus a *batch* of writes and
requires ``r(r(s, xs), ys) == r(s, xs + ys)``. `add_messages` itself is not
batching-invariant (a ``RemoveMessage`` followed by the same id inside one call
un-removes in place; across two calls it re-appends), so we replay the writes one by
one with `add_messages`' exact semantics. Folding `add_messages` directly costs
O(len(state)) per write (it copies the list and rebuilds its id index every call);
here the index and a tombstoned slot list live across the whole batch, so a batch
costs O(len(state) + total size of the writes).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import (
    BaseMessage,
    BaseMessageChunk,
    RemoveMessage,
    convert_to_messages,
    message_chunk_to_message,
)

#: The id of a ``RemoveMessage`` that clears every message before it (LangGraph's value).
REMOVE_ALL_MESSAGES = "__remove_all__"

_TOMBSTONE: Any = None


def _coerce(values: list[Any]) -> list[Any]:
    # Same rule as add_messages: plain (non-chunk) messages pass through as the very
    # same objects; anything else goes through convert_to_messages and chunk folding.
    if all(
        issubclass(t, BaseMessage) and not issubclass(t, BaseMessageChunk)
        for t in set(map(type, values))
    ):
        return values
    return [message_chunk_to_message(m) for m in convert_to_messages(values)]


def _null_argument_error(left: Any) -> ValueError:
    # add_messages' wrapper rejects a None side with this exact wording.
    return ValueError(
        "Must specify non-null arguments for both 'left' and 'right'. Only "
        f"received: '{'left' if left else 'right'}'."
    )


class _MessageSlots:
    """The running state of one reduction: slots with tombstones and an id index."""

    __slots__ = ("earlier", "last", "slots")

    def __init__(self, messages: list[Any]) -> None:
        self.slots: list[Any] = []
        self.last: dict[Any, int] = {}
        # Earlier live positions of ids that occur more than once (rare: only a seed or
        # the tail after a remove-all can hold duplicates). add_messages replaces the
        # LAST occurrence but removes EVERY occurrence of an id.
        self.earlier: dict[Any, list[int]] = {}
        self.reset(messages)

    def reset(self, messages: list[Any]) -> None:
        self.slots = list(messages)
        self.last = {}
        self.earlier = {}
        for i, m in enumerate(self.slots):
            prev = self.last.get(m.id)
            if prev is not None:
                self.earlier.setdefault(m.id, []).append(prev)
            self.last[m.id] = i

    def apply(self, right: list[Any]) -> None:
        """Apply one write exactly as ``add_messages(current, right)`` would."""
        remove_all_idx = None
        for idx, m in enumerate(right):
            if m.id is None:
                m.id = str(uuid.uuid4())
            if isinstance(m, RemoveMessage) and m.id == REMOVE_ALL_MESSAGES:
                remove_all_idx = idx
        if remove_all_idx is not None:
            self.reset(right[remove_all_idx + 1 :])
            return
        to_remove: set[Any] = set()
        slots, last = self.slots, self.last
        for m in right:
            mid = m.id
            pos = last.get(mid)
            if pos is not None:
                if isinstance(m, RemoveMessage):
                    to_remove.add(mid)
                else:
                    # A later message with a removed id inside the same write wins.
                    to_remove.discard(mid)
                    slots[pos] = m
            else:
                if isinstance(m, RemoveMessage):
                    raise ValueError(
                        f"Attempting to delete a message with an ID that doesn't exist ('{mid}')"
                    )
                last[mid] = len(slots)
                slots.append(m)
        for mid in to_remove:
            slots[last.pop(mid)] = _TOMBSTONE
            for pos in self.earlier.pop(mid, ()):
                slots[pos] = _TOMBSTONE

    def is_empty(self) -> bool:
        return not self.last

    def result(self) -> list[Any]:
        return [m for m in self.slots if m is not _TOMBSTONE]


def merge_message_writes(state: Any, writes: Sequence[Any]) -> Any:
    """Reduce ``writes`` onto ``state``: exactly ``add_messages`` folded over the writes.

    Ids replace in place, ``RemoveMessage`` removes (a missing id raises the same
    ``ValueError``), ``RemoveMessage(id=REMOVE_ALL_MESSAGES)`` clears; missing ids are
    assigned in the same order `add_messages` assigns them. Batching-invariant.
    """
    if not writes:
        return state
    if state is None:
        raise _null_argument_error(state)
    left = state if isinstance(state, list) else [state]
    left = _coerce(left)
    for m in left:
        if m.id is None:
            m.id = str(uuid.uuid4())
    current = _MessageSlots(left)
    for write in writes:
        if write is None:
            # add_messages(left, None) names 'left' only when the running state is truthy.
            raise _null_argument_error(not current.is_empty())
        right = write if isinstance(write, list) else [write]
        current.apply(_coerce(right))
    return current.result()
