"""`StoreMachine`: the store suite's Hypothesis state machine (exported by
`runstore.conformance.machines`, where subclassing it is described).

Puts, deletes, gets, filtered searches with pages, namespace listings and (for stores
declaring ``store_clock``/``store_ttl``) a `ManualClock` the machine moves, all under one
fresh root label per example, checked against `StoreModel`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from langgraph.store.base import GetOp, ListNamespacesOp, MatchCondition, PutOp

from runstore.clock import ManualClock
from runstore.store import matches_labels

from .events_model import fresh_id
from .store_model import StoreModel

#: Where the machine's clock starts.
MACHINE_EPOCH = datetime(2001, 1, 1, tzinfo=UTC)
#: Namespaces under the example's root label (depths 2 to 4 counting the root).
SUBSPACES: list[tuple[str, ...]] = [("a",), ("a", "x"), ("a", "y"), ("b",), ("b", "x", "z")]
KEYS = ["k0", "k1", "k2"]
KINDS = ["note", "fact", "task"]
TAGS = ["red", "blue"]


def values() -> st.SearchStrategy[dict[str, Any]]:
    """Item values: the keys filters reach, one of them nested."""
    return st.fixed_dictionaries(
        {
            "kind": st.sampled_from(KINDS),
            "n": st.integers(-20, 20),
            "meta": st.fixed_dictionaries({"tag": st.sampled_from(TAGS), "level": st.integers(0, 3)}),
        }
    )


def keys_of(items: Any) -> list[tuple[tuple[str, ...], str]]:
    """``(namespace, key)`` of each returned item, in order."""
    return [(tuple(i.namespace), i.key) for i in items]


class StoreMachine(RuleBasedStateMachine):
    """Drives a store with random calls; every answer is checked against `StoreModel`."""

    def __init__(self, session: Any) -> None:
        super().__init__()
        self.session = session
        self.target = session.target
        self.store: Any = session.backend
        self.root = (fresh_id("sm"),)
        self.model = StoreModel()
        self.clock: ManualClock | None = None
        if self.target.has("store_clock"):
            self.clock = ManualClock(MACHINE_EPOCH)
            self.store.clock = self.clock
        self.ttl = self.target.has("store_ttl") and self.clock is not None
        self.steps = 0
        #: namespaces a delete left without a live item (listings over them are labelled)
        self.emptied: set[tuple[str, ...]] = set()
        #: whether a delete removed a live item in this example
        self.deleted = False

    def teardown(self) -> None:
        for ns, key in list(self.model.items):
            self.session.run(self.store.adelete(ns, key))

    def now(self) -> datetime | None:
        return self.clock() if self.clock is not None else None

    def ns(self, data: st.DataObject) -> tuple[str, ...]:
        namespace = self.root + data.draw(st.sampled_from(SUBSPACES), label="namespace")
        self.model.touched.add(namespace)
        return namespace

    def check_listing(self, got: Any, prefix: Any, suffix: Any, max_depth: int | None, what: str) -> None:
        """A listing's answer: exactly the model's, or for a store without
        ``store_namespace_cleanup``, at least those and only namespaces a call named."""
        found = [tuple(ns) for ns in got]
        expected = self.model.namespaces(prefix, suffix, max_depth, self.now())
        loose = expected if self.target.has("store_namespace_cleanup") else self.model.namespaces(
            prefix, suffix, max_depth, self.now(), loose=True
        )
        assert len(found) == len(set(found)) and expected <= set(found) <= loose, (
            f"contract: {what} lists each namespace holding a live item once, matched ('*' any "
            f"label) and cut to max_depth labels: got {sorted(found)}, expected {sorted(expected)}"
        )

    def label_listing(self, what: str, prefix: tuple[str, ...]) -> None:
        """Label a read over what a delete (or, after every step, an expiry) changed: how
        often each is drawn."""
        now = self.now()
        live = self.model.live(now)
        under = [k for k in self.model.items if matches_labels(k[0], "prefix", prefix)]
        if what.startswith("invariant") and any(k not in live for k in under):
            event(f"store machine: {what} over an expired, unswept item")
        if self.deleted:
            event(f"store machine: {what} after a delete")
        if any(matches_labels(ns, "prefix", prefix) and not any(k[0] == ns for k in live) for ns in self.emptied):
            event(f"store machine: {what} over a namespace a delete emptied")

    def draw_filter(self, data: st.DataObject) -> dict[str, Any] | None:
        """A filter the store declares it evaluates: plain equality always, comparisons and
        nested keys when declared."""
        kinds = ["none", "eq", "eq_op", "ne", "two"]
        if self.target.has("store_numeric_filters"):
            kinds += ["range", "range"]
        if self.target.has("store_nested_filters"):
            kinds += ["dotted", "nested", "nested_op"]
        kind = data.draw(st.sampled_from(kinds), label="filter kind")
        if kind in ("dotted", "nested", "nested_op"):
            event("store machine: a nested filter")
        value = data.draw(st.sampled_from(KINDS), label="kind value")
        bound = data.draw(st.integers(-21, 21), label="bound")
        tag = data.draw(st.sampled_from(TAGS), label="tag")
        filters: dict[str, Any] = {
            "none": None,
            "eq": {"kind": value},
            "eq_op": {"kind": {"$eq": value}},
            "ne": {"kind": {"$ne": value}},
            "two": {"kind": value, "n": bound},
            "range": {"n": {data.draw(st.sampled_from(["$gt", "$gte", "$lt", "$lte"]), label="op"): bound}},
            "dotted": {"meta.tag": tag},
            "nested": {"meta": {"tag": tag}},
            "nested_op": {"meta.level": {"$gte": data.draw(st.integers(0, 3), label="level")}},
        }
        return filters[kind]

    def check_item(self, got: Any, namespace: tuple[str, ...], key: str, what: str) -> None:
        expected = self.model.get(namespace, key, self.now())
        assert expected is not None
        assert got.value == expected.value, (
            f"contract: {what} returns the value last put at {namespace}/{key}: {got.value} != {expected.value}"
        )
        if self.clock is not None:
            assert (got.created_at, got.updated_at) == (expected.created_at, expected.updated_at), (
                "contract: created_at is the first put's time (kept across updates), updated_at "
                f"the last put's, on the store's clock: got {got.created_at}, {got.updated_at}; "
                f"expected {expected.created_at}, {expected.updated_at}"
            )

    # -- writes ----------------------------------------------------------------------

    @rule(data=st.data(), value=values())
    def put(self, data: st.DataObject, value: dict[str, Any]) -> None:
        namespace, key = self.ns(data), data.draw(st.sampled_from(KEYS), label="key")
        ttl = data.draw(st.sampled_from([None, None, 1.0, 2.0]), label="ttl") if self.ttl else None
        if self.ttl:
            self.session.run(self.store.aput(namespace, key, value, ttl=ttl))
        else:
            self.session.run(self.store.aput(namespace, key, value))
        self.model.put(namespace, key, value, ttl, self.now())

    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        # Mostly an item the model holds: a delete of a missing item changes nothing to
        # check afterwards.
        namespace, key = self.pick(data)
        self.session.run(self.store.adelete(namespace, key))
        if self.model.get(namespace, key, self.now()) is not None:
            self.deleted = True
            event("store machine: delete of a live item")
            if not any(ns == namespace and k != key for ns, k in self.model.live(self.now())):
                self.emptied.add(namespace)
        self.model.delete(namespace, key)

    @precondition(lambda self: self.clock is not None)
    @rule(seconds=st.sampled_from([30, 60, 90, 150]))
    def advance(self, seconds: int) -> None:
        assert self.clock is not None
        live = len(self.model.live(self.now()))
        self.clock.advance(seconds)
        if len(self.model.live(self.now())) < live:
            event("store machine: advance expires an item")

    @precondition(lambda self: self.ttl)
    @rule()
    def sweep(self) -> None:
        self.session.run(self.store.asweep_expired())
        now = self.now()
        for k in [k for k in self.model.items if k not in self.model.live(now)]:
            del self.model.items[k]

    # -- reads -----------------------------------------------------------------------

    def pick(self, data: st.DataObject) -> tuple[tuple[str, ...], str]:
        """Mostly an item the model holds (in put order), sometimes any namespace and key."""
        known = list(self.model.items)
        if known and data.draw(st.integers(0, 9), label="known") < 7:
            return data.draw(st.sampled_from(known), label="item")
        return self.ns(data), data.draw(st.sampled_from(KEYS), label="key")

    @rule(data=st.data())
    def get(self, data: st.DataObject) -> None:
        namespace, key = self.pick(data)
        refresh = data.draw(st.booleans(), label="refresh") if self.ttl else True
        got = self.session.run(self.store.aget(namespace, key, refresh_ttl=refresh))
        expected = self.model.get(namespace, key, self.now())
        if expected is None:
            assert got is None, f"contract: get of a deleted, expired or never-put item returns None; got {got}"
            return
        assert got is not None, (
            f"contract: get returns an item until ttl minutes after its last write or refreshing read "
            f"(ttl={expected.ttl}, expires at {expected.expires_at}, now {self.now()}): {namespace}/{key} is missing"
        )
        self.check_item(got, namespace, key, "get")
        if refresh:
            self.model.refresh(namespace, key, self.now())

    def _scope(self, data: st.DataObject) -> tuple[str, ...]:
        return self.root + data.draw(st.sampled_from([(), ("a",), ("b",), ("a", "x")]), label="prefix")

    @rule(data=st.data())
    def search(self, data: st.DataObject) -> None:
        prefix, filter = self._scope(data), self.draw_filter(data)
        limit, offset = data.draw(st.integers(1, 6), label="limit"), data.draw(st.integers(0, 4), label="offset")
        refresh = data.draw(st.booleans(), label="refresh") if self.ttl else True
        got = self.session.run(
            self.store.asearch(prefix, filter=filter, limit=limit, offset=offset, refresh_ttl=refresh)
        )
        expected = self.model.search(prefix, filter, self.now())
        self.label_listing("search", prefix)
        keys = keys_of(got)
        assert len(set(keys)) == len(keys), f"contract: a search page lists each item once: {keys}"
        extra = sorted(set(keys) - expected.keys())
        assert not extra, (
            f"contract: search returns only live items under the prefix that match the filter "
            f"{filter}: {extra} do not"
        )
        want = min(limit, max(0, len(expected) - offset))
        assert len(keys) == want, (
            f"contract: search returns min(limit, matches - offset) items: {len(expected)} match "
            f"{filter} under {prefix}, limit={limit} offset={offset}, got {len(keys)}"
        )
        for item, (ns, key) in zip(got, keys, strict=True):
            self.check_item(item, ns, key, "search")
            if refresh:
                self.model.refresh(ns, key, self.now())

    # Paging needs several items to page through, and half the time no filter to thin them.
    @precondition(lambda self: len(self.model.live(self.now())) >= 2)
    @rule(data=st.data())
    def page_through(self, data: st.DataObject) -> None:
        prefix = self._scope(data)
        filter = self.draw_filter(data) if data.draw(st.booleans(), label="filtered") else None
        size = data.draw(st.integers(1, 3), label="page size")
        expected = self.model.search(prefix, filter, self.now())
        stamps = [item.updated_at for item in expected.values()]
        if len(expected) > size and len(set(stamps)) < len(stamps):
            event("store machine: pages through items tied on updated_at")
        seen: list[tuple[tuple[str, ...], str]] = []
        for offset in range(0, len(expected) + size, size):
            page = keys_of(
                self.session.run(
                    self.store.asearch(prefix, filter=filter, limit=size, offset=offset, refresh_ttl=False)
                )
            )
            seen += page
            if len(page) < size:
                break
        assert len(seen) == len(set(seen)), (
            f"contract: search pages (limit={size}, offset 0, {size}, ...) never repeat an item: got {seen}"
        )
        assert set(seen) == expected.keys(), (
            f"contract: search pages (limit={size}, offset 0, {size}, ...) together list every live item "
            f"under the prefix that match the filter {filter}: got {sorted(seen)}, expected {sorted(expected)}"
        )

    @rule(data=st.data())
    def list_namespaces(self, data: st.DataObject) -> None:
        prefix = self.root + data.draw(st.sampled_from([(), ("a",), ("*", "x"), ("b", "*")]), label="prefix")
        suffix = data.draw(st.sampled_from([None, None, ("x",), ("*",), ("x", "*")]), label="suffix")
        max_depth = data.draw(st.sampled_from([None, None, 1, 2, 3]), label="max_depth")
        got = self.session.run(
            self.store.alist_namespaces(prefix=prefix, suffix=suffix, max_depth=max_depth, limit=100)
        )
        what = f"list_namespaces(prefix={prefix}, suffix={suffix}, max_depth={max_depth})"
        self.label_listing("list_namespaces", prefix)
        self.check_listing(got, prefix, suffix, max_depth, what)

    @invariant()
    def whole_store(self) -> None:
        """After every step: the root's items and its namespaces at a depth that cycles
        with the steps (swarm testing leaves some examples without the read rules)."""
        self.steps += 1
        everything = self.session.run(self.store.asearch(self.root, limit=100, refresh_ttl=False))
        expected = self.model.search(self.root, None, self.now())
        assert sorted(keys_of(everything)) == sorted(expected), (
            f"contract: search returns every live item under the prefix that match the filter None: "
            f"got {sorted(keys_of(everything))}, expected {sorted(expected)}"
        )
        self.label_listing("invariant: search and list_namespaces", self.root)
        max_depth = [None, 1, 2, 3, 4][self.steps % 5]
        got = self.session.run(self.store.alist_namespaces(prefix=self.root, max_depth=max_depth, limit=100))
        self.check_listing(got, self.root, None, max_depth, f"list_namespaces(prefix={self.root}, max_depth={max_depth})")
        if self.steps % 3 == 0:
            self.page_root(expected)

    def page_root(self, expected: dict[tuple[tuple[str, ...], str], Any]) -> None:
        """Every item under the root in pages of two: items put at one instant tie on
        updated_at, and pages must still neither repeat nor skip one of them."""
        stamps = [item.updated_at for item in expected.values()]
        if len(expected) > 2 and len(set(stamps)) < len(stamps):
            event("store machine: invariant: pages through items tied on updated_at")
        seen: list[tuple[tuple[str, ...], str]] = []
        for offset in range(0, len(expected) + 2, 2):
            page = keys_of(self.session.run(self.store.asearch(self.root, limit=2, offset=offset, refresh_ttl=False)))
            seen += page
            if len(page) < 2:
                break
        assert len(seen) == len(set(seen)) and set(seen) == expected.keys(), (
            f"contract: search pages (limit=2, offset 0, 2, ...) never repeat an item and together list "
            f"every live item under the prefix: got {seen}, expected {sorted(expected)}"
        )

    @precondition(lambda self: self.target.has("store_ordered_batch"))
    @rule(data=st.data(), value=values())
    def ordered_batch(self, data: st.DataObject, value: dict[str, Any]) -> None:
        namespace, key = self.ns(data), data.draw(st.sampled_from(KEYS), label="key")
        listing = ListNamespacesOp((MatchCondition("prefix", namespace),), None, 10, 0)
        ops = [PutOp(namespace, key, value), GetOp(namespace, key), listing, PutOp(namespace, key, None), GetOp(namespace, key)]
        got = self.session.run(self.store.abatch(ops))
        assert got[1] is not None and got[1].value == value and namespace in got[2] and got[4] is None, (
            "contract: ops of one batch apply in order: a get after a put in the batch sees it, "
            f"a listing lists its namespace, a get after the delete sees nothing; got {got}"
        )
        self.model.delete(namespace, key)
