"""The delta reducer equals folding add_messages over the writes, however they are batched."""

from __future__ import annotations

import copy
import itertools
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, RemoveMessage
from langgraph.graph.message import add_messages

from runstore.checkpoint.reducer import REMOVE_ALL_MESSAGES, merge_message_writes

IDS = ["a", "b", "c", "d"]


@pytest.fixture
def fixed_uuids(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Deterministic uuid4 so generated ids compare equal across both reductions."""

    class Counter:
        def reset(self) -> None:
            self.it = itertools.count()

        def __call__(self) -> uuid.UUID:
            return uuid.UUID(int=next(self.it))

    counter = Counter()
    counter.reset()
    monkeypatch.setattr(uuid, "uuid4", counter)
    yield counter


ids = st.one_of(st.none(), st.sampled_from(IDS))
texts = st.text(alphabet="xyz", max_size=2)


@st.composite
def message(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["human", "ai", "remove", "remove_all", "tuple", "dict", "chunk"]))
    mid = draw(ids)
    content = draw(texts)
    if kind == "human":
        return HumanMessage(content, id=mid)
    if kind == "ai":
        return AIMessage(content, id=mid)
    if kind == "remove":
        return RemoveMessage(id=draw(st.sampled_from(IDS)))
    if kind == "remove_all":
        return RemoveMessage(id=REMOVE_ALL_MESSAGES)
    if kind == "tuple":
        return ("user", content or "t")
    if kind == "dict":
        out = {"role": "assistant", "content": content}
        if mid:
            out["id"] = mid
        return out
    return AIMessageChunk(content, id=mid)


write = st.one_of(st.lists(message(), max_size=4), message())
seed = st.lists(
    st.one_of(
        st.builds(HumanMessage, texts, id=ids),
        st.builds(AIMessage, texts, id=ids),
    ),
    max_size=4,
)


def fold(state: Any, writes: list[Any]) -> tuple[str, Any]:
    try:
        for w in writes:
            state = add_messages(state, w)
    except ValueError as exc:
        return ("error", str(exc))
    return ("ok", state)


def ours(state: Any, batches: list[list[Any]]) -> tuple[str, Any]:
    try:
        for batch in batches:
            state = merge_message_writes(state, batch)
    except ValueError as exc:
        return ("error", str(exc))
    return ("ok", state)


def split(writes: list[Any], cuts: list[int]) -> list[list[Any]]:
    points = sorted({c % (len(writes) + 1) for c in cuts})
    out, start = [], 0
    for p in [*points, len(writes)]:
        out.append(writes[start:p])
        start = p
    return [b for b in out if b] or [[]]


@given(seed=seed, writes=st.lists(write, max_size=6), cuts=st.lists(st.integers(0, 10), max_size=3))
# duplicate ids (a seed, or the tail after a remove-all, may hold them): replace hits
# the last occurrence, remove drops every occurrence
@example(seed=[HumanMessage("1", id="a"), HumanMessage("2", id="a")],
         writes=[[RemoveMessage(id="a")]], cuts=[])
@example(seed=[], writes=[[RemoveMessage(id=REMOVE_ALL_MESSAGES), HumanMessage("1", id="a"),
                           HumanMessage("2", id="a")], [AIMessage("3", id="a")],
                          [RemoveMessage(id="a")]], cuts=[1])
def test_reducer_equals_sequential_add_messages(
    fixed_uuids: Any, seed: list[Any], writes: list[Any], cuts: list[int]
) -> None:
    fixed_uuids.reset()
    expected = fold(copy.deepcopy(seed), copy.deepcopy(writes))
    fixed_uuids.reset()
    one_batch = ours(copy.deepcopy(seed), [copy.deepcopy(writes)])
    assert one_batch == expected, "contract: delta reducer == fold of add_messages"
    fixed_uuids.reset()
    batched = ours(copy.deepcopy(seed), split(copy.deepcopy(writes), cuts))
    assert batched == expected, "contract: reducer is batching-invariant"


def test_ids_replace_in_place_and_remove() -> None:
    state = [HumanMessage("1", id="a"), AIMessage("2", id="b")]
    out = merge_message_writes(
        state, [[AIMessage("2'", id="b")], [RemoveMessage(id="a")], [HumanMessage("3", id="c")]]
    )
    assert [(m.id, m.content) for m in out] == [("b", "2'"), ("c", "3")]


def test_remove_all_clears_and_missing_remove_raises() -> None:
    state = [HumanMessage("1", id="a")]
    out = merge_message_writes(state, [[RemoveMessage(id=REMOVE_ALL_MESSAGES), HumanMessage("n", id="n")]])
    assert [m.id for m in out] == ["n"]
    with pytest.raises(ValueError, match="doesn't exist"):
        merge_message_writes(state, [[RemoveMessage(id="zzz")]])


def test_remove_then_readd_in_one_write_keeps_position() -> None:
    state = [HumanMessage("1", id="a"), HumanMessage("2", id="b")]
    out = merge_message_writes(state, [[RemoveMessage(id="a"), HumanMessage("1'", id="a")]])
    assert [(m.id, m.content) for m in out] == [("a", "1'"), ("b", "2")]
    # across two writes the id is re-appended, exactly as two add_messages calls do
    out = merge_message_writes(state, [[RemoveMessage(id="a")], [HumanMessage("1'", id="a")]])
    assert [m.id for m in out] == ["b", "a"]


def test_input_lists_not_mutated() -> None:
    state = [HumanMessage("1", id="a")]
    w = [HumanMessage("2", id="b")]
    merge_message_writes(state, [w])
    assert [m.id for m in state] == ["a"] and len(w) == 1


def test_linear_time_on_many_writes() -> None:
    # 4000 single-message writes over a 4000-message state: a fold would do ~16M
    # element copies; ours is one pass. No timing assertion (shared machine), only
    # that it completes and equals the fold on a prefix.
    state = [HumanMessage(str(i), id=f"s{i}") for i in range(4000)]
    writes = [[AIMessage(str(i), id=f"w{i}")] for i in range(4000)]
    out = merge_message_writes(state, writes)
    assert len(out) == 8000 and out[-1].id == "w3999"
