"""Ready factories for LangGraph's Agent Server (``langgraph dev``, ``langgraph up``).

Point ``langgraph.json`` at them and the server keeps its checkpoints (and its
long-term memory store) in runstore, with no code of yours::

    {"graphs": {...},
     "checkpointer": {"path": "runstore.agent_server.checkpointer"},
     "store": {"path": "runstore.agent_server.store"}}

(the server imports a module path by splitting at the last dot, so it is
``runstore.agent_server.checkpointer``, not ``...:checkpointer``). URLs and options come
from ``runstore.yaml`` / ``RUNSTORE_*`` variables like every other entry point
(`runstore.settings.Settings.load`): ``checkpointer:`` (default: the embedded sqlite
file ``.runstore/runstore.db`` under the server's working directory),
``checkpoint_channel_mode`` (``full`` or ``delta``), ``checkpoint_delta``,
``checkpoint_cache``, ``store:`` and the plugin sections. Each factory opens its own
kind only: the server keeps its thread and run records in its own runtime.
docs/agent-server.md has the whole recipe.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from runstore.errors import ConfigError
from runstore.settings import URL_KEYS, Settings
from runstore.stores import open as open_stores

if TYPE_CHECKING:
    from langgraph.checkpoint.base import BaseCheckpointSaver
    from langgraph.store.base import BaseStore

__all__ = ["checkpointer", "checkpointer_settings", "server_store_config", "settings_for", "store"]

#: The environment variable the Agent Server keeps ``langgraph.json``'s ``store`` section in.
SERVER_STORE_ENV = "LANGGRAPH_STORE"


def settings_for(
    kind: str, config: Mapping[str, Any] | str | os.PathLike[str] | Settings | None = None
) -> Settings:
    """`Settings.load` (``runstore.yaml``, ``RUNSTORE_*``, ``config``) selecting ``kind`` only."""
    settings = Settings.load(config)
    defaults = Settings()
    # `runstore.open` opens every kind some source configured; a factory needs one, so
    # the other kinds go back to unset (their URLs are not read here).
    others = {k: getattr(defaults, k) for k in URL_KEYS if k != kind}
    return dataclasses.replace(settings, **others, _urls_set=frozenset({kind}))


def checkpointer_settings(
    config: Mapping[str, Any] | str | os.PathLike[str] | Settings | None = None,
) -> Settings:
    """The settings `checkpointer` opens (`settings_for` the checkpointer kind)."""
    return settings_for("checkpointer", config)


@asynccontextmanager
async def checkpointer() -> AsyncIterator[BaseCheckpointSaver[Any]]:
    """The configured checkpoint saver, migrations applied, closed when the server stops.

    The Agent Server calls it without arguments and enters it once per event loop it
    runs graphs on. In ``delta`` mode the saver comes wrapped (mode marker, parent-walk
    memo, history cache) as `runstore.open` wraps it.
    """
    async with open_stores(checkpointer_settings()) as stores:
        yield stores.checkpointer


def server_store_config(env: Mapping[str, str] | None = None) -> tuple[Any, Any]:
    """``(index, ttl)`` of ``langgraph.json``'s ``store`` section, as the server passes it
    to its process (``LANGGRAPH_STORE``); ``(None, None)`` when absent."""
    raw = (os.environ if env is None else env).get(SERVER_STORE_ENV)
    if not raw:
        return None, None
    try:
        section = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"{SERVER_STORE_ENV} is not JSON ({exc}); accepted: langgraph.json's store section") from exc
    if not isinstance(section, Mapping):
        raise ConfigError(f"{SERVER_STORE_ENV} must be a JSON object (langgraph.json's store section)")
    return section.get("index"), section.get("ttl")


@asynccontextmanager
async def store() -> AsyncIterator[BaseStore]:
    """The configured long-term memory store (``store:`` URL), migrations applied, closed
    when the server stops.

    ``index`` and ``ttl`` from ``langgraph.json``'s ``store`` section are applied as
    `runstore.open` applies ``store_index``/``store_ttl`` (the server itself ignores them
    for a custom store).
    """
    index, ttl = server_store_config()
    async with open_stores(settings_for("store"), store_index=index, store_ttl=ttl) as stores:
        yield stores.store
