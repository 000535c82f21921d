"""The FastAPI recipe of docs/web-apps.md, served by uvicorn in a subprocess.

The app is docs/examples/fastapi_app.py itself (and the page shows that file), on the
shared Redis for streams and a sqlite file for the rest, so this test process publishes
and creates runs the server streams. Checked: a run id that does not exist is a 404;
events then END stream and end the response; a finished run whose stream is gone gets
one ``end`` frame; the server shuts down within seconds while a client follows a live
run (the lifespan closes the stores); a client that goes away closes its subscription.
Bounds are generous: these are behaviours, not timings.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

import runstore
from runstore.urls import BackendURL

from ..faults.servers import OnChosenPorts, free_port

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "docs" / "examples" / "fastapi_app.py"
#: Generous: a shutdown that waits for the stream never ends at all.
SHUTDOWN_BOUND = 20.0
LOG_CONFIG = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(name)s %(levelname)s %(message)s"}},
    "handlers": {"err": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr", "formatter": "plain"}},
    "loggers": {
        "runstore.streams.sse": {"level": "DEBUG", "handlers": ["err"], "propagate": False},
        "uvicorn": {"level": "INFO", "handlers": ["err"], "propagate": False},
    },
}


class Served(OnChosenPorts):
    """uvicorn running the recipe on a free port; its log goes to a file."""

    def __init__(self, tmp: Path, urls: dict[str, str]) -> None:
        self.tmp = tmp
        self.log_path = tmp / "server.log"
        self.config = tmp / "log.json"
        self.config.write_text(json.dumps(LOG_CONFIG))
        self.env = {
            **os.environ,
            "RUNSTORE_CHECKPOINTER_URL": urls["db"],
            "RUNSTORE_EVENTS_URL": urls["db"],
            "RUNSTORE_RUNS_URL": urls["db"],
            "RUNSTORE_STREAMS_URL": urls["streams"],
            "RUNSTORE_STREAM_BRIDGE__HEARTBEAT_INTERVAL_SECONDS": "0.5",
        }
        self._choose_ports = True
        self._repick_ports()
        self._start_on_ports()

    def _repick_ports(self) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"

    def _start(self) -> None:
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "fastapi_app:app", "--app-dir", str(RECIPE.parent),
                 "--host", "127.0.0.1", "--port", str(self.port), "--log-config", str(self.config)],
                cwd=self.tmp, env=self.env, stdout=subprocess.DEVNULL, stderr=log,
            )
        # Logged once the socket is bound; the application's startup is logged before it.
        self.wait_for_log("Uvicorn running on", 60)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log():
            if self.process.poll() is not None:
                raise AssertionError(f"uvicorn exited ({self.process.returncode}):\n{self.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} in the server log within {timeout:g}s:\n{self.log()}")
            time.sleep(0.05)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)


@pytest.fixture
def urls(redis_url: str, tmp_path: Path) -> dict[str, str]:
    prefix = f"{BackendURL.parse(redis_url).option('prefix', '')}web-{uuid.uuid4().hex[:8]}:"
    return {
        "db": BackendURL.for_file("sqlite", tmp_path / "app.db").render(),
        "streams": BackendURL.parse(redis_url).with_query(prefix=prefix).render(hide_password=False),
    }


@pytest.fixture
async def stores(urls: dict[str, str]) -> AsyncIterator[runstore.Stores]:
    async with runstore.open(checkpointer=urls["db"], events=urls["db"], runs=urls["db"],
                             streams=urls["streams"]) as opened:
        yield opened


@pytest.fixture
def server(tmp_path: Path, urls: dict[str, str], stores: runstore.Stores) -> Iterator[Served]:
    # `stores` first: the schema exists before the server opens the same file.
    served = Served(tmp_path, urls)
    try:
        yield served
    finally:
        served.close()


def test_the_page_shows_the_tested_app() -> None:
    page = (ROOT / "docs" / "web-apps.md").read_text()
    assert RECIPE.read_text().strip() in page


async def _frames(response: httpx.Response) -> AsyncIterator[dict[str, str]]:
    """The SSE frames of ``response`` as field maps (a comment is ``{"comment": ...}``)."""
    frame: dict[str, str] = {}
    async for line in response.aiter_lines():
        if not line:
            if frame:
                yield frame
            frame = {}
        elif line.startswith(":"):
            frame["comment"] = line[1:].strip()
        else:
            name, _, value = line.partition(":")
            frame[name] = value.strip()


async def test_unknown_run_is_404(server: Served) -> None:
    async with httpx.AsyncClient(base_url=server.base, timeout=10) as client:
        response = await client.get("/runs/no-such-run/stream")
    assert response.status_code == 404
    assert "no-such-run" in response.text


async def test_events_then_end_then_the_response_ends(server: Served, stores: runstore.Stores) -> None:
    run = (await stores.runs.create("thread-live")).run
    run_id = run["run_id"]
    await stores.streams.publish(run_id, "values", {"n": 1})
    seen: list[dict[str, str]] = []
    async with (
        httpx.AsyncClient(base_url=server.base, timeout=10) as client,
        client.stream("GET", f"/runs/{run_id}/stream") as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        async for frame in _frames(response):
            seen.append(frame)
            if frame.get("event") == "values" and len([f for f in seen if "event" in f]) == 1:
                await stores.streams.publish(run_id, "values", {"n": 2})
                await stores.streams.publish_end(run_id)
    events = [f for f in seen if "event" in f]
    assert [(f["event"], f.get("data")) for f in events] == [
        ("values", '{"n":1}'), ("values", '{"n":2}'), ("end", "null")
    ]


async def test_finished_run_whose_stream_is_gone_gets_one_end_frame(
    server: Served, stores: runstore.Stores
) -> None:
    run_id = (await stores.runs.create("thread-done")).run["run_id"]
    await stores.runs.start(run_id, "worker-1", 60)
    await stores.runs.finalize(run_id, "worker-1", "success")
    assert not await stores.streams.stream_exists(run_id)
    async with httpx.AsyncClient(base_url=server.base, timeout=10) as client:
        response = await client.get(f"/runs/{run_id}/stream")  # ends by itself
    assert response.status_code == 200
    assert "event: end" in response.text and "heartbeat" not in response.text


async def _follow(server: Served, run_id: str, connected: asyncio.Event) -> list[dict[str, str]]:
    seen: list[dict[str, str]] = []
    try:
        async with (
            httpx.AsyncClient(base_url=server.base, timeout=httpx.Timeout(10, read=60)) as client,
            client.stream("GET", f"/runs/{run_id}/stream") as response,
        ):
            async for frame in _frames(response):
                seen.append(frame)
                connected.set()
    except httpx.HTTPError:
        pass  # the server went away mid-stream: also an end of the stream
    return seen


async def test_shutdown_finishes_promptly_while_a_client_follows_a_live_run(
    server: Served, stores: runstore.Stores
) -> None:
    run_id = (await stores.runs.create("thread-shutdown")).run["run_id"]
    await stores.streams.publish(run_id, "values", {"n": 1})  # live: no END ever comes
    connected = asyncio.Event()
    client = asyncio.create_task(_follow(server, run_id, connected))
    await asyncio.wait_for(connected.wait(), 30)
    started = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    while server.process.poll() is None:
        assert time.monotonic() - started < SHUTDOWN_BOUND, (
            f"uvicorn still running {SHUTDOWN_BOUND:g}s after SIGTERM with a client connected:\n{server.log()}"
        )
        await asyncio.sleep(0.05)
    seen = await asyncio.wait_for(client, 10)  # the client's stream ended too
    assert seen and seen[0].get("event") == "values"
    log = server.log()
    assert "Application shutdown complete" in log, log  # the lifespan closed the stores
    assert f"SSE stream of run {run_id} was closed early" in log, log


async def test_client_disconnect_closes_the_subscription(server: Served, stores: runstore.Stores) -> None:
    run_id = (await stores.runs.create("thread-gone")).run["run_id"]
    await stores.streams.publish(run_id, "values", {"n": 1})
    connected = asyncio.Event()
    client = asyncio.create_task(_follow(server, run_id, connected))
    await asyncio.wait_for(connected.wait(), 30)
    client.cancel()  # the client goes away mid-stream
    await asyncio.gather(client, return_exceptions=True)
    await asyncio.to_thread(server.wait_for_log, f"SSE stream of run {run_id} was closed early", 15)
    assert server.process.poll() is None  # the server itself keeps serving
    async with httpx.AsyncClient(base_url=server.base, timeout=10) as http:
        assert (await http.get("/runs/no-such-run/stream")).status_code == 404
