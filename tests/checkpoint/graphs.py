"""A tiny chat graph in either mode, shared by the checkpoint tests."""

from __future__ import annotations

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
