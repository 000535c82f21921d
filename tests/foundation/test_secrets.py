"""Passwords never leave runstore: every output channel is grepped for a password made of
every URL-special character.

The password carries the marker ``Zq7`` between its special characters, so any piece of
it long enough to matter, raw or encoded, shows up as ``Zq7`` in a leak. Channels:
exceptions, logging at DEBUG, ``repr``/``str`` of every public object holding a URL, the
CLI (``runstore check`` text, JSON and JUnit; ``runstore backends``) and ``runstore bench``
(JSONL rows with ``argv`` and ``case_id``, warnings).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

import runstore
from runstore.errors import InvalidURLError
from runstore.redaction import redact
from runstore.urls import BackendURL

from ..faults.servers import RedisServer, free_port

MARK = "Zq7"
#: RFC 3986 gen-delims and sub-delims, '%', space, quotes, backslash and other unsafe characters.
SPECIALS = [":/?#", "[]@", "!$&'()", "*+,;=", "% \"<>", "\\^`{|}~", "é%41\t"]
PASSWORD = MARK + MARK.join(SPECIALS) + MARK


def no_secret(text: str, where: str) -> None:
    """Fail if any piece of the password (a marker) appears in ``text``."""
    at = text.find(MARK)
    assert at < 0, f"password leaked through {where}: ...{text[max(0, at - 60):at + 60]!r}..."


def with_password(url: str, user: str | None = None) -> str:
    """``url`` with the password set (percent-encoded, as a URL must carry it)."""
    parsed = BackendURL.parse(url)
    return dataclasses.replace(parsed, username=user or parsed.username or "", password=PASSWORD).render(
        hide_password=False
    )


def _runstore(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runstore.cli", *args], capture_output=True, text=True, cwd=cwd,
        timeout=600, env={**os.environ, **(env or {})},
    )


# -- the parser and the masking function ------------------------------------------------


@given(st.text(alphabet=st.sampled_from("".join(SPECIALS) + "ab"), min_size=1, max_size=24))
def test_every_encoded_password_parses_back_and_is_masked(password: str) -> None:
    raw = f"postgresql://bob:{quote(password, safe='')}@db.example:5432/app?schema=s"
    url = BackendURL.parse(raw)
    assert url.password == password and url.host == "db.example" and url.port == 5432
    assert url.render() == "postgresql://bob:***@db.example:5432/app?schema=s"
    masked = redact(f"connect to {raw} failed")
    assert masked == "connect to postgresql://bob:***@db.example:5432/app?schema=s failed"


@pytest.mark.parametrize(
    "raw",
    [
        f"postgresql://u:{PASSWORD}@db.example/app",  # nothing encoded at all
        f"redis://:{MARK}/x{MARK}@cache:6379/0",
        f"redis://:{MARK}#x{MARK}@cache:6379/0",
        f"redis://:{MARK}?x{MARK}@cache:6379/0",
        f"postgresql://u:{MARK}[x]{MARK}@db.example/app",
        f"postgresql://u:{MARK} x{MARK}@db.example/app",
    ],
)
def test_unencoded_special_characters_are_an_error_that_hides_the_password(raw: str) -> None:
    """A URL whose password holds an unencoded / ? # (the host part ends early) is ambiguous:
    it is rejected, telling how to encode, without echoing any of the password."""
    try:
        url = BackendURL.parse(raw)
    except InvalidURLError as exc:
        chained: BaseException | None = exc
        while chained is not None:  # a suppressed context is still reachable (and logged by some tools)
            no_secret(f"{chained} {chained!r}", "the parse error or its context")
            chained = chained.__cause__ or chained.__context__
        assert "percent-encode" in str(exc)
    else:
        # Unambiguous after all (':', '@' and '%' need no encoding in a password).
        assert url.host in ("db.example", "cache")
        no_secret(str(url) + repr(url), "the parsed URL")
    no_secret(redact(f"error for {raw} here"), "redact() of free text")


def test_redact_masks_urls_in_any_text_and_known_passwords_in_any_spelling() -> None:
    BackendURL.parse(f"postgresql://u:{quote(PASSWORD, safe='')}@h/db")  # now a known password
    element = ET.Element("failure", message=PASSWORD)
    element.text = PASSWORD
    spellings = [PASSWORD, quote(PASSWORD, safe=""), quote(PASSWORD), json.dumps(PASSWORD),
                 repr(PASSWORD), json.dumps(repr(PASSWORD)), ET.tostring(element, encoding="unicode")]
    for spelling in spellings:
        no_secret(redact(f"before {spelling} after"), f"redact() of {spelling!r}")
    assert redact("redis://cache:6379/0?prefix=a and sqlite:///x.db") == "redis://cache:6379/0?prefix=a and sqlite:///x.db"
    assert redact("postgresql://u:pw@h/db") == "postgresql://u:***@h/db"


# -- in-process channels: exceptions, DEBUG logs, repr/str -----------------------------


@pytest.fixture
def redis_with_password() -> Any:
    with RedisServer(args=["--requirepass", PASSWORD]) as server:
        yield server


@pytest.mark.postgres
@pytest.mark.redis
async def test_no_password_in_objects_errors_or_debug_logs(
    postgres_url: str, redis_with_password: RedisServer, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.DEBUG)
    pg = with_password(postgres_url, user="postgres")
    rd = redis_with_password.url(password=PASSWORD)
    seen: list[str] = []
    settings = runstore.Settings.load(
        {"checkpoint_cache": {"type": "redis", "url": rd}, "checkpoint_channel_mode": "delta"},
        env={"RUNSTORE_CHECKPOINTER_URL": pg, "RUNSTORE_EVENTS_URL": pg, "RUNSTORE_STREAMS_URL": rd},
    )
    seen += [repr(settings), str(settings), json.dumps(settings.public_dict()), repr(settings.checkpoint_cache)]
    from runstore.checkpoint import modes

    modes.reset_checkpoint_mode_for_tests()
    try:
        async with runstore.open(settings) as stores:
            await stores.events.put(thread_id="t", run_id="r", event_type="x", category="lifecycle",
                                    content={}, user_id=None)
            await stores.streams.publish("r", "v", 1)
            for obj in (stores, stores.checkpointer, stores.events, stores.streams, stores.settings,
                        getattr(stores.checkpointer, "cache", None)):
                seen += [repr(obj), str(obj)]
    finally:
        modes.reset_checkpoint_mode_for_tests()
    # Errors: a wrong password, a dead port, an unknown option, a malformed URL.
    failures: list[BaseException] = []
    for url in (
        rd.replace(quote(PASSWORD, safe=""), quote(PASSWORD[::-1], safe="")),
        with_password(f"redis://127.0.0.1:{free_port()}/0?operation_timeout=0.5"),
        with_password(f"postgresql://127.0.0.1:{free_port()}/db"),
        with_password("redis://cache:6379/0?bogus=1"),
        f"redis://:{PASSWORD}@cache:6379/0",
    ):
        for kind in ("events", "streams"):
            if (kind == "events") != url.startswith("postgresql"):
                continue
            try:
                async with runstore.open(events="memory://", **{kind: url}, checkpointer="memory://"):
                    pass
            except Exception as exc:
                failures.append(exc)
    assert len(failures) == 5, failures
    for exc in failures:
        chain: BaseException | None = exc
        while chain is not None:
            seen += [str(chain), repr(chain)]
            chain = chain.__cause__ or chain.__context__
    for record in caplog.records:
        seen.append(record.getMessage())
        if record.exc_info:
            seen.append(logging.Formatter().formatException(record.exc_info))
    for text in seen:
        no_secret(text, "an object, an error or a log record")
    await asyncio.sleep(0)


# -- the command line -----------------------------------------------------------------------


@pytest.mark.postgres
def test_no_password_in_check_and_backends_output(postgres_url: str, tmp_path: Path) -> None:
    pg = with_password(postgres_url, user="postgres")
    dead = with_password(f"postgresql://127.0.0.1:{free_port()}/db")
    junit = tmp_path / "report.xml"
    outputs: dict[str, str] = {}
    stdout: dict[str, str] = {}
    for label, args, env in (
        ("check text", ["check", pg, "-k", "roundtrip"], {}),
        ("check json + junit", ["check", pg, dead, "--json", "--junit-xml", str(junit), "-k", "roundtrip"],
         {"CI": "true"}),
        ("check show-log", ["check", dead, "--show-log", "-k", "roundtrip"], {"CI": "true"}),
        ("check defaults", ["check", "-k", "roundtrip"], {"RUNSTORE_EVENTS_URL": dead}),
        ("check malformed", ["check", f"postgresql://u:{PASSWORD}@h/db"], {}),
        ("backends", ["backends"], {"RUNSTORE_EVENTS_URL": pg}),
        ("backends json", ["backends", "--json"], {"RUNSTORE_EVENTS_URL": pg}),
    ):
        out = _runstore(*args, cwd=tmp_path, env=env)
        outputs[label] = out.stdout + out.stderr
        stdout[label] = out.stdout
    outputs["junit"] = junit.read_text()
    result = json.loads(stdout["check json + junit"])
    assert result["ok"] is False, "the dead server is reported (and its failure message shown)"
    assert "unreachable" in outputs["junit"], "the failure message is in the JUnit report"
    assert "passed" in outputs["check text"], outputs["check text"][-2000:]
    for label, text in outputs.items():
        no_secret(text, label)


@pytest.mark.redis
def test_no_password_in_bench_rows_argv_case_ids_or_warnings(redis_with_password: RedisServer, tmp_path: Path) -> None:
    good = redis_with_password.url(password=PASSWORD)
    dead = with_password(f"redis://127.0.0.1:{free_port()}/0?operation_timeout=0.5")
    rows = tmp_path / "rows.jsonl"
    out = subprocess.run(
        [sys.executable, "-m", "runstore.cli", "bench", "streams", "-b", good, "-b", dead, "--events", "3",
         "--throughput-events", "3", "--subscribers", "1", "--repetitions", "1", "-o", str(rows)],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
    )
    text = rows.read_text()
    records = [json.loads(line) for line in text.splitlines()]
    assert any(r.get("argv") for r in records) and any(r.get("case_id") for r in records)
    assert any(r.get("status") == "ok" for r in records) and any(r.get("status") == "error" for r in records), (
        out.stderr[-2000:]
    )
    no_secret(text, "bench JSONL")
    no_secret(out.stdout + out.stderr, "bench output and warnings")
