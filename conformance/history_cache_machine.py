"""`HistoryCacheMachine`: the history-cache suite's Hypothesis state machine (exported by
`runstore.conformance.machines`, where subclassing it is described), with its dict model
and the entries it stores.

Sets, gets, purges and clears over thread ids and keys that are prefixes of each other
(``t1``/``t10``, an entry key and its seed key), checked against `HistoryCacheModel`
after every step. Entries are real ``DeltaChannelHistory`` values (writes of messages,
a ``_DeltaSnapshot`` seed, a ``seed_ref``), and the machine mutates what it gave ``set``
and what ``get`` returned, so a cache sharing either with what it stores is caught.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.serde.types import _DeltaSnapshot

from runstore.checkpoint.cache import entry_key

from .events_model import fresh_id

#: Thread id suffixes: each a prefix of, or a glob pattern matching, another.
THREADS = ["t1", "t10", "t1[0]"]
#: Entry keys as `CachedHistorySaver` builds them: an entry, its seed record (an
#: extension of the entry's key), a checkpoint id that extends another, a subgraph's.
KEYS = [
    entry_key("", "c1", "messages"),
    entry_key("", "c1", "messages") + "\x1fseed",
    entry_key("", "c10", "messages"),
    entry_key("sub", "c1", "messages"),
]


def sample(n: int = 0) -> dict[str, Any]:
    """An entry as `CachedHistorySaver` stores one: writes of messages and a snapshot seed."""
    return {
        "writes": [
            ("task-a", "messages", [HumanMessage(f"hi {n}", id=f"h{n}")]),
            ("task-b", "messages", [AIMessage(f"yo {n}", id=f"a{n}", additional_kwargs={"n": [n]})]),
        ],
        "seed": _DeltaSnapshot([HumanMessage(f"seed {n}", id=f"s{n}")]),
    }


def _messages() -> st.SearchStrategy[list[BaseMessage]]:
    text = st.text("abc xyz", max_size=6)
    one = st.one_of(
        st.builds(lambda c, i: HumanMessage(c, id=f"h{i}"), text, st.integers(0, 99)),
        st.builds(lambda c, i: AIMessage(c, id=f"a{i}", additional_kwargs={"n": [i]}), text, st.integers(0, 99)),
    )
    return st.lists(one, max_size=3)


def _values() -> st.SearchStrategy[Any]:
    return st.one_of(_messages(), st.integers(-5, 5), st.text("ab", max_size=3),
                     st.dictionaries(st.sampled_from(["k", "n"]), st.lists(st.integers(0, 3), max_size=2), max_size=2))


def entries() -> st.SearchStrategy[dict[str, Any]]:
    """``DeltaChannelHistory`` values as `CachedHistorySaver` stores them: ``writes`` (task id,
    channel, value), and sometimes a ``seed`` (a ``_DeltaSnapshot`` of messages, or a plain
    value) or a ``seed_ref`` (the key of the record holding the seed)."""
    write = st.tuples(st.sampled_from(["task-a", "task-b"]), st.just("messages"), _values())
    seed = st.one_of(st.builds(_DeltaSnapshot, _messages()), _values())
    return st.builds(
        _entry,
        st.lists(write, max_size=3),
        st.one_of(st.none(), st.tuples(seed)),
        st.one_of(st.none(), st.sampled_from(KEYS)),
    )


def _entry(writes: list[tuple[str, str, Any]], seed: tuple[Any] | None, seed_ref: str | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"writes": writes}
    if seed is not None:
        entry["seed"] = seed[0]
    if seed_ref is not None:
        entry["seed_ref"] = seed_ref
    return entry


def mutate(entry: Any) -> None:
    """Change ``entry`` in place everywhere a caller could: its dict, its writes list, the
    values in it (lists, dicts, messages) and its seed."""
    if not isinstance(entry, dict):
        return
    writes = entry.get("writes")
    if isinstance(writes, list):
        for write in writes:
            if isinstance(write, tuple | list) and len(write) == 3:
                _mutate_value(write[2])
        writes.append(("mutated", "messages", "mutated"))
    if "seed" in entry:
        seed = entry["seed"]
        _mutate_value(seed.value if isinstance(seed, _DeltaSnapshot) else seed)
    entry["mutated"] = True


def _mutate_value(value: Any) -> None:
    if isinstance(value, list):
        for item in value:
            _mutate_value(item)
        value.append("mutated")
    elif isinstance(value, dict):
        value["mutated"] = True
    elif isinstance(value, BaseMessage):
        value.content = "mutated"


class HistoryCacheModel:
    """What a correct cache holds, and why a key holds nothing (for failure messages)."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, str], dict[str, Any]] = {}
        #: Entries replaced by a later set at the same key.
        self.replaced: dict[tuple[str, str], list[dict[str, Any]]] = {}
        #: Why a key that once held an entry holds none: ``purge_thread('t1')`` or ``clear()``.
        self.gone: dict[tuple[str, str], str] = {}

    def set(self, thread_id: str, key: str, entry: dict[str, Any]) -> None:
        slot = (thread_id, key)
        if slot in self.entries:
            self.replaced.setdefault(slot, []).append(self.entries[slot])
        self.entries[slot] = copy.deepcopy(entry)
        self.gone.pop(slot, None)

    def purge_thread(self, thread_id: str) -> None:
        for slot in [s for s in self.entries if s[0] == thread_id]:
            del self.entries[slot]
            self.gone[slot] = f"purge_thread({thread_id!r})"

    def clear(self) -> None:
        for slot in self.entries:
            self.gone[slot] = "clear()"
        self.entries.clear()

    def check(self, thread_id: str, key: str, got: Any, what: str) -> None:
        """Assert ``got`` (what ``what`` returned for the slot) is what a correct cache answers."""
        slot = (thread_id, key)
        expected = self.entries.get(slot)
        if expected is None:
            if got is None:
                return
            why = self.gone.get(slot)
            if why == "clear()":
                raise AssertionError(f"contract: clear removes every entry: {what} after clear() returned {got}")
            if why is not None:
                raise AssertionError(
                    f"contract: purge_thread removes exactly that thread's entries: {what} after {why} returned {got}"
                )
            raise AssertionError(f"contract: a miss is None: {what}, never set, returned {got}")
        assert got is not None, (
            f"contract: a cache holding fewer entries than checkpoint_cache.max_entries keeps every entry set: "
            f"{what} returned None; expected {expected}"
        )
        if got == expected:
            return
        if any(got == old for old in self.replaced.get(slot, [])):
            raise AssertionError(f"contract: set replaces the entry at its key: {what} returned a replaced entry {got}")
        purged = [s for s, why in self.gone.items() if why.startswith("purge_thread") and s[1] == key]
        if got.get("mutated") if isinstance(got, dict) else False:
            raise AssertionError(
                f"contract: get returns a copy: mutating the entry given to set, or one get returned, changed "
                f"the stored entry: {what} returned {got}"
            )
        raise AssertionError(
            f"contract: get returns the entry last set at (thread_id, key), never another one: {what} returned "
            f"{got}, expected {expected}" + (f" (other threads' entries purged: {purged})" if purged else "")
        )


class HistoryCacheMachine(RuleBasedStateMachine):
    """Drives a history cache with random calls; every answer is checked against `HistoryCacheModel`."""

    def __init__(self, session: Any) -> None:
        super().__init__()
        self.session = session
        self.target = session.target
        self.cache: Any = session.backend
        base = fresh_id("hc")
        self.threads = [f"{base}/{suffix}" for suffix in THREADS]
        self.model = HistoryCacheModel()

    def teardown(self) -> None:
        for thread_id in self.threads:
            self.session.run(self.cache.purge_thread(thread_id))

    @rule(t=st.integers(0, len(THREADS) - 1), k=st.integers(0, len(KEYS) - 1), entry=entries())
    def set(self, t: int, k: int, entry: dict[str, Any]) -> None:
        thread_id, key = self.threads[t], KEYS[k]
        self.session.run(self.cache.set(thread_id, key, entry))
        self.model.set(thread_id, key, entry)
        # What set was given belongs to the caller again: changing it changes nothing stored.
        mutate(entry)

    @rule(t=st.integers(0, len(THREADS) - 1), k=st.integers(0, len(KEYS) - 1))
    def get(self, t: int, k: int) -> None:
        thread_id, key = self.threads[t], KEYS[k]
        got = self.session.run(self.cache.get(thread_id, key))
        self.model.check(thread_id, key, got, f"get({THREADS[t]!r}, {key!r})")
        # What get returned belongs to the caller: changing it changes nothing stored.
        mutate(got)

    @rule(t=st.integers(0, len(THREADS) - 1))
    def purge_thread(self, t: int) -> None:
        self.session.run(self.cache.purge_thread(self.threads[t]))
        self.model.purge_thread(self.threads[t])

    @rule()
    def clear(self) -> None:
        self.session.run(self.cache.clear())
        self.model.clear()

    @invariant()
    def every_key(self) -> None:
        """After every step: each thread's every key answers as the model does."""
        slots = [(t, key) for t in range(len(self.threads)) for key in KEYS]

        async def read_all() -> list[Any]:
            # One trip to the loop for every get: the loop's start-up would cost more than the gets.
            return [await self.cache.get(self.threads[t], key) for t, key in slots]

        for (t, key), got in zip(slots, self.session.run(read_all()), strict=True):
            self.model.check(self.threads[t], key, got, f"get({THREADS[t]!r}, {key!r})")
