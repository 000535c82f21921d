"""The SSE helper: frame encoding, and a real ASGI app (starlette on uvicorn) read by httpx."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

import runstore
from runstore import END, HEARTBEAT, StreamEvent
from runstore.plugins.memory.streams import MemoryStreamBridge
from runstore.streams.protocol import StreamGap
from runstore.streams.sse import GAP_RECOVERY_HINT, format_sse, sse_frame, sse_frames

WAIT = 10.0

# -- frames ---------------------------------------------------------------------------


def test_event_frame_has_id_event_and_json_data() -> None:
    frame = sse_frame(StreamEvent("0-7", "values", {"a": [1, "x"]}))
    assert frame == b'id: 0-7\nevent: values\ndata: {"a":[1,"x"]}\n\n'


def test_heartbeat_is_a_comment_line() -> None:
    assert sse_frame(HEARTBEAT) == b": heartbeat\n\n"


def test_end_frame() -> None:
    assert sse_frame(END) == b"event: end\ndata: null\n\n"


def test_gap_frame_carries_bounds_and_recovery_hint() -> None:
    frame = sse_frame(StreamGap("0-1", "0-5", "0-9")).decode()
    lines = frame.strip("\n").split("\n")
    assert lines[0] == "event: gap" and not any(line.startswith("id:") for line in lines)
    payload = json.loads(lines[1].removeprefix("data: "))
    assert payload == {
        "requested_event_id": "0-1",
        "earliest_available_event_id": "0-5",
        "latest_available_event_id": "0-9",
        "recovery": GAP_RECOVERY_HINT,
    }


def test_multiline_data_and_unsafe_fields() -> None:
    frame = sse_frame(StreamEvent("0-1", "bad\nname", "x"), dumps=lambda d: "line1\nline2")
    assert frame == b"id: 0-1\nevent: bad name\ndata: line1\ndata: line2\n\n"
    assert format_sse(retry_ms=1500) == b"retry: 1500\n\n"


def test_pydantic_like_data_is_dumped() -> None:
    class Model:
        def model_dump(self, mode: str) -> dict[str, Any]:
            return {"mode": mode}

    assert sse_frame(StreamEvent("0-1", "m", Model())).endswith(b'data: {"mode":"json"}\n\n')
    with pytest.raises(TypeError, match="JSON serializable"):
        sse_frame(StreamEvent("0-1", "m", object()))


async def test_frames_close_the_subscription() -> None:
    bridge = MemoryStreamBridge(heartbeat_interval=0.01)
    sub = bridge.subscribe("r")
    frames = sse_frames(sub, retry_ms=10)
    assert await anext(frames) == b"retry: 10\n\n"
    assert await anext(frames) == b": heartbeat\n\n"
    await frames.aclose()
    assert "r" not in bridge._runs, "closing the response unsubscribes"


def test_exported_from_runstore() -> None:
    assert runstore.sse_stream is not None and runstore.SSE_MEDIA_TYPE == "text/event-stream"
    assert runstore.SSE_HEADERS["Cache-Control"] == "no-cache"


# -- a real server --------------------------------------------------------------------


def make_app(bridge: runstore.StreamBridge) -> Starlette:
    async def run_stream(request: Request) -> StreamingResponse:
        # The three lines the docs promise (plus an optional heartbeat query parameter).
        hb = request.query_params.get("heartbeat")
        frames = runstore.sse_stream(
            bridge,
            request.path_params["run_id"],
            last_event_id=request.headers.get("last-event-id"),
            heartbeat_interval=float(hb) if hb else None,
        )
        return StreamingResponse(frames, media_type=runstore.SSE_MEDIA_TYPE, headers=runstore.SSE_HEADERS)

    return Starlette(routes=[Route("/runs/{run_id}/stream", run_stream)])


@pytest.fixture
async def bridge() -> AsyncIterator[MemoryStreamBridge]:
    bridge = MemoryStreamBridge(queue_maxsize=4, heartbeat_interval=30)
    yield bridge
    await bridge.close()


@pytest.fixture
async def base_url(bridge: MemoryStreamBridge) -> AsyncIterator[str]:
    async with serve(bridge) as url:
        yield url


@contextlib.asynccontextmanager
async def serve(bridge: runstore.StreamBridge) -> AsyncIterator[str]:
    """Run the app on uvicorn (a real HTTP server) on a free port; yield its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(make_app(bridge), log_level="warning", lifespan="off",
                            timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    for _ in range(500):
        if server.started:
            break
        await asyncio.sleep(0.01)
    assert server.started, "uvicorn did not start"
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    await asyncio.wait_for(task, WAIT)


@dataclass
class Frame:
    event: str | None = None
    id: str | None = None
    data: list[str] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)

    @property
    def json(self) -> Any:
        return json.loads("\n".join(self.data))


async def frames(response: httpx.Response) -> AsyncIterator[Frame]:
    """Parse an SSE body as a client would (only what our server sends)."""
    frame = Frame()
    async for line in response.aiter_lines():
        if line == "":
            yield frame
            frame = Frame()
        elif line.startswith(":"):
            frame.comments.append(line[1:].strip())
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "data":
                frame.data.append(value)
            elif name in ("event", "id"):
                setattr(frame, name, value)


async def read(it: AsyncIterator[Frame]) -> Frame:
    return await asyncio.wait_for(anext(it), WAIT)


async def test_stream_events_then_end(bridge: MemoryStreamBridge, base_url: str) -> None:
    ids = [await bridge.publish("r1", "values", {"i": i}) for i in range(3)]
    async with httpx.AsyncClient(timeout=WAIT) as client, client.stream(
        "GET", f"{base_url}/runs/r1/stream"
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        it = frames(response)
        got = [await read(it) for _ in range(3)]
        assert [(f.id, f.event, f.json) for f in got] == [
            (ids[i], "values", {"i": i}) for i in range(3)
        ]
        # Live: published after the client connected.
        live_id = await bridge.publish("r1", "messages", ["hi"])
        live = await read(it)
        assert (live.id, live.event, live.json) == (live_id, "messages", ["hi"])
        await bridge.publish_end("r1")
        end = await read(it)
        assert end.event == "end" and end.id is None
        with pytest.raises(StopAsyncIteration):
            await read(it)  # the response ends after END


async def test_heartbeat_comment_when_idle(bridge: MemoryStreamBridge, base_url: str) -> None:
    async with httpx.AsyncClient(timeout=WAIT) as client, client.stream(
        "GET", f"{base_url}/runs/idle/stream?heartbeat=0.05"
    ) as response:
        it = frames(response)
        first = await read(it)
        assert first.comments == ["heartbeat"] and first.event is None and not first.data
        await bridge.publish("idle", "values", 1)
        while (frame := await read(it)).comments:
            pass
        assert frame.event == "values" and frame.json == 1


async def test_reconnect_with_last_event_id(bridge: MemoryStreamBridge, base_url: str) -> None:
    ids = [await bridge.publish("r2", "values", i) for i in range(3)]
    url = f"{base_url}/runs/r2/stream"
    async with httpx.AsyncClient(timeout=WAIT) as client:
        async with client.stream("GET", url) as response:
            it = frames(response)
            seen = [await read(it), await read(it)]
        assert [f.id for f in seen] == ids[:2]
        # Disconnected: the run goes on.
        ids.append(await bridge.publish("r2", "values", 3))
        async with client.stream("GET", url, headers={"Last-Event-ID": seen[-1].id or ""}) as response:
            it = frames(response)
            resumed = [await read(it), await read(it)]
            assert [(f.id, f.json) for f in resumed] == [(ids[2], 2), (ids[3], 3)], (
                "reconnecting with Last-Event-ID resumes right after it"
            )
            await bridge.publish_end("r2")
            assert (await read(it)).event == "end"


async def test_gap_frame_when_cursor_was_evicted(bridge: MemoryStreamBridge, base_url: str) -> None:
    ids = [await bridge.publish("r3", "values", i) for i in range(10)]  # keeps the last 4
    async with httpx.AsyncClient(timeout=WAIT) as client, client.stream(
        "GET", f"{base_url}/runs/r3/stream", headers={"Last-Event-ID": ids[1]}
    ) as response:
        it = frames(response)
        gap = await read(it)
        assert gap.event == "gap" and gap.id is None
        assert gap.json["requested_event_id"] == ids[1]
        assert gap.json["earliest_available_event_id"] == ids[6]
        assert gap.json["latest_available_event_id"] == ids[9]
        assert "event store" in gap.json["recovery"]
        with pytest.raises(StopAsyncIteration):
            await read(it)


async def test_client_disconnect_unsubscribes(bridge: MemoryStreamBridge, base_url: str) -> None:
    await bridge.publish("r4", "values", 0)
    async with httpx.AsyncClient(timeout=WAIT) as client, client.stream(
        "GET", f"{base_url}/runs/r4/stream?heartbeat=0.05"
    ) as response:
        it = frames(response)
        await read(it)
        assert bridge._runs["r4"].subscribers == 1
    for _ in range(200):
        if bridge._runs["r4"].subscribers == 0:
            break
        await asyncio.sleep(0.05)
    assert bridge._runs["r4"].subscribers == 0, "a closed connection ends its subscription"


@pytest.mark.redis
async def test_reconnect_to_another_server_process_with_redis(redis_url: str) -> None:
    """Two servers on two Redis bridge instances: a client resumes on the other one."""
    from runstore.options import BackendOptions
    from runstore.plugins.redis.streams import RedisStreamBridge
    from runstore.urls import BackendURL

    async with BackendOptions.scope() as options:
        url = BackendURL.parse(redis_url)
        first = await RedisStreamBridge.open(url, options)
        second = await RedisStreamBridge.open(url, options)
        options.on_close(first.close)
        options.on_close(second.close)
        ids = [await first.publish("xr", "values", i) for i in range(3)]
        async with serve(first) as url_a, serve(second) as url_b, httpx.AsyncClient(timeout=WAIT) as client:
            async with client.stream("GET", f"{url_a}/runs/xr/stream") as response:
                it = frames(response)
                seen = [await read(it), await read(it)]
            ids.append(await first.publish("xr", "values", 3))
            headers = {"Last-Event-ID": seen[-1].id or ""}
            async with client.stream("GET", f"{url_b}/runs/xr/stream", headers=headers) as response:
                it = frames(response)
                resumed = [await read(it), await read(it)]
                assert [(f.id, f.json) for f in resumed] == [(ids[2], 2), (ids[3], 3)]
                await first.publish_end("xr")
                assert (await read(it)).event == "end"


# -- open_sse_stream: which runs exist -------------------------------------------------


async def _first_frames(frames: AsyncIterator[bytes], count: int) -> list[bytes]:
    out = []
    try:
        async with asyncio.timeout(WAIT):
            async for frame in frames:
                out.append(frame)
                if len(out) == count:
                    break
    finally:
        await frames.aclose()  # type: ignore[attr-defined]
    return out


async def test_open_sse_stream_knows_runs_from_the_run_store() -> None:
    from runstore.plugins.memory.runs import MemoryRunStore

    bridge = MemoryStreamBridge(heartbeat_interval=0.05)
    runs = MemoryRunStore()
    try:
        assert await runstore.open_sse_stream(bridge, "no-such-run", runs=runs) is None
        pending = (await runs.create("t-pending")).run["run_id"]
        frames = await runstore.open_sse_stream(bridge, pending, runs=runs)
        assert frames is not None  # exists, not publishing yet: heartbeats until it does
        assert await _first_frames(frames, 1) == [sse_frame(HEARTBEAT)]
        done = (await runs.create("t-done")).run["run_id"]
        await runs.start(done, "w", 60)
        await runs.finalize(done, "w", "success")
        frames = await runstore.open_sse_stream(bridge, done, runs=runs)
        assert frames is not None
        assert [frame async for frame in frames] == [sse_frame(END)]  # not heartbeats forever
    finally:
        await bridge.close()
        await runs.close()


async def test_open_sse_stream_without_a_run_store_knows_runs_by_their_stream() -> None:
    bridge = MemoryStreamBridge(heartbeat_interval=0.05)
    try:
        assert await runstore.open_sse_stream(bridge, "r1") is None
        await bridge.publish("r1", "values", {"n": 1})
        frames = await runstore.open_sse_stream(bridge, "r1")
        assert frames is not None
        assert await _first_frames(frames, 1) == [sse_frame(StreamEvent("0-1", "values", {"n": 1}))]
    finally:
        await bridge.close()
