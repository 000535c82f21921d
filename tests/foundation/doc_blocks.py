"""Run a markdown page's python blocks the way a reader pasting them would.

Shared by test_readme_examples.py (README.md) and test_docs_examples.py (docs/*.md): a
page's ```python blocks run in page order, in one fresh process (doc_driver.py), in a
scratch directory (sqlite paths are relative to it), without the caller's ``RUNSTORE_*``
settings. A block is either run or exempted with the reason; a block that is neither fails,
so no example can silently stop running. Blocks naming the docs' example servers
(``postgresql://app@db/app``, ``redis://cache:6379/0``) run on the test servers
(``RUNSTORE_TEST_POSTGRES_URL``, ``RUNSTORE_TEST_REDIS_URL``), in an own schema and key
prefix dropped after the test; when those are down outside CI, the other blocks still
run and the test then skips, naming the blocks left out.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("doc_driver.py")

POSTGRES = re.compile(r"postgresql://app@db/app(?:\?schema=\w+)?")
REDIS = re.compile(r"redis://cache:6379/0")
_FENCE = re.compile(r"^([ \t]*)```python\n(.*?)\n\1```[ \t]*$", flags=re.S | re.M)
_OTHER_PYTHON_FENCE = re.compile(r"^[ \t]*```(?:py|py3|python3|pycon|ipython)\s*$", flags=re.M)


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository, e.g. docs/store.md
    index: int
    line: int  # where its fence opens; 0 for a test's setup (index -1) or teardown
    code: str

    @property
    def name(self) -> str:
        if not self.line:
            return f"{self.page}'s test {'setup' if self.index < 0 else 'teardown'}"
        return f"{self.page}:{self.line}"

    def has(self, text: str) -> bool:
        return any(text in line for line in self.code.splitlines())

    def services(self) -> set[str]:
        return {name for name, pattern in (("postgres", POSTGRES), ("redis", REDIS)) if pattern.search(self.code)}


def has_python_fence(page: Path) -> bool:
    """Whether the page shows python code fenced as python (in any spelling)."""
    return bool(re.search(r"^[ \t]*```(?:python|py|py3|python3|pycon|ipython)\s*$", page.read_text(), flags=re.M))


def python_blocks(page: Path) -> list[Block]:
    """Every ```python fence of the page, indented ones (inside a list) too."""
    text = page.read_text()
    rel = page.relative_to(ROOT).as_posix()
    blocks = []
    for match in _FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        blocks.append(Block(rel, len(blocks), line, textwrap.dedent(match.group(2))))
    other = _OTHER_PYTHON_FENCE.findall(text)
    assert not other, f"{rel} has python examples fenced as {other}: fence them ```python to be run"
    opened = len(re.findall(r"^[ \t]*```python\s*$", text, flags=re.M))
    assert opened == len(blocks), f"{rel} opens {opened} python blocks; {len(blocks)} were read (a broken fence?)"
    return blocks


def exempt_reason(block: Block, exempt: Mapping[str, str]) -> str | None:
    """Why ``block`` is not run (its key in ``exempt`` is one of its lines), or None."""
    return next((reason for key, reason in exempt.items() if block.has(key)), None)


def check_keys(blocks: list[Block], exempt: Mapping[str, str], expected: Mapping[str, list[str]]) -> None:
    """Each exemption and each expected output names exactly one block; exemptions say why."""
    for key, reason in exempt.items():
        matching = [b.name for b in blocks if b.has(key)]
        assert len(matching) == 1, f"exemption {key!r} matches blocks {matching}, not exactly one"
        assert len(reason) > 20, f"exemption {key!r} needs its reason"
    for key in expected:
        matching = [b for b in blocks if b.has(key)]
        assert len(matching) == 1, f"expected output for {key!r} matches blocks {[b.name for b in matching]}"
        assert exempt_reason(matching[0], exempt) is None, f"{key!r}: an exempt block prints nothing"


def _services(request: pytest.FixtureRequest, needed: set[str]) -> tuple[dict[str, str], dict[str, str]]:
    """Test server URLs by service, and why each unreachable one is (outside CI)."""
    urls: dict[str, str] = {}
    unreachable: dict[str, str] = {}
    for name, fixture in (("postgres", "postgres_url"), ("redis", "redis_url")):
        if name not in needed:
            continue
        try:
            urls[name] = request.getfixturevalue(fixture)
        except pytest.skip.Exception as exc:  # CI=true fails in the fixture instead
            unreachable[name] = str(exc)
    return urls, unreachable


@dataclass
class PageRun:
    """What running a page's blocks did."""

    ran: list[Block]
    left_out: list[Block]  # they need a test server that is down (outside CI)
    unreachable: dict[str, str]
    stdout: dict[int, list[str]] = field(default_factory=dict)  # by block index


def run_page(
    blocks: list[Block],
    exempt: Mapping[str, str],
    expected: Mapping[str, list[str]],
    request: pytest.FixtureRequest,
    workdir: Path,
    env: Mapping[str, str] | None = None,
    setup: str = "",
    teardown: str = "",
    setup_before: str = "",
) -> PageRun:
    """Run the blocks not exempt in one fresh process in ``workdir``; assert each ran and
    printed what ``expected`` says (keyed by a line of the block); ``env`` is added to the
    reader's environment. ``setup`` runs first in the same namespace (the names a page of
    fragments assumes the reader has), or just before the block holding the line
    ``setup_before``; ``teardown`` runs last (closing what ``setup`` opened, or checking
    what the page says the blocks did)."""
    needed = set().union(*(b.services() for b in blocks if exempt_reason(b, exempt) is None))
    urls, unreachable = _services(request, needed)
    to_run: list[Block] = []
    left_out: list[Block] = []
    for block in blocks:
        if exempt_reason(block, exempt) is not None:
            continue
        if block.services() & set(unreachable):
            left_out.append(block)
            continue
        code = POSTGRES.sub(lambda _: urls["postgres"], block.code)
        code = REDIS.sub(lambda _: urls["redis"], code)
        to_run.append(Block(block.page, block.index, block.line, code))
    run = PageRun(to_run, left_out, unreachable)
    if not to_run:
        return run
    page = blocks[0].page
    at = next((i for i, b in enumerate(to_run) if b.has(setup_before)), None) if setup_before else 0
    assert at is not None, f"{page}: setup_before {setup_before!r} names no block that runs"
    framed = [
        *to_run[:at],
        *([Block(page, -1, 0, setup)] if setup else []),
        *to_run[at:],
        *([Block(page, len(blocks), 0, teardown)] if teardown else []),
    ]
    (workdir / "blocks.json").write_text(
        json.dumps([{"index": b.index, "name": b.name, "code": b.code} for b in framed])
    )
    # The reader has no runstore settings in the environment or a runstore.yaml.
    reader_env = {k: v for k, v in os.environ.items() if not k.startswith("RUNSTORE_") or k.startswith("RUNSTORE_TEST_")}
    reader_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, str(DRIVER), "blocks.json", "results.json"],
        cwd=workdir, env=reader_env, capture_output=True, text=True, timeout=600,
    )
    results_file = workdir / "results.json"
    results: list[dict[str, Any]] = json.loads(results_file.read_text()) if results_file.exists() else []
    by_index = {r["index"]: r for r in results}
    for block in framed:
        result = by_index.get(block.index)
        assert result is not None, f"{block.name} did not run (an earlier block failed?)\n{proc.stderr[-3000:]}"
        assert result["ok"], f"{block.name} failed:\n{result.get('error')}"
    assert proc.returncode == 0, proc.stderr[-3000:]
    run.stdout = {index: r["stdout"].splitlines() for index, r in by_index.items()}
    for key, lines in expected.items():
        block = next(b for b in blocks if b.has(key))
        if block.index in run.stdout:
            got = run.stdout[block.index]
            assert got == lines, f"{block.name} prints {got}, its comments say {lines}"
    return run


def skip_if_left_out(run: PageRun) -> None:
    """Skip (after everything else ran) when blocks needed a test server that is down."""
    if run.left_out:
        pytest.skip(
            f"blocks {[b.name for b in run.left_out]} need a test server that is down "
            f"({'; '.join(run.unreachable.values())}); every other block ran"
        )
