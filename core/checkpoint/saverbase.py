"""Small, backend-neutral helpers that checkpoint savers share.

Nothing here touches storage: these are the rules every saver has to apply the
same way (write slots, metadata filters, the sync-twin guard, which ancestors a
delta reconstruction needs), kept in one place so the memory, sqlite and
PostgreSQL savers (and third-party ones) agree.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Collection, Coroutine, Iterable, Mapping
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import WRITES_IDX_MAP

from ..errors import SyncCallOnEventLoopError

R = TypeVar("R")

#: LangGraph's per-checkpoint metadata naming the delta channels not snapshotted there.
DELTA_COUNTERS_KEY = "counters_since_delta_snapshot"
#: `aget_tuple` on a thread's head prefetches its delta history only up to this many
#: supersteps since the last snapshot: beyond, the history costs more than the round
#: trip it saves, and a caller that wants only the head would pay for all of it.
PREFETCH_MAX_SUPERSTEPS = 256

__all__ = [
    "DELTA_COUNTERS_KEY",
    "PREFETCH_MAX_SUPERSTEPS",
    "checkpoint_config",
    "delta_channels",
    "ensure_off_loop",
    "is_last_write_wins",
    "metadata_matches",
    "reconstruction_ancestors",
    "run_sync",
    "worth_prefetching",
    "write_slot",
]


def write_slot(channel: str, idx: int) -> int:
    """The storage index of the ``idx``-th write of a task: special channels get their
    fixed negative slot (`WRITES_IDX_MAP`), everything else keeps its position."""
    return WRITES_IDX_MAP.get(channel, idx)


def is_last_write_wins(slot: int) -> bool:
    """Whether a write stored at ``slot`` replaces an existing one (special negative
    slots: errors, interrupts, resumes) instead of being ignored (first write wins)."""
    return slot < 0


def checkpoint_config(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> RunnableConfig:
    """The config that addresses one stored checkpoint."""
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": checkpoint_ns,
            "checkpoint_id": checkpoint_id,
        }
    }


def metadata_matches(metadata: Mapping[str, Any], filter: Mapping[str, Any] | None) -> bool:
    """Whether ``metadata`` has every ``filter`` key with an equal value (the `alist` filter rule)."""
    if not filter:
        return True
    missing = object()
    return all(metadata.get(key, missing) == value for key, value in filter.items())


def worth_prefetching(metadata: Mapping[str, Any] | None) -> bool:
    """Whether the head's delta history is short enough to fetch along with it.

    Reads the supersteps since the last snapshot from LangGraph's counters
    (``{channel: [updates, supersteps]}``); malformed counters count as short.
    """
    counters = (metadata or {}).get(DELTA_COUNTERS_KEY)
    if not isinstance(counters, Mapping):
        return True
    for value in counters.values():
        if isinstance(value, list | tuple) and len(value) > 1:
            steps = value[1]
            if isinstance(steps, int | float) and steps > PREFETCH_MAX_SUPERSTEPS:
                return False
    return True


def delta_channels(metadata: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The delta channels a checkpoint's metadata names (``counters_since_delta_snapshot``).

    LangGraph lists every `DeltaChannel` there whose counters are non-zero, i.e. each
    one not snapshotted at that checkpoint. Only these need their history to rebuild:
    an ordinary channel with nothing stored (a consumed trigger, say) is just empty.
    """
    counters = (metadata or {}).get(DELTA_COUNTERS_KEY)
    if not isinstance(counters, Mapping):
        return ()
    return tuple(sorted(str(k) for k in counters))


def reconstruction_ancestors(
    start_id: str,
    channels: Iterable[str],
    parent_of: Callable[[str], str | None],
    valued_channels: Callable[[str], Collection[str]],
) -> list[str]:
    """Ancestors (nearest first) a delta reconstruction of ``channels`` at ``start_id`` reads.

    Walks parent links from ``start_id``'s parent; each channel stops at the first
    ancestor holding a value for it (``valued_channels(id)``). Savers keep these when
    pruning or deleting so a surviving checkpoint still rebuilds the same state; pass
    as ``channels`` the `delta_channels` of the start checkpoint that hold no value there.
    ``parent_of`` returns ``None`` for a root or a checkpoint that no longer exists.
    """
    remaining = set(channels)
    chain: list[str] = []
    current = parent_of(start_id) if remaining else None
    seen: set[str] = set()
    while current is not None and remaining and current not in seen:
        seen.add(current)
        chain.append(current)
        remaining.difference_update(valued_channels(current))
        current = parent_of(current)
    return chain


def ensure_off_loop(loop: asyncio.AbstractEventLoop | None, method: str, owner: str) -> None:
    """Raise `SyncCallOnEventLoopError` if the caller runs on ``loop``'s thread.

    A sync twin that waits for work scheduled on its own loop would deadlock there;
    failing fast tells the caller to use the async method instead.
    """
    if loop is None:
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        return
    if running is loop:
        raise SyncCallOnEventLoopError(
            f"{owner}.{method}() was called on the event loop thread the saver runs on; "
            f"await {owner}.a{method}() there instead (sync twins are for other threads)"
        )


def run_sync(
    loop: asyncio.AbstractEventLoop,
    coro_factory: Callable[[], Coroutine[Any, Any, R]],
    method: str,
    owner: str,
    timeout: float | None = None,
) -> R:
    """Run a coroutine on the saver's ``loop`` from another thread and wait for its result.

    Raises `SyncCallOnEventLoopError` when called on the loop's own thread (where waiting
    would deadlock) and `RuntimeError` when the loop is closed or not running.
    """
    ensure_off_loop(loop, method, owner)
    if loop.is_closed() or not loop.is_running():
        raise RuntimeError(
            f"{owner}.{method}(): the saver's event loop is not running; "
            "sync twins need the loop the saver was opened on to stay alive"
        )
    future: concurrent.futures.Future[R] = asyncio.run_coroutine_threadsafe(
        coro_factory(), loop
    )
    return future.result(timeout)
