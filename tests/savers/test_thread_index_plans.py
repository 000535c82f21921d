"""PostgreSQL answers list_threads from indexes: on 100,000 thread records a metadata-filtered
page (a rare filter from the GIN index, a common one by the probe of the newest records), a
status page, the newest page and a cursor page read at most 2,000 records, never every
record (EXPLAIN ANALYZE of the saver's own statements)."""

from __future__ import annotations

from typing import Any

import asyncpg
import orjson

from runstore.checkpoint.threads import THREADS, encode_cursor, thread_query
from runstore.options import BackendOptions
from runstore.plugins.postgres import sql
from runstore.plugins.postgres.saver import PostgresSaver
from runstore.urls import BackendURL

THREAD_COUNT = 100_000
#: Threads a statement may read at most: its page plus what the index hands over.
BOUND = 2_000


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    out = [plan]
    for child in plan.get("Plans", []):
        out.extend(_nodes(child))
    return out


async def _explain(conn: asyncpg.Connection, statement: str, args: list[Any]) -> list[dict[str, Any]]:
    [row] = await conn.fetch(f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", *args)
    return _nodes(orjson.loads(row[0])[0]["Plan"])


def _flat(statement: tuple[str, list[Any]]) -> list[Any]:
    return [statement[0], *statement[1]]


def _rows_read(nodes: list[dict[str, Any]]) -> int:
    """Rows the scans of the record table produced (before any sort or limit)."""
    return sum(
        int(n.get("Actual Rows", 0)) * int(n.get("Actual Loops", 1))
        for n in nodes
        if n.get("Relation Name") == THREADS or "Index Name" in n
    )


async def test_thread_pages_and_sweep_claims_use_indexes(postgres_url: str) -> None:
    url = BackendURL.parse(postgres_url)
    async with BackendOptions.scope() as options:
        await PostgresSaver.open(url, options)  # creates the tables in the test's schema
    conn = await asyncpg.connect(
        url.without_query("schema").render(hide_password=False),
        server_settings={"search_path": url.query["schema"]},
    )
    try:
        await conn.execute(
            f"""INSERT INTO {THREADS} (thread_id, created_at, updated_at, touched_at,
                latest_checkpoint_id, metadata, status, checkpoints, writes, bytes, oldest_at,
                swept_at)
            SELECT 't' || lpad(i::text, 6, '0'), i, i, i, 'c' || i,
                   jsonb_build_object('user', 'u' || (i % 1000), 'tier', i % 10, 'n', i),
                   CASE WHEN i % 97 = 0 THEN 'interrupted' ELSE 'idle' END, 3, 0, 100, i, i
            FROM generate_series(1, {THREAD_COUNT}) AS i"""
        )
        await conn.execute(f"ANALYZE {THREADS}")
        # The cursor after the first page of half the threads: deep in the table.
        middle = encode_cursor("updated_at", (THREAD_COUNT // 2, f"t{THREAD_COUNT // 2:06d}"))
        pages = {
            "metadata filter": thread_query(filter={"user": "u17"}, limit=50),
            "status": thread_query(status="interrupted", limit=50),
            "newest": thread_query(limit=50),
            "cursor": thread_query(limit=50, cursor=middle),
            "filter and cursor": thread_query(filter={"user": "u17"}, limit=50, cursor=middle),
        }
        statements = {what: sql.list_threads_sql(query) for what, query in pages.items()}
        # A filter many records match: the probe (newest records in index order) fills the page.
        common = thread_query(filter={"tier": 3}, limit=50)
        statements["common filter, probe"] = sql.list_threads_sql(common, probe=True)
        assert len(await conn.fetch(*_flat(statements["common filter, probe"]))) == 50
        for what, (statement, args) in statements.items():
            nodes = await _explain(conn, statement, args)
            kinds = [n["Node Type"] for n in nodes]
            assert "Seq Scan" not in kinds, f"{what}: {kinds} scans every record"
            assert _rows_read(nodes) <= BOUND, f"{what}: read {_rows_read(nodes)} records ({kinds})"
    finally:
        await conn.close()

