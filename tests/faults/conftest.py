"""Fixtures of the fault tests: throwaway servers and proxies (see ``tests/faults/servers.py``).

Every test here carries the ``faults`` marker (``pytest -m faults`` runs them; CI runs
them with everything else). A missing server binary skips the test, or fails it under
``CI=true``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from runstore.conformance.harness import service_unavailable

from .servers import PostgresServer, RedisServer, ServerUnavailable, TcpProxy


@pytest.fixture
def postgres_server() -> Iterator[PostgresServer]:
    """A started throwaway PostgreSQL cluster, removed after the test."""
    try:
        server = PostgresServer()
    except ServerUnavailable as exc:
        service_unavailable("a throwaway PostgreSQL cluster", exc)
        raise
    with server:
        yield server


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A started throwaway redis-server (no persistence), removed after the test."""
    try:
        server = RedisServer()
    except ServerUnavailable as exc:
        service_unavailable("a throwaway redis-server", exc)
        raise
    with server:
        yield server


@pytest.fixture
def tcp_proxy() -> Iterator[Callable[[int], TcpProxy]]:
    """``tcp_proxy(port)`` starts a proxy to 127.0.0.1:port; every proxy is closed after the test."""
    proxies: list[TcpProxy] = []

    def start(port: int) -> TcpProxy:
        proxy = TcpProxy(port)
        proxy.start()
        proxies.append(proxy)
        return proxy

    yield start
    for proxy in reversed(proxies):
        proxy.close()
