"""`SqliteSaver`: a LangGraph checkpoint saver on one sqlite file (aiosqlite + stdlib sqlite3).

Every logical operation is one function run on the aiosqlite worker thread against
the raw ``sqlite3`` connection (one thread hop, one transaction), instead of one
hop per statement. The async side borrows one connection from the SQLAlchemy
engine it shares with the sqlite event store (`runstore.plugins.sqlite.engine.shared_engine`);
the sync twins run the very same functions on a stdlib ``sqlite3`` connection to
the same file, from the calling thread. See docs/savers.md for schema and decisions.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    get_checkpoint_id,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from runstore.checkpoint import codec
from runstore.checkpoint.saverbase import DELTA_COUNTERS_KEY, ensure_off_loop, worth_prefetching
from runstore.sql.migrations import Migration, ensure_schema

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

    from runstore.options import BackendOptions
    from runstore.urls import BackendURL

R = TypeVar("R")

__all__ = ["SCHEMA_COMPONENT", "SCHEMA_MIGRATIONS", "SqliteSaver"]

#: Component name of this saver's schema in ``runstore_schema_versions``.
SCHEMA_COMPONENT = "sqlite-saver"

CHECKPOINTS = "runstore_checkpoints"
BLOBS = "runstore_checkpoint_blobs"
WRITES = "runstore_checkpoint_writes"

SCHEMA_MIGRATIONS: list[Migration] = [
    Migration(
        1,
        [
            f"""CREATE TABLE IF NOT EXISTS {CHECKPOINTS} (
                thread_id TEXT NOT NULL,
                checkpoint_ns TEXT NOT NULL DEFAULT '',
                checkpoint_id TEXT NOT NULL,
                parent_checkpoint_id TEXT,
                run_id TEXT,
                type TEXT NOT NULL,
                checkpoint BLOB NOT NULL,
                metadata TEXT NOT NULL DEFAULT '{{}}',
                value_versions TEXT NOT NULL DEFAULT '{{}}',
                PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
            )""",
            f"""CREATE TABLE IF NOT EXISTS {BLOBS} (
                thread_id TEXT NOT NULL,
                checkpoint_ns TEXT NOT NULL DEFAULT '',
                channel TEXT NOT NULL,
                version TEXT NOT NULL,
                type TEXT NOT NULL,
                blob BLOB,
                PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
            )""",
            f"""CREATE TABLE IF NOT EXISTS {WRITES} (
                thread_id TEXT NOT NULL,
                checkpoint_ns TEXT NOT NULL DEFAULT '',
                checkpoint_id TEXT NOT NULL,
                task_id TEXT NOT NULL,
                idx INTEGER NOT NULL,
                task_path TEXT NOT NULL DEFAULT '',
                channel TEXT NOT NULL,
                type TEXT NOT NULL,
                value BLOB,
                PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
            )""",
        ],
        "checkpoints, channel blobs and pending writes",
    ),
    Migration(
        2,
        [
            f"CREATE INDEX IF NOT EXISTS {CHECKPOINTS}_run_id "
            f"ON {CHECKPOINTS} (run_id) WHERE run_id IS NOT NULL",
        ],
        "run_id index for delete_for_runs",
    ),
]

_PRUNE_STRATEGIES = ("keep_latest", "delete")
#: Checkpoints fetched per worker-thread hop while iterating `alist`.
_LIST_PAGE = 100
#: Requested channels answered per delta-history statement (bits of a 64-bit mask).
_MAX_MASK_CHANNELS = 62
#: Upper bound on the parent links one delta-history statement follows (cycle guard).
_MAX_DEPTH = 1_000_000

#: Prefetched delta histories kept per saver (each is used at most once).
_PREFETCH_SLOTS = 64

_SELECT_RECORD = (
    "SELECT thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, "
    f"metadata, value_versions FROM {CHECKPOINTS} c"
)
_SELECT_BLOBS = (
    f"SELECT j.key, b.type, b.blob FROM json_each(?) j JOIN {BLOBS} b "
    "ON b.thread_id = ? AND b.checkpoint_ns = ? AND b.channel = j.key AND b.version = j.value"
)
_SELECT_WRITES = (
    f"SELECT task_id, channel, type, value, task_path, idx FROM {WRITES} "
    "WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?"
)
_INSERT_CHECKPOINT = f"INSERT OR REPLACE INTO {CHECKPOINTS} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
_INSERT_BLOB = f"INSERT OR REPLACE INTO {BLOBS} VALUES (?, ?, ?, ?, ?, ?)"
_MISSING_BLOBS = (
    f"SELECT j.key FROM json_each(?) j WHERE NOT EXISTS (SELECT 1 FROM {BLOBS} b "
    "WHERE b.thread_id = ? AND b.checkpoint_ns = ? AND b.channel = j.key AND b.version = j.value)"
)
_INSERT_WRITE_FIRST = f"INSERT OR IGNORE INTO {WRITES} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
_INSERT_WRITE_LAST = f"INSERT OR REPLACE INTO {WRITES} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"

# One statement answers the whole delta history. `chain` follows parent links from
# the target (depth 0); `seen` is a bit mask of the requested channels already held
# by a shallower ancestor (depths 1..depth-1), so a row contributes channel `bit`
# while `seen & bit = 0`: its writes, and its blob when it holds a value. Recursion
# stops once every channel is seen, or when a parent link leads back to the target (a
# cycle left by re-putting an id under its own descendant). CROSS JOIN pins the chain
# as the outer loop, so each step is one primary-key probe.
_DELTA_SQL = f"""
WITH RECURSIVE
  req(bit, ch) AS (SELECT 1 << CAST(key AS INTEGER), value FROM json_each(:channels)),
  chain(depth, cid, parent, vv, seen, root) AS (
    SELECT 0, checkpoint_id, parent_checkpoint_id, value_versions, 0, checkpoint_id
      FROM {CHECKPOINTS}
     WHERE thread_id = :thread_id AND checkpoint_ns = :ns
       AND checkpoint_id = coalesce(:checkpoint_id, (
             SELECT max(checkpoint_id) FROM {CHECKPOINTS}
              WHERE thread_id = :thread_id AND checkpoint_ns = :ns))
    UNION ALL
    SELECT chain.depth + 1, c.checkpoint_id, c.parent_checkpoint_id, c.value_versions,
           chain.seen | CASE WHEN chain.depth = 0 THEN 0 ELSE (
               SELECT coalesce(sum(req.bit), 0) FROM req JOIN json_each(chain.vv) j
                   ON j.key = req.ch) END,
           chain.root
      FROM chain CROSS JOIN {CHECKPOINTS} c
        ON c.thread_id = :thread_id AND c.checkpoint_ns = :ns
       AND c.checkpoint_id = chain.parent
     WHERE chain.seen != :full AND chain.depth < :max_depth AND chain.parent != chain.root
  )
SELECT chain.depth, req.ch, {codec.HISTORY_WRITE}, w.task_id, w.task_path, w.idx, w.type, w.value
  FROM chain CROSS JOIN req CROSS JOIN {WRITES} w
    ON w.thread_id = :thread_id AND w.checkpoint_ns = :ns
   AND w.checkpoint_id = chain.cid AND w.channel = req.ch
 WHERE chain.depth > 0 AND (chain.seen & req.bit) = 0
UNION ALL
SELECT chain.depth, req.ch, {codec.HISTORY_SEED}, NULL, NULL, NULL, b.type, b.blob
  FROM chain CROSS JOIN req CROSS JOIN json_each(chain.vv) j CROSS JOIN {BLOBS} b
    ON b.thread_id = :thread_id AND b.checkpoint_ns = :ns
   AND b.channel = req.ch AND b.version = j.value
 WHERE chain.depth > 0 AND (chain.seen & req.bit) = 0 AND j.key = req.ch
"""


# --- functions run on a sqlite3 connection (worker thread or sync caller) ---------


def _write_tx(conn: sqlite3.Connection, body: Callable[[], R]) -> R:
    """Run ``body`` in a ``BEGIN IMMEDIATE`` transaction (the file's write lock up front).

    Inside a group commit (`_op_group` already opened the transaction and a savepoint
    for this op) ``body`` just runs.
    """
    if conn.in_transaction:
        return body()
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = body()
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return result


#: One queued write: the op function, its arguments and the future of its caller.
WriteOp = tuple[Callable[..., Any], tuple[Any, ...], "asyncio.Future[Any]"]


def _op_group(
    conn: sqlite3.Connection, ops: list[tuple[Callable[..., Any], tuple[Any, ...]]]
) -> list[tuple[bool, Any]]:
    """Run several write ops in one transaction (group commit): ``(ok, result or error)`` each."""
    outcomes: list[tuple[bool, Any]] = []
    conn.execute("BEGIN IMMEDIATE")
    try:
        for fn, args in ops:
            # A savepoint per op: a failing op undoes only its own changes.
            conn.execute("SAVEPOINT runstore_op")
            try:
                value = fn(conn, *args)
            except Exception as exc:
                conn.execute("ROLLBACK TO runstore_op")
                conn.execute("RELEASE runstore_op")
                outcomes.append((False, exc))
            else:
                conn.execute("RELEASE runstore_op")
                outcomes.append((True, value))
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return outcomes


def _read_tx(conn: sqlite3.Connection, body: Callable[[], R]) -> R:
    """Run ``body`` in a deferred transaction, so its statements see one snapshot."""
    conn.execute("BEGIN")
    try:
        return body()
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")


RecordRow = tuple[str, str, str, str | None, str, bytes, str, str]
#: A fetched checkpoint: its record row, its blob rows and its write rows.
Fetched = tuple[RecordRow, list[tuple[str, str, bytes]], list[tuple[Any, ...]]]


def _fetch_parts(conn: sqlite3.Connection, record: RecordRow) -> Fetched:
    thread_id, ns, cid = record[0], record[1], record[2]
    blobs = conn.execute(_SELECT_BLOBS, (record[7], thread_id, ns)).fetchall()
    writes = conn.execute(_SELECT_WRITES, (thread_id, ns, cid)).fetchall()
    return record, blobs, writes


#: What `_op_get` returns: the checkpoint, and the delta history prefetched for it
#: (channels, rows) when asked to and its metadata names delta channels it does not hold.
Got = tuple[Fetched, tuple[list[str], list[tuple[Any, ...]]] | None]


def _prefetch_channels(record: RecordRow) -> list[str]:
    """Delta channels without a value stored at ``record``, if their history is worth
    fetching with it (`saverbase.worth_prefetching`); else none."""
    import orjson

    metadata, value_versions = record[6], record[7]
    if not metadata or DELTA_COUNTERS_KEY not in metadata:
        return []
    decoded = orjson.loads(metadata)
    counters = decoded.get(DELTA_COUNTERS_KEY)
    if not isinstance(counters, dict) or not counters or not worth_prefetching(decoded):
        return []
    held = orjson.loads(value_versions)
    return [ch for ch in counters if ch not in held]


def _op_get(
    conn: sqlite3.Connection,
    thread_id: str,
    ns: str,
    checkpoint_id: str | None,
    prefetch: bool = False,
) -> Got | None:
    def body() -> Got | None:
        if checkpoint_id:
            record = conn.execute(
                f"{_SELECT_RECORD} WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?",
                (thread_id, ns, checkpoint_id),
            ).fetchone()
        else:
            record = conn.execute(
                f"{_SELECT_RECORD} WHERE thread_id = ? AND checkpoint_ns = ? "
                "ORDER BY checkpoint_id DESC LIMIT 1",
                (thread_id, ns),
            ).fetchone()
        if record is None:
            return None
        fetched = _fetch_parts(conn, record)
        history = None
        if prefetch and (missing := _prefetch_channels(record)):
            # LangGraph asks for exactly these channels' history right after loading
            # the checkpoint; answering it in this hop saves a second one.
            history = (missing, _delta_rows(conn, thread_id, ns, record[2], missing))
        return fetched, history

    return _read_tx(conn, body)


def _op_list_page(
    conn: sqlite3.Connection,
    where: list[str],
    params: list[Any],
    after: tuple[str, str, str] | None,
    page: int,
) -> list[Fetched]:
    clauses = list(where)
    args = list(params)
    if after is not None:
        clauses.append("(c.checkpoint_id, c.thread_id, c.checkpoint_ns) < (?, ?, ?)")
        args.extend(after)
    sql = _SELECT_RECORD
    if clauses:
        sql += " WHERE " + " AND ".join(clauses)
    sql += " ORDER BY c.checkpoint_id DESC, c.thread_id DESC, c.checkpoint_ns DESC LIMIT ?"
    args.append(page)

    def body() -> list[Fetched]:
        return [_fetch_parts(conn, record) for record in conn.execute(sql, args).fetchall()]

    return _read_tx(conn, body)


def _op_put(
    conn: sqlite3.Connection, encoded: codec.EncodedCheckpoint, serde: SerializerProtocol
) -> None:
    row = encoded.row

    def body() -> None:
        conn.execute(_INSERT_CHECKPOINT, row)
        if encoded.blobs:
            conn.executemany(_INSERT_BLOB, encoded.blobs)
        if not encoded.carried:
            return
        # Normally stored by the put that created the version; only a hand-made
        # checkpoint gets here without it, and then its value must not be lost.
        missing = conn.execute(
            _MISSING_BLOBS,
            (codec.dump_json(encoded.carried), row.thread_id, row.checkpoint_ns),
        ).fetchall()
        for (channel,) in missing:
            conn.execute(
                _INSERT_BLOB,
                codec.encode_blob(
                    serde,
                    row.thread_id,
                    row.checkpoint_ns,
                    channel,
                    encoded.carried[channel],
                    encoded.carried_values[channel],
                ),
            )

    _write_tx(conn, body)


def _op_put_writes(conn: sqlite3.Connection, encoded: codec.EncodedWrites) -> None:
    def body() -> None:
        if encoded.first_wins:
            conn.executemany(_INSERT_WRITE_FIRST, encoded.first_wins)
        if encoded.last_wins:
            conn.executemany(_INSERT_WRITE_LAST, encoded.last_wins)

    _write_tx(conn, body)


def _op_delete_thread(conn: sqlite3.Connection, thread_id: str) -> None:
    def body() -> None:
        for table in (CHECKPOINTS, BLOBS, WRITES):
            conn.execute(f"DELETE FROM {table} WHERE thread_id = ?", (thread_id,))

    _write_tx(conn, body)


def _op_copy_thread(conn: sqlite3.Connection, source: str, target: str) -> None:
    def body() -> None:
        conn.execute(
            f"INSERT OR REPLACE INTO {CHECKPOINTS} SELECT ?, checkpoint_ns, checkpoint_id, "
            "parent_checkpoint_id, run_id, type, checkpoint, metadata, value_versions "
            f"FROM {CHECKPOINTS} WHERE thread_id = ?",
            (target, source),
        )
        conn.execute(
            f"INSERT OR REPLACE INTO {BLOBS} SELECT ?, checkpoint_ns, channel, version, type, "
            f"blob FROM {BLOBS} WHERE thread_id = ?",
            (target, source),
        )
        conn.execute(
            f"INSERT OR REPLACE INTO {WRITES} SELECT ?, checkpoint_ns, checkpoint_id, task_id, "
            f"idx, task_path, channel, type, value FROM {WRITES} WHERE thread_id = ?",
            (target, source),
        )

    _write_tx(conn, body)


class _Graph:
    """The checkpoints of one (thread, namespace), for pruning decisions."""

    def __init__(self, rows: list[tuple[str, str | None, str | None, str, str]]) -> None:
        import orjson

        self.parent: dict[str, str | None] = {}
        self.run_id: dict[str, str | None] = {}
        self.valued: dict[str, set[str]] = {}
        self.unvalued: dict[str, list[str]] = {}
        for cid, parent, run_id, metadata, value_versions in rows:
            self.parent[cid] = parent
            self.run_id[cid] = run_id
            valued = set(orjson.loads(value_versions))
            self.valued[cid] = valued
            # Delta channels are the ones LangGraph counts toward a snapshot; a delta
            # channel with no value stored here is rebuilt from its ancestors.
            counters = orjson.loads(metadata).get(DELTA_COUNTERS_KEY) if metadata else None
            delta = counters if isinstance(counters, dict) else {}
            self.unvalued[cid] = [ch for ch in delta if ch not in valued]

    def needed(self, checkpoint_id: str) -> list[str]:
        """Ancestors (nearest first) a delta reconstruction at ``checkpoint_id`` reads."""
        remaining = set(self.unvalued.get(checkpoint_id, ()))
        chain: list[str] = []
        seen: set[str] = set()
        current = self.parent.get(checkpoint_id) if remaining else None
        while current is not None and remaining and current in self.parent:
            if current in seen:
                break
            seen.add(current)
            chain.append(current)
            remaining -= self.valued[current]
            current = self.parent[current]
        return chain


def _load_graph(conn: sqlite3.Connection, thread_id: str, ns: str) -> _Graph:
    rows = conn.execute(
        "SELECT checkpoint_id, parent_checkpoint_id, run_id, metadata, value_versions "
        f"FROM {CHECKPOINTS} WHERE thread_id = ? AND checkpoint_ns = ?",
        (thread_id, ns),
    ).fetchall()
    return _Graph(rows)


def _remove(conn: sqlite3.Connection, thread_id: str, ns: str, doomed: Sequence[str]) -> None:
    """Delete checkpoints ``doomed`` with their writes, then blobs no survivor holds."""
    if not doomed:
        return
    import orjson

    ids = orjson.dumps(list(doomed)).decode()
    for table in (CHECKPOINTS, WRITES):
        conn.execute(
            f"DELETE FROM {table} WHERE thread_id = ? AND checkpoint_ns = ? "
            "AND checkpoint_id IN (SELECT value FROM json_each(?))",
            (thread_id, ns, ids),
        )
    conn.execute(
        f"DELETE FROM {BLOBS} WHERE thread_id = ? AND checkpoint_ns = ? AND NOT EXISTS ("
        f"SELECT 1 FROM {CHECKPOINTS} c, json_each(c.value_versions) j "
        f"WHERE c.thread_id = {BLOBS}.thread_id AND c.checkpoint_ns = {BLOBS}.checkpoint_ns "
        f"AND j.key = {BLOBS}.channel AND j.value = {BLOBS}.version)",
        (thread_id, ns),
    )


def _op_prune(conn: sqlite3.Connection, thread_ids: Sequence[str], strategy: str) -> None:
    def body() -> None:
        for thread_id in thread_ids:
            if strategy == "delete":
                for table in (CHECKPOINTS, BLOBS, WRITES):
                    conn.execute(f"DELETE FROM {table} WHERE thread_id = ?", (thread_id,))
                continue
            namespaces = [
                r[0]
                for r in conn.execute(
                    f"SELECT DISTINCT checkpoint_ns FROM {CHECKPOINTS} WHERE thread_id = ?",
                    (thread_id,),
                )
            ]
            for ns in namespaces:
                graph = _load_graph(conn, thread_id, ns)
                latest = max(graph.parent)
                keep = {latest, *graph.needed(latest)}
                _remove(conn, thread_id, ns, [cid for cid in graph.parent if cid not in keep])
                # Writes whose checkpoint was never stored cannot be reached from the kept one.
                conn.execute(
                    f"DELETE FROM {WRITES} WHERE thread_id = ? AND checkpoint_ns = ? "
                    f"AND checkpoint_id NOT IN (SELECT checkpoint_id FROM {CHECKPOINTS} "
                    "WHERE thread_id = ? AND checkpoint_ns = ?)",
                    (thread_id, ns, thread_id, ns),
                )

    _write_tx(conn, body)


def _op_delete_for_runs(conn: sqlite3.Connection, run_ids: Sequence[str]) -> None:
    import orjson

    wanted = orjson.dumps(list(run_ids)).decode()

    def body() -> None:
        pairs = conn.execute(
            f"SELECT DISTINCT thread_id, checkpoint_ns FROM {CHECKPOINTS} "
            "WHERE run_id IN (SELECT value FROM json_each(?))",
            (wanted,),
        ).fetchall()
        wanted_set = set(run_ids)
        for thread_id, ns in pairs:
            graph = _load_graph(conn, thread_id, ns)
            doomed = {cid for cid, run in graph.run_id.items() if run in wanted_set}
            for cid in graph.parent:
                if cid not in doomed:
                    doomed.difference_update(graph.needed(cid))
            _remove(conn, thread_id, ns, sorted(doomed))

    _write_tx(conn, body)


def _delta_rows(
    conn: sqlite3.Connection,
    thread_id: str,
    ns: str,
    checkpoint_id: str | None,
    channels: list[str],
) -> list[tuple[Any, ...]]:
    import orjson

    rows: list[tuple[Any, ...]] = []
    for start in range(0, len(channels), _MAX_MASK_CHANNELS):
        chunk = channels[start : start + _MAX_MASK_CHANNELS]
        params = {
            "channels": orjson.dumps(chunk).decode(),
            "thread_id": thread_id,
            "ns": ns,
            "checkpoint_id": checkpoint_id,
            "full": (1 << len(chunk)) - 1,
            "max_depth": _MAX_DEPTH,
        }
        rows.extend(conn.execute(_DELTA_SQL, params).fetchall())
    return rows


def _op_delta(
    conn: sqlite3.Connection,
    thread_id: str,
    ns: str,
    checkpoint_id: str | None,
    channels: list[str],
) -> list[tuple[Any, ...]]:
    if len(channels) <= _MAX_MASK_CHANNELS:
        return _delta_rows(conn, thread_id, ns, checkpoint_id, channels)
    return _read_tx(conn, lambda: _delta_rows(conn, thread_id, ns, checkpoint_id, channels))


# --- the saver ------------------------------------------------------------------


def _where(
    config: RunnableConfig | None,
    filter: Mapping[str, Any] | None,
    before: RunnableConfig | None,
) -> tuple[list[str], list[Any]]:
    """SQL conditions (sqlite JSON1 dialect) and parameters for `alist`."""
    clauses: list[str] = []
    params: list[Any] = []
    if config is not None:
        configurable = config.get("configurable") or {}
        if configurable.get("thread_id") is not None:
            clauses.append("c.thread_id = ?")
            params.append(str(configurable["thread_id"]))
        if configurable.get("checkpoint_ns") is not None:
            clauses.append("c.checkpoint_ns = ?")
            params.append(configurable["checkpoint_ns"])
        if checkpoint_id := configurable.get("checkpoint_id"):
            clauses.append("c.checkpoint_id = ?")
            params.append(checkpoint_id)
    for term in codec.metadata_filter_terms(filter):
        probe = "SELECT 1 FROM json_each(c.metadata) m WHERE m.key = ?"
        if term.kind == "null":
            clauses.append(f"NOT EXISTS ({probe} AND m.type != 'null')")
            params.append(term.key)
        elif term.kind == "number":
            clauses.append(f"EXISTS ({probe} AND m.type IN ('integer', 'real') AND m.atom = ?)")
            params.extend((term.key, term.value))
        elif term.kind == "bool":
            clauses.append(f"EXISTS ({probe} AND m.type = ?)")
            params.extend((term.key, term.json_type))
        elif term.kind == "text":
            clauses.append(f"EXISTS ({probe} AND m.type = 'text' AND m.atom = ?)")
            params.extend((term.key, term.value))
        else:
            clauses.append(f"EXISTS ({probe} AND m.type = ? AND m.value = ?)")
            params.extend((term.key, term.json_type, term.value))
    if before is not None and (before_id := get_checkpoint_id(before)):
        clauses.append("c.checkpoint_id < ?")
        params.append(before_id)
    return clauses, params


def _thread_ns(config: RunnableConfig) -> tuple[str, str, str | None]:
    configurable = config["configurable"]
    return (
        str(configurable["thread_id"]),
        str(configurable.get("checkpoint_ns") or ""),
        configurable.get("checkpoint_id") or None,
    )


def _connect_sync(path: Path, synchronous: str, busy_timeout_ms: int) -> sqlite3.Connection:
    conn = sqlite3.connect(
        path,
        timeout=busy_timeout_ms / 1000.0,
        isolation_level=None,
        check_same_thread=False,
    )
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous.upper()}")
    return conn


def _settle(task: asyncio.Future[list[tuple[bool, Any]]], batch: list[WriteOp]) -> None:
    """Hand each queued writer its own outcome of a group commit."""
    for i, (_, _, future) in enumerate(batch):
        if future.done():
            continue
        if task.cancelled():
            future.cancel()
        elif (error := task.exception()) is not None:
            future.set_exception(error)
        else:
            ok, value = task.result()[i]
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)


class _State:
    """Connection-level state shared by a saver and its shallow copies."""

    def __init__(self) -> None:
        self.closed = False
        self.sync_conn: sqlite3.Connection | None = None
        self.sync_lock = threading.Lock()
        # Bumped when any write starts and when it ends: a prefetched delta history is
        # used only if no write overlapped the time since it was read.
        self.generation = 0
        self.write_queue: list[WriteOp] = []
        self.group_lock = asyncio.Lock()
        self.prefetched: dict[tuple[str, str, str], tuple[int, list[str], list[Any]]] = {}


class SqliteSaver(BaseCheckpointSaver[str]):
    """LangGraph checkpoint saver on a sqlite file: ``sqlite:///path/app.db``.

    Open it with `SqliteSaver.open` (or through `runstore.open`); it shares its
    SQLAlchemy engine with a sqlite event store on the same file. Async methods
    run one worker-thread hop each; sync twins use a stdlib ``sqlite3`` connection
    from the calling thread and refuse to run on the saver's event loop thread.
    """

    def __init__(
        self,
        *,
        path: Path,
        serde: SerializerProtocol | None = None,
        synchronous: str = "normal",
        busy_timeout_ms: int = 5000,
    ) -> None:
        super().__init__(serde=serde)
        self.path = path
        self.synchronous = synchronous
        self.busy_timeout_ms = busy_timeout_ms
        self._loop: asyncio.AbstractEventLoop | None = None
        self._engine: AsyncEngine | None = None
        self._sa_conn: AsyncConnection | None = None
        self._aconn: Any = None
        self._raw: sqlite3.Connection | None = None
        self._write_lock: asyncio.Lock | None = None
        # Mutable state lives in one object: `with_allowlist` (which LangGraph may call
        # when compiling a graph) makes shallow copies, and those must share it.
        self._state = _State()

    # -- lifecycle ---------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        url: BackendURL,
        options: BackendOptions,
        *,
        serde: SerializerProtocol | None = None,
    ) -> SqliteSaver:
        """Open (creating or upgrading the schema) the saver for ``url``; closed with ``options``."""
        from runstore.errors import InvalidURLError

        from .engine import shared_engine, sqlite_write_lock
        from .settings import SqliteSettings

        url.check_options(frozenset())
        path = url.file_path()
        if path is None:
            raise InvalidURLError(
                f"{url} names no file; use sqlite:///relative/app.db or sqlite:////abs/app.db"
            )
        engine = await shared_engine(url, options)
        await ensure_schema(engine, SCHEMA_COMPONENT, SCHEMA_MIGRATIONS)
        cfg = options.settings.section(SqliteSettings)
        saver = cls(
            path=path.expanduser().resolve(),
            serde=serde,
            synchronous=cfg.synchronous,
            busy_timeout_ms=cfg.busy_timeout_ms,
        )
        await saver._attach(engine, sqlite_write_lock(engine))
        options.on_close(saver.aclose)
        return saver

    async def _attach(self, engine: AsyncEngine, write_lock: asyncio.Lock | None) -> None:
        # One pooled connection stays checked out for the saver's lifetime: its aiosqlite
        # worker thread is where every async operation runs as a single function call.
        sa_conn = await engine.connect()
        try:
            fairy = await sa_conn.get_raw_connection()
            aconn = fairy.driver_connection
            raw = aconn._conn  # the sqlite3.Connection owned by the aiosqlite thread
            if not callable(getattr(aconn, "_execute", None)):
                raise RuntimeError("unsupported aiosqlite version: Connection._execute is missing")
        except BaseException:
            await sa_conn.close()
            raise
        self._engine = engine
        self._sa_conn = sa_conn
        self._aconn = aconn
        self._raw = raw
        self._write_lock = write_lock
        self._loop = asyncio.get_running_loop()

    @property
    def engine(self) -> AsyncEngine | None:
        """The SQLAlchemy engine shared with a sqlite event store on the same file."""
        return self._engine

    async def aclose(self) -> None:
        """Return the pooled connection and close the sync connection (idempotent)."""
        if self._state.closed:
            return
        self._state.closed = True
        if self._sa_conn is not None:
            await self._sa_conn.close()
            self._sa_conn = None
        with self._state.sync_lock:
            if self._state.sync_conn is not None:
                self._state.sync_conn.close()
                self._state.sync_conn = None

    async def __aenter__(self) -> SqliteSaver:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- plumbing ----------------------------------------------------------------

    async def _hop(self, fn: Callable[..., R], *args: Any) -> R:
        if self._state.closed or self._aconn is None:
            raise RuntimeError("SqliteSaver is closed")
        result: R = await self._aconn._execute(fn, self._raw, *args)
        return result

    async def _write_hop(self, fn: Callable[..., R], *args: Any) -> R:
        """Run write op ``fn`` on the worker thread, group-committed with concurrent writes.

        LangGraph overlaps a step's ``aput_writes`` with the checkpoint ``aput``: writers
        that arrive while a write is running queue up, and the next one to run takes the
        whole queue into one hop and one transaction (each op in its own savepoint), so
        they share a commit (one fsync with ``synchronous=full``). Every caller still
        returns only after its own op is committed.
        """
        self._state.generation += 1
        try:
            future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            self._state.write_queue.append((fn, args, future))
            async with self._state.group_lock:
                if not future.done() and self._state.write_queue:
                    batch, self._state.write_queue = self._state.write_queue, []
                    if len(batch) == 1:
                        # Only this caller's op (the common case): nobody else to answer,
                        # so no task or shield, which cost several loop iterations.
                        [(ok, value)] = await self._run_group(batch)
                        if not ok:
                            raise value
                        result: R = value
                        return result
                    task = asyncio.ensure_future(self._run_group(batch))
                    task.add_done_callback(lambda t, b=batch: _settle(t, b))
                    # Shielded: if this caller is cancelled, the others still get answers.
                    await asyncio.wait([asyncio.shield(task)])
            result = await future
            return result
        finally:
            self._state.generation += 1

    async def _run_group(self, batch: list[WriteOp]) -> list[tuple[bool, Any]]:
        # In-process writers queue on the engine's asyncio lock (shared with the event
        # store) rather than on sqlite's busy_timeout polling.
        if self._write_lock is None:
            return await self._grouped_hop(batch)
        async with self._write_lock:
            return await self._grouped_hop(batch)

    async def _grouped_hop(self, batch: list[WriteOp]) -> list[tuple[bool, Any]]:
        if len(batch) == 1:
            fn, args, _ = batch[0]
            try:
                return [(True, await self._hop(fn, *args))]
            except Exception as exc:
                return [(False, exc)]
        return await self._hop(_op_group, [(fn, args) for fn, args, _ in batch])

    def _sync(self, method: str, fn: Callable[..., R], *args: Any) -> R:
        ensure_off_loop(self._loop, method, type(self).__name__)
        if self._state.closed:
            raise RuntimeError("SqliteSaver is closed")
        self._state.generation += 1
        try:
            with self._state.sync_lock:
                if self._state.sync_conn is None:
                    self._state.sync_conn = _connect_sync(
                        self.path, self.synchronous, self.busy_timeout_ms
                    )
                return fn(self._state.sync_conn, *args)
        finally:
            self._state.generation += 1

    def _decode(self, fetched: Fetched) -> CheckpointTuple:
        record, blobs, writes = fetched
        return codec.decode_checkpoint(
            self.serde,
            thread_id=record[0],
            checkpoint_ns=record[1],
            checkpoint_id=record[2],
            parent_checkpoint_id=record[3],
            type=record[4],
            checkpoint=record[5],
            metadata=record[6],
            blobs=blobs,
            writes=writes,
        )

    def _history(
        self, channels: Sequence[str], rows: list[tuple[Any, ...]]
    ) -> dict[str, DeltaChannelHistory]:
        return codec.assemble_delta_history(self.serde, channels, rows)

    def _got(self, got: Got | None, generation: int) -> CheckpointTuple | None:
        """Decode `_op_get`'s answer and keep its prefetched delta history, if any."""
        if got is None:
            return None
        fetched, history = got
        if history is not None:
            record = fetched[0]
            if len(self._state.prefetched) >= _PREFETCH_SLOTS:
                self._state.prefetched.pop(next(iter(self._state.prefetched)))
            self._state.prefetched[(record[0], record[1], record[2])] = (generation, *history)
        return self._decode(fetched)

    def _take_prefetched(
        self, config: RunnableConfig, wanted: list[str]
    ) -> list[tuple[Any, ...]] | None:
        """Rows prefetched for exactly this checkpoint, if still valid (used once)."""
        if not self._state.prefetched:
            return None
        thread_id, ns, checkpoint_id = _thread_ns(config)
        if checkpoint_id is None:
            return None
        entry = self._state.prefetched.pop((thread_id, ns, checkpoint_id), None)
        if entry is None:
            return None
        generation, channels, rows = entry
        if generation != self._state.generation or not set(wanted) <= set(channels):
            return None
        return rows

    # -- async API ---------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint named by ``config`` (latest of the thread without ``checkpoint_id``)."""
        generation = self._state.generation
        thread_id, ns, checkpoint_id = _thread_ns(config)
        # Prefetch only for the thread's latest checkpoint (how a run starts): a walk
        # that loads ancestors one by one would otherwise pay for a history each.
        got = await self._hop(_op_get, thread_id, ns, checkpoint_id, checkpoint_id is None)
        return self._got(got, generation)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Checkpoints matching ``config``/``filter``/``before``, newest first, at most ``limit``."""
        where, params = _where(config, filter, before)
        remaining = limit
        after: tuple[str, str, str] | None = None
        while remaining is None or remaining > 0:
            page = _LIST_PAGE if remaining is None else min(_LIST_PAGE, remaining)
            fetched = await self._hop(_op_list_page, where, params, after, page)
            for item in fetched:
                yield self._decode(item)
            if len(fetched) < page:
                return
            if remaining is not None:
                remaining -= len(fetched)
            last = fetched[-1][0]
            after = (last[2], last[0], last[1])

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store ``checkpoint`` (record + blobs of ``new_versions``) under ``config``'s parent."""
        encoded = codec.encode_checkpoint(self.serde, config, checkpoint, metadata, new_versions)
        await self._write_hop(_op_put, encoded, self.serde)
        return encoded.config

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store pending writes of ``task_id`` (first write wins; special channels last wins)."""
        encoded = codec.encode_writes(self.serde, config, writes, task_id, task_path)
        if encoded.first_wins or encoded.last_wins:
            await self._write_hop(_op_put_writes, encoded)

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete every checkpoint, blob and write of ``thread_id``."""
        await self._write_hop(_op_delete_thread, str(thread_id))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint (whole parent chain), blob and write to another thread.

        On a checkpoint id present in both threads the source's copy wins.
        """
        await self._write_hop(_op_copy_thread, str(source_thread_id), str(target_thread_id))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest``: per namespace keep the latest checkpoint and every ancestor its
        delta reconstruction reads (with their writes); ``delete``: drop the threads."""
        if strategy not in _PRUNE_STRATEGIES:
            raise ValueError(
                f"unknown prune strategy {strategy!r}; accepted: {', '.join(_PRUNE_STRATEGIES)}"
            )
        await self._write_hop(_op_prune, [str(t) for t in thread_ids], strategy)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete checkpoints (and writes) whose ``run_id`` is in ``run_ids``, keeping
        ancestors a surviving checkpoint's delta reconstruction still reads."""
        if run_ids:
            await self._write_hop(_op_delete_for_runs, [str(r) for r in run_ids])

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Per-channel writes and seed along the target's parent chain, in one statement."""
        if not channels:
            return {}
        wanted = list(dict.fromkeys(channels))
        rows = self._take_prefetched(config, wanted)
        if rows is None:
            rows = await self._hop(_op_delta, *_thread_ns(config), wanted)
        return self._history(channels, rows)

    # -- sync twins --------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Sync twin of `aget_tuple` (not on the saver's event loop thread)."""
        ensure_off_loop(self._loop, "get_tuple", type(self).__name__)
        got = self._sync("get_tuple", _op_get, *_thread_ns(config), False)
        return None if got is None else self._decode(got[0])

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Sync twin of `alist` (not on the saver's event loop thread)."""
        ensure_off_loop(self._loop, "list", type(self).__name__)
        where, params = _where(config, filter, before)
        return self._list_sync(where, params, limit)

    def _list_sync(
        self, where: list[str], params: list[Any], limit: int | None
    ) -> Iterator[CheckpointTuple]:
        remaining = limit
        after: tuple[str, str, str] | None = None
        while remaining is None or remaining > 0:
            page = _LIST_PAGE if remaining is None else min(_LIST_PAGE, remaining)
            fetched = self._sync("list", _op_list_page, where, params, after, page)
            for item in fetched:
                yield self._decode(item)
            if len(fetched) < page:
                return
            if remaining is not None:
                remaining -= len(fetched)
            last = fetched[-1][0]
            after = (last[2], last[0], last[1])

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Sync twin of `aput` (not on the saver's event loop thread)."""
        ensure_off_loop(self._loop, "put", type(self).__name__)
        encoded = codec.encode_checkpoint(self.serde, config, checkpoint, metadata, new_versions)
        self._sync("put", _op_put, encoded, self.serde)
        return encoded.config

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Sync twin of `aput_writes` (not on the saver's event loop thread)."""
        ensure_off_loop(self._loop, "put_writes", type(self).__name__)
        encoded = codec.encode_writes(self.serde, config, writes, task_id, task_path)
        if encoded.first_wins or encoded.last_wins:
            self._sync("put_writes", _op_put_writes, encoded)

    def delete_thread(self, thread_id: str) -> None:
        """Sync twin of `adelete_thread` (not on the saver's event loop thread)."""
        self._sync("delete_thread", _op_delete_thread, str(thread_id))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Sync twin of `acopy_thread` (not on the saver's event loop thread)."""
        self._sync("copy_thread", _op_copy_thread, str(source_thread_id), str(target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Sync twin of `aprune` (not on the saver's event loop thread)."""
        ensure_off_loop(self._loop, "prune", type(self).__name__)
        if strategy not in _PRUNE_STRATEGIES:
            raise ValueError(
                f"unknown prune strategy {strategy!r}; accepted: {', '.join(_PRUNE_STRATEGIES)}"
            )
        self._sync("prune", _op_prune, [str(t) for t in thread_ids], strategy)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Sync twin of `adelete_for_runs` (not on the saver's event loop thread)."""
        ensure_off_loop(self._loop, "delete_for_runs", type(self).__name__)
        if run_ids:
            self._sync("delete_for_runs", _op_delete_for_runs, [str(r) for r in run_ids])

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Sync twin of `aget_delta_channel_history` (not on the saver's event loop thread)."""
        ensure_off_loop(self._loop, "get_delta_channel_history", type(self).__name__)
        if not channels:
            return {}
        wanted = list(dict.fromkeys(channels))
        rows = self._sync("get_delta_channel_history", _op_delta, *_thread_ns(config), wanted)
        return self._history(channels, rows)

    def get_next_version(self, current: str | None, channel: None) -> str:
        """A new channel version string after ``current`` (stock-saver compatible shape)."""
        return codec.next_version(current)
