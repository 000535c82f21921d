"""Built-in plugin ``jsonl``: run events as one JSON-lines file per run under a directory."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from runstore.hookspecs import hookimpl
from runstore.urls import BackendURL

if TYPE_CHECKING:
    from runstore.registry import EventStoreRegistry


@hookimpl
def runstore_register_event_stores(registry: EventStoreRegistry) -> None:
    registry.add(
        "jsonl",
        schemes=["jsonl"],
        factory="runstore.plugins.jsonl.events:JsonlEventStore.open",
        capabilities=["durable", "fencing"],
        description="one JSON-lines file per run: jsonl:///var/runs",
    )


@hookimpl
def runstore_conformance_provision(url: BackendURL) -> Any:
    if url.scheme != "jsonl":
        return None

    @contextlib.asynccontextmanager
    async def scratch() -> AsyncIterator[BackendURL]:
        with tempfile.TemporaryDirectory(prefix="runstore-jsonl-") as tmp:
            yield BackendURL.for_file("jsonl", tmp)

    return scratch()
