"""Tiny chat graphs in either mode, shared by the tests."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from runstore.checkpoint.modes import get_thread_state_schema, inject_checkpoint_mode


class Middleware(TypedDict, total=False):
    """An extra schema a runtime's middleware adds (declares messages the full way)."""

    messages: Annotated[list, add_messages]
    todos: list[str]


def _agent(state: dict[str, Any]) -> dict[str, Any]:
    last = state["messages"][-1]
    return {
        "messages": [AIMessage(f"answer to {last.content}", id=f"ai-{last.id}")],
        "todos": [*state.get("todos", []), f"t{len(state['messages'])}"],
    }


def chat_builder(mode: str, frequency: int = 3) -> StateGraph:
    schema = get_thread_state_schema(mode, frequency, extra_schemas=[Middleware])
    builder = StateGraph(schema)
    builder.add_node("agent", _agent)
    builder.add_edge(START, "agent")
    builder.add_edge("agent", END)
    return builder


def thread(thread_id: str, mode: str) -> dict[str, Any]:
    return inject_checkpoint_mode({"configurable": {"thread_id": thread_id}}, mode)


async def turn(graph: Any, config: dict[str, Any], text: str) -> None:
    await graph.ainvoke({"messages": [HumanMessage(text, id=f"h-{text}")]}, config)


def contents(snapshot: Any) -> list[str]:
    return [m.content for m in snapshot.values.get("messages", [])]


def _reply(state: dict[str, Any]) -> dict[str, Any]:
    last = state["messages"][-1]
    return {"messages": [AIMessage(f"you said: {last.content}", id=f"ai-{last.id}")]}


async def chat_turns(
    saver: Any, thread_id: str, texts: Iterable[str], mode: str = "full", frequency: int = 3
) -> list[str]:
    """Send each of ``texts`` as a turn of a one-node graph on ``saver`` that answers
    ``you said: <text>``; answer the thread's message contents after the last turn."""
    builder = StateGraph(get_thread_state_schema(mode, frequency))
    builder.add_node("reply", _reply)
    builder.add_edge(START, "reply")
    graph = builder.compile(checkpointer=saver)
    cfg = {"configurable": {"thread_id": thread_id}}
    for text in texts:
        await graph.ainvoke({"messages": [HumanMessage(text, id=f"{thread_id}-{text}")]}, cfg)
    return [m.content for m in (await graph.aget_state(cfg)).values["messages"]]
