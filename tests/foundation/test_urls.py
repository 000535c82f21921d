from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runstore import redaction
from runstore.errors import InvalidURLError
from runstore.redaction import redact
from runstore.urls import BackendURL


def test_parse_postgres_url_with_options() -> None:
    url = BackendURL.parse("postgresql://alice:s3cret@db.example:5433/app?schema=rs")
    assert (url.scheme, url.username, url.password, url.host, url.port, url.path) == (
        "postgresql", "alice", "s3cret", "db.example", 5433, "/app",
    )
    assert url.option("schema") == "rs"
    assert "s3cret" not in str(url) and "s3cret" not in repr(url)
    assert url.render(hide_password=False) == "postgresql://alice:s3cret@db.example:5433/app?schema=rs"


@given(st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=30))
def test_password_never_shown(password: str) -> None:
    from urllib.parse import quote

    raw = f"postgresql://bob:{quote(password, safe='')}@host/db"
    url = BackendURL.parse(raw)
    assert url.password == password
    assert quote(password, safe="") not in str(url).split("@")[0].split(":", 2)[-1] or password == "***"
    assert BackendURL.parse(url.render(hide_password=False)) == url


def test_file_paths_follow_sqlalchemy() -> None:
    assert BackendURL.parse("sqlite:///data/app.db").file_path() == Path("data/app.db")
    assert BackendURL.parse("sqlite:////srv/app.db").file_path() == Path("/srv/app.db")
    assert BackendURL.parse("sqlite://").file_path() is None
    assert BackendURL.for_file("jsonl", "/tmp/x").file_path() == Path("/tmp/x")
    with pytest.raises(InvalidURLError, match="names a host"):
        BackendURL.parse("sqlite://host/app.db").file_path()


@pytest.mark.parametrize("raw", ["not a url", "postgresql://h:notaport/db", "://x", "x://a?k=1&k=2"])
def test_malformed_urls_are_clear(raw: str) -> None:
    with pytest.raises(InvalidURLError):
        BackendURL.parse(raw)


def test_malformed_url_error_hides_password() -> None:
    with pytest.raises(InvalidURLError) as info:
        BackendURL.parse("postgresql://u:topsecret@h:99999999/db")
    assert "topsecret" not in str(info.value)


def test_check_options_names_accepted() -> None:
    url = BackendURL.parse("redis://h/0?prefx=a")
    with pytest.raises(InvalidURLError, match="'prefx'.*accepts: prefix"):
        url.check_options({"prefix"})


def test_redact_free_text(monkeypatch: pytest.MonkeyPatch) -> None:
    # Only the URL shapes: a password another test of this process parsed (a generated
    # one may be "s") would be masked inside "postgresql" too, whatever ran first.
    monkeypatch.setattr(redaction, "_SECRETS", set())
    text = "could not connect to postgresql://u:pw@h/db and redis://:pw2@r:6379/0"
    assert "pw" not in redact(text).replace("***", "")


def test_password_without_user_survives_rendering() -> None:
    url = BackendURL.parse("redis://:s3cret@cache:6379/0")
    assert (url.username, url.password) == ("", "s3cret")
    assert url.render(hide_password=False) == "redis://:s3cret@cache:6379/0"
    assert str(url) == "redis://:***@cache:6379/0"


def test_file_paths_may_hold_spaces() -> None:
    assert BackendURL.parse("sqlite:///my data/app.db").file_path() == Path("my data/app.db")
    with pytest.raises(InvalidURLError, match="whitespace"):
        BackendURL.parse("postgresql://u:a b@h/db")


@pytest.mark.parametrize(
    ("raw", "host", "port", "hosts"),
    [
        ("postgresql://u@/db?host=/var/run/postgresql", None, None, ()),
        ("postgresql://u@%2Fvar%2Frun%2FPostgreSQL/db", "/var/run/PostgreSQL", None, ()),
        ("postgresql://u@%2fvar%2frun%2fpostgresql:5433/db", "/var/run/postgresql", 5433, ()),
        ("postgresql://u@%2Fcloudsql%2Fp%3Ar%3Ai/db", "/cloudsql/p:r:i", None, ()),
        ("postgresql://u@H1:5432,h2:5433/db", None, None, (("h1", 5432), ("h2", 5433))),
        ("postgresql://h1,[::1]:5433,%2Ftmp/db", None, None, (("h1", None), ("::1", 5433), ("/tmp", None))),
    ],
)
def test_socket_directories_and_host_lists_parse_and_round_trip(
    raw: str, host: str | None, port: int | None, hosts: tuple[tuple[str, int | None], ...]
) -> None:
    url = BackendURL.parse(raw)
    assert (url.host, url.port, url.hosts) == (host, port, hosts)
    assert BackendURL.parse(url.render(hide_password=False)) == url


def test_rendered_option_values_keep_paths_and_lists_readable() -> None:
    url = BackendURL.parse("postgresql://u@/db?host=/var/run/postgresql,h2&port=5432,5433&options=-c%20a%3D1")
    assert str(url) == "postgresql://u@/db?host=/var/run/postgresql,h2&port=5432,5433&options=-c+a%3D1"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("postgresql://u@h1,,h2/db", r"empty entry in its host list 'h1,,h2'"),
        ("postgresql://,h2/db", r"empty entry in its host list ',h2'"),
        ("postgresql://u@h1:x,h2/db", r"port of 'h1:x' must be a number from 1 to 65535"),
        ("postgresql://u@h1:0,h2/db", r"port of 'h1:0' must be a number from 1 to 65535"),
        # Not ASCII digits: str.isdigit() accepts them, int() does not.
        ("postgresql://u@h1:\u00b2,h2/db", r"port of 'h1:\u00b2' must be a number from 1 to 65535"),
        ("postgresql://u@[::1]x,h2/db", r"cannot read the host '\[::1\]x'"),
    ],
)
def test_bad_host_lists_are_clear(raw: str, message: str) -> None:
    with pytest.raises(InvalidURLError, match=message):
        BackendURL.parse(raw)


def test_host_list_errors_and_renders_hide_the_password() -> None:
    with pytest.raises(InvalidURLError) as info:
        BackendURL.parse("postgresql://u:topsecret9@h1:x,h2/db")
    assert "topsecret9" not in str(info.value)
    url = BackendURL.parse("postgresql://u:topsecret9@h1:5432,h2:5433/db")
    assert str(url) == "postgresql://u:***@h1:5432,h2:5433/db"


@pytest.mark.parametrize(
    "raw",
    [
        "postgresql://u:pw@/db?host=/var/run/postgresql",
        "postgresql://u:pw@%2Fvar%2Frun%2Fpostgresql:5432/db",
        "postgresql://u:pw@h1:5432,h2:5433/db",
    ],
)
def test_redact_masks_socket_and_host_list_urls(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redaction, "_SECRETS", set())  # the URL shape alone, as above
    assert redact(f"cannot connect to {raw}: refused") == f"cannot connect to {raw.replace(':pw@', ':***@')}: refused"


def test_file_urls_refuse_a_host_list() -> None:
    with pytest.raises(InvalidURLError, match="names a host"):
        BackendURL.parse("sqlite://h1,h2/app.db").file_path()


def test_a_hostless_postgres_url_is_not_a_file() -> None:
    from runstore.bench.targets import is_file_url

    assert not is_file_url(BackendURL.parse("postgresql://u@/db?host=/var/run/postgresql"))
    assert not is_file_url(BackendURL.parse("postgres://u@/db"))
    assert is_file_url(BackendURL.parse("sqlite:///app.db"))
    assert is_file_url(BackendURL.parse("other:///data/dir"))
    assert not is_file_url(BackendURL.parse("other://h1,h2/data"))
