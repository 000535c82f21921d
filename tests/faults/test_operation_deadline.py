"""``operation_timeout`` bounds one whole call, every attempt included, on a half-open network.

A warm pool (connections leased and idle from the call just made, more idle in the
engine's pool past the ping threshold) meets a network that stops forwarding
(`TcpProxy.blackhole`): the first attempt waits on a connection that will never answer,
the retries wait on pings of pooled connections and on connects that are held forever. Every PostgreSQL kind (saver, event store, run store, the retention sweep) and
the Redis stream bridge must then end with `BackendUnavailableError` by the call's
``operation_timeout`` plus a small margin, not by the deadline plus whatever the attempt
in flight (or its clean-up) was still allowed. This is the documented contract
(docs/reliability.md), so the test asserts the bound itself.

One throwaway PostgreSQL and one redis-server, each behind its own proxy, and the stores
opened on them (a fresh schema, a fresh key prefix) serve the whole module; each test
warms the pool again, so the tests do not depend on each other's order.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio

from runstore.checkpoint.policy import RetentionPolicy
from runstore.conformance.harness import service_unavailable
from runstore.errors import BackendUnavailableError
from runstore.options import BackendOptions
from runstore.settings import Settings
from runstore.sweeper import Sweeper
from runstore.urls import BackendURL

from .servers import PostgresServer, RedisServer, ServerUnavailable, TcpProxy
from .sqlstacks import Stack, cfg, checkpoint_args, ev, open_stack, put_chain

# One event loop for the module, so the stores opened once serve every test.
pytestmark = [pytest.mark.faults, pytest.mark.asyncio(loop_scope="module")]

#: The bounds of the half-open-network scenario (seconds): an attempt's statement timeout
#: is shorter than the call's deadline, and the deadline is not a multiple of it.
CONNECT, COMMAND, OPERATION = 1.0, 1.5, 4.0
#: How far past ``operation_timeout`` a call may end: raising the error, closing the
#: abandoned connection. Well under ``COMMAND``, the overrun of an attempt not cut.
MARGIN = 1.0
#: A hang detector for every wait (never a timing assertion).
WAIT = 60.0


@pytest.fixture(scope="module")
def pg() -> Iterator[tuple[PostgresServer, TcpProxy]]:
    """One throwaway PostgreSQL and a proxy in front of it, for the whole module."""
    try:
        server = PostgresServer()
    except ServerUnavailable as exc:
        service_unavailable("a throwaway PostgreSQL cluster", exc)
        raise
    with server, TcpProxy(server.port) as proxy:
        yield server, proxy


@pytest.fixture(scope="module")
def rd() -> Iterator[tuple[RedisServer, TcpProxy]]:
    """One throwaway redis-server and a proxy in front of it, for the whole module."""
    try:
        server = RedisServer()
    except ServerUnavailable as exc:
        service_unavailable("a throwaway redis-server", exc)
        raise
    with server, TcpProxy(server.port) as proxy:
        yield server, proxy


_serial = itertools.count()


def _n() -> str:
    return f"n{next(_serial)}"


@dataclass
class Kinds:
    """Every PostgreSQL kind on one pool: the stack's saver and event store, a run store,
    and the checkpoint chain and run the reads look for."""

    stack: Stack
    runs: Any
    ids: list[str]

    @property
    def saver(self) -> Any:
        return self.stack.saver

    @property
    def store(self) -> Any:
        return self.stack.store


#: A call on `Kinds`; each call makes its own ids, so the same call runs warm first and
#: then into the black hole.
PgCall = Callable[[Kinds], Awaitable[Any]]


async def _aput(kinds: Kinds) -> Any:
    return await kinds.saver.aput(*checkpoint_args(kinds.saver, cfg(_n()), "v", "run", 0))


async def _aput_writes(kinds: Kinds) -> Any:
    await kinds.saver.aput_writes(cfg("h", kinds.ids[0]), [("b", _n())], _n(), "")


async def _aget_tuple(kinds: Kinds) -> Any:
    return await kinds.saver.aget_tuple(cfg("h"))


async def _alist_threads(kinds: Kinds) -> Any:
    return await kinds.saver.alist_threads(limit=5)


async def _put(kinds: Kinds) -> Any:
    return await kinds.store.put(**ev("h", "r", _n()), user_id=None)


async def _put_batch(kinds: Kinds) -> Any:
    return await kinds.store.put_batch([ev("h", "r", _n()) for _ in range(3)], user_id=None)


async def _put_if_absent(kinds: Kinds) -> Any:
    return await kinds.store.put_if_absent(**ev("h", _n(), "start", "run_start"), user_id=None)


async def _list_messages(kinds: Kinds) -> Any:
    return await kinds.store.list_messages("h", user_id=None)


async def _runs_create(kinds: Kinds) -> Any:
    return await kinds.runs.create(_n())


async def _runs_get(kinds: Kinds) -> Any:
    return await kinds.runs.get("a")


async def _sweep(kinds: Kinds) -> Any:
    sweeper = Sweeper(saver=kinds.saver, events=kinds.store, runs=kinds.runs)
    return await sweeper.sweep(RetentionPolicy(keep_last=1))


PG_CALLS: dict[str, PgCall] = {
    "saver aput": _aput,
    "saver aput_writes": _aput_writes,
    "saver aget_tuple": _aget_tuple,
    "saver alist_threads": _alist_threads,
    "event store put": _put,
    "event store put_batch": _put_batch,
    "event store put_if_absent": _put_if_absent,
    "event store list_messages": _list_messages,
    "run store create": _runs_create,
    "run store get": _runs_get,
    "retention sweep": _sweep,
}


async def _timed_into_black_hole(proxy: TcpProxy, call: Callable[[], Awaitable[Any]]) -> tuple[float, BackendUnavailableError]:
    """Black-hole ``proxy``, run ``call``; return how long it took and its error."""
    proxy.blackhole()
    try:
        started = time.monotonic()
        with pytest.raises(BackendUnavailableError) as caught:
            await asyncio.wait_for(call(), WAIT)
        return time.monotonic() - started, caught.value
    finally:
        proxy.pass_traffic()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def kinds(pg: tuple[PostgresServer, TcpProxy]) -> AsyncIterator[Kinds]:
    """Every PostgreSQL kind through the module's proxy, with the scenario's bounds."""
    server, proxy = pg
    bounds = {"connect_timeout_seconds": CONNECT, "command_timeout_seconds": COMMAND,
              "operation_timeout_seconds": OPERATION}
    async with open_stack("postgres", server=server, proxy=proxy, postgres=bounds) as stack:
        runs, _ = await stack.open_runs()
        await runs.create("t", run_id="a")
        yield Kinds(stack, runs, await put_chain(stack.saver, "h", ["v0"]))


async def _warm_pool(kinds: Kinds, size: int = 3) -> None:
    """Leave ``size`` connections open and idle in the shared engine's pool."""
    engine = kinds.stack.store.engine
    opened = [await engine.connect() for _ in range(size)]
    for conn in opened:
        await conn.close()


@pytest.mark.parametrize("name", list(PG_CALLS))
async def test_a_postgres_call_into_a_half_open_network_ends_at_its_operation_timeout(
    name: str, pg: tuple[PostgresServer, TcpProxy], kinds: Kinds, fault_report: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Warm pool, then the network stops forwarding: the call raises `BackendUnavailableError`
    (driver error as ``__cause__``) within ``operation_timeout`` plus the margin, and the same
    call succeeds once traffic passes again."""
    from runstore.plugins.postgres import engine as postgres_engine

    _, proxy = pg
    call = PG_CALLS[name]
    # Pooled connections idle past the ping threshold, as in a service between bursts:
    # a retry's checkout pings one (a statement the deadline may cut).
    monkeypatch.setattr(postgres_engine, "PING_AFTER_IDLE_SECONDS", 0.0)
    await _warm_pool(kinds)
    await call(kinds)  # warm: this call's connections are leased and idle
    elapsed, error = await _timed_into_black_hole(proxy, lambda: call(kinds))
    assert error.__cause__ is not None, "the driver's error is the cause"
    assert elapsed <= OPERATION + MARGIN, (
        f"{name} ended {elapsed:.2f}s after it started; operation_timeout is {OPERATION:g}s "
        f"(all attempts included): {error}"
    )
    await asyncio.wait_for(call(kinds), WAIT)  # the same stores, not reopened
    fault_report.add(f"postgres: {name} into a half-open network (warm pool)", trials=1,
                     acknowledged=0, lost=0, duplicated=0, ms=int(elapsed * 1000))


# -- Redis ---------------------------------------------------------------------------------

RedisCall = Callable[[Any], Awaitable[Any]]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def bridge(rd: tuple[RedisServer, TcpProxy]) -> AsyncIterator[Any]:
    """A Redis stream bridge through the module's proxy, with the scenario's bounds."""
    from runstore.plugins.redis.streams import RedisStreamBridge

    server, proxy = rd
    url = proxy.url(server.url(
        socket_connect_timeout=f"{CONNECT:g}", socket_timeout=f"{COMMAND:g}",
        operation_timeout=f"{OPERATION:g}", prefix=f"deadline-{uuid.uuid4().hex[:8]}:",
    ))
    async with BackendOptions.scope(Settings()) as options:
        opened = await RedisStreamBridge.open(BackendURL.parse(url), options)
        options.on_close(opened.close)
        yield opened

REDIS_CALLS: dict[str, RedisCall] = {
    "stream bridge publish": lambda bridge: bridge.publish("r", "v", _n()),
    "stream bridge publish_end": lambda bridge: bridge.publish_end(_n()),
    "stream bridge stream_exists": lambda bridge: bridge.stream_exists("r"),
}


@pytest.mark.parametrize("name", list(REDIS_CALLS))
async def test_a_redis_call_into_a_half_open_network_ends_at_its_operation_timeout(
    name: str, rd: tuple[RedisServer, TcpProxy], bridge: Any, fault_report: Any
) -> None:
    """The stream bridge under the same rule: warm pool, black hole, `BackendUnavailableError`
    by ``operation_timeout`` plus the margin; working again once traffic passes."""
    _, proxy = rd
    call = REDIS_CALLS[name]
    await call(bridge)  # warm
    elapsed, error = await _timed_into_black_hole(proxy, lambda: call(bridge))
    assert error.__cause__ is not None, "the driver's error is the cause"
    assert elapsed <= OPERATION + MARGIN, (
        f"{name} ended {elapsed:.2f}s after it started; operation_timeout is {OPERATION:g}s "
        f"(all attempts included): {error}"
    )
    await asyncio.wait_for(call(bridge), WAIT)
    fault_report.add(f"redis: {name} into a half-open network (warm pool)", trials=1,
                     acknowledged=0, lost=0, duplicated=0, ms=int(elapsed * 1000))
