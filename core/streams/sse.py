"""Server-sent events: serve a run's stream as ``text/event-stream``.

FastAPI / Starlette (docs/web-apps.md has the whole app, with its lifespan)::

    frames = await open_sse_stream(stores.streams, run_id, runs=stores.runs,
                                   last_event_id=request.headers.get("last-event-id"))
    if frames is None:
        raise HTTPException(404)
    return EventSourceResponse(frames, ping=0, headers=SSE_HEADERS)  # sse-starlette

Frames: an event is ``id:`` + ``event:`` + ``data:`` (JSON); a heartbeat is the
comment line ``: heartbeat`` (keeps proxies from closing an idle connection, ignored
by EventSource); a gap is ``event: gap`` whose JSON data carries the window bounds
and a recovery hint; END is ``event: end``. After ``end`` or ``gap`` the response
ends. A browser EventSource reconnects by itself, so a client should ``close()`` on
``end`` and ``gap``; reconnecting with ``Last-Event-ID`` resumes after that id.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Final

import orjson

from runstore.streams.protocol import END, HEARTBEAT, StreamEvent, StreamGap, StreamItem

if TYPE_CHECKING:
    from runstore.streams.protocol import StreamBridge

log = logging.getLogger(__name__)

#: The media type of an SSE response.
SSE_MEDIA_TYPE: Final = "text/event-stream"
#: Response headers that keep caches and buffering proxies (nginx) out of the way.
SSE_HEADERS: Final[dict[str, str]] = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
#: What a client should do after an ``event: gap`` frame.
GAP_RECOVERY_HINT: Final = (
    "events after requested_event_id were evicted from the live stream: reload the run's "
    "history from the run event store, then reconnect without Last-Event-ID to follow live"
)

Dumps = Callable[[Any], bytes | str]


def _default(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    raise TypeError(f"{type(value).__name__} is not JSON serializable; pass dumps= to the SSE helper")


def json_dumps(value: Any) -> bytes:
    """The default data encoder: orjson, plus pydantic models through ``model_dump``."""
    return orjson.dumps(value, default=_default)


def _field(value: str) -> str:
    # A line break would end the field (or the frame) early; the spec forbids NUL in ids.
    return value.replace("\r", " ").replace("\n", " ").replace("\0", "")


def format_sse(
    *,
    data: str | bytes | None = None,
    event: str | None = None,
    id: str | None = None,
    comment: str | None = None,
    retry_ms: int | None = None,
) -> bytes:
    """Encode one SSE frame; multi-line ``data`` becomes several ``data:`` lines."""
    lines: list[str] = []
    if comment is not None:
        lines.extend(f": {line}" for line in comment.splitlines() or [""])
    if retry_ms is not None:
        lines.append(f"retry: {int(retry_ms)}")
    if id is not None:
        lines.append(f"id: {_field(id)}")
    if event is not None:
        lines.append(f"event: {_field(event)}")
    if data is not None:
        text = data.decode() if isinstance(data, bytes) else data
        lines.extend(f"data: {line}" for line in text.replace("\r\n", "\n").split("\n"))
    return ("\n".join(lines) + "\n\n").encode()


def sse_frame(item: StreamItem, *, dumps: Dumps = json_dumps) -> bytes:
    """The SSE frame of one stream item (event, heartbeat, gap or END)."""
    if item is HEARTBEAT:
        return format_sse(comment="heartbeat")
    if item is END:
        return format_sse(event="end", data="null")
    if isinstance(item, StreamGap):
        payload = {
            "requested_event_id": item.requested_event_id,
            "earliest_available_event_id": item.earliest_available_event_id,
            "latest_available_event_id": item.latest_available_event_id,
            "recovery": GAP_RECOVERY_HINT,
        }
        return format_sse(event="gap", data=orjson.dumps(payload))
    if isinstance(item, StreamEvent):
        return format_sse(id=item.id, event=item.event, data=dumps(item.data))
    raise TypeError(f"not a stream item: {item!r}")


async def sse_frames(
    items: AsyncIterable[StreamItem],
    *,
    dumps: Dumps = json_dumps,
    retry_ms: int | None = None,
) -> AsyncIterator[bytes]:
    """Turn stream items into SSE frames; the subscription is closed when the response is."""
    try:
        if retry_ms is not None:
            yield format_sse(retry_ms=retry_ms)
        async for item in items:
            yield sse_frame(item, dumps=dumps)
    finally:
        aclose = getattr(items, "aclose", None)
        if aclose is not None:
            await aclose()


def sse_stream(
    bridge: StreamBridge,
    run_id: str,
    *,
    last_event_id: str | None = None,
    heartbeat_interval: float | None = None,
    dumps: Dumps = json_dumps,
    retry_ms: int | None = None,
) -> AsyncIterator[bytes]:
    """Subscribe to ``run_id`` (resuming after ``last_event_id``) and yield SSE frames.

    Pass the request's ``Last-Event-ID`` header as ``last_event_id`` so a reconnecting
    client resumes where it left off.
    """
    subscription = bridge.subscribe(
        run_id, last_event_id=last_event_id or None, heartbeat_interval=heartbeat_interval
    )
    return _logged(sse_frames(subscription, dumps=dumps, retry_ms=retry_ms), run_id)






async def _logged(frames: AsyncIterator[bytes], run_id: str) -> AsyncIterator[bytes]:
    """``frames``, logging (DEBUG) how the stream ended: by END or a gap, or cut short by the
    client going away or the server stopping (the subscription is closed either way)."""
    how = "was closed early (client gone or server stopping)"
    try:
        async for frame in frames:
            yield frame
        how = "ended"
    finally:
        try:
            await frames.aclose()  # type: ignore[attr-defined]
        finally:
            log.debug("SSE stream of run %s %s", run_id, how)
