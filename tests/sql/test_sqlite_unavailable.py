"""Every sqlite backend reports a file it cannot use right now the same way: another
connection holds the write lock past ``busy_timeout`` -> `BackendUnavailableError`
(nothing written, the sqlite error as ``__cause__``), and the same objects work once
the lock is gone."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from runstore.errors import BackendUnavailableError
from runstore.options import BackendOptions
from runstore.plugins.sqlite.events import SqliteEventStore
from runstore.plugins.sqlite.runs import SqliteRunStore
from runstore.plugins.sqlite.saver import SqliteSaver
from runstore.settings import Settings
from runstore.urls import BackendURL


def _unavailable(info: pytest.ExceptionInfo[BackendUnavailableError], backend: str) -> None:
    error = info.value
    assert error.backend == backend, str(error)
    assert error.write_may_have_happened is False, str(error)
    assert isinstance(error.__cause__, sqlite3.OperationalError), repr(error.__cause__)


async def test_a_locked_file_is_unavailable_on_every_sqlite_backend(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    url = BackendURL.for_file("sqlite", path)
    settings = Settings().merged({"sqlite": {"busy_timeout_ms": 50}})
    async with BackendOptions.scope(settings) as options:
        saver = await SqliteSaver.open(url, options)
        events = await SqliteEventStore.open(url, options)
        runs = await SqliteRunStore.open(url, options)
        config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        checkpoint = empty_checkpoint()

        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # another writer of the file, holding its lock
        try:
            with pytest.raises(BackendUnavailableError) as info:
                await saver.aput(config, checkpoint, {}, {})
            _unavailable(info, "sqlite saver")
            with pytest.raises(BackendUnavailableError) as info:
                await asyncio.to_thread(saver.put, config, checkpoint, {}, {})
            _unavailable(info, "sqlite saver")
            with pytest.raises(BackendUnavailableError) as info:
                await events.put(thread_id="t", run_id="r", event_type="e", category="c", user_id=None)
            _unavailable(info, "sqlite event store")
            with pytest.raises(BackendUnavailableError) as info:
                await runs.create("t", run_id="a")
            _unavailable(info, "sqlite run store")
        finally:
            holder.execute("ROLLBACK")
            holder.close()

        assert await saver.aget_tuple(config) is None, "the refused put wrote nothing"
        await saver.aput(config, checkpoint, {}, {})
        assert await saver.aget_tuple(config) is not None
        await events.put(thread_id="t", run_id="r", event_type="e", category="c", user_id=None)
        assert await events.count_messages("t", user_id=None) == 0
        assert len(await events.list_events("t", "r", user_id=None)) == 1, "the refused put wrote nothing"
        await runs.create("t", run_id="a")
        assert [r["run_id"] for r in await runs.list_by_thread("t")] == ["a"]
