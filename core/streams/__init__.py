"""The stream bridge wing: the protocol of live run streams, and server-sent events.

``protocol`` holds `StreamBridge` and its events; ``sse`` turns a stream into SSE frames.
"""

from __future__ import annotations

from runstore.moved import moved_attribute
from runstore.streams.protocol import (
    END,
    HEARTBEAT,
    Notifier,
    Poll,
    StreamBridge,
    StreamEvent,
    StreamGap,
    StreamItem,
    check_event,
    check_run_id,
    check_stream_data,
    format_event_id,
    heartbeat_loop,
    parse_event_id,
    resolve_heartbeat,
)

__getattr__ = moved_attribute(
    __name__, {"StreamEndedError": "runstore.errors", "InvalidStreamInputError": "runstore.errors"}
)

__all__ = [
    "END",
    "HEARTBEAT",
    "Notifier",
    "Poll",
    "StreamBridge",
    "StreamEvent",
    "StreamGap",
    "StreamItem",
    "check_event",
    "check_run_id",
    "check_stream_data",
    "format_event_id",
    "heartbeat_loop",
    "parse_event_id",
    "resolve_heartbeat",
]
