"""LangGraph's own checkpointer conformance suite (``langgraph-checkpoint-conformance``)
run against our savers.

The package detects the extended capabilities (``copy_thread``, ``prune``,
``delete_for_runs``) by looking for overridden methods; ours override all three, so
every capability must be detected and pass: the report's level must be FULL.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

import runstore

pytestmark = pytest.mark.asyncio


async def _report(url: str) -> Any:
    @checkpointer_test(name=f"runstore {url.split(':')[0]}")
    async def factory() -> AsyncIterator[Any]:
        # A fresh instance per capability suite, as the package asks.
        async with runstore.open(checkpointer=url) as stores:
            yield stores.checkpointer

    return await validate(factory)


def _assert_full(report: Any) -> None:
    results = report.results
    assert set(results) == {c.value for c in ALL_CAPABILITIES}, f"capabilities run: {sorted(results)}"
    undetected = sorted(name for name, r in results.items() if not r.detected)
    assert not undetected, f"capabilities not detected: {undetected}"
    failures = {name: r.failures for name, r in results.items() if r.tests_failed or r.passed is not True}
    assert not failures, f"langgraph-checkpoint-conformance failures: {failures}"
    for name, result in results.items():
        assert result.tests_passed > 0 and result.tests_failed == 0, f"{name}: {result}"
    assert report.conformance_level() == "FULL", report.to_dict()


async def test_memory_saver_passes_langgraph_conformance() -> None:
    _assert_full(await _report("memory://"))


async def test_sqlite_saver_passes_langgraph_conformance(tmp_path: Path) -> None:
    _assert_full(await _report(f"sqlite:///{tmp_path / 'lg.db'}"))


@pytest.mark.postgres
async def test_postgres_saver_passes_langgraph_conformance(postgres_url: str) -> None:
    _assert_full(await _report(postgres_url))
