"""Typed registries that plugins fill from their ``runstore_register_*`` hooks."""

from __future__ import annotations

import importlib.util
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from .capabilities import Kind, validate_capabilities
from .errors import BackendNotFoundError, DuplicateBackendError, MissingDriverError, PluginError
from .urls import BackendURL

if TYPE_CHECKING:
    # Used in the quoted type arguments of the registries below.
    from langgraph.checkpoint.base import BaseCheckpointSaver  # noqa: F401

    from .events import RunEventStore  # noqa: F401
    from .options import BackendOptions
    from .streams import StreamBridge  # noqa: F401

T = TypeVar("T")

#: ``async def factory(url, options) -> backend``: opens one backend instance.
Factory = Callable[[BackendURL, "BackendOptions"], Awaitable[T]]


@dataclass(frozen=True)
class PluginInfo:
    """Where a registration came from: the plugin name and its distribution."""

    name: str
    distribution: str | None = None
    version: str | None = None

    def __str__(self) -> str:
        if self.distribution:
            return f"{self.name} ({self.distribution} {self.version or '?'})"
        return self.name


@dataclass(frozen=True)
class BackendSpec(Generic[T]):
    """One registered backend: what it is called, which URLs it serves, what it can do."""

    kind: Kind
    name: str
    schemes: tuple[str, ...]
    factory: Factory[T] = field(repr=False)
    capabilities: frozenset[str]
    plugin: PluginInfo
    drivers: tuple[str, ...] = ()
    extra: str | None = None
    description: str = ""

    def missing_driver(self) -> str | None:
        """Return the first driver module that cannot be imported, or ``None``."""
        for module in self.drivers:
            if importlib.util.find_spec(module) is None:
                return module
        return None

    def has(self, capability: str) -> bool:
        """Whether this backend declares ``capability``."""
        return capability in self.capabilities

    async def open(self, url: BackendURL, options: BackendOptions) -> T:
        """Open an instance, raising `MissingDriverError` first if a driver is absent."""
        module = self.missing_driver()
        if module is not None:
            raise MissingDriverError(self.name, module, self.extra or self.name)
        return await self.factory(url, options)


class BackendRegistry(Generic[T]):
    """The backends of one kind, by name and by URL scheme."""

    kind: ClassVar[Kind]

    def __init__(self) -> None:
        self._by_name: dict[str, BackendSpec[T]] = {}
        self._by_scheme: dict[str, BackendSpec[T]] = {}
        self._plugin = PluginInfo("<direct>")

    def add(
        self,
        name: str,
        *,
        schemes: Iterable[str],
        factory: Factory[T],
        capabilities: Iterable[str] = (),
        drivers: Iterable[str] = (),
        extra: str | None = None,
        description: str = "",
    ) -> BackendSpec[T]:
        """Register a backend; a name or scheme already taken raises `DuplicateBackendError`."""
        where = f"{self.kind} backend {name!r} from plugin {self._plugin}"
        scheme_list = tuple(s.lower() for s in schemes)
        if not name or not scheme_list:
            raise PluginError(f"{where}: a backend needs a name and at least one URL scheme")
        spec = BackendSpec(
            kind=self.kind,
            name=name,
            schemes=scheme_list,
            factory=factory,
            capabilities=validate_capabilities(capabilities, where=where),
            plugin=self._plugin,
            drivers=tuple(drivers),
            extra=extra,
            description=description,
        )
        if name in self._by_name:
            other = self._by_name[name]
            raise DuplicateBackendError(
                f"two plugins register a {self.kind} backend named {name!r}: "
                f"{other.plugin} and {spec.plugin}; disable one with RUNSTORE_DISABLE_PLUGINS"
            )
        for scheme in scheme_list:
            if scheme in self._by_scheme:
                other = self._by_scheme[scheme]
                raise DuplicateBackendError(
                    f"two plugins serve {scheme}:// for {self.kind} backends: "
                    f"{other.name!r} from {other.plugin} and {name!r} from {spec.plugin}; "
                    "disable one with RUNSTORE_DISABLE_PLUGINS"
                )
        self._by_name[name] = spec
        for scheme in scheme_list:
            self._by_scheme[scheme] = spec
        return spec

    def for_url(self, url: BackendURL | str) -> BackendSpec[T]:
        """Return the backend serving ``url``'s scheme or raise `BackendNotFoundError`."""
        parsed = BackendURL.parse(url)
        try:
            return self._by_scheme[parsed.scheme]
        except KeyError:
            raise BackendNotFoundError(str(self.kind), parsed.scheme, self._by_scheme) from None

    def get(self, name: str) -> BackendSpec[T]:
        """Return the backend registered as ``name``."""
        try:
            return self._by_name[name]
        except KeyError:
            raise BackendNotFoundError(str(self.kind), name, self._by_scheme) from None

    def serves(self, url: BackendURL | str) -> bool:
        """Whether some backend of this kind serves ``url``'s scheme."""
        return BackendURL.parse(url).scheme in self._by_scheme

    def __iter__(self) -> Iterator[BackendSpec[T]]:
        return iter(sorted(self._by_name.values(), key=lambda s: s.name))

    def __len__(self) -> int:
        return len(self._by_name)


class SaverRegistry(BackendRegistry["BaseCheckpointSaver[Any]"]):
    """Checkpoint savers (``runstore_register_savers``)."""

    kind = Kind.SAVER


class EventStoreRegistry(BackendRegistry["RunEventStore"]):
    """Run event stores (``runstore_register_event_stores``)."""

    kind = Kind.EVENTS


class StreamBridgeRegistry(BackendRegistry["StreamBridge"]):
    """Stream bridges (``runstore_register_stream_bridges``)."""

    kind = Kind.STREAMS


class HistoryCacheRegistry(BackendRegistry[Any]):
    """Delta-history cache backends (``runstore_register_history_caches``)."""

    kind = Kind.HISTORY_CACHE


@dataclass
class Backends:
    """Every registered backend, one registry per kind."""

    savers: SaverRegistry = field(default_factory=SaverRegistry)
    events: EventStoreRegistry = field(default_factory=EventStoreRegistry)
    streams: StreamBridgeRegistry = field(default_factory=StreamBridgeRegistry)
    history_caches: HistoryCacheRegistry = field(default_factory=HistoryCacheRegistry)

    def of(self, kind: Kind | str) -> BackendRegistry[Any]:
        """Return the registry of ``kind``."""
        registries: dict[Kind, BackendRegistry[Any]] = {
            Kind.SAVER: self.savers,
            Kind.EVENTS: self.events,
            Kind.STREAMS: self.streams,
            Kind.HISTORY_CACHE: self.history_caches,
        }
        return registries[Kind(kind)]

    def all(self) -> Iterator[BackendSpec[Any]]:
        """Every backend of every kind."""
        for kind in Kind:
            yield from self.of(kind)
