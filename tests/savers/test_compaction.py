"""Compaction gives deleted space back: sqlite files start in incremental auto-vacuum mode
and shrink after a deletion; an older file is converted by its first compaction;
PostgreSQL runs VACUUM on the saver's tables and reports their sizes."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from runstore.conformance.savers_model import config_for, make_checkpoint, new_checkpoint_id
from runstore.options import BackendOptions
from runstore.plugins.postgres.saver import PostgresSaver
from runstore.plugins.sqlite.saver import SqliteSaver
from runstore.urls import BackendURL


async def _fill(saver: Any, threads: int = 4, turns: int = 20) -> None:
    for t in range(threads):
        parent = None
        for i in range(turns):
            cid = new_checkpoint_id()
            version = f"{i + 1:032}.0"
            await saver.aput(
                config_for(f"t{t}", parent), make_checkpoint(cid, {"a": "x" * 5000}, {"a": version}),
                {}, {"a": version},
            )  # fmt: skip
            parent = cid


async def test_sqlite_gives_deleted_space_back(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    async with BackendOptions.scope() as options:
        saver = await SqliteSaver.open(BackendURL.for_file("sqlite", path), options)
        assert sqlite3.connect(path).execute("PRAGMA auto_vacuum").fetchone()[0] == 2
        await _fill(saver)
        removed = await saver.apurge_threads(["t0", "t1", "t2"])
        assert (removed.threads, removed.checkpoints) == (3, 60)
        result = await saver.acompact()
        assert result.after < result.before and result.reclaimed >= removed.bytes // 2


async def test_sqlite_file_from_before_is_converted_by_its_first_compaction(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    sqlite3.connect(path).execute("CREATE TABLE placeholder (x)").connection.close()
    async with BackendOptions.scope() as options:
        saver = await SqliteSaver.open(BackendURL.for_file("sqlite", path), options)
        assert sqlite3.connect(path).execute("PRAGMA auto_vacuum").fetchone()[0] == 0
        await _fill(saver)
        await saver.apurge_threads(["t0", "t1"])
        result = await saver.acompact()
        assert result.after < result.before
        assert sqlite3.connect(path).execute("PRAGMA auto_vacuum").fetchone()[0] == 2


async def test_postgres_compaction_vacuums_the_saver_tables(postgres_url: str) -> None:
    async with BackendOptions.scope() as options:
        saver = await PostgresSaver.open(postgres_url, options)
        await _fill(saver)
        removed = await saver.apurge_threads(["t0", "t1"])
        assert removed.checkpoints == 40
        result = await saver.acompact()
        assert result.before > 0 and result.after > 0 and result.reclaimed >= 0
        full = await saver.acompact(full=True)
        assert full.after < full.before, "VACUUM FULL returns the deleted rows' space"
