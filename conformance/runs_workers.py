"""Worker processes for the run store's cross-process races (spawned, so importable by name)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .processes import errors_travel, with_backend

T = TypeVar("T")


def _with_store(url: str, plugins: list[str], body: Callable[[Any], Awaitable[T]]) -> T:
    """Open the run store at ``url`` in this process (through the registry) and run ``body``."""
    return with_backend("runs", url, plugins, body)


@errors_travel
def create_race_worker(
    url: str, plugins: list[str], thread_ids: list[str], index: int, barrier: Any
) -> list[tuple[str, str]]:
    """For each thread, wait for every process, then ``create`` with ``reject``.

    Returns one ``("created", run_id)`` or ``("busy", active_run_id)`` per thread.
    """
    from runstore.errors import ThreadBusyError

    async def body(store: Any) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for thread_id in thread_ids:
            barrier.wait(timeout=120)
            try:
                result = await store.create(thread_id, run_id=f"{thread_id}-p{index}")
                out.append(("created", result.run["run_id"]))
            except ThreadBusyError as exc:
                out.append(("busy", exc.active_run["run_id"]))
        return out

    return _with_store(url, plugins, body)


@errors_travel
def claim_worker(
    url: str,
    plugins: list[str],
    owner: str,
    run_ids: list[str],
    dead_owner: str,
    rounds: int,
    barrier: Any,
) -> list[tuple[str, int]]:
    """Claim expired runs (on this machine's clock); return ``(run_id, fence)`` per claim.

    Every process claims two runs per round, all rounds starting together (a barrier),
    so the claimers contend for the same longest-expired runs each time. Then each
    sweeps until none of ``run_ids`` is left to ``dead_owner``.
    """

    async def body(store: Any) -> list[tuple[str, int]]:
        claimed: list[tuple[str, int]] = []
        for _ in range(rounds):
            barrier.wait(timeout=120)
            got = await store.claim_expired(owner, 600, grace=0, limit=2)
            claimed += [(run["run_id"], run["fence"]) for run in got]
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            got = await store.claim_expired(owner, 600, grace=0, limit=7)
            claimed += [(run["run_id"], run["fence"]) for run in got]
            if got:
                continue
            # Nothing free: done once no run is still held by the dead owner (the others
            # may still be finishing claims they locked).
            left = [r for r in [await store.get(i) for i in run_ids] if r and r["owner"] == dead_owner]
            if not left:
                break
            await asyncio.sleep(0.01)
        return claimed

    return _with_store(url, plugins, body)
