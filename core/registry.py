"""Typed registries that plugins fill from their ``runstore_register_*`` hooks.

The loader keeps one table per kind (`BackendRegistry`) and one of settings sections
(`SettingsSections`). A plugin's hook never sees a table: it receives a view scoped
to that plugin (`SaverRegistry`, `EventStoreRegistry`, ..., `SettingsRegistry`) whose
``add`` records every registration as coming from it.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import re
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, cast

from runstore.capabilities import Kind, validate_capabilities
from runstore.errors import (
    BackendNotFoundError,
    DuplicateBackendError,
    MissingDriverError,
    PluginError,
)
from runstore.urls import BackendURL

if TYPE_CHECKING:
    # Used in the quoted type arguments of the registries below.
    from _typeshed import DataclassInstance
    from langgraph.checkpoint.base import BaseCheckpointSaver
    from langgraph.store.base import BaseStore

    from runstore.events.protocol import RunEventStore
    from runstore.options import BackendOptions
    from runstore.runs.protocol import RunStore
    from runstore.streams.protocol import StreamBridge

T = TypeVar("T")

#: ``async def factory(url, options) -> backend``: opens one backend instance.
Factory = Callable[[BackendURL, "BackendOptions"], Awaitable[T]]

#: How a factory is named instead of passed: ``"package.module:attr"`` with a dotted
#: ``attr`` (``"runstore.plugins.sqlite.saver:SqliteSaver.open"``), the object reference
#: syntax of entry points. The named object is the factory itself.
_FACTORY_REF = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def check_factory(factory: object, *, where: str) -> None:
    """Refuse a ``factory`` that is neither callable nor a well-formed ``"package.module:attr"``
    reference, with `PluginError` (nothing is imported)."""
    if isinstance(factory, str) and _FACTORY_REF.fullmatch(factory):
        return
    if callable(factory) and not isinstance(factory, str):
        return
    raise PluginError(
        f"{where}: factory must be an async callable (url, options) -> backend or a "
        f"'package.module:attr' reference naming one (e.g. 'acme_runstore.saver:AcmeSaver.open'), "
        f"not {factory!r}"
    )


def resolve_factory(ref: str, *, where: str = "factory") -> Callable[..., Any]:
    """Import the object ``ref`` (``"package.module:attr"``) names and return it.

    Raises `PluginError`, with the import's error as its cause, when the module or the
    attribute is missing or names something that is not callable.
    """
    check_factory(ref, where=where)
    module_name, _, attr_path = ref.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for attr in attr_path.split("."):
            target = getattr(target, attr)
    except (ImportError, AttributeError) as exc:
        raise PluginError(f"{where}: cannot import its factory {ref!r}: {exc}") from exc
    if not callable(target):
        raise PluginError(f"{where}: factory {ref!r} names {target!r}, which is not callable")
    return cast("Callable[..., Any]", target)


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
    #: The async callable that opens an instance, or its ``"package.module:attr"`` name
    #: (imported on first open, so listing backends imports no backend module).
    factory: Factory[T] | str = field(repr=False)
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

    def describe(self) -> str:
        """``saver backend 'sqlite' from plugin sqlite (runstore 0.1.0)``: for messages."""
        return f"{self.kind} backend {self.name!r} from plugin {self.plugin}"

    def opener(self) -> Factory[T]:
        """The factory as a callable, importing it first when it was registered by name."""
        if isinstance(self.factory, str):
            return cast("Factory[T]", resolve_factory(self.factory, where=self.describe()))
        return self.factory

    async def open(self, url: BackendURL, options: BackendOptions) -> T:
        """Open an instance, raising `MissingDriverError` first if a driver is absent.

        ``options`` takes charge of closing it (`BackendOptions.adopt`): it closes when
        they do, whatever the kind. A saver is then held to the methods of the
        capabilities it declares (`runstore.checkpoint.contracts`): one lacking any is
        refused with `PluginError` naming them (and closes with ``options``).
        """
        module = self.missing_driver()
        if module is not None:
            raise MissingDriverError(self.name, module, self.extra or self.name)
        backend: T = await options.adopt(await self.opener()(url, options))
        if self.kind is Kind.SAVER:
            from runstore.checkpoint.contracts import check_saver

            check_saver(backend, self.capabilities, where=self.describe())
        return backend


class BackendRegistry(Generic[T]):
    """The backends of one kind, by name and by URL scheme (the loader fills it)."""

    def __init__(self, kind: Kind) -> None:
        self.kind = kind
        self._by_name: dict[str, BackendSpec[T]] = {}
        self._by_scheme: dict[str, BackendSpec[T]] = {}

    def add(
        self,
        name: str,
        *,
        plugin: PluginInfo,
        schemes: Iterable[str],
        factory: Factory[T] | str,
        capabilities: Iterable[str] = (),
        drivers: Iterable[str] = (),
        extra: str | None = None,
        description: str = "",
    ) -> BackendSpec[T]:
        """Register a backend from ``plugin``; a name or scheme already taken raises `DuplicateBackendError`."""
        where = f"{self.kind} backend {name!r} from plugin {plugin}"
        scheme_list = tuple(s.lower() for s in schemes)
        if not name or not scheme_list:
            raise PluginError(f"{where}: a backend needs a name and at least one URL scheme")
        check_factory(factory, where=where)
        spec = BackendSpec(
            kind=self.kind,
            name=name,
            schemes=scheme_list,
            factory=factory,
            capabilities=validate_capabilities(capabilities, where=where),
            plugin=plugin,
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


class _PluginView:
    """A view handed to one plugin's hook: whatever it adds is recorded as the plugin's."""

    def __init__(self, plugin: PluginInfo) -> None:
        self._plugin = plugin

    @property
    def plugin(self) -> PluginInfo:
        """The plugin whose registrations this view records."""
        return self._plugin


class PluginRegistry(_PluginView, Generic[T]):
    """What one plugin's ``runstore_register_*`` hook receives: adds backends of one kind."""

    kind: ClassVar[Kind]

    def __init__(self, table: BackendRegistry[T], plugin: PluginInfo) -> None:
        if table.kind is not self.kind:
            raise TypeError(f"{type(self).__name__} adds {self.kind} backends, not {table.kind}")
        super().__init__(plugin)
        self._table = table

    def add(
        self,
        name: str,
        *,
        schemes: Iterable[str],
        factory: Factory[T] | str,
        capabilities: Iterable[str] = (),
        drivers: Iterable[str] = (),
        extra: str | None = None,
        description: str = "",
    ) -> BackendSpec[T]:
        """Register a backend; a name or scheme already taken raises `DuplicateBackendError`.

        ``factory`` opens an instance: ``async (url, options) -> backend``, given as the
        callable or as its ``"package.module:attr"`` name (``"acme_runstore.saver:AcmeSaver.open"``),
        which runstore imports on the first open. ``drivers`` are modules it imports (a
        missing one makes `BackendSpec.open` raise `MissingDriverError` naming ``extra``,
        the pip extra that installs them).
        """
        return self._table.add(
            name,
            plugin=self._plugin,
            schemes=schemes,
            factory=factory,
            capabilities=capabilities,
            drivers=drivers,
            extra=extra,
            description=description,
        )


class SaverRegistry(PluginRegistry["BaseCheckpointSaver[Any]"]):
    """Adds checkpoint savers (``runstore_register_savers``)."""

    kind = Kind.SAVER


class EventStoreRegistry(PluginRegistry["RunEventStore"]):
    """Adds run event stores (``runstore_register_event_stores``)."""

    kind = Kind.EVENTS


class StreamBridgeRegistry(PluginRegistry["StreamBridge"]):
    """Adds stream bridges (``runstore_register_stream_bridges``)."""

    kind = Kind.STREAMS


class RunStoreRegistry(PluginRegistry["RunStore"]):
    """Adds run stores (``runstore_register_run_stores``)."""

    kind = Kind.RUNS


class HistoryCacheRegistry(PluginRegistry[Any]):
    """Adds delta-history cache backends (``runstore_register_history_caches``)."""

    kind = Kind.HISTORY_CACHE


class StoreRegistry(PluginRegistry["BaseStore"]):
    """Adds long-term memory stores, LangGraph ``BaseStore`` (``runstore_register_stores``)."""

    kind = Kind.STORE


#: How a settings section may be named: lowercase, a ``RUNSTORE_<SECTION>__<KEY>`` prefix.
_SECTION_NAME = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")


@dataclass(frozen=True)
class SettingsSection:
    """A settings section a plugin declares: its name in the config and its dataclass."""

    name: str
    schema: type[DataclassInstance]
    plugin: PluginInfo
    description: str = ""


class SettingsSections:
    """The plugins' settings sections by name (the loader fills it; `runstore.settings` reads it)."""

    def __init__(self) -> None:
        self._by_name: dict[str, SettingsSection] = {}

    def add(
        self,
        name: str,
        schema: type[DataclassInstance],
        *,
        plugin: PluginInfo,
        description: str = "",
    ) -> SettingsSection:
        """Register section ``name`` from ``plugin``; a name already taken raises `PluginError`."""
        where = f"settings section {name!r} from plugin {plugin}"
        if not isinstance(name, str) or not _SECTION_NAME.fullmatch(name):
            raise PluginError(
                f"{where}: a section name is lowercase letters, digits and single underscores, "
                "starting with a letter (it becomes RUNSTORE_<SECTION>__<KEY>)"
            )
        if not (isinstance(schema, type) and dataclasses.is_dataclass(schema)):
            raise PluginError(f"{where}: the schema must be a dataclass, not {schema!r}")
        if not schema.__dataclass_params__.frozen:  # type: ignore[attr-defined]
            raise PluginError(f"{where}: the schema dataclass must be frozen=True")
        if name in self._by_name:
            other = self._by_name[name]
            raise DuplicateBackendError(
                f"two plugins declare the settings section {name!r}: {other.plugin} and "
                f"{plugin}; disable one with RUNSTORE_DISABLE_PLUGINS"
            )
        section = SettingsSection(name, schema, plugin, description)
        self._by_name[name] = section
        return section

    def get(self, name: str) -> SettingsSection | None:
        """The section called ``name``, or ``None``."""
        return self._by_name.get(name)

    def __iter__(self) -> Iterator[SettingsSection]:
        return iter(sorted(self._by_name.values(), key=lambda s: s.name))

    def __len__(self) -> int:
        return len(self._by_name)


class SettingsRegistry(_PluginView):
    """What one plugin's ``runstore_register_settings`` hook receives: declares its sections."""

    def __init__(self, table: SettingsSections, plugin: PluginInfo) -> None:
        super().__init__(plugin)
        self._table = table

    def add(
        self, name: str, schema: type[DataclassInstance], *, description: str = ""
    ) -> SettingsSection:
        """Declare the settings section ``name`` whose keys and defaults are ``schema``'s fields.

        ``schema`` is a frozen dataclass of int, float, str, ``Literal[...]`` or
        ``X | None`` fields; ``field(metadata=runstore.settings.bounds(...))`` sets a
        number's accepted range. The section is then read from YAML, mappings and
        ``RUNSTORE_<NAME>__<KEY>`` variables with the built-in sections' rules, and
        backends read it as ``options.settings.section(schema)``.
        """
        return self._table.add(name, schema, plugin=self._plugin, description=description)


@dataclass
class Backends:
    """Every registered backend, one registry per kind, and the plugins' settings sections."""

    savers: BackendRegistry[BaseCheckpointSaver[Any]] = field(
        default_factory=lambda: BackendRegistry(Kind.SAVER)
    )
    events: BackendRegistry[RunEventStore] = field(
        default_factory=lambda: BackendRegistry(Kind.EVENTS)
    )
    streams: BackendRegistry[StreamBridge] = field(
        default_factory=lambda: BackendRegistry(Kind.STREAMS)
    )
    runs: BackendRegistry[RunStore] = field(default_factory=lambda: BackendRegistry(Kind.RUNS))
    history_caches: BackendRegistry[Any] = field(
        default_factory=lambda: BackendRegistry(Kind.HISTORY_CACHE)
    )
    stores: BackendRegistry[BaseStore] = field(default_factory=lambda: BackendRegistry(Kind.STORE))
    settings: SettingsSections = field(default_factory=SettingsSections)

    def of(self, kind: Kind | str) -> BackendRegistry[Any]:
        """Return the registry of ``kind``."""
        registries: dict[Kind, BackendRegistry[Any]] = {
            Kind.SAVER: self.savers,
            Kind.EVENTS: self.events,
            Kind.STREAMS: self.streams,
            Kind.RUNS: self.runs,
            Kind.HISTORY_CACHE: self.history_caches,
            Kind.STORE: self.stores,
        }
        return registries[Kind(kind)]

    def all(self) -> Iterator[BackendSpec[Any]]:
        """Every backend of every kind."""
        for kind in Kind:
            yield from self.of(kind)
