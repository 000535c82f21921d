"""Broken store: the sqlite store with a read cache per process. An item this process has
read is served from the cache until this process writes it, so a put, delete or sweep by
another process is not seen here. The store suite must fail it (contract: cross_process:
a read sees the last write acknowledged in another process)."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

from langgraph.store.base import GetOp, Op, PutOp, Result

from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.sqlite import STORE_CAPABILITIES
from runstore.plugins.sqlite.store import SqliteStore
from runstore.registry import StoreRegistry
from runstore.urls import BackendURL

NAME = "broken-store-process-local"

#: What this process has read, by (namespace, key): the store instances of a process share it.
_CACHE: dict[tuple[tuple[str, ...], str], Result] = {}


class ProcessLocalStore(SqliteStore):
    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        listed = list(ops)
        slots = [(tuple(op.namespace), op.key) if isinstance(op, GetOp | PutOp) else None for op in listed]
        if listed and all(isinstance(op, GetOp) and slot in _CACHE for op, slot in zip(listed, slots, strict=True)):
            # BUG (on purpose): no check that another process wrote the item since.
            return [_CACHE[slot] for slot in slots if slot is not None]
        results = await super().abatch(listed)
        for op, slot, result in zip(listed, slots, results, strict=True):
            if isinstance(op, GetOp) and slot is not None:
                _CACHE[slot] = result
            elif slot is not None:
                _CACHE.pop(slot, None)
        return results


async def _open(url: BackendURL, options: BackendOptions) -> Any:
    path = url.file_path()
    if path is None:
        raise ValueError(f"{url}: name the sqlite file ({NAME}:////absolute/path.db)")
    return await ProcessLocalStore.open(BackendURL.for_file("sqlite", path), options)


@hookimpl
def runstore_register_stores(registry: StoreRegistry) -> None:
    registry.add(NAME, schemes=[NAME], factory=_open, capabilities=STORE_CAPABILITIES)


@hookimpl
def runstore_conformance_provision(url: BackendURL) -> Any:
    if url.scheme != NAME:
        return None

    @contextlib.asynccontextmanager
    async def scratch() -> AsyncIterator[BackendURL]:
        with tempfile.TemporaryDirectory(prefix="runstore-broken-store-") as tmp:
            yield BackendURL.for_file(NAME, Path(tmp, "store.db"))

    return scratch()
