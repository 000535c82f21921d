"""The saver contract for list: thread, metadata filter, ``before`` and ``limit`` together,
the documented filter rule, and one order across threads.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ..savers_checks import (
    checkpoint_ids,
    collect,
    put_chain_with_metadata,
)
from ..savers_metadata import metadata_and_filters, reference_match
from ..savers_model import (
    config_for,
    make_checkpoint,
    named,
    new_checkpoint_id,
    new_thread_id,
)


def test_list_filter_before_limit(saver_target: Any) -> None:
    """list honours thread, metadata filter, exclusive `before` and `limit` together."""
    with saver_target.session() as session:

        @given(
            steps=st.lists(st.sampled_from(["x", "y", "z"]), min_size=1, max_size=8),
            flt=st.sampled_from([None, "x", "y", "z"]),
            before=st.one_of(st.none(), st.integers(0, 8)),
            limit=st.one_of(st.none(), st.integers(0, 9)),
        )
        # Known edges: more matches than the limit, a filter the newest checkpoints miss
        # (a limit applied before the filter returns too few), `before` inside the matches.
        @example(steps=["x", "y", "x", "y", "x", "y"], flt="x", before=None, limit=2)
        @example(steps=["x", "x", "x", "y", "y"], flt="x", before=None, limit=2)
        @example(steps=["x", "y", "x", "y", "x"], flt=None, before=3, limit=None)
        def check(steps: list[str], flt: str | None, before: int | None, limit: int | None) -> None:
            async def body() -> None:
                saver = session.backend
                thread, tag = new_thread_id(), new_thread_id("tag")
                other = new_thread_id()
                ids: list[str] = []
                parent: str | None = None
                for i, kind in enumerate(steps):
                    cid = new_checkpoint_id()
                    for tid in (thread, other):
                        await saver.aput(
                            config_for(tid, parent),
                            make_checkpoint(cid, {}, {}),
                            {"source": "loop", "step": i, "kind": kind, "tag": tag},
                            {},
                        )
                    ids.append(cid)
                    parent = cid
                expected = list(reversed(ids))
                kinds = dict(zip(ids, steps, strict=True))
                kwargs: dict[str, Any] = {}
                if flt is not None:
                    kwargs["filter"] = {"kind": flt}
                    expected = [c for c in expected if kinds[c] == flt]
                if before is not None and before < len(ids):
                    kwargs["before"] = config_for(thread, ids[before])
                    expected = [c for c in expected if c < ids[before]]
                if limit is not None:
                    kwargs["limit"] = limit
                    expected = expected[:limit]
                got = checkpoint_ids(await collect(saver, config_for(thread), **kwargs))
                assert got == expected, (
                    named(f"list({kwargs}) -> {got} != {expected} (contract: list filters by metadata "
                    "equality, before is exclusive, limit caps the newest-first result)")
                )
                anywhere = checkpoint_ids(await collect(saver, None, filter={"tag": tag, "step": 0}))
                assert sorted(anywhere) == sorted([ids[0], ids[0]]), (
                    "contract: list(None, filter=...) searches every thread"
                )
                only = await collect(saver, config_for(thread, ids[-1]))
                assert checkpoint_ids(only) == [ids[-1]], (
                    "contract: list with a checkpoint_id in config returns that checkpoint only"
                )

            session.run(body())

        check()


@pytest.mark.requires("typed_filters")
def test_metadata_filters_follow_the_documented_rule(saver_target: Any) -> None:
    """list(filter=...) returns exactly the checkpoints the documented rule matches, on
    random nested metadata: None also matches an absent key, booleans never match numbers,
    numbers match by value (1 matches 1.0), documents whatever their key order."""
    with saver_target.session() as session:

        @given(case=metadata_and_filters())
        @example(case=([{"a": 1}, {}], {"b": None}))
        @example(case=([{"a": True}, {"a": 1}, {"a": 1.0}], {"a": 1}))
        @example(case=([{"a": {"x": 1, "y": [1, 2.5]}}], {"a": {"y": [1.0, 2.5], "x": 1.0}}))
        @example(case=([{"a": [0, {"y": False}]}], {"a": [False, {"y": 0}]}))
        def check(case: tuple[list[dict[str, Any]], dict[str, Any]]) -> None:
            metas, flt = case

            async def body() -> None:
                saver = session.backend
                thread = new_thread_id()
                ids = await put_chain_with_metadata(saver, thread, metas)
                expected = [
                    cid for cid, meta in zip(ids, metas, strict=True) if reference_match(meta, flt)
                ][::-1]
                got = checkpoint_ids(await collect(saver, config_for(thread), filter=flt))
                assert got == expected, (
                    f"list(filter={flt!r}) over metadata {metas!r} (oldest first) -> "
                    f"{[ids.index(c) for c in got]} != {[ids.index(c) for c in expected]} "
                    "(contract: the documented metadata filter rule: None matches an absent "
                    "key or null, booleans only booleans, numbers by value, documents as JSON)"
                )

            session.run(body())

        check()


@pytest.mark.requires("global_list_order")
def test_list_without_thread_id_spans_threads_in_one_order(saver_target: Any) -> None:
    """list with config None, a config without thread_id, or only a checkpoint_ns lists
    every thread; every list is ordered by (checkpoint_id, thread_id, checkpoint_ns)
    descending, and before / limit apply to that order."""
    with saver_target.session() as session:

        @given(
            layout=st.lists(
                st.tuples(st.integers(0, 2), st.sampled_from(["", "child:1"]), st.booleans()),
                min_size=1,
                max_size=8,
            ),
            before=st.one_of(st.none(), st.integers(0, 7)),
            limit=st.one_of(st.none(), st.integers(0, 8)),
        )
        @example(layout=[(0, "", True), (1, "", True), (2, "child:1", True)], before=None, limit=None)
        def check(layout: list[tuple[int, str, bool]], before: int | None, limit: int | None) -> None:
            async def body() -> None:
                saver = session.backend
                tag = new_thread_id("tag")
                threads = sorted(new_thread_id() for _ in range(3))
                shared = new_checkpoint_id()  # one id in several threads, as copy_thread makes
                rows: set[tuple[str, str, str]] = set()
                for t, ns, same_id in layout:
                    cid = shared if same_id else new_checkpoint_id()
                    checkpoint = make_checkpoint(cid, {}, {})
                    await saver.aput(config_for(threads[t], ns=ns), checkpoint, {"tag": tag}, {})
                    rows.add((cid, threads[t], ns))
                ordered = sorted(rows, reverse=True)

                async def listed(config: Any, **kwargs: Any) -> list[tuple[str, str, str]]:
                    items = await collect(saver, config, filter={"tag": tag}, **kwargs)
                    return [
                        (
                            i.config["configurable"]["checkpoint_id"],
                            i.config["configurable"]["thread_id"],
                            i.config["configurable"]["checkpoint_ns"],
                        )
                        for i in items
                    ]

                contract = (
                    "(contract: list orders by (checkpoint_id, thread_id, checkpoint_ns) "
                    "descending; thread_id / checkpoint_ns in the config narrow when present, "
                    "and without thread_id every thread is listed)"
                )
                configs: tuple[dict[str, Any] | None, ...] = (None, {"configurable": {}})
                for config in configs:
                    assert await listed(config) == ordered, f"list({config}) {contract}"
                only_ns = [r for r in ordered if r[2] == "child:1"]
                got = await listed({"configurable": {"checkpoint_ns": "child:1"}})
                assert got == only_ns, f"list(checkpoint_ns only) {contract}"
                one_thread = [r for r in ordered if r[1] == threads[0]]
                got = await listed({"configurable": {"thread_id": threads[0]}})
                assert got == one_thread, f"list(thread_id, no namespace) {contract}"
                expected = ordered
                kwargs: dict[str, Any] = {}
                if before is not None and before < len(ordered):
                    cut = ordered[before][0]
                    kwargs["before"] = config_for(ordered[before][1], cut)
                    expected = [r for r in expected if r[0] < cut]
                if limit is not None:
                    kwargs["limit"] = limit
                    expected = expected[:limit]
                assert await listed(None, **kwargs) == expected, (
                    f"list(None, {kwargs}) {contract}; before is exclusive, limit caps"
                )

            session.run(body())

        check()
