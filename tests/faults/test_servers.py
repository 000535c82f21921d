"""The fault-test tools work: throwaway servers start, crash and come back; the proxy
passes, drops and black-holes traffic."""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest

from .servers import SHARED_PORTS, PostgresServer, RedisServer, TcpProxy, free_port

pytestmark = pytest.mark.faults


def _ping(port: int, timeout: float = 5.0) -> bytes:
    """One raw RESP PING; returns the reply bytes (raises on timeout or a closed socket)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(b"PING\r\n")
        return sock.recv(64)


def test_free_port_never_hands_out_the_shared_ports() -> None:
    assert all(free_port() not in SHARED_PORTS for _ in range(20))
    with pytest.raises(ValueError, match="shared port"):
        TcpProxy(6379)


def test_free_port_never_hands_out_a_port_twice() -> None:
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)


def _taken(port: int) -> socket.socket:
    """A socket listening on ``port``, as another process that got there first would be."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


@pytest.mark.parametrize("kind", ["postgres", "redis", "redis-cluster-node"])
def test_a_server_whose_chosen_port_was_taken_starts_on_another(kind: str) -> None:
    server: PostgresServer | RedisServer
    if kind == "postgres":
        server = PostgresServer()
    elif kind == "redis":
        server = RedisServer()
    else:
        server = RedisServer(args=["--cluster-enabled", "yes", "--cluster-port", str(free_port())])
    chosen = server.port
    try:
        with _taken(chosen):
            server.start()
            assert server.port != chosen
            if isinstance(server, PostgresServer):
                assert server.psql("SHOW port") == str(server.port)
            else:
                assert _ping(server.port) == b"+PONG\r\n"
        # A restart keeps the port clients know.
        server.stop()
        server.start()
        assert server.port != chosen and server.running
    finally:
        server.close()


def test_a_server_given_a_taken_port_says_so() -> None:
    with _taken(free_port()) as sock:
        server = RedisServer(port=sock.getsockname()[1])
        try:
            with pytest.raises(RuntimeError, match="Address already in use"):
                server.start()
        finally:
            server.close()


def test_postgres_server_crashes_and_recovers_committed_data(postgres_server: PostgresServer) -> None:
    server = postgres_server
    assert server.port not in SHARED_PORTS
    assert server.psql("SHOW port") == str(server.port)
    server.psql("CREATE TABLE t (v int); INSERT INTO t VALUES (1)")

    server.crash()  # -m immediate
    assert not server.running
    server.start()
    server.psql("INSERT INTO t VALUES (2)")

    pid = server.pid
    assert pid is not None
    server.sigkill()
    assert not server.running and server.pid is None
    server.start()
    assert server.psql("SELECT string_agg(v::text, ',' ORDER BY v) FROM t") == "1,2"
    assert "database system was interrupted" in server.log() or "not properly shut down" in server.log()


async def test_postgres_server_terminates_client_sessions(postgres_server: PostgresServer) -> None:
    import asyncpg

    conn = await asyncpg.connect(postgres_server.url(password="any:pw/@"))
    try:
        assert await conn.fetchval("SELECT 1") == 1
        assert postgres_server.terminate_connections() == 1
        with pytest.raises(asyncpg.exceptions.ConnectionDoesNotExistError):
            await conn.fetchval("SELECT 1")
    finally:
        await conn.close()


def test_postgres_server_takes_settings_and_files() -> None:
    with PostgresServer(settings={"work_mem": "7MB"}, files={"extra.conf": "work_mem = '9MB'\n"}) as server:
        assert server.psql("SHOW work_mem") == "7MB"
        server.stop()
        server.configure(settings={"include": "extra.conf"})
        server.start()
        assert server.psql("SHOW work_mem") == "9MB"


def test_redis_server_restart_keeps_data_only_when_persistent() -> None:
    with RedisServer() as volatile, RedisServer(persistent=True) as durable:
        for server in (volatile, durable):
            assert server.port not in SHARED_PORTS
            server.command("SET", "k", "v")
            server.sigkill()
            assert not server.running
            server.start()
        assert volatile.command("GET", "k") is None
        assert durable.command("GET", "k") == b"v"


def test_redis_server_kills_clients(redis_server: RedisServer) -> None:
    with socket.create_connection(("127.0.0.1", redis_server.port), timeout=5) as sock:
        sock.sendall(b"PING\r\n")
        assert sock.recv(64) == b"+PONG\r\n"
        assert redis_server.kill_clients() == 1
        assert sock.recv(64) == b"", "the server closed the connection"
    assert _ping(redis_server.port) == b"+PONG\r\n"


def test_proxy_passes_drops_and_blackholes(
    redis_server: RedisServer, tcp_proxy: Callable[[int], TcpProxy]
) -> None:
    proxy = tcp_proxy(redis_server.port)
    assert proxy.url(redis_server.url()) == f"redis://127.0.0.1:{proxy.port}/0"
    assert _ping(proxy.port) == b"+PONG\r\n"

    # drop: an open connection is reset; a new one works.
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
        sock.sendall(b"PING\r\n")
        assert sock.recv(64) == b"+PONG\r\n"
        assert proxy.drop() == 1
        with pytest.raises(ConnectionResetError):
            sock.sendall(b"PING\r\n")
            if sock.recv(64) == b"":
                raise ConnectionResetError("closed")
    assert _ping(proxy.port) == b"+PONG\r\n"

    # black hole: an existing connection gets no answer, a new one is accepted but
    # never answered; both are answered once traffic passes again.
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as old:
        old.sendall(b"PING\r\n")
        assert old.recv(64) == b"+PONG\r\n"
        proxy.blackhole()
        old.settimeout(0.3)
        old.sendall(b"PING\r\n")
        with pytest.raises(TimeoutError):
            old.recv(64)
        with pytest.raises(TimeoutError):
            _ping(proxy.port, timeout=0.3)
        new = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        new.sendall(b"PING\r\n")
        proxy.pass_traffic()
        old.settimeout(5)
        assert old.recv(64) == b"+PONG\r\n", "held data is delivered after the black hole"
        assert new.recv(64) == b"+PONG\r\n"
        new.close()
