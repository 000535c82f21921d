"""Every call of the PostgreSQL backends runs on a connection leased here (`PostgresCalls.run`,
or `PostgresCalls.query` for one statement).

The event store and the saver take raw asyncpg connections from the SQLAlchemy engine
they share for a URL (one pool, one ``search_path``, one size limit) and keep a few
leased between calls. `PostgresCalls.run` holds the rules both inherit (docs/reliability.md):

- Clean or gone. A call that fails or is cancelled mid-statement leaves its
  connection possibly mid-protocol or inside a transaction (holding the thread's
  advisory lock). Before the error reaches the caller, the connection is rolled back
  (``ROLLBACK``, which first waits for asyncpg's cancel request to settle) or, if that
  does not finish in time, closed: it is never used again inside a transaction, no
  lock stays held, and the call's transaction is whole or absent.
- Bounded. Connecting and checking a pooled connection wait at most
  ``connect_timeout``, each statement at most ``command_timeout``, a whole call
  (waiting for a connection, retries and the rollback included) at most
  ``operation_timeout`` (`PostgresTimeouts`). The attempts run in runstore's one retry
  loop (`runstore.retry.retried`): each is cut to what is left of the call's deadline,
  and so are the bounds it hands the driver (the statement timeout of `PostgresCalls.query`,
  the connect and ping timeouts of the engine's pool hooks, the rollback's wait).
- Retried only where that cannot write twice. A connection failure is retried on a
  fresh connection until the operation deadline for reads, idempotent writes and a
  transaction whose ``COMMIT`` was never sent (the first retry at once: the usual cause
  is one pooled connection the server closed); otherwise the outcome is unknown.
- Reported as `BackendUnavailableError` (driver error as ``__cause__``), whose
  ``write_may_have_happened`` is true exactly when a write's commit may have been
  sent and its answer never came.

`PostgresCalls.query` is `PostgresCalls.run` for one statement call, the saver's hot path: its first
attempt on an idle leased connection is bounded by the statement's own timeout (cut to
the call's deadline), so it needs no ``asyncio.timeout`` of its own; a failed first
attempt goes on to the same retries under the same deadline.

`run_statement_batch` is the saver's group-commit callback
(`runstore.batching`): a batch of write statements, one ``executemany``
(one implicit transaction) per statement kind.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from runstore.batching import Outcome
from runstore.cancellation import wait_until_done
from runstore.errors import (
    BackendRefusedError,
    BackendUnavailableError,
    MissingDriverError,
    RunstoreError,
    SchemaNotSetUpError,
)
from runstore.moved import renamed_attribute
from runstore.retry import BACKOFF, Deadline, deadline_cause, retried
from runstore.sql.dialect import driver_connection

from .connect_options import refusal_hint
from .settings import PostgresTimeouts

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

R = TypeVar("R")

__all__ = [
    "PostgresCalls",
    "Statement",
    "connection_lost",
    "import_asyncpg",
    "run_statement_batch",
]

log = logging.getLogger(__name__)

#: SQLSTATE of a statement naming a table that does not exist.
UNDEFINED_TABLE = "42P01"

#: One write: SQL text and its arguments.
Statement = tuple[str, Sequence[Any]]


def import_asyncpg() -> Any:
    """The asyncpg module, or `MissingDriverError` naming the extra to install."""
    try:
        import asyncpg
    except ImportError:
        raise MissingDriverError("postgres", "asyncpg", "postgres") from None
    return asyncpg


def driver_error(exc: BaseException) -> BaseException:
    """The asyncpg or OS error under SQLAlchemy's wrappers of it (``exc`` itself if none)."""
    while exc.__cause__ is not None and type(exc).__module__.startswith("sqlalchemy"):
        exc = exc.__cause__
    return exc


def connection_lost(exc: BaseException, conn: Any | None = None) -> bool:
    """Whether ``exc`` means the connection or the server failed, not the statement.

    Network errors, timeouts, the server shutting down, crashing or refusing new
    sessions. An asyncpg client error counts only when it left ``conn`` closed
    (the same class also reports bad arguments, which no retry fixes).
    """
    exc = driver_error(exc)
    if isinstance(exc, ssl.SSLCertVerificationError):
        return False  # the server's certificate is not trusted: no retry changes that
    if isinstance(exc, OSError | TimeoutError):
        return True
    asyncpg = import_asyncpg()
    errors = asyncpg.exceptions
    if isinstance(
        exc,
        errors.PostgresConnectionError
        | errors.AdminShutdownError
        | errors.CrashShutdownError
        | errors.CannotConnectNowError
        | errors.IdleSessionTimeoutError
        | errors.TooManyConnectionsError,
    ):
        return True
    return (
        isinstance(exc, errors.InterfaceError | errors.InternalClientError)
        and not isinstance(exc, errors.DataError)
        and (conn is None or conn.is_closed())
    )


class _Lease:
    """A connection checked out of the engine: its SQLAlchemy wrapper and the asyncpg one."""

    __slots__ = ("conn", "sa_conn")

    def __init__(self, sa_conn: AsyncConnection, conn: Any) -> None:
        self.sa_conn = sa_conn
        self.conn = conn

    @property
    def clean(self) -> bool:
        """Open, idle and outside any transaction (asyncpg's view after the last reply)."""
        return not self.conn.is_closed() and not self.conn.is_in_transaction()


class _Failed(Exception):
    """One attempt lost its connection; ``sent`` says whether its write may have committed."""

    def __init__(self, cause: BaseException, sent: bool) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.sent = sent


def _lost(exc: Exception) -> bool:
    """The retry loop's test: an attempt that lost its connection (`_Failed`) is retried."""
    return isinstance(exc, _Failed)


class _Sharing:
    """The `PostgresCalls` objects of one engine, and how many of their callers wait for its pool."""

    def __init__(self) -> None:
        self.waiting = 0
        self.members: weakref.WeakSet[PostgresCalls] = weakref.WeakSet()


def _sharing(engine: AsyncEngine) -> _Sharing:
    pool = engine.sync_engine.pool
    sharing: _Sharing | None = getattr(pool, "_runstore_sharing", None)
    if sharing is None:
        sharing = _Sharing()
        pool._runstore_sharing = sharing  # type: ignore[attr-defined]
    return sharing


class _Progress:
    """What one of `PostgresCalls.run`'s attempts has done so far, read when a deadline cuts it."""

    __slots__ = ("sent",)

    def __init__(self) -> None:
        self.sent = False


class PostgresCalls:
    """Raw asyncpg connections borrowed from the shared SQLAlchemy engine; see the module docstring.

    Up to ``max_idle`` (at most half the engine's pool) stay checked out between
    calls: a checkout from the engine's pool runs its event hooks (and a ping after a
    second idle), which costs more than a small statement. While any caller of the
    engine (this store's or another's) waits for a pooled connection, nothing stays
    parked: the idle ones go back to the pool and so does every connection a call
    ends with, so a waiter is served in pool order instead of starving while callers
    that arrived later reuse parked connections. ``backend`` names the user in errors
    (``"postgres event store"``).
    """

    def __init__(
        self,
        engine: AsyncEngine,
        max_idle: int,
        *,
        backend: str,
        timeouts: PostgresTimeouts,
        synchronous_commit: bool = True,
    ) -> None:
        self._engine = engine
        pool = engine.sync_engine.pool
        size = pool.size() if hasattr(pool, "size") else 2
        self._max_idle = max(0, min(max_idle, max(1, size // 2)))
        self.backend = backend
        self.timeouts = timeouts
        # Session settings live only while the connection is leased: the pool is shared
        # with the event store, so they are reset before a connection goes back.
        self._setup = None if synchronous_commit else "SET synchronous_commit = off"
        self._reset = None if synchronous_commit else "RESET synchronous_commit"
        self._server_error: type[BaseException] = import_asyncpg().PostgresError
        self._idle: list[_Lease] = []
        self._closed = False
        self._tasks: set[asyncio.Future[None]] = set()
        self._sharing = _sharing(engine)
        self._sharing.members.add(self)

    async def run(
        self,
        fn: Callable[[Any], Awaitable[R]],
        *,
        operation: str,
        write: bool = False,
        idempotent: bool = False,
        begin: str | None = None,
        deadline: Deadline | None = None,
    ) -> R:
        """Run ``fn(connection)`` under the rules of the module docstring and return its result.

        With ``begin`` (e.g. ``"BEGIN"``), ``fn`` runs inside that transaction, which
        this call commits; ``fn`` must not end it. ``write``/``idempotent`` decide the
        retries and ``write_may_have_happened``; ``operation`` names the call in errors.
        ``deadline``: the deadline of a larger call this one is part of (default: one of
        ``operation_timeout`` from now).
        """
        if self._closed:
            raise RuntimeError(f"this {self.backend} is closed")
        if deadline is None:
            deadline = Deadline.after(self.timeouts.operation)
        return await self._retried(fn, operation, write, idempotent, begin, deadline, None)

    async def query(
        self,
        method: str,
        args: tuple[Any, ...],
        *,
        operation: str,
        write: bool = False,
        idempotent: bool = False,
    ) -> Any:
        """``connection.<method>(*args)``, one asyncpg statement call (``execute``,
        ``executemany``, ``fetchrow``, ``fetchmany``), under the rules of `run` with less
        work per call (module docstring)."""
        if self._closed:
            raise RuntimeError(f"this {self.backend} is closed")
        deadline = Deadline.after(self.timeouts.operation)
        command = self.timeouts.command
        failed: _Failed | None = None
        idle = self._idle
        if idle:
            lease = idle.pop()
            if lease.clean:
                try:
                    result = await getattr(lease.conn, method)(*args, timeout=deadline.cap(command))
                except BaseException as exc:
                    # An autocommit statement commits as it runs: sent.
                    error = await self._failure(lease, exc, operation, deadline, sent=True)
                    if error is None:
                        raise
                    if not isinstance(error, _Failed):
                        raise error from exc
                    failed = error
                else:
                    self._give_back(lease)
                    return result
            else:
                self._in_background(self._drop(lease))

        # Explicit, as on the first attempt: a caller's engine (`from_engine`) may give its
        # connections no command timeout.
        async def call(conn: Any) -> Any:
            return await getattr(conn, method)(*args, timeout=deadline.cap(command))

        return await self._retried(call, operation, write, idempotent, None, deadline, failed)

    async def _retried(
        self,
        fn: Callable[[Any], Awaitable[R]],
        operation: str,
        write: bool,
        idempotent: bool,
        begin: str | None,
        deadline: Deadline,
        failed: _Failed | None,
    ) -> R:
        """`run`'s attempts (`runstore.retry.retried`) until one succeeds or ``deadline``;
        ``failed``: the first attempt was made (by `query`) and lost its connection."""
        # Whether the attempt in progress has sent what may commit (a deadline that cuts
        # it there leaves the write's outcome unknown), and whether an earlier one had.
        progress = _Progress()
        may_have_written = False

        def judge(lost: _Failed) -> None:
            nonlocal may_have_written
            if write and lost.sent:
                may_have_written = True
                if not idempotent:
                    error = self._unavailable(operation, True, lost.cause)
                    raise error from error.__cause__

        async def attempt(deadline: Deadline) -> R:
            try:
                return await self._attempt(fn, operation, begin, deadline, progress)
            except _Failed as lost:
                judge(lost)
                raise

        def give_up(last: BaseException | None) -> BackendUnavailableError:
            cause = deadline_cause(last.cause if isinstance(last, _Failed) else last, deadline)
            return self._unavailable(operation, write and (may_have_written or progress.sent), cause)

        def log_retry(lost: Exception, retries: int) -> None:
            cause = lost.cause if isinstance(lost, _Failed) else lost
            (log.warning if retries == 0 else log.debug)(
                "%s: %s lost its connection (%s); retrying on a fresh one for up to %gs",
                self.backend, operation, type(driver_error(cause)).__name__, deadline.timeout,
            )

        if failed is not None:
            judge(failed)
        return await retried(
            attempt, deadline, transient=_lost, give_up=give_up, backoff=BACKOFF,
            immediate_first=True, failed=failed, on_retry=log_retry,
        )

    def _unavailable(
        self, operation: str, may_have_written: bool, cause: BaseException
    ) -> BackendUnavailableError:
        return BackendUnavailableError(
            self.backend, operation, write_may_have_happened=may_have_written,
            cause=driver_error(cause),
        )

    def _refused(self, operation: str, exc: BaseException) -> RunstoreError:
        if isinstance(exc, import_asyncpg().exceptions.QueryCanceledError):
            # statement_timeout or a cancel: the server gave up and rolled the statement back.
            return self._unavailable(operation, False, exc)
        code = getattr(exc, "sqlstate", None)
        if code == UNDEFINED_TABLE:
            # A store from `from_conn_string` whose setup() never ran (or ran in another schema).
            return SchemaNotSetUpError(self.backend, operation, exc, code)
        return BackendRefusedError(self.backend, operation, exc, code, hint=refusal_hint(exc))

    async def _attempt(
        self,
        fn: Callable[[Any], Awaitable[R]],
        operation: str,
        begin: str | None,
        deadline: Deadline,
        progress: _Progress,
    ) -> R:
        progress.sent = False
        try:
            lease = await self._take(deadline)
        except Exception as exc:
            if connection_lost(exc):
                raise _Failed(exc, sent=False) from exc
            # Refused for good (authentication, a missing database): no retry helps.
            error = self._refused(operation, driver_error(exc))
            raise error from error.__cause__
        conn = lease.conn
        try:
            if begin is None:
                progress.sent = True  # an autocommit statement commits as it runs
                result = await fn(conn)
            else:
                await conn.execute(begin)
                result = await fn(conn)
                progress.sent = True  # from here the transaction may commit
                await conn.execute("COMMIT")
        except BaseException as exc:
            instead = await self._failure(lease, exc, operation, deadline, progress.sent)
            if instead is None:
                raise
            raise instead from exc
        self._give_back(lease)
        return result

    async def _failure(
        self, lease: _Lease, exc: BaseException, operation: str, deadline: Deadline, sent: bool
    ) -> BaseException | None:
        """After a call on ``lease`` raised ``exc``: give the connection back, or roll it
        back or close it, and return what to raise instead (`_Failed` if the connection
        was lost), or ``None`` to raise ``exc`` itself (a cancellation, say)."""
        lost = isinstance(exc, Exception) and connection_lost(exc, lease.conn)
        refused = isinstance(exc, self._server_error) and not lost
        if refused and lease.clean:
            # The server refused a statement outside any transaction and said so
            # (its reply is complete): the connection is as good as before.
            self._give_back(lease)
            return self._refused(operation, exc)
        await self._settle(lease, deadline)
        if lost:
            return _Failed(exc, sent=sent)
        if refused:  # its transaction was rolled back by _settle
            return self._refused(operation, exc)
        return None

    async def _take(self, deadline: Deadline) -> _Lease:
        """An idle leased connection still open and clean, else a fresh one from the pool."""
        while self._idle:
            lease = self._idle.pop()
            if lease.clean:
                return lease
            self._in_background(self._drop(lease))
        return await self._fresh(deadline)

    async def _fresh(self, deadline: Deadline) -> _Lease:
        sharing = self._sharing
        sharing.waiting += 1
        try:
            pool: Any = self._engine.sync_engine.pool
            size = getattr(pool, "size", None)
            if size is not None and pool.checkedout() >= size():
                # The pool is out: connections parked idle would never reach us.
                for member in list(sharing.members):
                    member._park_none()
            sa_conn = await self._engine.connect()
        finally:
            sharing.waiting -= 1
        lease = None
        try:
            lease = _Lease(sa_conn, await driver_connection(sa_conn))
            if self._setup is not None:
                await lease.conn.execute(self._setup, timeout=deadline.cap(self.timeouts.connect))
        except BaseException:
            if lease is not None:
                await self._drop(lease)
            else:
                await _invalidate(sa_conn)
            raise
        return lease

    async def _settle(self, lease: _Lease, deadline: Deadline) -> None:
        """After a failed or cancelled call: roll ``lease`` back and keep it, or close it.

        Runs in its own task, which the caller waits out (`runstore.cancellation`: a
        cancellation meanwhile is raised once it has ended). Waits at most
        ``command_timeout`` and never past ``deadline``.
        """
        if lease.conn.is_closed():
            await self._drop(lease)
            return
        budget = deadline.cap(self.timeouts.command)
        task = asyncio.ensure_future(self._roll_back(lease, budget))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        await wait_until_done(task)

    async def _roll_back(self, lease: _Lease, budget: float) -> None:
        if budget > 0:
            try:
                # Waits for a statement the caller abandoned (asyncpg sends the server a
                # cancel request) and ends whatever transaction the call had open.
                await lease.conn.execute("ROLLBACK", timeout=budget)
            except Exception:  # no answer in time, or the connection died: close it
                pass
            else:
                if lease.clean:
                    self._give_back(lease)
                    return
        await self._drop(lease)

    def _give_back(self, lease: _Lease) -> None:
        if not lease.clean:
            self._in_background(self._drop(lease))
        elif self._closed or len(self._idle) >= self._max_idle or self._sharing.waiting:
            self._in_background(self._release(lease))
        else:
            self._idle.append(lease)

    def _park_none(self) -> None:
        """Return every idle connection to the engine's pool (someone waits for one)."""
        idle, self._idle = self._idle, []
        for lease in idle:
            self._in_background(self._release(lease))

    def _in_background(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _release(self, lease: _Lease) -> None:
        """Return a clean connection to the engine's pool, its session settings reset."""
        if self._reset is not None:
            try:
                await lease.conn.execute(self._reset, timeout=self.timeouts.command)
            except Exception:  # cannot restore the session: never pool it
                await self._drop(lease)
                return
        try:
            await lease.sa_conn.close()
        except Exception:
            await self._drop(lease)

    async def _drop(self, lease: _Lease) -> None:
        """Close the connection at once and remove it from the engine's pool."""
        lease.conn.terminate()
        await _invalidate(lease.sa_conn)

    async def release_idle(self) -> None:
        """Return the idle connections to the engine's pool (before it is disposed, say)."""
        idle, self._idle = self._idle, []
        for lease in idle:
            await self._release(lease)

    async def aclose(self) -> None:
        """Return every idle connection to the engine's pool; later calls raise."""
        self._closed = True
        await self.release_idle()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


async def _invalidate(sa_conn: AsyncConnection) -> None:
    """Remove ``sa_conn``'s connection from its pool (a dead one may fail to close: dropped)."""
    try:
        await sa_conn.invalidate()
        await sa_conn.close()
    except Exception:
        pass


async def one_at_a_time(
    items: Sequence[Any], run: Callable[[Any], Awaitable[Any]]
) -> list[Outcome]:
    """``run(item)`` for each item in order, one `Outcome` each: how a batch that failed as a
    whole is re-run so only the bad call fails. Once the database is unavailable the rest
    get that error without a call each (not one deadline per call)."""
    outcomes: list[Outcome] = []
    unavailable: BackendUnavailableError | None = None
    for item in items:
        if unavailable is not None:
            outcomes.append((False, unavailable))
            continue
        try:
            outcomes.append((True, await run(item)))
        except BackendUnavailableError as exc:
            unavailable = exc
            outcomes.append((False, exc))
        except Exception as exc:
            outcomes.append((False, exc))
    return outcomes


#: How errors name `run_statement_batch`'s calls.
_WRITES = "write checkpoints"


async def run_statement_batch(leases: PostgresCalls, batch: list[Statement]) -> list[Outcome]:
    """Run a batch of write statements; one `Outcome` per statement.

    Statements are grouped by SQL text, in order of first arrival, and each group
    sent as one ``executemany`` (asyncpg pipelines its argument sets in one round
    trip and runs them as one implicit transaction, so a group needs no
    ``BEGIN``/``COMMIT``). Groups commit one after another, each on its own: every
    statement is a whole write by itself, so a batch needs no transaction around its
    groups, and wrapping two groups in one costs two more round trips than the
    commit it saves (docs/benchmarks.md). Rows one caller touches twice keep their
    order. Every write statement is idempotent, so a lost connection is retried. If
    a group fails on a statement, it is re-run one statement at a time, so only the
    bad one fails; if the database is unavailable, every statement not yet committed
    gets that error.
    """
    if len(batch) == 1:
        # The lone caller's batch (group commit's inline op): one statement, no grouping.
        statement, args = batch[0]
        try:
            await leases.query(
                "execute", (statement, *args), operation=_WRITES, write=True, idempotent=True
            )
        except Exception as exc:
            return [(False, exc)]
        return [(True, None)]
    groups: dict[str, list[int]] = {}
    for i, (statement, _) in enumerate(batch):
        groups.setdefault(statement, []).append(i)
    outcomes: list[Outcome] = [(False, None)] * len(batch)
    unavailable: BackendUnavailableError | None = None
    for statement, positions in groups.items():
        if unavailable is not None:
            for i in positions:
                outcomes[i] = (False, unavailable)
            continue
        if len(positions) > 1:
            many = [batch[i][1] for i in positions]
            try:
                await leases.query(
                    "executemany", (statement, many), operation=_WRITES, write=True, idempotent=True
                )
            except BackendUnavailableError as exc:
                unavailable = exc
                for i in positions:
                    outcomes[i] = (False, exc)
                continue
            except Exception:  # retried one by one below
                pass
            else:
                for i in positions:
                    outcomes[i] = (True, None)
                continue

        async def alone(args: Sequence[Any], s: str = statement) -> None:
            await leases.query("execute", (s, *args), operation=_WRITES, write=True, idempotent=True)

        alone_outcomes = await one_at_a_time([batch[i][1] for i in positions], alone)
        for i, outcome in zip(positions, alone_outcomes, strict=True):
            outcomes[i] = outcome
            if not outcome[0] and isinstance(outcome[1], BackendUnavailableError):
                unavailable = outcome[1]
    return outcomes


# The former name, for one release (runstore.moved).
__getattr__ = renamed_attribute(__name__)
