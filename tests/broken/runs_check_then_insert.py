"""Broken run store: ``create`` checks for an active run, yields, then inserts unchecked.

Racing ``reject`` creates all see a free thread and all write a run. The run store
suite must fail it (contract: create with reject is atomic).
"""

from __future__ import annotations

import asyncio
from typing import Any

from runstore.errors import ThreadBusyError
from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory.runs import MemoryRunStore
from runstore.registry import RunStoreRegistry
from runstore.runs.protocol import CreateResult
from runstore.urls import BackendURL


class CheckThenInsertStore(MemoryRunStore):
    async def create(self, thread_id: str, *, multitask_strategy: Any = "reject", **kw: Any) -> CreateResult:  # type: ignore[override]
        if multitask_strategy != "reject":
            return await super().create(thread_id, multitask_strategy=multitask_strategy, **kw)
        active = [r for r in await self.list_by_thread(thread_id) if r["active"]]
        if active:
            raise ThreadBusyError(thread_id, active[0])
        # BUG (on purpose): another create can run between the check and the write, and
        # the write no longer looks (it queues behind whatever won instead of refusing).
        await asyncio.sleep(0)
        return await super().create(thread_id, multitask_strategy="enqueue", **kw)


async def _open(url: BackendURL, options: BackendOptions) -> CheckThenInsertStore:
    return await CheckThenInsertStore.open(url.with_query(), options)  # type: ignore[return-value]


@hookimpl
def runstore_register_run_stores(registry: RunStoreRegistry) -> None:
    registry.add("broken-check-then-insert", schemes=["broken-check-then-insert"], factory=_open)
