"""The graph the Agent Server tests serve (copied into each server's project directory).

Its state schema follows the configured channel mode (``RUNSTORE_CHECKPOINT_CHANNEL_MODE``),
as an application's graph does. ``ask ...`` interrupts, ``slow ...`` sleeps (a run a
second one can roll back), anything else is echoed with the message count.
"""

import asyncio

from langchain_core.messages import AIMessage
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

import runstore

State = runstore.get_thread_state_schema()


async def agent(state: dict) -> dict:
    text = str(state["messages"][-1].content)
    if text.startswith("slow"):
        await asyncio.sleep(3)
    if text.startswith("ask"):
        answer = interrupt({"question": text})
        return {"messages": [AIMessage(content=f"answer:{answer}")]}
    return {"messages": [AIMessage(content=f"echo:{text}:{len(state['messages'])}")]}


builder = StateGraph(State)
builder.add_node("agent", agent)
builder.add_edge(START, "agent")
builder.add_edge("agent", END)
graph = builder.compile()
