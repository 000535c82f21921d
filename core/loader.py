"""Plugin discovery: the pluggy manager, the ``runstore`` entry-point group, and loading.

Built-in backends are listed under the same entry-point group as third-party ones, so
they load the same way. Only when the ``runstore`` distribution's own entry points are
absent (a source tree or an unpacked copy on ``PYTHONPATH``, without its metadata) does
the loader import the built-in plugin modules itself (`BUILTIN_PLUGINS`).

Which plugins load: every one installed, or only those ``RUNSTORE_PLUGINS`` lists (an
allow-list for reproducible deployments; naming one that is not installed is an error),
minus those ``RUNSTORE_DISABLE_PLUGINS`` lists. Plugins registered in the process
(`register_plugin`, ``--plugin``) load as asked.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import os
import re
import threading
from collections.abc import Callable
from importlib.metadata import EntryPoint
from pathlib import Path
from types import ModuleType

import pluggy

from runstore import hookspecs
from runstore.errors import PluginError
from runstore.registry import (
    Backends,
    EventStoreRegistry,
    HistoryCacheRegistry,
    PluginInfo,
    RunStoreRegistry,
    SaverRegistry,
    SettingsRegistry,
    StoreRegistry,
    StreamBridgeRegistry,
)

ENTRY_POINT_GROUP = "runstore"
DISABLE_ENV = "RUNSTORE_DISABLE_PLUGINS"
ALLOW_ENV = "RUNSTORE_PLUGINS"
#: The distribution whose entry points list the built-in plugins.
DISTRIBUTION = "runstore"
#: The built-in plugins as the ``runstore`` distribution's entry points list them; loaded
#: from here only when those entry points are absent.
BUILTIN_PLUGINS: dict[str, str] = {
    "memory": "runstore.plugins.memory",
    "jsonl": "runstore.plugins.jsonl",
    "sqlite": "runstore.plugins.sqlite",
    "postgres": "runstore.plugins.postgres",
    "redis": "runstore.plugins.redis",
}


_lock = threading.Lock()
_manager: pluggy.PluginManager | None = None
_backends: Backends | None = None
_infos: dict[str, PluginInfo] = {}


def _names(variable: str) -> set[str]:
    return {name.strip() for name in os.environ.get(variable, "").split(",") if name.strip()}


def disabled_plugins() -> set[str]:
    """Plugin names listed in ``RUNSTORE_DISABLE_PLUGINS``."""
    return _names(DISABLE_ENV)


def allowed_plugins() -> set[str] | None:
    """Plugin names listed in ``RUNSTORE_PLUGINS``, or ``None`` when it is unset or empty
    (every installed plugin loads)."""
    return _names(ALLOW_ENV) or None


def _canonical(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def _entry_points() -> list[EntryPoint]:
    # Looked up through the module so that a test can hide the installed metadata.
    found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    return sorted(found, key=lambda ep: ep.name)


def _builtin_fallback(eps: list[EntryPoint]) -> list[tuple[str, str]]:
    """The built-in plugins to import by module name: all of them when no entry point
    comes from the ``runstore`` distribution, none otherwise (never both ways)."""
    if any(ep.dist is not None and _canonical(ep.dist.name) == DISTRIBUTION for ep in eps):
        return []
    return list(BUILTIN_PLUGINS.items())


def _candidates(
    eps: list[EntryPoint], fallback: list[tuple[str, str]]
) -> list[tuple[str, PluginInfo, str, Callable[[], object]]]:
    """``(name, info, source, load)`` of each plugin to load: the entry points, then the
    built-in fallback modules."""
    found: list[tuple[str, PluginInfo, str, Callable[[], object]]] = []
    for ep in eps:
        dist = ep.dist
        info = PluginInfo(ep.name, dist.name if dist else None, dist.version if dist else None)
        found.append((ep.name, info, ep.value, ep.load))
    if fallback:
        from runstore import __version__

        for name, module in fallback:
            info = PluginInfo(name, DISTRIBUTION, __version__)
            found.append((name, info, module, functools.partial(importlib.import_module, module)))
    return found


def _check_allowed(allowed: set[str] | None, available: set[str]) -> None:
    if allowed is None:
        return
    missing = sorted(allowed - available)
    if missing:
        raise PluginError(
            f"{ALLOW_ENV} names {', '.join(map(repr, missing))}, which "
            f"{'is' if len(missing) == 1 else 'are'} not installed; the runstore plugins "
            f"found: {', '.join(sorted(available)) or 'none'}. Install the plugin's "
            f"distribution or remove the name from {ALLOW_ENV}"
        )


def _new_manager(extra: tuple[tuple[str, object], ...]) -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    blocked = disabled_plugins()
    allowed = allowed_plugins()
    for name in blocked:
        pm.set_blocked(name)
    _infos.clear()
    eps = _entry_points()
    fallback = _builtin_fallback(eps)
    _check_allowed(allowed, {ep.name for ep in eps} | {n for n, _ in fallback} | {n for n, _ in extra})

    def wanted(name: str) -> bool:
        return name not in blocked and (allowed is None or name in allowed)

    for name, info, source, load in _candidates(eps, fallback):
        if not wanted(name):
            continue
        if name in _infos:
            raise PluginError(
                f"two distributions declare the runstore plugin {name!r}: "
                f"{_infos[name]} and {info}; uninstall one or disable it with {DISABLE_ENV}"
            )
        try:
            plugin = load()
        except Exception as exc:
            raise PluginError(f"could not load runstore plugin {info} ({source}): {exc}") from exc
        if pm.is_registered(plugin):
            continue
        pm.register(plugin, name=name)
        _infos[name] = info
    for name, plugin in extra:
        if name in blocked or pm.is_registered(plugin):
            # Already registered: an installed plugin also named as a development one.
            continue
        if pm.get_plugin(name) is not None:
            raise PluginError(f"plugin name {name!r} is already registered by {_infos[name]}")
        pm.register(plugin, name=name)
        _infos[name] = PluginInfo(name)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"invalid runstore plugin {exc.plugin!r}: {exc}") from exc
    return pm


def _collect(pm: pluggy.PluginManager) -> Backends:
    backends = Backends()
    views: dict[str, Callable[[PluginInfo], object]] = {
        "runstore_register_savers": lambda info: SaverRegistry(backends.savers, info),
        "runstore_register_event_stores": lambda info: EventStoreRegistry(backends.events, info),
        "runstore_register_stream_bridges": lambda info: StreamBridgeRegistry(
            backends.streams, info
        ),
        "runstore_register_run_stores": lambda info: RunStoreRegistry(backends.runs, info),
        "runstore_register_history_caches": lambda info: HistoryCacheRegistry(
            backends.history_caches, info
        ),
        "runstore_register_stores": lambda info: StoreRegistry(backends.stores, info),
        "runstore_register_settings": lambda info: SettingsRegistry(backends.settings, info),
    }
    for hook_name, view in views.items():
        # Call each implementation on its own, with a view scoped to its plugin, so every
        # registration records the plugin it came from.
        for impl in getattr(pm.hook, hook_name).get_hookimpls():
            plugin_name = pm.get_name(impl.plugin) or repr(impl.plugin)
            scoped = view(_infos.get(plugin_name, PluginInfo(plugin_name)))
            impl.function(**{arg: scoped for arg in impl.argnames})
    return backends


_extra: list[tuple[str, object]] = []


def register_plugin(plugin: ModuleType | object, name: str | None = None) -> None:
    """Register a plugin object in this process (tests, ``--runstore-plugin``) and reload."""
    plugin_name = name or getattr(plugin, "__name__", None) or repr(plugin)
    with _lock:
        _extra.append((plugin_name, plugin))
    reset()


def _is_file_spec(spec: str) -> bool:
    return spec.endswith(".py") or os.sep in spec


def normalize_plugin_spec(spec: str, base: Path) -> str:
    """A plugin spec as `register_plugin_spec` keys it: a file as an absolute path (relative
    ones resolved against ``base``), a dotted module name unchanged."""
    return str((base / spec).resolve()) if _is_file_spec(spec) else spec


def register_plugin_spec(spec: str) -> ModuleType:
    """Import and register a plugin given as a dotted module name or a ``.py`` file path.

    Registering the same module or file again returns the module registered first.
    """
    import importlib
    import importlib.util

    if _is_file_spec(spec):
        path = Path(spec).resolve()
        with _lock:
            for _, loaded in _extra:
                if isinstance(loaded, ModuleType) and getattr(loaded, "__file__", None) == str(path):
                    return loaded
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        if module_spec is None or module_spec.loader is None or not path.is_file():
            raise PluginError(f"cannot load runstore plugin file {spec}: not a readable .py file")
        module = importlib.util.module_from_spec(module_spec)
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:
            raise PluginError(f"could not load runstore plugin file {spec}: {exc}") from exc
        register_plugin(module, name=path.stem)
        return module
    try:
        module = importlib.import_module(spec)
    except ImportError as exc:
        raise PluginError(f"could not import runstore plugin module {spec!r}: {exc}") from exc
    with _lock:
        if any(loaded is module for _, loaded in _extra):
            return module
    register_plugin(module, name=spec)
    return module


def unregister_plugin(name: str) -> None:
    """Undo `register_plugin` for ``name``."""
    with _lock:
        _extra[:] = [(n, p) for n, p in _extra if n != name]
    reset()


def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, loading entry points on first use."""
    global _manager
    with _lock:
        if _manager is None:
            _manager = _new_manager(tuple(_extra))
        return _manager


def get_backends() -> Backends:
    """Every registered backend, loading plugins on first use."""
    global _backends
    pm = get_plugin_manager()
    with _lock:
        if _backends is None:
            _backends = _collect(pm)
        return _backends


def reset() -> None:
    """Forget loaded plugins so the next lookup reloads them (after env or install changes)."""
    global _manager, _backends
    with _lock:
        _manager = None
        _backends = None
