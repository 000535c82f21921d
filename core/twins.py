"""Sync twins: a backend's blocking methods (``get_tuple``, ``batch``, ...) that run its
async methods on the event loop it was opened on and wait from another thread.

Waiting on the loop's own thread would deadlock, so a twin called there fails fast with
`SyncCallOnEventLoopError` and names the async method to await instead.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from runstore.errors import SyncCallOnEventLoopError

R = TypeVar("R")


def ensure_off_loop(loop: asyncio.AbstractEventLoop | None, method: str, owner: str) -> None:
    """Raise `SyncCallOnEventLoopError` if the caller runs on ``loop``'s thread.

    A sync twin that waits for work scheduled on its own loop would deadlock there;
    failing fast tells the caller to use the async method instead.
    """
    if loop is None:
        return
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        return
    if running is loop:
        raise SyncCallOnEventLoopError(
            f"{owner}.{method}() was called on the event loop thread {owner} runs on; "
            f"await {owner}.a{method}() there instead (sync twins are for other threads)"
        )


def run_sync(
    loop: asyncio.AbstractEventLoop,
    coro_factory: Callable[[], Coroutine[Any, Any, R]],
    method: str,
    owner: str,
    timeout: float | None = None,
) -> R:
    """Run a coroutine on a backend's ``loop`` from another thread and wait for its result.

    Raises `SyncCallOnEventLoopError` when called on the loop's own thread (where waiting
    would deadlock) and `RuntimeError` when the loop is closed or not running.
    """
    ensure_off_loop(loop, method, owner)
    if loop.is_closed() or not loop.is_running():
        raise RuntimeError(
            f"{owner}.{method}(): the event loop {owner} was opened on is not running; "
            "sync twins need that loop to stay alive"
        )
    future: concurrent.futures.Future[R] = asyncio.run_coroutine_threadsafe(
        coro_factory(), loop
    )
    return future.result(timeout)
