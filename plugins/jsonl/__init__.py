"""Built-in plugin ``jsonl``: run events as one JSON-lines file per run under a directory."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from runstore.hookspecs import hookimpl
from runstore.urls import BackendURL

if TYPE_CHECKING:
    from runstore.options import BackendOptions
    from runstore.registry import EventStoreRegistry

    from .events import JsonlEventStore


async def _open_events(url: BackendURL, options: BackendOptions) -> JsonlEventStore:
    from .events import JsonlEventStore

    return await JsonlEventStore.open(url, options)


@hookimpl
def runstore_register_event_stores(registry: EventStoreRegistry) -> None:
    registry.add(
        "jsonl",
        schemes=["jsonl"],
        factory=_open_events,
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
