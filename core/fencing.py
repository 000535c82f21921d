"""Fencing tokens: the one definition of what a run's ``fence`` is, how a store checks it,
and how a lease grant fences every store of its run.

A lease grant (`RunStore.start`, `RunStore.claim_expired`) issues a token from a
per-thread counter that only grows. A store that declares the capability ``fencing``
keeps, per thread (per run for a stream bridge), the highest token it has seen and
refuses a write carrying an older one (`admit_fence`). Each kind's protocol has one
method that raises the store's fence without writing anything else (`FENCE_METHODS`),
and `fence_stores` calls it on every store of a run as soon as a lease is granted, so a
worker that lost the run is refused on its very first write to any store.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from runstore.errors import InvalidEventError, RunstoreError, StaleFenceError

#: Fencing tokens are SQL ``BIGINT``s from 1.
MAX_FENCE = 2**63 - 1

#: Per kind, the protocol method that raises a store's fence without writing anything
#: else, and what it is keyed by: savers ``afence_thread(thread_id, fence)``, event stores
#: (and any store keyed by thread) ``fence_thread(thread_id, fence)``, stream bridges
#: ``fence_stream(run_id, fence)``. The first method a store has is the one called.
FENCE_METHODS: tuple[tuple[str, str], ...] = (
    ("afence_thread", "thread_id"),
    ("fence_stream", "run_id"),
    ("fence_thread", "thread_id"),
)


def check_fence(value: Any, what: str = "fence", error: type[RunstoreError] = InvalidEventError) -> int:
    """A fencing token (a run's ``fence``): an int from 1 to `MAX_FENCE`, not a bool; else ``error``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_FENCE:
        raise error(
            f"{what} must be a fencing token (an int from 1 to {MAX_FENCE}, e.g. a run's "
            f"'fence'), not {value!r}"
        )
    return value


def is_stale(fence: int, current: int) -> bool:
    """The fencing rule: a token is stale when the store has seen a newer one (equal passes)."""
    return fence < current


def admit_fence(fence: int, current: int, *, thread_id: str | None = None, run_id: str | None = None) -> int:
    """The store's new fence after a write carrying ``fence`` (``current``: the highest seen,
    0 for none); raises `StaleFenceError` naming the thread (or the run's stream) if stale.

    A store applies it in the same step as the write it guards (under the lock that
    serializes the thread's writers); SQL stores spell the same rule as a
    compare-and-set (`fence <= token`) in the write's transaction."""
    if is_stale(fence, current):
        raise StaleFenceError(thread_id, fence, current, run_id=run_id)
    return fence


@dataclass(frozen=True)
class FenceGrant:
    """What a lease grant fences: the run, its thread and the lease's token."""

    thread_id: str
    run_id: str
    fence: int


def fence_method(store: Any) -> tuple[str, str] | None:
    """The `FENCE_METHODS` entry ``store`` implements (an async method), or ``None``."""
    for name, key in FENCE_METHODS:
        method = getattr(store, name, None)
        if method is not None and inspect.iscoroutinefunction(method):
            return name, key
    return None


async def fence_stores(grant: FenceGrant, stores: Iterable[Any]) -> None:
    """Raise the fence of each store (``None`` entries skipped) to the grant's token, all at
    once; returns when every store's fence call has ended.

    A store without a fence method (e.g. a stock LangGraph saver) is left alone; one
    whose fence is already newer raises `StaleFenceError` (the grant is outdated: its
    holder must not write). If several calls fail, the first store's error is raised."""
    calls = []
    for store in stores:
        found = None if store is None else fence_method(store)
        if found is not None:
            name, key = found
            calls.append(getattr(store, name)(getattr(grant, key), grant.fence))
    # Concurrently: the stores are independent, so a grant costs the slowest one's round
    # trip, not their sum. Every call is waited out before an error is raised (none is
    # left running); raising one store's fence while another refused is harmless, the
    # outdated token being older than the grant that refused it.
    results = await asyncio.gather(*calls, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result


__all__ = [
    "FENCE_METHODS",
    "MAX_FENCE",
    "FenceGrant",
    "admit_fence",
    "check_fence",
    "fence_method",
    "fence_stores",
    "is_stale",
]
