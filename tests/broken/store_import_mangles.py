"""Broken stores whose bulk import does not put items back as they were: one writes every
record with the import's time (created_at/updated_at and the expiry lost), one drops a
record's last namespace label. The no-lock-in group must fail both (contract: no lock-in:
store items imported back ...)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from runstore.clock import to_micros
from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory import STORE_CAPABILITIES
from runstore.plugins.memory.store import MemoryStore
from runstore.registry import StoreRegistry
from runstore.store.base import store_config
from runstore.urls import BackendURL


class ImportLosesTimesStore(MemoryStore):
    async def aimport_items(self, records: Sequence[Mapping[str, Any]], *, overwrite: bool = False) -> int:
        # BUG (on purpose): the records' times are replaced by the import's.
        now = to_micros(self.now())
        ttl = [r["ttl_minutes"] for r in records]
        fresh = [{**r, "created_at": now, "updated_at": now,
                  "expires_at": None if t is None else now + int(t * 60_000_000)} for r, t in zip(records, ttl, strict=True)]
        return await super().aimport_items(fresh, overwrite=overwrite)


class ImportDropsLevelStore(MemoryStore):
    async def aimport_items(self, records: Sequence[Mapping[str, Any]], *, overwrite: bool = False) -> int:
        # BUG (on purpose): a namespace deeper than two labels loses its last one.
        cut = [{**r, "namespace": list(r["namespace"])[:2]} for r in records]
        return await super().aimport_items(cut, overwrite=overwrite)


def _opener(cls: type[MemoryStore]) -> Any:
    async def _open(url: BackendURL, options: BackendOptions) -> Any:
        index, ttl = store_config(options)
        return cls(index=index, ttl=ttl)

    return _open


@hookimpl
def runstore_register_stores(registry: StoreRegistry) -> None:
    registry.add("broken-store-import-times", schemes=["broken-store-import-times"],
                 factory=_opener(ImportLosesTimesStore), capabilities=STORE_CAPABILITIES)  # fmt: skip
    registry.add("broken-store-import-level", schemes=["broken-store-import-level"],
                 factory=_opener(ImportDropsLevelStore), capabilities=STORE_CAPABILITIES)  # fmt: skip
