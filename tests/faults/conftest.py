"""Fixtures of the fault tests: throwaway servers and proxies (see ``tests/faults/servers.py``).

Every test here carries the ``faults`` marker (``pytest -m faults`` runs them; CI runs
them with everything else). A missing server binary skips the test, or fails it under
``CI=true``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

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


@dataclass
class FaultCounts:
    """One measured row of docs/reliability.md: a fault and what happened to the writes."""

    fault: str
    test: str
    trials: int
    acknowledged: int
    lost: int
    duplicated: int
    extra: dict[str, int] = field(default_factory=dict)


#: Every row recorded in this session; written to $RUNSTORE_FAULTS_REPORT (JSON lines) at the end.
REPORT: list[FaultCounts] = []


class FaultReport:
    """Records the counts a fault test measured (``fault_report.add(...)``)."""

    def __init__(self, test: str) -> None:
        self.test = test

    def add(self, fault: str, *, trials: int, acknowledged: int, lost: int, duplicated: int,
            **extra: int) -> None:
        """Record one fault's counts for this test."""
        REPORT.append(FaultCounts(fault, self.test, trials, acknowledged, lost, duplicated, extra))


@pytest.fixture
def fault_report(request: pytest.FixtureRequest) -> FaultReport:
    """Where a fault test records its measured counts (see docs/reliability.md)."""
    return FaultReport(request.node.nodeid)


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("RUNSTORE_FAULTS_REPORT")
    if path and REPORT:
        with open(path, "a", encoding="utf-8") as out:
            for row in REPORT:
                out.write(json.dumps(asdict(row)) + "\n")
