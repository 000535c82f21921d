"""What a backend factory receives besides its URL: settings, shared resources, cleanup."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from runstore.settings import Settings

R = TypeVar("R")


@dataclass
class BackendOptions:
    """Handed to every backend factory as ``(url, options)``.

    ``settings`` holds the resolved configuration. `shared` lets two backends opened
    together (a sqlite saver and event store on one file, say) share one pool, and
    `on_close` registers cleanup that runs when the enclosing `runstore.open` exits.
    """

    settings: Settings = field(default_factory=Settings)
    #: Whether factories bring their schema up to date at open (`runstore.open` does;
    #: stock-style ``from_conn_string`` leaves it to an explicit ``setup()``).
    migrate: bool = True
    _stack: AsyncExitStack = field(default_factory=AsyncExitStack, repr=False)
    _shared: dict[Hashable, Any] = field(default_factory=dict, repr=False)

    def on_close(self, callback: Callable[[], Awaitable[Any] | Any]) -> None:
        """Run ``callback`` (sync or async) when these options are closed, last in first out."""

        async def run() -> None:
            result = callback()
            if inspect.isawaitable(result):
                await result

        self._stack.push_async_callback(run)

    async def shared(
        self,
        key: Hashable,
        opener: Callable[[], Awaitable[R]],
        closer: Callable[[R], Awaitable[Any] | Any] | None = None,
    ) -> R:
        """Return the resource stored under ``key``, opening it (and scheduling its close) once."""
        if key not in self._shared:
            resource = await opener()
            self._shared[key] = resource
            if closer is not None:
                self.on_close(lambda: closer(resource))
        return self._shared[key]

    async def adopt(self, opened: Any) -> Any:
        """Take charge of what a backend factory returned, the same way for every kind.

        An async context manager (``AsyncSqliteSaver.from_conn_string(...)``, or a backend
        whose ``__aenter__`` returns itself) is entered now and exited when these options
        close; what it yields is the backend. Anything else is the backend itself, and its
        ``aclose()`` or else ``close()`` (sync or async) runs when these options close.
        Cleanups the factory registered with `on_close` run after that (last in, first out).
        """
        if hasattr(opened, "__aenter__") and hasattr(opened, "__aexit__"):
            return await self._stack.enter_async_context(opened)
        close = getattr(opened, "aclose", None) or getattr(opened, "close", None)
        if callable(close):
            self.on_close(close)
        return opened

    def provide(self, key: Hashable, resource: Any) -> None:
        """Make `shared` return ``resource`` for ``key`` without opening or ever closing it
        (a pool, engine or client the caller owns)."""
        self._shared[key] = resource

    def provided(self, key: Hashable, default: Any = None) -> Any:
        """What `provide` or `shared` holds under ``key``, or ``default`` (opens nothing)."""
        return self._shared.get(key, default)

    async def aclose(self) -> None:
        """Run every registered cleanup."""
        self._shared.clear()
        await self._stack.aclose()

    @classmethod
    @asynccontextmanager
    async def scope(cls, settings: Settings | None = None) -> AsyncIterator[BackendOptions]:
        """Options whose cleanups run when the ``async with`` block exits."""
        options = cls(settings=settings or Settings())
        try:
            yield options
        finally:
            await options.aclose()
