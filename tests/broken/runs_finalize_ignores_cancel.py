"""Broken run store: ``finalize`` ignores a pending cancel request.

The owner can report ``success`` although a cancel is pending. The run store suite
must fail it (contract: finalize refuses ... any status but cancelled/interrupted while
a cancel is pending).
"""

from __future__ import annotations

from typing import Any

from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory.runs import MemoryRunStore
from runstore.registry import RunStoreRegistry
from runstore.runs.protocol import RunRecord
from runstore.urls import BackendURL


class IgnoresCancelStore(MemoryRunStore):
    async def finalize(self, run_id: str, owner: str, status: Any, **kw: Any) -> RunRecord:  # type: ignore[override]
        # BUG (on purpose): forget the cancel request before checking it.
        db = self.driver.connection
        pending = db.execute(
            "SELECT cancel_action, cancel_requested_at FROM runstore_runs WHERE run_id = ? AND status = 'running'",
            (run_id,),
        ).fetchone()
        if pending is None or pending[0] is None or status in ("cancelled", "interrupted"):
            return await super().finalize(run_id, owner, status, **kw)
        db.execute("UPDATE runstore_runs SET cancel_action = NULL WHERE run_id = ?", (run_id,))
        try:
            run = await super().finalize(run_id, owner, status, **kw)
        finally:
            db.execute(
                "UPDATE runstore_runs SET cancel_action = ?, cancel_requested_at = ? WHERE run_id = ?",
                (pending[0], pending[1], run_id),
            )
        return {**run, "cancel_action": pending[0]}


async def _open(url: BackendURL, options: BackendOptions) -> IgnoresCancelStore:
    return await IgnoresCancelStore.open(url.with_query(), options)  # type: ignore[return-value]


@hookimpl
def runstore_register_run_stores(registry: RunStoreRegistry) -> None:
    registry.add("broken-ignores-cancel", schemes=["broken-ignores-cancel"], factory=_open)
