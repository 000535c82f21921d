"""Redis over TLS, for real: ``rediss://`` against a throwaway ``redis-server --tls-port``.

The server listens with TLS only and requires a client certificate signed by the
throwaway CA. verify-full works with the CA and the client certificate, and fails
clearly (and at once, never retried) without the CA, with a host name the certificate
does not carry, or without a client certificate. Skipped with the reason when the
installed redis-server was built without TLS.
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
from runstore.streams.protocol import END, StreamEvent

from .servers import Certificates, RedisServer, ServerUnavailable

pytestmark = [pytest.mark.faults, pytest.mark.timeout(120)]

CONFIG = {"checkpointer": "memory://", "events": "memory://", "runs": "memory://"}


@pytest.fixture(scope="module")
def certs() -> Certificates:
    try:
        return Certificates(server_names=("127.0.0.1",))
    except ServerUnavailable as exc:
        service_unavailable("openssl", exc)
        raise


@pytest.fixture(scope="module")
def tls_redis(certs: Certificates) -> Iterator[RedisServer]:
    try:
        server = RedisServer(tls=certs, tls_auth_clients=True)
    except ServerUnavailable as exc:
        pytest.skip(f"no TLS-capable redis-server: {exc}")
    with server:
        yield server


@pytest.fixture(scope="module")
def client_cert(certs: Certificates) -> dict[str, str]:
    cert, key = certs.client("runstore-test-client")
    return {"sslcert": str(cert), "sslkey": str(key)}


async def _round_trip(url: str, config: dict[str, Any] | None = None) -> None:
    """Open the Redis bridge on ``url``; publish a run and read it back."""
    async with runstore.open({**CONFIG, **(config or {})}, streams=url) as stores:
        await stores.streams.publish("run-tls", "values", {"n": 1})
        await stores.streams.publish_end("run-tls")
        items = [item async for item in stores.streams.subscribe("run-tls")]
        assert isinstance(items[0], StreamEvent) and items[0].data == {"n": 1} and items[-1] is END
        await stores.streams.cleanup("run-tls")


def _url(server: RedisServer, **query: str) -> str:
    return server.url(scheme="rediss", **{"operation_timeout": "20", **query})


async def test_verify_full_with_the_ca_and_a_client_certificate(
    tls_redis: RedisServer, certs: Certificates, client_cert: dict[str, str]
) -> None:
    await _round_trip(_url(tls_redis, sslrootcert=str(certs.ca), **client_cert))


async def test_the_same_options_work_from_settings(
    tls_redis: RedisServer, certs: Certificates, client_cert: dict[str, str]
) -> None:
    await _round_trip(_url(tls_redis), {"redis": {"sslmode": "verify-full", "sslrootcert": str(certs.ca), **client_cert}})


async def test_without_the_ca_the_certificate_is_refused_at_once(
    tls_redis: RedisServer, client_cert: dict[str, str]
) -> None:
    """No sslrootcert: the system's CAs, which never signed the throwaway one."""
    started = time.monotonic()
    with pytest.raises(BackendRefusedError, match="certificate verify failed"):
        await _round_trip(_url(tls_redis, **client_cert))
    assert time.monotonic() - started < 15, "an untrusted certificate is not retried until the deadline"


async def test_verify_full_checks_the_host_name_verify_ca_does_not(
    tls_redis: RedisServer, certs: Certificates, client_cert: dict[str, str]
) -> None:
    local = _url(tls_redis, sslmode="verify-ca", sslrootcert=str(certs.ca), **client_cert).replace(
        "127.0.0.1", "localhost"
    )
    await _round_trip(local)
    with pytest.raises(BackendRefusedError, match="localhost"):
        await _round_trip(local.replace("verify-ca", "verify-full"))


async def test_without_a_client_certificate_the_server_refuses(tls_redis: RedisServer, certs: Certificates) -> None:
    started = time.monotonic()
    with pytest.raises(BackendRefusedError, match="CERTIFICATE_REQUIRED|certificate required"):
        await _round_trip(_url(tls_redis, sslrootcert=str(certs.ca)))
    assert time.monotonic() - started < 15, "a refused client certificate is not retried until the deadline"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://127.0.0.1:1/0?sslrootcert=/x.pem", r"sslrootcert need TLS; use a rediss:// URL"),
        ("rediss://127.0.0.1:1/0?sslmode=disable", r"sslmode='disable'.*one of require, verify-ca, verify-full"),
        ("rediss://127.0.0.1:1/0?sslrootcert=/nonexistent.pem", r"sslrootcert.*no such file"),
        ("rediss://127.0.0.1:1/0?sslkey=/etc/hostname", r"sslkey.*needs its certificate"),
        ("rediss://127.0.0.1:1/0?ssl_ca_certs=/x", r"unknown option.*accepts: .*sslrootcert"),
    ],
)
async def test_bad_tls_options_are_refused_before_connecting(url: str, message: str) -> None:
    with pytest.raises(InvalidURLError, match=message):
        await _round_trip(url)


async def test_bad_tls_settings_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"redis.sslrootcert.*no such file"):
        await _round_trip("rediss://127.0.0.1:1/0", {"redis": {"sslrootcert": str(tmp_path / "none.pem")}})
