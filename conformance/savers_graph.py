"""Graph parity: generated turn sequences on a real `StateGraph` in full and delta modes.

The thread-state schemas come from `runstore.checkpoint.modes` (``full``: ``messages``
with `add_messages`; ``delta``: a `DeltaChannel`). The reference is plain folding of
LangGraph's `add_messages` over every batch a turn writes; every saver must make the
graph materialize exactly that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, RemoveMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import REMOVE_ALL_MESSAGES, add_messages

from runstore.checkpoint.modes import get_thread_state_schema, inject_checkpoint_mode

#: Turn kinds: a run (input batch + the agent's reply), a state update, a fork run, a
#: one-time full -> delta switch (only in the ``migrate`` scenario).
OPS = (
    "append", "append", "append", "append", "replace", "remove", "remove_all",
    "update", "update", "fork",
)
SCENARIOS = ("full", "delta", "migrate")
FREQUENCIES = (1, 3, 100)


def agent_reply(messages: Sequence[AnyMessage]) -> list[AnyMessage]:
    """What the graph's only node answers; a pure function of the state it sees."""
    if not messages:
        return [AIMessage("nothing left", id="ai-empty")]
    last = messages[-1]
    return [AIMessage(f"re: {last.content} ({len(messages)})", id=f"ai-{last.id}")]


def _agent(state: Any) -> dict[str, Any]:
    return {"messages": agent_reply(state.get("messages") or [])}


def build_graph(mode: str, frequency: int, saver: Any) -> Any:
    """A one-node chat graph on runstore's thread-state schema for ``mode``."""
    builder: StateGraph[Any] = StateGraph(get_thread_state_schema(mode, frequency))
    builder.add_node("agent", _agent)
    builder.add_edge(START, "agent")
    builder.add_edge("agent", END)
    return builder.compile(checkpointer=saver)


def view(messages: Sequence[Any]) -> list[tuple[str, str | None, Any]]:
    """Comparable form of a message list."""
    return [(m.type, m.id, m.content) for m in messages]


@dataclass
class GraphModel:
    """The reference: the message list at each recorded checkpoint, by id."""

    state: list[AnyMessage] = field(default_factory=list)
    at: dict[str, list[AnyMessage]] = field(default_factory=dict)
    counter: int = 0

    def apply(self, batch: Sequence[AnyMessage | RemoveMessage]) -> None:
        self.state = list(add_messages(self.state, list(batch)))  # type: ignore[arg-type]

    def fresh_id(self) -> str:
        self.counter += 1
        return f"h-{self.counter}"


def input_batch(op: str, model: GraphModel, pick: int) -> list[AnyMessage | RemoveMessage]:
    """The input messages for ``op`` given the model's current state."""
    ids = [m.id for m in model.state if m.id]
    if op == "replace" and ids:
        target = ids[pick % len(ids)]
        return [HumanMessage(f"edited {target} #{model.counter}", id=target)]
    if op == "remove" and ids:
        return [RemoveMessage(id=ids[pick % len(ids)])]
    if op == "remove_all":
        return [RemoveMessage(id=REMOVE_ALL_MESSAGES)]
    new_id = model.fresh_id()
    return [HumanMessage(f"hello {new_id}", id=new_id)]


def scenario_ops() -> st.SearchStrategy[list[tuple[str, int]]]:
    """Turn sequences: (op, a number used to pick ids / fork points). Every sequence
    forks from an older checkpoint at least once, after some history exists."""
    op = st.tuples(st.sampled_from(OPS), st.integers(0, 50))
    return st.builds(
        lambda head, pick, tail: [*head, ("fork", pick), *tail],
        st.lists(op, min_size=2, max_size=4),
        st.integers(0, 50),
        st.lists(op, min_size=1, max_size=4),
    )


def thread_config(thread_id: str, mode: str, checkpoint_id: str | None = None) -> Any:
    configurable: dict[str, Any] = {"thread_id": thread_id}
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return inject_checkpoint_mode({"configurable": configurable}, mode)
