"""Targets: a named backend, provisioned in isolation, that suite tests open and drive.

Suite tests are plain synchronous pytest tests (they never depend on a pytest
asyncio plugin). They receive a `BackendTarget` and either call `BackendTarget.run`
with a coroutine function, or open a `BackendSession` whose event loop lives as long
as a Hypothesis state machine does.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import pytest

from runstore.capabilities import Kind
from runstore.loader import get_backends, get_plugin_manager
from runstore.options import BackendOptions
from runstore.registry import BackendSpec
from runstore.settings import Settings
from runstore.urls import BackendURL

B = TypeVar("B")
R = TypeVar("R")


def in_ci() -> bool:
    """Whether we run under CI (``CI=true``), where an unreachable service fails instead of skipping."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def service_unavailable(what: str, exc: BaseException) -> None:
    """Skip (or fail under CI) because a service a test needs cannot be reached."""
    message = f"{what} is unreachable ({type(exc).__name__}: {exc})"
    if in_ci():
        pytest.fail(f"{message}; CI=true requires every service", pytrace=False)
    pytest.skip(message)


class NotImplementedYet(BaseException):
    """The backend raised NotImplementedError (a method not written yet, as in a
    `runstore new-plugin` skeleton). A BaseException, so Hypothesis stops at once instead
    of shrinking an example that every input fails the same way."""


@contextmanager
def not_implemented_stops_the_test() -> Iterator[None]:
    """Turn a backend's NotImplementedError into `NotImplementedYet`."""
    try:
        yield
    except NotImplementedError as exc:
        raise NotImplementedYet(f"NotImplementedError: {exc} (not written yet)") from exc


class Provisioned:
    """An isolated URL for one test session, from the plugin's provisioning hook."""

    def __init__(self, url: BackendURL) -> None:
        self.named_url = url
        self.url = url
        self._runner: asyncio.Runner | None = None
        self._stack: AsyncExitStack | None = None

    def __enter__(self) -> Provisioned:
        try:
            return self.enter()
        except (OSError, ConnectionError) as exc:
            service_unavailable(f"the server behind {self.named_url}", exc)
            raise

    def enter(self) -> Provisioned:
        """Provision, letting every error through (the preflight reports an unreachable server)."""
        manager: AbstractAsyncContextManager[BackendURL] | None = (
            get_plugin_manager().hook.runstore_conformance_provision(url=self.named_url)
        )
        if manager is None:
            return self
        runner = asyncio.Runner()
        stack = AsyncExitStack()
        try:
            self.url = runner.run(stack.enter_async_context(manager))
        except BaseException:
            runner.close()
            raise
        self._runner, self._stack = runner, stack
        return self

    def __exit__(self, *exc: object) -> None:
        if self._runner is not None and self._stack is not None:
            try:
                self._runner.run(self._stack.aclose())
            finally:
                self._runner.close()


@dataclass
class BackendTarget(Generic[B]):
    """One backend of one kind under test: its spec, its isolated URL and how to open it."""

    kind: Kind
    spec: BackendSpec[B]
    url: BackendURL
    named_url: BackendURL
    settings: Settings = field(default_factory=Settings)

    @property
    def name(self) -> str:
        """The backend's registered name."""
        return self.spec.name

    def has(self, capability: str) -> bool:
        """Whether the backend declares ``capability``."""
        return self.spec.has(capability)

    def require(self, *capabilities: str) -> None:
        """Skip the calling test unless the backend declares every capability."""
        for capability in capabilities:
            if not self.spec.has(capability):
                pytest.skip(
                    f"{self.kind} backend {self.spec.name!r} does not declare "
                    f"capability {capability!r}"
                )

    def settings_with(self, overrides: Mapping[str, Any] | None) -> Settings:
        """The target's settings with ``overrides`` (shaped like runstore.yaml) applied."""
        return self.settings.merged(overrides or {})

    def opener(
        self, overrides: Mapping[str, Any] | None = None, provided: Mapping[Any, Any] | None = None
    ) -> AbstractAsyncContextManager[B]:
        """An async context manager opening a fresh instance on the isolated URL; ``provided``
        is handed to the factory through `BackendOptions.provide` (a store's index config)."""
        target = self

        class _Open:
            async def __aenter__(self) -> B:
                self._scope = BackendOptions.scope(target.settings_with(overrides))
                options = await self._scope.__aenter__()
                for key, value in (provided or {}).items():
                    options.provide(key, value)
                try:
                    # The registry's lifecycle: options enter / close the backend.
                    backend = await target.spec.open(target.url, options)
                except BaseException:
                    await self._scope.__aexit__(None, None, None)
                    raise
                return backend

            async def __aexit__(self, *exc: Any) -> None:
                await self._scope.__aexit__(*exc)

        return _Open()

    def run(
        self,
        body: Callable[[B], Awaitable[R]],
        *,
        settings: Mapping[str, Any] | None = None,
        provided: Mapping[Any, Any] | None = None,
    ) -> R:
        """Open a fresh instance on a new event loop, await ``body(instance)``, close, return."""

        async def main() -> R:
            async with self.opener(settings, provided) as backend:
                return await body(backend)

        with not_implemented_stops_the_test():
            return asyncio.run(main())

    def session(self, *, settings: Mapping[str, Any] | None = None) -> BackendSession[B]:
        """Open an instance on an event loop that lives until `BackendSession.close`."""
        return BackendSession(self, settings)


class BackendSession(Generic[B]):
    """A backend instance plus the event loop it lives on, for synchronous drivers such as
    Hypothesis state machines. Use as a context manager or call `close`."""

    def __init__(self, target: BackendTarget[B], settings: Mapping[str, Any] | None) -> None:
        self.target = target
        self._runner = asyncio.Runner()
        self._opener = target.opener(settings)
        try:
            self.backend: B = self._runner.run(self._opener.__aenter__())
        except BaseException:
            self._runner.close()
            raise

    def run(self, awaitable: Awaitable[R]) -> R:
        """Run ``awaitable`` to completion on the session's loop."""
        async def wrap() -> R:
            return await awaitable

        with not_implemented_stops_the_test():
            return self._runner.run(wrap())

    def close(self) -> None:
        """Close the instance and the loop."""
        try:
            self._runner.run(self._opener.__aexit__(None, None, None))
        finally:
            self._runner.close()

    def __enter__(self) -> BackendSession[B]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def spec_for(kind: Kind, url: BackendURL) -> BackendSpec[Any] | None:
    """The backend of ``kind`` serving ``url``, or ``None``."""
    registry = get_backends().of(kind)
    return registry.for_url(url) if registry.serves(url) else None
