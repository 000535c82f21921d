"""A real LangGraph ``astream`` published through the memory and Redis bridges reaches an
SSE client (runstore.streams.sse, parsed by the LangGraph SDK's own decoder) as the same
frames on both: message chunks, updates, an Interrupt and Pydantic output included.

Before, Redis refused ``AIMessageChunk`` ("Type is not JSON serializable") while memory
took it, so a graph's stream broke when the URL changed.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.types import Command, Interrupt, Send, interrupt
from langgraph_sdk.sse import SSEDecoder
from pydantic import BaseModel

import runstore
from runstore.errors import InvalidStreamInputError
from runstore.streams.protocol import END, check_stream_data
from runstore.streams.sse import sse_frames


class Verdict(BaseModel):
    approved: bool
    note: str


def _graph() -> Any:
    model = GenericFakeChatModel(messages=iter([AIMessage("hello there, friend", id="ai-1")]))

    async def reply(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    def review(state: MessagesState) -> dict[str, Any]:
        interrupt({"question": "approve?", "verdict": Verdict(approved=False, note="pending")})
        return {}

    builder = StateGraph(MessagesState)
    builder.add_node("reply", reply)
    builder.add_node("review", review)
    builder.add_edge(START, "reply")
    builder.add_edge("reply", "review")
    return builder.compile(checkpointer=InMemorySaver())


async def _publish_run_and_read_sse(streams_url: str) -> tuple[list[tuple[str, Any]], list[str]]:
    graph = _graph()
    run_id = f"run-{uuid.uuid4().hex}"
    config = {"configurable": {"thread_id": run_id}}
    kinds: list[str] = []
    async with runstore.open(streams=streams_url) as stores:
        async for mode, chunk in graph.astream(
            {"messages": [HumanMessage("hi", id="h-1")]}, config, stream_mode=["messages", "updates"]
        ):
            kinds.append(type(chunk[0] if mode == "messages" else chunk).__name__)
            await stores.streams.publish(run_id, mode, chunk)
        await stores.streams.publish(run_id, "command", Command(resume="yes", goto=Send("reply", {"n": 1})))
        await stores.streams.publish_end(run_id)
        decoder = SSEDecoder()
        parts: list[tuple[str, Any]] = []
        async for frame in sse_frames(stores.streams.subscribe(run_id)):
            for line in frame.split(b"\n"):
                part = decoder.decode(line)
                if part is not None:
                    parts.append((part.event, part.data))
    return parts, kinds


def _without_run_specific(parts: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Metadata and interrupt ids that differ between two runs of the same graph."""
    out = []
    for event, data in parts:
        if event == "messages":
            data = [data[0], {k: v for k, v in data[1].items() if k in ("langgraph_node", "langgraph_step")}]
        if event == "updates" and "__interrupt__" in data:
            data = {"__interrupt__": [{**i, "id": "-"} for i in data["__interrupt__"]]}
        out.append((event, data))
    return out


@pytest.mark.redis
async def test_langgraph_stream_reaches_sse_clients_alike_on_memory_and_redis(redis_url: str) -> None:
    memory, kinds = await _publish_run_and_read_sse("memory://")
    redis, _ = await _publish_run_and_read_sse(redis_url)
    assert "AIMessageChunk" in kinds and "dict" in kinds
    assert _without_run_specific(memory) == _without_run_specific(redis)
    chunks = [data[0] for event, data in memory if event == "messages"]
    assert chunks and all(c["type"] == "AIMessageChunk" and c["id"] == "ai-1" for c in chunks)
    assert "".join(c["content"] for c in chunks) == "hello there, friend"
    (interrupted,) = [data for event, data in memory if event == "updates" and "__interrupt__" in data]
    (pending,) = interrupted["__interrupt__"]
    assert pending["value"] == {"question": "approve?", "verdict": {"approved": False, "note": "pending"}}
    assert memory[-2] == ("command", {"graph": None, "update": None, "resume": "yes",
                                      "goto": {"node": "reply", "arg": {"n": 1}}})
    assert memory[-1][0] == "end"


def test_the_json_form_of_langgraph_values() -> None:
    chunk = AIMessageChunk("hi", id="c-1")
    assert check_stream_data([chunk, {"k": (1, 2)}])[0] == chunk.model_dump(mode="json")
    pending = check_stream_data(Interrupt(value={"q": 1}, id="i-1"))
    assert (pending["value"], pending["id"]) == ({"q": 1}, "i-1")
    plain = {"a": [1, "x", None, {"b": 2.5}]}
    assert check_stream_data(plain) is plain  # plain data is not copied

    @dataclasses.dataclass
    class Point:
        x: int

    assert check_stream_data({"p": Point(1), "s": {3}}) == {"p": {"x": 1}, "s": [3]}


@pytest.mark.parametrize(
    ("data", "where"),
    [
        ({"a": [object()]}, "data['a'][0] is a builtins.object"),
        ({"a": float("nan")}, "data['a'] is nan"),
        ({1: "x"}, "has the key 1"),
        ({"f": len}, "data['f'] is a builtins.builtin_function_or_method"),
    ],
)
async def test_what_has_no_json_form_is_refused_alike(data: Any, where: str) -> None:
    async with runstore.open(streams="memory://") as stores:
        with pytest.raises(InvalidStreamInputError, match=where.replace("[", r"\[").replace("]", r"\]")):
            await stores.streams.publish("r", "x", data)
        await stores.streams.publish_end("r")
        assert [item async for item in stores.streams.subscribe("r")] == [END]
