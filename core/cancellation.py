"""Cancellation that never leaves half an operation behind: the one rule every store applies.

A caller cancelled while its write is in flight must not return before the write has
ended: a worker thread cannot be interrupted, a batch running in another task must
commit or roll back whole, and a connection must be rolled back before it is reused.
So a cancelled caller waits for what it started to end, further cancellations
meanwhile wait too, and only then does its cancellation propagate: "returned or
raised" always means "over". Every such operation is bounded by its own timeout, so
the wait is too.

Two forms of the one rule:

- `settle` runs an operation to its end in a task of its own (the operation would
  otherwise be interrupted with its caller): the run stores and the jsonl event store.
- `wait_until_done` waits for something already running elsewhere to end: a batch of
  `runstore.batching`, the sqlite worker thread's queue, a PostgreSQL rollback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")


async def settle(awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` to its end in its own task, even if the caller is cancelled.

    A cancellation of the caller is re-raised once the task has finished, so when this
    returns or raises, the operation is over (committed or rolled back).
    """
    task = asyncio.ensure_future(awaitable)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if task.done():  # the operation itself was cancelled, or ended as the caller was
            raise
        await wait_until_done(task)
        raise


async def wait_until_done(ended: Awaitable[Any]) -> None:
    """Wait until ``ended`` has finished, whatever its outcome (not this wait's business).

    A cancellation of the caller meanwhile is held until then and raised after it, so
    when this returns or raises, ``ended`` is over. ``ended`` is never cancelled by
    this wait.
    """
    future = asyncio.ensure_future(ended)
    cancelled = False
    while not future.done():
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError:
            # The caller's (held), or ``ended`` was itself cancelled: raised either way.
            cancelled = True
        except Exception:  # its outcome belongs to whoever waits on it
            break
    if cancelled or future.cancelled():
        raise asyncio.CancelledError
    future.exception()  # retrieved: no "never retrieved" warning when nobody else looks
