"""sqlite-vec's SQL functions on every connection runstore's sqlite backends open.

The memory store ranks a semantic search inside SQL with sqlite-vec's
``vec_distance_cosine`` (the ``sqlite-vec`` wheel ships the compiled extension). The
documented way to load it, ``sqlite_vec.load(conn)``, needs a Python whose ``sqlite3``
module was built with loadable extensions, which many builds are not (pyenv's and
several distributions' by default). So `register` asks SQLite itself: it hands the
extension's entry point to ``sqlite3_auto_extension`` of the SQLite library Python's
``_sqlite3`` module uses, and SQLite runs it on every connection opened afterwards in
this process. The sqlite engine calls `register` before it opens its first connection,
so the saver's, the event store's and the memory store's connections all have the
functions. Where that cannot work (no sqlite-vec installed, or a Python whose SQLite is
linked in statically and exports no symbols) `register` returns ``False`` and the store
ranks with numpy instead (`runstore.store.sqlbatch.Scorer`), with the same results.
"""

from __future__ import annotations

import ctypes
import logging
import threading

log = logging.getLogger(__name__)

_lock = threading.Lock()
_registered: bool | None = None
# Kept alive for the process: SQLite calls the entry point on every new connection.
_library: ctypes.CDLL | None = None


def register() -> bool:
    """Make sqlite-vec's functions part of every sqlite connection opened from now on.

    Idempotent and thread-safe; returns whether they are (module docstring).
    """
    global _registered, _library
    with _lock:
        if _registered is not None:
            return _registered
        _registered = False
        try:
            import _sqlite3

            import sqlite_vec
        except ImportError:
            return False
        try:
            sqlite = ctypes.CDLL(_sqlite3.__file__)
            extension = _load_extension(sqlite_vec.loadable_path())
            entry = extension.sqlite3_vec_init
            auto = sqlite.sqlite3_auto_extension
        except (OSError, AttributeError) as exc:
            log.info("sqlite-vec not registered (%s); semantic search ranks with numpy", exc)
            return False
        auto.argtypes = [ctypes.c_void_p]
        auto.restype = ctypes.c_int
        if auto(ctypes.cast(entry, ctypes.c_void_p)) != 0:
            return False
        _library = extension
        _registered = True
        return True


def _load_extension(stem: str) -> ctypes.CDLL:
    """The compiled extension beside ``stem`` (sqlite-vec's path without the suffix)."""
    error: OSError | None = None
    for suffix in (".so", ".dylib", ".dll"):
        try:
            return ctypes.CDLL(stem + suffix)
        except OSError as exc:
            error = exc
    assert error is not None
    raise error


def available(conn: object) -> bool:
    """Whether ``conn`` (a ``sqlite3.Connection``, on its own thread) has sqlite-vec's functions."""
    import sqlite3

    assert isinstance(conn, sqlite3.Connection)
    try:
        conn.execute("SELECT vec_version()").fetchone()
    except sqlite3.OperationalError:
        return False
    return True
