"""The worker process of the history cache's cross-process test (spawned, so importable by name)."""

from __future__ import annotations

from typing import Any

from .history_cache_machine import sample
from .processes import errors_travel, with_backend


@errors_travel
def cache_worker(url: str, plugins: list[str], read: str, write: str, key: str) -> Any:
    """Open the cache at ``url`` in this process: return what ``get(read, key)`` finds, then
    purge ``read`` and set the suite's second sample entry at ``(write, key)``."""
    async def body(cache: Any) -> Any:
        seen = await cache.get(read, key)
        await cache.purge_thread(read)
        await cache.set(write, key, sample(2))
        return seen

    return with_backend("history_cache", url, plugins, body)
