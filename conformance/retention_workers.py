"""Sweeper processes for the cross-process retention test (spawned, so importable by name)."""

from __future__ import annotations

import asyncio
from typing import Any

from .processes import errors_travel, load_plugins


@errors_travel
def sweeper_worker(
    url: str, plugins: list[str], keep_last: int, thread_ids: list[str], barrier: Any
) -> dict[str, Any]:
    """Open the saver at ``url`` in this process and run one retention pass over
    ``thread_ids`` (the suite's storage holds other tests' threads) in small batches; returns ``{"checkpoints": removed, "examined": threads examined}``."""
    from runstore.capabilities import Kind
    from runstore.checkpoint.policy import RetentionPolicy
    from runstore.loader import get_backends
    from runstore.options import BackendOptions
    from runstore.sweeper import Sweeper
    from runstore.urls import BackendURL

    load_plugins(plugins)

    async def main() -> dict[str, Any]:
        parsed = BackendURL.parse(url)
        spec = get_backends().of(Kind.SAVER).for_url(parsed)
        async with BackendOptions.scope() as options:
            saver = await spec.open(parsed, options)
            barrier.wait(timeout=120)
            report = await Sweeper(saver).sweep(
                RetentionPolicy(keep_last=keep_last), batch_size=3, thread_ids=thread_ids
            )
            return {"checkpoints": report.removed.checkpoints, "examined": report.examined}

    return asyncio.run(main())


@errors_travel
def claim_worker(url: str, plugins: list[str], keep_last: int, thread_ids: list[str], barrier: Any) -> list[str]:
    """Open the saver at ``url`` in this process and run ONE sweep batch over ``thread_ids``
    (a limit that takes them all); returns the thread ids that batch examined."""
    from runstore.capabilities import Kind
    from runstore.checkpoint.policy import RetentionPolicy
    from runstore.loader import get_backends
    from runstore.options import BackendOptions
    from runstore.urls import BackendURL

    load_plugins(plugins)

    async def main() -> list[str]:
        parsed = BackendURL.parse(url)
        spec = get_backends().of(Kind.SAVER).for_url(parsed)
        async with BackendOptions.scope() as options:
            saver = await spec.open(parsed, options)
            barrier.wait(timeout=120)
            batch = await saver.asweep(
                RetentionPolicy(keep_last=keep_last), limit=len(thread_ids), thread_ids=thread_ids
            )
            return [t.thread_id for t in batch.threads]

    return asyncio.run(main())


@errors_travel
def sweep_once_worker(url: str, plugins: list[str], thread_ids: list[str]) -> dict[str, list[str]]:
    """Open the saver at ``url`` in this process and run ONE sweep batch over ``thread_ids``;
    returns the threads it examined and the deleted threads it claimed for cleanup."""
    from runstore.capabilities import Kind
    from runstore.checkpoint.policy import RetentionPolicy
    from runstore.loader import get_backends
    from runstore.options import BackendOptions
    from runstore.urls import BackendURL

    load_plugins(plugins)

    async def main() -> dict[str, list[str]]:
        parsed = BackendURL.parse(url)
        spec = get_backends().of(Kind.SAVER).for_url(parsed)
        async with BackendOptions.scope() as options:
            saver = await spec.open(parsed, options)
            batch = await saver.asweep(RetentionPolicy(keep_last=1), limit=100, thread_ids=thread_ids)
            return {"threads": [t.thread_id for t in batch.threads], "cleanup": list(batch.cleanup)}

    return asyncio.run(main())
