"""runstore as the storage of LangGraph's own server, tested as users run it.

Real ``langgraph dev`` subprocesses serve the same graph with the server's default
saver and store, and with runstore's factories (``runstore.agent_server.checkpointer``
on a sqlite file and on the PostgreSQL test server, a schema of its own;
``runstore.agent_server.store`` on the configured store), in full and delta channel
mode. The same ``langgraph_sdk`` script (tests/agent_server/script.py: runs wait and
stream, state, history, fork, interrupt and resume, multitask rollback, copy, delete,
search, the store API, then a restart and more of the same) drives each server, and
every normalized answer of a runstore server must equal the default's.

Every server runs at once (one per backend and mode, restarted once): a run costs the
dev runtime's queue about a second whatever the saver, so running them side by side
keeps the module's wall time near one server's.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("langgraph_api", reason="the agent-server extra is not installed")
pytest.importorskip("langgraph_runtime_inmem", reason="the agent-server extra is not installed")

from runstore.conformance.harness import Provisioned, in_ci
from runstore.urls import BackendURL
from tests.conftest import POSTGRES_URL

from .script import Transcript, after_restart, before_restart
from .server import AgentServer

pytestmark = pytest.mark.timeout(600)

MODES = ("full", "delta")
BACKENDS = ("sqlite", "postgres")


class Served:
    """What one server answered, and how long its starts took."""

    def __init__(self, transcript: Transcript, starts: list[float], error: BaseException | None, log: str) -> None:
        self.transcript = transcript
        self.starts = starts
        self.error = error
        self.log = log


def _drive(server: AgentServer) -> Served:
    out = Transcript()
    try:
        server.start()
        asyncio.run(before_restart(server.url, out))
        server.restart()
        asyncio.run(after_restart(server.url, out))
    except BaseException as exc:  # reported by the test of this server, with its log
        return Served(out, server.starts, exc, server.tail())
    finally:
        server.stop()
    return Served(out, server.starts, None, "")


@pytest.fixture(scope="module")
def postgres_checkpointer_url() -> Iterator[str | None]:
    """A PostgreSQL URL with a fresh schema, or ``None`` when the server is unreachable outside CI."""
    try:
        with Provisioned(BackendURL.parse(POSTGRES_URL)) as provisioned:
            yield provisioned.url.render(hide_password=False)
    except OSError:
        if in_ci():
            raise
        yield None


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, postgres_checkpointer_url: str | None) -> dict[tuple[str, str], Served]:
    """Every server's answers, keyed by (backend, mode); ``default`` is the server's own saver."""
    root: Path = tmp_path_factory.mktemp("agent-server")
    servers: dict[tuple[str, str], AgentServer] = {}
    for mode in MODES:
        # One PostgreSQL schema for both modes: the thread ids never meet.
        urls = {"default": None, "sqlite": f"sqlite:///{root}/{mode}-checkpoints.db", "postgres": postgres_checkpointer_url}
        for backend, url in urls.items():
            if backend != "default" and url is None:
                continue
            env = {"RUNSTORE_CHECKPOINT_CHANNEL_MODE": mode}
            if url is not None:
                env["RUNSTORE_CHECKPOINTER_URL"] = url
            servers[(backend, mode)] = AgentServer(root / f"{backend}-{mode}", runstore=backend != "default", env=env)

    async def all_at_once() -> list[Served]:
        return list(await asyncio.gather(*(asyncio.to_thread(_drive, s) for s in servers.values())))

    began = time.monotonic()
    results = dict(zip(servers, asyncio.run(all_at_once()), strict=True))
    summary = {
        "wall_seconds": round(time.monotonic() - began, 1),
        "starts_seconds": {f"{b}/{m}": [round(s, 2) for s in r.starts] for (b, m), r in results.items()},
    }
    print(f"\nagent-server servers: {json.dumps(summary)}")
    return results


def _served(served: dict[tuple[str, str], Served], backend: str, mode: str) -> Served:
    if (backend, mode) not in served:
        pytest.skip(f"no {backend} server (PostgreSQL unreachable outside CI)")
    result = served[(backend, mode)]
    if result.error is not None:
        pytest.fail(f"{backend}/{mode} server failed: {result.error!r}\n{result.log}")
    return result


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_runstore_answers_like_the_default_saver(served: dict[tuple[str, str], Served], backend: str, mode: str) -> None:
    """Every answer of the script through runstore equals the default saver's, step by step."""
    reference = _served(served, "default", mode).transcript.items
    got = _served(served, backend, mode).transcript.items
    assert [step for step, _ in got] == [step for step, _ in reference]
    for (step, answer), (_, expected) in zip(got, reference, strict=True):
        assert answer == expected, f"{backend}/{mode}: {step!r} differs from the default saver's answer"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_copied_thread_names_itself(served: dict[tuple[str, str], Served], backend: str, mode: str) -> None:
    """The copy's history, filtered by the copy's own thread id, is the whole history."""
    items = dict(_served(served, backend, mode).transcript.items)
    whole = items["copy history"]
    assert whole and items["copy history filtered by its thread_id"] == whole
