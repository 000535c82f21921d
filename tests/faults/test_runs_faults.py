"""The PostgreSQL run store when its server goes away or stops answering: runstore
errors within the bounds, then recovery without reopening."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from runstore.errors import BackendUnavailableError
from runstore.options import BackendOptions
from runstore.settings import Settings
from runstore.urls import BackendURL

from .servers import PostgresServer, TcpProxy

pytestmark = [pytest.mark.faults, pytest.mark.postgres]

#: Generous bound of any wait here (a hang detector, never a timing assertion).
WAIT = 60.0


async def test_a_stopped_server_is_unavailable_then_the_store_recovers(postgres_server: PostgresServer) -> None:
    from runstore.plugins.postgres.runs import PostgresRunStore

    options = BackendOptions()
    try:
        url = postgres_server.url(operation_timeout="1")
        store = await PostgresRunStore.open(BackendURL.parse(url), options)
        await store.create("t", run_id="a")
        postgres_server.stop()
        for call in (store.get("a"), store.create("t", run_id="b"), store.start("a", "w", 5)):
            with pytest.raises(BackendUnavailableError) as info:
                await asyncio.wait_for(call, WAIT)  # retried on fresh connections until 1 s
            assert info.value.write_may_have_happened is False
            assert info.value.__cause__ is not None
        postgres_server.start()
        run = await store.start("a", "w", 5)
        assert run["status"] == "running" and run["fence"] == 1
        assert [r["run_id"] for r in await store.list_by_thread("t")] == ["a"], "nothing was written"
    finally:
        await options.aclose()


async def test_calls_into_a_half_open_network_end_at_the_url_bounds(
    postgres_server: PostgresServer, tcp_proxy: Callable[[int], TcpProxy], fault_report: Any
) -> None:
    """The URL's timeout options apply to the run store as to the other postgres stores
    (settings far longer): a black-holed call, retried on fresh connections, ends at the
    operation bound with `BackendUnavailableError`, nothing written (its COMMIT never
    left); once traffic passes, the same store works."""
    from runstore.plugins.postgres.runs import PostgresRunStore

    proxy: TcpProxy = tcp_proxy(postgres_server.port)
    url = proxy.url(postgres_server.url(connect_timeout="0.5", command_timeout="0.5", operation_timeout="2"))
    settings = Settings().merged({"postgres": {
        "connect_timeout_seconds": 600, "command_timeout_seconds": 600, "operation_timeout_seconds": 600,
    }})
    async with BackendOptions.scope(settings) as options:
        store = await PostgresRunStore.open(BackendURL.parse(url), options)
        await store.create("t", run_id="a")
        calls = {
            "get": lambda: store.get("a"),
            "create": lambda: store.create("t2", run_id="b"),
            "start": lambda: store.start("a", "w", 5),
        }
        elapsed: dict[str, float] = {}
        for name, call in calls.items():
            proxy.blackhole()
            started = time.monotonic()
            with pytest.raises(BackendUnavailableError) as info:
                await asyncio.wait_for(call(), WAIT)
            elapsed[name] = time.monotonic() - started
            assert info.value.write_may_have_happened is False, (name, str(info.value))
            assert info.value.__cause__ is not None
            proxy.pass_traffic()
            assert (await store.get("a")) is not None, "the same store answers once traffic passes"
        assert await store.get("b") is None, "the black-holed create wrote nothing"
        run = await store.start("a", "w", 5)
        assert run["status"] == "running" and run["fence"] == 1
    fault_report.add("postgres: run store calls into a half-open network (URL bounds)",
                     trials=len(calls), acknowledged=0, lost=0, duplicated=0,
                     **{f"ms {name}": int(t * 1000) for name, t in elapsed.items()})


async def test_a_connection_killed_while_idle_does_not_fail_the_next_call(
    postgres_server: PostgresServer, tcp_proxy: Callable[[int], TcpProxy], fault_report: Any
) -> None:
    """Pooled connections closed by the server (``pg_terminate_backend``) or reset by the
    network while idle: the next read and write succeed, each write once."""
    from runstore.plugins.postgres.runs import PostgresRunStore

    proxy: TcpProxy = tcp_proxy(postgres_server.port)
    trials = 10
    async with BackendOptions.scope() as options:
        store = await PostgresRunStore.open(BackendURL.parse(proxy.url(postgres_server.url())), options)
        await store.create("t", run_id="a")
        for i in range(trials):
            await store.get("a")  # a pooled connection, idle from here
            if i % 2:
                await asyncio.to_thread(postgres_server.terminate_connections)
            else:
                proxy.drop(reset=True)
            await asyncio.sleep(0.05)  # the close has reached the client
            assert (await store.get("a")) is not None
            await store.create(f"t{i}", run_id=f"b{i}")
        created = [r["run_id"] for i in range(trials) for r in await store.list_by_thread(f"t{i}")]
    assert created == [f"b{i}" for i in range(trials)], "each create once"
    fault_report.add("postgres: run store connection killed while idle (server or network)",
                     trials=trials, acknowledged=trials + 1, lost=0, duplicated=0)
