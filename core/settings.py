"""Settings: defaults, the YAML file, ``RUNSTORE_*`` environment variables and mappings.

Later sources override earlier ones: defaults < YAML file < environment < mapping
< keyword URLs. Unknown keys and bad values raise `ConfigError` naming the key and
what it accepts.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .errors import ConfigError
from .urls import BackendURL, redact

#: The embedded default: one sqlite file for checkpoints and events, memory streams.
DEFAULT_DATABASE_URL = "sqlite:///.runstore/runstore.db"
DEFAULT_STREAMS_URL = "memory://"
CONFIG_FILE = "runstore.yaml"
CONFIG_ENV = "RUNSTORE_CONFIG"


def _at_least(minimum: float) -> dict[str, float]:
    return {"min": minimum}


@dataclass(frozen=True)
class CheckpointDeltaSettings:
    """``checkpoint_delta``: delta-mode tuning, frozen with the mode."""

    snapshot_frequency: int = field(default=10, metadata=_at_least(1))


@dataclass(frozen=True)
class CheckpointGraphCacheSettings:
    """``checkpoint_graph_cache``: graphs the state accessor keeps compiled."""

    accessor_graph_max: int = field(default=64, metadata=_at_least(1))


@dataclass(frozen=True)
class CheckpointCacheSettings:
    """``checkpoint_cache``: the delta history cache (``max_entries: 0`` disables it)."""

    type: str = "memory"
    max_entries: int = field(default=128, metadata=_at_least(0))
    ttl_seconds: int = field(default=86400, metadata=_at_least(1))
    key_prefix: str | None = None
    url: str | None = None


@dataclass(frozen=True)
class RunEventSettings:
    """``run_events``: event store limits."""

    max_trace_content: int = field(default=10240, metadata=_at_least(1))


@dataclass(frozen=True)
class StreamBridgeSettings:
    """``stream_bridge``: retention and cadence of live run streams."""

    queue_maxsize: int = field(default=256, metadata=_at_least(1))
    heartbeat_interval_seconds: float = field(default=15.0, metadata={"min": 0.001})
    stream_ttl_seconds: int = field(default=86400, metadata=_at_least(1))
    late_subscriber_window_seconds: float = field(default=60.0, metadata=_at_least(0))


@dataclass(frozen=True)
class SqliteSettings:
    """``sqlite``: durability and locking of sqlite files.

    ``synchronous: normal`` (WAL) survives an application crash but may lose the last
    commits on power loss; ``full`` fsyncs every commit like the stock LangGraph saver.
    """

    synchronous: Literal["normal", "full"] = "normal"
    busy_timeout_ms: int = field(default=5000, metadata=_at_least(0))


@dataclass(frozen=True)
class PostgresSettings:
    """``postgres``: connection pool of the asyncpg backends."""

    pool_min_size: int = field(default=1, metadata=_at_least(0))
    pool_max_size: int = field(default=10, metadata=_at_least(1))
    pool_recycle_seconds: float = field(default=300.0, metadata=_at_least(0))
    command_timeout_seconds: float = field(default=60.0, metadata={"min": 0.001})
    #: ``synchronous_commit`` of the checkpoint saver's writes. ``off`` returns before the
    #: WAL flush: survives an application crash, may lose the last commits (~0.6 s) if the
    #: PostgreSQL server crashes; never corrupts. ``on`` (default) waits for the flush.
    saver_synchronous_commit: Literal["on", "off"] = "on"


@dataclass(frozen=True)
class RedisSettings:
    """``redis``: client pool of the Redis backends."""

    max_connections: int = field(default=64, metadata=_at_least(1))


@dataclass(frozen=True)
class Settings:
    """Everything configurable in runstore; see the settings table in the README."""

    checkpointer: str = DEFAULT_DATABASE_URL
    events: str = DEFAULT_DATABASE_URL
    streams: str = DEFAULT_STREAMS_URL
    checkpoint_channel_mode: Literal["full", "delta"] = "full"
    checkpoint_delta: CheckpointDeltaSettings = field(default_factory=CheckpointDeltaSettings)
    checkpoint_graph_cache: CheckpointGraphCacheSettings = field(
        default_factory=CheckpointGraphCacheSettings
    )
    checkpoint_cache: CheckpointCacheSettings = field(default_factory=CheckpointCacheSettings)
    run_events: RunEventSettings = field(default_factory=RunEventSettings)
    stream_bridge: StreamBridgeSettings = field(default_factory=StreamBridgeSettings)
    sqlite: SqliteSettings = field(default_factory=SqliteSettings)
    postgres: PostgresSettings = field(default_factory=PostgresSettings)
    redis: RedisSettings = field(default_factory=RedisSettings)

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
        return _build(cls, merged, prefix="")

    def merged(self, changes: Mapping[str, Any]) -> Settings:
        """Return a copy with ``changes`` (shaped like the YAML file) applied and validated."""
        data = dataclasses.asdict(self)
        _deep_merge(data, changes, "arguments")
        return _build(Settings, data, prefix="")

    def public_dict(self) -> dict[str, Any]:
        """The settings as plain data with every password masked (for logs and the CLI)."""
        data = dataclasses.asdict(self)
        for key in ("checkpointer", "events", "streams"):
            data[key] = redact(data[key])
        if data["checkpoint_cache"]["url"]:
            data["checkpoint_cache"]["url"] = redact(data["checkpoint_cache"]["url"])
        return data

    def url(self, kind: Literal["checkpointer", "events", "streams"]) -> BackendURL:
        """The parsed URL selected for ``kind``."""
        return BackendURL.parse(getattr(self, kind))


def read_yaml(path: Path) -> Mapping[str, Any]:
    """Read a runstore YAML file; an unreadable file or non-mapping document is a `ConfigError`."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data


def from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """Read ``RUNSTORE_*`` variables: ``RUNSTORE_EVENTS_URL``, ``RUNSTORE_STREAM_BRIDGE__QUEUE_MAXSIZE``..."""
    out: dict[str, Any] = {}
    hints = typing.get_type_hints(Settings)
    sections = {name for name, typ in hints.items() if dataclasses.is_dataclass(typ)}
    for name, value in env.items():
        if not name.startswith("RUNSTORE_"):
            continue
        key = name[len("RUNSTORE_") :].lower()
        if key in ("checkpointer_url", "events_url", "streams_url"):
            out[key[: -len("_url")]] = value
        elif key == "checkpoint_channel_mode":
            out[key] = value
        elif "__" in key:
            section, _, sub = key.partition("__")
            if section in sections:
                out.setdefault(section, {})[sub] = value
    return out


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
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - fields.keys())
    if unknown:
        where = f"section {prefix.rstrip('.')!r}" if prefix else "the top level"
        raise ConfigError(
            f"unknown config key '{prefix}{unknown[0]}' in {where}; accepted: "
            f"{', '.join(sorted(fields))}"
        )
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
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
        for kind in ("checkpointer", "events", "streams"):
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
        number: Any
        if isinstance(value, bool):
            number = None
        elif isinstance(value, int | float):
            number = value
        elif isinstance(value, str):
            try:
                number = typ(value.strip())
            except ValueError:
                number = None
        else:
            number = None
        if number is None or (typ is int and number != int(number)):
            raise ConfigError(f"config key {key!r} must be {'an integer' if typ is int else 'a number'}; got {value!r}")
        number = typ(number)
        if "min" in meta and number < meta["min"]:
            raise ConfigError(f"config key {key!r} must be >= {meta['min']}; got {value!r}")
        return number
    if typ is str:
        if not isinstance(value, str):
            raise ConfigError(f"config key {key!r} must be a string; got {value!r}")
        return value
    raise ConfigError(f"config key {key!r} has an unsupported type")  # pragma: no cover
