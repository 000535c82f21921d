"""The sqlite saver's operations: plain functions on a ``sqlite3.Connection``.

Each runs whole on one thread: the aiosqlite worker thread for the async API (one
hop per operation) or the caller's thread for the sync twins. Read operations open
their own read transaction (`read_tx`); write operations run inside the transaction
of `write_batch`, which commits a group of them at once (group commit).

Why one module of this size: every operation shares the same few row helpers and the
transaction rules above (read_tx, the savepoint per write in `write_batch`); kept
together, the one transaction discipline is visible in one place.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import orjson
from langgraph.checkpoint.serde.base import SerializerProtocol

from runstore.batching import Outcome
from runstore.checkpoint import codec
from runstore.checkpoint.codec import BLOBS, CHECKPOINTS, WRITES
from runstore.checkpoint.filters import json_equal
from runstore.checkpoint.policy import (
    CheckpointGraph,
    DryRun,
    RetentionPolicy,
    ThreadSwept,
    plan_thread,
)
from runstore.checkpoint.rules import (
    DELTA_COUNTERS_KEY,
    missing_delta_channels,
    worth_prefetching,
)
from runstore.checkpoint.threads import Removed, status_of
from runstore.errors import StaleFenceError, ThreadDeletedError

from . import sql

R = TypeVar("R")

#: A write op: a function run on the connection inside the batch's transaction.
WriteOp = tuple[Callable[..., Any], tuple[Any, ...]]
#: A record as `sql.SELECT_RECORD` reads it.
RecordRow = tuple[str, str, str, str | None, str, bytes, str, str, str | None]
#: A fetched checkpoint: its record row, its blob rows and its write rows.
Fetched = tuple[RecordRow, list[tuple[str, str, bytes]], list[tuple[Any, ...]]]
#: What `get` returns: the checkpoint, and the delta history read with it
#: ``(channels, rows)`` when asked to and there is one worth reading.
Got = tuple[Fetched, tuple[list[str], list[tuple[Any, ...]]] | None]


def register_functions(conn: sqlite3.Connection) -> None:
    """Register the SQL functions the saver's statements call (on the connection's thread)."""

    def json_equal_text(stored: str | None, wanted: str | None) -> bool:
        if stored is None or wanted is None:
            return False
        return json_equal(orjson.loads(stored), orjson.loads(wanted))

    conn.create_function(sql.JSON_EQUAL_FUNCTION, 2, json_equal_text, deterministic=True)


# --- transactions -----------------------------------------------------------------


def write_batch(conn: sqlite3.Connection, ops: Sequence[WriteOp]) -> list[Outcome]:
    """Run write ops in one ``BEGIN IMMEDIATE`` transaction: one `Outcome` per op.

    Each op of a group runs in its own savepoint, so a failing op undoes only its
    own changes and only its caller sees the error. If the commit itself fails,
    the transaction is rolled back and the error raised (every op failed).
    """
    outcomes: list[Outcome] = []
    conn.execute("BEGIN IMMEDIATE")  # the file's write lock up front, never a BUSY upgrade
    try:
        if len(ops) == 1:
            fn, args = ops[0]
            try:
                outcomes.append((True, fn(conn, *args)))
            except Exception as exc:
                conn.execute("ROLLBACK")
                return [(False, exc)]
        else:
            for fn, args in ops:
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


def read_tx(conn: sqlite3.Connection, body: Callable[[], R]) -> R:
    """Run ``body`` in a deferred transaction, so its statements see one snapshot
    (inside an open transaction, in that one)."""
    if conn.in_transaction:
        return body()
    conn.execute("BEGIN")
    try:
        return body()
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")


# --- reads ------------------------------------------------------------------------


def _fetch_parts(conn: sqlite3.Connection, record: RecordRow) -> Fetched:
    thread_id, ns, cid = record[0], record[1], record[2]
    blobs = conn.execute(sql.SELECT_BLOBS, (record[7], thread_id, ns)).fetchall()
    writes = conn.execute(sql.SELECT_WRITES, (thread_id, ns, cid)).fetchall()
    return record, blobs, writes


def _prefetch_channels(record: RecordRow) -> list[str]:
    """The head's missing delta channels, if their history is worth reading with it."""
    metadata, versions = record[6], record[8]
    if not metadata or DELTA_COUNTERS_KEY not in metadata:
        return []  # not a delta checkpoint: skip decoding anything
    decoded = orjson.loads(metadata)
    if not worth_prefetching(decoded):
        return []
    return missing_delta_channels(
        decoded, None if versions is None else orjson.loads(versions), orjson.loads(record[7])
    )


def get(
    conn: sqlite3.Connection,
    thread_id: str,
    ns: str,
    checkpoint_id: str | None,
    prefetch: bool = False,
) -> Got | None:
    """The checkpoint by id (or the latest), with its delta history when ``prefetch``."""

    def body() -> Got | None:
        if checkpoint_id:
            record = conn.execute(
                f"{sql.SELECT_RECORD} WHERE thread_id = ? AND checkpoint_ns = ? "
                "AND checkpoint_id = ?",
                (thread_id, ns, checkpoint_id),
            ).fetchone()
        else:
            record = conn.execute(
                f"{sql.SELECT_RECORD} WHERE thread_id = ? AND checkpoint_ns = ? "
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
            history = (missing, delta(conn, thread_id, ns, record[2], missing))
        return fetched, history

    return read_tx(conn, body)


def list_page(
    conn: sqlite3.Connection,
    where: Sequence[str],
    params: Sequence[Any],
    after: tuple[str, str, str] | None,
    page: int,
) -> list[Fetched]:
    """Up to ``page`` checkpoints matching ``where``, ordered by (id, thread, ns)
    descending, after the keyset position ``after``."""
    clauses = list(where)
    args = list(params)
    if after is not None:
        clauses.append("(c.checkpoint_id, c.thread_id, c.checkpoint_ns) < (?, ?, ?)")
        args.extend(after)
    statement = sql.SELECT_RECORD
    if clauses:
        statement += " WHERE " + " AND ".join(clauses)
    statement += " ORDER BY c.checkpoint_id DESC, c.thread_id DESC, c.checkpoint_ns DESC LIMIT ?"
    args.append(page)

    def body() -> list[Fetched]:
        return [_fetch_parts(conn, r) for r in conn.execute(statement, args).fetchall()]

    return read_tx(conn, body)


def get_thread(conn: sqlite3.Connection, thread_id: str) -> tuple[Any, ...] | None:
    """The thread's record (`sql.THREAD_INFO_COLUMNS`), if it is live."""
    row: tuple[Any, ...] | None = conn.execute(sql.SELECT_THREAD, (thread_id,)).fetchone()
    return row


def list_threads(
    conn: sqlite3.Connection, statement: str, params: Sequence[Any]
) -> list[tuple[Any, ...]]:
    """One page of thread records (`sql.list_threads_sql`)."""
    return conn.execute(statement, params).fetchall()


def delta(
    conn: sqlite3.Connection,
    thread_id: str,
    ns: str,
    checkpoint_id: str | None,
    channels: list[str],
) -> list[tuple[Any, ...]]:
    """`codec.HistoryRow`s of the delta history of ``channels`` at the checkpoint (the
    latest without ``checkpoint_id``): one statement per 62 channels, one snapshot."""

    def body() -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = []
        for start in range(0, len(channels), sql.MAX_MASK_CHANNELS):
            chunk = channels[start : start + sql.MAX_MASK_CHANNELS]
            params = {
                "channels": orjson.dumps(chunk).decode(),
                "thread_id": thread_id,
                "ns": ns,
                "checkpoint_id": checkpoint_id,
                "full": (1 << len(chunk)) - 1,
                "max_depth": sql.MAX_DEPTH,
            }
            rows.extend(conn.execute(sql.DELTA_SQL, params).fetchall())
        return rows

    return read_tx(conn, body)


# --- writes (run inside `write_batch`) --------------------------------------------


def fence_thread(conn: sqlite3.Connection, thread_id: str, now: int, fence: int) -> None:
    """Raise the thread's fence to ``fence`` (`sql.FENCE_THREAD`, a compare-and-set in the
    caller's transaction); `StaleFenceError` if the thread holds a newer token."""
    params = {"thread_id": thread_id, "now": now, "fence": fence}
    if not conn.execute(sql.FENCE_THREAD, params).rowcount:
        (current,) = conn.execute(sql.FENCE_OF, (thread_id,)).fetchone()
        raise StaleFenceError(thread_id, fence, int(current))


def put(
    conn: sqlite3.Connection,
    encoded: codec.EncodedCheckpoint,
    serde: SerializerProtocol,
    now: int,
    fence: int | None = None,
) -> None:
    """Store one encoded checkpoint (its record, its new blobs, and carried values whose
    blob is missing) and update its thread's record. A stale ``fence`` raises
    `StaleFenceError`; a checkpoint with a parent on a deleted thread is a late write
    and raises `ThreadDeletedError` (the caller's transaction then undoes the put)."""
    row = encoded.row
    if fence is not None:
        fence_thread(conn, row.thread_id, now, fence)
    added = conn.execute(sql.INSERT_CHECKPOINT, (*row, now)).rowcount == 1
    if not added:
        conn.execute(sql.REPLACE_CHECKPOINT, (*row[3:], *row[:3]))
    size = len(row.checkpoint) + len(row.metadata)
    if encoded.blobs:
        conn.executemany(sql.INSERT_BLOB, encoded.blobs)
        size += sum(len(b.blob or b"") for b in encoded.blobs)
    if encoded.carried:
        # Normally stored by the put that created the version; only a hand-made
        # checkpoint gets here without it, and then its value must not be lost.
        missing = conn.execute(
            sql.MISSING_BLOBS,
            (codec.dump_json(encoded.carried), row.thread_id, row.checkpoint_ns),
        ).fetchall()
        for (channel,) in missing:
            blob = codec.encode_blob(
                serde,
                row.thread_id,
                row.checkpoint_ns,
                channel,
                encoded.carried[channel],
                encoded.carried_values[channel],
            )
            conn.execute(sql.INSERT_BLOB, blob)
            size += len(blob.blob)
    params: dict[str, Any] = {
        "thread_id": row.thread_id,
        "ns": row.checkpoint_ns,
        "checkpoint_id": row.checkpoint_id,
        "now": now,
        "added": int(added),
        # A replayed put replaces rows already counted.
        "bytes": size if added else 0,
        "metadata": row.metadata,
    }
    if conn.execute(sql.PUT_THREAD, params).rowcount:
        return
    # The thread's first checkpoint, or one after its deletion.
    state = conn.execute(sql.THREAD_DELETED_AT, (row.thread_id,)).fetchone()
    if state is not None and state[0] is not None and row.parent_checkpoint_id is not None:
        raise ThreadDeletedError(row.thread_id)
    head = row.checkpoint_ns == ""
    rows = conn.execute(sql.HEAD_SPECIAL_CHANNELS, (row.thread_id, row.checkpoint_id)).fetchall()
    params.update(
        latest=row.checkpoint_id if head else None,
        metadata=row.metadata if head else "{}",
        status=status_of(r[0] for r in rows) if head else "idle",
    )
    conn.execute(sql.START_THREAD, params)


def put_writes(
    conn: sqlite3.Connection, encoded: codec.EncodedWrites, now: int, fence: int | None = None
) -> None:
    """Store pending writes (first write wins, special slots last write wins) and count
    them in their thread's record; a stale ``fence`` raises `StaleFenceError`, writes to
    a deleted thread `ThreadDeletedError` (the caller's transaction then undoes them)."""
    rows = [*encoded.first_wins, *encoded.last_wins]
    if not rows:
        return
    first = rows[0]
    if fence is not None:
        fence_thread(conn, first.thread_id, now, fence)
    added = size = 0
    for w in encoded.first_wins:
        if conn.execute(sql.INSERT_WRITE_FIRST, w).rowcount:
            added += 1
            size += len(w.blob or b"")
    for w in encoded.last_wins:
        key = (w.thread_id, w.checkpoint_ns, w.checkpoint_id, w.task_id, w.idx)
        if conn.execute(sql.WRITE_EXISTS, key).fetchone() is None:
            added += 1
            size += len(w.blob or b"")
        conn.execute(sql.INSERT_WRITE_LAST, w)
    params = {
        "thread_id": first.thread_id,
        "ns": first.checkpoint_ns,
        "checkpoint_id": first.checkpoint_id,
        "now": now,
        "added": added,
        "bytes": size,
        "status": status_of(w.channel for w in encoded.last_wins),
    }
    statement = sql.WRITES_THREAD if params["status"] == "idle" else sql.WRITES_THREAD_STATUS
    if not conn.execute(statement, params).rowcount:
        raise ThreadDeletedError(first.thread_id)


def purge_threads(
    conn: sqlite3.Connection, thread_ids: Sequence[str], now: int, dry_run: bool = False
) -> Removed:
    """Delete every checkpoint, blob and write of the threads and leave each a tombstone
    (late writes are refused); what was (or, with ``dry_run``, would be) removed."""
    removed = Removed()
    for thread_id in thread_ids:
        params = {"thread_id": thread_id, "now": now}
        ck, ck_bytes, wr, wr_bytes, bl, bl_bytes = conn.execute(
            sql.THREAD_FOOTPRINT, params
        ).fetchone()
        live = conn.execute(sql.SELECT_THREAD, (thread_id,)).fetchone() is not None
        removed += Removed(int(live), ck, wr, bl, ck_bytes + wr_bytes + bl_bytes)
        if dry_run:
            continue
        for table in (CHECKPOINTS, BLOBS, WRITES):
            conn.execute(f"DELETE FROM {table} WHERE thread_id = ?", (thread_id,))
        conn.execute(sql.TOMBSTONE_THREAD, params)
    return removed


def delete_threads(
    conn: sqlite3.Connection, thread_ids: Sequence[str], now: int, fence: int | None = None
) -> None:
    """`purge_threads`, answering nothing (``delete_thread`` and ``prune(strategy="delete")``);
    with ``fence`` (one thread), refused by a stale token like any write."""
    if fence is not None:
        for thread_id in thread_ids:
            fence_thread(conn, thread_id, now, fence)
    purge_threads(conn, thread_ids, now)


def refresh_threads(conn: sqlite3.Connection, thread_ids: Sequence[str]) -> None:
    """Recompute the records of threads whose rows were deleted or copied in bulk."""
    for thread_id in thread_ids:
        conn.execute(sql.REFRESH_THREAD, {"thread_id": thread_id})


def copy_thread(conn: sqlite3.Connection, source: str, target: str, now: int) -> None:
    """Copy every row of ``source`` to ``target`` (the source wins on a shared key)."""
    for statement in sql.copy_thread_statements():
        conn.execute(statement, (target, source))
    if conn.execute(sql.CHECKPOINT_OF_THREAD, (target,)).fetchone() is None:
        return  # nothing was copied: no thread to record
    conn.execute(sql.ENSURE_THREAD, {"thread_id": target, "now": now})
    refresh_threads(conn, [target])


def _graph(conn: sqlite3.Connection, thread_id: str, ns: str) -> CheckpointGraph:
    return CheckpointGraph(conn.execute(sql.SELECT_GRAPH, (thread_id, ns)).fetchall())


def _remove(conn: sqlite3.Connection, thread_id: str, ns: str, doomed: Sequence[str]) -> None:
    """Delete checkpoints ``doomed`` with their writes, cut the parent links that pointed at
    them, then drop blobs no survivor holds."""
    if not doomed:
        return
    ids = orjson.dumps(list(doomed)).decode()
    for table in (CHECKPOINTS, WRITES):
        conn.execute(
            f"DELETE FROM {table} WHERE thread_id = ? AND checkpoint_ns = ? "
            "AND checkpoint_id IN (SELECT value FROM json_each(?))",
            (thread_id, ns, ids),
        )
    # A parent that can no longer be loaded is not named (docs/threads.md).
    conn.execute(
        f"UPDATE {CHECKPOINTS} SET parent_checkpoint_id = NULL WHERE thread_id = ? "
        "AND checkpoint_ns = ? AND parent_checkpoint_id IN (SELECT value FROM json_each(?))",
        (thread_id, ns, ids),
    )
    conn.execute(
        f"DELETE FROM {BLOBS} WHERE thread_id = ? AND checkpoint_ns = ? AND NOT EXISTS ("
        f"SELECT 1 FROM {CHECKPOINTS} c, json_each(c.value_versions) j "
        f"WHERE c.thread_id = {BLOBS}.thread_id AND c.checkpoint_ns = {BLOBS}.checkpoint_ns "
        f"AND j.key = {BLOBS}.channel AND j.value = {BLOBS}.version)",
        (thread_id, ns),
    )


def prune_keep_latest(conn: sqlite3.Connection, thread_ids: Sequence[str]) -> None:
    """Per namespace keep the latest checkpoint and the ancestors its reconstruction reads."""
    for thread_id in thread_ids:
        namespaces = [
            r[0]
            for r in conn.execute(
                f"SELECT DISTINCT checkpoint_ns FROM {CHECKPOINTS} WHERE thread_id = ?",
                (thread_id,),
            )
        ]
        for ns in namespaces:
            graph = _graph(conn, thread_id, ns)
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
    refresh_threads(conn, thread_ids)


def delete_for_runs(conn: sqlite3.Connection, run_ids: Sequence[str]) -> None:
    """Delete the runs' checkpoints except ancestors a survivor's reconstruction reads."""
    pairs = conn.execute(
        f"SELECT DISTINCT thread_id, checkpoint_ns FROM {CHECKPOINTS} "
        "WHERE run_id IN (SELECT value FROM json_each(?))",
        (orjson.dumps(list(run_ids)).decode(),),
    ).fetchall()
    wanted = set(run_ids)
    for thread_id, ns in pairs:
        graph = _graph(conn, thread_id, ns)
        doomed = {cid for cid, run in graph.run_id.items() if run in wanted}
        for cid in graph.parent:
            if cid not in doomed:
                doomed.difference_update(graph.needed(cid))
        _remove(conn, thread_id, ns, sorted(doomed))
    refresh_threads(conn, sorted({thread_id for thread_id, _ in pairs}))


# --- retention --------------------------------------------------------------------


def sweep_claim(
    conn: sqlite3.Connection,
    policy: RetentionPolicy,
    now: int,
    after: str | None,
    limit: int,
    claim_until: int | None,
    rescan: bool,
    only: Sequence[str] | None,
) -> list[tuple[str, bool]]:
    """The next threads of a sweep pass ``(thread_id, deleted)``, claimed until
    ``claim_until`` (a dry run passes ``None`` and claims nothing)."""
    params = sweep_params(policy, now, after, limit)
    rows = conn.execute(
        sql.SWEEP_CANDIDATES,
        {
            **params,
            "rescan": int(rescan),
            "only": None if only is None else orjson.dumps(list(only)).decode(),
        },
    ).fetchall()
    if claim_until is not None and rows:
        conn.execute(sql.CLAIM_THREADS, (claim_until, orjson.dumps([r[0] for r in rows]).decode()))
    return [(r[0], bool(r[1])) for r in rows]


def sweep_params(
    policy: RetentionPolicy, now: int, after: str | None, limit: int
) -> dict[str, Any]:
    """`sql.SWEEP_CANDIDATES`' parameters (an unset limit is NULL: never true)."""
    return {
        "after": after or "",
        "now": now,
        "limit": limit,
        "keep_last": policy.keep_last,
        "idle_cutoff": None if policy.idle_ttl is None else now - int(policy.idle_ttl * 1e6),
        "age_cutoff": None if policy.max_age is None else now - int(policy.max_age * 1e6),
    }


def sweep_thread(
    conn: sqlite3.Connection, thread_id: str, policy: RetentionPolicy, now: int, dry_run: bool
) -> ThreadSwept | None:
    """Apply ``policy`` (with the thread's overrides) to one claimed thread; ``None`` when
    it is no longer live. A dry run raises `DryRun` carrying the answer, so the batch's
    transaction undoes everything."""
    state = conn.execute(sql.SWEEP_STATE, (thread_id,)).fetchone()
    if state is None or state[0] is not None or not state[1]:
        return None
    effective = policy.overridden(orjson.loads(state[3]) if state[3] else None)
    plan = plan_thread(
        lambda: {
            ns: _graph(conn, thread_id, ns)
            for (ns,) in conn.execute(sql.NAMESPACES_OF_THREAD, (thread_id,)).fetchall()
        },
        effective,
        now=now,
        touched_at=state[2],
    )
    if plan.expire:
        swept = ThreadSwept(thread_id, True, purge_threads(conn, [thread_id], now))
    else:
        before = _footprint(conn, thread_id)
        for ns, gone in plan.doomed.items():
            _remove(conn, thread_id, ns, gone)
        if plan.doomed:
            refresh_threads(conn, [thread_id])
        removed = before - _footprint(conn, thread_id)
        conn.execute(
            sql.SWEPT_THREAD, {"thread_id": thread_id, "now": now, "sweep_after": plan.sweep_after}
        )
        swept = ThreadSwept(thread_id, False, removed)
    if dry_run:
        raise DryRun(swept)
    return swept


def _footprint(conn: sqlite3.Connection, thread_id: str) -> Removed:
    ck, ck_bytes, wr, wr_bytes, bl, bl_bytes = conn.execute(
        sql.THREAD_FOOTPRINT, {"thread_id": thread_id}
    ).fetchone()
    return Removed(0, ck, wr, bl, ck_bytes + wr_bytes + bl_bytes)


def finish_cleanup(conn: sqlite3.Connection, thread_ids: Sequence[str], now: int) -> None:
    """Mark tombstones whose events and stream keys are deleted as done."""
    conn.execute(sql.CLEANED_THREADS, (now, orjson.dumps(list(thread_ids)).decode()))


def set_retention(
    conn: sqlite3.Connection, thread_id: str, retention: str | None, now: int
) -> None:
    """Store a thread's retention overrides (JSON text; ``None`` clears them)."""
    state = conn.execute(sql.THREAD_DELETED_AT, (thread_id,)).fetchone()
    if state is not None and state[0] is not None:
        raise ThreadDeletedError(thread_id)
    conn.execute(sql.SET_RETENTION, {"thread_id": thread_id, "now": now, "retention": retention})


def compact(conn: sqlite3.Connection, full: bool) -> None:
    """Give free pages back to the file system: ``PRAGMA incremental_vacuum`` on a file
    in incremental auto-vacuum mode, else (or with ``full``) a ``VACUUM`` that rewrites
    the file and switches it to that mode; then truncate the WAL."""
    mode = conn.execute("PRAGMA auto_vacuum").fetchone()[0]
    if full or mode != 2:  # 2: incremental
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        conn.execute("VACUUM")
    else:
        # Through sqlite3_exec: it steps the pragma to the end (one page per step), where
        # a cursor's fetch stops after the first page.
        conn.executescript("PRAGMA incremental_vacuum;")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()


def touch_thread(conn: sqlite3.Connection, thread_id: str, now: int) -> bool:
    """Refresh a live thread's ``touched_at``; whether it exists."""
    return conn.execute(sql.TOUCH_THREAD, (now, thread_id)).rowcount > 0
