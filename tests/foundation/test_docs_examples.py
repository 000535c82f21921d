"""Every python example in docs/*.md runs, page by page, the way test_readme_examples.py
runs the README's: a page's blocks in page order in one fresh process (doc_blocks.py).

Every page showing python is in `PAGES` (its blocks run, or are exempted one by one with
the reason) or in `NOT_YET_RUN` (with the reason); a page in neither fails
`test_every_page_with_python_is_run_or_listed`, so a new page's examples cannot silently
go unrun. Fragments (an API's calls on objects the page assumes) run after a `setup`
the test states: the names the page assumes the reader has (open stores, a graph), never
a change to what the block does. A block that cannot run even so (a handler's body with a
``return``, a record's shape) is exempted by a line of it, saying why and where that
code runs.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .doc_blocks import (
    ROOT,
    check_keys,
    has_python_fence,
    python_blocks,
    run_page,
    skip_if_left_out,
)

DOCS = ROOT / "docs"


@dataclass(frozen=True)
class Page:
    #: A line of the block -> why it is not run here, and where that code runs.
    exempt: dict[str, str] = field(default_factory=dict)
    #: A line of the block -> what it prints, where the page says so in a comment.
    expected: dict[str, list[str]] = field(default_factory=dict)
    #: Settings the page tells the reader to make before its blocks (``RUNSTORE_*``).
    env: dict[str, str] = field(default_factory=dict)
    #: For a page of fragments: what the page assumes the reader has (run first, not shown).
    setup: str = ""
    #: Runs last: closes what `setup` opened, or checks what the page says its blocks did.
    teardown: str = ""
    #: A line of the block `setup` runs just before (default: before the first block).
    setup_before: str = ""


PAGES: dict[str, Page] = {
    "store.md": Page(expected={'print(result["recalled"])': ["['likes bikes']"]}),
    "agent-server.md": Page(
        exempt={
            "async def aget_delta_channel_history(self, *, config, channels):": (
                "a proposed patch to LangGraph's server adapter (langgraph_api), not runstore code"
            ),
        },
        # The page sets delta mode in runstore.yaml or .env before the server imports agent.py,
        # and says the graph's schema follows it.
        env={"RUNSTORE_CHECKPOINT_CHANNEL_MODE": "delta"},
        teardown=textwrap.dedent("""
            from langgraph.channels.delta import DeltaChannel

            assert isinstance(graph.channels["messages"], DeltaChannel), graph.channels["messages"]
        """),
    ),
    # After the page's first example (on PostgreSQL), its fragments run inside a worker of
    # the embedded default: open stores, a graph, its inputs, a thread, a stream chunk.
    "runs.md": Page(
        expected={
            'print(renewed, cancel, done["status"])': ["True None success"],
            'print(done.outcome, done.run["status"])': ["finished success"],
        },
        setup=textwrap.dedent("""
            import os
            import socket

            from langgraph.graph import START, StateGraph

            _opened = runstore.open()
            stores = await _opened.__aenter__()
            saver, events, bridge = stores.checkpointer, stores.events, stores.streams
            graph = (StateGraph(stores.thread_state_schema())
                     .add_node("reply", lambda state: {"messages": [("ai", "ok")]})
                     .add_edge(START, "reply").compile(checkpointer=stores.checkpointer))
            inputs, thread_id = {"messages": [("user", "hi")]}, "thread-2"
            host, pid, chunk = socket.gethostname(), os.getpid(), {"reply": {"messages": []}}
        """),
        setup_before="from runstore.worker import Worker",
        teardown="await _opened.__aexit__(None, None, None)",
    ),
    "plugin-authors.md": Page(),
    # Open stores, a middleware schema and a graph with an "editor" node and a "title" key.
    "checkpoint-modes.md": Page(
        setup=textwrap.dedent("""
            from typing import TypedDict

            from langgraph.graph import START, StateGraph

            import runstore

            class MiddlewareState(TypedDict):
                title: str

            _opened = runstore.open()
            stores = await _opened.__aenter__()
            checkpointer = stores.checkpointer
            graph = (StateGraph(runstore.get_thread_state_schema(extra_schemas=[MiddlewareState]))
                     .add_node("editor", lambda state: {}).add_edge(START, "editor").compile(checkpointer=checkpointer))
            config = {"configurable": {"thread_id": "t1"}}
            await graph.ainvoke({"messages": [("user", "hi")], "title": "first"}, config)
        """),
        teardown="await _opened.__aexit__(None, None, None)",
    ),
    "events.md": Page(
        exempt={
            '{"thread_id", "run_id", "event_type", "category", "content", "metadata", "seq", "created_at"}': (
                "the keys of an event record shown as a set: a shape, not a program"
            ),
        },
    ),
    # A graph to publish, and a fencing bridge with a run's lease for the fenced publishes.
    "streams.md": Page(
        exempt={
            "frames = await runstore.open_sse_stream(stores.streams, run_id, runs=stores.runs,": (
                "a fragment of a FastAPI handler: the whole app is docs/examples/fastapi_app.py, "
                "run by tests/web/test_fastapi_recipe.py"
            ),
        },
        setup=textwrap.dedent("""
            from langgraph.checkpoint.memory import InMemorySaver
            from langgraph.graph import START, StateGraph

            import runstore

            graph = (StateGraph(runstore.get_thread_state_schema())
                     .add_node("reply", lambda state: {"messages": [("ai", "ok")]})
                     .add_edge(START, "reply").compile(checkpointer=InMemorySaver()))
            inputs, config, run_id = {"messages": [("user", "hi")]}, {"configurable": {"thread_id": "t1"}}, "r1"
            _opened = runstore.open(streams="memory://")
            bridge = (await _opened.__aenter__()).streams
            run, chunk = {"fence": 1}, {"reply": {"messages": []}}
        """),
        teardown="await _opened.__aexit__(None, None, None)",
    ),
    # The page's calls on an open saver, as a reader with the embedded default open has them.
    "threads.md": Page(
        setup=textwrap.dedent("""
            from datetime import UTC, datetime

            import runstore

            _opened = runstore.open()
            stores = await _opened.__aenter__()
            saver, settings = stores.checkpointer, stores.settings
        """),
        teardown="await _opened.__aexit__(None, None, None)",
    ),
    "web-apps.md": Page(
        exempt={
            "app = FastAPI(lifespan=lifespan)": (
                "docs/examples/fastapi_app.py itself: tests/web/test_fastapi_recipe.py checks the page shows "
                "that file and serves it with uvicorn"
            ),
            "return StreamingResponse(frames, media_type=runstore.SSE_MEDIA_TYPE": (
                "the last line of the handler above, spelled without sse-starlette; a fragment"
            ),
        },
    ),
}

#: Pages whose python blocks are not run yet -> why.
NOT_YET_RUN: dict[str, str] = {}


def _pages_with_python() -> set[str]:
    return {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if has_python_fence(p)}


def test_every_page_with_python_is_run_or_listed() -> None:
    shown = _pages_with_python()
    unlisted = sorted(shown - set(PAGES) - set(NOT_YET_RUN))
    assert not unlisted, (
        f"docs pages {unlisted} show python that nothing runs: add each to PAGES in {Path(__file__).name} "
        "(exempting fragments with reasons) or to NOT_YET_RUN with the reason"
    )
    assert not set(PAGES) & set(NOT_YET_RUN), "a page is both run and listed as not yet run"
    stale = sorted((set(PAGES) | set(NOT_YET_RUN)) - shown)
    assert not stale, f"{stale} are listed but show no python (or do not exist): remove them"
    for page, reason in NOT_YET_RUN.items():
        assert len(reason) > 20, f"NOT_YET_RUN[{page!r}] needs its reason"


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_exemption_names_one_block_and_a_reason(page: str) -> None:
    check_keys(python_blocks(DOCS / page), PAGES[page].exempt, PAGES[page].expected)


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_python_block_of_the_page_runs(page: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    spec = PAGES[page]
    run = run_page(python_blocks(DOCS / page), spec.exempt, spec.expected, request, tmp_path, env=spec.env,
                   setup=spec.setup, teardown=spec.teardown, setup_before=spec.setup_before)
    skip_if_left_out(run)
