"""Broken run store: ``claim_expired`` takes running runs with no condition on their lease.

It reads the running runs, yields, then takes them over: a live lease is taken too, and
racing claimers take the same runs. The run store suite must fail it (contract:
claim_expired takes only runs whose lease ended ...; each expired run is claimed by
exactly one claimer).
"""

from __future__ import annotations

import asyncio
from typing import Any

from runstore.clock import seconds_to_micros, to_micros
from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory.runs import MemoryRunStore
from runstore.registry import RunStoreRegistry
from runstore.runs.protocol import RunRecord
from runstore.runs.sql import record
from runstore.urls import BackendURL


class UnconditionalClaimStore(MemoryRunStore):
    async def claim_expired(self, owner: str, ttl: float, *, grace: float, limit: int = 100) -> list[RunRecord]:  # type: ignore[override]
        db = self.driver.connection
        # BUG (on purpose): no condition on lease_expires_at, and none again at the write.
        ids = [r for (r,) in db.execute(
            "SELECT run_id FROM runstore_runs WHERE status = 'running' ORDER BY lease_expires_at, run_id LIMIT ?",
            (limit,),
        )]  # fmt: skip
        await asyncio.sleep(0)
        now = to_micros(self.now())
        out: list[RunRecord] = []
        for run_id in ids:
            (thread,) = db.execute("SELECT thread_id FROM runstore_runs WHERE run_id = ?", (run_id,)).fetchone()
            (fence,) = db.execute(
                "UPDATE runstore_run_threads SET fence = fence + 1 WHERE thread_id = ? RETURNING fence", (thread,)
            ).fetchone()
            row: Any = db.execute(
                "UPDATE runstore_runs SET owner = ?, lease_expires_at = ?, fence = ?, updated_at = ? "
                "WHERE run_id = ? RETURNING *",
                (owner, now + seconds_to_micros(ttl), fence, now, run_id),
            ).fetchone()
            out.append(record(tuple(row)))
        return out


async def _open(url: BackendURL, options: BackendOptions) -> UnconditionalClaimStore:
    return await UnconditionalClaimStore.open(url.with_query(), options)  # type: ignore[return-value]


@hookimpl
def runstore_register_run_stores(registry: RunStoreRegistry) -> None:
    registry.add("broken-unconditional-claim", schemes=["broken-unconditional-claim"], factory=_open)
