"""Test-only runstore plugin: LangGraph's stock ``InMemorySaver`` as ``langgraph-memory://``.

Our run of the saver suite includes it as a reference peer, so the suite proves it
passes a saver we did not write (capabilities the stock saver lacks are skipped).
"""

from __future__ import annotations

from typing import Any

from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.registry import SaverRegistry
from runstore.urls import BackendURL


async def _open(url: BackendURL, options: BackendOptions) -> Any:
    from langgraph.checkpoint.memory import InMemorySaver

    url.check_options(set())
    return InMemorySaver()


@hookimpl
def runstore_register_savers(registry: SaverRegistry) -> None:
    registry.add(
        "langgraph-memory",
        schemes=["langgraph-memory"],
        factory=_open,
        capabilities=["delta_history", "sync_api"],
        description="LangGraph's stock InMemorySaver (test reference)",
    )
