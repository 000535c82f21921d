"""Broken run stores, one per rule of the rule-by-rule suite (`test_runs_rules`) and per
rare transition of the state machine (a claim at a tie, an owner repeating itself), and
one correct store that breaks ties between equal expiry times differently (the suite must
pass it: the contract leaves that order to the store).

SQL twins run the memory store's scripts with one condition rewritten; the others
override one method.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from typing import Any

from runstore.clock import seconds_to_micros, to_micros
from runstore.errors import RunFinishedError
from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.memory.runs import MemoryRunDriver, MemoryRunStore
from runstore.registry import RunStoreRegistry
from runstore.runs.protocol import RunRecord
from runstore.urls import BackendURL


class _Rewriting:
    """A connection whose statements get ``rewrite`` applied (the rest is the connection's)."""

    def __init__(self, conn: sqlite3.Connection, rewrite: tuple[tuple[str, str], ...]) -> None:
        self._conn = conn
        self._rewrite = rewrite

    def execute(self, sql: str, params: Any = ()) -> Any:
        for old, new in self._rewrite:
            sql = sql.replace(old, new)
        return self._conn.execute(sql, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def _rewriting_store(rewrite: tuple[tuple[str, str], ...]) -> type[MemoryRunStore]:
    class Driver(MemoryRunDriver):
        @property
        def connection(self) -> Any:
            return _Rewriting(super().connection, rewrite)

    class Store(MemoryRunStore):
        def __init__(self) -> None:
            super().__init__()
            self.driver = Driver()
            self._driver = self.driver

    return Store


# BUG (on purpose): a renewal at exactly lease_expires_at still finds the lease live.
RenewAtExpiry = _rewriting_store((("lease_expires_at > ?", "lease_expires_at >= ?"),))
# BUG (on purpose): a lease that ended exactly grace seconds ago is not claimed yet.
ClaimStrictCutoff = _rewriting_store((("lease_expires_at <= ?", "lease_expires_at < ?"),))
# Correct: equal expiry times claimed in descending run id order.
TiesDescending = _rewriting_store((("ORDER BY lease_expires_at, run_id LIMIT", "ORDER BY lease_expires_at, run_id DESC LIMIT"),))


class RefinalizeOverwrites(MemoryRunStore):
    async def finalize(self, run_id: str, owner: str, status: Any, **kw: Any) -> RunRecord:  # type: ignore[override]
        run = await self.get(run_id)
        if run is not None and run["owner"] == owner and run["status"] not in ("pending", "running"):
            # BUG (on purpose): the owner may restate how its finished run ended.
            self.driver.connection.execute("UPDATE runstore_runs SET status = ? WHERE run_id = ?", (status, run_id))
        return await super().finalize(run_id, owner, status, **kw)


class ListIgnoresLimit(MemoryRunStore):
    async def list_by_thread(self, thread_id: str, *, status: Any = None, limit: int | None = None) -> list[RunRecord]:
        return await super().list_by_thread(thread_id, status=status)  # BUG (on purpose): no limit


class ListFirstStatus(MemoryRunStore):
    async def list_by_thread(self, thread_id: str, *, status: Any = None, limit: int | None = None) -> list[RunRecord]:
        if status is not None and not isinstance(status, str) and isinstance(status, Iterable):
            status = sorted(status)[:1]  # BUG (on purpose): a list of statuses filters by one of them
        return await super().list_by_thread(thread_id, status=status, limit=limit)


class ClaimWholeTie(MemoryRunStore):
    async def claim_expired(self, owner: str, ttl: float, *, grace: float, limit: int = 100) -> list[RunRecord]:  # type: ignore[override]
        db = self.driver.connection
        cutoff = to_micros(self.now()) - seconds_to_micros(grace)
        ends = [end for (end,) in db.execute(
            "SELECT lease_expires_at FROM runstore_runs WHERE status = 'running' AND lease_expires_at <= ? "
            "ORDER BY lease_expires_at LIMIT ?", (cutoff, limit),
        )]  # fmt: skip
        if len(ends) == limit:
            # BUG (on purpose): the limit counts expiry instants, so a tie at the cut is taken whole.
            (limit,) = db.execute(
                "SELECT COUNT(*) FROM runstore_runs WHERE status = 'running' AND lease_expires_at <= ?", (ends[-1],)
            ).fetchone()
        return await super().claim_expired(owner, ttl, grace=grace, limit=limit)


def _holds(run: RunRecord | None, owner: str, now: Any) -> bool:
    return run is not None and run["status"] == "running" and run["owner"] == owner and run["lease_expires_at"] > now


class RestartRegrants(MemoryRunStore):
    async def start(self, run_id: str, owner: str, ttl: float) -> RunRecord:
        run = await self.get(run_id)
        if _holds(run, owner, self.now()):
            # BUG (on purpose): the owner repeating start gets its lease extended, not the run unchanged.
            await self.renew_lease(run_id, owner, ttl)
            return await self.get(run_id)  # type: ignore[return-value]
        return await super().start(run_id, owner, ttl)


class HeartbeatNoop(MemoryRunStore):
    async def renew_lease(self, run_id: str, owner: str, ttl: float) -> Any:
        run = await self.get(run_id)
        if run is not None and _holds(run, owner, self.now()):
            return True, run["cancel_action"]  # BUG (on purpose): renewed, but the lease is not extended
        return await super().renew_lease(run_id, owner, ttl)


class RefinalizeRefuses(MemoryRunStore):
    async def finalize(self, run_id: str, owner: str, status: Any, **kw: Any) -> RunRecord:  # type: ignore[override]
        run = await self.get(run_id)
        if run is not None and run["status"] not in ("pending", "running"):
            raise RunFinishedError(run)  # BUG (on purpose): the owner's retry after a lost reply too
        return await super().finalize(run_id, owner, status, **kw)


class SharedMetadata(MemoryRunStore):
    """Keeps the caller's metadata dict and hands it out in every record (a dict-backed store
    that stores and returns its own objects)."""

    def __init__(self) -> None:
        super().__init__()
        self._kept: dict[str, dict[str, Any]] = {}

    def _share(self, run: RunRecord) -> RunRecord:
        if run["run_id"] in self._kept:
            run["metadata"] = self._kept[run["run_id"]]  # BUG (on purpose): no copy in or out
        return run

    async def create(self, thread_id: str, **kw: Any) -> Any:  # type: ignore[override]
        result = await super().create(thread_id, **kw)
        if kw.get("metadata") is not None:
            self._kept.setdefault(result.run["run_id"], kw["metadata"])
        self._share(result.run)
        return result

    async def get(self, run_id: str) -> RunRecord | None:
        run = await super().get(run_id)
        return None if run is None else self._share(run)

    async def list_by_thread(self, thread_id: str, *, status: Any = None, limit: int | None = None) -> list[RunRecord]:
        return [self._share(r) for r in await super().list_by_thread(thread_id, status=status, limit=limit)]


BROKEN: dict[str, type[MemoryRunStore]] = {
    "broken-renew-at-expiry": RenewAtExpiry,
    "broken-claim-strict-cutoff": ClaimStrictCutoff,
    "broken-refinalize-overwrites": RefinalizeOverwrites,
    "broken-list-ignores-limit": ListIgnoresLimit,
    "broken-list-first-status": ListFirstStatus,
    "ties-descending": TiesDescending,
    "broken-claim-whole-tie": ClaimWholeTie,
    "broken-restart-regrants": RestartRegrants,
    "broken-heartbeat-noop": HeartbeatNoop,
    "broken-refinalize-refuses": RefinalizeRefuses,
    "broken-shared-metadata": SharedMetadata,
}


def _factory(cls: type[MemoryRunStore]) -> Any:
    async def _open(url: BackendURL, options: BackendOptions) -> MemoryRunStore:
        return await cls.open(url.with_query(), options)

    return _open


@hookimpl
def runstore_register_run_stores(registry: RunStoreRegistry) -> None:
    for name, cls in BROKEN.items():
        registry.add(name, schemes=[name], factory=_factory(cls))
