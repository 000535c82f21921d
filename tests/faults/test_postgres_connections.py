"""PostgreSQL connections that die or stop answering: the event store and the saver.

Each test runs its own throwaway cluster (tests/faults/servers.py), reached through a
TCP proxy the test controls, and checks with counts:

- a connection killed while idle (by the server, or reset by the network) never
  fails the next call: reads, idempotent writes and writes whose transaction never
  committed are retried on a fresh connection, exactly once;
- a write whose ``COMMIT`` was sent but never answered raises `BackendUnavailableError`
  with ``write_may_have_happened=True`` and the driver's error as ``__cause__``;
- on a half-open network every call ends within its configured bounds (settings or
  URL options) with `BackendUnavailableError`, and the stores work again, without
  being reopened, once traffic passes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from runstore.errors import BackendUnavailableError

from .servers import PostgresServer, TcpProxy
from .sqlstacks import Stack, cfg, checkpoint_args, ev, open_stack, put_chain, snapshot

pytestmark = pytest.mark.faults

#: Generous bound of any wait in these tests (never a timing assertion).
WAIT = 60.0


@pytest.fixture
def proxied(postgres_server: PostgresServer, tcp_proxy: Callable[[int], TcpProxy]) -> Iterator[tuple[PostgresServer, TcpProxy]]:
    yield postgres_server, tcp_proxy(postgres_server.port)


# -- a connection killed while idle -----------------------------------------------------

#: One call kind: ``prepare(stack, tag)`` before the kill (it also leaves connections
#: leased), ``act(stack, tag)`` after it; act returns (acknowledged, lost, duplicated).
Prepare = Callable[[Stack, str], Awaitable[Any]]
Act = Callable[[Stack, str, Any], Awaitable[tuple[int, int, int]]]


async def _nothing(stack: Stack, tag: str) -> None:
    await stack.store.list_events(tag, "r", user_id=None)
    await stack.saver.aget_tuple(cfg(tag))


async def _put(stack: Stack, tag: str, _: Any) -> tuple[int, int, int]:
    record = await stack.store.put(**ev(tag, "r", tag), user_id=None)
    contents = list((await stack.events(tag, "r")).values())
    return 1, int(record["content"] not in contents), contents.count(tag) - 1


async def _put_batch(stack: Stack, tag: str, _: Any) -> tuple[int, int, int]:
    records = await stack.store.put_batch([ev(tag, "r", f"{tag}-{i}") for i in range(5)], user_id=None)
    seen = await stack.events(tag, "r")
    lost = sum(1 for r in records if seen.get(r["seq"]) != r["content"])
    return 5, lost, len(seen) - len(set(seen.values())) + max(0, len(seen) - 5)


async def _put_if_absent(stack: Stack, tag: str, _: Any) -> tuple[int, int, int]:
    record, created = await stack.store.put_if_absent(**ev(tag, "r", "start", "run_start"), user_id=None)
    assert created, "the key was absent: a retry must not turn the winner into a loser"
    seen = await stack.events(tag, "r")
    return 1, int(seen.get(record["seq"]) != "start"), len(seen) - 1


async def _prepare_delete(stack: Stack, tag: str) -> None:
    await stack.store.put_batch([ev(tag, "r", f"d{i}") for i in range(3)], user_id=None)


async def _delete_by_run(stack: Stack, tag: str, _: Any) -> tuple[int, int, int]:
    count = await stack.store.delete_by_run(tag, "r", user_id=None)
    assert count == 3, "the delete ran once and counted what it deleted"
    return 1, int(bool(await stack.events(tag, "r"))), 0


async def _list_events(stack: Stack, tag: str, _: Any) -> tuple[int, int, int]:
    rows = await stack.store.list_events(tag, "r", user_id=None)
    assert [r["content"] for r in rows] == ["d0", "d1", "d2"]
    return 0, 0, 0


async def _prepare_chain(stack: Stack, tag: str) -> list[str]:
    return await put_chain(stack.saver, tag, ["v0"])


async def _aput(stack: Stack, tag: str, ids: list[str]) -> tuple[int, int, int]:
    saved = await stack.saver.aput(*checkpoint_args(stack.saver, cfg(tag, ids[0]), "v1", "run", 1))
    got = await stack.saver_reader.aget_tuple(saved)
    return 1, int(got is None or got.checkpoint["channel_values"] != {"a": "v1"}), 0


async def _aput_writes(stack: Stack, tag: str, ids: list[str]) -> tuple[int, int, int]:
    await stack.saver.aput_writes(cfg(tag, ids[0]), [("b", "x")], "t2", "")
    got = await stack.saver_reader.aget_tuple(cfg(tag, ids[0]))
    assert got is not None
    writes = [w for w in got.pending_writes or [] if w[0] == "t2"]
    return 1, int(len(writes) != 1), max(0, len(writes) - 1)


async def _aget_tuple(stack: Stack, tag: str, ids: list[str]) -> tuple[int, int, int]:
    got = await stack.saver.aget_tuple(cfg(tag))
    assert got is not None and got.config["configurable"]["checkpoint_id"] == ids[0]
    return 0, 0, 0


async def _acopy_thread(stack: Stack, tag: str, ids: list[str]) -> tuple[int, int, int]:
    await stack.saver.acopy_thread(tag, f"{tag}-copy")
    copied = await snapshot(stack.saver_reader, f"{tag}-copy")
    return 1, int([c[0] for c in copied] != ids), 0


async def _adelete_thread(stack: Stack, tag: str, ids: list[str]) -> tuple[int, int, int]:
    await stack.saver.adelete_thread(tag)
    return 1, int(bool(await snapshot(stack.saver_reader, tag))), 0


CALLS: dict[str, tuple[Prepare, Act]] = {
    "event store put": (_nothing, _put),
    "event store put_batch": (_nothing, _put_batch),
    "event store put_if_absent": (_nothing, _put_if_absent),
    "event store delete_by_run": (_prepare_delete, _delete_by_run),
    "event store list_events": (_prepare_delete, _list_events),
    "saver aput": (_prepare_chain, _aput),
    "saver aput_writes": (_prepare_chain, _aput_writes),
    "saver aget_tuple": (_prepare_chain, _aget_tuple),
    "saver acopy_thread": (_prepare_chain, _acopy_thread),
    "saver adelete_thread": (_prepare_chain, _adelete_thread),
}

KILLS: dict[str, Callable[[PostgresServer, TcpProxy], object]] = {
    "server terminates it (pg_terminate_backend)": lambda server, proxy: server.terminate_connections(),
    "network resets it (RST)": lambda server, proxy: proxy.drop(reset=True),
}


@pytest.mark.parametrize("kill", list(KILLS))
async def test_connection_killed_while_idle_does_not_fail_the_next_call(
    kill: str, proxied: tuple[PostgresServer, TcpProxy], fault_report: Any
) -> None:
    server, proxy = proxied
    trials = acknowledged = lost = duplicated = 0
    async with open_stack("postgres", server=server, proxy=proxy) as stack:
        for n, (name, (prepare, act)) in enumerate(CALLS.items()):
            # At once (the dead socket not yet noticed: the call fails on it and retries)
            # and after the event loop saw it close (replaced before use).
            for noticed in (False, True):
                tag = f"k{n}-{int(noticed)}"
                prepared = await prepare(stack, tag)
                KILLS[kill](server, proxy)
                if noticed:
                    await asyncio.sleep(0.05)
                try:
                    ack, gone, dup = await asyncio.wait_for(act(stack, tag, prepared), WAIT)
                except BackendUnavailableError as exc:
                    raise AssertionError(f"{name} failed after an idle kill ({kill}): {exc}") from exc
                await stack.assert_settled()
                trials += 1
                acknowledged += ack
                lost += gone
                duplicated += dup
    fault_report.add(f"postgres: connection killed while idle, {kill}", trials=trials,
                     acknowledged=acknowledged, lost=lost, duplicated=duplicated)
    assert lost == duplicated == 0


# -- a connection that dies during a write -----------------------------------------------

_SLOW = """
CREATE FUNCTION slow_row() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN PERFORM pg_sleep(0.5); RETURN NULL; END $$;
CREATE {deferred} TRIGGER slow_row AFTER INSERT ON runstore_events {when_deferred}
  FOR EACH ROW WHEN (NEW.run_id = 'slow') EXECUTE FUNCTION slow_row();
"""


async def _sleeping_backend(stack: Stack) -> None:
    """Wait until a session of the stack sits in the slow trigger's pg_sleep."""
    checker = stack._checker
    for _ in range(int(WAIT / 0.01)):
        rows = await checker.fetch("SELECT pid FROM pg_stat_activity WHERE wait_event = 'PgSleep'")
        if rows:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("no session reached the slow trigger")


@pytest.mark.parametrize("at_commit", [False, True], ids=["during-insert", "during-commit"])
async def test_connection_reset_during_a_write(
    at_commit: bool, proxied: tuple[PostgresServer, TcpProxy], fault_report: Any
) -> None:
    """Reset before the COMMIT was sent: retried on a fresh connection, written once.
    Reset while the COMMIT runs: `BackendUnavailableError` saying the write may have
    happened (here it did: the server finishes the commit), driver error as __cause__."""
    import asyncpg

    server, proxy = proxied
    async with open_stack("postgres", server=server, proxy=proxy) as stack:
        schema = stack.url.split("schema=")[1].split("&")[0]
        conn = await asyncpg.connect(server.url(), server_settings={"search_path": schema})
        try:
            await conn.execute(_SLOW.format(
                deferred="CONSTRAINT" if at_commit else "",
                when_deferred="DEFERRABLE INITIALLY DEFERRED" if at_commit else "",
            ))
        finally:
            await conn.close()
        call = asyncio.ensure_future(stack.store.put(**ev("t", "slow", "x"), user_id=None))
        await _sleeping_backend(stack)
        proxy.drop(reset=True)
        if at_commit:
            with pytest.raises(BackendUnavailableError) as caught:
                await asyncio.wait_for(call, WAIT)
            error = caught.value
            assert error.write_may_have_happened, "the COMMIT was sent: its outcome is unknown"
            assert isinstance(error.__cause__, asyncpg.ConnectionDoesNotExistError), repr(error.__cause__)
            assert "may have happened" in str(error)
        else:
            record = await asyncio.wait_for(call, WAIT)
            assert record["content"] == "x"
        for _ in range(int(WAIT / 0.01)):  # the abandoned backend finishes its sleep
            if not await stack._checker.fetch("SELECT 1 FROM pg_stat_activity WHERE wait_event = 'PgSleep'"):
                break
            await asyncio.sleep(0.01)
        seen = list((await stack.events("t", "slow")).values())
        assert seen == ["x"], "written exactly once"
        await stack.assert_settled()
        after = await stack.store.put(**ev("t", "r", "after"), user_id=None)
        assert (await stack.events("t", "r")) == {after["seq"]: "after"}
    fault_report.add(
        f"postgres: connection reset during a put's {'COMMIT' if at_commit else 'insert'}",
        trials=1, acknowledged=0 if at_commit else 1, lost=0, duplicated=0,
        may_have_happened=int(at_commit),
    )


# -- a half-open network -----------------------------------------------------------------

BOUNDS = {"connect_timeout": "0.5", "command_timeout": "0.5", "operation_timeout": "2"}


@pytest.mark.parametrize("where", ["settings", "url"])
async def test_calls_into_a_half_open_network_are_bounded(
    where: str, proxied: tuple[PostgresServer, TcpProxy], fault_report: Any
) -> None:
    """Every call ends with `BackendUnavailableError` within its bounds (the settings, or
    the URL options overriding them); a write whose COMMIT never left says nothing was
    written; once traffic passes, the same stores work again."""
    server, proxy = proxied
    if where == "url":
        opened = open_stack("postgres", server=server, proxy=proxy, url_options=BOUNDS,
                            postgres={"command_timeout_seconds": 60, "operation_timeout_seconds": 600})
    else:
        opened = open_stack("postgres", server=server, proxy=proxy, postgres={
            f"{name}_seconds": float(value) for name, value in BOUNDS.items()
        })
    async with opened as stack:
        ids = await put_chain(stack.saver, "h", ["v0"])
        await stack.store.put(**ev("h", "r", "before"), user_id=None)
        calls: dict[str, tuple[Callable[[], Awaitable[Any]], bool | None]] = {
            "event store list_events": (lambda: stack.store.list_events("h", "r", user_id=None), False),
            "event store put": (lambda: stack.store.put(**ev("h", "r", "lost"), user_id=None), False),
            "saver aget_tuple": (lambda: stack.saver.aget_tuple(cfg("h")), False),
            # One autocommit statement: sent, so it may run when the network heals.
            "saver aput": (lambda: stack.saver.aput(*checkpoint_args(stack.saver, cfg("h", ids[0]), "v1", "run", 1)), True),
        }
        elapsed: dict[str, float] = {}
        for name, (call, may_have_happened) in calls.items():
            proxy.blackhole()
            started = time.monotonic()
            with pytest.raises(BackendUnavailableError) as caught:
                await asyncio.wait_for(call(), WAIT)
            elapsed[name] = time.monotonic() - started
            assert caught.value.write_may_have_happened is may_have_happened, (name, str(caught.value))
            assert caught.value.__cause__ is not None
            assert type(caught.value.__cause__).__module__.split(".")[0] in ("asyncpg", "asyncio", "builtins"), repr(caught.value.__cause__)
            proxy.pass_traffic()
            # The same stores, not reopened, answer again.
            assert [r["content"] for r in await stack.store.list_events("h", "r", user_id=None)] == ["before"]
            assert await stack.saver.aget_tuple(cfg("h")) is not None
        await stack.assert_settled()
    fault_report.add(f"postgres: half-open network (bounds from {where})", trials=len(calls),
                     acknowledged=0, lost=0, duplicated=0,
                     **{f"ms {name}": int(t * 1000) for name, t in elapsed.items()})
