"""The thread index on existing databases: a file or schema written before the index
existed is back-filled when a current saver opens it (the upgrade from the previous
schema version), and the record then follows new writes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import asyncpg
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.serde.types import INTERRUPT

from runstore.checkpoint import codec
from runstore.checkpoint.codec import BLOBS, CHECKPOINTS, WRITES
from runstore.conformance.savers_model import config_for, make_checkpoint
from runstore.options import BackendOptions
from runstore.plugins.postgres.saver import COMPONENT, PostgresSaver
from runstore.plugins.postgres.saver import SCHEMA_MIGRATIONS as PG_MIGRATIONS
from runstore.plugins.sqlite.saver import SCHEMA_COMPONENT, SqliteSaver
from runstore.plugins.sqlite.saver import SCHEMA_MIGRATIONS as SQLITE_MIGRATIONS
from runstore.sql.migrations import ensure_schema
from runstore.urls import BackendURL

serde = JsonPlusSerializer()

#: (thread, namespace, checkpoint id, parent, metadata, value) written at the old version.
OLD_ROWS = [
    ("t-a", "", "01", None, {"step": 0, "title": "first"}, [1]),
    ("t-a", "", "02", "01", {"step": 1, "title": "second"}, [1, 2]),
    ("t-a", "child:1", "03", None, {"step": 0}, [9]),
    ("t-b", "", "05", None, {"step": 0, "title": "other"}, [5]),
]
#: (thread, namespace, checkpoint id, task, channel, value) pending writes.
OLD_WRITES = [
    ("t-a", "", "02", "task", "a", 3),
    ("t-a", "", "02", "task", INTERRUPT, "ask"),
    ("t-a", "", "01", "task", "a", 2),
]


def _encoded() -> tuple[list[codec.CheckpointRow], list[codec.BlobRow], list[codec.WriteRow]]:
    checkpoints, blobs, writes = [], [], []
    for thread, ns, cid, parent, metadata, value in OLD_ROWS:
        version = f"{int(cid):032}.5"
        encoded = codec.encode_checkpoint(
            serde,
            config_for(thread, parent, ns),
            make_checkpoint(cid, {"a": value}, {"a": version}),
            metadata,
            {"a": version},
        )
        checkpoints.append(encoded.row)
        blobs.extend(encoded.blobs)
    for thread, ns, cid, task, channel, value in OLD_WRITES:
        encoded_writes = codec.encode_writes(
            serde, config_for(thread, cid, ns), [(channel, value)], task
        )
        writes.extend([*encoded_writes.first_wins, *encoded_writes.last_wins])
    return checkpoints, blobs, writes


def _before_the_index(migrations: list[Any]) -> int:
    """The schema version just before the one that added the thread index."""
    return next(m.version for m in migrations if "thread index" in m.description) - 1


async def _check_backfilled(saver: Any, before: datetime, after: datetime) -> None:
    info = await saver.aget_thread("t-a")
    assert info is not None
    assert (info.checkpoints, info.writes) == (3, 3)
    assert info.latest_checkpoint_id == "02"
    assert info.metadata["title"] == "second"
    assert info.status == "interrupted"
    assert info.bytes > 0
    assert before <= info.created_at == info.updated_at <= after, (
        "times unknown before the index are the migration's"
    )
    other = await saver.aget_thread("t-b")
    assert other is not None and other.status == "idle" and other.checkpoints == 1
    page = await saver.alist_threads(filter={"title": "second"})
    assert [t.thread_id for t in page.threads] == ["t-a"]
    head = await saver.aget_tuple(config_for("t-a"))
    assert head is not None and head.checkpoint["channel_values"] == {"a": [1, 2]}
    # The record follows new writes from here on.
    await saver.aput(config_for("t-a", "02"), make_checkpoint("04", {}, {}), {"title": "new"}, {})
    info = await saver.aget_thread("t-a")
    assert info is not None and info.checkpoints == 4 and info.status == "idle"
    assert info.latest_checkpoint_id == "04" and info.updated_at > info.created_at


async def test_sqlite_file_from_the_previous_version_is_backfilled(sqlite_url: str) -> None:
    from runstore.plugins.sqlite.engine import shared_engine

    url = BackendURL.parse(sqlite_url)
    previous = _before_the_index(SQLITE_MIGRATIONS)
    async with BackendOptions.scope() as options:
        engine = await shared_engine(url, options)
        assert await ensure_schema(engine, SCHEMA_COMPONENT, SQLITE_MIGRATIONS[:previous]) == previous
        checkpoints, blobs, writes = _encoded()
        async with engine.begin() as conn:
            for table, fields, rows in (
                (CHECKPOINTS, codec.CheckpointRow._fields, checkpoints),
                (BLOBS, codec.BlobRow._fields, blobs),
                (WRITES, codec.WriteRow._fields, writes),
            ):
                statement = (
                    f"INSERT INTO {table} ({', '.join(fields)}) "
                    f"VALUES ({', '.join('?' * len(fields))})"
                )
                for row in rows:
                    await conn.exec_driver_sql(statement, tuple(row))
    before = datetime.now(UTC)
    async with BackendOptions.scope() as options:
        saver = await SqliteSaver.open(url, options)
        await _check_backfilled(saver, before, datetime.now(UTC))


async def test_postgres_schema_from_the_previous_version_is_backfilled(postgres_url: str) -> None:
    from runstore.plugins.postgres.engine import shared_engine

    url = BackendURL.parse(postgres_url)
    previous = _before_the_index(PG_MIGRATIONS)
    async with BackendOptions.scope() as options:
        engine = await shared_engine(url, options)
        assert await ensure_schema(engine, COMPONENT, PG_MIGRATIONS[:previous]) == previous
    checkpoints, blobs, writes = _encoded()
    schema = url.query["schema"]
    conn = await asyncpg.connect(
        url.without_query("schema").render(hide_password=False),
        server_settings={"search_path": schema},
    )
    try:
        await conn.executemany(
            f"INSERT INTO {CHECKPOINTS} ({', '.join(codec.CheckpointRow._fields)}) VALUES "
            "($1, $2, $3, $4, $5, $6, $7, $8::jsonb, $9::jsonb, $10::jsonb)",
            [tuple(r) for r in checkpoints],
        )
        await conn.executemany(
            f"INSERT INTO {BLOBS} VALUES ($1, $2, $3, $4, $5, $6)", [tuple(r) for r in blobs]
        )
        await conn.executemany(
            f"INSERT INTO {WRITES} ({', '.join(codec.WriteRow._fields)}) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            [tuple(r) for r in writes],
        )
    finally:
        await conn.close()
    before = datetime.now(UTC)
    async with BackendOptions.scope() as options:
        saver = await PostgresSaver.open(url, options)
        await _check_backfilled(saver, before, datetime.now(UTC))
