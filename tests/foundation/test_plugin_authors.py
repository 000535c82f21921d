"""What a third-party plugin author runs into, driven through plugins outside runstore:
development plugins (pyproject and ``--runstore-plugin``) reach every process the suite
starts, and worker errors reach the author as their cause."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from runstore import errors

REDIS_URL = os.environ.get("RUNSTORE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

#: A development plugin (not installed): cross-process backends under their own schemes.
DEV_PLUGIN = '''
from dataclasses import replace

import runstore
from runstore.plugins.redis import _open_streams
from runstore.plugins.sqlite import _open_events


async def _events(url, options):
    return await _open_events(replace(url, scheme="sqlite"), options)


async def _streams(url, options):
    return await _open_streams(replace(url, scheme="redis"), options)


@runstore.hookimpl
def runstore_register_event_stores(registry):
    registry.add("zoo-sqlite", schemes=["zoo-sqlite"], factory=_events,
                 capabilities=["cross_process"], description="sqlite under another name")


@runstore.hookimpl
def runstore_register_stream_bridges(registry):
    registry.add("zoo-redis", schemes=["zoo-redis"], factory=_streams,
                 capabilities=["cross_process", "replay"], description="redis under another name")
'''


def _redis_or_skip() -> None:
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.ConnectionError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"Redis at {REDIS_URL} is unreachable ({exc})")


def _drop_prefix(prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(match=f"{prefix}*", count=500))
    if keys:
        client.delete(*keys)


def test_development_plugins_reach_every_process(tmp_path: Path) -> None:
    """The plugin is named in pyproject AND on the command line (loaded once), and the
    event-store race workers and the stream publisher process both open its backends."""
    _redis_or_skip()
    (tmp_path / "zoo_dev.py").write_text(textwrap.dedent(DEV_PLUGIN))
    (tmp_path / "pyproject.toml").write_text('[tool.runstore.conformance]\nplugins = ["zoo_dev.py"]\n')
    prefix = f"zoo-{uuid.uuid4().hex[:12]}:"
    streams_url = REDIS_URL.replace("redis://", "zoo-redis://", 1) + f"?prefix={prefix}"
    events_url = f"zoo-sqlite:///{tmp_path / 'events.db'}"
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "--pyargs", "runstore.conformance.test_events",
             "runstore.conformance.test_streams", "-p", "no:cacheprovider", "-q", "-rA",
             "-k", "race_across_processes or different_processes",
             "--runstore-backend", events_url, "--runstore-backend", streams_url,
             "--runstore-plugin", str(tmp_path / "zoo_dev.py")],
            cwd=tmp_path, capture_output=True, text=True, timeout=600,
        )
    finally:
        _drop_prefix(prefix)
    assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-3000:]
    assert "2 passed" in out.stdout.splitlines()[-1], out.stdout[-3000:]

    # `runstore check` runs the suite elsewhere: a relative plugin file still reaches it.
    checked = subprocess.run(
        [sys.executable, "-m", "runstore", "check", f"events={events_url}", "--plugin", "zoo_dev.py",
         "-k", "race_across_processes", "--json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-3000:]
    assert json.loads(checked.stdout)["ok"] is True


def test_runstore_errors_survive_pickling() -> None:
    """A worker's error crosses the process boundary as itself (not BrokenProcessPool)."""
    samples = [
        errors.BackendNotFoundError("events", "zoo", ["memory"]),
        errors.MissingDriverError("zoo", "zoo_driver", "zoo"),
        errors.BackendUnavailableError("zoo", "put", write_may_have_happened=True),
        errors.CheckpointModeMismatchError("t1"),
        errors.ThreadDeletedError("t1"),
        errors.ConfigError("bad key"),
    ]
    for exc in samples:
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc) and str(back) == str(exc) and vars(back) == vars(exc)


class _Unpicklable(Exception):
    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"a={a} b={b}")


def _raise_unpicklable() -> None:
    raise _Unpicklable(1, 2)


def test_worker_errors_that_cannot_be_pickled_still_name_their_cause() -> None:
    from runstore.conformance.processes import WorkerError, errors_travel

    with pytest.raises(WorkerError, match=r"_Unpicklable: a=1 b=2") as info:
        errors_travel(_raise_unpicklable)()
    pickle.loads(pickle.dumps(info.value))
