"""The PostgreSQL memory store's schema and its batch, as statements on an asyncpg connection.

Each step of a batch (`runstore.store.sqlbatch`) is one statement, and a step that
reads and writes does both in that statement (data-modifying ``WITH``): a put writes
the item and replaces its vectors, a read refreshes the expiries of what it returns.
So a single op is one round trip; a batch of several runs its statements in order
inside one ``BEGIN`` ... ``COMMIT`` (`PostgresStore.abatch`).

Vectors are float32 ``bytea`` (no server extension needed). A semantic search ranks the
vectors on the client with numpy: from the store's vector cache (`_nearest`, valid at the
generation summed from ``runstore_store_vector_changes``, which a trigger appends to on
every write to the vectors), else by reading the candidates' vectors
(`runstore.store.sqlbatch.rank`): measured on 10,000 384-dimension vectors, that took
about 36 ms where scoring ``float4[]`` arrays in SQL (``unnest``) took about 640 ms.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from langgraph.store.base import Item, Result

from runstore.sql.migrations import Migration
from runstore.store.sqlbatch import (
    GetStep,
    ListStep,
    PutStep,
    SearchStep,
    Step,
    decoded,
    expires_at,
    expiry_sql,
    item_of,
    list_namespaces,
    page,
    rank,
    rank_keys,
    search_item_of,
)
from runstore.store.sqlplan import FilterSql, decode_namespace, prefix_condition
from runstore.store.vectorcache import VectorCache, decode
from runstore.validation import dumps

from .engine import POSTGRES

ITEMS = "runstore_store_items"
VECTORS = "runstore_store_vectors"
CHANGES = "runstore_store_vector_changes"
COMPONENT = "store"

MIGRATIONS: list[Migration] = [
    Migration(
        1,
        [
            # The namespace as bytes (runstore.store.sqlplan); keys sort by code point.
            f"""CREATE TABLE {ITEMS} (
    prefix BYTEA NOT NULL,
    key TEXT COLLATE "C" NOT NULL,
    value JSONB NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    expires_at BIGINT,
    ttl_minutes DOUBLE PRECISION,
    PRIMARY KEY (prefix, key)
)""",
            f"CREATE INDEX {ITEMS}_expiry ON {ITEMS} (expires_at) WHERE expires_at IS NOT NULL",
            # A search's order: with a LIMIT the planner can walk it newest first and stop
            # at the page instead of sorting every match (a filtered search over 10,000
            # items: about 0.3 ms instead of 5 ms).
            f"CREATE INDEX {ITEMS}_recent ON {ITEMS} (updated_at DESC, prefix, key)",
            f"""CREATE TABLE {VECTORS} (
    prefix BYTEA NOT NULL,
    key TEXT COLLATE "C" NOT NULL,
    field TEXT NOT NULL,
    embedding BYTEA NOT NULL,
    PRIMARY KEY (prefix, key, field)
)""",
        ],
        "memory store items and their embedded fields",
    ),
    Migration(
        2,
        [
            # One row per change to the vectors (a trigger, so every writer in every
            # process counts), summed per namespace range: the generation the searches'
            # vector cache is valid at. Rows are only inserted, never updated, so writers
            # never wait on each other; the sweep folds them into one row per namespace
            # (same sums).
            f"CREATE TABLE {CHANGES} (prefix BYTEA NOT NULL, weight BIGINT NOT NULL DEFAULT 1)",
            f"CREATE INDEX {CHANGES}_prefix ON {CHANGES} (prefix) INCLUDE (weight)",
            f"""CREATE FUNCTION {VECTORS}_changed() RETURNS trigger LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        INSERT INTO {CHANGES} (prefix) VALUES (OLD.prefix);
    END IF;
    IF TG_OP = 'INSERT' OR (TG_OP = 'UPDATE' AND NEW.prefix <> OLD.prefix) THEN
        INSERT INTO {CHANGES} (prefix) VALUES (NEW.prefix);
    END IF;
    RETURN NULL;
END $$""",
            f"CREATE TRIGGER {VECTORS}_changed AFTER INSERT OR UPDATE OR DELETE ON {VECTORS} "
            f"FOR EACH ROW EXECUTE FUNCTION {VECTORS}_changed()",
        ],
        "a change log of the embedded fields (vector cache validity)",
    ),
]

#: The order of a search without a query (and of ties among equal scores).
ORDER = "i.updated_at DESC, i.prefix, i.key"
_COLUMNS = "i.prefix, i.key, i.value, i.created_at, i.updated_at, i.ttl_minutes"
_LIVE = "(i.expires_at IS NULL OR i.expires_at > ?)"


class PostgresFilters(FilterSql):
    """Filters over the ``value`` column with jsonb operators (the path a ``text[]`` parameter)."""

    def reaches(self, path: tuple[str, ...]) -> bool:
        # ``#>`` reads a key that looks like a number as an index into an array, where
        # the shared rule finds no member: such paths are left to the Python evaluator.
        return not any(_INDEX_LIKE.match(key) for key in path)

    def equal_needs_type(self, wanted: str | int | float) -> bool:
        # jsonb equality is JSON equality already: a string never equals a number, 1 = 1.0.
        return False

    def member_type(self, path: tuple[str, ...], params: list[Any]) -> str:
        return f"jsonb_typeof({self.member(path, params)})"

    def member(self, path: tuple[str, ...], params: list[Any]) -> str:
        if len(path) == 1:
            params.append(path[0])
            return "(i.value -> ?::text)"
        params.append(list(path))
        return "(i.value #> ?::text[])"

    def operand(self, value: str | int | float, params: list[Any]) -> str:
        # jsonb compares numbers as numbers and strings as strings: exact both ways.
        params.append(dumps(value))
        return "?::jsonb"

    def text_member(self, path: tuple[str, ...], params: list[Any]) -> str:
        # Code-point order, whatever the database's collation.
        params.append(list(path))
        return '((i.value #>> ?::text[]) COLLATE "C")'

    def text_operand(self, value: str, params: list[Any]) -> str:
        params.append(value)
        return "?::text"

    def boolean(self, path: tuple[str, ...], wanted: bool, params: list[Any]) -> str:
        member = self.member(path, params)
        params.append("true" if wanted else "false")
        return f"COALESCE({member} = ?::jsonb, FALSE)"


_INDEX_LIKE = re.compile(r"^\s*-?\d+\s*$")


FILTERS = PostgresFilters()


@functools.lru_cache(maxsize=512)
def sql(text: str) -> str:
    """Our ``?`` placeholders as asyncpg's ``$n``."""
    return POSTGRES.placeholders(text)


@dataclass(frozen=True)
class Context:
    """The batch's time, the index's dimensions and the store's vector cache (``None``
    in a batch that writes: its uncommitted changes must never be cached)."""

    now: int
    dims: int | None
    cache: VectorCache | None = None


#: Writing an item (an expired one's created_at restarts).
_UPSERT = f"""INSERT INTO {ITEMS} AS old (prefix, key, value, created_at, updated_at, expires_at, ttl_minutes)
    VALUES (?, ?, ?::jsonb, ?, ?, ?, ?)
    ON CONFLICT (prefix, key) DO UPDATE SET
        value = excluded.value,
        created_at = CASE WHEN old.expires_at IS NOT NULL AND old.expires_at <= excluded.updated_at
                          THEN excluded.created_at ELSE old.created_at END,
        updated_at = excluded.updated_at,
        expires_at = excluded.expires_at,
        ttl_minutes = excluded.ttl_minutes
    RETURNING 1"""

#: A put that embeds: the item, its vectors replaced.
_PUT = f"""WITH item AS ({_UPSERT}), dropped AS (
    DELETE FROM {VECTORS} WHERE prefix = ? AND key = ? AND NOT (field = ANY(?::text[]))
)
INSERT INTO {VECTORS} (prefix, key, field, embedding)
SELECT ?, ?, f, e FROM unnest(?::text[], ?::bytea[]) AS t(f, e)
ON CONFLICT (prefix, key, field) DO UPDATE SET embedding = excluded.embedding"""

#: A put that embeds nothing: the item, and any vectors an earlier put left dropped.
_PUT_PLAIN = f"""WITH item AS ({_UPSERT})
DELETE FROM {VECTORS} WHERE prefix = ? AND key = ?"""

_DELETE = f"""WITH item AS (DELETE FROM {ITEMS} WHERE prefix = ? AND key = ?)
DELETE FROM {VECTORS} WHERE prefix = ? AND key = ?"""


_EXPIRY = expiry_sql(f"{ITEMS}.ttl_minutes")


def _refreshing(select: str, params: list[Any], now: int) -> tuple[str, list[Any]]:
    """``select`` (item rows) that also pushes back the expiry of each row it returns."""
    text = f"""WITH hit AS ({select}), refreshed AS (
    UPDATE {ITEMS} SET expires_at = {_EXPIRY}
    FROM hit WHERE {ITEMS}.prefix = hit.prefix AND {ITEMS}.key = hit.key
        AND {ITEMS}.ttl_minutes IS NOT NULL
)
SELECT * FROM hit ORDER BY updated_at DESC, prefix, key"""
    return text, [*params, now]


async def run_steps(conn: Any, steps: Sequence[Step], ctx: Context) -> list[Result]:
    """Run ``steps`` in order on asyncpg connection ``conn`` (inside the caller's transaction
    when there are several); one result per step."""
    results: list[Result] = []
    for step in steps:
        if isinstance(step, GetStep):
            results.append(await _get(conn, step, ctx))
        elif isinstance(step, PutStep):
            await _put(conn, step, ctx)
            results.append(None)
        elif isinstance(step, SearchStep):
            results.append(await _search(conn, step, ctx))
        else:
            results.append(await _list(conn, step, ctx))
    return results


def writes(steps: Sequence[Step]) -> bool:
    """Whether running ``steps`` may write (a put, or a read that refreshes expiries)."""
    return any(
        isinstance(step, PutStep) or (isinstance(step, GetStep | SearchStep) and step.refresh)
        for step in steps
    )


def one_statement(steps: Sequence[Step]) -> bool:
    """Whether ``steps`` run as one statement (which then needs no transaction around it):
    one step, and not a semantic search or a search filtered in Python that refreshes."""
    if len(steps) != 1:
        return False
    step = steps[0]
    if isinstance(step, SearchStep):
        return step.query_vector is None and (step.rendered.exact or not step.refresh)
    return True


async def sweep(conn: Any, now: int) -> int:
    """Delete the items expired at ``now`` and their vectors (one statement); return how many."""
    text = f"""WITH gone AS (
    DELETE FROM {ITEMS} WHERE expires_at <= ? RETURNING prefix, key
), vectors AS (
    DELETE FROM {VECTORS} v USING gone WHERE v.prefix = gone.prefix AND v.key = gone.key
)
SELECT count(*) FROM gone"""
    swept = int(await conn.fetchval(sql(text), now))
    await fold(conn, ())
    return swept


async def fold(conn: Any, prefix: tuple[str, ...]) -> None:
    """Fold the change log under ``prefix`` (``()``: all of it) to one row per namespace:
    the sums, and so the generations, stay what they were (a concurrent fold deletes
    only the rows its snapshot saw), and summing them reads fewer rows."""
    params: list[Any] = []
    where = prefix_condition("prefix", prefix, params)
    await conn.execute(
        sql(
            f"""WITH folded AS (DELETE FROM {CHANGES} WHERE {where} RETURNING prefix, weight)
INSERT INTO {CHANGES} (prefix, weight) SELECT prefix, sum(weight) FROM folded GROUP BY prefix"""
        ),
        *params,
    )


async def _get(conn: Any, step: GetStep, ctx: Context) -> Item | None:
    params: list[Any] = [step.prefix, step.key, ctx.now]
    select = f"SELECT {_COLUMNS} FROM {ITEMS} i WHERE i.prefix = ? AND i.key = ? AND {_LIVE}"
    if step.refresh:
        select, params = _refreshing(select, params, ctx.now)
    row = await conn.fetchrow(sql(select), *params)
    if row is None:
        return None
    return item_of(step.namespace, row[1], row[2], row[3], row[4])


async def _put(conn: Any, step: PutStep, ctx: Context) -> None:
    if step.value_text is None:
        await conn.execute(sql(_DELETE), step.prefix, step.key, step.prefix, step.key)
        return
    now = ctx.now
    expiry = expires_at(now, step.ttl_minutes)
    if not step.vectors:
        await conn.execute(
            sql(_PUT_PLAIN),
            step.prefix, step.key, step.value_text, now, now, expiry, step.ttl_minutes,
            step.prefix, step.key,
        )  # fmt: skip
        return
    fields = [path for path, _ in step.vectors]
    blobs = [vector.tobytes() for _, vector in step.vectors]
    await conn.execute(
        sql(_PUT),
        step.prefix, step.key, step.value_text, now, now, expiry, step.ttl_minutes,
        step.prefix, step.key, fields,
        step.prefix, step.key, fields, blobs,
    )  # fmt: skip


def _where(step: SearchStep, ctx: Context, params: list[Any]) -> str:
    clauses = [prefix_condition("i.prefix", step.namespace_prefix, params), _LIVE]
    params.append(ctx.now)
    clauses.append(step.rendered.sql)
    params.extend(step.rendered.params)
    return " AND ".join(clauses)


async def _search(conn: Any, step: SearchStep, ctx: Context) -> list[Any]:
    params: list[Any] = []
    where = _where(step, ctx, params)
    if step.query_vector is not None and ctx.dims is not None and step.rendered.exact:
        found = await _ranked(conn, step, ctx)
        if step.refresh:
            await _refresh(conn, [(r[0], r[1]) for r in found], ctx)
    elif step.query_vector is not None and ctx.dims is not None:
        rows = await conn.fetch(sql(f"SELECT {_COLUMNS} FROM {ITEMS} i WHERE {where}"), *params)
        vparams: list[Any] = []
        vectors = await conn.fetch(
            sql(
                f"SELECT v.prefix, v.key, v.embedding FROM {VECTORS} v JOIN {ITEMS} i "
                f"ON i.prefix = v.prefix AND i.key = v.key WHERE {_where(step, ctx, vparams)}"
            ),
            *vparams,
        )
        found = [(*row, score) for row, score in rank(rows, [tuple(v) for v in vectors], step, ctx.dims)]
        if step.refresh:
            await _refresh(conn, [(r[0], r[1]) for r in found], ctx)
    else:
        select = f"SELECT {_COLUMNS}, NULL::float8 AS score FROM {ITEMS} i WHERE {where} ORDER BY {ORDER}"
        if step.rendered.exact:
            select += " LIMIT ? OFFSET ?"
            params.extend([step.limit, step.offset])
            if step.refresh:
                select, params = _refreshing(select, params, ctx.now)
            found = list(await conn.fetch(sql(select), *params))
        else:
            rows = await conn.fetch(sql(select), *params)
            found = page([r for r in rows if step.keep(decoded(r[2]))], step)
            if step.refresh:
                await _refresh(conn, [(r[0], r[1]) for r in found], ctx)
    return [
        search_item_of(item_of(decode_namespace(r[0]), r[1], r[2], r[3], r[4]), r[6]) for r in found
    ]


async def _ranked(conn: Any, step: SearchStep, ctx: Context) -> list[Any]:
    """A semantic search whose filter the SQL decides: only the candidates' vectors travel;
    the page's items are read once ranked, then unembedded items fill what is left."""
    assert step.query_vector is not None and ctx.dims is not None
    if ctx.cache is not None:
        top = await _nearest(conn, step, ctx, ctx.cache)
        if top is not None:
            return top
    params: list[Any] = []
    where = _where(step, ctx, params)
    vectors = await conn.fetch(
        sql(
            f"SELECT v.prefix, v.key, i.updated_at, v.embedding FROM {VECTORS} v JOIN {ITEMS} i "
            f"ON i.prefix = v.prefix AND i.key = v.key WHERE {where}"
        ),
        *params,
    )
    ranked, embedded = rank_keys(vectors, step.query_vector, ctx.dims, step.offset + step.limit)
    wanted = ranked[step.offset : step.offset + step.limit]
    found: list[Any] = []
    if wanted:
        rows = await conn.fetch(
            sql(
                f"SELECT {_COLUMNS} FROM {ITEMS} i JOIN unnest(?::bytea[], ?::text[]) AS t(p, k) "
                "ON i.prefix = t.p AND i.key = t.k"
            ),
            [p for p, _, _ in wanted], [k for _, k, _ in wanted],
        )  # fmt: skip
        by_key = {(r[0], r[1]): r for r in rows}
        found = [(*by_key[(p, k)], score) for p, k, score in wanted if (p, k) in by_key]
    missing = step.offset + step.limit - embedded
    if len(found) < step.limit and missing > 0:
        params = []
        where = _where(step, ctx, params)
        params.append(ctx.dims * 4)
        params.extend([min(missing, step.limit - len(found)), max(0, step.offset - embedded)])
        found += await conn.fetch(
            sql(
                f"SELECT {_COLUMNS}, NULL::float8 FROM {ITEMS} i WHERE {where} AND NOT EXISTS ("
                f"SELECT 1 FROM {VECTORS} v WHERE v.prefix = i.prefix AND v.key = i.key "
                f"AND length(v.embedding) = ?) ORDER BY {ORDER} LIMIT ? OFFSET ?"
            ),
            *params,
        )
    return found


#: How many vectors `_nearest` reads per result it needs (room for filtered-out items).
_OVERFETCH = 4


def _generation(step: SearchStep, params: list[Any]) -> str:
    """SQL for the vector generation under the search's prefix (the change log's sum)."""
    where = prefix_condition("c.prefix", step.namespace_prefix, params)
    return f"(SELECT COALESCE(sum(c.weight), 0)::bigint FROM {CHANGES} c WHERE {where})"


async def _nearest(conn: Any, step: SearchStep, ctx: Context, cache: VectorCache) -> list[Any] | None:
    """The page from the nearest cached vectors alone, or ``None`` when they cannot decide
    it (then `_ranked` reads every vector). Fetching the 10,000 vectors of a prefix for
    each query cost about 150 ms; the cache (`runstore.store.vectorcache`) is checked
    against the generation in the same statement that reads the candidates' items, so
    both come from one snapshot. The candidates are the nearest ``_OVERFETCH`` times the
    needed vectors; if enough of them pass the filter and the last one read scores below
    the last one kept (no tie cut off), that is the page."""
    assert step.query_vector is not None and ctx.dims is not None
    wanted = step.offset + step.limit
    if step.limit == 0:
        return []
    fetch = wanted * _OVERFETCH + 16
    entry = cache.get(step.namespace_prefix, ctx.dims)  # checked against the generation below
    for _ in range(2):
        if entry is None:
            entry = await _load_vectors(conn, step, ctx.dims)
            if entry is None:
                return None
            cache.put(step.namespace_prefix, entry)
        nearest = entry.nearest(step.query_vector, fetch)
        if nearest is None:
            return None  # every vector would be read: the unembedded items may be needed too
        best: dict[tuple[bytes, str], float] = {}
        for prefix, key, score in nearest:
            best.setdefault((prefix, key), score)  # the first is the item's best (descending)
        params: list[Any] = []
        generation = _generation(step, params)
        params.extend([[p for p, _ in best], [k for _, k in best]])
        where = _where(step, ctx, params)
        rows = await conn.fetch(
            sql(
                f"SELECT {generation}, r.* FROM (SELECT 1) AS one LEFT JOIN LATERAL ("
                f"SELECT {_COLUMNS} FROM unnest(?::bytea[], ?::text[]) AS t(p, k) "
                f"JOIN {ITEMS} i ON i.prefix = t.p AND i.key = t.k WHERE {where}) AS r ON TRUE"
            ),
            *params,
        )
        if rows[0][0] != entry.generation:
            entry = None  # another writer changed the vectors since they were read
            continue
        kept = sorted(
            ((*row[1:], best[(row[1], row[2])]) for row in rows if row[1] is not None),
            key=lambda r: (-r[6], -int(r[4]), r[0], r[1]),
        )
        if len(kept) < wanted or not kept[wanted - 1][6] > nearest[-1][2]:
            return None
        return kept[step.offset : wanted]
    return None


async def _load_vectors(conn: Any, step: SearchStep, dims: int) -> Any:
    """Every vector under the search's prefix with its generation, one snapshot; ``None``
    when there are none."""
    params: list[Any] = []
    generation = _generation(step, params)
    vector_prefix = prefix_condition("v.prefix", step.namespace_prefix, params)
    params.append(dims * 4)
    rows = await conn.fetch(
        sql(
            f"SELECT {generation}, v.prefix, v.key, v.embedding FROM {VECTORS} v "
            f"WHERE {vector_prefix} AND length(v.embedding) = ?"
        ),
        *params,
    )
    if not rows:
        return None
    return decode(int(rows[0][0]), dims, [(r[1], r[2], r[3]) for r in rows])


async def _refresh(conn: Any, keys: Sequence[tuple[bytes, str]], ctx: Context) -> None:
    if not keys:
        return
    await conn.execute(
        sql(
            f"UPDATE {ITEMS} SET expires_at = {_EXPIRY} FROM unnest(?::bytea[], ?::text[]) AS t(p, k) "
            f"WHERE {ITEMS}.prefix = t.p AND {ITEMS}.key = t.k AND {ITEMS}.ttl_minutes IS NOT NULL"
        ),
        ctx.now, [p for p, _ in keys], [k for _, k in keys],
    )  # fmt: skip


async def _list(conn: Any, step: ListStep, ctx: Context) -> list[tuple[str, ...]]:
    rows = await conn.fetch(sql(f"SELECT DISTINCT i.prefix FROM {ITEMS} i WHERE {_LIVE}"), ctx.now)
    return list_namespaces((decode_namespace(r[0]) for r in rows), step.op)
