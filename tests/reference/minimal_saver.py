"""Test-only runstore plugin: a saver declaring no optional capability, as ``minimal://``.

LangGraph's ``InMemorySaver`` registered with an empty capability list: the suite must
run only the contract every saver owes and skip every capability group it never declared.
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
        "minimal",
        schemes=["minimal"],
        factory=_open,
        capabilities=[],
        description="a saver with no optional capability (test reference)",
    )
