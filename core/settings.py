"""Settings: defaults, the YAML file, ``RUNSTORE_*`` environment variables and mappings.

Later sources override earlier ones: defaults < YAML file < environment < mapping
< keyword URLs. Unknown keys and bad values raise `ConfigError` naming the key and
what it accepts. Besides the built-in sections, each plugin may declare its own
(``runstore_register_settings``); they are read and validated by the same rules and
reached with `Settings.section`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from runstore.errors import ConfigError, InvalidURLError, PluginError
from runstore.redaction import masked_repr, redact
from runstore.urls import BackendURL

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

S = TypeVar("S", bound="DataclassInstance")

#: The embedded default: one sqlite file for checkpoints, events, runs and the long-term
#: memory store; memory streams.
DEFAULT_DATABASE_URL = "sqlite:///.runstore/runstore.db"
DEFAULT_STREAMS_URL = "memory://"
DEFAULT_STORE_URL = DEFAULT_DATABASE_URL
CONFIG_FILE = "runstore.yaml"
CONFIG_ENV = "RUNSTORE_CONFIG"
#: The top-level keys that hold one backend URL each.
URL_KEYS = ("checkpointer", "events", "streams", "runs", "store")


#: The largest value an int setting accepts unless its field says otherwise: every count,
#: size and millisecond figure fits a C int, which is what drivers hand them to.
MAX_INT_SETTING = 2**31 - 1
#: The largest value a float setting (a duration in seconds) accepts unless its field
#: says otherwise: about 31 years, far below what timers and Redis expiries overflow at.
MAX_FLOAT_SETTING = 10**9


def bounds(minimum: float | None = None, maximum: float | None = None) -> dict[str, float]:
    """Field metadata giving a number setting its accepted range (both ends inclusive).

    Use as ``field(default=..., metadata=bounds(1))``; without a maximum an int
    accepts up to `MAX_INT_SETTING` and a float up to `MAX_FLOAT_SETTING`.
    """
    meta: dict[str, float] = {}
    if minimum is not None:
        meta["min"] = minimum
    if maximum is not None:
        meta["max"] = maximum
    return meta



@dataclass(frozen=True)
class CheckpointDeltaSettings:
    """``checkpoint_delta``: delta-mode tuning, frozen with the mode."""

    snapshot_frequency: int = field(default=10, metadata=bounds(1))


@dataclass(frozen=True)
class CheckpointGraphCacheSettings:
    """``checkpoint_graph_cache``: graphs the state accessor keeps compiled."""

    accessor_graph_max: int = field(default=64, metadata=bounds(1))


@dataclass(frozen=True)
class CheckpointCacheSettings:
    """``checkpoint_cache``: the delta history cache (``max_entries: 0`` disables it).

    ``enabled: auto`` wraps a delta-mode saver unless its class says the cache does not
    pay for it (``history_cache_helps = False``: runstore's sqlite and PostgreSQL savers,
    which read a thread's delta history in one trip); ``on`` wraps every saver, ``off`` none.
    """

    enabled: Literal["auto", "on", "off"] = "auto"
    type: str = "memory"
    max_entries: int = field(default=128, metadata=bounds(0))
    ttl_seconds: int = field(default=86400, metadata=bounds(1))
    key_prefix: str | None = None
    url: str | None = None

    __repr__ = masked_repr


@dataclass(frozen=True)
class RunEventSettings:
    """``run_events``: event store limits."""

    max_trace_content: int = field(default=10240, metadata=bounds(1))


@dataclass(frozen=True)
class StreamBridgeSettings:
    """``stream_bridge``: retention and cadence of live run streams."""

    queue_maxsize: int = field(default=256, metadata=bounds(1))
    heartbeat_interval_seconds: float = field(default=15.0, metadata=bounds(0.001))
    stream_ttl_seconds: int = field(default=86400, metadata=bounds(1))
    late_subscriber_window_seconds: float = field(default=60.0, metadata=bounds(0))


@dataclass(frozen=True)
class RetentionSettings:
    """``retention``: the default retention policy and the sweeper's pace (docs/threads.md).

    ``null`` lifts a limit; with all three unset a sweep removes nothing.
    """

    keep_last: int | None = field(default=None, metadata=bounds(1))
    max_age_seconds: float | None = field(default=None, metadata=bounds(1))
    idle_ttl_seconds: float | None = field(default=None, metadata=bounds(1))
    batch_size: int = field(default=100, metadata=bounds(1, 10_000))
    interval_seconds: float = field(default=300.0, metadata=bounds(1))
    claim_seconds: float = field(default=300.0, metadata=bounds(1))


@dataclass(frozen=True)
class Settings:
    """Everything configurable in runstore; see the settings table in the README."""

    checkpointer: str = DEFAULT_DATABASE_URL
    events: str = DEFAULT_DATABASE_URL
    streams: str = DEFAULT_STREAMS_URL
    runs: str = DEFAULT_DATABASE_URL
    store: str = DEFAULT_STORE_URL
    checkpoint_channel_mode: Literal["full", "delta"] = "full"
    checkpoint_delta: CheckpointDeltaSettings = field(default_factory=CheckpointDeltaSettings)
    checkpoint_graph_cache: CheckpointGraphCacheSettings = field(
        default_factory=CheckpointGraphCacheSettings
    )
    checkpoint_cache: CheckpointCacheSettings = field(default_factory=CheckpointCacheSettings)
    run_events: RunEventSettings = field(default_factory=RunEventSettings)
    stream_bridge: StreamBridgeSettings = field(default_factory=StreamBridgeSettings)
    retention: RetentionSettings = field(default_factory=RetentionSettings)
    #: The plugins' sections as ``(name, value)`` pairs sorted by name; read with `section`.
    _sections: tuple[tuple[str, Any], ...] = ()
    #: The URL keys some source set (defaults aside); see `selected_kinds`.
    _urls_set: frozenset[str] = field(default=frozenset(), repr=False, compare=False)

    __repr__ = masked_repr

    @classmethod
    def load(
        cls,
        config: Mapping[str, Any] | str | os.PathLike[str] | Settings | None = None,
        *,
        env: Mapping[str, str] | None = None,
        **overrides: Any,
    ) -> Settings:
        """Build settings from the YAML file, the environment, ``config`` and ``overrides``.

        ``config`` may be a mapping shaped like the YAML file, a path to a YAML file,
        or a `Settings` (returned with ``overrides`` applied). ``overrides`` are
        top-level keys such as ``events="memory://"``; ``None`` values are ignored.
        """
        overrides = {k: v for k, v in overrides.items() if v is not None}
        if isinstance(config, Settings):
            return config.merged(overrides)
        env = os.environ if env is None else env
        layers: list[tuple[str, Mapping[str, Any]]] = []
        if isinstance(config, str | os.PathLike):
            layers.append((str(config), read_yaml(Path(config))))
            config = None
        elif env.get(CONFIG_ENV):
            layers.append((env[CONFIG_ENV], read_yaml(Path(env[CONFIG_ENV]))))
        elif Path(CONFIG_FILE).is_file():
            layers.append((CONFIG_FILE, read_yaml(Path(CONFIG_FILE))))
        layers.append(("environment", from_env(env)))
        if config is not None:
            if not isinstance(config, Mapping):
                raise ConfigError(
                    f"config must be a mapping, a YAML path or Settings, not {type(config).__name__}"
                )
            layers.append(("config", config))
        layers.append(("arguments", overrides))
        merged: dict[str, Any] = {}
        for source, layer in layers:
            _deep_merge(merged, layer, source)
        urls_set = frozenset(k for k in URL_KEYS if merged.get(k) is not None)
        return dataclasses.replace(_build(cls, merged, prefix=""), _urls_set=urls_set)

    def merged(self, changes: Mapping[str, Any]) -> Settings:
        """Return a copy with ``changes`` (shaped like the YAML file) applied and validated."""
        data = self._data()
        _deep_merge(data, changes, "arguments")
        urls_set = self._urls_set | {k for k in URL_KEYS if changes.get(k) is not None}
        return dataclasses.replace(_build(Settings, data, prefix=""), _urls_set=urls_set)

    def selected_kinds(self) -> tuple[str, ...]:
        """The kinds `runstore.open` opens: those whose URL some source set (or that differ
        from the default); all of them, the embedded default, when none is."""
        defaults = Settings()
        chosen = tuple(
            kind for kind in URL_KEYS
            if kind in self._urls_set or getattr(self, kind) != getattr(defaults, kind)
        )
        return chosen or URL_KEYS

    def section(self, schema: type[S]) -> S:
        """The plugin settings section whose dataclass is ``schema`` (its defaults if not set).

        A plugin declares the section with ``runstore_register_settings`` and reads it
        here, e.g. ``options.settings.section(SqliteSettings).busy_timeout_ms``.
        """
        for _, value in self._sections:
            if type(value) is schema:
                return value
        return schema()

    def section_values(self, name: str) -> dict[str, Any]:
        """Plugin section ``name`` as plain data (its defaults if not set; ``{}`` if undeclared)."""
        for key, value in self._sections:
            if key == name:
                return dataclasses.asdict(value)
        declared = _plugin_sections().get(name)
        return dataclasses.asdict(declared.schema()) if declared is not None else {}

    def public_dict(self) -> dict[str, Any]:
        """The settings as plain data with every password masked (for logs and the CLI).

        Every declared plugin section is listed, with its defaults when not set.
        """
        data = self._data()
        for declared in _plugin_sections():
            data.setdefault(declared.name, dataclasses.asdict(declared.schema()))
        for key in URL_KEYS:
            data[key] = redact(data[key])
        if data["checkpoint_cache"]["url"]:
            data["checkpoint_cache"]["url"] = redact(data["checkpoint_cache"]["url"])
        return data

    def _data(self) -> dict[str, Any]:
        """The settings shaped like the YAML file (plugin sections at the top level)."""
        data: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name.startswith("_"):
                continue
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                data[f.name] = dataclasses.asdict(value)
            else:
                data[f.name] = value
        for name, value in self._sections:
            data[name] = dataclasses.asdict(value)
        return data

    def url(self, kind: Literal["checkpointer", "events", "streams", "runs", "store"]) -> BackendURL:
        """The parsed URL selected for ``kind``."""
        return BackendURL.parse(getattr(self, kind))


def read_yaml(path: Path) -> Mapping[str, Any]:
    """Read a runstore YAML file; an unreadable, non-UTF-8 or non-mapping file is a `ConfigError`."""
    import yaml

    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {path} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset "
            f"{exc.start}); runstore reads YAML config files as UTF-8"
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {_yaml_problem(exc, text)}") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data


def _yaml_problem(exc: Exception, text: str) -> str:
    """The parser's complaint, and for the usual cause (an unquoted URL holding ``: `` or
    ending in ``:``) the line and how to write it."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if mark is None:
        return str(exc)
    line = text.splitlines()[mark.line] if mark.line < len(text.splitlines()) else ""
    where = f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    key, colon, value = line.partition(":")
    value = value.strip()
    if colon and value and (": " in value or value.endswith(":")) and value[0] not in "\"'":
        return (
            f"{where}; a value containing ': ' or ending in ':' must be quoted, "
            f"e.g. {key.strip()}: \"{redact(value)}\""
        )
    return where


def from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """Read ``RUNSTORE_*`` variables: ``RUNSTORE_EVENTS_URL``, ``RUNSTORE_STREAM_BRIDGE__QUEUE_MAXSIZE``..."""
    out: dict[str, Any] = {}
    builtin = _builtin_sections()
    plugin: set[str] | None = None
    for name, value in env.items():
        if not name.startswith("RUNSTORE_"):
            continue
        key = name[len("RUNSTORE_") :].lower()
        if key in ("checkpointer_url", "events_url", "streams_url", "runs_url", "store_url"):
            out[key[: -len("_url")]] = value
        elif key == "checkpoint_channel_mode":
            out[key] = value
        elif "__" in key:
            section, _, sub = key.partition("__")
            if section not in builtin and plugin is None:
                plugin = {declared.name for declared in _plugin_sections()}
            if section in builtin or (plugin is not None and section in plugin):
                out.setdefault(section, {})[sub] = value
    return out


def _builtin_sections() -> set[str]:
    hints = typing.get_type_hints(Settings)
    return {name for name, typ in hints.items() if dataclasses.is_dataclass(typ)}


class DeclaredSection(Protocol):
    """What configuration reads of a section a plugin declares (`runstore.registry` keeps them)."""

    name: str
    schema: type[DataclassInstance]
    plugin: Any


class DeclaredSections(Protocol):
    """The plugins' sections by name, as configuration reads them."""

    def get(self, name: str) -> DeclaredSection | None:
        """The section called ``name``, or ``None``."""

    def __iter__(self) -> Iterator[DeclaredSection]:
        """Every declared section."""


def _plugin_sections() -> DeclaredSections:
    """The settings sections plugins declare.

    Configuration does not discover plugins itself: the package root does, on first use
    (`runstore.plugin_settings_sections`), so this module depends on no plugin machinery.
    """
    import runstore

    sections: DeclaredSections = runstore.plugin_settings_sections()
    reserved = {f.name for f in dataclasses.fields(Settings)}
    for declared in sections:
        if declared.name in reserved:
            raise PluginError(
                f"plugin {declared.plugin} declares the settings section {declared.name!r}, "
                "which is a built-in key"
            )
        for name, typ in typing.get_type_hints(declared.schema).items():
            if not _supported(typ):
                raise PluginError(
                    f"settings section {declared.name!r} of plugin {declared.plugin}: key "
                    f"{name!r} has type {typ}; accepted: int, float, str, Literal[...], X | None"
                )
    return sections


def _supported(typ: Any) -> bool:
    origin = typing.get_origin(typ)
    if origin in (types.UnionType, typing.Union):
        return all(_supported(a) for a in typing.get_args(typ) if a is not type(None))
    return origin is Literal or typ in (int, float, str)


def _deep_merge(into: dict[str, Any], layer: Mapping[str, Any], source: str) -> None:
    for key, value in layer.items():
        if not isinstance(key, str):
            raise ConfigError(f"config keys must be strings, got {key!r} (from {source})")
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _deep_merge(into[key], value, source)
        elif isinstance(value, Mapping):
            into[key] = {}
            _deep_merge(into[key], value, source)
        else:
            into[key] = value


def _build(cls: type[Any], data: Mapping[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.name.startswith("_")}
    kwargs: dict[str, Any] = {}
    unknown = sorted(set(data) - fields.keys())
    if unknown and cls is Settings:
        declared = _plugin_sections()
        sections = []
        for name in unknown:
            section = declared.get(name)
            if section is None:
                accepted = sorted([*fields, *(d.name for d in declared)])
                raise ConfigError(
                    f"unknown config key '{name}' in the top level; accepted: {', '.join(accepted)}"
                )
            value = data[name]
            if not isinstance(value, Mapping):
                raise ConfigError(f"config key {name!r} is a section; give it a mapping")
            sections.append((name, _build(section.schema, value, prefix=f"{name}.")))
        kwargs["_sections"] = tuple(sorted(sections))
    elif unknown:
        raise ConfigError(
            f"unknown config key '{prefix}{unknown[0]}' in section {prefix.rstrip('.')!r}; "
            f"accepted: {', '.join(sorted(fields))}"
        )
    for name, value in data.items():
        if name not in fields:
            continue
        typ = hints[name]
        key = f"{prefix}{name}"
        if dataclasses.is_dataclass(typ):
            if not isinstance(value, Mapping):
                raise ConfigError(f"config key {key!r} is a section; give it a mapping")
            kwargs[name] = _build(typ, value, prefix=f"{key}.")  # type: ignore[arg-type]
        else:
            kwargs[name] = _coerce(value, typ, key, fields[name].metadata)
    settings = cls(**kwargs)
    if cls is Settings:
        for kind in URL_KEYS:
            BackendURL.parse(getattr(settings, kind))
    return settings


def _coerce(value: Any, typ: Any, key: str, meta: Mapping[str, Any]) -> Any:
    origin = typing.get_origin(typ)
    args = typing.get_args(typ)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _coerce(value, inner, key, meta)
    if origin is Literal:
        if isinstance(value, bool) and {"on", "off"} <= set(args):
            # YAML 1.1 (PyYAML, `--set`) reads a bare on/off as a boolean.
            return "on" if value else "off"
        if isinstance(value, str) and value.lower() in args:
            return value.lower()
        raise ConfigError(
            f"config key {key!r} must be one of {', '.join(map(str, args))}; got {value!r}"
        )
    if typ is bool:
        raise ConfigError(f"config key {key!r}: boolean settings are not supported")
    if typ in (int, float):
        return _number(value, typ, key, meta)
    if typ is str:
        if not isinstance(value, str):
            raise ConfigError(f"config key {key!r} must be a string; got {value!r}")
        return value
    raise ConfigError(f"config key {key!r} has an unsupported type")  # pragma: no cover


def accepted_values(typ: Any, meta: Mapping[str, Any]) -> str:
    """What a setting of type ``typ`` with field metadata ``meta`` accepts, in words."""
    origin = typing.get_origin(typ)
    if origin in (types.UnionType, typing.Union):
        inner = [a for a in typing.get_args(typ) if a is not type(None)]
        return " or ".join(accepted_values(a, meta) for a in inner) + " or null"
    if origin is Literal:
        return "one of " + ", ".join(map(str, typing.get_args(typ)))
    if typ in (int, float):
        low = meta.get("min")
        high = meta.get("max", MAX_INT_SETTING if typ is int else MAX_FLOAT_SETTING)
        kind = "an integer" if typ is int else "a number"
        return f"{kind} from {low} to {high}" if low is not None else f"{kind} up to {high}"
    return "a string"


def _number(value: Any, typ: type[int] | type[float], key: str, meta: Mapping[str, Any]) -> Any:
    """``value`` as a finite int/float within the field's bounds, or a `ConfigError` saying which."""
    low = meta.get("min")
    high = meta.get("max", MAX_INT_SETTING if typ is int else MAX_FLOAT_SETTING)
    accepted = accepted_values(typ, meta)
    number: Any = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str):
        try:
            number = typ(value.strip())
        except ValueError:
            number = None
    if (
        number is None
        or not math.isfinite(number)
        or (typ is int and number != int(number))
    ):
        raise ConfigError(f"config key {key!r} must be {accepted}; got {value!r}")
    number = typ(number)
    if low is not None and number < low:
        raise ConfigError(f"config key {key!r} must be >= {low}; got {value!r}")
    if number > high:
        raise ConfigError(f"config key {key!r} must be {accepted}; got {value!r}")
    return number


def seconds_with_url(url: BackendURL, section: Any, names: Sequence[str]) -> dict[str, float]:
    """``section``'s ``<name>_seconds`` settings with ``url``'s ``<name>`` options applied.

    A URL option is checked against the same bounds as its setting (the field's
    `bounds`); a bad one is an `InvalidURLError` naming it and what it accepts. So every
    backend whose URL can override a duration accepts and refuses the same values.
    """
    meta = {f.name: f.metadata for f in dataclasses.fields(section)}
    values: dict[str, float] = {}
    for name in names:
        key = f"{name}_seconds"
        raw = url.option(name)
        if raw is None:
            values[name] = float(getattr(section, key))
            continue
        try:
            values[name] = float(_number(raw, float, key, meta[key]))
        except ConfigError:
            raise InvalidURLError(
                f"URL option {name}={raw!r} in {url}: must be {accepted_values(float, meta[key])} (seconds)"
            ) from None
    return values


@dataclass(frozen=True)
class OptionValues:
    """A settings section's values for some keys with a URL's options of the same names
    applied, and where each value came from, for messages (`with_url_options`)."""

    values: Mapping[str, Any]
    origins: Mapping[str, str]

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def problem(self, name: str, message: str) -> InvalidURLError | ConfigError:
        """The error for a bad ``name``: `InvalidURLError` if the URL gave it, else `ConfigError`,
        saying where it came from and ``message``."""
        where = self.origins[name]
        error = InvalidURLError if where.startswith("URL") else ConfigError
        return error(f"{where}: {message}")


def with_url_options(url: BackendURL, section: Any, section_name: str, names: Sequence[str]) -> OptionValues:
    """``section``'s ``names`` with ``url``'s options of the same names applied (the URL wins)."""
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for name in names:
        raw = url.option(name)
        if raw is not None:
            values[name], origins[name] = raw, f"URL option {name}={raw!r} in {url}"
        else:
            value = getattr(section, name)
            values[name], origins[name] = value, f"config key '{section_name}.{name}' ({value!r})"
    return OptionValues(values, origins)
