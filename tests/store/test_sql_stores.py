"""The sqlite and PostgreSQL memory stores on real sqlite files and a real PostgreSQL schema.

Each test opens the store on an event loop in a thread of its own and calls the sync
API (`BaseStore.batch` and friends), which runs on that loop: the Hypothesis tests then
need no event loop of their own, and the sync twins are exercised on the way.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import uuid
from collections.abc import Callable, Coroutine, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langgraph.store.base import (
    GetOp,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    SearchOp,
)
from langgraph.store.memory import InMemoryStore

from runstore.clock import ManualClock
from runstore.options import BackendOptions
from runstore.settings import Settings
from runstore.urls import BackendURL

R = TypeVar("R")
DIMS = 16


class LoopThread:
    """An event loop running in a thread of its own, for the stores under test."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, R]) -> R:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(120)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def embed(texts: list[str]) -> list[list[float]]:
    """A deterministic embedding: a vector drawn from a generator seeded by the text."""
    out = []
    for text in texts:
        seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
        out.append(np.random.default_rng(seed).standard_normal(DIMS).tolist())
    return out


class Opened:
    """A store opened on a loop thread; `close` closes it and the loop."""

    def __init__(self, kind: str, url: str, **kwargs: Any) -> None:
        self.kind = kind
        self.url = url
        self.loop = LoopThread()
        self._options: Any = None
        self.store = self.loop.run(self._open(**kwargs))

    async def _open(self, **kwargs: Any) -> Any:
        self._scope = BackendOptions.scope(Settings.load(None))
        options = await self._scope.__aenter__()
        if self.kind == "sqlite":
            from runstore.plugins.sqlite.store import SqliteStore

            return await SqliteStore.open(BackendURL.parse(self.url), options, **kwargs)
        from runstore.plugins.postgres.store import PostgresStore

        return await PostgresStore.open(BackendURL.parse(self.url), options, **kwargs)

    def close(self) -> None:
        self.loop.run(self._scope.__aexit__(None, None, None))
        self.loop.stop()


@pytest.fixture(params=["sqlite", "postgres"])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., Opened]]:
    """Opens stores of one backend on a fresh file / schema; all closed after the test."""
    kind = request.param
    if kind == "sqlite":
        url = BackendURL.for_file("sqlite", tmp_path / "store.db").render()
    else:
        url = request.getfixturevalue("postgres_url")
    opened: list[Opened] = []

    def open_store(**kwargs: Any) -> Opened:
        store = Opened(kind, url, **kwargs)
        opened.append(store)
        return store

    yield open_store
    for store in opened:
        store.close()


# --- differential: the same ops on InMemoryStore ------------------------------------

LABELS = st.sampled_from(["a", "b", "a-b", "c"])
KEYS = st.sampled_from(["k1", "k2", "k3"])
VALUES = st.fixed_dictionaries(
    {
        "n": st.integers(-3, 3),
        "s": st.sampled_from(["x", "y", "z"]),
        "b": st.booleans(),
        "nested": st.fixed_dictionaries({"m": st.integers(0, 2)}),
    }
)
FILTERS = st.one_of(
    st.none(),
    st.fixed_dictionaries({"s": st.sampled_from(["x", "y"])}),
    st.fixed_dictionaries({"b": st.booleans()}),
    st.fixed_dictionaries({"n": st.sampled_from([0, 1, -1])}),
    st.builds(
        lambda op, v: {"n": {op: v}},
        st.sampled_from(["$gt", "$gte", "$lt", "$lte", "$eq", "$ne"]),
        st.integers(-2, 2),
    ),
    st.builds(lambda v: {"nested": {"m": v}}, st.integers(0, 2)),
    st.builds(lambda s, v: {"s": {"$ne": s}, "n": {"$gte": v}}, st.sampled_from(["x", "y"]), st.integers(-2, 2)),
)


def _namespaces(root: str) -> st.SearchStrategy[tuple[str, ...]]:
    return st.lists(LABELS, min_size=0, max_size=2).map(lambda labels: (root, *labels))


def _ops(root: str) -> st.SearchStrategy[Any]:
    ns = _namespaces(root)
    put = st.builds(lambda n, k, v: PutOp(n, k, v), ns, KEYS, st.one_of(VALUES, VALUES, st.none()))
    get = st.builds(lambda n, k: GetOp(n, k), ns, KEYS)
    search = st.builds(
        lambda prefix, f: SearchOp(prefix, f, limit=100), _namespaces(root), FILTERS
    )
    listing = st.builds(
        lambda path, kind, depth: ListNamespacesOp(
            (MatchCondition("prefix", (root,)), *((MatchCondition(kind, path),) if path else ())),
            max_depth=depth,
            limit=100,
        ),
        st.lists(st.one_of(LABELS, st.just("*")), max_size=2).map(tuple),
        st.sampled_from(["prefix", "suffix"]),
        st.one_of(st.none(), st.integers(1, 3)),
    )
    return st.one_of(put, put, get, search, listing)


class Reference(InMemoryStore):
    """LangGraph's InMemoryStore, listing only namespaces that hold items (it also lists
    the ones a get or delete merely named, which hold none)."""

    def _handle_list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        for namespace in [ns for ns, items in self._data.items() if not items]:
            del self._data[namespace]
        return super()._handle_list_namespaces(op)


def _comparable(result: Any) -> Any:
    if isinstance(result, list):
        if result and isinstance(result[0], tuple):
            return result
        # Searches: the same items, whatever the order among equal timestamps.
        return sorted((tuple(item.namespace), item.key, orjson.dumps(item.value, option=orjson.OPT_SORT_KEYS)) for item in result)
    if result is None:
        return None
    return (tuple(result.namespace), result.key, result.value)


def test_random_batches_match_langgraphs_in_memory_store(opener: Callable[..., Opened]) -> None:
    """Batches of random ops answer as LangGraph's InMemoryStore does, op by op, in order."""
    store = opener().store

    @settings(max_examples=25, deadline=None)
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        root = "r" + uuid.uuid4().hex[:10]
        reference = Reference()
        batches = data.draw(st.lists(st.lists(_ops(root), min_size=1, max_size=4), min_size=1, max_size=6))
        for batch in batches:
            ours = store.batch(batch)
            expected = [reference.batch([op])[0] for op in batch]
            assert [_comparable(r) for r in ours] == [_comparable(r) for r in expected], batch

    check()


# --- TTL with a controllable clock ---------------------------------------------------


def test_ttl_expires_refreshes_on_read_and_sweeps(opener: Callable[..., Opened]) -> None:
    opened = opener(ttl={"default_ttl": 1.0, "refresh_on_read": True})
    store = opened.store
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    store.clock = clock
    store.put(("m",), "kept", {"v": 1})
    store.put(("m",), "idle", {"v": 2})
    store.put(("m",), "forever", {"v": 3}, ttl=None)
    clock.advance(40)
    assert store.get(("m",), "kept") is not None  # refreshed: now expires at 100 s
    assert store.get(("m",), "idle", refresh_ttl=False) is not None  # not refreshed
    clock.advance(40)  # 80 s
    assert store.get(("m",), "idle") is None
    assert [i.key for i in store.search(("m",), refresh_ttl=False)] == ["forever", "kept"] or {
        i.key for i in store.search(("m",), refresh_ttl=False)
    } == {"forever", "kept"}
    clock.advance(30)  # 110 s: "kept" was last refreshed at 40 s
    assert store.get(("m",), "kept") is None
    assert store.list_namespaces() == [("m",)]
    assert opened.loop.run(store.asweep_expired()) == 2
    assert opened.loop.run(store.asweep_expired()) == 0
    assert store.get(("m",), "forever").value == {"v": 3}


def test_search_refreshes_the_items_it_returns(opener: Callable[..., Opened]) -> None:
    store = opener().store
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    store.clock = clock
    store.put(("s",), "a", {"t": "x"}, ttl=1.0)
    store.put(("s",), "b", {"t": "y"}, ttl=1.0)
    clock.advance(50)
    assert [i.key for i in store.search(("s",), filter={"t": "x"})] == ["a"]
    clock.advance(50)  # 100 s: "a" refreshed at 50 s, "b" expired at 60 s
    assert [i.key for i in store.search(("s",))] == ["a"]


def test_an_expired_item_put_again_is_new(opener: Callable[..., Opened]) -> None:
    store = opener().store
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    store.clock = clock
    store.put(("e",), "k", {"v": 1}, ttl=0.5)
    clock.advance(60)
    store.put(("e",), "k", {"v": 2})
    item = store.get(("e",), "k")
    assert item.value == {"v": 2}
    assert item.created_at == item.updated_at == clock()


# --- semantic search ------------------------------------------------------------------


@pytest.mark.parametrize("vec", [True, False], ids=["sql-ranking", "numpy-ranking"])
def test_semantic_search_ranks_like_a_numpy_scan(opener: Callable[..., Opened], vec: bool) -> None:
    opened = opener(index={"dims": DIMS, "embed": embed, "fields": ["text"]})
    store = opened.store
    if opened.kind == "postgres" and not vec:
        pytest.skip("PostgreSQL always ranks with numpy")
    if opened.kind == "sqlite":
        assert store._vec, "sqlite-vec is registered on this machine"
        store._vec = vec
    texts = [f"memory number {i}" for i in range(120)]
    store.batch([PutOp(("docs", str(i % 3)), f"k{i}", {"text": t, "i": i}) for i, t in enumerate(texts)])
    store.put(("docs", "0"), "plain", {"text": "not embedded"}, index=False)
    matrix = np.asarray(embed(texts), dtype=np.float64)
    for query in ["memory number 7", "something else", "zz"]:
        q = np.asarray(embed([query])[0])
        scores = matrix @ q / (np.linalg.norm(matrix, axis=1) * np.linalg.norm(q))
        expected = [f"k{i}" for i in np.argsort(-scores)[:10]]
        found = store.search(("docs",), query=query, limit=10)
        assert [i.key for i in found] == expected
        assert [i.score for i in found] == pytest.approx(sorted(scores, reverse=True)[:10], abs=1e-5)
        # Paging continues the same ranking; a filter ranks only what it keeps.
        assert [i.key for i in store.search(("docs",), query=query, limit=5, offset=5)] == expected[5:]
        everything = store.search(("docs",), query=query, limit=200)
        assert len(everything) == 121
        assert everything[-1].key == "plain" and everything[-1].score is None
        # Pages that reach past the embedded items go on with the unembedded ones.
        assert [i.key for i in store.search(("docs",), query=query, limit=5, offset=119)] == [
            everything[119].key,
            "plain",
        ]
        assert [i.key for i in store.search(("docs",), query=query, limit=5, offset=120)] == ["plain"]
        ranked = [f"k{i}" for i in np.argsort(-scores)]
        under_one = [i.key for i in store.search(("docs", "1"), query=query, limit=200)]
        assert under_one == [k for k in ranked if int(k[1:]) % 3 == 1]
        low = [i.key for i in store.search(("docs",), query=query, filter={"i": {"$lt": 30}}, limit=200)]
        assert low == [k for k in ranked if int(k[1:]) < 30]
        # A short page under a filter (read from the nearest vectors first on sqlite).
        half = [i.key for i in store.search(("docs",), query=query, filter={"i": {"$lt": 60}}, limit=3)]
        assert half == [k for k in ranked if int(k[1:]) < 60][:3]


def test_semantic_search_sees_other_writers_at_once(opener: Callable[..., Opened]) -> None:
    """The decoded vectors a store keeps between searches never hide another store's
    (another connection's) put, re-embed or delete: the next search ranks with them."""
    index = {"dims": DIMS, "embed": embed, "fields": ["text"]}
    reader, writer = opener(index=index).store, opener(index=index).store
    texts = [f"memory number {i}" for i in range(100)]
    writer.batch([PutOp(("cached", str(i % 2)), f"k{i}", {"text": t}) for i, t in enumerate(texts)])
    query = "memory number 7"
    first = [i.key for i in reader.search(("cached",), query=query, limit=5)]
    assert first[0] == "k7"
    again = [i.key for i in reader.search(("cached",), query=query, limit=5)]
    assert again == first
    # A new item embedded exactly as the query ranks first.
    writer.put(("cached", "1"), "new", {"text": query})
    assert [i.key for i in reader.search(("cached",), query=query, limit=5)][:2] in (["k7", "new"], ["new", "k7"])
    # Deleted items are gone; a re-embedded one moves.
    writer.delete(("cached", "1"), "new")
    writer.delete(("cached", "1"), "k7")
    writer.put(("cached", "1"), "k7", {"text": "something else entirely"})
    after = [i.key for i in reader.search(("cached",), query=query, limit=5)]
    assert "new" not in after and "k7" not in after and after == [k for k in first if k != "k7"][:4] + after[4:]
    # An item no longer embedded (put with index=False) is no longer ranked by its vector.
    writer.put(("cached", str(int(after[0][1:]) % 2)), after[0], {"text": "x"}, index=False)
    assert reader.search(("cached",), query=query, limit=5)[0].key == after[1]
    # A sweep (which folds PostgreSQL's change log) changes no ranking; later writes still count.
    writer.sweep_expired()
    assert reader.search(("cached",), query=query, limit=5)[0].key == after[1]
    writer.put(("cached", "0"), "back", {"text": query})
    assert reader.search(("cached",), query=query, limit=1)[0].key == "back"


# --- one batch, one transaction --------------------------------------------------------


def test_a_failing_op_leaves_nothing_of_its_batch(opener: Callable[..., Opened], monkeypatch: pytest.MonkeyPatch) -> None:
    opened = opener()
    store = opened.store
    store.put(("t",), "before", {"v": 0})
    if opened.kind == "sqlite":
        from runstore.plugins.sqlite import store_ops as module
    else:
        from runstore.plugins.postgres import store_sql as module  # type: ignore[no-redef]
    real = module._put
    calls = {"n": 0}

    def failing(*args: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected failure in the third op")
        return real(*args)

    monkeypatch.setattr(module, "_put", failing)
    with pytest.raises(Exception, match="injected failure"):
        store.batch(
            [
                PutOp(("t",), "a", {"v": 1}),
                PutOp(("t",), "before", None),
                PutOp(("t",), "c", {"v": 3}),
            ]
        )
    monkeypatch.setattr(module, "_put", real)
    assert store.get(("t",), "a") is None
    assert store.get(("t",), "before").value == {"v": 0}
    assert store.search(("t",)) and [i.key for i in store.search(("t",))] == ["before"]


def test_ops_in_one_batch_see_each_other_in_order(opener: Callable[..., Opened]) -> None:
    store = opener().store
    results = store.batch(
        [
            PutOp(("o",), "k", {"v": 1}),
            GetOp(("o",), "k"),
            PutOp(("o",), "k", {"v": 2}),
            SearchOp(("o",)),
            PutOp(("o",), "k", None),
            GetOp(("o",), "k"),
            ListNamespacesOp(),
        ]
    )
    assert results[1].value == {"v": 1}
    assert [i.value for i in results[3]] == [{"v": 2}]
    assert results[5] is None
    assert results[6] == []


# --- a real LangGraph graph -------------------------------------------------------------


def test_a_graph_writes_and_searches_memories(opener: Callable[..., Opened]) -> None:
    from typing import TypedDict

    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END, START, StateGraph
    from langgraph.store.base import BaseStore

    opened = opener(index={"dims": DIMS, "embed": embed, "fields": ["text"]})

    class State(TypedDict):
        user: str
        text: str
        recalled: list[str]

    async def remember(state: State, *, store: BaseStore) -> dict[str, Any]:
        namespace = ("memories", state["user"])
        await store.aput(namespace, uuid.uuid4().hex, {"text": state["text"]})
        found = await store.asearch(namespace, query=state["text"], limit=5)
        return {"recalled": [item.value["text"] for item in found]}

    builder = StateGraph(State)
    builder.add_node("remember", remember)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", END)
    graph = builder.compile(checkpointer=InMemorySaver(), store=opened.store)

    async def run() -> list[list[str]]:
        outs = []
        for thread, text in [("t1", "likes tea"), ("t2", "lives in Oslo"), ("t3", "likes tea")]:
            out = await graph.ainvoke(
                {"user": "ada", "text": text, "recalled": []}, {"configurable": {"thread_id": thread}}
            )
            outs.append(out["recalled"])
        return outs

    first, second, third = opened.loop.run(run())
    assert first == ["likes tea"]
    assert sorted(second) == ["likes tea", "lives in Oslo"]
    # Two memories with the same text tie at the top; the other one ranks last.
    assert third[:2] == ["likes tea", "likes tea"] and third[2] == "lives in Oslo"


# --- filters in SQL mean what the shared evaluator means -----------------------------

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([1.0, 2.5, -0.5, 10, 9]),
    st.sampled_from(["", "a", "b", "B", "é", "ä", "z", "10", "9", "a b"]),
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=2), st.dictionaries(st.sampled_from(["x", "y", "1"]), inner, max_size=2)
    ),
    max_leaves=4,
)
FIELD_NAMES = st.sampled_from(["a", "b", "1", "k y", "it's"])
ITEM_VALUES = st.dictionaries(FIELD_NAMES, JSON, max_size=3)
PATHS = st.sampled_from(["a", "b", "a.x", "a.1", "1", "k y", "a.x.y", "b.y", "it's"])
CONDITIONS = st.one_of(
    SCALARS,
    st.dictionaries(st.sampled_from(["$eq", "$ne"]), SCALARS, min_size=1, max_size=2),
    st.dictionaries(
        st.sampled_from(["$gt", "$gte", "$lt", "$lte"]),
        st.one_of(st.integers(-3, 3), st.sampled_from([2.5, -0.5]), st.sampled_from(["a", "b", "é", "10", ""])),
        min_size=1,
        max_size=2,
    ),
    st.lists(st.integers(0, 1), max_size=1),
    st.fixed_dictionaries({"x": SCALARS}),
)
SEARCH_FILTERS = st.dictionaries(PATHS, CONDITIONS, min_size=1, max_size=2)


def test_filters_in_sql_mean_what_the_shared_evaluator_means(opener: Callable[..., Opened]) -> None:
    """Whatever part of a filter the SQL decides, a search keeps exactly the items the
    shared evaluator (`runstore.store.filters.matches`) keeps, page by page."""
    from runstore.store.filters import compile_filter, matches

    store = opener().store

    @settings(max_examples=40, deadline=None)
    @given(values=st.lists(ITEM_VALUES, min_size=1, max_size=8), filters=st.lists(SEARCH_FILTERS, min_size=1, max_size=4))
    def check(values: list[dict[str, Any]], filters: list[dict[str, Any]]) -> None:
        root = "f" + uuid.uuid4().hex[:10]
        store.batch([PutOp((root,), str(i), value) for i, value in enumerate(values)])
        for f in filters:
            expected = {str(i) for i, value in enumerate(values) if matches(compile_filter(f), value)}
            found = [item.key for item in store.search((root,), filter=f, limit=100)]
            assert sorted(found) == sorted(expected), f
            assert len(found) == len(set(found))
            paged = [item.key for item in store.search((root,), filter=f, limit=2, offset=1)]
            assert paged == found[1:3], f

    check()


# --- bad input: a specific error, nothing written ------------------------------------


def test_bad_input_is_refused_and_writes_nothing(opener: Callable[..., Opened]) -> None:
    from runstore.errors import InvalidStoreInputError

    def wrong_size(texts: list[str]) -> list[list[float]]:
        return [[1.0, 2.0] for _ in texts]

    store = opener(index={"dims": DIMS, "embed": embed, "fields": ["text"]}).store
    bad_batches: list[list[Any]] = [
        [PutOp(("ok",), "a", {"text": "x"}), PutOp((), "b", {"v": 1})],
        [PutOp(("ok",), "a", {"text": "x"}), PutOp(("a.b",), "b", {"v": 1})],
        [PutOp(("ok",), "a", {"text": "x"}), PutOp(("langgraph",), "b", {"v": 1})],
        [PutOp(("ok",), "a", {"text": "x"}), PutOp(("ok",), "b", {"v": object()})],
        [PutOp(("ok",), "a", {"text": "x"}), SearchOp(("ok",), {"v": {"$near": 1}})],
        [PutOp(("ok",), "a", {"text": "x"}), PutOp(("ok",), "b", {"title": "t"}, index=["text"])],
    ]
    for batch in bad_batches:
        with pytest.raises(InvalidStoreInputError):
            store.batch(batch)
    assert store.get(("ok",), "a") is None
    wrong = opener(index={"dims": DIMS, "embed": wrong_size}).store
    with pytest.raises(InvalidStoreInputError, match="dims"):
        wrong.put(("ok",), "a", {"text": "x"})
    assert wrong.get(("ok",), "a") is None


def test_from_conn_string_setup_and_schema_sql(opener: Callable[..., Opened]) -> None:
    kind = opener().kind
    url = opener().url

    async def run() -> tuple[str, str, Any]:
        if kind == "sqlite":
            from runstore.plugins.sqlite.store import SqliteStore as cls
            target = url.replace("store.db", "standalone.db")
        else:
            from runstore.plugins.postgres.store import PostgresStore as cls  # type: ignore[assignment]
            target = url.replace("schema=", "schema=standalone_")
        async with cls.from_conn_string(
            target, index={"dims": DIMS, "embed": embed, "fields": ["text"]}, ttl={"default_ttl": 5}
        ) as store:
            before = await store.schema_sql()
            await store.setup()
            after = await store.schema_sql()
            await store.aput(("a",), "k", {"text": "hello"})
            found = await store.asearch(("a",), query="hello")
        if kind == "postgres":
            import asyncpg

            schema = BackendURL.parse(target).option("schema")
            conn = await asyncpg.connect(url.split("?")[0])
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            await conn.close()
        return before, after, found

    loop = LoopThread()
    try:
        before, after, found = loop.run(run())
    finally:
        loop.stop()
    assert "runstore_store_items" in before and after == ""
    assert found[0].key == "k" and found[0].score == pytest.approx(1.0, abs=1e-5)


def test_runstore_open_hands_the_store_its_index_and_ttl(opener: Callable[..., Opened]) -> None:
    """``runstore.open(store=URL, store_index=..., store_ttl=...)``: the same file or schema
    as the other kinds, the store found by its URL's scheme."""
    import runstore

    url = opener().url
    checkpointer = url

    async def run() -> tuple[Any, Any, Any]:
        async with runstore.open(
            checkpointer=checkpointer,
            store=url,
            store_index={"dims": DIMS, "embed": embed, "fields": ["text"]},
            store_ttl={"default_ttl": 10},
        ) as stores:
            store = stores.store
            await store.aput(("users", "ada"), "m1", {"text": "likes tea"})
            found = await store.asearch(("users",), query="likes tea")
            return type(store).__name__, found[0], store.ttl_config

    loop = LoopThread()
    try:
        name, first, ttl = loop.run(run())
    finally:
        loop.stop()
    assert name == ("SqliteStore" if url.startswith("sqlite") else "PostgresStore")
    assert first.key == "m1" and first.score == pytest.approx(1.0, abs=1e-5)
    assert ttl["default_ttl"] == 10


@pytest.mark.parametrize("vec", [True, False], ids=["sql-ranking", "numpy-ranking"])
def test_a_zero_vector_scores_zero(opener: Callable[..., Opened], vec: bool) -> None:
    """Cosine against a zero vector is 0.0 (the shared rule), not a missing score."""

    def flat(texts: list[str]) -> list[list[float]]:
        return [[0.0] * 4 if t == "zero" else [1.0, 0.0, 0.0, 0.0] for t in texts]

    opened = opener(index={"dims": 4, "embed": flat, "fields": ["text"]})
    store = opened.store
    if opened.kind == "sqlite":
        store._vec = vec
    elif not vec:
        pytest.skip("PostgreSQL always ranks with numpy")
    store.clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    store.put(("z",), "zero", {"text": "zero"})
    store.put(("z",), "one", {"text": "one"})
    found = store.search(("z",), query="one")
    assert [(i.key, i.score) for i in found] == [("one", pytest.approx(1.0)), ("zero", 0.0)]
    # Equal scores (and times): by key.
    assert [(i.key, i.score) for i in store.search(("z",), query="zero")] == [("one", 0.0), ("zero", 0.0)]


def test_postgres_store_from_engine_takes_index_and_ttl(postgres_url: str) -> None:
    """``PostgresStore.from_engine`` runs on the caller's engine, which it leaves open."""
    from sqlalchemy.ext.asyncio import create_async_engine

    from runstore.plugins.postgres.store import PostgresStore

    parsed = BackendURL.parse(postgres_url)
    schema = parsed.option("schema")

    async def run() -> tuple[Any, Any]:
        engine = create_async_engine(
            parsed.without_query("schema").render(hide_password=False).replace("postgresql://", "postgresql+asyncpg://"),
            connect_args={"server_settings": {"search_path": f'"{schema}"'}},
        )
        try:
            async with PostgresStore.from_engine(
                engine, index={"dims": DIMS, "embed": embed, "fields": ["text"]}, ttl={"default_ttl": 3}
            ) as store:
                await store.setup()
                await store.aput(("e",), "k", {"text": "hello"})
                found = await store.asearch(("e",), query="hello")
                ttl = store.ttl_config
            async with engine.connect() as conn:  # still the caller's, still open
                await conn.exec_driver_sql("SELECT 1")
        finally:
            await engine.dispose()
        return found, ttl

    loop = LoopThread()
    try:
        found, ttl = loop.run(run())
    finally:
        loop.stop()
    assert found[0].key == "k" and found[0].score == pytest.approx(1.0, abs=1e-5)
    assert ttl["default_ttl"] == 3
