"""Reference model of the run store contract, for the run store suite (`test_runs`).

Every expected answer is computed here from the contract (docs/runs.md), written as
plainly as possible, never from a backend: runs in a dict, a fencing counter per
thread, and each operation as a few lines of Python.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from runstore.errors import (
    CancelPendingError,
    IdempotencyConflictError,
    LeaseHeldError,
    LeaseLostError,
    RunAlreadyStartedError,
    RunExistsError,
    RunFinishedError,
    RunNotFoundError,
    RunQueuedError,
    ThreadBusyError,
)
from runstore.runs.protocol import RunStore

TERMINAL = {"success", "error", "interrupted", "timeout", "cancelled"}


@dataclass(frozen=True)
class Err:
    """An expected error: its class, and the run id it must name (if any)."""

    cls: type[Exception]
    names: str | None = None


@dataclass
class RunsModel:
    """Runs by id, creation order per thread, one fencing counter per thread."""

    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    order: dict[str, list[str]] = field(default_factory=dict)
    fence: dict[str, int] = field(default_factory=dict)

    # -- reads ------------------------------------------------------------------------

    def thread_runs(self, thread_id: str) -> list[dict[str, Any]]:
        return [copy.deepcopy(self.runs[r]) for r in self.order.get(thread_id, []) if r in self.runs]

    def active(self, thread_id: str) -> dict[str, Any] | None:
        found = [r for r in self.thread_runs(thread_id) if r["active"]]
        assert len(found) <= 1, "model: more than one active run"
        return self.runs[found[0]["run_id"]] if found else None

    def get(self, run_id: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.runs.get(run_id))

    @staticmethod
    def live(run: dict[str, Any], now: datetime) -> bool:
        return run["status"] == "running" and run["lease_expires_at"] is not None and now < run["lease_expires_at"]

    # -- helpers ----------------------------------------------------------------------

    def _issue(self, thread_id: str) -> int:
        self.fence[thread_id] = self.fence.get(thread_id, 0) + 1
        return self.fence[thread_id]

    def _end(self, run: dict[str, Any], now: datetime, *, promote: bool = True, **changes: Any) -> None:
        """The run leaves the thread: no lease; a lease's token is retired; the queue moves."""
        was_running, was_active = run["status"] == "running", run["active"]
        run.update(changes, active=False, lease_expires_at=None, updated_at=now)
        if was_running:
            self._issue(run["thread_id"])
        if was_active and promote:
            for other in self.order[run["thread_id"]]:
                queued = self.runs.get(other)
                if other != run["run_id"] and queued is not None and queued["status"] == "pending" and not queued["active"]:
                    queued.update(active=True, updated_at=now)
                    break

    # -- operations (each returns the expected result, or an Err) ---------------------

    def create(
        self,
        thread_id: str,
        run_id: str,
        kind: str,
        strategy: str,
        key: str | None,
        metadata: dict[str, Any] | None,
        now: datetime,
    ) -> Any:
        if key is not None:
            for run in self.runs.values():
                if run["idempotency_key"] == key:
                    if run["thread_id"] != thread_id:
                        return Err(IdempotencyConflictError, run["run_id"])
                    return ("existing", copy.deepcopy(run), None)
        if run_id in self.runs:
            return Err(RunExistsError, run_id)
        active = self.active(thread_id)
        queued = False
        interrupted = None
        if active is not None:
            if strategy == "reject":
                return Err(ThreadBusyError, active["run_id"])
            if strategy == "enqueue":
                queued = True
            else:
                if self.live(active, now):
                    return Err(LeaseHeldError, active["run_id"])
                self._end(
                    active, now, promote=False, status="interrupted", stop_reason=strategy,
                    cancel_action=active["cancel_action"] or strategy,
                    cancel_requested_at=active["cancel_requested_at"] or now,
                )  # fmt: skip
                interrupted = copy.deepcopy(active)
        self.runs[run_id] = {
            "run_id": run_id, "thread_id": thread_id, "status": "pending", "active": not queued,
            "kind": kind, "owner": None, "lease_expires_at": None, "fence": None,
            "cancel_action": None, "cancel_requested_at": None, "stop_reason": None, "error": None,
            "idempotency_key": key, "metadata": dict(metadata or {}), "created_at": now, "updated_at": now,
        }  # fmt: skip
        self.order.setdefault(thread_id, []).append(run_id)
        return ("enqueued" if queued else "created", copy.deepcopy(self.runs[run_id]), interrupted)

    def start(self, run_id: str, owner: str, ttl: float, now: datetime) -> Any:
        run = self.runs.get(run_id)
        if run is None:
            return Err(RunNotFoundError, run_id)
        if run["status"] == "running":
            if run["owner"] == owner and self.live(run, now):
                return copy.deepcopy(run)
            return Err(RunAlreadyStartedError, run_id)
        if run["status"] in TERMINAL:
            return Err(RunFinishedError, run_id)
        if not run["active"]:
            active = self.active(run["thread_id"])
            return Err(RunQueuedError, active["run_id"] if active else None)
        run.update(
            status="running", owner=owner, lease_expires_at=now + timedelta(seconds=ttl),
            fence=self._issue(run["thread_id"]), updated_at=now,
        )  # fmt: skip
        return copy.deepcopy(run)

    def renew(self, run_id: str, owner: str, ttl: float, now: datetime) -> tuple[bool, str | None]:
        run = self.runs.get(run_id)
        if run is None:
            return False, None
        if run["owner"] == owner and self.live(run, now):
            run.update(lease_expires_at=now + timedelta(seconds=ttl), updated_at=now)
            return True, run["cancel_action"]
        return False, run["cancel_action"]

    def cancel(self, run_id: str, action: str, now: datetime) -> Any:
        run = self.runs.get(run_id)
        if run is None:
            return Err(RunNotFoundError, run_id)
        if run["cancel_action"] is not None:
            return run["cancel_action"]
        if run["status"] in TERMINAL:
            return Err(RunFinishedError, run_id)
        if run["status"] == "pending":
            self._end(
                run, now, status="cancelled", stop_reason=action, cancel_action=action,
                cancel_requested_at=now,
            )  # fmt: skip
        else:
            run.update(cancel_action=action, cancel_requested_at=now, updated_at=now)
        return action

    def finalize(
        self, run_id: str, owner: str, status: str, stop_reason: str | None, error: str | None, now: datetime
    ) -> Any:
        run = self.runs.get(run_id)
        if run is None:
            return Err(RunNotFoundError, run_id)
        if run["status"] in TERMINAL:
            if run["owner"] == owner and run["status"] == status:
                return copy.deepcopy(run)
            return Err(RunFinishedError, run_id)
        if run["owner"] != owner or not self.live(run, now):
            return Err(LeaseLostError, run_id)
        if run["cancel_action"] is not None and status not in ("cancelled", "interrupted"):
            return Err(CancelPendingError, run_id)
        self._end(run, now, status=status, stop_reason=stop_reason, error=error)
        return copy.deepcopy(run)

    def claimable(self, grace: float, limit: int, now: datetime) -> list[dict[str, Any]]:
        """Runs a claim at ``now`` may take: leases that ended at least ``grace`` ago,
        longest-expired first; only the expiry times of the first ``limit`` are fixed (the
        contract leaves the order among equal expiry times to the store)."""
        cutoff = now - timedelta(seconds=grace)
        return sorted(
            (r for r in self.runs.values() if r["status"] == "running" and r["lease_expires_at"] <= cutoff),
            key=lambda r: r["lease_expires_at"],
        )

    def claim_choice_ok(self, chosen: list[str], grace: float, limit: int, now: datetime) -> bool:
        """Whether ``chosen`` (run ids, in the store's order) is a claim the contract allows:
        as many runs as it may take, distinct, each claimable, and the same expiry times in
        the same order as the longest-expired ``limit`` (ties broken any way)."""
        candidates = self.claimable(grace, limit, now)
        by_id = {r["run_id"]: r for r in candidates}
        if len(set(chosen)) != len(chosen) or not set(chosen) <= set(by_id):
            return False
        return [by_id[r]["lease_expires_at"] for r in chosen] == [
            r["lease_expires_at"] for r in candidates[:limit]
        ]

    def claim(
        self, owner: str, ttl: float, grace: float, limit: int, now: datetime, chosen: list[str] | None = None
    ) -> list[dict[str, Any]]:
        """Take ``chosen`` (a choice `claim_choice_ok` allows), or the longest-expired
        ``limit`` runs with ties by run id when ``chosen`` is ``None``."""
        if chosen is None:
            chosen = [r["run_id"] for r in sorted(
                self.claimable(grace, limit, now), key=lambda r: (r["lease_expires_at"], r["run_id"])
            )[:limit]]  # fmt: skip
        expired = [self.runs[r] for r in chosen]
        for run in expired:
            run.update(
                owner=owner, lease_expires_at=now + timedelta(seconds=ttl),
                fence=self._issue(run["thread_id"]), updated_at=now,
            )  # fmt: skip
        return [copy.deepcopy(r) for r in expired]

    def delete(self, run_id: str, now: datetime) -> bool:
        run = self.runs.get(run_id)
        if run is None:
            return False
        self._end(run, now)
        del self.runs[run_id]
        return True


async def delete_all(store: RunStore, thread_ids: list[str]) -> None:
    """Delete every run of ``thread_ids`` (claims see every run of a store, so tests clean up)."""
    for thread_id in thread_ids:
        for run in await store.list_by_thread(thread_id):
            await store.delete(run["run_id"])
