"""Which sqlite errors become runstore errors, for every sqlite backend (the one place).

The saver, the event store and the run store translate driver errors here, with the
driver error as ``__cause__``:

* "the file cannot be used right now" becomes `BackendUnavailableError`, as the network
  backends do for a server that is down: busy past ``busy_timeout`` (another process
  holds the write lock), an I/O error, a full disk, a file that cannot be opened, no
  memory. sqlite commits atomically, so a statement or ``COMMIT`` that failed left
  nothing behind: ``write_may_have_happened`` is false, and the call may be retried.
* a missing table (a store from ``from_conn_string`` whose ``setup()`` never ran)
  becomes `SchemaNotSetUpError`, which says to call ``setup()``.

Any other sqlite error is the backend's own business (a bug or a corrupt file) and is
left to it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from runstore.errors import BackendUnavailableError, RunstoreError, SchemaNotSetUpError

#: sqlite result codes (and their extended forms, e.g. ``SQLITE_IOERR_WRITE``) meaning
#: the file could not be used right now.
UNAVAILABLE_CODES = ("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_IOERR", "SQLITE_FULL", "SQLITE_CANTOPEN", "SQLITE_NOMEM")


def is_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` is a sqlite error meaning the file could not be used right now."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    return isinstance(exc, sqlite3.Error) and name.startswith(UNAVAILABLE_CODES)


def is_missing_table(exc: BaseException) -> bool:
    """Whether ``exc`` says a table runstore reads or writes does not exist (no ``setup()``)."""
    # sqlite has no distinct result code for it: SQLITE_ERROR with this message.
    return isinstance(exc, sqlite3.OperationalError) and str(exc).startswith("no such table")


def translated_error(exc: BaseException, backend: str, operation: str) -> RunstoreError | None:
    """The runstore error ``exc`` becomes (module docstring), or ``None`` to raise ``exc``."""
    if is_missing_table(exc):
        return SchemaNotSetUpError(backend, operation, exc)
    if is_unavailable(exc):
        return BackendUnavailableError(backend, operation, write_may_have_happened=False, cause=exc)
    return None


@contextmanager
def translated_errors(backend: str, operation: str) -> Iterator[None]:
    """Raise `translated_error` for a sqlite error in the block that has one."""
    try:
        yield
    except sqlite3.Error as exc:
        error = translated_error(exc, backend, operation)
        if error is None:
            raise
        raise error from exc
