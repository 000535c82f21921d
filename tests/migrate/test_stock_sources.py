"""Teams on LangGraph's stock savers move in with one command: AsyncSqliteSaver and
AsyncPostgresSaver through their own classes (read-only, by URL), InMemorySaver through
the API; LangGraph answers the same on runstore afterwards, in both modes."""

from __future__ import annotations

import hashlib
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.store.postgres.aio import AsyncPostgresStore
from langgraph.store.sqlite.aio import AsyncSqliteStore

from runstore.errors import InvalidURLError
from runstore.migrate.endpoints import Endpoint, _open_stock, open_endpoint
from runstore.migrate.engine import MigrateOptions, migrate
from runstore.migrate.sources import LiveSource
from runstore.migrate.transfer import run_migrate
from runstore.urls import BackendURL

from .data import graph_view, write_graph_threads, write_namespace_and_writes


async def assert_answers_alike(stock: Any, ours: Any) -> None:
    for thread_id, mode in (("thread-full", "full"), ("thread-delta", "delta")):
        assert await graph_view(ours, thread_id, mode) == await graph_view(stock, thread_id, mode)
    config = {"configurable": {"thread_id": "thread-ns", "checkpoint_ns": "child:1"}}
    theirs, mine = await stock.aget_tuple(config), await ours.aget_tuple(config)
    assert mine.checkpoint["channel_values"] == theirs.checkpoint["channel_values"]
    assert sorted(mine.pending_writes) == sorted(theirs.pending_writes)


KINDS = ["saver", "store"]


async def write_store_items(store: Any) -> None:
    """Items in two namespaces of LangGraph's stock store (which shares the saver's database)."""
    await store.aput(("users", "alice"), "prefs", {"theme": "dark", "nested": {"n": [1, 2]}})
    await store.aput(("users", "alice"), "name", {"v": "Alice"})
    await store.aput(("users", "alice", "notes"), "n1", {"text": "hello"})


async def assert_store_alike(stock: Any, ours: Any) -> None:
    for namespace, key in ((("users", "alice"), "prefs"), (("users", "alice"), "name"), (("users", "alice", "notes"), "n1")):
        theirs, mine = await stock.aget(namespace, key), await ours.aget(namespace, key)
        times = [t if t.tzinfo is not None else t.replace(tzinfo=UTC) for t in (theirs.created_at, theirs.updated_at)]
        assert (mine.value, [mine.created_at, mine.updated_at]) == (theirs.value, times)
    assert await ours.alist_namespaces() == [("users", "alice"), ("users", "alice", "notes")]


async def test_from_async_sqlite_saver_by_url_read_only(tmp_path: Path) -> None:
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    path = tmp_path / "stock.db"
    async with AsyncSqliteSaver.from_conn_string(str(path)) as stock:
        await write_graph_threads(stock)
        await write_namespace_and_writes(stock)
    async with AsyncSqliteStore.from_conn_string(str(path)) as store:
        await store.setup()
        await write_store_items(store)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    destination = BackendURL.for_file("sqlite", tmp_path / "ours.db").render()
    report = await run_migrate(f"langgraph+sqlite:///{path}", destination,
                               MigrateOptions(kinds=(), destination_mode="delta"), None)  # fmt: skip
    assert report.kinds == ["saver", "store"] and report.counts["saver"].threads == 3
    assert (report.counts["store"].threads, report.counts["store"].copied) == (2, 3)
    assert not any(report.mismatches.values())
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before  # the source is only read
    async with AsyncSqliteSaver.from_conn_string(str(path)) as stock, open_endpoint(destination, KINDS) as ours:
        await assert_answers_alike(stock, ours.saver)
    async with AsyncSqliteStore.from_conn_string(str(path)) as store, open_endpoint(destination, KINDS) as ours:
        await assert_store_alike(store, ours.store)


async def test_from_async_postgres_saver_by_url(postgres_url: str, tmp_path: Path) -> None:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg import AsyncConnection
    from psycopg.rows import dict_row

    parsed = BackendURL.parse(postgres_url)
    schema = parsed.option("schema")
    conninfo = parsed.without_query("schema").render(hide_password=False)
    async with await AsyncConnection.connect(conninfo, autocommit=True, prepare_threshold=0, row_factory=dict_row,
                                             options=f"-c search_path={schema}") as conn:  # fmt: skip
        stock = AsyncPostgresSaver(conn=conn)
        await stock.setup()
        await write_graph_threads(stock)
        await write_namespace_and_writes(stock)
        store = AsyncPostgresStore(conn)
        await store.setup()
        await write_store_items(store)
        destination = BackendURL.for_file("sqlite", tmp_path / "ours.db").render()
        report = await run_migrate("langgraph+" + postgres_url, destination,
                                   MigrateOptions(kinds=(), destination_mode="delta"), None)  # fmt: skip
        assert report.counts["saver"].threads == 3 and not any(report.mismatches.values())
        assert report.counts["store"].copied == 3
        async with open_endpoint(destination, KINDS) as ours:
            await assert_answers_alike(stock, ours.saver)
            await assert_store_alike(store, ours.store)


async def test_from_in_memory_saver_through_the_api(postgres_url: str) -> None:
    stock = InMemorySaver()
    await write_graph_threads(stock)
    await write_namespace_and_writes(stock)
    async with open_endpoint(postgres_url, ["saver"]) as ours:
        report = await migrate(LiveSource(Endpoint("InMemorySaver", saver=stock, stock=True)), ours,
                               MigrateOptions(kinds=("saver",), destination_mode="delta"))  # fmt: skip
        assert report.counts["saver"].threads == 3 and not any(report.mismatches.values())
        await assert_answers_alike(stock, ours.saver)


async def test_a_stock_saver_is_never_a_destination(tmp_path: Path) -> None:
    from runstore.errors import KindNotServedError

    async with open_endpoint("memory://", ["saver"]) as ours:
        with pytest.raises(KindNotServedError, match="never writes it"):
            await migrate(LiveSource(ours), Endpoint("stock", saver=InMemorySaver(), stock=True),
                          MigrateOptions(kinds=("saver",), destination_mode="delta"))  # fmt: skip


async def test_a_stock_postgres_source_bounds_each_statement(postgres_url: str) -> None:
    """A read of the stock source ends at ``command_timeout`` (60 s unless the URL sets it),
    enforced by the server; a value that is no positive number is refused by name."""
    async with _open_stock("langgraph+" + postgres_url) as stock:
        cur = await stock.conn.execute("SHOW statement_timeout")
        assert (await cur.fetchone())["statement_timeout"] == "1min"
    sep = "&" if "?" in postgres_url else "?"
    async with _open_stock(f"langgraph+{postgres_url}{sep}command_timeout=2.5") as stock:
        cur = await stock.conn.execute("SHOW statement_timeout")
        assert (await cur.fetchone())["statement_timeout"] == "2500ms"
        with pytest.raises(Exception, match="canceling statement due to statement timeout"):
            await stock.conn.execute("SELECT pg_sleep(5)")
    with pytest.raises(InvalidURLError, match="command_timeout='soon' is not a positive number of seconds"):
        async with _open_stock(f"langgraph+{postgres_url}{sep}command_timeout=soon"):
            pass
