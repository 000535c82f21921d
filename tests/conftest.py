"""Shared fixtures: test service URLs, isolated per test, and the built-in conformance run.

PostgreSQL and Redis are found through ``RUNSTORE_TEST_POSTGRES_URL`` and
``RUNSTORE_TEST_REDIS_URL``. Outside CI a test whose service is unreachable skips
and says why; under ``CI=true`` it fails.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from runstore.conformance.harness import Provisioned, in_ci
from runstore.urls import BackendURL

POSTGRES_URL = os.environ.get(
    "RUNSTORE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
REDIS_URL = os.environ.get("RUNSTORE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

# Hundreds of tests start a child pytest or python (runstore check, the teeth runs, fresh
# virtualenvs). Under PYTHONDONTWRITEBYTECODE (set in this machine's environment) each of them
# compiled every module from source again, and pytest re-rewrote the asserts of every
# module of every pytest plugin's distribution (hypothesis, langsmith, runstore ...): half of
# a child run's start-up. The test run keeps bytecode caches (``__pycache__``, ignored by
# git), shared by the xdist workers, which start after this file loads, and their children.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

#: What our own run of the conformance suite checks when no --runstore-backend is given.
#: The ``langgraph-*`` savers are LangGraph's stock InMemorySaver, AsyncSqliteSaver and
#: AsyncPostgresSaver, reference peers for the saver suite (test-only plugins in
#: tests/reference/): a correct saver we did not write must pass what it declares.
BUILTIN_BACKENDS = [
    "memory://",
    "jsonl://",
    "sqlite://",
    POSTGRES_URL,
    REDIS_URL,
    "langgraph-memory://",
    "langgraph-sqlite://",
    "langgraph-" + POSTGRES_URL,
]
#: Test-only runstore plugins our default run registers (reference peers).
TEST_PLUGINS = [
    str(Path(__file__).parent / "reference" / name)
    for name in ("langgraph_memory.py", "langgraph_sql.py")
]


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if not in_ci():
        # Outside CI an unreachable service skips (with its reason); CI=true fails.
        config.option.runstore_allow_unreachable = True
    if not config.getoption("runstore_backend"):
        config.option.runstore_backend = list(BUILTIN_BACKENDS)
        config.option.runstore_plugin = [
            *(config.getoption("runstore_plugin") or []),
            *TEST_PLUGINS,
        ]


def _provisioned(raw: str) -> Iterator[str]:
    with Provisioned(BackendURL.parse(raw)) as provisioned:
        yield provisioned.url.render(hide_password=False)


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A PostgreSQL URL whose ``?schema=`` is a fresh schema, dropped after the test."""
    yield from _provisioned(POSTGRES_URL)


@pytest.fixture
def redis_url() -> Iterator[str]:
    """A Redis URL whose ``?prefix=`` is fresh; its keys are deleted after the test."""
    yield from _provisioned(REDIS_URL)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A sqlite URL for a fresh file in the test's temp dir."""
    return BackendURL.for_file("sqlite", tmp_path / "test.db").render()


@pytest.fixture
def jsonl_url(tmp_path: Path) -> str:
    """A jsonl URL for a fresh directory in the test's temp dir."""
    return BackendURL.for_file("jsonl", tmp_path / "events").render()

