"""A FastAPI app serving runstore: the stores live as long as the app, and a run's live
events stream over server-sent events. Run with ``uvicorn fastapi_app:app``.

Settings come from ``runstore.yaml`` and ``RUNSTORE_*`` variables (docs/configuration.md).
"""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException, Request
from sse_starlette import EventSourceResponse

import runstore


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # Opened once at startup, shared by every request; closed (pools, files, the
    # bridge) when the server shuts down, after the last response has finished.
    async with runstore.open() as stores:
        app.state.stores = stores
        yield


app = FastAPI(lifespan=lifespan)


@app.get("/runs/{run_id}/stream")
async def stream_run(run_id: str, request: Request) -> EventSourceResponse:
    stores = request.app.state.stores
    frames = await runstore.open_sse_stream(
        stores.streams,
        run_id,
        runs=stores.runs,
        last_event_id=request.headers.get("last-event-id"),
    )
    if frames is None:
        raise HTTPException(status_code=404, detail=f"no run {run_id!r}")
    # sse-starlette ends the response when the client goes away or the server shuts
    # down; ping=0 because runstore's heartbeats already keep proxies from timing out.
    return EventSourceResponse(frames, ping=0, headers=runstore.SSE_HEADERS)
