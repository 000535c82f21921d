"""Long-term memory store conformance (LangGraph ``BaseStore``, docs/store.md): the state
machine against a plain-dict model, then each edge rule on its own.

Every test works under a fresh root label, so tests share one provisioned store. Rules
not every store keeps are gated by capability: ``store_clock``, ``store_ttl``,
``store_nested_filters``, ``store_numeric_filters``, ``store_vector_search``,
``store_ordered_batch``, ``checked_store_input``, ``sync_api``, ``durable``,
``cross_process`` (workers in `runstore.conformance.store_workers`).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import random
from collections.abc import Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from runstore.clock import ManualClock
from runstore.errors import InvalidStoreInputError
from runstore.store.base import STORE_CONFIG_KEY

from .events_model import fresh_id
from .harness import BackendTarget
from .machines import run_machine
from .session import development_plugins
from .store_machine import StoreMachine
from .store_workers import TTL_CHECK_AT, TTL_EPOCH, TTL_ITEMS, Slot, StoreOp, read_all, store_worker

pytestmark = pytest.mark.runstore_contract("store")

EPOCH = datetime(2002, 2, 2, tzinfo=UTC)
DIMS = 8


def letters(text: str) -> list[float]:
    """A deterministic embedding: how often each of the letters a to h occurs."""
    return [float(text.count(c)) for c in "abcdefgh"]


def embed(texts: list[str]) -> list[list[float]]:
    """The test embeddings function (texts -> vectors of `DIMS`)."""
    return [letters(t) for t in texts]


def index(fields: list[str] | None = None, dims: int = DIMS) -> dict[Any, Any]:
    """What the harness provides for a store opened with semantic search."""
    config: dict[str, Any] = {"dims": dims, "embed": embed}
    if fields is not None:
        config["fields"] = fields
    return {STORE_CONFIG_KEY: (config, None)}


def run(target: BackendTarget[Any], body: Callable[[Any, tuple[str, ...]], Awaitable[None]], **kw: Any) -> None:
    """Run ``body(store, root)`` on a fresh instance, ``root`` a fresh namespace label."""
    root = (fresh_id("st"),)
    target.run(lambda store: body(store, root), **kw)


def clocked(store: Any) -> ManualClock:
    """Give ``store`` a `ManualClock` at `EPOCH` and return it."""
    clock = ManualClock(EPOCH)
    store.clock = clock
    return clock


def keys(items: Any) -> list[tuple[tuple[str, ...], str]]:
    return [(tuple(i.namespace), i.key) for i in items]


def test_store_state_machine(store_target: BackendTarget[Any]) -> None:
    run_machine(store_target, StoreMachine)


def test_put_get_delete(store_target: BackendTarget[Any]) -> None:
    async def body(store: Any, root: tuple[str, ...]) -> None:
        ns = (*root, "users", "u1")
        await store.aput(ns, "prefs", {"theme": "dark", "size": [1, 2.5, None, True]})
        got = await store.aget(ns, "prefs")
        assert got is not None and got.value == {"theme": "dark", "size": [1, 2.5, None, True]}, (
            f"contract: get returns the value put: {got}"
        )
        assert (tuple(got.namespace), got.key) == (ns, "prefs"), f"contract: an item names its namespace and key: {got}"
        assert got.updated_at >= got.created_at, f"contract: updated_at >= created_at: {got}"
        await store.aput(ns, "prefs", {"theme": "light"})
        got = await store.aget(ns, "prefs")
        assert got is not None and got.value == {"theme": "light"}, f"contract: a put replaces the value: {got}"
        await store.adelete(ns, "prefs")
        await store.adelete(ns, "never-put")
        assert await store.aget(ns, "prefs") is None, "contract: a deleted item is gone"

    run(store_target, body)


@pytest.mark.requires("checked_store_input")
def test_values_are_copies(store_target: BackendTarget[Any]) -> None:
    """A stored value is a copy of what was put, and every read returns a fresh copy:
    mutating the caller's dict or a returned item's value never changes the stored item."""

    async def body(store: Any, root: tuple[str, ...]) -> None:
        ns = (*root, "copies")
        value: dict[str, Any] = {"tags": ["a"], "nested": {"n": 1}}
        await store.aput(ns, "k", value)
        value["tags"].append("caller")
        value["nested"]["n"] = 2
        value["added"] = True
        expected = {"tags": ["a"], "nested": {"n": 1}}
        got = await store.aget(ns, "k")
        assert got is not None and got.value == expected, (
            f"contract: a stored value is a copy: mutating the dict after the put changed the item; got {got}"
        )
        for how in ("get", "search"):
            item = got if how == "get" else (await store.asearch(ns))[0]
            item.value["tags"].append(how)
            item.value["nested"]["n"] = how
            item.value["added"] = how
            again = await store.aget(ns, "k")
            assert again is not None and again.value == expected, (
                f"contract: a read returns a fresh copy: mutating the value {how} returned changed "
                f"the stored item; got {again.value if again else None}"
            )

    run(store_target, body)


def test_search_prefix_is_by_label(store_target: BackendTarget[Any]) -> None:
    async def body(store: Any, root: tuple[str, ...]) -> None:
        await store.aput((*root, "a", "b"), "k", {"v": 1})
        await store.aput((*root, "a", "bc"), "k", {"v": 2})
        await store.aput((*root, "ab"), "k", {"v": 3})
        got = keys(await store.asearch((*root, "a", "b"), limit=10))
        assert got == [((*root, "a", "b"), "k")], (
            f"contract: a search prefix matches whole labels: ('a', 'b') is not a prefix of ('a', 'bc'): {got}"
        )
        got = keys(await store.asearch((*root, "a"), limit=10))
        assert sorted(got) == [((*root, "a", "b"), "k"), ((*root, "a", "bc"), "k")], (
            f"contract: a search covers the prefix's namespace and those under it, not ('ab',): {got}"
        )

    run(store_target, body)


def test_search_pages(store_target: BackendTarget[Any]) -> None:
    async def body(store: Any, root: tuple[str, ...]) -> None:
        for i in range(7):
            await store.aput((*root, "p", str(i % 2)), f"k{i}", {"i": i, "even": i % 2 == 0})
        for filter in (None, {"even": True}):
            everything = keys(await store.asearch(root, filter=filter, limit=100))
            for size in (1, 2, 3):
                pages = [k for offset in range(0, 8, size)
                         for k in keys(await store.asearch(root, filter=filter, limit=size, offset=offset))]
                assert len(pages) == len(set(pages)) == len(everything) and set(pages) == set(everything), (
                    f"contract: search pages (limit={size}, offset 0, {size}, ...) never repeat an item and "
                    f"together list every match of {filter}: {pages}"
                )

    run(store_target, body)


def test_list_namespaces_rules(store_target: BackendTarget[Any]) -> None:
    async def body(store: Any, root: tuple[str, ...]) -> None:
        for ns in [("a", "b", "c"), ("a", "b", "d", "e"), ("a", "b", "d", "i"), ("a", "b", "f"), ("a", "c", "f")]:
            await store.aput((*root, *ns), "k", {"v": 1})

        async def listed(**kw: Any) -> list[tuple[str, ...]]:
            return [tuple(ns[1:]) for ns in await store.alist_namespaces(prefix=kw.pop("prefix", root), **kw)]

        got = await listed(prefix=(*root, "a", "b"), max_depth=4)
        assert sorted(got) == [("a", "b", "c"), ("a", "b", "d"), ("a", "b", "f")], (
            f"contract: list_namespaces max_depth cuts namespaces to that many labels, each listed once: {got}"
        )
        got = await listed(suffix=("f",))
        assert sorted(got) == [("a", "b", "f"), ("a", "c", "f")], f"contract: a suffix matches the last labels: {got}"
        got = await listed(prefix=(*root, "a", "*", "d"))
        assert sorted(got) == [("a", "b", "d", "e"), ("a", "b", "d", "i")], (
            f"contract: '*' in a prefix matches any one label: {got}"
        )
        got = await listed(suffix=("d", "*"))
        assert sorted(got) == [("a", "b", "d", "e"), ("a", "b", "d", "i")], (
            f"contract: '*' in a suffix matches any one label: {got}"
        )
        everything = await listed()
        pages = [ns for offset in range(0, 6, 2) for ns in await listed(limit=2, offset=offset)]
        assert len(everything) == 5 and sorted(pages) == sorted(everything) and len(set(pages)) == 5, (
            f"contract: list_namespaces pages (limit/offset) never repeat and together list all: {pages}"
        )

    run(store_target, body)


@pytest.mark.requires("store_namespace_cleanup")
def test_listed_namespaces_hold_items(store_target: BackendTarget[Any]) -> None:
    async def body(store: Any, root: tuple[str, ...]) -> None:
        await store.aput((*root, "kept"), "k", {"v": 1})
        await store.aput((*root, "gone"), "k", {"v": 1})
        await store.adelete((*root, "gone"), "k")
        await store.aget((*root, "read"), "k")
        await store.adelete((*root, "deleted"), "k")
        await store.asearch((*root, "searched"))
        got = [tuple(ns) for ns in await store.alist_namespaces(prefix=root)]
        assert got == [(*root, "kept")], (
            f"contract: a namespace is listed only while it holds an item (not after its last "
            f"delete, nor after a read, search or delete of a missing item): {got}"
        )

    run(store_target, body)


@pytest.mark.requires("store_numeric_filters")
def test_comparison_operators(store_target: BackendTarget[Any]) -> None:
    async def body(store: Any, root: tuple[str, ...]) -> None:
        values = {"m2": -2, "p9": 9, "p10": 10, "p10f": 10.0, "s": "10", "t": True}
        for key, n in values.items():
            await store.aput(root, key, {"n": n})

        async def found(filter: dict[str, Any]) -> set[str]:
            return {i.key for i in await store.asearch(root, filter=filter, limit=50)}

        cases: list[tuple[dict[str, Any], set[str]]] = [
            ({"n": {"$gt": 9}}, {"p10", "p10f"}),
            ({"n": {"$gte": 9}}, {"p9", "p10", "p10f"}),
            ({"n": {"$lt": 9}}, {"m2"}),
            ({"n": {"$lte": -2}}, {"m2"}),
            ({"n": {"$gt": -3, "$lt": 10}}, {"m2", "p9"}),
            ({"n": {"$gt": "1"}}, {"s"}),
            ({"n": 10}, {"p10", "p10f"}),
            ({"n": {"$eq": True}}, {"t"}),
        ]
        for filter, want in cases:
            got = await found(filter)
            assert got == want, (
                f"contract: filter {filter} compares as JSON types (numbers as numbers, strings as "
                f"strings, a bool never a number): got {sorted(got)}, expected {sorted(want)}"
            )

    run(store_target, body)


@pytest.mark.requires("store_nested_filters")
def test_nested_filters(store_target: BackendTarget[Any]) -> None:
    async def body(store: Any, root: tuple[str, ...]) -> None:
        await store.aput(root, "a", {"meta": {"tag": "red", "level": 2}, "kind": "note"})
        await store.aput(root, "b", {"meta": {"tag": "blue", "level": 1}, "kind": "note"})
        await store.aput(root, "c", {"meta": "red", "kind": "note"})
        for filter in [{"meta.tag": "red"}, {"meta": {"tag": "red"}}, {"meta.level": {"$gt": 1}}]:
            got = sorted(i.key for i in await store.asearch(root, filter=filter, limit=10))
            assert got == ["a"], (
                f"contract: search returns the items that match the filter, which reaches nested keys by "
                f"dotted path or nested mapping (a subset match): "
                f"{filter} -> {got}"
            )

    run(store_target, body)


@pytest.mark.requires("store_clock")
def test_timestamps_on_the_store_clock(store_target: BackendTarget[Any]) -> None:
    async def body(store: Any, root: tuple[str, ...]) -> None:
        clock = clocked(store)
        await store.aput(root, "k", {"v": 1})
        first = clock()
        clock.advance(5)
        await store.aput(root, "k", {"v": 2})
        got = await store.aget(root, "k")
        assert got is not None and got.created_at.tzinfo is not None, (
            f"contract: created_at and updated_at are timezone-aware datetimes: {got}"
        )
        assert (got.created_at, got.updated_at) == (first, clock()), (
            f"contract: created_at is kept across updates and updated_at is the last put, on the store's clock: {got}"
        )

    run(store_target, body)


@pytest.mark.requires("store_ttl", "store_clock")
def test_ttl_expiry_refresh_and_sweep(store_target: BackendTarget[Any]) -> None:
    async def body(store: Any, root: tuple[str, ...]) -> None:
        clock = clocked(store)
        await store.aput(root, "short", {"v": 1}, ttl=1)
        await store.aput(root, "kept", {"v": 2}, ttl=None)
        clock.advance(59)
        assert await store.aget(root, "short", refresh_ttl=False) is not None, "contract: an item lives until its ttl"
        clock.advance(1)
        assert await store.aget(root, "short") is None, (
            "contract: an item is gone exactly ttl minutes after its last write (expiry is inclusive)"
        )
        assert await store.aget(root, "kept") is not None, "contract: ttl=None never expires"
        await store.aput(root, "read", {"v": 3}, ttl=1)
        clock.advance(50)
        assert await store.aget(root, "read", refresh_ttl=True) is not None
        clock.advance(50)
        assert await store.aget(root, "read", refresh_ttl=False) is not None, (
            "contract: a read with refresh_ttl restarts the item's ttl: it lives until ttl minutes "
            "after its last write or refreshing read"
        )
        clock.advance(5)
        assert [i.key for i in await store.asearch(root, filter={"v": 3}, refresh_ttl=True)] == ["read"]
        clock.advance(50)
        assert await store.aget(root, "read", refresh_ttl=False) is not None, (
            "contract: a search with refresh_ttl restarts the ttl of the items it returns: each "
            "lives until ttl minutes after its last write or refreshing read"
        )
        clock.advance(20)
        assert await store.aget(root, "read") is None, "contract: a read without refresh leaves the ttl running"
        await store.aput(root, "swept", {"v": 4}, ttl=1)
        clock.advance(61)
        removed = await store.asweep_expired()
        assert removed >= 1, f"contract: asweep_expired deletes expired items and counts them: {removed}"
        assert [i.key for i in await store.asearch(root, limit=10)] == ["kept"], (
            "contract: expired items are never returned"
        )

    run(store_target, body)


@pytest.mark.requires("store_ttl", "store_clock")
def test_ttl_config_default_ttl_and_refresh_on_read(store_target: BackendTarget[Any]) -> None:
    """The store's ``TTLConfig``: a put without ``ttl`` lives ``default_ttl`` minutes
    (``ttl=None`` never expires); with ``refresh_on_read=False`` a plain get or search
    leaves the TTL running, and a call's ``refresh_ttl=True`` still restarts it (store.md "TTL")."""

    async def body(store: Any, root: tuple[str, ...]) -> None:
        clock = clocked(store)
        for key in ("default", "get", "search", "asked"):
            await store.aput(root, key, {"k": key})
        await store.aput(root, "forever", {"k": "forever"}, ttl=None)
        clock.advance(30 * 60)
        await store.aget(root, "get")
        assert [i.key for i in await store.asearch(root, filter={"k": "search"})] == ["search"]
        await store.aget(root, "asked", refresh_ttl=True)
        clock.advance(30 * 60 - 1)
        assert await store.aget(root, "default", refresh_ttl=False) is not None, (
            "contract: an item put without a ttl lives default_ttl minutes"
        )
        clock.advance(1)
        gone = {key: await store.aget(root, key, refresh_ttl=False) is None
                for key in ("default", "get", "search", "asked", "forever")}
        assert gone["default"], "contract: an item put without a ttl is gone default_ttl minutes after its put"
        assert gone["get"] and gone["search"], (
            f"contract: with refresh_on_read=False a plain get or search leaves the ttl running (gone: {gone})"
        )
        assert not gone["asked"], "contract: a call's refresh_ttl=True restarts the ttl even with refresh_on_read=False"
        assert not gone["forever"], "contract: put(ttl=None) never expires, whatever default_ttl says"

    run(store_target, body, provided={STORE_CONFIG_KEY: (None, {"default_ttl": 60, "refresh_on_read": False})})


@pytest.mark.requires("store_vector_search")
def test_semantic_search(store_target: BackendTarget[Any]) -> None:
    async def body(store: Any, root: tuple[str, ...]) -> None:
        await store.aput(root, "aaa", {"text": "aaab", "title": "h"})
        await store.aput(root, "bbb", {"text": "bbba", "title": "a"})
        await store.aput(root, "ccc", {"text": "cccc", "title": "c"})
        await store.aput(root, "skip", {"text": "aaaa"}, index=False)
        await store.aput(root, "titled", {"text": "hhhh", "title": "aaaa"}, index=["title"])
        got = await store.asearch(root, query="aaaa", limit=10)
        order = [i.key for i in got]
        assert order[:3] == ["titled", "aaa", "bbb"] and order[-1] == "skip", (
            f"contract: search(query=) ranks by cosine similarity of the indexed fields, best first; "
            f"index=False items come last without a score; a put's index list embeds only those fields: {order}"
        )
        scores = {i.key: i.score for i in got}
        assert scores["skip"] is None and abs(scores["titled"] - 1.0) < 1e-6, (
            f"contract: SearchItem.score is the cosine similarity (None when not indexed): {scores}"
        )
        assert abs(scores["aaa"] - 3 / 10**0.5) < 1e-6 and scores["ccc"] == pytest.approx(0.0, abs=1e-9), (
            f"contract: SearchItem.score is the cosine similarity of query and item vectors: {scores}"
        )
        page = [i.key for i in await store.asearch(root, query="aaaa", limit=2, offset=1)]
        assert page == order[1:3], f"contract: limit/offset page the ranked results: {page} vs {order}"
        filtered = [i.key for i in await store.asearch(root, query="aaaa", filter={"title": "a"}, limit=10)]
        assert filtered == ["bbb"], f"contract: a filter applies with a query: {filtered}"

    run(store_target, body, provided=index(["text"]))


@pytest.mark.requires("store_vector_search", "checked_store_input")
def test_semantic_search_bad_input(store_target: BackendTarget[Any]) -> None:
    async def body(store: Any, root: tuple[str, ...]) -> None:
        with pytest.raises(InvalidStoreInputError, match="title"):
            await store.aput(root, "k", {"text": "a"}, index=["title"])
        assert await store.aget(root, "k") is None, "contract: a refused put writes nothing"

    run(store_target, body, provided=index(["text"]))

    async def wrong_dims(store: Any, root: tuple[str, ...]) -> None:
        with pytest.raises(InvalidStoreInputError, match="dims"):
            await store.aput(root, "k", {"text": "a"})
        assert await store.aget(root, "k") is None, "contract: a put whose embedding has the wrong size writes nothing"

    run(store_target, wrong_dims, provided=index(["text"], dims=DIMS + 1))


@pytest.mark.requires("store_ordered_batch")
def test_batch_applies_in_order(store_target: BackendTarget[Any]) -> None:
    from langgraph.store.base import GetOp, PutOp, SearchOp

    async def body(store: Any, root: tuple[str, ...]) -> None:
        ops = [
            PutOp(root, "k", {"v": 1}),
            PutOp(root, "k", {"v": 2}),
            GetOp(root, "k"),
            SearchOp(root, {"v": 2}, 10, 0),
            PutOp(root, "k", None),
            SearchOp(root, None, 10, 0),
        ]
        got = await store.abatch(ops)
        assert got[0] is None and got[1] is None and got[4] is None, f"contract: a put's result is None: {got}"
        assert got[2] is not None and got[2].value == {"v": 2} and keys(got[3]) == [(root, "k")] and got[5] == [], (
            f"contract: ops of one batch apply in order, each seeing the puts before it: {got}"
        )

    run(store_target, body)


BAD_CALLS: list[tuple[str, Callable[[Any, tuple[str, ...]], Awaitable[Any]]]] = [
    ("empty namespace", lambda s, r: s.aput((), "k", {"v": 1})),
    ("empty label", lambda s, r: s.aput((*r, ""), "k", {"v": 1})),
    ("label with a period", lambda s, r: s.aput((*r, "a.b"), "k", {"v": 1})),
    ("reserved root", lambda s, r: s.aput(("langgraph", *r), "k", {"v": 1})),
    ("label not a string", lambda s, r: s.aput((*r, 1), "k", {"v": 1})),
    ("NUL in a key", lambda s, r: s.aput(r, "k\x00", {"v": 1})),
    ("value not an object", lambda s, r: s.aput(r, "k", [1, 2])),
    ("value not JSON", lambda s, r: s.aput(r, "k", {"v": object()})),
    ("NaN in a value", lambda s, r: s.aput(r, "k", {"v": float("nan")})),
    ("unknown operator", lambda s, r: s.asearch(r, filter={"v": {"$regex": "x"}})),
    ("negative ttl", lambda s, r: s.aput(r, "k", {"v": 1}, ttl=-1)),
    ("negative limit", lambda s, r: s.asearch(r, limit=-1)),
]


@pytest.mark.requires("checked_store_input")
def test_a_batch_with_one_bad_op_writes_nothing(store_target: BackendTarget[Any]) -> None:
    """The whole batch is checked before any op runs: puts and deletes ahead of a bad op
    are not applied (store.md "Batches")."""
    from langgraph.store.base import PutOp

    async def body(store: Any, root: tuple[str, ...]) -> None:
        await store.aput(root, "kept", {"v": 0})
        ops = [PutOp(root, "good", {"v": 1}), PutOp(root, "kept", None), PutOp(root, "bad", {"v": float("nan")})]
        try:
            await store.abatch(ops)
        except InvalidStoreInputError:
            pass
        else:
            raise AssertionError("contract: a batch holding a bad op is refused with InvalidStoreInputError")
        good, kept = await store.aget(root, "good"), await store.aget(root, "kept")
        assert good is None and kept is not None and kept.value == {"v": 0}, (
            "contract: a batch with one bad op writes nothing (the whole batch is checked before any op "
            f"runs); after it: good={good}, kept={kept}"
        )

    run(store_target, body)


@pytest.mark.requires("checked_store_input")
@pytest.mark.parametrize("case", [name for name, _ in BAD_CALLS])
def test_bad_input_is_refused(store_target: BackendTarget[Any], case: str) -> None:
    call = dict(BAD_CALLS)[case]

    async def body(store: Any, root: tuple[str, ...]) -> None:
        try:
            await call(store, root)
        except InvalidStoreInputError as exc:
            assert str(exc), "contract: the error says what was wrong"
        else:
            raise AssertionError(f"contract: {case} is refused with InvalidStoreInputError")
        assert await store.asearch(root) == [] and await store.aget(root, "k") is None, (
            f"contract: a refused call ({case}) writes nothing"
        )

    run(store_target, body)


@pytest.mark.requires("sync_api")
def test_sync_api(store_target: BackendTarget[Any]) -> None:
    async def body(store: Any, root: tuple[str, ...]) -> None:
        def calls() -> Any:
            store.put(root, "k", {"v": 1})
            got = store.get(root, "k")
            found = store.search(root, filter={"v": 1})
            spaces = store.list_namespaces(prefix=root)
            store.delete(root, "k")
            return got, found, spaces, store.get(root, "k")

        # Off the loop thread, as LangGraph's sync API is meant to be called.
        got, found, spaces, after = await asyncio.to_thread(calls)
        assert got is not None and got.value == {"v": 1} and keys(found) == [(root, "k")], (
            f"contract: the sync twins behave as the async methods: {got}, {found}"
        )
        assert [tuple(s) for s in spaces] == [root] and after is None, (
            f"contract: the sync twins behave as the async methods: {spaces}, {after}"
        )

    run(store_target, body)


@pytest.mark.requires("durable")
def test_durable(store_target: BackendTarget[Any]) -> None:
    root = (fresh_id("dur"),)

    async def write(store: Any) -> None:
        await store.aput(root, "k", {"v": 1})

    async def read(store: Any) -> Any:
        return await store.aget(root, "k")

    store_target.run(write)
    got = store_target.run(read)
    assert got is not None and got.value == {"v": 1}, "contract: items survive closing and reopening the store"


def _process_plan(
    root: tuple[str, ...], workers: int, rounds: int, per_round: int
) -> tuple[list[list[list[StoreOp]]], list[Slot], list[tuple[str, ...]]]:
    """Per worker and round, puts and deletes of keys every worker writes and keys only it
    writes, in two nested shared namespaces and in a namespace of its own; every slot."""
    rng = random.Random(0)
    shared = [(*root, "shared"), (*root, "shared", "deep")]
    owns = [(*root, "own", f"p{i}") for i in range(workers)]
    overlapping = [(ns, f"s{j}") for ns in shared for j in range(2)]
    mine = [
        [(ns, f"p{i}-{j}") for ns in shared for j in range(2)] + [(owns[i], f"k{j}") for j in range(2)]
        for i in range(workers)
    ]
    plans = [
        [
            [
                ("delete", *slot, None) if rng.random() < 0.3 else ("put", *slot, {"p": i, "r": r, "n": n})
                for n, slot in enumerate(rng.choice(overlapping + mine[i]) for _ in range(per_round))
            ]
            for r in range(rounds)
        ]
        for i in range(workers)
    ]
    return plans, overlapping + [s for m in mine for s in m], owns


def _check_read(read: dict[str, Any], cleanup: bool, where: str) -> None:
    """A reader's search and listing agree with its gets."""
    live = {slot: v for slot, v in read["gets"].items() if v is not None}
    assert read["search"] == live, (
        f"contract: cross_process: search returns exactly the items get returns ({where}): "
        f"search {sorted(read['search'])}, get {sorted(live)}"
    )
    held, listed = {ns for ns, _ in live}, set(read["namespaces"])
    assert (listed == held) if cleanup else (listed >= held), (
        f"contract: cross_process: list_namespaces lists the namespaces holding the items get "
        f"returns ({where}): listed {sorted(listed)}, holding items {sorted(held)}"
    )


def _check_rounds(
    plans: list[list[list[StoreOp]]], results: list[dict[str, Any]], slots: list[Slot],
    owns: list[tuple[str, ...]], cleanup: bool,
) -> dict[Slot, Any]:
    """Check every worker's reads round by round; return the value (or None) of every slot
    the workers agreed on after the last round."""
    state: dict[Slot, Any] = {}
    own_state: list[dict[str, Any]] = [{} for _ in plans]
    for r in range(len(plans[0])):
        # A slot written in this round holds some worker's last write of the round to it
        # (the writes of one worker are ordered, those of different workers race).
        last: dict[Slot, list[Any]] = {}
        for i, plan in enumerate(plans):
            mine: dict[Slot, Any] = {}
            for _action, ns, key, value in plan[r]:
                mine[(ns, key)] = value
                if ns == owns[i]:
                    own_state[i][key] = value
            for slot, value in mine.items():
                last.setdefault(slot, []).append(value)
            own = {k: v for k, v in own_state[i].items() if v is not None}
            assert results[i]["own"][r] == own, (
                f"contract: cross_process: a search while other processes write returns exactly "
                f"this process's items in its own namespace (round {r}, process {i}): "
                f"{results[i]['own'][r]}, expected {own}"
            )
        for slot in slots:
            allowed = last.get(slot, [state.get(slot)])
            seen = [res["read"][r]["gets"][slot] for res in results]
            for i, value in enumerate(seen):
                assert value in allowed, (
                    f"contract: cross_process: a read sees the last write acknowledged in another "
                    f"process before it began (round {r}, process {i}, {slot}): got {value}, "
                    f"acknowledged last writes {allowed} (None: deleted)"
                )
            assert all(value == seen[0] for value in seen), (
                f"contract: cross_process: every process reads the same value once the writes are "
                f"acknowledged (round {r}, {slot}): {seen}"
            )
            state[slot] = seen[0]
        for i, res in enumerate(results):
            _check_read(res["read"][r], cleanup, f"round {r}, process {i}")
    return state


def _in_processes(
    store_target: BackendTarget[Any],
    request: pytest.FixtureRequest,
    root: tuple[str, ...],
    plans: list[list[list[StoreOp]]],
    owns: list[tuple[str, ...]],
    slots: list[Slot],
    roles: list[tuple[str, tuple[str, ...]]] | None,
) -> list[dict[str, Any]]:
    """Run `store_worker` in one spawned OS process per plan, on the store's URL."""
    url = store_target.url.render(hide_password=False)
    plugins = development_plugins(request.config)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(len(plans))
        with ProcessPoolExecutor(max_workers=len(plans), mp_context=ctx) as pool:
            futures = [
                pool.submit(
                    store_worker, url, plugins, root, plans[i], owns[i], slots,
                    None if roles is None else roles[i], barrier,
                )
                for i in range(len(plans))
            ]
            return [f.result(timeout=300) for f in futures]


@pytest.mark.requires("cross_process")
def test_store_across_processes(store_target: BackendTarget[Any], request: pytest.FixtureRequest) -> None:
    """3 OS processes put and delete keys of shared namespaces (some keys written by all,
    some by one) in rounds that start together; after each round every process reads the
    last acknowledged write per key, and search and list_namespaces agree with its gets,
    as does a fresh store afterwards."""
    workers, rounds, per_round = 3, 3, 8
    root = (fresh_id("xproc"),)
    plans, slots, owns = _process_plan(root, workers, rounds, per_round)
    results = _in_processes(store_target, request, root, plans, owns, slots, None)
    cleanup = store_target.has("store_namespace_cleanup")
    state = _check_rounds(plans, results, slots, owns, cleanup)

    async def fresh(store: Any) -> Any:
        return await read_all(store, root, slots)

    read = store_target.run(fresh)
    assert read["gets"] == state, (
        f"contract: cross_process: a fresh store reads every process's last acknowledged write "
        f"(no lost put, no item back after its delete): "
        f"{ {s: (read['gets'][s], v) for s, v in state.items() if read['gets'][s] != v} }"
    )
    _check_read(read, cleanup, "a fresh store")


@pytest.mark.requires("cross_process", "store_ttl", "store_clock")
def test_store_ttl_across_processes(store_target: BackendTarget[Any], request: pytest.FixtureRequest) -> None:
    """3 OS processes share TTL'd items: items swept by one process are gone for another
    whose clock has not reached their expiry, and an item whose TTL a read refreshed
    survives the sweep, also for a fresh store afterwards."""
    workers = 3
    ttl_ns: tuple[str, ...] = (fresh_id("xproc-ttl"),)
    roles: list[tuple[str, tuple[str, ...]]] = [("writer", ttl_ns), ("sweeper", ttl_ns), *[("idle", ttl_ns)] * (workers - 2)]
    owns: list[tuple[str, ...]] = [(*ttl_ns, f"w{i}") for i in range(workers)]
    results = _in_processes(store_target, request, ttl_ns, [[] for _ in range(workers)], owns, [], roles)
    cleanup = store_target.has("store_namespace_cleanup")
    swept, seen = results[1]["ttl"]["swept"], results[0]["ttl"]["seen"]
    expired = [k for k, minutes in TTL_ITEMS.items() if minutes is not None and k != "refreshed"]
    assert swept >= len(expired), (
        f"contract: asweep_expired deletes the items expired on its clock, whichever process "
        f"wrote them: removed {swept}, at least {len(expired)} expected"
    )
    gone = {slot[1]: value for slot, value in seen["gets"].items()}
    want = {k: (None if k in expired else {"key": k}) for k in TTL_ITEMS}
    assert gone == want, (
        f"contract: cross_process: items another process swept are gone (though this process's "
        f"clock has not reached their expiry), and an item whose TTL a read refreshed survives "
        f"the sweep: {gone}, expected {want}"
    )
    _check_read(seen, cleanup, "after another process's sweep")

    async def fresh_ttl(store: Any) -> Any:
        clocked(store).set(TTL_EPOCH + timedelta(seconds=TTL_CHECK_AT))
        return await read_all(store, ttl_ns, [(ttl_ns, k) for k in TTL_ITEMS])

    read = store_target.run(fresh_ttl)
    assert {slot[1]: value for slot, value in read["gets"].items()} == want, (
        f"contract: cross_process: a fresh store reads what the sweep left: {read['gets']}, expected {want}"
    )
    _check_read(read, cleanup, "a fresh store after the sweep")
