"""A password that is an ordinary word (``postgres``, ``admin``, ``password``, ``only``) is
masked where a secret stands, never in the ordinary text around it.

Masking every remembered password anywhere in any text turned PostgreSQL's
"read-only transaction" into "read-*** transaction" once some URL with the password
``only`` had been parsed in the process, and ``postgresql://`` into ``***ql://`` for a
user whose password is ``postgres``. Each error path is run with such passwords.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import runstore
from runstore.errors import InvalidURLError, RunstoreError
from runstore.redaction import is_strong_secret, masked_repr, redact, remember_secret
from runstore.settings import Settings
from runstore.urls import BackendURL

from ..faults.servers import RedisServer, free_port

WORDS = ["postgres", "admin", "secret", "only", "password", "redis", "transaction"]


@pytest.fixture(autouse=True)
def _ordinary_passwords_known() -> None:
    """Every ordinary word above is the password of a URL this process has parsed."""
    for word in WORDS:
        BackendURL.parse(f"postgresql://u:{word}@h/db")


def test_ordinary_words_stay_in_free_text_and_secret_places_are_masked() -> None:
    text = 'ERROR: cannot execute DELETE in a read-only transaction; password authentication failed for user "postgres"'
    assert redact(text) == text
    assert redact("admin secret redis postgresql://h/db") == "admin secret redis postgresql://h/db"
    assert redact("connect to postgresql://postgres:postgres@h/db") == "connect to postgresql://postgres:***@h/db"
    assert redact("dsn: host=h user=postgres password=postgres dbname=x") == (
        "dsn: host=h user=postgres password=*** dbname=x"
    )
    assert redact("{'user': 'admin', 'password': 'admin'}") == "{'user': 'admin', 'password': '***'}"
    assert redact('{"password": "secret", "db": 0}') == '{"password": "***", "db": 0}'
    assert redact("connect(host='h', password='only', sslpassword=\"only\")") == (
        "connect(host='h', password='***', sslpassword=\"***\")"
    )
    assert redact("PGPASSWORD=admin psql") == "PGPASSWORD=*** psql"
    assert redact("password=None") == "password=None"


def test_a_comma_joined_url_list_keeps_every_url() -> None:
    """`runstore bench -b memory://,sqlite://x.db,postgresql://u:pw@h/db` records its argv
    redacted: each URL of the list is its own URL, not one URL with an '@' past its host."""
    joined = "memory://,sqlite:///x.db,postgresql://app@127.0.0.1:5432/test,postgresql://u:pw@h/db"
    assert redact(joined) == "memory://,sqlite:///x.db,postgresql://app@127.0.0.1:5432/test,postgresql://u:***@h/db"


def test_a_strong_password_is_masked_as_a_whole_token_anywhere() -> None:
    strong = "x7#Kq2!vLm"
    assert is_strong_secret(strong) and not any(is_strong_secret(w) for w in WORDS)
    assert is_strong_secret("correct-horse-battery") and not is_strong_secret("internationalization")
    remember_secret(strong)
    assert redact(f"AUTH {strong} failed") == "AUTH *** failed"
    assert redact(f"AUTH '{strong}' failed") == "AUTH '***' failed"
    # Glued to letters it is part of another word, not the secret.
    assert redact(f"a{strong}b") == f"a{strong}b"


def test_settings_reprs_mask_url_passwords_and_keep_words() -> None:
    settings = Settings.load({}, env={"RUNSTORE_CHECKPOINTER_URL": "postgresql://postgres:postgres@h:5432/postgres"})
    shown = repr(settings)
    assert "postgresql://postgres:***@h:5432/postgres" in shown and "***ql" not in shown


def test_masked_repr_masks_password_fields() -> None:
    from dataclasses import dataclass

    @dataclass
    class Login:
        user: str
        password: str
        __repr__ = masked_repr

    assert repr(Login("admin", "admin")) == "test_masked_repr_masks_password_fields.<locals>.Login(user='admin', password='***')"


def test_url_errors_keep_ordinary_words() -> None:
    with pytest.raises(InvalidURLError) as info:
        BackendURL.parse("postgresql://postgres:postgres@h/db?x=1&x=2")
    assert "in 'postgresql://postgres:***@h/db?x=1&x=2'" in str(info.value)
    with pytest.raises(InvalidURLError) as info:
        BackendURL.parse("postgresql://u:admin@h1:x,h2/admin")
    assert str(info.value).startswith("backend URL 'postgresql://...': the port of 'h1:x'")
    url = BackendURL.parse("redis://:secret@cache:6379/0")
    assert str(url) == "redis://:***@cache:6379/0"


@pytest.mark.postgres
async def test_postgres_connection_errors_keep_ordinary_words(postgres_url: str) -> None:
    base = BackendURL.parse(postgres_url)
    missing = BackendURL(scheme="postgresql", username="postgres", password="postgres", host=base.host,
                         port=base.port, path="/nosuch_postgres_db").render(hide_password=False)
    with pytest.raises(RunstoreError) as info:
        async with runstore.open(checkpointer=missing):
            pass
    message = str(info.value)
    assert 'database "nosuch_postgres_db" does not exist' in message, message
    assert "postgresql://postgres:***@" in message and "***ql" not in message
    dead = BackendURL(scheme="postgresql", username="postgres", password="postgres", host="127.0.0.1",
                      port=free_port(), path="/test").render(hide_password=False)
    with pytest.raises(RunstoreError) as info:
        async with runstore.open(checkpointer=dead):
            pass
    assert f"postgresql://postgres:***@127.0.0.1:{BackendURL.parse(dead).port}/test" in str(info.value)
    assert str(info.value).startswith("postgres"), str(info.value)


@pytest.mark.redis
async def test_redis_connection_errors_keep_ordinary_words() -> None:
    with RedisServer(args=["--requirepass", "another-one"]) as server:
        url = server.url(password="password") + "?operation_timeout=2"
        with pytest.raises(RunstoreError) as info:
            async with runstore.open(streams=url) as stores:
                await stores.streams.publish("r", "v", 1)
    message = str(info.value)
    assert "username-password pair" in message, message
    assert "redis://:***@" in message and message.startswith("redis stream bridge")


def test_cli_errors_keep_ordinary_words(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "runstore", "check", "postgresql://postgres:postgres@h/postgres?x=1&x=2"],
        capture_output=True, text=True, cwd=tmp_path, timeout=300, env={**os.environ, "COLUMNS": "200"},
    )
    assert out.returncode == 2, out.stderr
    assert "'postgresql://postgres:***@h/postgres?x=1&x=2'" in out.stderr, out.stderr
