"""The sqlite memory store's schema and its batch, as functions on a ``sqlite3.Connection``.

A batch's steps (`runstore.store.sqlbatch`) run in order as one function on the
connection's thread: one thread hop and one transaction per `abatch`. A batch that
writes runs as one op of the file's write queue (`runstore.plugins.sqlite.commits`);
a batch that only reads runs in one read transaction (one snapshot), and hands back
the items whose expiry a read refreshes, which the store then writes in one op.

Vectors are float32 blobs in ``runstore_store_vectors`` (sqlite-vec's layout). A
semantic search finds the nearest vectors in the store's vector cache
(`runstore.store.vectorcache`, valid at the file's generation in
``runstore_store_generation``, which triggers bump on every write to the vectors). When
those cannot decide the page, it ranks inside SQL with sqlite-vec's functions on the
connection (`runstore.plugins.sqlite.vectors`, ``vec_distance_cosine``), or without them
reads the candidates' vectors and ranks them with numpy (`Scorer`), with the same result.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from langgraph.store.base import Item, Result

from runstore.sql.migrations import Migration
from runstore.store.sqlbatch import (
    GetStep,
    ListStep,
    PutStep,
    SearchStep,
    Step,
    expires_at,
    item_of,
    list_namespaces,
    page,
    rank,
    search_item_of,
)
from runstore.store.sqlplan import FilterSql, decode_namespace, prefix_condition
from runstore.store.vectorcache import VectorCache, decode
from runstore.validation import loads

ITEMS = "runstore_store_items"
VECTORS = "runstore_store_vectors"
GENERATION = "runstore_store_generation"
COMPONENT = "store"

MIGRATIONS: list[Migration] = [
    Migration(
        1,
        [
            f"""CREATE TABLE {ITEMS} (
    prefix BLOB NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    expires_at INTEGER,
    ttl_minutes REAL,
    PRIMARY KEY (prefix, key)
) WITHOUT ROWID""",
            # WITHOUT ROWID: a search under a namespace prefix reads its slice of the
            # primary key and the rows with it, not an index and then each row.
            f"CREATE INDEX {ITEMS}_expiry ON {ITEMS} (expires_at) WHERE expires_at IS NOT NULL",
            f"""CREATE TABLE {VECTORS} (
    prefix BLOB NOT NULL,
    key TEXT NOT NULL,
    field TEXT NOT NULL,
    embedding BLOB NOT NULL,
    PRIMARY KEY (prefix, key, field)
)""",
        ],
        "memory store items and their embedded fields",
    ),
    Migration(
        2,
        [
            f"CREATE TABLE {GENERATION} (id INTEGER PRIMARY KEY CHECK (id = 0), n INTEGER NOT NULL)",
            f"INSERT INTO {GENERATION} (id, n) VALUES (0, 0)",
            # Every change to the vectors, by any writer in any process, counts: the
            # searches' vector cache is valid only at the generation it was read at.
            *(
                f"CREATE TRIGGER {VECTORS}_{event.lower()} AFTER {event} ON {VECTORS} "
                f"BEGIN UPDATE {GENERATION} SET n = n + 1; END"
                for event in ("INSERT", "UPDATE", "DELETE")
            ),
        ],
        "a generation counter of the embedded fields (vector cache validity)",
    ),
]

#: The order of a search without a query (and of ties among equal scores).
ORDER = "i.updated_at DESC, i.prefix, i.key"
_COLUMNS = "i.prefix, i.key, i.value, i.created_at, i.updated_at, i.ttl_minutes"
_LIVE = "(i.expires_at IS NULL OR i.expires_at > ?)"


class SqliteFilters(FilterSql):
    """Filters over the ``value`` column with sqlite's JSON1 functions (the path a parameter)."""

    string_types = ("text",)
    number_types = ("integer", "real")

    def reaches(self, path: tuple[str, ...]) -> bool:
        # Each key is quoted in the JSON path; a key holding a quote or backslash is left
        # to the Python evaluator.
        return not any('"' in key or "\\" in key for key in path)

    def equal_needs_type(self, wanted: str | int | float) -> bool:
        # json_extract gives a JSON string as TEXT, a number as INTEGER or REAL, true and
        # false as 1 and 0, an object or array as its JSON text; TEXT never equals a
        # number. So only 0 and 1 (booleans) and text starting like an object or array
        # need the type checked too, which costs a second parse of the value.
        if isinstance(wanted, str):
            return wanted.lstrip().startswith(("{", "["))
        return wanted in (0, 1)

    def member_type(self, path: tuple[str, ...], params: list[Any]) -> str:
        return f"json_type(i.value, {_json_path(path)})"

    def member(self, path: tuple[str, ...], params: list[Any]) -> str:
        return f"json_extract(i.value, {_json_path(path)})"


def _json_path(path: tuple[str, ...]) -> str:
    """sqlite's JSON path to the member at ``path`` (object keys only), as a SQL literal.

    A literal, not a parameter: sqlite then parses the path once per statement instead
    of once per row (filtered searches over 10,000 items took about 1.5x as long). Keys
    reaching here hold no ``"`` or ``\\`` (`SqliteFilters.reaches`); a ``'`` is doubled.
    """
    text = "$" + "".join(f'."{key}"' for key in path)
    return "'" + text.replace("'", "''") + "'"


FILTERS = SqliteFilters()


@dataclass
class Outcome:
    """What a batch returns: one result per step, and the expiries its reads refreshed
    (``(expires_at, prefix, key)``) when it ran read-only and could not write them."""

    results: list[Result]
    refresh: list[tuple[int, bytes, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Context:
    """The batch's time, the index's dimensions, whether sqlite-vec ranks in SQL,
    whether the batch runs in a write transaction (refreshes are then written at once)
    and the store's vector cache."""

    now: int
    dims: int | None
    vec: bool
    write: bool = False
    cache: VectorCache | None = None


def write_batch(conn: sqlite3.Connection, steps: Sequence[Step], ctx: Context) -> Outcome:
    """Run ``steps`` in order inside the caller's write transaction (``ctx.write`` set);
    refreshes are written as they happen."""
    return _run(conn, steps, ctx)


def read_batch(conn: sqlite3.Connection, steps: Sequence[Step], ctx: Context) -> Outcome:
    """Run read-only ``steps`` in one read transaction; expiries to refresh handed back."""
    if conn.in_transaction:
        # Someone else's transaction, which may yet roll back: no vector cache (`_cached`).
        return _run(conn, steps, replace(ctx, cache=None))
    conn.execute("BEGIN")
    try:
        return _run(conn, steps, ctx)
    finally:
        if conn.in_transaction:
            conn.execute("COMMIT")


def refresh(conn: sqlite3.Connection, targets: Sequence[tuple[int, bytes, str]]) -> None:
    """Write refreshed expiries (inside the caller's write transaction)."""
    _write_refresh(conn, targets)


def sweep(conn: sqlite3.Connection, now: int) -> int:
    """Delete the items expired at ``now`` and their vectors; return how many items."""
    conn.execute(
        f"DELETE FROM {VECTORS} WHERE EXISTS (SELECT 1 FROM {ITEMS} i WHERE i.prefix = "
        f"{VECTORS}.prefix AND i.key = {VECTORS}.key AND i.expires_at <= ?)",
        (now,),
    )
    return conn.execute(f"DELETE FROM {ITEMS} WHERE expires_at <= ?", (now,)).rowcount


def _write_refresh(conn: sqlite3.Connection, targets: Sequence[tuple[int, bytes, str]]) -> None:
    if targets:
        conn.executemany(
            f"UPDATE {ITEMS} SET expires_at = ? WHERE prefix = ? AND key = ? AND ttl_minutes IS NOT NULL",
            targets,
        )


def _run(conn: sqlite3.Connection, steps: Sequence[Step], ctx: Context) -> Outcome:
    outcome = Outcome(results=[])
    for step in steps:
        if isinstance(step, GetStep):
            outcome.results.append(_get(conn, step, ctx, outcome.refresh))
        elif isinstance(step, PutStep):
            _put(conn, step, ctx)
            outcome.results.append(None)
        elif isinstance(step, SearchStep):
            outcome.results.append(_search(conn, step, ctx, outcome.refresh))
        else:
            outcome.results.append(_list(conn, step, ctx))
    return outcome


def _note_refresh(refresh: list[tuple[int, bytes, str]], ctx: Context, prefix: bytes, key: str, ttl: float | None) -> None:
    stamp = expires_at(ctx.now, ttl)
    if stamp is not None:
        refresh.append((stamp, prefix, key))


def _get(conn: sqlite3.Connection, step: GetStep, ctx: Context, refresh: list[tuple[int, bytes, str]]) -> Item | None:
    row = conn.execute(
        f"SELECT {_COLUMNS} FROM {ITEMS} i WHERE i.prefix = ? AND i.key = ? AND {_LIVE}",
        (step.prefix, step.key, ctx.now),
    ).fetchone()
    if row is None:
        return None
    if step.refresh:
        _note_refresh(refresh, ctx, row[0], row[1], row[5])
        # Written before the next step runs, so later steps of the batch see it.
        _flush(conn, ctx, refresh)
    return item_of(step.namespace, row[1], row[2], row[3], row[4])


def _flush(conn: sqlite3.Connection, ctx: Context, refresh: list[tuple[int, bytes, str]]) -> None:
    """In a write batch, write pending refreshes now, so later steps see them (a read
    batch hands them back instead)."""
    if refresh and ctx.write:
        _write_refresh(conn, refresh)
        refresh.clear()


def _put(conn: sqlite3.Connection, step: PutStep, ctx: Context) -> None:
    if step.value_text is None:
        conn.execute(f"DELETE FROM {ITEMS} WHERE prefix = ? AND key = ?", (step.prefix, step.key))
        conn.execute(f"DELETE FROM {VECTORS} WHERE prefix = ? AND key = ?", (step.prefix, step.key))
        return
    now = ctx.now
    conn.execute(
        f"""INSERT INTO {ITEMS} (prefix, key, value, created_at, updated_at, expires_at, ttl_minutes)
VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (prefix, key) DO UPDATE SET
    value = excluded.value,
    created_at = CASE WHEN {ITEMS}.expires_at IS NOT NULL AND {ITEMS}.expires_at <= ?
                      THEN excluded.created_at ELSE {ITEMS}.created_at END,
    updated_at = excluded.updated_at,
    expires_at = excluded.expires_at,
    ttl_minutes = excluded.ttl_minutes""",
        (step.prefix, step.key, step.value_text, now, now, expires_at(now, step.ttl_minutes), step.ttl_minutes, now),
    )
    conn.execute(f"DELETE FROM {VECTORS} WHERE prefix = ? AND key = ?", (step.prefix, step.key))
    if step.vectors:
        conn.executemany(
            f"INSERT OR REPLACE INTO {VECTORS} (prefix, key, field, embedding) VALUES (?, ?, ?, ?)",
            [(step.prefix, step.key, path, vector.tobytes()) for path, vector in step.vectors],
        )


def _where(step: SearchStep, ctx: Context, params: list[Any]) -> str:
    clauses = [prefix_condition("i.prefix", step.namespace_prefix, params), _LIVE]
    params.append(ctx.now)
    clauses.append(step.rendered.sql)
    params.extend(step.rendered.params)
    return " AND ".join(clauses)


def _search(
    conn: sqlite3.Connection, step: SearchStep, ctx: Context, refresh: list[tuple[int, bytes, str]]
) -> list[Any]:
    if step.query_vector is not None and ctx.dims is not None:
        found = _ranked(conn, step, ctx)
    else:
        params: list[Any] = []
        sql = f"SELECT {_COLUMNS}, NULL FROM {ITEMS} i WHERE {_where(step, ctx, params)} ORDER BY {ORDER}"
        if step.rendered.exact:
            sql += " LIMIT ? OFFSET ?"
            params.extend([step.limit, step.offset])
            found = conn.execute(sql, params).fetchall()
        else:
            found = page([r for r in conn.execute(sql, params) if step.keep(_value(r))], step)
    results = []
    for row in found:
        item = item_of(decode_namespace(row[0]), row[1], row[2], row[3], row[4])
        results.append(search_item_of(item, row[6]))
        if step.refresh:
            _note_refresh(refresh, ctx, row[0], row[1], row[5])
    _flush(conn, ctx, refresh)
    return results


def _value(row: Sequence[Any]) -> Any:
    return loads(row[2])


def _ranked(conn: sqlite3.Connection, step: SearchStep, ctx: Context) -> list[Any]:
    """A semantic search: items by their best field's cosine similarity, unembedded ones last."""
    assert step.query_vector is not None and ctx.dims is not None
    if step.rendered.exact and (ctx.vec or _cached(ctx)):
        top = _nearest(conn, step, ctx)
        if top is not None:
            return top
    if ctx.vec:
        params: list[Any] = [step.query_vector.tobytes()]
        vector_prefix = prefix_condition("v.prefix", step.namespace_prefix, params)
        params.append(ctx.dims * 4)
        where = _where(step, ctx, params)
        sql = f"""SELECT {_COLUMNS}, s.score FROM {ITEMS} i LEFT JOIN (
    SELECT v.prefix, v.key, MAX(COALESCE(1.0 - vec_distance_cosine(v.embedding, ?), 0.0)) AS score
    FROM {VECTORS} v WHERE {vector_prefix} AND length(v.embedding) = ? GROUP BY v.prefix, v.key
) s ON s.prefix = i.prefix AND s.key = i.key
WHERE {where} ORDER BY s.score IS NULL, s.score DESC, {ORDER}"""
        if step.rendered.exact:
            sql += " LIMIT ? OFFSET ?"
            params.extend([step.limit, step.offset])
            return conn.execute(sql, params).fetchall()
        return page([r for r in conn.execute(sql, params) if step.keep(_value(r))], step)
    params = []
    rows = conn.execute(f"SELECT {_COLUMNS} FROM {ITEMS} i WHERE {_where(step, ctx, params)}", params).fetchall()
    params = []
    vectors = conn.execute(
        f"SELECT v.prefix, v.key, v.embedding FROM {VECTORS} v JOIN {ITEMS} i "
        f"ON i.prefix = v.prefix AND i.key = v.key WHERE {_where(step, ctx, params)}",
        params,
    ).fetchall()
    return [(*row, score) for row, score in rank(rows, vectors, step, ctx.dims)]


#: How many vectors `_nearest` reads per result it needs (room for filtered-out items).
_OVERFETCH = 4


def _nearest(conn: sqlite3.Connection, step: SearchStep, ctx: Context) -> list[Any] | None:
    """The page from the nearest vectors alone, or ``None`` when they cannot decide it.

    Scoring every vector is the cost of a semantic search; joining each to its item and
    grouping by item on top of that tripled it (10,000 items). So the nearest
    ``_OVERFETCH`` times the needed vectors are read first, then only their items
    (expiry and filter checked in SQL). If enough of them pass and the last vector read
    scores below the last one kept (no tie cut off), that is the page; otherwise the
    full query decides (unembedded items to fill in, or a filter that dropped too many).
    The nearest vectors come from the store's vector cache when it may be used
    (`runstore.store.vectorcache`), else from sqlite-vec.
    """
    assert step.query_vector is not None and ctx.dims is not None
    wanted = step.offset + step.limit
    if step.limit == 0:
        return []
    fetch = wanted * _OVERFETCH + 16
    if _cached(ctx):
        nearest = _cached_nearest(conn, step, ctx, fetch)
    else:
        params: list[Any] = [step.query_vector.tobytes()]
        vector_prefix = prefix_condition("v.prefix", step.namespace_prefix, params)
        params.extend([ctx.dims * 4, fetch])
        nearest = conn.execute(
            f"SELECT v.prefix, v.key, COALESCE(1.0 - vec_distance_cosine(v.embedding, ?), 0.0) AS score "
            f"FROM {VECTORS} v WHERE {vector_prefix} AND length(v.embedding) = ? "
            "ORDER BY score DESC LIMIT ?",
            params,
        ).fetchall()
    if nearest is None or len(nearest) < fetch:
        return None  # every vector was read: the unembedded items may be needed too
    best: dict[tuple[bytes, str], float] = {}
    for prefix, key, score in nearest:
        best.setdefault((prefix, key), score)  # the first is the item's best (descending)
    pairs = list(best)
    params = [v for pair in pairs for v in pair]
    marks = ", ".join("(?, ?)" for _ in pairs)
    where = _where(step, ctx, params)
    # CROSS JOIN keeps the candidates outside: one primary-key lookup each, where an IN
    # list let the planner walk the prefix's whole range (5 ms for 10,000 items).
    rows = conn.execute(
        f"WITH c(p, k) AS (VALUES {marks}) SELECT {_COLUMNS} FROM c CROSS JOIN {ITEMS} i "
        f"ON i.prefix = c.p AND i.key = c.k WHERE {where}",
        params,
    ).fetchall()
    kept = sorted(
        ((*row, best[(row[0], row[1])]) for row in rows),
        key=lambda r: (-r[6], -int(r[4]), r[0], r[1]),
    )
    if len(kept) < wanted or not kept[wanted - 1][6] > nearest[-1][2]:
        return None
    return kept[step.offset : wanted]


def _cached(ctx: Context) -> bool:
    # Never inside a write transaction: it may see (and would cache) changes that are
    # then rolled back, under a generation a later commit reuses.
    return ctx.cache is not None and not ctx.write


def _cached_nearest(
    conn: sqlite3.Connection, step: SearchStep, ctx: Context, fetch: int
) -> list[tuple[bytes, str, float]] | None:
    """`_nearest`'s vectors from the cache, (re)loaded when the generation moved on; the
    generation is read in the batch's read transaction, so it matches what it sees."""
    assert ctx.cache is not None and ctx.dims is not None and step.query_vector is not None
    generation = conn.execute(f"SELECT n FROM {GENERATION}").fetchone()[0]
    entry = ctx.cache.get(step.namespace_prefix, ctx.dims, generation)
    if entry is None:
        params: list[Any] = []
        vector_prefix = prefix_condition("v.prefix", step.namespace_prefix, params)
        params.append(ctx.dims * 4)
        rows = conn.execute(
            f"SELECT v.prefix, v.key, v.embedding FROM {VECTORS} v WHERE {vector_prefix} "
            "AND length(v.embedding) = ?",
            params,
        ).fetchall()
        entry = decode(generation, ctx.dims, rows)
        ctx.cache.put(step.namespace_prefix, entry)
    return entry.nearest(step.query_vector, fetch)


def _list(conn: sqlite3.Connection, step: ListStep, ctx: Context) -> list[tuple[str, ...]]:
    rows = conn.execute(
        f"SELECT DISTINCT i.prefix FROM {ITEMS} i WHERE {_LIVE}", (ctx.now,)
    ).fetchall()
    return list_namespaces((decode_namespace(r[0]) for r in rows), step.op)
