"""The run store protocol: which runs exist, who executes each, one active run per thread.

Contract (every backend, same answers; docs/runs.md has the state diagram and faults):

* A run is a `RunRecord`. Its ``status`` is ``pending`` until a worker `RunStore.start`\\ s
  it (``running``, with an ``owner`` and a lease until ``lease_expires_at``), then one of
  `TERMINAL_STATUSES`. A thread has at most one *active* run (``active``: pending or
  running and holding the thread); runs created with ``enqueue`` behind it are pending
  with ``active=False`` (queued) and become active, oldest first, when it ends.
* `RunStore.create` is atomic with its ``multitask_strategy``: ``reject`` raises
  `ThreadBusyError` naming the active run; ``interrupt``/``rollback`` mark the active
  run ``interrupted`` in the same transaction, unless it runs under a live lease
  (`LeaseHeldError`); ``enqueue`` queues behind it. A repeated ``idempotency_key``
  returns the existing run (``CreateResult.outcome == "existing"``), never a second one.
* Leases use the caller's clock (`RunStore.clock`, a `Clock`): a lease is live while
  ``clock() < lease_expires_at``. Only the owner of a live lease renews or finalizes
  it; `RunStore.claim_expired` hands a run whose lease expired more than ``grace``
  seconds ago to exactly one claimer. ``grace`` must exceed the clock skew between
  workers.
* Every lease grant (`RunStore.start`, `RunStore.claim_expired`) issues a fencing token
  (``fence``) from a per-thread counter that only grows; the counter also moves when a
  leased run ends, so a token is current exactly while its lease is the thread's
  running lease. Deleting runs never resets a thread's counter.
* A cancel request is first-writer-wins (`RunStore.request_cancel` returns the winning
  action). While one is pending the owner may only finalize with ``cancelled`` or
  ``interrupted``.
* Bad input raises `InvalidRunError` naming what is accepted, before any I/O. Every
  write is all-or-nothing.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Literal, TypedDict

from runstore.clock import Clock, check_time, system_clock
from runstore.errors import (
    InvalidRunError,
)

RunStatus = Literal["pending", "running", "success", "error", "interrupted", "timeout", "cancelled"]
MultitaskStrategy = Literal["reject", "interrupt", "rollback", "enqueue"]
CancelAction = Literal["interrupt", "rollback"]
CreateOutcome = Literal["created", "enqueued", "existing"]

RUN_STATUSES: tuple[str, ...] = (
    "pending", "running", "success", "error", "interrupted", "timeout", "cancelled",
)  # fmt: skip
#: Statuses a run never leaves; `RunStore.finalize` accepts exactly these.
TERMINAL_STATUSES: frozenset[str] = frozenset(RUN_STATUSES[2:])
#: The statuses that acknowledge a pending cancel request in `RunStore.finalize`.
CANCEL_STATUSES: frozenset[str] = frozenset({"cancelled", "interrupted"})
MULTITASK_STRATEGIES: tuple[str, ...] = ("reject", "interrupt", "rollback", "enqueue")
CANCEL_ACTIONS: tuple[str, ...] = ("interrupt", "rollback")

#: Lease lengths (``ttl``) and ``grace`` are seconds in [`MIN_TTL_SECONDS`, `MAX_TTL_SECONDS`].
MIN_TTL_SECONDS = 0.001
MAX_TTL_SECONDS = 86400.0
#: Most runs one `RunStore.claim_expired` call hands out.
MAX_CLAIM_LIMIT = 1000
MAX_KIND_LENGTH = 32
MAX_STOP_REASON_LENGTH = 200


class RunRecord(TypedDict):
    """One run, as every backend returns it. Times are timezone-aware UTC datetimes."""

    run_id: str
    thread_id: str
    status: RunStatus
    #: Holds the thread (pending or running, not queued); at most one per thread.
    active: bool
    #: What the run does (free-form, e.g. ``"run"``, ``"wait"``), 1-32 characters.
    kind: str
    #: The worker holding (or that last held) the lease; ``None`` before the first start.
    owner: str | None
    #: End of the current lease; ``None`` unless running.
    lease_expires_at: datetime | None
    #: Fencing token of the current (or last) lease; ``None`` before the first start.
    fence: int | None
    cancel_action: CancelAction | None
    cancel_requested_at: datetime | None
    #: Why the store stopped the run (``"interrupt"``, ``"rollback"``), or the owner's reason.
    stop_reason: str | None
    error: str | None
    idempotency_key: str | None
    metadata: dict[str, Any]
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class CreateResult:
    """What `RunStore.create` did.

    ``outcome``: ``"created"`` (the run is the thread's active run), ``"enqueued"`` (it
    waits behind the active run) or ``"existing"`` (the idempotency key matched ``run``,
    which was returned unchanged and nothing was written). ``interrupted`` is the run
    that ``interrupt``/``rollback`` stopped, if any.
    """

    run: RunRecord
    outcome: CreateOutcome
    interrupted: RunRecord | None = None

    @property
    def created(self) -> bool:
        """Whether this call wrote a new run (created or enqueued)."""
        return self.outcome != "existing"


# -- errors ---------------------------------------------------------------------------






























# -- time -----------------------------------------------------------------------------
















# -- validation (every backend, before any I/O) -----------------------------------------


def _text(value: Any, what: str, *, max_chars: int | None = None, max_bytes: int | None = None) -> str:
    if not isinstance(value, str):
        raise InvalidRunError(f"{what} must be a str, not {type(value).__name__}")
    if not value:
        raise InvalidRunError(f"{what} must be a non-empty string")
    if "\x00" in value:
        raise InvalidRunError(f"{what} contains a NUL character (\\x00), which no backend can store")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidRunError(f"{what} contains a lone surrogate (not valid Unicode text)") from None
    if max_bytes is not None and size > max_bytes:
        raise InvalidRunError(f"{what} is longer than {max_bytes} UTF-8 bytes")
    if max_chars is not None and len(value) > max_chars:
        raise InvalidRunError(f"{what} must be 1 to {max_chars} characters long, got {len(value)}")
    return value


def check_id(value: Any, what: str) -> str:
    """A thread id, run id, owner or idempotency key: the event stores' id rules (non-empty
    str, at most 200 UTF-8 bytes, no NUL, no lone surrogate)."""
    from runstore.validation import MAX_ID_BYTES

    return _text(value, what, max_bytes=MAX_ID_BYTES)


def _choice(value: Any, what: str, accepted: Iterable[str]) -> str:
    accepted = tuple(accepted)
    if not isinstance(value, str) or value not in accepted:
        raise InvalidRunError(f"{what} must be one of {', '.join(accepted)}; got {value!r}")
    return value


def check_strategy(value: Any) -> MultitaskStrategy:
    """A `MultitaskStrategy`."""
    return _choice(value, "multitask_strategy", MULTITASK_STRATEGIES)  # type: ignore[return-value]


def check_cancel_action(value: Any) -> CancelAction:
    """A `CancelAction`."""
    return _choice(value, "action", CANCEL_ACTIONS)  # type: ignore[return-value]


def check_final_status(value: Any) -> RunStatus:
    """A terminal status (what `RunStore.finalize` accepts)."""
    return _choice(value, "status", [s for s in RUN_STATUSES if s in TERMINAL_STATUSES])  # type: ignore[return-value]


def check_statuses(value: Any) -> frozenset[str] | None:
    """A `RunStore.list_by_thread` status filter: ``None``, one status, or an iterable of them."""
    if value is None:
        return None
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, Iterable):
        raise InvalidRunError(f"status must be a status, a list of statuses or None; got {value!r}")
    return frozenset(_choice(item, "status", RUN_STATUSES) for item in items)


def check_seconds(value: Any, what: str, *, minimum: float = MIN_TTL_SECONDS) -> float:
    """A duration in seconds: an int or finite float in [minimum, `MAX_TTL_SECONDS`]."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRunError(
            f"{what} must be a number of seconds between {minimum:g} and {MAX_TTL_SECONDS:g}, "
            f"got {value!r}"
        )
    if not minimum <= value <= MAX_TTL_SECONDS:
        raise InvalidRunError(
            f"{what} must be between {minimum:g} and {MAX_TTL_SECONDS:g} seconds, got {value!r}"
        )
    return float(value)


def check_limit(value: Any, *, maximum: int = MAX_CLAIM_LIMIT, allow_none: bool = False) -> int | None:
    """A positive int limit up to ``maximum`` (``None`` too when ``allow_none``)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise InvalidRunError(f"limit must be an int from 1 to {maximum}, got {value!r}")
    return value


def check_kind(value: Any) -> str:
    """An operation kind: 1 to `MAX_KIND_LENGTH` characters."""
    return _text(value, "kind", max_chars=MAX_KIND_LENGTH)


def check_stop_reason(value: Any) -> str | None:
    """``None`` or 1 to `MAX_STOP_REASON_LENGTH` characters."""
    return None if value is None else _text(value, "stop_reason", max_chars=MAX_STOP_REASON_LENGTH)


def check_error(value: Any) -> str | None:
    """``None`` or a non-empty str (a message or a traceback)."""
    return None if value is None else _text(value, "error")


def check_metadata(value: Any) -> dict[str, Any]:
    """A mapping of JSON values (or ``None`` for ``{}``), as event metadata; returns a copy."""
    from runstore.errors import InvalidEventError
    from runstore.validation import validate_metadata

    try:
        return validate_metadata(value)
    except InvalidEventError as exc:
        raise InvalidRunError(str(exc)) from None


# -- the protocol -----------------------------------------------------------------------


class RunStore(ABC):
    """Runs, their leases and one active run per thread; the module docstring states the contract."""

    #: Capabilities are declared at registration; this mirrors them for introspection.
    capabilities: ClassVar[frozenset[str]] = frozenset()

    #: The time every lease decision uses (see the module docstring). Replace it on an
    #: instance (``store.clock = ManualClock(...)``) to control time in tests.
    clock: Clock = staticmethod(system_clock)

    def now(self) -> datetime:
        """Read `clock` once, checking that it returned an aware datetime."""
        return check_time(self.clock())

    @abstractmethod
    async def create(
        self,
        thread_id: str,
        *,
        run_id: str | None = None,
        kind: str = "run",
        multitask_strategy: MultitaskStrategy = "reject",
        idempotency_key: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> CreateResult:
        """Create a pending run on ``thread_id`` applying ``multitask_strategy`` atomically.

        Raises `ThreadBusyError` (reject), `LeaseHeldError` (interrupt/rollback with a
        live lease), `RunExistsError` (``run_id`` taken) or `IdempotencyConflictError`
        (the key belongs to another thread). ``run_id=None`` generates a UUID.
        """

    @abstractmethod
    async def start(self, run_id: str, owner: str, ttl: float) -> RunRecord:
        """Move the thread's active pending run to ``running`` under a lease of ``ttl`` seconds.

        Issues a new fencing token (``fence``). Repeating the call as the same owner
        while its lease is live returns the run unchanged. Raises `RunNotFoundError`,
        `RunQueuedError`, `RunAlreadyStartedError` or `RunFinishedError`.
        """

    @abstractmethod
    async def renew_lease(
        self, run_id: str, owner: str, ttl: float
    ) -> tuple[bool, CancelAction | None]:
        """Extend the owner's live lease to ``now + ttl``; return ``(renewed, cancel_action)``.

        ``renewed`` is False when ``owner`` holds no live lease on a running run (then
        stop writing: another worker may take over). ``cancel_action`` is the run's
        pending cancel request either way (``None`` for none or an unknown run).
        """

    @abstractmethod
    async def request_cancel(self, run_id: str, action: CancelAction = "interrupt") -> CancelAction:
        """Ask the run to stop; the first request wins and every caller gets its action.

        A pending run is cancelled at once (status ``cancelled``); a running run keeps
        running until its owner sees the request (`renew_lease`) and finalizes it.
        Raises `RunNotFoundError`, or `RunFinishedError` for a run that ended without one.
        """

    @abstractmethod
    async def finalize(
        self,
        run_id: str,
        owner: str,
        status: RunStatus,
        *,
        stop_reason: str | None = None,
        error: str | None = None,
    ) -> RunRecord:
        """End the run with a terminal ``status`` while ``owner`` holds its live lease.

        With a cancel pending, only ``cancelled`` or ``interrupted`` are accepted
        (`CancelPendingError`). The fencing token is retired and the oldest queued run
        of the thread becomes active. Repeating the call as the same owner with the
        same status returns the stored run. Raises `RunNotFoundError`, `LeaseLostError`
        or `RunFinishedError`.
        """

    @abstractmethod
    async def claim_expired(
        self, owner: str, ttl: float, *, grace: float, limit: int = 100
    ) -> list[RunRecord]:
        """Take over running runs whose lease ended at least ``grace`` seconds ago.

        Each such run is claimed by exactly one caller, whatever runs concurrently: its
        owner becomes ``owner`` with a lease of ``ttl`` seconds and a new fencing token.
        At most ``limit`` runs, the longest-expired first; an empty list means none
        were free. Pending cancel requests stay pending.
        """

    @abstractmethod
    async def get(self, run_id: str) -> RunRecord | None:
        """The run, or ``None`` if there is none."""

    @abstractmethod
    async def list_by_thread(
        self,
        thread_id: str,
        *,
        status: RunStatus | Iterable[RunStatus] | None = None,
        limit: int | None = None,
    ) -> list[RunRecord]:
        """The thread's runs in creation order (optionally only those statuses, at most ``limit``)."""

    @abstractmethod
    async def delete(self, run_id: str) -> bool:
        """Delete the run; return whether it existed.

        Deleting the active run makes the oldest queued run active; deleting a running
        run retires its fencing token (its owner's writes become stale).
        """

    async def close(self) -> None:
        """Release resources; idempotent. The store is unusable afterwards."""
        return None
