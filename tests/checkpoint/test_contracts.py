"""The saver API beyond BaseCheckpointSaver is declared per capability
(`runstore.checkpoint.contracts`): a saver is held to what it declares when it opens,
and the worker and the sweeper ask the contracts instead of probing names."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver

from runstore.capabilities import CAPABILITY_KINDS, Kind
from runstore.checkpoint.contracts import (
    CONTRACTS,
    SYNC_CONTRACTS,
    CompactingSaver,
    FencingSaver,
    RetentionSaver,
    ThreadIndexSaver,
    check_saver,
    contract_methods,
    missing_methods,
)
from runstore.checkpoint.forwarding import DeltaMarkingSaver
from runstore.checkpoint.threads import Removed
from runstore.errors import InvalidSaverInputError, PluginError, StaleFenceError
from runstore.loader import get_backends
from runstore.options import BackendOptions
from runstore.plugins.memory.runs import MemoryRunStore
from runstore.plugins.memory.saver import MemorySaver
from runstore.registry import BackendRegistry, BackendSpec, PluginInfo
from runstore.sweeper import Sweeper
from runstore.urls import BackendURL
from runstore.worker import Lease, Worker


class HalfRetention(InMemorySaver):
    """Declares ``retention`` and writes every method of it but ``asweep``."""

    closed = False

    async def aset_thread_retention(self, thread_id: str, overrides: Any) -> None:
        return None

    async def afinish_cleanup(self, thread_ids: Sequence[str]) -> None:
        return None

    async def apurge_threads(self, thread_ids: Sequence[str], *, dry_run: bool = False) -> Removed:
        return Removed()

    async def __aexit__(self, *exc: object) -> None:
        # InMemorySaver is an async context manager: runstore enters it on open and exits it on close.
        self.closed = True


class AsyncOnlyIndex(InMemorySaver):
    """The thread index's async methods, none of its sync twins."""

    async def aget_thread(self, thread_id: str) -> None:
        return None

    async def alist_threads(self, **kwargs: Any) -> Any:
        return None

    async def atouch_thread(self, thread_id: str) -> bool:
        return False


def _spec(saver: Any, capabilities: list[str]) -> BackendSpec[Any]:
    async def factory(url: BackendURL, options: BackendOptions) -> Any:
        return saver

    return BackendRegistry(Kind.SAVER).add(
        "half", plugin=PluginInfo("half_plugin"), schemes=["half"], factory=factory,
        capabilities=capabilities,
    )  # fmt: skip


async def test_a_saver_declaring_retention_without_asweep_is_refused_naming_it() -> None:
    saver = HalfRetention()
    async with BackendOptions.scope() as options:
        with pytest.raises(PluginError) as info:
            await _spec(saver, ["retention", "durable"]).open(BackendURL.parse("half://"), options)
        message = str(info.value)
        assert "saver backend 'half' from plugin half_plugin" in message
        assert "HalfRetention declares retention but lacks asweep." in message
        assert "aset_thread_retention" not in message and "durable" not in message
        assert not saver.closed
    assert saver.closed, "a refused saver is still closed with its options"


async def test_the_same_saver_opens_when_it_declares_only_what_it_has() -> None:
    async with BackendOptions.scope() as options:
        opened = await _spec(HalfRetention(), ["durable"]).open(BackendURL.parse("half://"), options)
    assert isinstance(opened, HalfRetention)


def test_base_class_defaults_do_not_count_as_written() -> None:
    """LangGraph's BaseCheckpointSaver has acopy_thread/aprune/adelete_for_runs raising
    NotImplementedError: inheriting them is not implementing them."""
    assert missing_methods(InMemorySaver(), {"copy_thread", "prune", "delete_for_runs"}) == {
        "copy_thread": ["acopy_thread"],
        "delete_for_runs": ["adelete_for_runs"],
        "prune": ["aprune"],
    }
    with pytest.raises(PluginError, match="declares copy_thread but lacks acopy_thread"):
        check_saver(InMemorySaver(), {"copy_thread"}, where="test")


def test_sync_twins_are_required_only_with_sync_api() -> None:
    assert missing_methods(AsyncOnlyIndex(), {"thread_index"}) == {}
    with pytest.raises(PluginError, match="declares sync_api but lacks get_thread, list_threads"):
        check_saver(AsyncOnlyIndex(), {"thread_index", "sync_api"}, where="test")


def test_the_stock_saver_passes_what_it_honestly_declares() -> None:
    check_saver(InMemorySaver(), {"delta_history", "sync_api"}, where="test")


def test_a_wrapper_is_judged_by_the_saver_behind_it() -> None:
    assert missing_methods(DeltaMarkingSaver(InMemorySaver()), {"prune"}) == {"prune": ["aprune"]}
    assert missing_methods(DeltaMarkingSaver(MemorySaver()), CONTRACTS.keys()) == {}


def test_every_contract_belongs_to_a_saver_capability() -> None:
    for capability in (*CONTRACTS, *SYNC_CONTRACTS):
        assert Kind.SAVER in CAPABILITY_KINDS[capability], capability
    methods = [m for protocol in (*CONTRACTS.values(), *SYNC_CONTRACTS.values()) for m in contract_methods(protocol)]
    assert len(methods) == len(set(methods)), "a method belongs to one contract"
    assert contract_methods(RetentionSaver) == ("asweep", "aset_thread_retention", "afinish_cleanup", "apurge_threads")


@pytest.mark.postgres
async def test_every_built_in_saver_passes_its_declaration(tmp_path: Any, postgres_url: str) -> None:
    urls = {"memory": "memory://", "sqlite": f"sqlite:///{tmp_path}/c.db", "postgres": postgres_url}
    specs = [s for s in get_backends().savers if s.plugin.distribution == "runstore"]
    assert {s.name for s in specs} == set(urls)
    async with BackendOptions.scope() as options:
        for spec in specs:
            saver = await spec.open(BackendURL.parse(urls[spec.name]), options)
            assert missing_methods(saver, spec.capabilities) == {}, spec.name
            for capability in spec.capabilities & CONTRACTS.keys():
                assert isinstance(saver, CONTRACTS[capability]), (spec.name, capability)
            assert isinstance(saver, CompactingSaver) == (spec.name != "memory")


async def test_the_sweeper_accepts_a_wrapped_retention_saver_and_refuses_a_stock_one() -> None:
    Sweeper(DeltaMarkingSaver(MemorySaver()))
    with pytest.raises(InvalidSaverInputError, match="lacks asweep, aset_thread_retention, afinish_cleanup, apurge_threads"):
        Sweeper(InMemorySaver())


async def _nothing(lease: Lease) -> None:
    return None


async def test_the_worker_fences_the_saver_behind_its_wrappers() -> None:
    saver = MemorySaver()
    assert isinstance(saver, FencingSaver) and isinstance(saver, ThreadIndexSaver)
    async with BackendOptions.scope() as options:
        runs = await MemoryRunStore.open(BackendURL.parse("memory://"), options)
        worker = Worker(runs, DeltaMarkingSaver(saver), owner="w1")
        first = await worker.start("t1")
        assert (await worker.execute(first, _nothing)).outcome == "finished"
        second = await worker.start("t1")
        assert second.fence > first.fence
        assert (await worker.execute(second, _nothing)).outcome == "finished"
        with pytest.raises(StaleFenceError):
            await saver.afence_thread("t1", first.fence)


async def test_the_worker_runs_on_a_saver_without_fencing() -> None:
    async with BackendOptions.scope() as options:
        runs = await MemoryRunStore.open(BackendURL.parse("memory://"), options)
        worker = Worker(runs, InMemorySaver(), owner="w1")
        lease = await worker.start("t1")
        assert (await worker.execute(lease, _nothing)).outcome == "finished"


def test_the_plugin_authors_page_lists_each_contract() -> None:
    """docs/plugin-authors.md's table of contracts cannot drift from `CONTRACTS`."""
    import re
    from pathlib import Path

    page = (Path(__file__).parents[2] / "docs" / "plugin-authors.md").read_text(encoding="utf-8")
    section = page.split("\n## A saver's extra methods", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| `"):
            rows[cells[0].strip("`")] = (cells[1].strip("`"), re.findall(r"`(\w+)`", cells[2]))
    assert rows.keys() == CONTRACTS.keys()
    for capability, (protocol, methods) in rows.items():
        assert protocol == CONTRACTS[capability].__name__
        expected = list(contract_methods(CONTRACTS[capability]))
        if capability == "sync_api":
            expected += [m for p in SYNC_CONTRACTS.values() for m in contract_methods(p)]
            methods = [m for m in methods if m != "SYNC_CONTRACTS"]
        assert methods == expected, capability
