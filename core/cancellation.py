"""Cancellation that never leaves half an operation behind.

A caller cancelled while its write is in flight must not return before the write has
ended: a worker thread cannot be interrupted, and a transaction must commit or roll
back whole. `settle` runs the operation to its end in its own task and only then
re-raises the caller's cancellation, so "returned or raised" always means "over".
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def settle(awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` to its end in its own task, even if the caller is cancelled.

    A cancellation of the caller is re-raised once the task has finished, so when this
    returns or raises, the operation is over (committed or rolled back).
    """
    task = asyncio.ensure_future(awaitable)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return result
