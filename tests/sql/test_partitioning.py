"""The hash-partitioning DDL of docs/scaling.md, run as the page shows it on a real
PostgreSQL schema: the partitioned tables keep runstore's columns and indexes, runstore
opens them without DDL, and saver and event-store calls work with rows in several
partitions."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from runstore.plugins.postgres.events import PostgresEventStore
from runstore.plugins.postgres.saver import PostgresSaver
from runstore.urls import BackendURL
from tests.checkpoint.graphs import chat_turns

pytestmark = pytest.mark.postgres

DOC = Path(__file__).resolve().parents[2] / "docs" / "scaling.md"
PARTITIONED = ("runstore_events", "runstore_checkpoint_blobs")
THREADS = [f"thread-{i}" for i in range(12)]


def partitioning_ddl() -> str:
    """The one SQL block of docs/scaling.md that partitions the tables."""
    blocks = re.findall(r"```sql\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    ddl = [b for b in blocks if "PARTITION BY HASH (thread_id)" in b]
    assert len(ddl) == 1, "docs/scaling.md must hold exactly one partitioning DDL block"
    return ddl[0]


async def table_shape(conn: asyncpg.Connection, schema: str) -> dict[str, Any]:
    """Columns (type, collation, NOT NULL, default, compression) and indexes of the tables."""
    columns = await conn.fetch(
        """SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod) AS type,
                  a.attcollation, a.attnotnull, pg_get_expr(d.adbin, d.adrelid) AS dflt,
                  a.attcompression
           FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
           JOIN pg_namespace n ON n.oid = c.relnamespace
           LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
           WHERE n.nspname = $1 AND c.relname = ANY($2::text[]) AND a.attnum > 0
             AND NOT a.attisdropped
           ORDER BY c.relname, a.attnum""", schema, list(PARTITIONED))
    indexes = await conn.fetch(
        "SELECT tablename, indexname, replace(indexdef, ' ON ONLY ', ' ON ') AS def"
        " FROM pg_indexes WHERE schemaname = $1 AND tablename = ANY($2::text[])"
        " ORDER BY tablename, indexname", schema, list(PARTITIONED))
    return {"columns": [tuple(r) for r in columns], "indexes": [tuple(r) for r in indexes]}


async def partitions_holding(conn: asyncpg.Connection, table: str) -> set[str]:
    rows = await conn.fetch(f"SELECT DISTINCT tableoid::regclass::text AS p FROM {table}")
    return {r["p"] for r in rows}


async def test_runstore_runs_on_hash_partitioned_tables(postgres_url: str) -> None:
    schema = BackendURL.parse(postgres_url).option("schema")
    assert schema
    # runstore creates its plain tables first (a DBA would apply `runstore schema-sql`).
    async with PostgresSaver.from_conn_string(postgres_url) as saver:
        await saver.setup()
        assert await chat_turns(saver, "before", ["hi"]) == ["hi", "you said: hi"]
    async with PostgresEventStore.from_conn_string(postgres_url) as store:
        await store.setup()
        await store.put(thread_id="before", run_id="r0", event_type="note", category="message",
                        content="kept", user_id=None)

    conn = await asyncpg.connect(BackendURL.parse(postgres_url).without_query("schema")
                                 .render(hide_password=False))
    try:
        await conn.execute(f'SET search_path TO "{schema}"')
        plain = await table_shape(conn, schema)
        await conn.execute(partitioning_ddl())
        kinds = await conn.fetch(
            "SELECT c.relname, c.relkind::text, (SELECT count(*) FROM pg_inherits i"
            " WHERE i.inhparent = c.oid) AS parts FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = $1 AND c.relname = ANY($2::text[])", schema, list(PARTITIONED))
        assert {(r["relname"], r["relkind"], r["parts"]) for r in kinds} == {
            (t, "p", 16) for t in PARTITIONED}
        # The same columns and indexes, under the same names: runstore's SQL and any later
        # migration see the schema they expect.
        assert await table_shape(conn, schema) == plain

        async with PostgresSaver.from_conn_string(postgres_url) as saver:
            assert await saver.schema_sql() == ""  # current: opening runs no DDL
            await saver.setup()
            # Rows written before the conversion were moved, not lost.
            assert await chat_turns(saver, "before", ["again"]) == [
                "hi", "you said: hi", "again", "you said: again"]
            for thread in THREADS:
                assert await chat_turns(saver, thread, ["one"]) == ["one", "you said: one"]
                assert await chat_turns(saver, thread, ["two"]) == [
                    "one", "you said: one", "two", "you said: two"]
            cfg = {"configurable": {"thread_id": THREADS[0], "checkpoint_ns": ""}}
            head = await saver.aget_tuple(cfg)
            assert head is not None
            history = [c async for c in saver.alist(cfg)]
            assert history[0].config == head.config and len(history) >= 4
            await saver.acopy_thread(THREADS[0], "copied")
            assert len([c async for c in saver.alist(
                {"configurable": {"thread_id": "copied"}})]) == len(history)
            await saver.adelete_thread(THREADS[1])
            assert await saver.aget_tuple({"configurable": {"thread_id": THREADS[1]}}) is None
            assert await saver.aget_tuple({"configurable": {"thread_id": THREADS[2]}}) is not None
            for table in ("runstore_checkpoints", "runstore_checkpoint_writes"):
                assert await conn.fetchval(
                    f"SELECT count(*) FROM {table} WHERE thread_id = $1", THREADS[1]) == 0
            delta = await chat_turns(saver, "delta", [f"d{i}" for i in range(7)], "delta", 3)
            assert delta == [t for i in range(7) for t in (f"d{i}", f"you said: d{i}")]
        async with PostgresSaver.from_conn_string(postgres_url) as saver:
            # Reopened: the delta thread is rebuilt from its snapshot and writes.
            assert await chat_turns(saver, "delta", ["d7"], "delta", 3) == [*delta, "d7", "you said: d7"]
            compaction = await saver.acompact()
            blobs = await conn.fetchval(
                "SELECT sum(pg_total_relation_size(relid))::bigint FROM"
                " pg_partition_tree('runstore_checkpoint_blobs')")
            plain = await conn.fetchval(
                "SELECT pg_total_relation_size('runstore_checkpoints')"
                " + pg_total_relation_size('runstore_checkpoint_writes')"
                " + pg_total_relation_size('runstore_threads')")
            # The reported size counts the partitions (the parent has no storage).
            assert compaction.after >= 0.9 * (blobs + plain) and blobs > 0.1 * (blobs + plain)

        async with PostgresEventStore.from_conn_string(postgres_url) as store:
            assert await store.schema_sql() == ""
            await store.setup()
            batch = [{"thread_id": t, "run_id": "r1", "event_type": f"e{i}",
                      "category": "message" if i % 2 else "trace", "content": f"{t}:{i}"}
                     for t in THREADS for i in range(5)]
            records = await store.put_batch(batch, user_id=None)
            assert [r["seq"] for r in records[:5]] == [1, 2, 3, 4, 5]
            listed = await store.list_events(THREADS[3], "r1", user_id=None)
            assert [e["content"] for e in listed] == [f"{THREADS[3]}:{i}" for i in range(5)]
            assert [m["seq"] for m in await store.list_messages(THREADS[3], user_id=None)] == [2, 4]
            first, created = await store.put_if_absent(
                thread_id=THREADS[4], run_id="r1", event_type="done", category="lifecycle",
                user_id=None)
            again, created_again = await store.put_if_absent(
                thread_id=THREADS[4], run_id="r1", event_type="done", category="lifecycle",
                user_id=None)
            assert (created, created_again, again["seq"]) == (True, False, first["seq"]) == (
                True, False, 6)
            assert await store.delete_by_thread(THREADS[5], user_id=None) == 5
            assert await store.list_events(THREADS[5], "r1", user_id=None) == []
            old = await store.list_events("before", "r0", user_id=None)
            assert [e["content"] for e in old] == ["kept"]

        for table in PARTITIONED:
            held = await partitions_holding(conn, table)
            assert len(held) > 1, f"{table}: every row in {held}"
            assert all(re.fullmatch(rf"{table}_p\d+", p) for p in held)
        # A statement on one thread reads one partition (pruning on the hash of thread_id).
        plan = "\n".join(r[0] for r in await conn.fetch(
            "EXPLAIN SELECT * FROM runstore_events WHERE thread_id = 'thread-3' ORDER BY seq"))
        assert len(set(re.findall(r"runstore_events_p\d+", plan))) == 1, plan
    finally:
        await conn.close()
