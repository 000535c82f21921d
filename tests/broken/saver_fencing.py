"""Broken fenced savers: one ignores the token, one checks it apart from the write.

* ``broken-fence-ignored``: accepts ``runstore_fence`` and drops it (the hole every
  stock saver has: a worker that lost its lease keeps writing).
* ``broken-fence-check-then-write``: reads the thread's fence, yields, then writes and
  raises the fence: a newer writer can land in between, and the stale write lands
  after it.

The fencing suite must fail both by name.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig

from runstore.checkpoint.rules import FENCE_KEY, config_fence
from runstore.errors import StaleFenceError
from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory.saver import MemorySaver
from runstore.registry import SaverRegistry
from runstore.urls import BackendURL

CAPABILITIES = ["copy_thread", "prune", "delete_for_runs", "delta_history", "sync_api", "fencing"]


def _unfenced(config: RunnableConfig) -> RunnableConfig:
    configurable = {k: v for k, v in (config.get("configurable") or {}).items() if k != FENCE_KEY}
    return {**config, "configurable": configurable}


class FenceIgnoredSaver(MemorySaver):
    def put(self, config: RunnableConfig, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        # BUG (on purpose): the token is dropped.
        return super().put(_unfenced(config), checkpoint, metadata, new_versions)

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = "") -> None:
        super().put_writes(_unfenced(config), writes, task_id, task_path)

    def delete_thread(self, thread_id: str, *, fence: int | None = None) -> None:
        super().delete_thread(thread_id)

    def fence_thread(self, thread_id: str, fence: int) -> None:
        return None


class CheckThenWriteSaver(MemorySaver):
    async def _check(self, config: RunnableConfig) -> int | None:
        fence = config_fence(config)
        thread_id = (config.get("configurable") or {}).get("thread_id")
        record = self._records.get(thread_id)
        if fence is not None and record is not None and fence < record.fence:
            raise StaleFenceError(thread_id, fence, record.fence)
        # BUG (on purpose): the write happens in a later step than the check.
        await asyncio.sleep(0)
        return fence

    def _raise(self, config: RunnableConfig, fence: int | None) -> None:
        record = self._records.get((config.get("configurable") or {}).get("thread_id"))
        if fence is not None and record is not None:
            record.fence = max(record.fence, fence)

    async def aput(self, config: RunnableConfig, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        fence = await self._check(config)
        out = self.put(_unfenced(config), checkpoint, metadata, new_versions)
        self._raise(config, fence)
        return out

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        fence = await self._check(config)
        self.put_writes(_unfenced(config), writes, task_id, task_path)
        self._raise(config, fence)


def _factory(cls: type[MemorySaver]) -> Any:
    async def _open(url: BackendURL, options: BackendOptions) -> MemorySaver:
        return cls()

    return _open


@hookimpl
def runstore_register_savers(registry: SaverRegistry) -> None:
    registry.add(
        "broken-fence-ignored", schemes=["broken-fence-ignored"],
        factory=_factory(FenceIgnoredSaver), capabilities=CAPABILITIES,
    )  # fmt: skip
    registry.add(
        "broken-fence-check-then-write", schemes=["broken-fence-check-then-write"],
        factory=_factory(CheckThenWriteSaver), capabilities=CAPABILITIES,
    )  # fmt: skip
