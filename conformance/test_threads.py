"""The thread index contract (capability ``thread_index``), as generated tests.

A saver declaring ``thread_index`` keeps one record per thread in the same transaction
as every write: ``get_thread`` / ``list_threads`` answer from it, and a deleted thread
keeps a tombstone that refuses writes continuing its history (docs/threads.md).
Assertion messages name the contract that broke.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT, RESUME

from runstore.checkpoint.rules import FENCE_KEY
from runstore.checkpoint.threads import status_of
from runstore.clock import ManualClock
from runstore.errors import (
    InvalidCursorError,
    InvalidSaverInputError,
    StaleFenceError,
    ThreadDeletedError,
)

from .savers_model import (
    as_metadata,
    checkpoint_trees,
    config_for,
    make_checkpoint,
    new_checkpoint_id,
    new_thread_id,
    write_tree,
)

Saver = BaseCheckpointSaver[Any]
START = datetime(2030, 1, 1, tzinfo=UTC)

pytestmark = pytest.mark.requires("thread_index")


def _clock(saver: Saver) -> ManualClock:
    clock = ManualClock(START)
    saver.clock = clock  # type: ignore[attr-defined]
    return clock


async def _chain(
    saver: Saver,
    thread: str,
    metas: list[dict[str, Any]],
    clock: ManualClock | None = None,
    ns: str = "",
) -> list[str]:
    ids: list[str] = []
    parent: str | None = None
    for meta in metas:
        if clock is not None:
            clock.advance(1)
        cid = new_checkpoint_id()
        await saver.aput(config_for(thread, parent, ns), make_checkpoint(cid, {}, {}), as_metadata(meta), {})
        ids.append(cid)
        parent = cid
    return ids


async def _all_pages(saver: Saver, **kwargs: Any) -> list[Any]:
    out: list[Any] = []
    cursor = None
    while True:
        page = await saver.alist_threads(cursor=cursor, **kwargs)  # type: ignore[attr-defined]
        out.extend(page.threads)
        if page.next_cursor is None:
            return out
        assert len(page.threads) == kwargs.get("limit", 50), (
            "contract: a page with a next_cursor is full"
        )
        cursor = page.next_cursor


# --------------------------------------------------------------------------- the record


def test_record_follows_every_write(saver_target: Any) -> None:
    """After generated trees in two namespaces and special writes on the head, the record
    counts every checkpoint and write row, names the latest root checkpoint with its
    metadata and status, and holds the first and last put times of the saver's clock."""
    with saver_target.session() as session:

        @given(
            spec=checkpoint_trees(max_nodes=6),
            child=st.one_of(st.none(), checkpoint_trees(max_nodes=3)),
            special=st.lists(st.sampled_from([ERROR, INTERRUPT, RESUME]), max_size=2),
        )
        def check(spec: Any, child: Any, special: list[str]) -> None:
            async def body() -> None:
                saver = session.backend
                clock = _clock(saver)
                thread = new_thread_id()
                tree = await write_tree(saver, spec, thread)
                rows = sum(len(n.writes.by_key) for n in tree.nodes)
                checkpoints = len(tree.nodes)
                if child is not None:
                    clock.advance(5)
                    sub = await write_tree(saver, child, thread, "child:1")
                    rows += sum(len(n.writes.by_key) for n in sub.nodes)
                    checkpoints += len(sub.nodes)
                head = max(tree.nodes, key=lambda n: n.id)
                for i, channel in enumerate(special):
                    clock.advance(1)
                    await saver.aput_writes(tree.config(head.index), [(channel, i)], f"s{i}", "")
                rows += len({(f"s{i}", ch) for i, ch in enumerate(special)})
                info = await saver.aget_thread(thread)
                assert info is not None, "contract: get_thread finds a thread with checkpoints"
                note(repr(info))
                assert info.checkpoints == checkpoints, (
                    f"{info.checkpoints} != {checkpoints} (contract: the record counts every "
                    "checkpoint of every namespace)"
                )
                assert info.writes == rows, (
                    f"{info.writes} != {rows} (contract: the record counts stored write rows)"
                )
                assert info.latest_checkpoint_id == head.id, (
                    "contract: latest_checkpoint_id is the root namespace's latest checkpoint"
                )
                for key, value in head.metadata.items():
                    assert info.metadata.get(key) == value, (
                        "contract: the record holds the latest root checkpoint's metadata"
                    )
                channels = [w[1] for w in head.writes.ordered()] + list(special)
                assert info.status == status_of(channels), (
                    f"{info.status} for writes on {channels} (contract: status is error, "
                    "interrupted or idle from the latest checkpoint's pending writes)"
                )
                assert info.created_at == START + timedelta(seconds=0), (
                    "contract: created_at is the saver clock at the thread's first write"
                )
                assert info.updated_at >= START and info.touched_at >= info.updated_at, (
                    "contract: updated_at is the last put, touched_at the last write"
                )
                assert info.bytes > 0, "contract: bytes approximates what the thread stores"

            session.run(body())

        check()


def test_updated_at_is_the_last_put_and_status_follows_the_head(saver_target: Any) -> None:
    """updated_at moves with each put (not with writes); an interrupt write on the head
    makes the thread interrupted, an error write errored, and a new head idle again."""

    async def body(saver: Saver) -> None:
        clock = _clock(saver)
        thread = new_thread_id()
        [first] = await _chain(saver, thread, [{"n": 1}], clock)
        clock.advance(10)
        await saver.aput_writes(config_for(thread, first), [(INTERRUPT, "ask")], "t", "")
        info = await saver.aget_thread(thread)  # type: ignore[attr-defined]
        assert info is not None and info.status == "interrupted"
        assert info.updated_at == START + timedelta(seconds=1), (
            "contract: updated_at is the last put; writes move touched_at only"
        )
        assert info.touched_at == START + timedelta(seconds=11)
        await saver.aput_writes(config_for(thread, first), [(ERROR, "boom")], "u", "")
        info = await saver.aget_thread(thread)  # type: ignore[attr-defined]
        assert info is not None and info.status == "error", "contract: error beats interrupted"
        clock.advance(1)
        cid = new_checkpoint_id()
        await saver.aput(config_for(thread, first), make_checkpoint(cid, {}, {}), as_metadata({"n": 2}), {})
        info = await saver.aget_thread(thread)  # type: ignore[attr-defined]
        assert info is not None and info.status == "idle" and info.metadata.get("n") == 2, (
            "contract: a new latest checkpoint carries its own (empty) writes' status"
        )
        assert info.updated_at == START + timedelta(seconds=12)
        assert await saver.aget_thread(new_thread_id()) is None  # type: ignore[attr-defined]

    saver_target.run(body)


def test_a_new_head_takes_the_status_of_writes_stored_before_it(saver_target: Any) -> None:
    """Pending writes may reach the saver before their checkpoint (LangGraph sends them
    while the checkpoint's put is still on its way): when that checkpoint becomes the
    head, the thread's status counts them, on a thread's first checkpoint and on later
    ones, and a re-put of the head keeps it."""

    async def body(saver: Saver) -> None:
        _clock(saver)
        thread = new_thread_id()
        first = new_checkpoint_id()
        await saver.aput_writes(config_for(thread, first), [(INTERRUPT, "ask")], "t", "")
        await saver.aput(config_for(thread), make_checkpoint(first, {}, {}), as_metadata({}), {})
        info = await saver.aget_thread(thread)  # type: ignore[attr-defined]
        assert info is not None and info.status == "interrupted", (
            "contract: a first checkpoint's status counts writes stored before it"
        )
        second = new_checkpoint_id()
        await saver.aput_writes(config_for(thread, second), [(ERROR, "boom")], "u", "")
        info = await saver.aget_thread(thread)  # type: ignore[attr-defined]
        assert info is not None and info.status == "interrupted", (
            "contract: writes on a checkpoint that is not the head leave the status alone"
        )
        config = config_for(thread, first)
        await saver.aput(config, make_checkpoint(second, {}, {}), as_metadata({}), {})
        info = await saver.aget_thread(thread)  # type: ignore[attr-defined]
        assert info is not None and info.status == "error", (
            "contract: a new head's status counts writes stored before it"
        )
        await saver.aput(config, make_checkpoint(second, {}, {}), as_metadata({}), {})
        info = await saver.aget_thread(thread)  # type: ignore[attr-defined]
        assert info is not None and info.status == "error", "contract: a re-put head keeps its status"

    saver_target.run(body)


def test_a_replayed_write_is_not_counted_again(saver_target: Any) -> None:
    """Re-putting a stored checkpoint and re-sending its pending writes (what a retry after
    a lost reply does) leaves the record's checkpoint, write and byte counts as they were."""

    async def body(saver: Saver) -> None:
        _clock(saver)
        thread = new_thread_id()
        cid = new_checkpoint_id()
        checkpoint = make_checkpoint(cid, {"messages": "x" * 300}, {"messages": "1"})
        config = config_for(thread)
        stored = await saver.aput(config, checkpoint, as_metadata({"n": 1}), {"messages": "1"})
        writes = [("messages", "y" * 200), (INTERRUPT, "z" * 100)]
        await saver.aput_writes(stored, writes, "task", "")
        first = await saver.aget_thread(thread)  # type: ignore[attr-defined]
        assert first is not None and first.bytes > 0
        await saver.aput(config, checkpoint, as_metadata({"n": 1}), {"messages": "1"})
        await saver.aput_writes(stored, writes, "task", "")
        again = await saver.aget_thread(thread)  # type: ignore[attr-defined]
        assert again is not None
        assert (again.checkpoints, again.writes) == (first.checkpoints, first.writes), (
            "contract: a replaced checkpoint or write row is not counted again"
        )
        assert again.bytes == first.bytes, (
            f"{again.bytes} != {first.bytes} (contract: bytes counts a replaced row once)"
        )

    saver_target.run(body)


# --------------------------------------------------------------------------- listing


def test_list_threads_pages_filters_and_orders(saver_target: Any) -> None:
    """Walking every page of list_threads with a generated filter, status, time window,
    order and page size yields exactly the matching threads, newest first, once each."""
    with saver_target.session() as session:

        @settings(max_examples=min(20, settings().max_examples))
        @given(
            threads=st.lists(
                st.tuples(
                    st.sampled_from(["a", "b"]),
                    st.integers(0, 5),
                    st.integers(0, 5),
                    st.booleans(),
                ),
                min_size=1,
                max_size=9,
            ),
            kind=st.sampled_from([None, "a", "b"]),
            status=st.sampled_from([None, "idle", "interrupted"]),
            window=st.one_of(st.none(), st.tuples(st.integers(0, 6), st.integers(0, 12))),
            order_by=st.sampled_from(["updated_at", "created_at"]),
            limit=st.integers(1, 4),
        )
        def check(
            threads: list[tuple[str, int, int, bool]],
            kind: str | None,
            status: str | None,
            window: tuple[int, int] | None,
            order_by: str,
            limit: int,
        ) -> None:
            async def body() -> None:
                saver = session.backend
                clock = _clock(saver)
                tag = new_thread_id("tag")
                model = []
                for label, created, extra, interrupted in threads:
                    thread = new_thread_id()
                    clock.set(START + timedelta(seconds=created))
                    ids = await _chain(saver, thread, [{"tag": tag, "kind": label}])
                    clock.advance(extra)
                    if extra:
                        await _chain(saver, thread, [{"tag": tag, "kind": label}])
                        ids = ids[:0]
                    if interrupted:
                        info = await saver.aget_thread(thread)
                        head = info.latest_checkpoint_id
                        await saver.aput_writes(config_for(thread, head), [(INTERRUPT, 1)], "t", "")
                    model.append(
                        (thread, label, created, created + extra, "interrupted" if interrupted else "idle")
                    )
                flt: dict[str, Any] = {"tag": tag}
                expected = model
                if kind is not None:
                    flt["kind"] = kind
                    expected = [m for m in expected if m[1] == kind]
                if status is not None:
                    expected = [m for m in expected if m[4] == status]
                kwargs: dict[str, Any] = {}
                if window is not None:
                    after, before = window
                    kwargs["updated_after"] = START + timedelta(seconds=after)
                    kwargs["updated_before"] = START + timedelta(seconds=before)
                    expected = [m for m in expected if after < m[3] < before]
                key = (lambda m: (m[3], m[0])) if order_by == "updated_at" else (lambda m: (m[2], m[0]))
                expected = sorted(expected, key=key, reverse=True)
                got = await _all_pages(
                    saver, filter=flt, status=status, order_by=order_by, limit=limit, **kwargs
                )
                assert [t.thread_id for t in got] == [m[0] for m in expected], (
                    f"list_threads(filter={flt}, status={status}, {kwargs}, order_by={order_by}, "
                    f"limit={limit}) (contract: every matching thread once, newest first by "
                    "order_by then thread_id, pages joined by next_cursor)"
                )

            session.run(body())

        check()


def test_list_threads_metadata_filter_follows_the_filter_rule(saver_target: Any) -> None:
    """list_threads filters the latest checkpoint's metadata by the saver filter rule:
    None matches a missing key, numbers by value, booleans never numbers."""

    async def body(saver: Saver) -> None:
        tag = new_thread_id("tag")
        metas: list[dict[str, Any]] = [
            {"v": 1}, {"v": 1.0}, {"v": True}, {"v": "1"}, {}, {"v": None}, {"v": [1, {"x": 2}]}
        ]
        threads = []
        for meta in metas:
            thread = new_thread_id()
            await _chain(saver, thread, [{"v": "old"}, {"tag": tag, **meta}])
            threads.append(thread)

        async def ids(flt: dict[str, Any]) -> set[str]:
            return {t.thread_id for t in await _all_pages(saver, filter={"tag": tag, **flt})}

        assert await ids({"v": 1}) == {threads[0], threads[1]}, "contract: numbers match by value"
        assert await ids({"v": True}) == {threads[2]}, "contract: booleans never match numbers"
        assert await ids({"v": "1"}) == {threads[3]}
        assert await ids({"v": None}) == {threads[4], threads[5]}, (
            "contract: None matches a missing key or null"
        )
        assert await ids({"v": [1.0, {"x": 2}]}) == {threads[6]}
        assert await ids({"v": "old"}) == set(), (
            "contract: filters look at the latest checkpoint's metadata only"
        )

    saver_target.run(body)


def test_list_threads_cursor_is_stable_under_concurrent_writes(saver_target: Any) -> None:
    """While pages are read, other threads are written: a thread not written meanwhile
    appears exactly once, and no thread appears twice."""

    async def body(saver: Saver) -> None:
        tag = new_thread_id("tag")
        threads = [new_thread_id() for _ in range(24)]
        for thread in threads:
            await _chain(saver, thread, [{"tag": tag}])
        touched: set[str] = set()
        seen: list[str] = []
        cursor = None
        step = 0
        while True:
            page = await saver.alist_threads(filter={"tag": tag}, limit=5, cursor=cursor)  # type: ignore[attr-defined]
            seen.extend(t.thread_id for t in page.threads)
            # Write to threads on both sides of the cursor, and start new ones.
            for victim in (threads[step % 24], threads[(7 * step + 3) % 24]):
                touched.add(victim)
                info = await saver.aget_thread(victim)  # type: ignore[attr-defined]
                await saver.aput(
                    config_for(victim, info.latest_checkpoint_id),
                    make_checkpoint(new_checkpoint_id(), {}, {}),
                    as_metadata({"tag": tag}),
                    {},
                )
            await _chain(saver, new_thread_id(), [{"tag": tag}])
            step += 1
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert len(seen) == len(set(seen)), "contract: keyset pages never repeat a thread"
        missing = [t for t in threads if t not in touched and t not in seen]
        assert not missing, (
            f"{len(missing)} thread(s) not written during paging were skipped (contract: keyset "
            "cursors are stable under concurrent writes)"
        )

    saver_target.run(body)


def test_list_threads_bad_arguments_and_cursors(saver_target: Any) -> None:
    """Bad list_threads arguments raise InvalidSaverInputError naming what is accepted; a
    malformed cursor, or one made for another order_by, raises InvalidCursorError."""

    async def body(saver: Saver) -> None:
        for thread in (new_thread_id(), new_thread_id()):
            await _chain(saver, thread, [{"k": 1}])
        page = await saver.alist_threads(limit=1)  # type: ignore[attr-defined]
        assert page.next_cursor is not None
        bad: list[tuple[dict[str, Any], type[Exception], str]] = [
            ({"limit": 0}, InvalidSaverInputError, "limit"),
            ({"limit": 1001}, InvalidSaverInputError, "limit"),
            ({"limit": True}, InvalidSaverInputError, "limit"),
            ({"status": "busy"}, InvalidSaverInputError, "status"),
            ({"order_by": "thread_id"}, InvalidSaverInputError, "order_by"),
            ({"updated_after": datetime(2030, 1, 1)}, InvalidSaverInputError, "updated_after"),
            ({"filter": {1: 2}}, InvalidSaverInputError, "keys"),
            ({"cursor": "not a cursor"}, InvalidCursorError, "cursor"),
            ({"cursor": page.next_cursor[:-3]}, InvalidCursorError, "cursor"),
            ({"cursor": ""}, InvalidCursorError, "cursor"),
            ({"cursor": page.next_cursor, "order_by": "created_at"}, InvalidCursorError, "order_by"),
        ]
        for kwargs, error, word in bad:
            with pytest.raises(error) as raised:
                await saver.alist_threads(**kwargs)  # type: ignore[attr-defined]
            assert word in str(raised.value), (
                f"{kwargs}: {raised.value!r} (contract: the error names the argument)"
            )
        with pytest.raises(InvalidSaverInputError):
            await saver.aget_thread("bad\x00id")  # type: ignore[attr-defined]

    saver_target.run(body)


@pytest.mark.requires("thread_index", "sync_api")
def test_thread_index_sync_twins_match(saver_target: Any) -> None:
    """get_thread and list_threads from a worker thread agree with the async calls."""

    async def body(saver: Saver) -> None:
        tag = new_thread_id("tag")
        thread = new_thread_id()
        await _chain(saver, thread, [{"tag": tag}, {"tag": tag, "n": 2}])
        sync_info = await asyncio.to_thread(saver.get_thread, thread)  # type: ignore[attr-defined]
        assert sync_info == await saver.aget_thread(thread)  # type: ignore[attr-defined]
        sync_page = await asyncio.to_thread(
            lambda: saver.list_threads(filter={"tag": tag})  # type: ignore[attr-defined]
        )
        assert sync_page == await saver.alist_threads(filter={"tag": tag})  # type: ignore[attr-defined]

    saver_target.run(body)


# --------------------------------------------------------------------------- deletion


def test_deleted_thread_keeps_a_tombstone(saver_target: Any) -> None:
    """After delete_thread the thread is gone from the index; a put continuing its history
    or writes to it raise ThreadDeletedError and store nothing; a put without a parent
    starts a new history (new created_at, counts from zero)."""

    async def body(saver: Saver) -> None:
        clock = _clock(saver)
        thread = new_thread_id()
        ids = await _chain(saver, thread, [{"n": 1}, {"n": 2}], clock)
        await saver.adelete_thread(thread)
        assert await saver.aget_thread(thread) is None  # type: ignore[attr-defined]
        late = new_checkpoint_id()
        with pytest.raises(ThreadDeletedError):
            await saver.aput(config_for(thread, ids[-1]), make_checkpoint(late, {}, {}), {}, {})
        with pytest.raises(ThreadDeletedError):
            await saver.aput_writes(config_for(thread, ids[-1]), [("a", 1)], "t", "")
        assert await saver.aget_tuple(config_for(thread)) is None, (
            "contract: a late write never brings a deleted thread back"
        )
        clock.advance(100)
        [fresh] = await _chain(saver, thread, [{"n": 3}])
        info = await saver.aget_thread(thread)  # type: ignore[attr-defined]
        assert info is not None and info.checkpoints == 1 and info.writes == 0, (
            "contract: a put without a parent starts the deleted thread again, from zero"
        )
        assert info.created_at == START + timedelta(seconds=102)
        assert info.latest_checkpoint_id == fresh

    saver_target.run(body)


@pytest.mark.requires("copy_thread")
def test_a_copy_into_a_deleted_thread_starts_it_again(saver_target: Any) -> None:
    """``copy_thread`` into a deleted thread starts it again, like a put without a parent:
    the copy is read, indexed (new ``created_at``, counts of the copy) and listed, and
    writes continuing it are accepted (docs/threads.md "Deletion and the tombstone")."""

    async def body(saver: Saver) -> None:
        clock = _clock(saver)
        src, dst = new_thread_id(), new_thread_id()
        tag = new_thread_id("tag")
        ids = await _chain(saver, src, [{"tag": tag}, {"tag": tag}], clock)
        await _chain(saver, dst, [{"n": 1}], clock)
        await saver.adelete_thread(dst)
        clock.advance(100)
        await saver.acopy_thread(src, dst)
        got = await saver.aget_tuple(config_for(dst))
        assert got is not None and got.config["configurable"]["checkpoint_id"] == ids[-1], (
            f"contract: copy_thread into a deleted thread starts it again with the copy; get_tuple gave {got}"
        )
        info = await saver.aget_thread(dst)  # type: ignore[attr-defined]
        assert info is not None and info.checkpoints == 2 and info.latest_checkpoint_id == ids[-1], (
            f"contract: copy_thread into a deleted thread starts its record again, counting the copy: {info}"
        )
        assert info.created_at == START + timedelta(seconds=103), (
            f"contract: a thread started again by a copy has a new created_at: {info.created_at}"
        )
        listed = [t.thread_id for t in await _all_pages(saver, filter={"tag": tag})]
        assert sorted(listed) == sorted([src, dst]), (
            f"contract: a thread started again by a copy is listed again: {listed}"
        )
        late = new_checkpoint_id()
        await saver.aput(config_for(dst, ids[-1]), make_checkpoint(late, {}, {}), as_metadata({"tag": tag}), {})
        await saver.aput_writes(config_for(dst, late), [("a", 1)], "t", "")
        head = await saver.aget_tuple(config_for(dst))
        assert head is not None and head.config["configurable"]["checkpoint_id"] == late, (
            "contract: writes continuing a copied-into thread are accepted (its tombstone is gone)"
        )

    saver_target.run(body)


def test_delete_racing_writes_never_resurrects(saver_target: Any) -> None:
    """delete_thread races a chain of puts and writes continuing the thread: afterwards the
    thread has no checkpoint, each racing write either landed before the delete or
    raised ThreadDeletedError, and the index does not show the thread."""

    async def body(saver: Saver) -> None:
        async def writer(thread: str, parent: str) -> list[str]:
            outcomes = []
            for i in range(8):
                cid = new_checkpoint_id()
                try:
                    await saver.aput(
                        config_for(thread, parent), make_checkpoint(cid, {}, {}), as_metadata({"n": i}), {}
                    )
                    await saver.aput_writes(config_for(thread, cid), [("a", i)], "t", "")
                except ThreadDeletedError:
                    outcomes.append("refused")
                    break
                outcomes.append("ok")
                parent = cid
                await asyncio.sleep(0)
            return outcomes

        async def deleter(thread: str, delay: int) -> None:
            for _ in range(delay):
                await asyncio.sleep(0)
            await saver.adelete_thread(thread)

        for trial in range(6):
            thread = new_thread_id()
            ids = await _chain(saver, thread, [{"n": 0}])
            outcomes, _ = await asyncio.gather(writer(thread, ids[-1]), deleter(thread, trial))
            assert await saver.aget_tuple(config_for(thread)) is None, (
                f"trial {trial}: writer {outcomes} (contract: a write racing delete_thread "
                "never brings the thread back)"
            )
            assert [t async for t in saver.alist(config_for(thread))] == []
            assert await saver.aget_thread(thread) is None  # type: ignore[attr-defined]

    saver_target.run(body)


# --------------------------------------------------------------------------- refusals


def _fenced(thread: str, fence: int, checkpoint_id: str | None = None, ns: str = "") -> Any:
    config = config_for(thread, checkpoint_id, ns)
    config["configurable"][FENCE_KEY] = fence
    return config


async def _refusals(saver: Saver, thread: str, calls: list[tuple[str, Any]], error: type[Exception],
                    clock: ManualClock) -> None:
    """Each call must raise ``error``; the thread's record must read exactly as before it,
    though the saver's clock moved (a refused write touches nothing: status, counts, bytes,
    ``updated_at``, ``touched_at``)."""
    before = await saver.aget_thread(thread)  # type: ignore[attr-defined]
    for what, call in calls:
        clock.advance(7)
        with pytest.raises(error):
            await call()
        after = await saver.aget_thread(thread)  # type: ignore[attr-defined]
        assert after == before, (
            f"contract: a refused write leaves the thread record as it was ({what} raised "
            f"{error.__name__})\n before: {before}\n after:  {after}"
        )


@pytest.mark.requires("fencing")
def test_a_write_refused_for_a_stale_token_leaves_the_record_as_it_was(saver_target: Any) -> None:
    """A stale token on put, on pending writes (normal, interrupt, error and resume slots),
    in the root and a subgraph namespace, and on delete_thread: StaleFenceError, and the
    record's status, counts, bytes and times are unchanged."""

    async def body(saver: Saver) -> None:
        clock = _clock(saver)
        thread = new_thread_id()
        ids = await _chain(saver, thread, [{"n": 1}, {"n": 2}], clock)
        [sub] = await _chain(saver, thread, [{"n": 1}], clock, ns="child:1")
        await saver.aput_writes(config_for(thread, ids[-1]), [("messages", "hi")], "t0", "")
        await saver.afence_thread(thread, 5)  # type: ignore[attr-defined]
        stale = 4  # one below the fence: the boundary
        head, parent = ids[-1], ids[0]
        calls: list[tuple[str, Any]] = [
            ("put on the head", lambda: saver.aput(
                _fenced(thread, stale, head), make_checkpoint(new_checkpoint_id(), {}, {}),
                as_metadata({"n": 3}), {})),
            ("put of a fork", lambda: saver.aput(
                _fenced(thread, stale, parent), make_checkpoint(new_checkpoint_id(), {}, {}),
                as_metadata({"n": 3}), {})),
            ("put in a subgraph namespace", lambda: saver.aput(
                _fenced(thread, stale, sub, "child:1"), make_checkpoint(new_checkpoint_id(), {}, {}),
                as_metadata({}), {})),
        ]
        for channel in ("messages", INTERRUPT, ERROR, RESUME):
            calls.append((f"put_writes {channel}", lambda channel=channel: saver.aput_writes(
                _fenced(thread, stale, head), [(channel, "late")], f"late-{channel}", "")))
        calls.append(("put_writes in a subgraph namespace", lambda: saver.aput_writes(
            _fenced(thread, stale, sub, "child:1"), [(INTERRUPT, "late")], "late", "")))
        calls.append(("delete_thread", lambda: saver.adelete_thread(thread, fence=stale)))  # type: ignore[call-arg]
        await _refusals(saver, thread, calls, StaleFenceError, clock)
        info = await saver.aget_thread(thread)  # type: ignore[attr-defined]
        assert info is not None and info.status == "idle", (
            "contract: a refused interrupt or error write never changes the thread's status"
        )

    saver_target.run(body)


@pytest.mark.requires("checked_ids")
def test_a_write_refused_as_bad_input_leaves_the_record_as_it_was(saver_target: Any) -> None:
    """Pending writes with an unstorable task id or channel (interrupt and error slots
    among them) and a put with an unstorable checkpoint id: InvalidSaverInputError, and
    the record is unchanged."""

    async def body(saver: Saver) -> None:
        clock = _clock(saver)
        thread = new_thread_id()
        ids = await _chain(saver, thread, [{"n": 1}], clock)
        config = config_for(thread, ids[-1])
        calls: list[tuple[str, Any]] = [
            ("put_writes with a NUL in task_id", lambda: saver.aput_writes(
                config, [(INTERRUPT, "x")], "bad\x00task", "")),
            ("put_writes with a NUL in a channel", lambda: saver.aput_writes(
                config, [(ERROR, "x"), ("bad\x00channel", 1)], "t", "")),
            ("put with a NUL in the checkpoint id", lambda: saver.aput(
                config, make_checkpoint("bad\x00id", {}, {}), as_metadata({}), {})),
        ]
        await _refusals(saver, thread, calls, InvalidSaverInputError, clock)

    saver_target.run(body)


def test_writes_refused_on_a_deleted_thread_leave_no_trace(saver_target: Any) -> None:
    """Writes continuing a deleted thread (a put with a parent, pending writes in every
    slot, in the root and a subgraph namespace) raise ThreadDeletedError; the thread stays
    out of get_thread, and when a put without a parent starts it again its record is that
    of a new thread: created now, one checkpoint, no writes, idle, the bytes of that put."""

    async def body(saver: Saver) -> None:
        clock = _clock(saver)
        thread, twin = new_thread_id(), new_thread_id()
        ids = await _chain(saver, thread, [{"n": 1}, {"n": 2}], clock)
        [sub] = await _chain(saver, thread, [{"n": 1}], clock, ns="child:1")
        await saver.adelete_thread(thread)
        calls: list[tuple[str, Any]] = [
            ("put with a parent", lambda: saver.aput(
                config_for(thread, ids[-1]), make_checkpoint(new_checkpoint_id(), {}, {}),
                as_metadata({"n": 3}), {})),
        ]
        for channel in ("messages", INTERRUPT, ERROR):
            calls.append((f"put_writes {channel}", lambda channel=channel: saver.aput_writes(
                config_for(thread, ids[-1]), [(channel, "late")], f"late-{channel}", "")))
        calls.append(("put_writes in a subgraph namespace", lambda: saver.aput_writes(
            config_for(thread, sub, "child:1"), [(INTERRUPT, "late")], "late", "")))
        await _refusals(saver, thread, calls, ThreadDeletedError, clock)
        clock.advance(3)
        restart = clock()
        cid, other = new_checkpoint_id(), new_checkpoint_id()
        await saver.aput(config_for(thread), make_checkpoint(cid, {}, {}), as_metadata({"n": 9}), {})
        await saver.aput(config_for(twin), make_checkpoint(other, {}, {}), as_metadata({"n": 9}), {})
        info = await saver.aget_thread(thread)  # type: ignore[attr-defined]
        fresh = await saver.aget_thread(twin)  # type: ignore[attr-defined]
        assert info is not None and fresh is not None
        got = (info.created_at, info.updated_at, info.checkpoints, info.writes, info.status, info.bytes)
        want = (restart, restart, 1, 0, "idle", fresh.bytes)
        assert got == want, (
            "contract: a thread started again after its deletion has the record of a new "
            "thread; writes refused meanwhile left nothing in it (created_at, updated_at, "
            f"checkpoints, writes, status, bytes)\n got:  {got}\n want: {want}"
        )

    saver_target.run(body)


# --------------------------------------------------------------------------- tombstones


def test_a_deleted_thread_is_in_no_listing(saver_target: Any) -> None:
    """While its tombstone stands, a deleted thread (idle, interrupted, or the newest)
    appears in no page of list_threads: without a filter, with a metadata filter, a
    status, a time window, either order, and small pages; its neighbours (ids it is a
    prefix of) still do."""

    async def body(saver: Saver) -> None:
        clock = ManualClock(datetime(2090, 1, 1, tzinfo=UTC))
        saver.clock = clock  # type: ignore[attr-defined]
        tag = new_thread_id("tag")
        base = new_thread_id()
        names = [base, base + "0", base + "_", base + "x"]
        for name in names:
            ids = await _chain(saver, name, [{"tag": tag}], clock)
            await saver.aput_writes(config_for(name, ids[-1]), [(INTERRUPT, "ask")], "t", "")
        gone = {base, base + "_"}
        clock.advance(1)
        for name in sorted(gone):
            await saver.adelete_thread(name)
        live = [n for n in names if n not in gone]
        window = {"updated_after": datetime(2089, 12, 31, tzinfo=UTC)}
        variants: list[dict[str, Any]] = [
            {}, {"filter": {"tag": tag}}, {"status": "interrupted"}, window,
            {"order_by": "created_at"}, {"filter": {"tag": tag}, "order_by": "created_at", "limit": 1},
            {"filter": {"tag": tag}, "status": "interrupted", **window, "limit": 2},
        ]
        for kwargs in variants:
            if "filter" in kwargs or "updated_after" in kwargs:
                listed = [t.thread_id for t in await _all_pages(saver, **kwargs)]
            else:  # this test's threads are the newest: they lead the first page
                page = await saver.alist_threads(limit=1000, **kwargs)  # type: ignore[attr-defined]
                listed = [t.thread_id for t in page.threads]
            shown = sorted(set(listed) & set(names))
            assert shown == sorted(live), (
                f"list_threads({kwargs}) shows {shown} (contract: a deleted thread is in no "
                f"listing while its tombstone stands; expected {sorted(live)})"
            )
        listed_ids = {t.config["configurable"]["thread_id"] async for t in saver.alist(None, filter={"tag": tag})}
        assert listed_ids == set(live), (
            f"list(None, filter) shows threads {sorted(listed_ids)} (contract: a deleted thread's "
            "checkpoints are in no listing)"
        )
        for name in names:
            await saver.adelete_thread(name)

    saver_target.run(body)
