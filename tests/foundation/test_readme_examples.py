"""Every python example in README.md runs: in README order, in one fresh process, in a
scratch directory (sqlite paths are relative to it), the way a reader pasting them would.

A block is either run or exempted in `EXEMPT` with the reason (and where it is run
instead); a block that is neither fails the test, so no example can silently stop
running. Blocks naming the README's example servers (``postgresql://app@db/app``,
``redis://cache:6379/0``) run on the test servers (``RUNSTORE_TEST_POSTGRES_URL``,
``RUNSTORE_TEST_REDIS_URL``, an own schema and key prefix); when those are down outside
CI, the other blocks still run and the test then skips, naming the blocks left out.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .doc_blocks import ROOT, Block, check_keys, python_blocks, run_page, skip_if_left_out

#: A line of the block -> why it is not run here, and where it is.
EXEMPT = {
    "class AcmeEventStore(MemoryEventStore):": (
        "a plugin package, not a script: tests/foundation/test_readme.py installs it as "
        "acme_runstore, opens acme:// with it and runs `runstore check` on it"
    ),
    "frames = await runstore.open_sse_stream(": (
        "a fragment of a FastAPI handler (request, HTTPException, EventSourceResponse): the "
        "whole app is docs/examples/fastapi_app.py, run by tests/web/test_fastapi_recipe.py"
    ),
}

#: What a block prints, where the README says so in a comment (keyed by a line of it).
EXPECTED_STDOUT = {
    "async with runstore.open() as stores:              # the embedded default": [
        "['hi', 'you said: hi']",
    ],
    "chat = StateGraph(stores.thread_state_schema())": ["2"],
    "state = runstore.CheckpointStateAccessor.bind(chat, stores.checkpointer)": ["['hi', 'you said: hi']"],
    'with runstore.owner_scope("alice"):': ["1", "0"],
    'async for item in stores.streams.subscribe("r1"):': [
        "StreamEvent(id='0-1', event='updates', data={'reply': 'you said: hi'})",
        "END",
    ],
    "done = await worker.run_graph(": ["finished success"],
}

def readme_blocks() -> list[Block]:
    return python_blocks(ROOT / "README.md")


def test_every_exemption_names_one_block_and_a_reason() -> None:
    check_keys(readme_blocks(), EXEMPT, EXPECTED_STDOUT)


def test_the_first_example_is_the_minimal_one() -> None:
    """The README starts with the smallest real thing: the embedded default, one graph, one
    invoke, the state read back; the features come one step at a time after it."""
    first = readme_blocks()[0].code
    assert "runstore.open()" in first and "compile(checkpointer=stores.checkpointer)" in first
    assert first.count("ainvoke(") == 1 and "aget_state(" in first
    for feature in ("checkpoint_channel_mode", "inject_checkpoint_mode", "CheckpointStateAccessor",
                    "owner_scope", "stores.events", "stores.streams", "Worker", "postgresql://"):
        assert feature not in first, f"the first example also teaches {feature}"


def test_every_readme_python_block_runs(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    run = run_page(readme_blocks(), EXEMPT, EXPECTED_STDOUT, request, tmp_path)
    assert (tmp_path / ".runstore" / "runstore.db").is_file(), "the embedded default's file is under .runstore/"
    skip_if_left_out(run)
