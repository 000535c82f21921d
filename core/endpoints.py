"""What a web endpoint calls to serve a run's live events, deciding 404 with the run store.

`open_sse_stream` composes two kinds (the stream bridge and, when given, the run store),
so it lives here rather than in either kind's wing; the SSE encoding itself is
``runstore.streams.sse``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from runstore.runs.protocol import TERMINAL_STATUSES
from runstore.streams.protocol import END
from runstore.streams.sse import Dumps, json_dumps, sse_frame, sse_stream

if TYPE_CHECKING:
    from runstore.runs.protocol import RunStore
    from runstore.streams.protocol import StreamBridge

log = logging.getLogger("runstore.streams.sse")


async def open_sse_stream(
    bridge: StreamBridge,
    run_id: str,
    *,
    runs: RunStore | None = None,
    last_event_id: str | None = None,
    heartbeat_interval: float | None = None,
    dumps: Dumps = json_dumps,
    retry_ms: int | None = None,
) -> AsyncIterator[bytes] | None:
    """`sse_stream` for an endpoint: ``None`` when there is no run ``run_id`` (answer 404).

    With ``runs`` (the run store) a run exists when it has a record: one created but not
    publishing yet streams heartbeats until its first event, and one that finished
    after its live stream was removed (the late-subscriber window is over) gets a single
    ``event: end`` frame, then the response ends: its events are in the run event store.
    Without ``runs`` a run exists while its stream does (`StreamBridge.stream_exists`),
    so a run that has not published yet is not found.
    """
    if runs is not None:
        record = await runs.get(run_id)
        if record is None:
            return None
        if record["status"] in TERMINAL_STATUSES and not await bridge.stream_exists(run_id):
            log.debug("SSE stream of run %s: finished and its stream is gone; sending end", run_id)
            return _finished()
    elif not await bridge.stream_exists(run_id):
        return None
    return sse_stream(
        bridge, run_id, last_event_id=last_event_id, heartbeat_interval=heartbeat_interval,
        dumps=dumps, retry_ms=retry_ms,
    )


async def _finished() -> AsyncIterator[bytes]:
    yield sse_frame(END)
