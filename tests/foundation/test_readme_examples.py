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

import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("readme_driver.py")

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

POSTGRES = re.compile(r"postgresql://app@db/app(?:\?schema=\w+)?")
REDIS = re.compile(r"redis://cache:6379/0")


@dataclass(frozen=True)
class Block:
    index: int
    line: int  # where its fence opens in README.md
    code: str

    def has(self, text: str) -> bool:
        return any(text in line for line in self.code.splitlines())

    def services(self) -> set[str]:
        return {name for name, pattern in (("postgres", POSTGRES), ("redis", REDIS)) if pattern.search(self.code)}


def python_blocks() -> list[Block]:
    """Every ```python fence of README.md, indented ones (inside a list) too."""
    text = (ROOT / "README.md").read_text()
    blocks = []
    for match in re.finditer(r"^([ \t]*)```python\n(.*?)\n\1```[ \t]*$", text, flags=re.S | re.M):
        line = text.count("\n", 0, match.start()) + 1
        blocks.append(Block(len(blocks), line, textwrap.dedent(match.group(2))))
    other = re.findall(r"^[ \t]*```(?:py|py3|python3|pycon|ipython)\s*$", text, flags=re.M)
    assert not other, f"README.md has python examples fenced as {other}: fence them ```python to be run"
    opened = len(re.findall(r"^[ \t]*```python\s*$", text, flags=re.M))
    assert opened == len(blocks), f"README.md opens {opened} python blocks; {len(blocks)} were read (a broken fence?)"
    return blocks


def _exempt(block: Block) -> str | None:
    return next((reason for key, reason in EXEMPT.items() if block.has(key)), None)


def test_every_exemption_names_one_block_and_a_reason() -> None:
    blocks = python_blocks()
    for key, reason in EXEMPT.items():
        matching = [b.line for b in blocks if b.has(key)]
        assert len(matching) == 1, f"exemption {key!r} matches README blocks at lines {matching}, not exactly one"
        assert len(reason) > 20, f"exemption {key!r} needs its reason"
    for key in EXPECTED_STDOUT:
        matching = [b.line for b in blocks if b.has(key)]
        assert len(matching) == 1, f"expected output for {key!r} matches blocks at lines {matching}"
        assert _exempt(next(b for b in blocks if b.has(key))) is None, f"{key!r}: an exempt block prints nothing"


def test_the_first_example_is_the_minimal_one() -> None:
    """The README starts with the smallest real thing: the embedded default, one graph, one
    invoke, the state read back; the features come one step at a time after it."""
    first = python_blocks()[0].code
    assert "runstore.open()" in first and "compile(checkpointer=stores.checkpointer)" in first
    assert first.count("ainvoke(") == 1 and "aget_state(" in first
    for feature in ("checkpoint_channel_mode", "inject_checkpoint_mode", "CheckpointStateAccessor",
                    "owner_scope", "stores.events", "stores.streams", "Worker", "postgresql://"):
        assert feature not in first, f"the first example also teaches {feature}"


def _services(request: pytest.FixtureRequest) -> tuple[dict[str, str], dict[str, str]]:
    """Test server URLs by service, and why each unreachable one is (outside CI)."""
    urls: dict[str, str] = {}
    unreachable: dict[str, str] = {}
    for name, fixture in (("postgres", "postgres_url"), ("redis", "redis_url")):
        try:
            urls[name] = request.getfixturevalue(fixture)
        except pytest.skip.Exception as exc:  # CI=true fails in the fixture instead
            unreachable[name] = str(exc)
    return urls, unreachable


def test_every_readme_python_block_runs(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    blocks = python_blocks()
    urls, unreachable = _services(request)
    to_run: list[Block] = []
    left_out: list[Block] = []
    for block in blocks:
        if _exempt(block) is not None:
            continue
        if block.services() & set(unreachable):
            left_out.append(block)
            continue
        code = POSTGRES.sub(lambda _: urls["postgres"], block.code)
        code = REDIS.sub(lambda _: urls["redis"], code)
        to_run.append(Block(block.index, block.line, code))
    (tmp_path / "blocks.json").write_text(json.dumps([{"index": b.index, "code": b.code} for b in to_run]))
    # The README's reader has no runstore settings in the environment or a runstore.yaml.
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNSTORE_") or k.startswith("RUNSTORE_TEST_")}
    proc = subprocess.run(
        [sys.executable, str(DRIVER), "blocks.json", "results.json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    results = json.loads((tmp_path / "results.json").read_text()) if (tmp_path / "results.json").exists() else []
    by_index = {r["index"]: r for r in results}
    for block in to_run:
        result = by_index.get(block.index)
        assert result is not None, (
            f"README block at line {block.line} did not run (an earlier block failed?)\n{proc.stderr[-3000:]}"
        )
        assert result["ok"], f"README block at line {block.line} failed:\n{result.get('error')}"
    assert proc.returncode == 0, proc.stderr[-3000:]
    for key, expected in EXPECTED_STDOUT.items():
        block = next(b for b in blocks if b.has(key))
        if block.index in by_index:
            got = by_index[block.index]["stdout"].splitlines()
            assert got == expected, f"README block at line {block.line} prints {got}, its comments say {expected}"
    assert (tmp_path / ".runstore" / "runstore.db").is_file(), "the embedded default's file is under .runstore/"
    if left_out:
        pytest.skip(
            f"README blocks at lines {[b.line for b in left_out]} need a test server that is down "
            f"({'; '.join(unreachable.values())}); "
            "every other block ran"
        )
