"""The SQL run store: one implementation of the `runstore.RunStore` contract for every SQL backend.

Each operation is written once, as a *script*: a generator that yields `Stmt`\\ s (SQL
with ``?`` placeholders) and receives their rows, deciding from what it read what to
write next. A `RunDriver`, one per backend in its plugin, runs the whole script inside
one transaction on one connection: the sqlite and memory drivers call `run_script` in
one go (sqlite's ``BEGIN IMMEDIATE`` serializes every writer of the file), the
PostgreSQL driver awaits each statement. Where a database serializes writers with row
locks instead, its driver's `RunDialect` says so and the scripts lock what they decide
on (the thread's row ``FOR UPDATE``, claims ``FOR UPDATE SKIP LOCKED``). So the rules
live in one place, and every check-and-write is atomic: nothing is checked outside the
transaction that writes. Nothing here knows a particular database.

Schema (component ``runs``, versioned by `runstore.sql.migrations`):

* ``runstore_runs``: one row per run; a partial unique index allows one ``active`` row
  per thread, another makes idempotency keys unique. Times are microseconds since the
  Unix epoch, read from the caller's clock (`runstore.runs.RunStore.clock`).
* ``runstore_run_threads``: one row per thread ever used, never deleted: ``fence`` is
  the thread's fencing-token counter (the current token while a run holds the lease)
  and ``runs`` numbers the thread's runs in creation order. Locking this row
  serializes everything that changes which run holds the thread.

Why one module of this size: the scripts are the run store's rules and share their
building blocks (`_locked_run`, `_end`, `_promote`), and the lock order (thread row,
then run row) is only visible with all of them together; `SqlRunStore` is the
validation in front of them, a few lines per operation.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from runstore.clock import from_micros, seconds_to_micros, to_micros
from runstore.errors import (
    CancelPendingError,
    IdempotencyConflictError,
    InvalidRunError,
    LeaseHeldError,
    LeaseLostError,
    RunAlreadyStartedError,
    RunExistsError,
    RunFinishedError,
    RunNotFoundError,
    RunQueuedError,
    ThreadBusyError,
)
from runstore.runs.protocol import (
    CANCEL_STATUSES,
    TERMINAL_STATUSES,
    CancelAction,
    CreateResult,
    MultitaskStrategy,
    RunRecord,
    RunStatus,
    RunStore,
    check_cancel_action,
    check_error,
    check_final_status,
    check_id,
    check_kind,
    check_limit,
    check_metadata,
    check_seconds,
    check_statuses,
    check_stop_reason,
    check_strategy,
)
from runstore.sql.migrations import Migration
from runstore.standalone import Standalone
from runstore.validation import dumps, loads

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

T = TypeVar("T")

RUNS = "runstore_runs"
THREADS = "runstore_run_threads"
COMPONENT = "runs"

#: Column order of every run row the scripts read.
COLUMNS = (
    "run_id", "thread_id", "seq", "status", "active", "kind", "owner", "lease_expires_at",
    "fence", "cancel_action", "cancel_requested_at", "stop_reason", "error",
    "idempotency_key", "metadata", "created_at", "updated_at",
)  # fmt: skip
_COLS = ", ".join(COLUMNS)

_STATUS_LIST = "'pending', 'running', 'success', 'error', 'interrupted', 'timeout', 'cancelled'"

#: Version 1 of the schema; the same DDL serves every backend.
MIGRATIONS: list[Migration] = [
    Migration(
        1,
        [
            f"""CREATE TABLE {RUNS} (
    run_id TEXT PRIMARY KEY,
    thread_id TEXT NOT NULL,
    seq BIGINT NOT NULL,
    status VARCHAR(16) NOT NULL CHECK (status IN ({_STATUS_LIST})),
    active BOOLEAN NOT NULL,
    kind VARCHAR(32) NOT NULL,
    owner TEXT,
    lease_expires_at BIGINT,
    fence BIGINT,
    cancel_action VARCHAR(16),
    cancel_requested_at BIGINT,
    stop_reason TEXT,
    error TEXT,
    idempotency_key TEXT,
    metadata TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
)""",
            f"CREATE UNIQUE INDEX {RUNS}_one_active ON {RUNS} (thread_id) WHERE active",
            f"CREATE UNIQUE INDEX {RUNS}_idempotency ON {RUNS} (idempotency_key) "
            "WHERE idempotency_key IS NOT NULL",
            f"CREATE UNIQUE INDEX {RUNS}_thread_seq ON {RUNS} (thread_id, seq)",
            f"CREATE INDEX {RUNS}_expiry ON {RUNS} (lease_expires_at) WHERE status = 'running'",
            f"""CREATE TABLE {THREADS} (
    thread_id TEXT PRIMARY KEY,
    fence BIGINT NOT NULL,
    runs BIGINT NOT NULL
)""",
        ],
        "runs and per-thread fencing counters",
    )
]

Row = tuple[Any, ...]


@dataclass(frozen=True)
class Stmt:
    """One statement of a script: SQL with ``?`` placeholders and its parameters."""

    sql: str
    params: Sequence[Any] = ()


#: A script: yields statements, receives each one's rows, returns the operation's result.
Script = Generator[Stmt, list[Row], T]


class _Rows(Protocol):
    def fetchall(self) -> list[Any]: ...


class QmarkConnection(Protocol):
    """A synchronous DB-API style connection taking ``?`` placeholders (e.g. stdlib ``sqlite3``)."""

    def execute(self, sql: str, parameters: Sequence[Any], /) -> _Rows: ...


def run_script(conn: QmarkConnection, script: Script[T]) -> T:
    """Drive ``script`` on a synchronous connection (the caller owns the transaction)."""
    try:
        stmt = next(script)
        while True:
            stmt = script.send(conn.execute(stmt.sql, stmt.params).fetchall())
    except StopIteration as done:
        return done.value


class RunDialect:
    """What the scripts' SQL needs to know about a database; the defaults suit sqlite.

    A plugin whose database differs subclasses it and sets it as its driver's
    `RunDriver.dialect`.
    """

    #: Whether the scripts lock what they decide on (the thread's row, then the run's,
    #: ``FOR UPDATE``; claims ``FOR UPDATE SKIP LOCKED``). ``False`` where a write
    #: transaction already excludes every other writer (sqlite's ``BEGIN IMMEDIATE``).
    row_locks: ClassVar[bool] = False

    def in_list(self, column: str, values: Sequence[Any], params: list[Any]) -> str:
        """A condition ``column IN values`` for a non-empty list, appending its parameters."""
        params.extend(values)
        return f"{column} IN ({', '.join('?' * len(values))})"


def record(row: Row) -> RunRecord:
    """A `RunRecord` from a row in `COLUMNS` order."""
    (run_id, thread_id, _seq, status, active, kind, owner, lease, fence, action, requested,
     stop_reason, error, key, metadata, created, updated) = row  # fmt: skip
    return {
        "run_id": run_id,
        "thread_id": thread_id,
        "status": status,
        "active": bool(active),
        "kind": kind,
        "owner": owner,
        "lease_expires_at": None if lease is None else from_micros(int(lease)),
        "fence": None if fence is None else int(fence),
        "cancel_action": action,
        "cancel_requested_at": None if requested is None else from_micros(int(requested)),
        "stop_reason": stop_reason,
        "error": error,
        "idempotency_key": key,
        "metadata": loads(metadata),
        "created_at": from_micros(int(created)),
        "updated_at": from_micros(int(updated)),
    }


# -- script building blocks -------------------------------------------------------------


def _get(run_id: str, *, lock: bool = False) -> Script[RunRecord | None]:
    rows = yield Stmt(f"SELECT {_COLS} FROM {RUNS} WHERE run_id = ?" + (" FOR UPDATE" if lock else ""), (run_id,))
    return record(rows[0]) if rows else None


def _locked_run(run_id: str, dialect: RunDialect) -> Script[RunRecord]:
    """The run, read after locking its thread's row (then its own row) where rows are locked.

    Lock order is always thread row, then run row (claims too), so no two scripts
    wait on each other in a cycle. sqlite is serialized by ``BEGIN IMMEDIATE``.
    """
    if dialect.row_locks:
        rows = yield Stmt(
            f"SELECT t.thread_id FROM {THREADS} t JOIN {RUNS} r ON r.thread_id = t.thread_id "
            "WHERE r.run_id = ? FOR UPDATE OF t",
            (run_id,),
        )
        if not rows:
            raise RunNotFoundError(run_id)
    run = yield from _get(run_id, lock=dialect.row_locks)
    if run is None:
        raise RunNotFoundError(run_id)
    return run


def _active(thread_id: str, *, lock: bool) -> Script[RunRecord | None]:
    rows = yield Stmt(
        f"SELECT {_COLS} FROM {RUNS} WHERE thread_id = ? AND active" + (" FOR UPDATE" if lock else ""),
        (thread_id,),
    )
    return record(rows[0]) if rows else None


def _bump_fence(thread_id: str) -> Script[int]:
    """Advance the thread's fencing counter and return the new token."""
    rows = yield Stmt(f"UPDATE {THREADS} SET fence = fence + 1 WHERE thread_id = ? RETURNING fence", (thread_id,))
    return int(rows[0][0])


def _promote(thread_id: str, now: int) -> Script[None]:
    """Make the thread's oldest queued run active (the caller has just ended the active one)."""
    yield Stmt(
        f"UPDATE {RUNS} SET active = TRUE, updated_at = ? WHERE run_id = ("
        f"SELECT run_id FROM {RUNS} WHERE thread_id = ? AND status = 'pending' AND NOT active "
        "ORDER BY seq LIMIT 1)",
        (now, thread_id),
    )


def _end(run: RunRecord, now: int, sets: str, params: Sequence[Any]) -> Script[RunRecord]:
    """Take ``run`` off the thread (``active`` false, no lease) with the extra ``sets``.

    A running run's fencing token is retired; if it held the thread, the oldest
    queued run takes it.
    """
    rows = yield Stmt(
        f"UPDATE {RUNS} SET active = FALSE, lease_expires_at = NULL, updated_at = ?, {sets} "
        f"WHERE run_id = ? RETURNING {_COLS}",
        (now, *params, run["run_id"]),
    )
    if run["status"] == "running":
        yield from _bump_fence(run["thread_id"])
    if run["active"]:
        yield from _promote(run["thread_id"], now)
    return record(rows[0])


# -- the operations ---------------------------------------------------------------------


@dataclass(frozen=True)
class NewRun:
    """A validated `RunStore.create` request."""

    thread_id: str
    run_id: str
    kind: str
    strategy: MultitaskStrategy
    idempotency_key: str | None
    metadata: dict[str, Any]


def create_script(new: NewRun, now: int, dialect: RunDialect) -> Script[CreateResult]:
    """`RunStore.create`: lock the thread, honour the key, apply the strategy, insert."""
    # Upserting the thread row takes its row lock where rows are locked, so the checks below and
    # the insert are one serialized step per thread (no check-then-insert race).
    rows = yield Stmt(
        f"INSERT INTO {THREADS} (thread_id, fence, runs) VALUES (?, 0, 0) "
        f"ON CONFLICT (thread_id) DO UPDATE SET runs = {THREADS}.runs RETURNING runs",
        (new.thread_id,),
    )
    seq = int(rows[0][0]) + 1
    if new.idempotency_key is not None:
        rows = yield Stmt(f"SELECT {_COLS} FROM {RUNS} WHERE idempotency_key = ?", (new.idempotency_key,))
        if rows:
            existing = record(rows[0])
            if existing["thread_id"] != new.thread_id:
                raise IdempotencyConflictError(new.idempotency_key, existing)
            return CreateResult(existing, "existing")
    if (yield from _get(new.run_id)) is not None:
        raise RunExistsError(new.run_id)
    active = yield from _active(new.thread_id, lock=dialect.row_locks)
    interrupted: RunRecord | None = None
    queued = False
    if active is not None:
        if new.strategy == "reject":
            raise ThreadBusyError(new.thread_id, active)
        if new.strategy == "enqueue":
            queued = True
        else:
            lease = active["lease_expires_at"]
            if active["status"] == "running" and lease is not None and to_micros(lease) > now:
                raise LeaseHeldError(active)
            # The new run takes the thread, so the stopped run's end must not promote.
            interrupted = yield from _end(
                {**active, "active": False},
                now,
                "status = 'interrupted', stop_reason = ?, cancel_action = coalesce(cancel_action, ?), "
                "cancel_requested_at = coalesce(cancel_requested_at, ?)",
                (new.strategy, new.strategy, now),
            )
    yield Stmt(f"UPDATE {THREADS} SET runs = ? WHERE thread_id = ?", (seq, new.thread_id))
    rows = yield Stmt(
        f"INSERT INTO {RUNS} ({_COLS}) VALUES (?, ?, ?, 'pending', ?, ?, NULL, NULL, NULL, NULL, "
        f"NULL, NULL, NULL, ?, ?, ?, ?) RETURNING {_COLS}",
        (new.run_id, new.thread_id, seq, not queued, new.kind, new.idempotency_key,
         dumps(new.metadata), now, now),
    )  # fmt: skip
    return CreateResult(record(rows[0]), "enqueued" if queued else "created", interrupted)


def _lease_live(run: RunRecord, now: int) -> bool:
    lease = run["lease_expires_at"]
    return run["status"] == "running" and lease is not None and to_micros(lease) > now


def start_script(run_id: str, owner: str, ttl: int, now: int, dialect: RunDialect) -> Script[RunRecord]:
    """`RunStore.start`: pending and active -> running under a new lease and token."""
    run = yield from _locked_run(run_id, dialect)
    if run["status"] == "running":
        if run["owner"] == owner and _lease_live(run, now):
            return run
        raise RunAlreadyStartedError(run)
    if run["status"] in TERMINAL_STATUSES:
        raise RunFinishedError(run)
    if not run["active"]:
        ahead = yield from _active(run["thread_id"], lock=False)
        raise RunQueuedError(run, ahead["run_id"] if ahead else "?")
    fence = yield from _bump_fence(run["thread_id"])
    rows = yield Stmt(
        f"UPDATE {RUNS} SET status = 'running', owner = ?, lease_expires_at = ?, fence = ?, "
        f"updated_at = ? WHERE run_id = ? RETURNING {_COLS}",
        (owner, now + ttl, fence, now, run_id),
    )
    return record(rows[0])


def renew_script(run_id: str, owner: str, ttl: int, now: int) -> Script[tuple[bool, CancelAction | None]]:
    """`RunStore.renew_lease`: one conditional update; a miss reads the cancel action."""
    rows = yield Stmt(
        f"UPDATE {RUNS} SET lease_expires_at = ?, updated_at = ? WHERE run_id = ? AND owner = ? "
        "AND status = 'running' AND lease_expires_at > ? RETURNING cancel_action",
        (now + ttl, now, run_id, owner, now),
    )
    if rows:
        return True, rows[0][0]
    rows = yield Stmt(f"SELECT cancel_action FROM {RUNS} WHERE run_id = ?", (run_id,))
    return False, rows[0][0] if rows else None


def cancel_script(run_id: str, action: CancelAction, now: int, dialect: RunDialect) -> Script[CancelAction]:
    """`RunStore.request_cancel`: the first request is stored; a pending run ends at once."""
    run = yield from _locked_run(run_id, dialect)
    if run["cancel_action"] is not None:
        return run["cancel_action"]
    if run["status"] in TERMINAL_STATUSES:
        raise RunFinishedError(run)
    if run["status"] == "pending":
        yield from _end(
            run,
            now,
            "status = 'cancelled', stop_reason = ?, cancel_action = ?, cancel_requested_at = ?",
            (action, action, now),
        )
    else:
        yield Stmt(
            f"UPDATE {RUNS} SET cancel_action = ?, cancel_requested_at = ?, updated_at = ? WHERE run_id = ?",
            (action, now, now, run_id),
        )
    return action


def finalize_script(
    run_id: str,
    owner: str,
    status: RunStatus,
    stop_reason: str | None,
    error: str | None,
    now: int,
    dialect: RunDialect,
) -> Script[RunRecord]:
    """`RunStore.finalize`: only under the caller's live lease, honouring a pending cancel."""
    run = yield from _locked_run(run_id, dialect)
    if run["status"] in TERMINAL_STATUSES:
        if run["owner"] == owner and run["status"] == status:
            return run
        raise RunFinishedError(run)
    if run["owner"] != owner or not _lease_live(run, now):
        raise LeaseLostError(run, owner, from_micros(now))
    if run["cancel_action"] is not None and status not in CANCEL_STATUSES:
        raise CancelPendingError(run, status)
    return (
        yield from _end(run, now, "status = ?, stop_reason = ?, error = ?", (status, stop_reason, error))
    )


def claim_script(
    owner: str, ttl: int, grace: int, limit: int, now: int, dialect: RunDialect
) -> Script[list[RunRecord]]:
    """`RunStore.claim_expired`: conditional takeover, each run by exactly one claimer.

    Where rows are locked (PostgreSQL), the script locks the candidates' thread rows ``FOR UPDATE SKIP LOCKED`` (a run
    another claimer is taking is skipped, not waited for) and the takeover is an
    ``UPDATE`` whose ``WHERE`` repeats the expiry condition, so a lease renewed or
    claimed meanwhile is left alone.
    """
    cutoff = now - grace
    rows = yield Stmt(
        f"SELECT run_id, thread_id FROM {RUNS} WHERE status = 'running' AND lease_expires_at <= ? "
        "ORDER BY lease_expires_at, run_id LIMIT ?",
        (cutoff, limit),
    )
    order = [run_id for run_id, _ in rows]
    if dialect.row_locks and rows:
        params: list[Any] = []
        where = dialect.in_list("thread_id", sorted({thread for _, thread in rows}), params)
        locked = yield Stmt(
            f"SELECT thread_id FROM {THREADS} WHERE {where} ORDER BY thread_id FOR UPDATE SKIP LOCKED",
            params,
        )
        free = {thread for (thread,) in locked}
        order = [run_id for run_id, thread in rows if thread in free]
    if not order:
        return []
    params = [owner, now + ttl, now]
    where = dialect.in_list("run_id", order, params)
    taken = yield Stmt(
        f"UPDATE {RUNS} SET owner = ?, lease_expires_at = ?, updated_at = ? WHERE {where} "
        "AND status = 'running' AND lease_expires_at <= ? RETURNING run_id, thread_id",
        [*params, cutoff],
    )
    if not taken:
        return []
    params = []
    where = dialect.in_list("thread_id", [thread for _, thread in taken], params)
    yield Stmt(f"UPDATE {THREADS} SET fence = fence + 1 WHERE {where}", params)
    params = []
    where = dialect.in_list("run_id", [run_id for run_id, _ in taken], params)
    rows = yield Stmt(
        f"UPDATE {RUNS} SET fence = (SELECT t.fence FROM {THREADS} t "
        f"WHERE t.thread_id = {RUNS}.thread_id) WHERE {where} RETURNING {_COLS}",
        params,
    )
    position = {run_id: i for i, run_id in enumerate(order)}
    return sorted((record(r) for r in rows), key=lambda run: position[run["run_id"]])


def get_script(run_id: str) -> Script[RunRecord | None]:
    """`RunStore.get`."""
    return (yield from _get(run_id))


def list_script(
    thread_id: str, statuses: frozenset[str] | None, limit: int | None, dialect: RunDialect
) -> Script[list[RunRecord]]:
    """`RunStore.list_by_thread`: creation order."""
    sql = f"SELECT {_COLS} FROM {RUNS} WHERE thread_id = ?"
    params: list[Any] = [thread_id]
    if statuses is not None:
        if not statuses:
            return []
        sql += " AND " + dialect.in_list("status", sorted(statuses), params)
    sql += " ORDER BY seq"
    if limit is not None:
        sql += " LIMIT ?"
        params.append(limit)
    rows = yield Stmt(sql, params)
    return [record(r) for r in rows]


def delete_script(run_id: str, now: int, dialect: RunDialect) -> Script[bool]:
    """`RunStore.delete`: the thread moves on as if the run had ended."""
    try:
        run = yield from _locked_run(run_id, dialect)
    except RunNotFoundError:
        return False
    yield Stmt(f"DELETE FROM {RUNS} WHERE run_id = ?", (run_id,))
    if run["status"] == "running":
        yield from _bump_fence(run["thread_id"])
    if run["active"]:
        yield from _promote(run["thread_id"], now)
    return True


# -- drivers and the store ----------------------------------------------------------------


# -- bulk_import: a thread's runs read whole and written back as stored ------------------


def thread_ids_script(after: str | None, limit: int) -> Script[list[str]]:
    """Up to ``limit`` thread ids holding runs, ascending, after ``after``."""
    where, params = ("WHERE thread_id > ? ", [after]) if after is not None else ("", [])
    rows = yield Stmt(f"SELECT DISTINCT thread_id FROM {RUNS} {where}ORDER BY thread_id LIMIT ?", (*params, limit))
    return [str(r[0]) for r in rows]


def export_script(thread_id: str) -> Script[dict[str, Any]]:
    """The thread's runs as stored (creation order) and its fencing counter."""
    rows = yield Stmt(f"SELECT {_COLS} FROM {RUNS} WHERE thread_id = ? ORDER BY seq", (thread_id,))
    counters = yield Stmt(f"SELECT fence, runs FROM {THREADS} WHERE thread_id = ?", (thread_id,))
    runs = []
    for row in rows:
        run = dict(zip(COLUMNS, row, strict=True))
        run["active"] = bool(run["active"])
        runs.append(run)
    fence, count = (int(counters[0][0]), int(counters[0][1])) if counters else (0, 0)
    return {"thread_id": thread_id, "fence": fence, "runs_counter": count, "runs": runs}


def check_import(thread: Mapping[str, Any]) -> dict[str, Any]:
    """Validate one exported thread (`InvalidRunError` naming the field)."""
    try:
        thread_id = str(thread["thread_id"])
        runs = [dict(run) for run in thread["runs"]]
        fence, counter = int(thread["fence"]), int(thread["runs_counter"])
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidRunError(f"an imported run thread lacks or mangles a field: {exc!r}") from exc
    for run in runs:
        missing = [c for c in COLUMNS if c not in run]
        if missing or run["thread_id"] != thread_id:
            raise InvalidRunError(f"an imported run lacks {missing or ['its thread_id']}")
    return {"thread_id": thread_id, "runs": runs, "fence": fence, "runs_counter": counter}


def import_script(threads: Sequence[Mapping[str, Any]]) -> Script[int]:
    """Insert every run unless its id (or a unique key) is taken; raise each thread's counters."""
    inserted = 0
    marks = ", ".join("?" * len(COLUMNS))
    for thread in threads:
        for run in thread["runs"]:
            rows = yield Stmt(
                f"INSERT INTO {RUNS} ({_COLS}) VALUES ({marks}) ON CONFLICT DO NOTHING RETURNING run_id",
                tuple(run[c] for c in COLUMNS),
            )
            inserted += len(rows)
        yield Stmt(
            f"INSERT INTO {THREADS} (thread_id, fence, runs) VALUES (?, ?, ?) ON CONFLICT (thread_id) DO UPDATE SET "
            f"fence = CASE WHEN excluded.fence > {THREADS}.fence THEN excluded.fence ELSE {THREADS}.fence END, "
            f"runs = CASE WHEN excluded.runs > {THREADS}.runs THEN excluded.runs ELSE {THREADS}.runs END",
            (thread["thread_id"], thread["fence"], thread["runs_counter"]),
        )
    return inserted


class RunDriver(ABC):
    """Runs scripts on one database: writes in one transaction each, reads as they come.

    Scripts are passed as factories so a driver may run one again from the start (the
    PostgreSQL driver does after a unique-key race with another thread's create).
    """

    #: How the database's SQL differs (row locks, ``IN`` lists).
    dialect: ClassVar[RunDialect] = RunDialect()

    async def start(self) -> None:
        """Acquire what the driver holds for the store's lifetime."""
        return None

    @abstractmethod
    async def close(self) -> None:
        """Release it (idempotent)."""

    @abstractmethod
    async def write(self, script: Callable[[], Script[T]], operation: str) -> T:
        """Run ``script()`` in one write transaction; commit if it returns, else roll back."""

    @abstractmethod
    async def read(self, script: Callable[[], Script[T]], operation: str) -> T:
        """Run a read-only ``script()``."""


class SqlRunStore(RunStore, Standalone):
    """`RunStore` over a `RunDriver`; validation and time are handled here, once."""

    #: The engine of a file or server database (for `setup` and `schema_sql`).
    engine: AsyncEngine | None = None

    def __init__(self, driver: RunDriver) -> None:
        self._driver = driver
        self._dialect = driver.dialect
        self._closed = False

    async def close(self) -> None:
        """Release the driver's connections (idempotent)."""
        if not self._closed:
            self._closed = True
            await self._driver.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this run store is closed")

    def _now(self) -> int:
        self._check_open()
        return to_micros(self.now())

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
        """Create a pending run, applying the strategy atomically (see `RunStore.create`)."""
        new = NewRun(
            thread_id=check_id(thread_id, "thread_id"),
            run_id=str(uuid.uuid4()) if run_id is None else check_id(run_id, "run_id"),
            kind=check_kind(kind),
            strategy=check_strategy(multitask_strategy),
            idempotency_key=None if idempotency_key is None else check_id(idempotency_key, "idempotency_key"),
            metadata=check_metadata(metadata),
        )
        now = self._now()
        return await self._driver.write(lambda: create_script(new, now, self._dialect), "create")

    async def start(self, run_id: str, owner: str, ttl: float) -> RunRecord:
        """Start the active pending run under a new lease (see `RunStore.start`)."""
        run_id, owner = check_id(run_id, "run_id"), check_id(owner, "owner")
        ttl_us = seconds_to_micros(check_seconds(ttl, "ttl"))
        now = self._now()
        return await self._driver.write(lambda: start_script(run_id, owner, ttl_us, now, self._dialect), "start")

    async def renew_lease(self, run_id: str, owner: str, ttl: float) -> tuple[bool, CancelAction | None]:
        """Extend a live lease (see `RunStore.renew_lease`)."""
        run_id, owner = check_id(run_id, "run_id"), check_id(owner, "owner")
        ttl_us = seconds_to_micros(check_seconds(ttl, "ttl"))
        now = self._now()
        return await self._driver.write(lambda: renew_script(run_id, owner, ttl_us, now), "renew_lease")

    async def request_cancel(self, run_id: str, action: CancelAction = "interrupt") -> CancelAction:
        """Store the first cancel request (see `RunStore.request_cancel`)."""
        run_id, action = check_id(run_id, "run_id"), check_cancel_action(action)
        now = self._now()
        return await self._driver.write(lambda: cancel_script(run_id, action, now, self._dialect), "request_cancel")

    async def finalize(
        self,
        run_id: str,
        owner: str,
        status: RunStatus,
        *,
        stop_reason: str | None = None,
        error: str | None = None,
    ) -> RunRecord:
        """End the run under the caller's live lease (see `RunStore.finalize`)."""
        run_id, owner = check_id(run_id, "run_id"), check_id(owner, "owner")
        status = check_final_status(status)
        stop_reason, error = check_stop_reason(stop_reason), check_error(error)
        now = self._now()
        return await self._driver.write(
            lambda: finalize_script(run_id, owner, status, stop_reason, error, now, self._dialect), "finalize"
        )

    async def claim_expired(self, owner: str, ttl: float, *, grace: float, limit: int = 100) -> list[RunRecord]:
        """Take over runs whose lease ended ``grace`` seconds ago (see `RunStore.claim_expired`)."""
        owner = check_id(owner, "owner")
        ttl_us = seconds_to_micros(check_seconds(ttl, "ttl"))
        grace_us = seconds_to_micros(check_seconds(grace, "grace", minimum=0))
        count = check_limit(limit)
        assert count is not None
        now = self._now()
        return await self._driver.write(
            lambda: claim_script(owner, ttl_us, grace_us, count, now, self._dialect), "claim_expired"
        )

    async def get(self, run_id: str) -> RunRecord | None:
        """The run, or ``None``."""
        run_id = check_id(run_id, "run_id")
        self._check_open()
        return await self._driver.read(lambda: get_script(run_id), "get")

    async def list_by_thread(
        self,
        thread_id: str,
        *,
        status: RunStatus | Iterable[RunStatus] | None = None,
        limit: int | None = None,
    ) -> list[RunRecord]:
        """The thread's runs in creation order."""
        thread_id = check_id(thread_id, "thread_id")
        statuses = check_statuses(status)
        count = check_limit(limit, maximum=2**31 - 1, allow_none=True)
        self._check_open()
        return await self._driver.read(lambda: list_script(thread_id, statuses, count, self._dialect), "list_by_thread")

    # -- bulk_import: what runstore migrate needs (statuses, times, counters kept) ----------

    async def aexport_run_thread_ids(self, *, after: str | None = None, limit: int = 500) -> list[str]:
        """Up to ``limit`` thread ids holding runs, ascending, after ``after``."""
        self._check_open()
        return await self._driver.read(lambda: thread_ids_script(after, limit), "export_runs")

    async def aexport_runs(self, thread_id: str) -> dict[str, Any]:
        """The thread's runs as stored (times in microseconds) with its fencing counter."""
        thread_id = check_id(thread_id, "thread_id")
        self._check_open()
        return await self._driver.read(lambda: export_script(thread_id), "export_runs")

    async def aimport_runs(self, threads: Sequence[Mapping[str, Any]]) -> int:
        """Insert exported runs unless already held, in one transaction; return how many."""
        checked = [check_import(thread) for thread in threads]
        self._check_open()
        return await self._driver.write(lambda: import_script(checked), "import_runs")

    async def delete(self, run_id: str) -> bool:
        """Delete the run; the thread moves on (see `RunStore.delete`)."""
        run_id = check_id(run_id, "run_id")
        now = self._now()
        return await self._driver.write(lambda: delete_script(run_id, now, self._dialect), "delete")


__all__ = [
    "COMPONENT",
    "MIGRATIONS",
    "QmarkConnection",
    "RunDialect",
    "RunDriver",
    "Script",
    "SqlRunStore",
    "Stmt",
    "record",
    "run_script",
]
