"""Errors that say what to fix: a refusal no retry changes is a `BackendRefusedError` naming
what to create or check (never "safe to retry"), `runstore check` learns within one knock
that nothing listens on a port, and an unquoted URL in runstore.yaml gets the quoting rule."""

from __future__ import annotations

from pathlib import Path

import pytest

import runstore
from runstore.conformance.preflight import _knock
from runstore.errors import BackendRefusedError, ConfigError
from runstore.settings import read_yaml
from runstore.urls import BackendURL

from ..faults.servers import RedisServer, free_port


@pytest.mark.postgres
async def test_a_missing_postgres_database_says_to_create_it(postgres_url: str) -> None:
    base = BackendURL.parse(postgres_url)
    missing = BackendURL(scheme="postgresql", username=base.username, host=base.host, port=base.port,
                         path="/nosuchdb").render(hide_password=False)
    with pytest.raises(BackendRefusedError) as info:
        async with runstore.open(checkpointer=missing):
            pass
    message = str(info.value)
    assert 'database "nosuchdb" does not exist' in message and "CREATE DATABASE" in message, message
    assert "safe to retry" not in message and info.value.code == "3D000"
    assert type(info.value.__cause__).__name__ == "InvalidCatalogNameError"


@pytest.mark.postgres
async def test_a_missing_postgres_role_says_what_to_check(postgres_url: str) -> None:
    base = BackendURL.parse(postgres_url)
    stranger = BackendURL(scheme="postgresql", username="nosuchrole", host=base.host, port=base.port,
                          path=base.path).render(hide_password=False)
    with pytest.raises(BackendRefusedError) as info:
        async with runstore.open(events=stranger):
            pass
    assert "create the role" in str(info.value) and "safe to retry" not in str(info.value)


@pytest.mark.redis
async def test_a_wrong_redis_password_says_what_to_check() -> None:
    with RedisServer(args=["--requirepass", "right-one"]) as server, pytest.raises(BackendRefusedError) as info:
        async with runstore.open(streams=server.url(password="wrong-one")) as stores:
            await stores.streams.publish("r", "v", 1)
    assert "requirepass" in str(info.value) and "safe to retry" not in str(info.value)


async def test_the_preflight_knock_reports_a_closed_port_itself() -> None:
    """Refused by the knock (an OSError the preflight reports as unreachable), not after the
    backend's own open retried for its operation timeout."""
    with pytest.raises(ConnectionRefusedError):
        await _knock(BackendURL.parse(f"redis://127.0.0.1:{free_port()}/0"))
    await _knock(BackendURL.parse("memory://"))  # nothing to knock on


@pytest.mark.parametrize("value", ["redis://h:6379/0?prefix=app:", "redis://h:6379/0?prefix=app: x"])
def test_an_unquoted_url_in_yaml_gets_the_quoting_rule(tmp_path: Path, value: str) -> None:
    config = tmp_path / "runstore.yaml"
    config.write_text(f"streams_url: {value}\n")
    with pytest.raises(ConfigError) as info:
        read_yaml(config)
    message = str(info.value)
    assert "line 1" in message and "must be quoted" in message, message
    assert f'e.g. streams_url: "{value}"' in message
