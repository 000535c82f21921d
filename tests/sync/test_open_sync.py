"""`runstore.open_sync`: a synchronous script runs graph.invoke on stores whose loop runstore owns."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import runstore
from runstore.checkpoint.modes import reset_checkpoint_mode_for_tests
from runstore.urls import BackendURL

SCRIPT = '''
import json, sys, threading
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import START, StateGraph
import runstore
import runstore.errors

url, mode, first = sys.argv[1], sys.argv[2], int(sys.argv[3])

def reply(state):
    last = state["messages"][-1]
    return {"messages": [AIMessage(f"you said: {last.content}", id=f"ai-{last.id}")]}

def ask(graph, cfg, text):
    graph.invoke({"messages": [HumanMessage(text, id=text)]}, cfg)

with runstore.open_sync({"checkpoint_channel_mode": mode}, checkpointer=url) as stores:
    builder = StateGraph(stores.thread_state_schema())
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    graph = builder.compile(checkpointer=stores.checkpointer)
    cfg = {"configurable": {"thread_id": "t1"}}
    ask(graph, cfg, f"q{first}")
    other = threading.Thread(target=ask, args=(graph, cfg, f"q{first + 1}"))
    other.start()
    other.join()
    messages = [m.content for m in graph.get_state(cfg).values["messages"]]

    async def sync_call_on_the_loop():
        try:
            stores.checkpointer.get_tuple(cfg)
        except runstore.errors.SyncCallOnEventLoopError as exc:
            return str(exc)
        return None

    on_loop = stores.run(sync_call_on_the_loop())
    loop = stores.loop
print(json.dumps({
    "messages": messages,
    "on_loop_error": on_loop,
    "loop_closed": loop.is_closed(),
    "threads": sorted(t.name for t in threading.enumerate()),
}))
'''


def _run(tmp_path: Path, url: str, mode: str, first: int) -> dict[str, Any]:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), url, mode, str(first)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["full", "delta"])
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_sync_script_runs_graph_invoke(
    backend: str, mode: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue("postgres_url") if backend == "postgres" else (
        BackendURL.for_file("sqlite", tmp_path / "app.db").render()
    )
    first = _run(tmp_path, url, mode, 0)
    assert first["messages"] == ["q0", "you said: q0", "q1", "you said: q1"]
    assert "await" in first["on_loop_error"], "a sync call on the loop keeps its clear error"
    assert first["loop_closed"] is True
    assert first["threads"] == ["MainThread"], "runstore's loop thread is gone after close"
    again = _run(tmp_path, url, mode, 2)  # a new process reads what the first one stored
    assert again["messages"] == [*first["messages"], "q2", "you said: q2", "q3", "you said: q3"]
    assert not (tmp_path / ".runstore").exists()


def test_open_sync_errors_and_close() -> None:
    reset_checkpoint_mode_for_tests()
    try:
        with pytest.raises(runstore.BackendNotFoundError):
            runstore.open_sync(checkpointer="nosuch://")
        stores = runstore.open_sync(checkpointer="memory://", events="memory://")
        record = stores.run(stores.events.put(
            thread_id="t", run_id="r", event_type="note", category="message", content="hi", user_id=None
        ))
        assert record["seq"] == 1
        stores.close()
        stores.close()  # idempotent
        assert stores.loop.is_closed()
        coro = stores.events.count_messages("t", user_id=None)
        with pytest.raises(RuntimeError, match="closed"):
            stores.run(coro)
    finally:
        reset_checkpoint_mode_for_tests()
