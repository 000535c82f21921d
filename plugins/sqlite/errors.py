"""Which sqlite errors mean "the file cannot be used right now", for every sqlite backend.

The saver, the event store and the run store raise `BackendUnavailableError` for them
(the driver error as ``__cause__``), as the network backends do for a server that is
down: busy past ``busy_timeout`` (another process holds the write lock), an I/O error,
a full disk, a file that cannot be opened, no memory. sqlite commits atomically, so a
statement or ``COMMIT`` that failed left nothing behind: ``write_may_have_happened``
is false, and the call may be retried. Any other sqlite error is the backend's own
business (a bug or a corrupt file) and is left to it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from runstore.errors import BackendUnavailableError

#: sqlite result codes (and their extended forms, e.g. ``SQLITE_IOERR_WRITE``) meaning
#: the file could not be used right now.
UNAVAILABLE_CODES = ("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_IOERR", "SQLITE_FULL", "SQLITE_CANTOPEN", "SQLITE_NOMEM")


def is_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` is a sqlite error meaning the file could not be used right now."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    return isinstance(exc, sqlite3.Error) and name.startswith(UNAVAILABLE_CODES)


def unavailable_error(exc: BaseException, backend: str, operation: str) -> BackendUnavailableError | None:
    """The `BackendUnavailableError` (nothing written) ``exc`` becomes if it `is_unavailable`."""
    if not is_unavailable(exc):
        return None
    return BackendUnavailableError(backend, operation, write_may_have_happened=False, cause=exc)


@contextmanager
def unavailable_errors(backend: str, operation: str) -> Iterator[None]:
    """Raise `unavailable_error` for an `is_unavailable` error in the block."""
    try:
        yield
    except sqlite3.Error as exc:
        error = unavailable_error(exc, backend, operation)
        if error is None:
            raise
        raise error from exc
