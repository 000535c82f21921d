"""The exception hierarchy: every error runstore raises on purpose is a `RunstoreError`.

Every exception class of runstore lives here, whichever kind raises it, so
``from runstore.errors import ...`` reaches all of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from runstore.redaction import redact


class RunstoreError(Exception):
    """Base class of every error runstore raises deliberately."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Subclasses take their own constructor arguments, so pickle (a worker process
        # sending its error back) rebuilds the instance from its state instead.
        return (_rebuild, (type(self), self.args, self.__dict__))


def _rebuild(cls: type[RunstoreError], args: tuple[Any, ...], state: dict[str, Any]) -> RunstoreError:
    exc = cls.__new__(cls)
    exc.args = args
    exc.__dict__.update(state)
    return exc


class ConfigError(RunstoreError, ValueError):
    """A configuration key or value is unknown or invalid; the message says what is accepted."""


class BackendNotFoundError(RunstoreError, LookupError):
    """No registered backend serves a URL scheme (or name) for the requested kind."""

    def __init__(self, kind: str, scheme: str, available: Iterable[str]) -> None:
        self.kind = kind
        self.scheme = scheme
        self.available = sorted(set(available))
        listed = ", ".join(f"{s}://" for s in self.available) or "none"
        super().__init__(
            f"no {kind} backend serves the scheme {scheme!r}; installed {kind} backends "
            f"accept: {listed} (run `runstore backends` to see them all)"
        )


class MissingDriverError(RunstoreError, ImportError):
    """A backend's optional driver is not installed; the message names the extra to install."""

    def __init__(self, backend: str, module: str, extra: str, *, needed_by: str | None = None) -> None:
        self.backend = backend
        self.module = module
        self.extra = extra
        super().__init__(
            f"{needed_by or f'the {backend} backend'} needs the {module!r} "
            f"{'module' if needed_by else 'driver'}, which is not installed; "
            f"install it with: pip install 'runstore[{extra}]'"
        )


class PluginError(RunstoreError):
    """A plugin could not be loaded or registered something invalid."""


class DuplicateBackendError(PluginError):
    """Two plugins registered the same backend name or URL scheme for one kind."""


class InvalidURLError(RunstoreError, ValueError):
    """A backend URL cannot be parsed or carries options the backend does not accept."""


class BackendUnavailableError(RunstoreError):
    """A backend could not be reached, lost its connection, or timed out during a call.

    ``write_may_have_happened`` tells the caller how to recover: ``False`` means the
    call changed nothing (a read, or a write that provably never reached the server),
    so it is safe to retry; ``True`` means the write may have taken effect (it was sent
    but its outcome is unknown), so check before retrying or it may happen twice. The
    driver's error is ``__cause__``.
    """

    def __init__(
        self,
        backend: str,
        operation: str,
        *,
        write_may_have_happened: bool,
        cause: BaseException | None = None,
    ) -> None:
        self.backend = backend
        self.operation = operation
        self.write_may_have_happened = write_may_have_happened
        outcome = (
            "the write may have happened; check before retrying"
            if write_may_have_happened
            else "nothing was written; it is safe to retry"
        )
        reason = ""
        if cause is not None:
            # Driver messages name hosts and ports; mask any URL password they carry.
            detail = redact(str(cause)).strip()
            reason = f" ({type(cause).__name__}{': ' + detail if detail else ''})"
        super().__init__(f"{backend} is unavailable during {operation}{reason}: {outcome}")
        if cause is not None:
            self.__cause__ = cause


class BackendRefusedError(RunstoreError):
    """The backend answered a call with an error of its own and changed nothing.

    The server was reachable but refused the statement: a read-only session (a standby),
    a missing privilege, a constraint, a full disk. Retrying the same call gets the same
    answer until that is fixed. ``backend`` and ``operation`` name where it happened,
    ``code`` is the server's error code where it has one (PostgreSQL's SQLSTATE); the
    driver's error is ``__cause__``.
    """

    def __init__(
        self, backend: str, operation: str, cause: BaseException, code: str | None = None, *, hint: str | None = None
    ) -> None:
        self.backend = backend
        self.operation = operation
        self.code = code
        detail = redact(str(cause)).strip()
        reason = f"{type(cause).__name__}{': ' + detail if detail else ''}"
        coded = f", code {code}" if code else ""
        # What to fix: a retry gets the same answer until someone does.
        fix = f"; {hint}" if hint else ""
        super().__init__(f"{backend} refused {operation} ({reason}{coded}); nothing was written{fix}")
        self.__cause__ = cause


class SchemaNotSetUpError(BackendRefusedError):
    """A store opened without its migrations (``from_conn_string`` without ``setup()``)
    found a table or schema missing; the message says to call ``setup()``.

    The driver's error (``no such table``, ``undefined_table``, ``invalid_schema_name``)
    is ``__cause__``; nothing was written.
    """

    #: What to do, appended to every message.
    HINT = (
        "the store's tables are not set up: call `await store.setup()` once after "
        "`from_conn_string(...)` (or apply `schema_sql()`), or open it with `runstore.open`, "
        "which applies the migrations"
    )

    def __init__(self, backend: str, operation: str, cause: BaseException, code: str | None = None) -> None:
        super().__init__(backend, operation, cause, code, hint=self.HINT)


class OwnerContextMissingError(RunstoreError, LookupError):
    """`user_id=AUTO` was used but no owner is set in the request context."""


class IncompleteMessageRunLookupError(RunstoreError):
    """A paged lookup could not prove it saw every candidate row (no safe, decreasing cursor)."""


class StoreNotOpenedError(RunstoreError, LookupError):
    """A kind of store was used that its `runstore.open` call did not open (it was not asked for)."""


class CheckpointModeError(RunstoreError):
    """Base for checkpoint channel-mode errors."""


class CheckpointModeMismatchError(CheckpointModeError):
    """A full-mode process touched a thread written in delta mode."""

    def __init__(self, thread_id: str, message: str | None = None) -> None:
        self.thread_id = thread_id
        super().__init__(
            message
            or (
                f"thread {thread_id!r} was written in delta checkpoint mode, but this process "
                "runs in full mode; set checkpoint_channel_mode: delta to read it"
            )
        )


class CheckpointModeReconfigurationError(CheckpointModeError):
    """The channel mode or snapshot frequency was frozen and a different value was requested."""


class SyncCallOnEventLoopError(RunstoreError, RuntimeError):
    """A synchronous API was called from the thread running the backend's event loop."""


class InvalidSaverInputError(RunstoreError, ValueError):
    """A checkpoint saver call got an id or value no saver can store; the message names
    the field and what is accepted. Nothing was written."""


class UndeclaredChannelError(RunstoreError, ValueError):
    """A state update named a key that no schema of the bound graph declares.

    Such a value would be stored but never read back (neither the accessor nor the
    graph has a channel for it), so the update is refused before anything is written.
    ``key`` is the first undeclared key, ``declared`` the channels that are accepted.
    """

    def __init__(self, key: str, declared: Iterable[str]) -> None:
        self.key = key
        self.declared = sorted(declared)
        super().__init__(
            f"state key {key!r} is not a channel of the bound graph's state, so it could "
            f"never be read back; declared channels: {', '.join(self.declared)} (declare it "
            "in the graph's state schema, or bind the accessor with extra_schemas=[...])"
        )

    def __reduce__(self) -> tuple[type[UndeclaredChannelError], tuple[str, list[str]]]:
        return (type(self), (self.key, self.declared))


class InvalidCursorError(InvalidSaverInputError):
    """A ``list_threads`` cursor is malformed or was made for another ordering."""


class ThreadDeletedError(RunstoreError):
    """A write continued a thread that was deleted (a late write), so it was refused.

    The deleted thread's tombstone keeps such writes from bringing it back; a new
    history on the same thread id starts with a checkpoint that has no parent.
    """

    def __init__(self, thread_id: str) -> None:
        self.thread_id = thread_id
        super().__init__(
            f"thread {thread_id!r} was deleted; this write continues its deleted history and "
            "was refused (start the thread again with a checkpoint that has no parent)"
        )


class StaleFenceError(RunstoreError):
    """A write carried a fencing token older than one the thread (or, on a stream bridge,
    the run's stream) has already seen, so it was refused and nothing was written.

    ``fence`` is the token the write carried, ``current`` the store's fence (the highest
    token a write carried, or a lease grant raised it to). ``thread_id`` names the
    thread (``None`` on a stream bridge, which knows runs only), ``run_id`` the run's
    stream (stream bridges). The writer's lease was taken over: it must stop writing.
    """

    def __init__(self, thread_id: str | None, fence: int, current: int, *, run_id: str | None = None) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.fence = fence
        self.current = current
        where = f"thread {thread_id!r}" if thread_id is not None else f"the stream of run {run_id!r}"
        super().__init__(
            f"{where} is fenced at token {current}; this write carried the stale "
            f"token {fence} and was refused (its lease was taken over: stop writing this "
            f"{'thread' if thread_id is not None else 'run'})"
        )


class RunError(RunstoreError):
    """Base of the run store's errors."""


class InvalidRunError(RunError, ValueError, TypeError):
    """An argument is invalid; the message names it and what is accepted (nothing was written)."""


class RunNotFoundError(RunError, LookupError):
    """No run has this id."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"no run {run_id!r}")


class RunExistsError(RunError):
    """`RunStore.create` was given a ``run_id`` that already exists."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"run {run_id!r} already exists; pass another run_id or none")


class IdempotencyConflictError(RunError):
    """An idempotency key is already held by a run of another thread."""

    def __init__(self, key: str, run: Mapping[str, Any]) -> None:
        self.key = key
        self.run = run
        super().__init__(
            f"idempotency key {key!r} belongs to run {run['run_id']!r} of thread "
            f"{run['thread_id']!r}; a key names one run of one thread"
        )


class ThreadBusyError(RunError):
    """``multitask_strategy="reject"`` and the thread has an active run (``active_run``)."""

    def __init__(self, thread_id: str, active_run: Mapping[str, Any]) -> None:
        self.thread_id = thread_id
        self.active_run = active_run
        super().__init__(
            f"thread {thread_id!r} already has active run {active_run['run_id']!r} "
            f"({active_run['status']}); strategy 'reject' creates nothing (use interrupt, "
            "rollback or enqueue, or wait for it to finish)"
        )


class LeaseHeldError(RunError):
    """``interrupt``/``rollback`` found the active run running under a live lease."""

    def __init__(self, run: Mapping[str, Any]) -> None:
        self.run = run
        super().__init__(
            f"active run {run['run_id']!r} of thread {run['thread_id']!r} is running under "
            f"a live lease of {run['owner']!r} until {_iso(run['lease_expires_at'])}; request a "
            "cancel (request_cancel) and create again once it has stopped"
        )


class RunStateError(RunError):
    """The run's state does not allow the call; ``run`` is the run as stored."""

    def __init__(self, run: Mapping[str, Any], message: str) -> None:
        self.run = run
        super().__init__(message)


class RunQueuedError(RunStateError):
    """`RunStore.start` on a queued run; ``ahead`` is the thread's active run id."""

    def __init__(self, run: Mapping[str, Any], ahead: str) -> None:
        self.ahead = ahead
        super().__init__(
            run, f"run {run['run_id']!r} is queued behind active run {ahead!r}; start that one"
        )


class RunAlreadyStartedError(RunStateError):
    """`RunStore.start` on a run that another call already started."""

    def __init__(self, run: Mapping[str, Any]) -> None:
        super().__init__(
            run,
            f"run {run['run_id']!r} is already running (owner {run['owner']!r}, lease until "
            f"{_iso(run['lease_expires_at'])})",
        )


class RunFinishedError(RunStateError):
    """The run has ended (a terminal status); it cannot be started, finalized or cancelled."""

    def __init__(self, run: Mapping[str, Any]) -> None:
        super().__init__(run, f"run {run['run_id']!r} has already ended ({run['status']})")


class LeaseLostError(RunStateError):
    """The caller does not hold a live lease on the run (never had one, expired, or taken over)."""

    def __init__(self, run: Mapping[str, Any], owner: str, now: datetime) -> None:
        self.owner = owner
        if run["status"] == "pending":
            why = "it is pending (not started)"
        elif run["owner"] != owner:
            why = f"its lease belongs to {run['owner']!r}"
        else:
            why = f"the lease expired at {_iso(run['lease_expires_at'])} (now {_iso(now)})"
        super().__init__(run, f"{owner!r} does not hold a live lease on run {run['run_id']!r}: {why}")


class CancelPendingError(RunStateError):
    """`RunStore.finalize` with a status that ignores the run's pending cancel request."""

    def __init__(self, run: Mapping[str, Any], status: str) -> None:
        self.action = run["cancel_action"]
        super().__init__(
            run,
            f"run {run['run_id']!r} has a pending cancel ({self.action}); finalize it as "
            f"cancelled or interrupted, not {status!r}",
        )


def _iso(value: datetime | None) -> str:
    return "never" if value is None else value.isoformat()


class InvalidEventError(RunstoreError, ValueError, TypeError):
    """An event or a read argument is invalid; the message says what is accepted.

    Subclasses both `ValueError` and `TypeError` so either ``except`` catches it.
    """


class StreamEndedError(RunstoreError):
    """`StreamBridge.publish` was called after `StreamBridge.publish_end` for that run."""


class InvalidStreamInputError(RunstoreError, ValueError):
    """A bridge call got a run id, event name or data it does not accept; nothing was
    published. The message names the argument and what is accepted."""


class InvalidStoreInputError(RunstoreError, ValueError):
    """A long-term memory store call got a namespace, key, value, filter, ttl, index or
    embedding it does not accept; nothing was written. The message names the argument
    and what is accepted."""


class UnboundEngineError(RunstoreError, LookupError):
    """An engine reached runstore's shared SQL code without a `SqlDialect` bound to it."""


class SchemaVersionError(RunstoreError):
    """The database holds a newer schema version than this runstore knows (downgrade)."""


class UnsupportedDriverError(RunstoreError, RuntimeError):
    """The installed aiosqlite lacks the private calls runstore's sqlite backends need."""


class MigrationError(RunstoreError):
    """A migration, export or import was refused before writing anything (base class);
    the message says what was wrong and what is accepted."""


class SameBackendError(MigrationError, ValueError):
    """``runstore migrate`` was given the same URL (or the same file) on both sides."""


class KindNotServedError(MigrationError, LookupError):
    """A kind asked for (``--kinds``) has no backend behind one of the URLs, or the
    backend cannot be read or written in bulk (no ``bulk_import`` for events)."""


class MigrationConflictError(MigrationError):
    """The destination already holds a thread whose content differs from the source's.

    ``thread_ids`` names them (the first few in the message); ``--on-conflict skip`` or
    ``overwrite`` choose another outcome."""

    def __init__(self, kind: str, thread_ids: Iterable[str]) -> None:
        self.kind = kind
        self.thread_ids = sorted(thread_ids)
        shown = ", ".join(self.thread_ids[:10]) + (" ..." if len(self.thread_ids) > 10 else "")
        # A store's conflicts are named by namespace.
        unit = "namespace(s)" if kind == "store" else "thread(s)"
        super().__init__(
            f"the destination's {kind} already holds {len(self.thread_ids)} {unit} with content "
            f"different from the source: {shown}; nothing was written. Pass --on-conflict skip to "
            "leave them, or --on-conflict overwrite to replace them with the source's"
        )


class MigrationModeError(MigrationError, CheckpointModeError):
    """Source threads are in a checkpoint channel mode the destination is not opened for."""


class ActiveRunsError(MigrationError):
    """The source holds runs under a lease (running); ``run_ids`` names them. Let them
    finish, or pass ``--include-active`` to copy them as orphaned (the destination's
    recovery, `RunStore.claim_expired`, ends them)."""

    def __init__(self, run_ids: Iterable[str]) -> None:
        self.run_ids = sorted(run_ids)
        shown = ", ".join(self.run_ids[:10]) + (" ..." if len(self.run_ids) > 10 else "")
        super().__init__(
            f"the source holds {len(self.run_ids)} running (leased) run(s): {shown}; nothing was written. "
            "Let them finish first, or pass --include-active to copy them as orphaned (their leases expired, "
            "so the destination's recovery ends them)"
        )


class ArchiveFormatError(MigrationError, ValueError):
    """An archive file is not a runstore archive, or one of its records is malformed."""


class ArchiveVersionError(ArchiveFormatError):
    """An archive carries a format version this runstore does not read (a newer one)."""


class VerifyMismatchError(MigrationError):
    """``--verify`` found threads whose digest differs between the two sides."""

    def __init__(self, mismatches: Mapping[str, Iterable[str]]) -> None:
        self.mismatches = {kind: sorted(ids) for kind, ids in mismatches.items() if ids}
        shown = "; ".join(f"{kind}: {', '.join(ids[:10])}" for kind, ids in self.mismatches.items())
        super().__init__(f"verify found differing threads ({shown})")
