"""PostgreSQL answers list_threads from indexes: on 100,000 thread records a metadata-filtered
page (a rare filter from the GIN index, a common one by the probe of the newest records), a
status page, the newest page and a cursor page read at most 2,000 records, never every
record (EXPLAIN ANALYZE of the saver's own statements). And it keeps the record cheap to
write: a pending write updates it in place."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import orjson

from runstore.checkpoint.threads import THREADS, encode_cursor, thread_query
from runstore.conformance.savers_model import config_for, make_checkpoint, new_checkpoint_id
from runstore.options import BackendOptions
from runstore.plugins.postgres import thread_sql
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
        statements = {what: thread_sql.list_threads_sql(query) for what, query in pages.items()}
        # A filter many records match: the probe (newest records in index order) fills the page.
        common = thread_query(filter={"tier": 3}, limit=50)
        statements["common filter, probe"] = thread_sql.list_threads_sql(common, probe=True)
        assert len(await conn.fetch(*_flat(statements["common filter, probe"]))) == 50
        for what, (statement, args) in statements.items():
            nodes = await _explain(conn, statement, args)
            kinds = [n["Node Type"] for n in nodes]
            assert "Seq Scan" not in kinds, f"{what}: {kinds} scans every record"
            assert _rows_read(nodes) <= BOUND, f"{what}: read {_rows_read(nodes)} records ({kinds})"
    finally:
        await conn.close()



async def test_pending_writes_update_the_thread_record_in_place(postgres_url: str) -> None:
    """A pending write moves only the record's counters and ``touched_at``: no index covers
    them and the table's pages keep room, so PostgreSQL updates the record in place (a HOT
    update: no new entry in any of its indexes)."""
    url = BackendURL.parse(postgres_url)
    writes = 20
    async with BackendOptions.scope() as options:
        saver = await PostgresSaver.open(url, options)
        checkpoint_id = new_checkpoint_id()
        config = await saver.aput(
            config_for("t1"), make_checkpoint(checkpoint_id, {"a": "x"}, {"a": "1.0"}),
            {"source": "input", "step": -1}, {"a": "1.0"},
        )  # fmt: skip
        for i in range(writes):
            await saver.aput_writes(config, [("a", f"w{i}")], f"task-{i}", "")
    # Closing the scope closed the saver's connections; a server process flushes its
    # table statistics when it exits.
    schema = url.query["schema"]
    conn = await asyncpg.connect(url.without_query("schema").render(hide_password=False))
    try:
        indexed = {
            row["attname"]
            for row in await conn.fetch(
                "SELECT a.attname FROM pg_index i JOIN pg_attribute a"
                " ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)"
                " WHERE i.indrelid = $1::regclass",
                f'"{schema}".{THREADS}',
            )
        }
        assert not indexed & {"touched_at", "writes", "bytes", "fence"}, indexed
        options_ = await conn.fetchval(
            "SELECT reloptions FROM pg_class WHERE oid = $1::regclass", f'"{schema}".{THREADS}'
        )
        assert "fillfactor=70" in (options_ or []), options_
        hot = 0
        for _ in range(50):
            await conn.execute("SELECT pg_stat_clear_snapshot()")
            hot = await conn.fetchval(
                "SELECT n_tup_hot_upd FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2",
                schema, THREADS,
            )  # fmt: skip
            if hot >= writes:
                break
            await asyncio.sleep(0.1)
        assert hot >= writes, f"{hot} of {writes} pending-write updates were HOT"
    finally:
        await conn.close()
