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
from runstore.hookspecs import hookimpl


async def _events(url, options):
    from runstore.plugins.sqlite.events import SqliteEventStore

    return await SqliteEventStore.open(replace(url, scheme="sqlite"), options)


async def _streams(url, options):
    from runstore.plugins.redis.streams import RedisStreamBridge

    return await RedisStreamBridge.open(replace(url, scheme="redis"), options)


@hookimpl
def runstore_register_event_stores(registry):
    registry.add("zoo-sqlite", schemes=["zoo-sqlite"], factory=_events,
                 capabilities=["cross_process"], description="sqlite under another name")


@hookimpl
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


# -- an installed distribution with broken bridges: the suite never hangs -------------

#: Stream bridges that make a suite wait forever: a publish that deadlocks (awaiting,
#: or blocking the loop's thread) and followers that heartbeat forever without END.
ZOO_PLUGIN = '''
import asyncio
import os
import threading
from contextlib import asynccontextmanager

import runstore
from runstore.hookspecs import hookimpl
from runstore.plugins.memory.streams import MemoryStreamBridge
from runstore.streams.protocol import HEARTBEAT


class DeadlockBridge(MemoryStreamBridge):
    async def publish(self, run_id, event, data):
        await asyncio.Event().wait()  # a lock nobody releases


class StuckBridge(MemoryStreamBridge):
    async def publish(self, run_id, event, data):
        threading.Event().wait()  # blocks the event loop's thread


class GroupBridge(MemoryStreamBridge):
    async def publish(self, run_id, event, data):
        async with asyncio.TaskGroup() as group:  # the failure arrives inside an ExceptionGroup
            group.create_task(self._send())

    async def _send(self):
        raise ConnectionResetError("zoo: connection reset by peer")


class ChattyBridge(MemoryStreamBridge):
    def subscribe(self, run_id, *, last_event_id=None, heartbeat_interval=None):
        async def beats():
            while True:
                await asyncio.sleep(0.01)
                yield HEARTBEAT
        return beats()


@asynccontextmanager
async def _saver_in_context():
    """A saver that lives inside an async context manager, like AsyncSqliteSaver.from_conn_string."""
    from langgraph.checkpoint.memory import InMemorySaver

    with open(os.environ["ZOO_LOG"], "a") as log:
        log.write("enter\\n")
    try:
        yield InMemorySaver()
    finally:
        with open(os.environ["ZOO_LOG"], "a") as log:
            log.write("exit\\n")


async def _open_saver(url, options):
    return _saver_in_context()


@hookimpl
def runstore_register_savers(registry):
    registry.add("zoosaver", schemes=["zoosaver"], factory=_open_saver, description="in a context")


@hookimpl
def runstore_register_stream_bridges(registry):
    for name, cls in [("zoodeadlock", DeadlockBridge), ("zoostuck", StuckBridge),
                      ("zoochatty", ChattyBridge), ("zoogroup", GroupBridge)]:
        # Named, not passed: runstore imports runstore_zoo:<Class>.open on first open.
        registry.add(name, schemes=[name], factory=f"runstore_zoo:{cls.__name__}.open",
                     capabilities=["replay"], description=name)
'''


@pytest.fixture
def zoo_site(tmp_path: Path) -> Path:
    """A distribution ``runstore-zoo`` installed as a dist-info directory with an entry point."""
    site = tmp_path / "site"
    info = site / "runstore_zoo-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: runstore-zoo\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[runstore]\nzoo = runstore_zoo\n")
    (site / "runstore_zoo.py").write_text(textwrap.dedent(ZOO_PLUGIN))
    return site


def _zoo_env(site: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(site), "RUNSTORE_CONFORMANCE_WAIT": "1"}


def test_a_bridge_that_deadlocks_or_chatters_fails_by_name_instead_of_hanging(
    zoo_site: Path, tmp_path: Path
) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "runstore", "check", "zoodeadlock://", "zoostuck://", "zoochatty://",
         "-k", "ids_increase or stream_exists_and_cleanup", "--timeout", "3", "--json"],
        cwd=tmp_path, env=_zoo_env(zoo_site), capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads(out.stdout)
    messages = {
        name.split(":", 1)[-1]: [f["message"] for s in row["suites"].values() for f in s["failures"]]
        for name, row in report["backends"].items()
    }
    assert set(messages) >= {"zoodeadlock", "zoostuck", "zoochatty"}, report
    for name in ("zoodeadlock", "zoostuck"):
        assert len(messages[name]) == 2, messages[name]
        for message in messages[name]:
            # The headline names the contract and the call that never returned.
            assert "contract: every streams backend call returns" in message, message
            assert "Bridge.publish (runstore_zoo.py:" in message, message
            assert "--runstore-timeout" in message, message
    assert len(messages["zoochatty"]) == 2, messages["zoochatty"]
    for message in messages["zoochatty"]:
        # Heartbeats do not restart the wait: the suite's own wait names its contract.
        assert "contract: " in message and "heartbeats arrived within 1.0s" in message, message


def test_the_bound_is_a_pyproject_setting(zoo_site: Path, tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.runstore.conformance]\nbackends = ["zoodeadlock://"]\ntimeout = 2\n'
    )
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "runstore.conformance.test_streams",
         "-p", "no:cacheprovider", "-q", "-k", "ids_increase"],
        cwd=tmp_path, env=_zoo_env(zoo_site), capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert "ContractTimeout: contract: every streams backend call returns" in out.stdout, out.stdout[-3000:]
    assert "when the test's 2s bound ran out" in out.stdout, out.stdout[-3000:]

    (tmp_path / "pyproject.toml").write_text('[tool.runstore.conformance]\ntimeout = "soon"\n')
    bad = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "runstore.conformance.test_streams",
         "-p", "no:cacheprovider", "-q", "--runstore-backend", "memory://"],
        cwd=tmp_path, env=_zoo_env(zoo_site), capture_output=True, text=True, timeout=600,
    )
    assert bad.returncode == pytest.ExitCode.USAGE_ERROR, bad.stderr
    assert "timeout is a number of seconds >= 0 (0 = none); got 'soon'" in bad.stderr


def test_the_harness_enters_and_exits_a_saver_factory_s_context_manager(
    zoo_site: Path, tmp_path: Path
) -> None:
    """One lifecycle for every kind, in runstore.open and in the suite: no on_close by hand."""
    log = tmp_path / "lifecycle.log"
    env = {**_zoo_env(zoo_site), "ZOO_LOG": str(log)}
    code = textwrap.dedent(
        """
        import asyncio, runstore
        async def main():
            async with runstore.open(checkpointer="zoosaver://", events="memory://") as stores:
                print(type(stores.checkpointer).__name__)
        asyncio.run(main())
        """
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["InMemorySaver"]
    assert log.read_text().split() == ["enter", "exit"]

    log.unlink()
    suite = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "runstore.conformance.test_savers",
         "-p", "no:cacheprovider", "-q", "--runstore-backend", "zoosaver://", "-k", "roundtrip"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )
    assert suite.returncode == 0, suite.stdout[-3000:] + suite.stderr[-2000:]
    events = log.read_text().split()
    assert events and events.count("enter") == events.count("exit"), events
    assert events == ["enter", "exit"] * (len(events) // 2), "each instance is exited before the next opens"


def test_a_failure_inside_an_exception_group_is_shown_by_its_cause(zoo_site: Path, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "runstore", "check", "zoogroup://", "-k", "ids_increase", "--json"],
        cwd=tmp_path, env=_zoo_env(zoo_site), capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    (row,) = json.loads(out.stdout)["backends"].values()
    (failure,) = [f for suite in row["suites"].values() for f in suite["failures"]]
    headline, _, note = failure["message"].partition("\n")
    assert headline == "ConnectionResetError: zoo: connection reset by peer", failure["message"]
    assert note.startswith("(raised inside ExceptionGroup"), failure["message"]
