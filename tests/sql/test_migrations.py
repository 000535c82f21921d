"""Versioned schema: idempotent ensure_schema, upgrade of an older events schema, no downgrade."""

from __future__ import annotations

import orjson
import pytest

from runstore.errors import SchemaVersionError
from runstore.options import BackendOptions
from runstore.plugins.postgres.events import POSTGRES_MIGRATIONS
from runstore.plugins.sqlite.events import SQLITE_MIGRATIONS
from runstore.sql.migrations import Migration, ensure_schema
from runstore.urls import BackendURL

from .conftest import open_engine, store_class


async def test_ensure_schema_is_idempotent_and_refuses_downgrades(db_url: str) -> None:
    migrations = [
        Migration(1, ["CREATE TABLE m_one (x INTEGER)"]),
        Migration(2, ["CREATE TABLE m_two (x INTEGER)"]),
    ]
    async with BackendOptions.scope() as options:
        engine = await open_engine(db_url, options)
        assert await ensure_schema(engine, "c", migrations[:1]) == 1
        assert await ensure_schema(engine, "c", migrations) == 2
        async with engine.connect() as conn:
            assert await ensure_schema(conn, "c", migrations) == 2
        with pytest.raises(SchemaVersionError, match="upgrade runstore"):
            await ensure_schema(engine, "c", migrations[:1])
        with pytest.raises(ValueError, match="numbered"):
            await ensure_schema(engine, "c", [Migration(2, [])])


async def test_failed_migration_leaves_the_old_version(db_url: str) -> None:
    good = Migration(1, ["CREATE TABLE f_one (x INTEGER)"])
    bad = Migration(2, ["CREATE TABLE f_two (x INTEGER)", "CREATE TABLE f_one (x INTEGER)"])
    async with BackendOptions.scope() as options:
        engine = await open_engine(db_url, options)
        await ensure_schema(engine, "f", [good])
        with pytest.raises(Exception, match="f_one"):
            await ensure_schema(engine, "f", [good, bad])
        # Transactional DDL: f_two was rolled back with the version bump, so a fixed
        # migration 2 applies cleanly.
        assert (
            await ensure_schema(
                engine, "f", [good, Migration(2, ["CREATE TABLE f_two (x INTEGER)"])]
            )
            == 2
        )


async def test_upgrade_from_schema_version_1_keeps_rows_readable(db_url: str) -> None:
    url = BackendURL.parse(db_url)
    async with BackendOptions.scope() as options:
        engine = await open_engine(url, options)
        postgres = engine.dialect.name == "postgresql"
        v1 = (POSTGRES_MIGRATIONS if postgres else SQLITE_MIGRATIONS)[:1]
        assert await ensure_schema(engine, "events", v1) == 1
        rows = [
            (
                "t",
                1,
                "r",
                "llm.ai.response",
                "message",
                {"type": "ai", "id": "a"},
                {"task_id": "k"},
            ),
            (
                "t",
                2,
                "r",
                "llm.ai.response",
                "message",
                {"type": "ai", "id": "b"},
                {"caller": "middleware:x"},
            ),
            ("t", 3, "r2", "ai_message", "message", {"type": "ai", "id": "c"}, {"task_id": 7}),
        ]
        insert = (
            "INSERT INTO runstore_events (thread_id, seq, run_id, event_type, category, content, "
            "content_json, metadata, created_at, user_id) VALUES "
            + (
                "($1, $2, $3, $4, $5, $6, TRUE, $7, '2026-01-01T00:00:00+00:00', NULL)"
                if postgres
                else "(?, ?, ?, ?, ?, ?, 1, ?, '2026-01-01T00:00:00+00:00', NULL)"
            )
        )
        async with engine.begin() as conn:
            for thread, seq, run, etype, cat, content, meta in rows:
                await conn.exec_driver_sql(
                    insert,
                    (
                        thread,
                        seq,
                        run,
                        etype,
                        cat,
                        orjson.dumps(content).decode(),
                        orjson.dumps(meta).decode(),
                    ),
                )
        store = await store_class(db_url).open(url, options)
        async with engine.connect() as conn:
            version = (
                await conn.exec_driver_sql(
                    "SELECT version FROM runstore_schema_versions WHERE component = 'events'"
                )
            ).scalar()
        assert version == len(SQLITE_MIGRATIONS) == len(POSTGRES_MIGRATIONS)
        assert [r["seq"] for r in await store.list_messages("t", user_id=None)] == [1, 2, 3]
        # The columns added by version 2 were backfilled from the stored metadata.
        assert [r["seq"] for r in await store.list_events("t", "r", task_id="k", user_id=None)] == [
            1
        ]
        assert await store.list_events("t", "r2", task_id="7", user_id=None) == []
        assert await store.get_last_visible_ai_seq_by_run("t", user_id=None) == {"r": 1, "r2": 3}
        assert (
            await store.put(
                thread_id="t", run_id="r", event_type="e", category="message", user_id=None
            )
        )["seq"] == 4
