"""Ready factories for LangGraph's Agent Server (``langgraph dev``, ``langgraph up``).

Point ``langgraph.json`` at them and the server keeps its checkpoints in runstore,
with no code of yours::

    {"graphs": {...}, "checkpointer": {"path": "runstore.agent_server.checkpointer"}}

(the server imports a module path by splitting at the last dot, so it is
``runstore.agent_server.checkpointer``, not ``...:checkpointer``). The URL and options
come from ``runstore.yaml`` / ``RUNSTORE_*`` variables like every other entry point
(`runstore.settings.Settings.load`): ``checkpointer:`` (default: the embedded sqlite
file ``.runstore/runstore.db`` under the server's working directory),
``checkpoint_channel_mode`` (``full`` or ``delta``), ``checkpoint_delta``,
``checkpoint_cache`` and the plugin sections. Only the checkpointer is opened: the
server keeps its thread and run records in its own runtime. docs/agent-server.md has
the whole recipe.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from runstore.settings import Settings
from runstore.stores import open as open_stores

if TYPE_CHECKING:
    import os

    from langgraph.checkpoint.base import BaseCheckpointSaver

__all__ = ["checkpointer", "checkpointer_settings"]


def checkpointer_settings(
    config: Mapping[str, Any] | str | os.PathLike[str] | Settings | None = None,
) -> Settings:
    """The settings `checkpointer` opens: `Settings.load` (``runstore.yaml``, ``RUNSTORE_*``,
    ``config``) selecting the checkpointer kind only."""
    settings = Settings.load(config)
    defaults = Settings()
    # `runstore.open` opens every kind some source configured; the server needs only
    # the saver, so the other kinds go back to unset (their URLs are not read here).
    return dataclasses.replace(
        settings,
        events=defaults.events,
        streams=defaults.streams,
        runs=defaults.runs,
        _urls_set=frozenset({"checkpointer"}),
    )


@asynccontextmanager
async def checkpointer() -> AsyncIterator[BaseCheckpointSaver[Any]]:
    """The configured checkpoint saver, migrations applied, closed when the server stops.

    The Agent Server calls it without arguments and enters it once per event loop it
    runs graphs on. In ``delta`` mode the saver comes wrapped (mode marker, history cache)
    as `runstore.open` wraps it.
    """
    async with open_stores(checkpointer_settings()) as stores:
        yield stores.checkpointer
