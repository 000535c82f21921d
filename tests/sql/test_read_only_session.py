"""Stores opened on a read-only PostgreSQL session (what a standby enforces), as docs/scaling.md
describes for history reads on a replica: opening runs no DDL, reads answer, writes fail
and change nothing."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import START, StateGraph

import runstore
from runstore.errors import BackendRefusedError
from runstore.plugins.postgres.events import PostgresEventStore
from runstore.plugins.postgres.runs import PostgresRunStore
from runstore.plugins.postgres.saver import PostgresSaver
from runstore.urls import BackendURL

pytestmark = pytest.mark.postgres


@pytest.fixture(autouse=True)
def _a_password_that_is_a_word() -> None:
    """The messages asserted below say "read-only transaction": a password ``only`` parsed
    earlier in the process (by any test) must leave them as they are."""
    BackendURL.parse("postgresql://u:only@h/db")


def _reply(state: dict[str, Any]) -> dict[str, Any]:
    return {"messages": [AIMessage("hello", id="ai-1")]}


def _refused_as_read_only(error: BackendRefusedError) -> None:
    """A refused write is a runstore error naming the store and the server's code, the
    driver's error as its cause."""
    assert error.code == "25006", error.code  # read_only_sql_transaction
    assert error.backend.startswith("postgres") and "nothing was written" in str(error)
    assert type(error.__cause__).__name__ == "ReadOnlySQLTransactionError", repr(error.__cause__)


async def test_stores_on_a_read_only_session_read_and_refuse_writes(postgres_url: str) -> None:
    builder = StateGraph(runstore.get_thread_state_schema("full"))
    builder.add_node("reply", _reply)
    builder.add_edge(START, "reply")
    cfg = {"configurable": {"thread_id": "t1"}}
    async with PostgresSaver.from_conn_string(postgres_url) as saver:
        await saver.setup()
        await builder.compile(checkpointer=saver).ainvoke({"messages": [HumanMessage("hi", id="h1")]}, cfg)
    async with PostgresEventStore.from_conn_string(postgres_url) as events:
        await events.setup()
        await events.put(thread_id="t1", run_id="r1", event_type="note", category="message",
                         content="hi", user_id=None)
    async with PostgresRunStore.from_conn_string(postgres_url) as runs:
        await runs.setup()
        await runs.create("t1", run_id="r1")

    replica = BackendURL.parse(postgres_url).with_query(
        options="-c default_transaction_read_only=on", target_session_attrs="read-only"
    ).render(hide_password=False)
    async with PostgresSaver.from_conn_string(replica) as saver:
        await saver.setup()  # current schema: nothing to write
        state = await builder.compile(checkpointer=saver).aget_state(cfg)
        assert [m.content for m in state.values["messages"]] == ["hi", "hello"]
        page = await saver.alist_threads()
        assert [t.thread_id for t in page.threads] == ["t1"]
        with pytest.raises(BackendRefusedError, match="read-only transaction") as refused:
            await saver.adelete_thread("t1")
        _refused_as_read_only(refused.value)
    async with PostgresEventStore.from_conn_string(replica) as events:
        assert [e["content"] for e in await events.list_messages("t1", user_id=None)] == ["hi"]
        with pytest.raises(BackendRefusedError, match="read-only transaction") as refused:
            await events.put(thread_id="t1", run_id="r1", event_type="note", category="message",
                             content="lost", user_id=None)
        _refused_as_read_only(refused.value)
    async with PostgresRunStore.from_conn_string(replica) as runs:
        run = await runs.get("r1")
        assert run is not None and run["thread_id"] == "t1"

    async with PostgresEventStore.from_conn_string(postgres_url) as events:  # nothing landed
        assert [e["content"] for e in await events.list_messages("t1", user_id=None)] == ["hi"]
    async with PostgresSaver.from_conn_string(postgres_url) as saver:
        assert await saver.aget_tuple(cfg) is not None
