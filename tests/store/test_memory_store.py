"""runstore's memory store: opened by URL, TTLConfig on its clock, semantic search, bad input,
the retention sweeper expiring its items, and a real LangGraph graph writing and searching
memories through ``stores.store``."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.store.base import BaseStore, PutOp

import runstore
from runstore.clock import ManualClock
from runstore.errors import InvalidStoreInputError, StoreNotOpenedError
from runstore.plugins.memory.store import MemoryStore
from runstore.settings import Settings
from runstore.sweeper import sweep

EPOCH = datetime(2003, 3, 3, tzinfo=UTC)


def embed(texts: list[str]) -> list[list[float]]:
    """Letter counts of a to d: a deterministic embedding for tests."""
    return [[float(t.count(c)) for c in "abcd"] for t in texts]


async def test_open_by_url_settings_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    async with runstore.open(checkpointer="memory://") as stores:
        with pytest.raises(StoreNotOpenedError, match=r"no long-term memory store.*store=URL"):
            stores.store  # noqa: B018
    async with runstore.open(store="memory://") as stores:
        assert stores.opened == ("store",) and isinstance(stores.store, MemoryStore)
    monkeypatch.setenv("RUNSTORE_STORE_URL", "memory://")
    assert Settings.load().selected_kinds() == ("store",)
    monkeypatch.delenv("RUNSTORE_STORE_URL")
    (tmp_path / "runstore.yaml").write_text("store: memory://\n")
    assert Settings.load().store == "memory://" and Settings.load().selected_kinds() == ("store",)


async def test_ttl_config_on_the_clock() -> None:
    ttl = {"default_ttl": 1, "refresh_on_read": False}
    async with runstore.open(store="memory://", store_ttl=ttl) as stores:
        store = stores.store
        clock = ManualClock(EPOCH)
        store.clock = clock  # type: ignore[attr-defined]
        await store.aput(("m",), "default", {"v": 1})
        await store.aput(("m",), "forever", {"v": 2}, ttl=None)
        clock.advance(59)
        assert await store.aget(("m",), "default") is not None
        clock.advance(1)
        assert await store.aget(("m",), "default") is None, "refresh_on_read=False: the read at 59s did not refresh"
        await store.aput(("m",), "refreshed", {"v": 3})
        clock.advance(50)
        assert await store.aget(("m",), "refreshed", refresh_ttl=True) is not None
        clock.advance(50)
        assert await store.aget(("m",), "refreshed") is not None, "refresh_ttl=True wins over the config"
        assert store.ttl_config == {"default_ttl": 1.0, "refresh_on_read": False, "sweep_interval_minutes": None}
        clock.advance(3600)
        assert await store.asweep_expired() == 1 and [i.key for i in await store.asearch(("m",))] == ["forever"]


async def test_the_retention_sweeper_expires_store_items() -> None:
    async with runstore.open(checkpointer="memory://", store="memory://") as stores:
        clock = ManualClock(EPOCH)
        stores.store.clock = clock  # type: ignore[attr-defined]
        await stores.store.aput(("m",), "k", {"v": 1}, ttl=1)
        await stores.store.aput(("m",), "j", {"v": 1})
        clock.advance(120)
        assert (await sweep(stores, dry_run=True)).store_items == 0
        report = await sweep(stores)
        assert report.store_items == 1 and report.as_dict()["store_items"] == 1
        assert [i.key for i in await stores.store.asearch(("m",))] == ["j"]


async def test_semantic_search_through_open() -> None:
    index = {"dims": 4, "embed": embed, "fields": ["text"]}
    async with runstore.open(store="memory://", store_index=index) as stores:
        store = stores.store
        await store.aput(("docs",), "a", {"text": "aaab"})
        await store.aput(("docs",), "c", {"text": "cccd"})
        await store.aput(("docs",), "raw", {"text": "aaaa"}, index=False)
        got = await store.asearch(("docs",), query="aaaa", limit=3)
        assert [i.key for i in got] == ["a", "c", "raw"]
        assert got[0].score == pytest.approx(3 / 10**0.5) and got[1].score == 0.0 and got[2].score is None
        with pytest.raises(InvalidStoreInputError, match="'summary'"):
            await store.aput(("docs",), "bad", {"text": "a"}, index=["summary"])
        assert await store.aget(("docs",), "bad") is None


async def test_a_bad_op_in_a_batch_writes_nothing() -> None:
    store = MemoryStore()
    with pytest.raises(InvalidStoreInputError, match="period"):
        await store.abatch([PutOp(("ok",), "k", {"v": 1}), PutOp(("a.b",), "k", {"v": 1})])
    assert await store.alist_namespaces() == []
    wrong = MemoryStore(index={"dims": 3, "embed": embed})
    with pytest.raises(InvalidStoreInputError, match="dims=3"):
        await wrong.aput(("d",), "k", {"text": "abc"})
    assert await wrong.aget(("d",), "k") is None


def test_sync_api_anywhere() -> None:
    store = MemoryStore()
    store.put(("s",), "k", {"v": 1})
    assert store.get(("s",), "k").value == {"v": 1}  # type: ignore[union-attr]
    assert [i.key for i in store.search(("s",), filter={"v": {"$gte": 1}})] == ["k"]
    store.delete(("s",), "k")
    assert store.list_namespaces() == []


class State(TypedDict):
    user: str
    text: str
    recalled: list[str]


def remember(state: State, *, store: BaseStore) -> dict[str, Any]:
    store.put(("memories", state["user"]), state["text"][:8], {"text": state["text"], "kind": "note"})
    return {}


async def recall(state: State, *, store: BaseStore) -> dict[str, Any]:
    found = await store.asearch(("memories", state["user"]), query=state["text"], filter={"kind": "note"}, limit=2)
    return {"recalled": [item.value["text"] for item in found]}


async def test_a_langgraph_agent_writes_and_searches_memories() -> None:
    builder = StateGraph(State)
    builder.add_node("remember", remember)
    builder.add_node("recall", recall)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", "recall")
    builder.add_edge("recall", END)
    index = {"dims": 4, "embed": embed}
    async with runstore.open(checkpointer="memory://", store="memory://", store_index=index) as stores:
        graph = builder.compile(checkpointer=stores.checkpointer, store=stores.store)
        config = {"configurable": {"thread_id": "t1"}}
        await graph.ainvoke({"user": "u1", "text": "bbbb likes bikes", "recalled": []}, config)
        out = await graph.ainvoke({"user": "u1", "text": "aaaa likes apples", "recalled": []}, config)
        assert out["recalled"] == ["aaaa likes apples", "bbbb likes bikes"]
        other = await graph.ainvoke({"user": "u2", "text": "cccc", "recalled": []}, {"configurable": {"thread_id": "t2"}})
        assert other["recalled"] == ["cccc"], "memories are per user namespace"
        assert sorted(await stores.store.alist_namespaces(prefix=("memories",))) == [("memories", "u1"), ("memories", "u2")]


async def test_from_conn_string_like_langgraph() -> None:
    async with MemoryStore.from_conn_string("memory://", ttl={"default_ttl": 5}) as store:
        await store.setup()
        assert await store.schema_sql() == ""
        assert store.ttl_rules.default_ttl == 5.0
        await store.aput(("x",), "k", {"v": 1})
        assert (await store.aget(("x",), "k")) is not None


def test_open_sync_hands_out_the_store() -> None:
    with runstore.open_sync(checkpointer="memory://", store="memory://", store_ttl={"default_ttl": 1}) as stores:
        stores.store.put(("s",), "k", {"v": 1})
        assert stores.store.get(("s",), "k").value == {"v": 1}  # type: ignore[union-attr]
        assert stores.store.ttl_config["default_ttl"] == 1.0  # type: ignore[index]
