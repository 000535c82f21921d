"""PostgreSQL over TLS, for real: a throwaway CA and a second cluster with ``ssl=on``.

The cluster refuses every connection without TLS (``hostnossl ... reject``), so a
store that opens and round-trips a checkpoint there spoke TLS. ``verify-full`` works
with the CA and fails clearly without it, with another CA, and for a host name the
certificate does not carry; a client certificate authenticates a user whose
``pg_hba`` line says ``cert``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import runstore
from runstore.conformance.harness import service_unavailable
from runstore.errors import BackendRefusedError, ConfigError, InvalidURLError
from runstore.urls import BackendURL

from .servers import Certificates, PostgresServer, ServerUnavailable

pytestmark = [pytest.mark.faults, pytest.mark.timeout(180)]

CONFIG = {"checkpointer": "memory://", "events": "memory://", "runs": "memory://", "streams": "memory://"}
CERT_USER = "certuser"


@pytest.fixture(scope="module")
def certs() -> Certificates:
    try:
        return Certificates(server_names=("127.0.0.1",))
    except ServerUnavailable as exc:
        service_unavailable("openssl", exc)
        raise


@pytest.fixture(scope="module")
def tls_server(certs: Certificates) -> Iterator[PostgresServer]:
    try:
        server = PostgresServer()
    except ServerUnavailable as exc:
        service_unavailable("a throwaway PostgreSQL cluster", exc)
        raise
    server.tls(certs, hba=[
        "hostnossl all all 127.0.0.1/32 reject",
        f"hostssl all {CERT_USER} 127.0.0.1/32 cert",
    ])
    with server:
        server.psql(f"CREATE ROLE {CERT_USER} LOGIN SUPERUSER")
        yield server


@pytest.fixture(autouse=True)
def no_default_roots(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No CA from the environment or ~/.postgresql: each test says what it trusts."""
    for name in ("PGSSLMODE", "PGSSLROOTCERT", "PGSSLCERT", "PGSSLKEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))


async def _round_trip(url: str, config: dict[str, Any] | None = None) -> None:
    """Open the saver and the event store on ``url``; write and read a checkpoint."""
    from langgraph.checkpoint.base import empty_checkpoint

    async with runstore.open({**CONFIG, **(config or {})}, checkpointer=url, events=url) as stores:
        cfg = {"configurable": {"thread_id": "tls", "checkpoint_ns": ""}}
        saved = await stores.checkpointer.aput(cfg, empty_checkpoint(), {"source": "input", "step": -1}, {})
        got = await stores.checkpointer.aget_tuple(saved)
        assert got is not None and got.checkpoint["id"] == saved["configurable"]["checkpoint_id"]


def _url(server: PostgresServer, **query: str) -> str:
    return server.url(schema="tls_test", **query)


async def test_verify_full_with_the_ca_connects_over_tls(tls_server: PostgresServer, certs: Certificates) -> None:
    await _round_trip(_url(tls_server, sslmode="verify-full", sslrootcert=str(certs.ca)))


async def test_the_same_options_work_from_settings(tls_server: PostgresServer, certs: Certificates) -> None:
    settings = {"postgres": {"sslmode": "verify-full", "sslrootcert": str(certs.ca),
                             "application_name": "tls-test"}}
    await _round_trip(_url(tls_server), settings)


async def test_plain_connections_are_refused_by_this_server(tls_server: PostgresServer) -> None:
    """The control: without TLS the server says no, so the other tests did use TLS."""
    with pytest.raises(BackendRefusedError) as caught:
        await _round_trip(_url(tls_server, sslmode="disable", connect_timeout="5", operation_timeout="10"))
    assert "no encryption" in str(caught.value) or "reject" in str(caught.value), caught.value


async def test_verify_full_without_a_ca_is_a_clear_error_before_connecting(tls_server: PostgresServer) -> None:
    with pytest.raises(InvalidURLError, match=r"sslmode.*verify-full.*sslrootcert=/path/to/ca.pem"):
        await _round_trip(_url(tls_server, sslmode="verify-full"))


async def test_verify_full_with_another_ca_fails_fast_naming_the_certificate(
    tls_server: PostgresServer, tmp_path: Path
) -> None:
    other = Certificates()
    started = time.monotonic()
    with pytest.raises(BackendRefusedError, match="certificate verify failed"):
        await _round_trip(_url(tls_server, sslmode="verify-full", sslrootcert=str(other.ca)))
    # Refused for good: not retried until the operation deadline (90 s by default).
    assert time.monotonic() - started < 30


async def test_verify_full_checks_the_host_name_verify_ca_does_not(
    tls_server: PostgresServer, certs: Certificates
) -> None:
    """The certificate names 127.0.0.1 only: ``localhost`` passes verify-ca, not verify-full."""
    local = _url(tls_server, sslmode="verify-ca", sslrootcert=str(certs.ca)).replace("127.0.0.1", "localhost")
    await _round_trip(local)
    with pytest.raises(BackendRefusedError, match="localhost"):
        await _round_trip(local.replace("verify-ca", "verify-full"))


async def test_a_client_certificate_authenticates(tls_server: PostgresServer, certs: Certificates) -> None:
    cert, key = certs.client(CERT_USER)
    url = tls_server.url(user=CERT_USER, schema="tls_cert", sslmode="verify-full", sslrootcert=str(certs.ca),
                         sslcert=str(cert), sslkey=str(key))
    await _round_trip(url)
    without = tls_server.url(user=CERT_USER, schema="tls_cert", sslmode="verify-full", sslrootcert=str(certs.ca))
    with pytest.raises(BackendRefusedError, match="certificate"):
        await _round_trip(without)


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"sslmode": "verify"}, r"sslmode='verify'.*one of disable, allow, prefer, require, verify-ca, verify-full"),
        ({"sslrootcert": "/nonexistent/ca.pem"}, r"sslrootcert.*no such file '/nonexistent/ca.pem'"),
        ({"sslkey": "/etc/hostname"}, r"sslkey.*needs its certificate"),
        ({"sslmode": "require", "sslrootcert": "system"}, r"system's CAs are only used with sslmode=verify-full"),
        ({"target_session_attrs": "writable"}, r"target_session_attrs.*one of any, primary"),
        ({"pooler": "pgbouncer"}, r"pooler.*one of none, transaction"),
        ({"options": "statement_timeout=5s"}, r"options.*'-c name=value'"),
        ({"application_name": "caf\u00e9"}, r"application_name.*printable ASCII"),
        ({"sslmode_typo": "x"}, r"unknown option.*accepts: application_name"),
    ],
)
async def test_bad_connect_options_are_refused_before_connecting(query: dict[str, str], message: str) -> None:
    # Nothing listens on port 1: a refused option never gets as far as connecting.
    url = BackendURL(scheme="postgresql", host="127.0.0.1", port=1, path="/x", query=query)
    with pytest.raises(InvalidURLError, match=message):
        await _round_trip(url.render(hide_password=False))


async def test_bad_settings_are_config_errors() -> None:
    url = "postgresql://127.0.0.1:1/x"
    with pytest.raises(ConfigError, match=r"postgres.sslmode.*one of"):
        await _round_trip(url, {"postgres": {"sslmode": "on"}})
    with pytest.raises(ConfigError, match=r"postgres.pool_max_idle.*must not exceed"):
        await _round_trip(url, {"postgres": {"pool_max_size": 2, "pool_max_idle": 3}})
    with pytest.raises(ConfigError, match=r"ALTER ROLE"):
        await _round_trip(url, {"postgres": {"pooler": "transaction", "saver_synchronous_commit": "off"}})
