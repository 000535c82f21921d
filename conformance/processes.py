"""What a process the suite starts needs: the development plugins, and errors that travel back.

Cross-process tests start workers (spawned pools, ``python -c`` children) that open the
backend by URL through the registry, so a plugin that is not installed yet must be
loaded there too, and a worker's exception must reach the author as its cause.
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import traceback
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

#: Environment variable carrying the development plugins to a ``python -c`` child.
PLUGINS_ENV = "RUNSTORE_SUITE_PLUGINS"


def load_plugins(specs: Sequence[str]) -> None:
    """Register development plugins (dotted names or absolute ``.py`` paths) in this process."""
    from runstore.loader import register_plugin_spec

    for spec in specs:
        register_plugin_spec(spec)


def with_backend(kind: str, url: str, plugins: Sequence[str], body: Callable[[Any], Awaitable[T]]) -> T:
    """Open the ``kind`` backend at ``url`` in this process (through the registry, after
    loading ``plugins``), run ``body`` on it in a new event loop, and close it."""
    import asyncio

    from runstore.capabilities import Kind
    from runstore.loader import get_backends
    from runstore.options import BackendOptions
    from runstore.urls import BackendURL

    load_plugins(plugins)

    async def main() -> T:
        parsed = BackendURL.parse(url)
        spec = get_backends().of(Kind(kind)).for_url(parsed)
        async with BackendOptions.scope() as options:
            backend = await spec.open(parsed, options)  # closed with the options
            return await body(backend)

    return asyncio.run(main())


def load_plugins_from_env() -> None:
    """`load_plugins` for the list a parent put in ``RUNSTORE_SUITE_PLUGINS`` (JSON)."""
    load_plugins(json.loads(os.environ.get(PLUGINS_ENV) or "[]"))


def plugins_env(specs: Sequence[str]) -> dict[str, str]:
    """The environment entries that hand ``specs`` to a child (see `load_plugins_from_env`)."""
    return {PLUGINS_ENV: json.dumps(list(specs))}


class WorkerError(Exception):
    """A worker process failed with an exception that cannot be sent back as itself."""


def errors_travel(fn: Callable[..., T]) -> Callable[..., T]:
    """Make ``fn``'s exceptions reach the parent of a process pool as their cause.

    An exception that cannot be pickled (a constructor with required arguments it does
    not keep in ``args``) would otherwise surface as ``BrokenProcessPool``; it is
    replaced by a `WorkerError` holding its type, message and traceback.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            try:
                pickle.loads(pickle.dumps(exc))
            except Exception:
                detail = "".join(traceback.format_exception(exc))
                raise WorkerError(
                    f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}\n{detail}"
                ) from None
            raise

    return wrapper
