"""Stream data, the one JSON form (docs/streams.md "Data and arguments"): a subscriber
gets what LangGraph streams emit (messages, Interrupt, dataclasses, named tuples, sets,
datetimes, UUIDs, Decimals, Enums, exceptions) as the JSON values the LangGraph SDK
uses, on every bridge, and data with no JSON form is refused with nothing published.
A bridge that stores the objects it was given (pickle, or an in-process buffer) passes
every other stream test and fails here.
"""

from __future__ import annotations

import enum
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, NamedTuple

from langchain_core.messages import AIMessageChunk
from langgraph.types import Interrupt

from runstore.errors import InvalidStreamInputError
from runstore.streams.protocol import END, StreamBridge, StreamEvent

from .test_streams import drain, new_run


class _Color(enum.Enum):
    RED = "red"


class _Point(NamedTuple):
    x: int
    y: int


def _payload() -> tuple[dict[str, Any], dict[str, Any]]:
    """Data as LangGraph code publishes it, and the JSON form every subscriber must get."""
    chunk = AIMessageChunk(content="hi", id="m1")
    when = datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    ident = uuid.UUID("12345678-1234-5678-1234-567812345678")
    data = {
        "messages": [chunk],
        "interrupt": Interrupt(value={"ask": "ok?"}, id="i1"),
        "point": _Point(1, 2),
        "tags": {"only"},
        "when": when,
        "id": ident,
        "price": Decimal("1.50"),
        "color": _Color.RED,
        "error": ValueError("bad"),
    }
    expected = {
        "messages": [chunk.model_dump(mode="json")],
        "interrupt": {"value": {"ask": "ok?"}, "id": "i1", "response_schema": None},
        "point": {"x": 1, "y": 2},
        "tags": ["only"],
        "when": when.isoformat(),
        "id": str(ident),
        "price": "1.50",
        "color": "red",
        "error": {"error": "ValueError", "message": "bad"},
    }
    return data, expected


def test_data_arrives_in_one_json_form(streams_target: Any) -> None:
    """Every subscriber, live and replaying, gets the JSON form, not the objects published."""

    async def body(bridge: StreamBridge) -> None:
        run_id = new_run()
        data, expected = _payload()
        live = bridge.subscribe(run_id, heartbeat_interval=0.05)
        event_id = await bridge.publish(run_id, "updates", data)
        await bridge.publish_end(run_id)
        contract = ("contract: stream data arrives in one JSON form on every bridge (messages as "
                    "model_dump(mode='json'), dataclasses and named tuples as dicts, sets as lists, "
                    "datetimes, UUIDs and Decimals as text, Enums as their value)")
        for sub, how in ((live, "a live subscriber"), (bridge.subscribe(run_id), "a replaying subscriber")):
            got = await drain(sub, f"{how} gets the event and END")
            assert got == [StreamEvent(event_id, "updates", expected), END], f"{contract}; {how} got {got}"

    streams_target.run(body)


def test_data_with_no_json_form_is_refused_naming_where(streams_target: Any) -> None:
    """An arbitrary object or a dict key that is not a string is an `InvalidStreamInputError`
    naming where it sits, and nothing is published."""

    async def body(bridge: StreamBridge) -> None:
        run_id = new_run()
        first = await bridge.publish(run_id, "values", {"i": 0})
        contract = "contract: data with no JSON form is an InvalidStreamInputError naming where it sits"
        for bad, where in (({"a": [1, object()]}, "data['a'][1]"), ({"a": {1: "x"}}, "data['a']")):
            try:
                await bridge.publish(run_id, "values", bad)
            except InvalidStreamInputError as exc:
                assert where in str(exc), f"{contract} ({where}); the error said: {exc}"
            else:
                raise AssertionError(f"{contract} ({bad!r} was published)")
        await bridge.publish_end(run_id)
        got = await drain(bridge.subscribe(run_id), "only the valid event, then END")
        assert got == [StreamEvent(first, "values", {"i": 0}), END], (
            f"contract: data refused for having no JSON form publishes nothing; got {got}"
        )

    streams_target.run(body)
