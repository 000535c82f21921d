"""`runstore.open_sync`: the stores for synchronous code, on an event loop runstore owns.

``graph.invoke``, scripts, Django/Flask handlers and notebooks call the savers' sync
methods (``get_tuple``, ``put``, ...). Those run the async method on the saver's event
loop and wait for it, so that loop must be running in another thread. `SyncStores`
starts one (a daemon thread named ``runstore-loop``), opens the stores on it, and on
`SyncStores.close` closes the stores, stops the loop, joins the thread and closes the
loop. The async-only stores (events, streams, runs) are reached with `SyncStores.run`.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Mapping
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from runstore.errors import SyncCallOnEventLoopError
from runstore.settings import Settings

if TYPE_CHECKING:
    from langgraph.checkpoint.base import BaseCheckpointSaver
    from langgraph.store.base import BaseStore

    from runstore.events.protocol import RunEventStore
    from runstore.registry import Backends
    from runstore.runs.protocol import RunStore
    from runstore.stores import Stores
    from runstore.streams.protocol import StreamBridge

R = TypeVar("R")


class SyncStores:
    """Stores opened by `open_sync`; usable from any thread except their loop's own.

    ``with runstore.open_sync(...) as stores:`` closes them at the end of the block;
    without ``with``, call `close` (at application shutdown, say).
    """

    def __init__(self, opener: AbstractAsyncContextManager[Stores]) -> None:
        self._opener = opener
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="runstore-loop", daemon=True
        )
        self._closed = False
        self._thread.start()
        try:
            self._stores: Stores = self.run(opener.__aenter__())
        except BaseException:
            self._stop()
            raise

    # -- the stores --------------------------------------------------------------

    @property
    def stores(self) -> Stores:
        """The async `Stores` (their methods are coroutines; await them through `run`)."""
        return self._stores

    @property
    def checkpointer(self) -> BaseCheckpointSaver[Any]:
        """The checkpoint saver: its sync methods work from any thread but the loop's."""
        return self._stores.checkpointer

    @property
    def events(self) -> RunEventStore:
        """The run event store (async: ``stores.run(stores.events.put(...))``)."""
        return self._stores.events

    @property
    def streams(self) -> StreamBridge:
        """The stream bridge (async: use `run`)."""
        return self._stores.streams

    @property
    def runs(self) -> RunStore:
        """The run store (async: use `run`)."""
        return self._stores.runs

    @property
    def store(self) -> BaseStore:
        """The long-term memory store: LangGraph's sync methods (``put``, ``search``...) work
        from any thread but the loop's (for ``builder.compile(store=...)`` with ``graph.invoke``)."""
        return self._stores.store

    @property
    def settings(self) -> Settings:
        """The resolved settings."""
        return self._stores.settings

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the stores run on (in runstore's own thread)."""
        return self._loop

    def thread_state_schema(self, **kwargs: Any) -> type:
        """`Stores.thread_state_schema` of these stores."""
        return self._stores.thread_state_schema(**kwargs)

    # -- running async code ------------------------------------------------------

    def run(self, awaitable: Awaitable[R], timeout: float | None = None) -> R:
        """Run ``awaitable`` on the stores' loop and return its result (wait at most ``timeout``).

        Raises `SyncCallOnEventLoopError` when called from the loop's own thread (it
        would wait for itself forever).
        """
        if threading.current_thread() is self._thread:
            if asyncio.iscoroutine(awaitable):
                awaitable.close()
            raise SyncCallOnEventLoopError(
                "SyncStores.run was called on the stores' own event loop thread, where it "
                "would wait for itself; await the coroutine there instead"
            )
        if self._loop.is_closed() or not self._thread.is_alive():
            if asyncio.iscoroutine(awaitable):
                awaitable.close()
            raise RuntimeError("these stores are closed")

        async def call() -> R:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result(timeout)

    # -- closing -----------------------------------------------------------------

    def close(self) -> None:
        """Close the stores, then stop and close their event loop (idempotent)."""
        self._exit(None, None, None)

    def _exit(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.run(self._opener.__aexit__(exc_type, exc, tb))
        finally:
            self._stop()

    def _stop(self) -> None:
        self._closed = True
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        try:
            # Tasks the stores left behind end here, not in a later loop's garbage.
            pending = [t for t in asyncio.all_tasks(self._loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.run_until_complete(self._loop.shutdown_default_executor())
        finally:
            self._loop.close()

    def __enter__(self) -> SyncStores:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exit(exc_type, exc, tb)


def open_sync(
    config: Mapping[str, Any] | str | os.PathLike[str] | Settings | None = None,
    *,
    checkpointer: str | None = None,
    events: str | None = None,
    streams: str | None = None,
    runs: str | None = None,
    store: str | None = None,
    store_index: Mapping[str, Any] | None = None,
    store_ttl: Mapping[str, Any] | None = None,
    backends: Backends | None = None,
) -> SyncStores:
    """`runstore.open` for synchronous code: the stores, opened on a loop runstore owns.

    Takes the arguments of `runstore.open`. Use as ``with runstore.open_sync(...) as
    stores:`` or keep the result and call ``stores.close()`` at shutdown. The saver's sync
    methods (what ``graph.invoke`` calls) work from any thread but the loop's own, where
    they raise `SyncCallOnEventLoopError`.
    """
    from runstore.stores import open as open_stores

    return SyncStores(
        open_stores(
            config,
            checkpointer=checkpointer,
            events=events,
            streams=streams,
            runs=runs,
            store=store,
            store_index=store_index,
            store_ttl=store_ttl,
            backends=backends,
        )
    )
