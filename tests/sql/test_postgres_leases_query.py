"""`PostgresCalls.query`, the saver's one-statement call, keeps every rule of `PostgresCalls.run`.

Its first attempt on an idle leased connection runs without an ``asyncio.timeout`` of
its own: the statement's timeout, cut to the operation's, must still end it by the
operation deadline, and a failure or a cancellation must leave the connection rolled
back or closed, as `PostgresCalls.run` does. Both report a write cut at the deadline by what it
had sent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from runstore.errors import BackendRefusedError, BackendUnavailableError
from runstore.options import BackendOptions
from runstore.plugins.postgres.connections import PostgresCalls
from runstore.plugins.postgres.engine import shared_engine
from runstore.plugins.postgres.settings import PostgresTimeouts
from runstore.settings import Settings
from runstore.urls import BackendURL

#: The operation deadline well below the statement bound: only it can end a long statement.
TIMEOUTS = PostgresTimeouts(connect=5.0, command=30.0, operation=0.6)


@pytest.fixture
async def leases(postgres_url: str) -> AsyncIterator[PostgresCalls]:
    async with BackendOptions.scope(Settings()) as options:
        engine = await shared_engine(BackendURL.parse(postgres_url), options)
        leases = PostgresCalls(engine, 1, backend="test", timeouts=TIMEOUTS)
        try:
            assert await leases.query("fetchval", ("SELECT 1",), operation="warm") == 1
            assert len(leases._idle) == 1, "the first attempts below find an idle connection"
            yield leases
        finally:
            await leases.aclose()


@pytest.mark.parametrize("write", [False, True])
async def test_a_statement_past_the_operation_deadline_is_cut_there(leases: PostgresCalls, write: bool) -> None:
    """A statement longer than ``operation_timeout`` (shorter than ``command_timeout``)
    ends at the deadline as `BackendUnavailableError` (a write: may have happened, it was
    sent), and the connection is settled: the next call works."""
    started = time.monotonic()
    with pytest.raises(BackendUnavailableError) as info:
        await leases.query(
            "execute", ("SELECT pg_sleep(5)",), operation="sleep", write=write, idempotent=True
        )
    took = time.monotonic() - started
    assert TIMEOUTS.operation <= took < TIMEOUTS.operation + 1.5, took
    assert info.value.write_may_have_happened is write, str(info.value)
    assert await leases.query("fetchval", ("SELECT 2",), operation="after") == 2


async def test_a_cancelled_first_attempt_leaves_the_connection_settled(leases: PostgresCalls) -> None:
    """A caller cancelled mid-statement gets its `CancelledError` once the connection is
    rolled back: the transaction it was in is gone, and the next call works."""
    conn = leases._idle[-1].conn
    call = asyncio.ensure_future(
        leases.query("execute", ("SELECT pg_sleep(5)",), operation="sleep", write=True)
    )
    await asyncio.sleep(0.2)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert conn.is_closed() or not conn.is_in_transaction()
    assert await leases.query("fetchval", ("SELECT 3",), operation="after") == 3


async def test_a_refused_statement_keeps_the_connection(leases: PostgresCalls) -> None:
    """The server refusing a statement is `BackendRefusedError` with its SQLSTATE; the
    connection, outside any transaction, stays leased."""
    conn = leases._idle[-1].conn
    with pytest.raises(BackendRefusedError) as info:
        await leases.query("execute", ("SELECT 1/0",), operation="divide")
    assert info.value.code == "22012", info.value
    assert [lease.conn for lease in leases._idle] == [conn]
    assert await leases.query("fetchval", ("SELECT 4",), operation="after") == 4


@pytest.mark.parametrize(
    ("begin", "sent"),
    [(None, True), ("BEGIN", False)],
    ids=["autocommit-statement-sent", "transaction-before-commit"],
)
async def test_run_reports_a_write_cut_at_the_deadline_by_what_it_sent(
    leases: PostgresCalls, begin: str | None, sent: bool
) -> None:
    """`PostgresCalls.run` cut by the operation deadline mid-attempt: a write whose statement
    commits as it runs was sent, so it may have happened; one cut inside its transaction,
    before COMMIT went out, did not happen (the connection is rolled back)."""

    async def slow(conn: object) -> None:
        await conn.execute("SELECT pg_sleep(5)")  # type: ignore[attr-defined]

    with pytest.raises(BackendUnavailableError) as info:
        await leases.run(slow, operation="slow write", write=True, idempotent=True, begin=begin)
    assert info.value.write_may_have_happened is sent, str(info.value)
    assert await leases.query("fetchval", ("SELECT 5",), operation="after") == 5
