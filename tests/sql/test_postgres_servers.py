"""PostgreSQL servers named the libpq ways: a Unix socket (``?host=/dir`` or the directory
percent-encoded in the host part) and a list of hosts tried in order. The saver, the
event store and the run store each write and read over them against the test server;
every malformed form is an `InvalidURLError` before any connection.

The socket directory is ``RUNSTORE_TEST_POSTGRES_SOCKET_DIR`` (default
``/var/run/postgresql``), with the user, database and port of the test server's URL.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

import runstore
from runstore.conformance.harness import Provisioned
from runstore.errors import BackendUnavailableError, InvalidURLError
from runstore.urls import BackendURL

from ..conftest import POSTGRES_URL

SOCKET_DIR = os.environ.get("RUNSTORE_TEST_POSTGRES_SOCKET_DIR", "/var/run/postgresql")
CONFIG = {"checkpointer": "memory://", "events": "memory://", "runs": "memory://", "streams": "memory://"}
#: Nothing listens on port 1: a host that refuses at once.
DEAD = ("127.0.0.1", 1)


def _server() -> BackendURL:
    return BackendURL.parse(POSTGRES_URL)


def _live() -> tuple[str, int]:
    server = _server()
    return server.host or "127.0.0.1", server.port or 5432


def _socket_option_url() -> BackendURL:
    server = _server()
    return dataclasses.replace(server, host=None, port=None).with_query(host=SOCKET_DIR, port=str(_live()[1]))


def _socket_host_url() -> BackendURL:
    return dataclasses.replace(_server(), host=SOCKET_DIR, port=_live()[1])


def _host_list_url() -> BackendURL:
    return dataclasses.replace(_server(), host=None, port=None, hosts=(DEAD, _live()))


def _host_option_url() -> BackendURL:
    host, port = _live()
    server = dataclasses.replace(_server(), host=None, port=None)
    return server.with_query(host=f"{DEAD[0]},{host}", port=f"{DEAD[1]},{port}")


@pytest.fixture
def provisioned(request: pytest.FixtureRequest) -> Iterator[BackendURL]:
    """The parametrized URL with a fresh ``schema``, dropped after the test (an unreachable
    server skips, or fails under CI=true)."""
    with Provisioned(request.param()) as provisioned:
        yield provisioned.url


async def _write_and_read(url: BackendURL) -> dict[str, Any]:
    """Open the saver, the event store and the run store on ``url``; each writes and reads
    back. Returns where the server saw its sessions (``client_addr`` and ``server_port``)."""
    app = f"rs_servers_{uuid.uuid4().hex[:8]}"
    named = url.with_query(application_name=app).render(hide_password=False)
    async with runstore.open(CONFIG, checkpointer=named, events=named, runs=named) as stores:
        cfg = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
        saved = await stores.checkpointer.aput(cfg, empty_checkpoint(), {"source": "input", "step": -1}, {})
        got = await stores.checkpointer.aget_tuple(saved)
        assert got is not None and got.checkpoint["id"] == saved["configurable"]["checkpoint_id"]

        await stores.events.put(thread_id="t1", run_id="r1", event_type="note", category="message",
                                content="over the socket", user_id=None)
        assert [e["content"] for e in await stores.events.list_messages("t1", user_id=None)] == ["over the socket"]

        created = await stores.runs.create("t1", run_id="r1")
        assert created.outcome == "created"
        run = await stores.runs.get("r1")
        assert run is not None and run["thread_id"] == "t1"

        async with stores.events.engine.connect() as conn:
            rows = (await conn.exec_driver_sql(
                "SELECT DISTINCT host(client_addr), inet_server_port() FROM pg_stat_activity "
                "WHERE application_name = $1", (app,),
            )).all()
    return {"client_addr": {row[0] for row in rows}, "server_port": {row[1] for row in rows}}


@pytest.mark.postgres
@pytest.mark.parametrize("provisioned", [_socket_option_url, _socket_host_url], indirect=True,
                         ids=["host-option", "encoded-host"])
async def test_stores_work_over_the_unix_socket(provisioned: BackendURL) -> None:
    seen = await _write_and_read(provisioned)
    # A session over a Unix socket has no client address and no server port.
    assert seen == {"client_addr": {None}, "server_port": {None}}


@pytest.mark.postgres
@pytest.mark.parametrize("provisioned", [_host_list_url, _host_option_url], indirect=True,
                         ids=["host-part", "host-option"])
async def test_a_dead_host_first_connects_to_the_live_one(provisioned: BackendURL) -> None:
    url = provisioned.with_query(target_session_attrs="read-write")
    seen = await _write_and_read(url)
    assert seen["server_port"] == {_live()[1]}


def _runstore_options_url() -> BackendURL:
    return _server().with_query(pooler="transaction", operation_timeout="30", options="-c lock_timeout=5s")


@pytest.mark.postgres
@pytest.mark.parametrize("provisioned", [_runstore_options_url], indirect=True, ids=["runstore-options"])
async def test_a_scratch_schema_for_a_url_with_runstore_options(provisioned: BackendURL) -> None:
    """The suite's scratch schema comes from a URL carrying options only runstore reads
    (``pooler``, time bounds) and session ``options``: none reaches the driver as a server
    setting it does not know, and the stores work there."""
    assert provisioned.option("schema", "").startswith("runstore_conf_")
    seen = await _write_and_read(provisioned)
    assert seen["server_port"] == {_live()[1]}


async def test_a_list_of_dead_hosts_is_unavailable() -> None:
    url = BackendURL(scheme="postgresql", username="postgres", path="/x", hosts=(DEAD, ("127.0.0.1", 2)))
    with pytest.raises(BackendUnavailableError, match=r"127\.0\.0\.1:1,127\.0\.0\.1:2"):
        async with runstore.open(CONFIG, checkpointer=url.render(hide_password=False)):
            pass


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("postgresql://u@/db?host=run/postgresql", r"relative socket directory.*absolute path"),
        ("postgresql://u@%2E%2Frun/db", r"relative socket directory.*absolute path"),
        ("postgresql://u@/db?host=", r"empty host in its host list"),
        ("postgresql://u@/db?host=h1,,h2", r"empty host in its host list"),
        ("postgresql://u@/db?host=h1,h2&port=1,2,3", r"3 ports for 2 host\(s\); give one port for all hosts or one per host"),
        ("postgresql://u@/db?port=5432,5433", r"2 ports for the default host\(s\)"),
        ("postgresql://u@/db?host=h1,h2&port=5432,", r"port '' must be a number from 1 to 65535"),
        ("postgresql://u@/db?host=h1&port=0", r"port '0' must be a number from 1 to 65535"),
        ("postgresql://u@/db?host=h1&port=%C2%B2", r"port '\u00b2' must be a number from 1 to 65535"),
        ("postgresql://u@h1/db?host=/var/run/postgresql", r"names its server twice"),
        ("postgresql://u@h1:5432,h2/db?port=5432", r"port both in the host part and in the port option"),
        ("postgresql://u@/db?host=h1:5432", r"ports in the port option"),
        ("postgresql://u@/db?host=@pgsock", r"abstract Unix socket"),
    ],
)
async def test_bad_server_forms_are_refused_before_connecting(
    url: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncpg

    async def no_connection(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a malformed URL opened a connection")

    monkeypatch.setattr(asyncpg, "connect", no_connection)
    with pytest.raises(InvalidURLError, match=message):
        async with runstore.open(CONFIG, checkpointer=url, events=url, runs=url):
            pass


async def test_a_redis_url_with_several_hosts_is_refused() -> None:
    with pytest.raises(InvalidURLError, match=r"lists several servers.*redis\+cluster://"):
        async with runstore.open(CONFIG, streams="redis://127.0.0.1:1,127.0.0.1:2/0"):
            pass
