"""Run event store conformance: the contract of docs/events.md, checked on any backend.

Every test takes ``events_target`` and is synchronous. Assertion messages start with
``contract:`` and name the rule a backend broke.

Why one module of this size: pytest collects a suite per module, and one module per
kind is what ``-k test_events``, `runstore check` and the broken-backend runner select;
the model and worker helpers live in ``events_model`` and ``events_workers``.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import random
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from runstore.errors import IncompleteMessageRunLookupError, OwnerContextMissingError
from runstore.events import AI_LOOKUP_PAGE_SIZE, EventRecord, RunEventStore, walk_ai_message_runs
from runstore.owner import owner_scope

from .events_model import (
    CATEGORIES,
    EVENT_TYPES,
    MESSAGE_IDS,
    ThreadModel,
    core,
    created_ats,
    fresh_id,
    message_contents,
    metadatas,
    page,
    utc_iso,
)
from .events_workers import race_worker
from .session import development_plugins

pytestmark = pytest.mark.runstore_contract("run event store")

BAD_INPUT = (ValueError, TypeError)


def _store_run(target: Any, body: Callable[[Any], Awaitable[Any]], **kw: Any) -> Any:
    return target.run(body, **kw)


def _check_owner(target: Any, record: Mapping[str, Any], owner: str | None) -> None:
    if target.has("owner_filter"):
        assert record.get("user_id") == owner, (
            f"contract: owner_filter backends return the write's owner as user_id "
            f"(expected {owner!r}, got {record.get('user_id')!r})"
        )


def _message(thread: str, run: str, content: Any, seq_hint: int = 0, **extra: Any) -> dict[str, Any]:
    return {
        "thread_id": thread,
        "run_id": run,
        "event_type": extra.pop("event_type", "llm.ai.response"),
        "category": extra.pop("category", "message"),
        "content": content,
        **extra,
    }


# =====================================================================================
# State machine against the plain-dict model
# =====================================================================================

RUNS = ["run-a", "run-b", "run-c"]
limits = st.integers(min_value=0, max_value=8)
cursors = st.one_of(st.none(), st.integers(min_value=-1, max_value=45))


class EventStoreMachine(RuleBasedStateMachine):
    """Drives writes, every read and deletes; checks each answer against `ThreadModel`."""

    def __init__(self, session: Any) -> None:
        super().__init__()
        self.session = session
        self.store: RunEventStore = session.backend
        self.target = session.target
        self.threads = [fresh_id("sm"), fresh_id("sm")]
        self.model = {t: ThreadModel() for t in self.threads}

    def call(self, coro: Awaitable[Any]) -> Any:
        return self.session.run(coro)

    def _expect_record(self, got: dict[str, Any], event: dict[str, Any]) -> None:
        expected = {
            "thread_id": event["thread_id"],
            "run_id": event["run_id"],
            "event_type": event["event_type"],
            "category": event["category"],
            "content": event.get("content", ""),
            "metadata": dict(event.get("metadata") or {}),
            "seq": got.get("seq"),
            "created_at": (
                utc_iso(event["created_at"]) if event.get("created_at") else got.get("created_at")
            ),
        }
        assert core(got) == expected, (
            "contract: a write returns its record: the fields as given, metadata {} for None, "
            f"created_at normalized to UTC ISO-8601\n got:      {core(got)}\n expected: {expected}"
        )
        assert isinstance(got["seq"], int) and got["seq"] >= 1, "contract: seq is an int >= 1"
        _check_owner(self.target, got, None)

    # -- writes ---------------------------------------------------------------------

    events = st.fixed_dictionaries(
        {
            "run_id": st.sampled_from(RUNS),
            "event_type": st.sampled_from(EVENT_TYPES),
            "category": st.sampled_from(CATEGORIES),
            "content": message_contents(),
        },
        optional={"metadata": metadatas, "created_at": created_ats},
    )

    @rule(t=st.integers(0, 1), event=events)
    def put(self, t: int, event: dict[str, Any]) -> None:
        event = {"thread_id": self.threads[t], **event}
        got = self.call(self.store.put(**event, user_id=None))
        self._expect_record(got, event)
        self.model[event["thread_id"]].add(core(got))

    @rule(batch=st.lists(st.tuples(st.integers(0, 1), events), max_size=5))
    def put_batch(self, batch: list[tuple[int, dict[str, Any]]]) -> None:
        events = [{"thread_id": self.threads[t], **e} for t, e in batch]
        got = self.call(self.store.put_batch(events, user_id=None))
        assert len(got) == len(events), "contract: put_batch returns one record per event, in order"
        by_thread: dict[str, list[int]] = {}
        for record, event in zip(got, events, strict=True):
            self._expect_record(record, event)
            by_thread.setdefault(event["thread_id"], []).append(record["seq"])
        for seqs in by_thread.values():
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), (
                f"contract: a batch gets one contiguous seq block per thread, in input order: {seqs}"
            )
        for record in got:
            self.model[record["thread_id"]].add(core(record))

    @rule(t=st.integers(0, 1), event=events)
    def put_if_absent(self, t: int, event: dict[str, Any]) -> None:
        event = {"thread_id": self.threads[t], **event}
        model = self.model[event["thread_id"]]
        existing = model.find_key(event["run_id"], event["event_type"])
        got, created = self.call(self.store.put_if_absent(**event, user_id=None))
        if existing is not None:
            assert created is False and core(got) == existing, (
                "contract: put_if_absent returns the existing (thread, run, event_type) record "
                f"with created=False\n got: {core(got)} created={created}\n existing: {existing}"
            )
        else:
            assert created is True, "contract: put_if_absent creates a record when none exists"
            self._expect_record(got, event)
            model.add(core(got))

    # -- reads ----------------------------------------------------------------------

    @rule(t=st.integers(0, 1), limit=limits, before=cursors, after=cursors)
    def list_messages(self, t: int, limit: int, before: int | None, after: int | None) -> None:
        thread = self.threads[t]
        got = self.call(
            self.store.list_messages(thread, limit=limit, before_seq=before, after_seq=after, user_id=None)
        )
        expected = page(self.model[thread].messages, limit, before, after)
        assert [core(r) for r in got] == expected, (
            f"contract: list_messages(limit={limit}, before_seq={before}, after_seq={after}) pages "
            "category=message ascending; cursors are exclusive (before_seq is exclusive, "
            "after_seq is exclusive); before_seq gives the last `limit` below it, after_seq the "
            f"first `limit` above it, both the first `limit` between them\n got seqs: "
            f"{[r['seq'] for r in got]}\n expected: {[r['seq'] for r in expected]}"
        )

    @rule(
        t=st.integers(0, 1),
        run=st.sampled_from(RUNS),
        types=st.one_of(st.none(), st.lists(st.sampled_from(EVENT_TYPES), max_size=3, unique=True)),
        task=st.one_of(st.none(), st.sampled_from(["task-a", "task-b"])),
        limit=limits,
        after=cursors,
    )
    def list_events(
        self, t: int, run: str, types: list[str] | None, task: str | None, limit: int, after: int | None
    ) -> None:
        thread = self.threads[t]
        got = self.call(
            self.store.list_events(
                thread, run, event_types=types, task_id=task, limit=limit, after_seq=after, user_id=None
            )
        )
        expected = self.model[thread].list_events(run, types, task, limit, after)
        assert [core(r) for r in got] == expected, (
            f"contract: list_events(event_types={types}, task_id={task!r}, limit={limit}, "
            f"after_seq={after}) gives the run's first `limit` events above after_seq, every "
            "category, filters applied before the limit, event_types=[] matching nothing\n"
            f" got seqs: {[r['seq'] for r in got]}\n expected: {[r['seq'] for r in expected]}"
        )

    @rule(t=st.integers(0, 1), run=st.sampled_from(RUNS), limit=limits, before=cursors, after=cursors)
    def list_messages_by_run(
        self, t: int, run: str, limit: int, before: int | None, after: int | None
    ) -> None:
        thread = self.threads[t]
        got = self.call(
            self.store.list_messages_by_run(
                thread, run, limit=limit, before_seq=before, after_seq=after, user_id=None
            )
        )
        rows = [r for r in self.model[thread].messages if r["run_id"] == run]
        expected = page(rows, limit, before, after)
        assert [core(r) for r in got] == expected, (
            f"contract: list_messages_by_run pages one run's messages like list_messages "
            f"(limit={limit}, before_seq={before}, after_seq={after}; cursors exclusive)\n"
            f" got seqs: {[r['seq'] for r in got]}\n expected: {[r['seq'] for r in expected]}"
        )

    @rule(t=st.integers(0, 1), runs=st.one_of(st.none(), st.sets(st.sampled_from([*RUNS, "run-x"]))))
    def last_visible_ai(self, t: int, runs: set[str] | None) -> None:
        thread = self.threads[t]
        got = self.call(self.store.get_last_visible_ai_seq_by_run(thread, run_ids=runs, user_id=None))
        expected = self.model[thread].last_visible(runs)
        assert got == expected, (
            "contract: get_last_visible_ai_seq_by_run maps each run to its last message event of "
            "an AI type whose metadata.caller is not middleware:*\n"
            f" run_ids={runs}\n got: {got}\n expected: {expected}"
        )

    identities = st.sets(
        st.sampled_from(
            [f"message:{m}" for m in MESSAGE_IDS]
            + [f"tool:{c}" for c in ("call_1", "call_2", "call_9")]
            + ["message:m1__user", "message:m%", "message:m_1", "message:unknown"]
        ),
        max_size=6,
    )

    @rule(t=st.integers(0, 1), identities=identities)
    def get_message_seqs(self, t: int, identities: set[str]) -> None:
        thread = self.threads[t]
        got = self.call(self.store.get_message_seqs(thread, identities, user_id=None))
        expected = self.model[thread].message_seqs(identities)
        assert got == expected, (
            "contract: get_message_seqs maps identities to the earliest message seq; unknown "
            f"identities are absent (LIKE wildcards match literally)\n asked: {sorted(identities)}\n"
            f" got: {got}\n expected: {expected}"
        )

    @rule(t=st.integers(0, 1), ids=st.sets(st.sampled_from([*MESSAGE_IDS, "nope"]), max_size=4))
    def find_latest(self, t: int, ids: set[str]) -> None:
        thread = self.threads[t]
        got = self.call(self.store.find_latest_ai_message_run_ids(thread, ids, user_id=None))
        expected = self.model[thread].latest_ai_runs(ids)
        assert got == expected, (
            "contract: find_latest_ai_message_run_ids maps each AI message id to the run of its "
            f"newest AI message event\n asked: {sorted(ids)}\n got: {got}\n expected: {expected}"
        )

    # -- deletes --------------------------------------------------------------------

    @precondition(lambda self: any(m.records for m in self.model.values()))
    @rule(t=st.integers(0, 1), run=st.sampled_from(RUNS))
    def delete_by_run(self, t: int, run: str) -> None:
        thread = self.threads[t]
        model = self.model[thread]
        got = self.call(self.store.delete_by_run(thread, run, user_id=None))
        expected = len(model.run_events(run))
        assert got == expected, f"contract: delete_by_run returns how many events it deleted ({got} != {expected})"
        model.records = [r for r in model.records if r["run_id"] != run]

    @precondition(lambda self: any(m.records for m in self.model.values()))
    @rule(t=st.integers(0, 1))
    def delete_by_thread(self, t: int) -> None:
        thread = self.threads[t]
        model = self.model[thread]
        got = self.call(self.store.delete_by_thread(thread, user_id=None))
        assert got == len(model.records), (
            f"contract: delete_by_thread returns how many events it deleted ({got} != {len(model.records)})"
        )
        model.records = []

    # -- invariants -----------------------------------------------------------------

    @invariant()
    def thread_matches_model(self) -> None:
        for thread in self.threads:
            model = self.model[thread]
            count = self.call(self.store.count_messages(thread, user_id=None))
            assert count == len(model.messages), (
                f"contract: count_messages counts the thread's message events ({count} != {len(model.messages)})"
            )
            got = self.call(self.store.list_messages(thread, limit=10_000, user_id=None))
            seqs = [r["seq"] for r in got]
            assert seqs == sorted(set(seqs)), f"contract: seq strictly increases per thread: {seqs}"
            assert [core(r) for r in got] == model.messages, (
                "contract: a thread holds exactly what was written and not deleted"
            )

    def teardown(self) -> None:
        for thread in self.threads:
            self.call(self.store.delete_by_thread(thread, user_id=None))


def test_state_machine_matches_model(events_target: Any) -> None:
    """Random put/put_batch/put_if_absent/reads/deletes agree with a plain-dict model."""
    with events_target.session() as session:
        # A factory: hypothesis's parameter is named for one, though annotated as a class.
        run_state_machine_as_test(
            lambda: EventStoreMachine(session),  # type: ignore[arg-type]
            settings=settings(suppress_health_check=list(HealthCheck)),
        )


# =====================================================================================
# put_if_absent serialization races
# =====================================================================================


def _race_events(thread: str, run: str, n: int) -> list[dict[str, Any]]:
    return [
        {"thread_id": thread, "run_id": run, "event_type": "tool.result", "category": "trace", "content": {"i": i}}
        for i in range(n)
    ]


def _check_race(
    claims: list[tuple[dict[str, Any], bool]],
    batches: list[list[dict[str, Any]]],
    all_seqs: list[int],
    total: int,
    where: str,
) -> None:
    created = [c for c in claims if c[1]]
    assert len(created) == 1, (
        f"contract: put_if_absent is serialized with every writer of the thread: exactly one "
        f"racing caller creates the record ({where}; {len(created)} created)"
    )
    first = core(created[0][0])
    for record, _ in claims:
        assert core(record) == first, (
            f"contract: put_if_absent is serialized: every racing caller gets the same record ({where})"
        )
    for batch in batches:
        seqs = [r["seq"] for r in batch]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), (
            f"contract: a batch gets one contiguous seq block even under concurrency ({where}): {seqs}"
        )
    assert sorted(all_seqs) == list(range(1, total + 1)), (
        f"contract: concurrent writers get unique, gap-free seqs ({where}): {sorted(all_seqs)}"
    )


def test_put_if_absent_race_in_one_process(events_target: Any) -> None:
    """Many coroutines racing put_if_absent and put_batch on one thread."""

    async def body(store: RunEventStore) -> None:
        for round_ in range(3):
            thread = fresh_id("race")

            async def claim(i: int, thread: str = thread) -> tuple[dict[str, Any], bool]:
                return await store.put_if_absent(
                    thread_id=thread, run_id="run-1", event_type="run.end", category="lifecycle",
                    content={"by": i}, user_id=None,
                )  # type: ignore[return-value]

            async def batch(i: int, thread: str = thread) -> list[dict[str, Any]]:
                return await store.put_batch(_race_events(thread, f"b{i}", 3), user_id=None)  # type: ignore[return-value]

            jobs: list[Awaitable[Any]] = [claim(i) for i in range(12)] + [batch(i) for i in range(6)]
            random.Random(round_).shuffle(jobs)
            results = await asyncio.gather(*jobs)
            claims = [r for r in results if isinstance(r, tuple)]
            batches = [r for r in results if isinstance(r, list)]
            seqs = [claims[0][0]["seq"]]
            for i in range(6):
                seqs += [r["seq"] for r in await store.list_events(thread, f"b{i}", user_id=None)]
            _check_race(claims, batches, seqs, 1 + 6 * 3, f"round {round_}")
            extra = await store.list_events(thread, "run-1", user_id=None)
            assert len(extra) == 1, (
                "contract: put_if_absent is serialized: one record per (thread, run, event_type)"
            )
            await store.delete_by_thread(thread, user_id=None)

    events_target.run(body)


def test_concurrent_readers_never_see_half_a_batch(events_target: Any) -> None:
    """Readers racing batch writers see each batch entirely or not at all."""

    async def body(store: RunEventStore) -> None:
        thread = fresh_id("vis")
        done = False

        async def writer(i: int) -> None:
            for k in range(4):
                await store.put_batch(
                    [_message(thread, f"w{i}-{k}", {"type": "ai", "id": f"{i}-{k}-{j}"}) for j in range(4)],
                    user_id=None,
                )
                await asyncio.sleep(0)

        async def reader() -> int:
            looks = 0
            while not done or looks == 0:
                rows = await store.list_messages(thread, limit=10_000, user_id=None)
                per_run: dict[str, int] = {}
                for r in rows:
                    per_run[r["run_id"]] = per_run.get(r["run_id"], 0) + 1
                half = {run: n for run, n in per_run.items() if n != 4}
                assert not half, (
                    f"contract: put_batch is all-or-nothing: a concurrent reader saw part of a batch {half}"
                )
                looks += 1
                await asyncio.sleep(0)
            return looks

        readers = [asyncio.ensure_future(reader()) for _ in range(2)]
        await asyncio.gather(*(writer(i) for i in range(3)))
        done = True
        await asyncio.gather(*readers)
        assert await store.count_messages(thread, user_id=None) == 3 * 4 * 4
        await store.delete_by_thread(thread, user_id=None)

    events_target.run(body)


@pytest.mark.requires("cross_process")
def test_put_if_absent_race_across_processes(events_target: Any, request: pytest.FixtureRequest) -> None:
    """The same race from 4 OS processes, each opening its own instance by URL."""
    thread = fresh_id("xproc")
    url = events_target.url.render(hide_password=False)
    plugins = development_plugins(request.config)
    rounds, workers = 4, 4
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(workers)
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            futures = [
                pool.submit(race_worker, url, plugins, thread, i, rounds, barrier)
                for i in range(workers)
            ]
            results = [f.result(timeout=300) for f in futures]

    async def read_back(store: RunEventStore) -> list[int]:
        seqs: list[int] = []
        for k in range(rounds):
            seqs += [r["seq"] for r in await store.list_events(thread, f"run-{k}", user_id=None)]
        for i in range(workers):
            seqs += [r["seq"] for r in await store.list_events(thread, f"w{i}", user_id=None)]
        await store.delete_by_thread(thread, user_id=None)
        return seqs

    all_seqs = events_target.run(read_back)
    batches = [b for res in results for b in res["batches"]]
    for k in range(rounds):
        claims = [c for res in results for c in res["claims"][k]]
        created = [c for c in claims if c[1]]
        assert len(created) == 1, (
            f"contract: put_if_absent is serialized across processes (cross_process): exactly one "
            f"of {workers} processes creates run-{k}'s record ({len(created)} created)"
        )
        assert all(c[0] == created[0][0] for c in claims), (
            "contract: put_if_absent is serialized across processes: every process gets the same record"
        )
    total = rounds + workers * rounds * 2
    for batch in batches:
        assert batch == list(range(batch[0], batch[0] + len(batch))), (
            f"contract: a batch gets one contiguous seq block across processes: {batch}"
        )
    assert sorted(all_seqs) == list(range(1, total + 1)), (
        f"contract: writers in several processes get unique, gap-free seqs: {sorted(all_seqs)}"
    )


# =====================================================================================
# Paging
# =====================================================================================


def test_paging_walks_reconstruct_the_thread(events_target: Any) -> None:
    """Walking backward and forward with random limits gives every message exactly once."""
    with events_target.session() as session:
        store: RunEventStore = session.backend

        @settings(max_examples=min(settings().max_examples, 15), suppress_health_check=list(HealthCheck))
        @given(
            cats=st.lists(st.sampled_from(["message", "message", "trace", "lifecycle"]), min_size=0, max_size=40),
            data=st.data(),
        )
        def walk(cats: list[str], data: st.DataObject) -> None:
            thread = fresh_id("page")
            events = [
                {"thread_id": thread, "run_id": f"run-{i % 3}", "event_type": "ai_message",
                 "category": c, "content": {"type": "ai", "id": f"m{i}"}}
                for i, c in enumerate(cats)
            ]
            records = session.run(store.put_batch(events, user_id=None)) if events else []
            messages = [core(r) for r in records if r["category"] == "message"]
            try:
                # backward from the newest
                seen: list[dict[str, Any]] = []
                before: int | None = None
                for _ in range(len(messages) + 2):
                    limit = data.draw(st.integers(1, 7), label="backward limit")
                    got = session.run(store.list_messages(thread, limit=limit, before_seq=before, user_id=None))
                    assert len(got) <= limit, (
                        f"contract: a page holds at most `limit` messages (limit={limit}, "
                        f"before_seq={before}, got {len(got)})"
                    )
                    if before is None:
                        assert [core(r) for r in got] == page(messages, limit, None, None), (
                            "contract: without cursors list_messages gives the newest `limit` "
                            f"messages, ascending (limit={limit}; got {[r['seq'] for r in got]})"
                        )
                    if before is not None:
                        assert all(r["seq"] < before for r in got), (
                            f"contract: before_seq is exclusive (before_seq={before}, got seqs "
                            f"{[r['seq'] for r in got]})"
                        )
                    assert [r["seq"] for r in got] == sorted(r["seq"] for r in got), (
                        "contract: a message page is ascending by seq"
                    )
                    if not got:
                        break
                    seen = [core(r) for r in got] + seen
                    before = got[0]["seq"]
                assert seen == messages, (
                    "contract: walking list_messages backward with before_seq (exclusive) yields "
                    "every message exactly once, other categories interleaved"
                )
                # forward from the start
                seen = []
                after: int | None = data.draw(st.sampled_from([None, 0, -5]), label="start")
                if after is None:
                    after = 0
                for _ in range(len(messages) + 2):
                    limit = data.draw(st.integers(1, 7), label="forward limit")
                    got = session.run(store.list_messages(thread, limit=limit, after_seq=after, user_id=None))
                    assert len(got) <= limit, (
                        f"contract: a page holds at most `limit` messages (limit={limit}, "
                        f"after_seq={after}, got {len(got)})"
                    )
                    assert [r["seq"] for r in got] == sorted(r["seq"] for r in got), (
                        "contract: a message page is ascending by seq"
                    )
                    assert all(r["seq"] > after for r in got), (
                        f"contract: after_seq is exclusive (after_seq={after}, got {[r['seq'] for r in got]})"
                    )
                    if not got:
                        break
                    seen += [core(r) for r in got]
                    after = got[-1]["seq"]
                assert seen == messages, (
                    "contract: walking list_messages forward with after_seq (exclusive) yields every "
                    "message exactly once, other categories interleaved"
                )
                # both cursors together
                top = len(cats) + 2
                lo = data.draw(st.integers(-1, top), label="after_seq")
                hi = data.draw(st.integers(-1, top), label="before_seq")
                limit = data.draw(st.integers(0, 10), label="limit")
                got = session.run(
                    store.list_messages(thread, limit=limit, before_seq=hi, after_seq=lo, user_id=None)
                )
                expected = page(messages, limit, hi, lo)
                assert [core(r) for r in got] == expected, (
                    f"contract: both cursors give the first `limit` messages strictly between "
                    f"after_seq={lo} and before_seq={hi} (limit={limit}); got "
                    f"{[r['seq'] for r in got]}, expected {[r['seq'] for r in expected]}"
                )
                newest = session.run(store.list_messages(thread, limit=limit, user_id=None))
                assert [core(r) for r in newest] == page(messages, limit, None, None), (
                    "contract: without cursors list_messages gives the newest `limit` messages, ascending"
                )
                # The edges random draws can miss: a window wider than the limit.
                if len(messages) >= 2:
                    top_seq = messages[-1]["seq"] + 1
                    got = session.run(store.list_messages(thread, limit=1, user_id=None))
                    assert [core(r) for r in got] == messages[-1:], (
                        "contract: without cursors list_messages gives the newest `limit` messages "
                        f"(limit=1 gave seqs {[r['seq'] for r in got]}, newest is {messages[-1]['seq']})"
                    )
                    got = session.run(store.list_messages(thread, limit=1, before_seq=top_seq, user_id=None))
                    assert [core(r) for r in got] == messages[-1:], (
                        f"contract: a page holds at most `limit` messages: before_seq gives the last "
                        f"`limit` below it (limit=1, before_seq={top_seq}; got {[r['seq'] for r in got]})"
                    )
                    got = session.run(
                        store.list_messages(thread, limit=1, after_seq=0, before_seq=top_seq, user_id=None)
                    )
                    assert [core(r) for r in got] == messages[:1], (
                        f"contract: both cursors give the first `limit` messages strictly between "
                        f"after_seq=0 and before_seq={top_seq} (limit=1); got {[r['seq'] for r in got]}, "
                        f"expected {messages[0]['seq']}"
                    )
            finally:
                session.run(store.delete_by_thread(thread, user_id=None))

        walk()


# =====================================================================================
# find_latest_ai_message_run_ids
# =====================================================================================

BIG = AI_LOOKUP_PAGE_SIZE * 2 + 300


async def _big_thread(store: RunEventStore, thread: str) -> dict[str, str]:
    """A thread of BIG messages: AI message ``old-k`` every 97 rows; returns id -> run."""
    expected: dict[str, str] = {}
    events = []
    for i in range(BIG):
        if i % 97 == 0:
            mid = f"old-{i}"
            run = f"run-{i % 5}"
            expected[mid] = run
            events.append(_message(thread, run, {"type": "ai", "id": mid}))
        else:
            events.append(_message(thread, "run-h", {"type": "human", "id": f"h{i}"}, event_type="human_message"))
    for start in range(0, len(events), 500):
        await store.put_batch(events[start : start + 500], user_id=None)
    return expected


class _AppendingView:
    """Delegates to a store, but appends newer AI messages after each page is read."""

    def __init__(self, store: RunEventStore, thread: str, ids: list[str]) -> None:
        self.store, self.thread, self.ids, self.pages = store, thread, ids, 0

    async def list_messages(self, thread_id: str, **kw: Any) -> list[EventRecord]:
        got = await self.store.list_messages(thread_id, **kw)
        self.pages += 1
        await self.store.put_batch(
            [_message(self.thread, "run-late", {"type": "ai", "id": mid}) for mid in self.ids] * 3,
            user_id=None,
        )
        return got


class _StuckView:
    """A store whose list_messages ignores before_seq: its seqs never progress."""

    def __init__(self, store: RunEventStore) -> None:
        self.store = store

    async def list_messages(self, thread_id: str, **kw: Any) -> list[EventRecord]:
        kw.pop("before_seq", None)
        return await self.store.list_messages(thread_id, **kw)


def test_find_latest_ai_message_run_ids_keeps_first_page_watermark(events_target: Any) -> None:
    """The default walk answers from the first page's snapshot while writers append."""

    async def body(store: RunEventStore) -> None:
        thread = fresh_id("hw")
        try:
            expected = await _big_thread(store, thread)
            targets = sorted(expected)
            view = _AppendingView(store, thread, targets)
            got = await walk_ai_message_runs(view.list_messages, thread, {*targets, "never"}, None)
            assert view.pages >= 3, "the walk should need several pages"
            assert got == expected, (
                "contract: find_latest_ai_message_run_ids keeps its first-page high-watermark: "
                "rows appended during the walk neither hide nor replace older answers "
                f"(got {len(got)} ids, expected {len(expected)}; mismatches: "
                f"{ {k: (got.get(k), v) for k, v in expected.items() if got.get(k) != v} })"
            )
            # The backend's own implementation, racing a writer: complete, each answer either
            # the original run or the run appended meanwhile.
            async def writer() -> None:
                for _ in range(5):
                    await store.put_batch(
                        [_message(thread, "run-late2", {"type": "ai", "id": m}) for m in targets[:3]],
                        user_id=None,
                    )
                    await asyncio.sleep(0)

            own, _ = await asyncio.gather(
                store.find_latest_ai_message_run_ids(thread, targets, user_id=None), writer()
            )
            assert set(own) == set(targets), (
                "contract: find_latest_ai_message_run_ids is complete (every AI message id found) "
                f"while writers append; missing {sorted(set(targets) - set(own))}"
            )
            for mid, run in own.items():
                assert run in (expected[mid], "run-late", "run-late2"), (
                    f"contract: find_latest_ai_message_run_ids maps {mid} to the run of its newest AI event, got {run}"
                )
        finally:
            await store.delete_by_thread(thread, user_id=None)

    events_target.run(body)


def test_find_latest_raises_when_seqs_do_not_progress(events_target: Any) -> None:
    """A full page without a safe, strictly decreasing cursor is an error, never a partial answer."""

    async def body(store: RunEventStore) -> None:
        thread = fresh_id("stuck")
        try:
            await _big_thread(store, thread)
            with pytest.raises(IncompleteMessageRunLookupError):
                await walk_ai_message_runs(
                    _StuckView(store).list_messages, thread, {"old-0", "missing"}, None
                )
        finally:
            await store.delete_by_thread(thread, user_id=None)

    events_target.run(body)


# =====================================================================================
# Message identity and get_message_seqs
# =====================================================================================


def test_message_identity_and_get_message_seqs(events_target: Any) -> None:
    async def body(store: RunEventStore) -> None:
        thread = fresh_id("ident")
        contents: list[tuple[str, Any]] = [
            ("human_message", {"type": "human", "id": "u1__user", "content": "hi"}),  # 1 message:u1
            ("human_message", {"type": "human", "id": "u1", "content": "hi"}),  # 2 message:u1 again
            ("tool.result", {"type": "tool", "id": "tm", "tool_call_id": "call_1"}),  # 3 tool:call_1
            ("llm.ai.response", {"type": "ai", "id": "a1"}),  # 4 message:a1
            ("llm.ai.response", {"type": "ai", "data": {"type": "ai", "id": "a2"}}),  # 5 message:a2
            ("llm.ai.response", {"type": "ai", "id": "x__user"}),  # 6 message:x__user (AI keeps it)
            ("llm.ai.response", {"type": "ai", "id": "a%_\\b"}),  # 7 wildcards literal
            ("llm.ai.response", {"type": "ai", "id": "axyb"}),  # 8
            ("tool.result", {"type": "tool", "id": "a1", "tool_call_id": "call_2"}),  # 9 tool wins
            ("llm.ai.response", "message:zz as plain text"),  # 10 no identity
            ("llm.ai.response", {"type": "ai", "id": "a1"}),  # 11 later duplicate of a1
        ]
        for event_type, content in contents:
            await store.put(
                thread_id=thread, run_id="run-1", event_type=event_type, category="message",
                content=content, user_id=None,
            )
        await store.put(
            thread_id=thread, run_id="run-1", event_type="llm.ai.response", category="trace",
            content={"type": "ai", "id": "trace-only"}, user_id=None,
        )
        asked = [
            "message:u1", "message:u1__user", "tool:call_1", "message:a1", "message:a2",
            "message:x__user", "message:x", "message:a%_\\b", "message:a%", "message:a__b",
            "message:a_yb", "tool:call_2", "message:tm", "message:zz", "message:trace-only",
            "message:unknown",
        ]
        got = await store.get_message_seqs(thread, asked, user_id=None)
        expected = {
            "message:u1": 1, "tool:call_1": 3, "message:a1": 4, "message:a2": 5,
            "message:x__user": 6, "message:a%_\\b": 7, "tool:call_2": 9,
        }
        assert got == expected, (
            "contract: get_message_seqs — tool:{tool_call_id} first, else message:{id}; a human id "
            "loses a trailing __user; earliest seq wins; only message events; unknown identities "
            f"absent; LIKE wildcards match literally\n got: {got}\n expected: {expected}"
        )
        await store.delete_by_thread(thread, user_id=None)

    events_target.run(body)


def test_empty_lookups_do_no_io(events_target: Any) -> None:
    """Empty identities / message ids answer {} without touching storage (even once closed)."""

    async def body(store: RunEventStore) -> None:
        await store.close()
        assert await store.get_message_seqs("t-any", [], user_id=None) == {}, (
            "contract: get_message_seqs with empty input returns {} and does no I/O"
        )
        assert await store.find_latest_ai_message_run_ids("t-any", set(), user_id=None) == {}, (
            "contract: find_latest_ai_message_run_ids with empty input returns {} and does no I/O"
        )

    events_target.run(body)


# =====================================================================================
# Bad input
# =====================================================================================

GOOD = {"run_id": "run-1", "event_type": "llm.ai.response", "category": "message", "content": "ok"}

BAD_EVENTS: dict[str, dict[str, Any]] = {
    "event_type over 32 chars": {"event_type": "e" * 33},
    "empty event_type": {"event_type": ""},
    "category over 16 chars": {"category": "c" * 17},
    "content of a non-JSON type": {"content": object()},
    "content as an int": {"content": 5},
    "content holding a set": {"content": {"a": {1, 2}}},
    "content holding bytes": {"content": [b"raw"]},
    "NaN in content": {"content": {"x": float("nan")}},
    "infinity in metadata": {"metadata": {"x": float("inf")}},
    "lone surrogate in content": {"content": "bad \ud800 text"},
    "lone surrogate in a content key": {"content": {"\udfff": 1}},
    "lone surrogate in event_type": {"event_type": "x\ud800"},
    "non-str content key": {"content": {1: "a"}},
    "metadata not a dict": {"metadata": ["a"]},
    "naive created_at": {"created_at": "2026-01-01T00:00:00"},
    "created_at not ISO-8601": {"created_at": "yesterday"},
    "run_id not a str": {"run_id": 7},
    "empty run_id": {"run_id": ""},
    "created_at before year 1 in UTC": {"created_at": "0001-01-01T00:00:00+05:00"},
    "created_at after year 9999 in UTC": {"created_at": "9999-12-31T23:59:59-05:00"},
}


@pytest.mark.parametrize("case", sorted(BAD_EVENTS))
def test_bad_input_is_a_clear_error_and_writes_nothing(events_target: Any, case: str) -> None:
    async def body(store: RunEventStore) -> None:
        thread = fresh_id("bad")
        event: dict[str, Any] = {"thread_id": thread, **GOOD, **BAD_EVENTS[case]}
        with pytest.raises(BAD_INPUT) as info:
            await store.put(**event, user_id=None)
        assert str(info.value), f"contract: bad input ({case}) raises an error that says what is wrong"
        with pytest.raises(BAD_INPUT):
            await store.put_if_absent(**event, user_id=None)
        good = {"thread_id": thread, **GOOD}
        with pytest.raises(BAD_INPUT):
            await store.put_batch([good, good, event], user_id=None)
        count = await store.count_messages(thread, user_id=None)
        events = await store.list_events(thread, "run-1", user_id=None)
        assert count == 0 and events == [], (
            f"contract: put_batch is all-or-nothing: a rejected batch ({case}) writes nothing "
            f"(found {len(events)} events)"
        )

    events_target.run(body)


def test_put_batch_unknown_key_is_rejected(events_target: Any) -> None:
    async def body(store: RunEventStore) -> None:
        thread = fresh_id("keys")
        good = {"thread_id": thread, **GOOD}
        for extra in ({"seq": 5}, {"user_id": "u"}, {"colour": "red"}):
            with pytest.raises(BAD_INPUT):
                await store.put_batch([good, {**good, **extra}], user_id=None)
        with pytest.raises(BAD_INPUT):
            await store.put_batch([{"thread_id": thread, "run_id": "r"}], user_id=None)
        assert await store.list_events(thread, "run-1", user_id=None) == [], (
            "contract: put_batch is all-or-nothing: unknown or missing keys reject the whole batch"
        )

    events_target.run(body)


def test_put_batch_is_all_or_nothing_and_retry_is_clean(events_target: Any) -> None:
    async def body(store: RunEventStore) -> None:
        a, b = fresh_id("aon"), fresh_id("aon")
        batch = [
            {"thread_id": a, **GOOD, "content": "a1"},
            {"thread_id": b, **GOOD, "content": "b1"},
            {"thread_id": a, **GOOD, "content": "a2"},
            {"thread_id": b, **GOOD, "event_type": "x" * 40},
        ]
        with pytest.raises(BAD_INPUT):
            await store.put_batch(batch, user_id=None)
        for thread in (a, b):
            left = await store.list_messages(thread, limit=100, user_id=None)
            assert left == [], (
                f"contract: put_batch is all-or-nothing: a failed batch leaves no prefix behind "
                f"(found {[r['content'] for r in left]})"
            )
        batch[3] = {"thread_id": b, **GOOD, "content": "b2"}
        got = await store.put_batch(batch, user_id=None)
        assert [(r["thread_id"], r["seq"]) for r in got] == [(a, 1), (b, 1), (a, 2), (b, 2)], (
            "contract: put_batch is all-or-nothing: a retry after a failure starts each thread at "
            f"seq 1 and duplicates nothing (got {[(r['thread_id'][-4:], r['seq']) for r in got]})"
        )
        for thread in (a, b):
            await store.delete_by_thread(thread, user_id=None)

    events_target.run(body)


IDS = [
    "../escape", "a/b", "/abs", "a\\b", "..", ".", "x'; DROP TABLE run_events; --",
    "100%_done\\", 'quote"d', "ünï 🙂 code", "new\nline", "tab\tand space", "a" * 200,
]


@pytest.mark.parametrize("ident", IDS, ids=lambda s: repr(s)[:24])
def test_ids_with_metacharacters_round_trip_or_fail_clearly(events_target: Any, ident: str) -> None:
    async def body(store: RunEventStore) -> None:
        for thread, run in ((f"{ident}", "run-1"), (fresh_id("meta"), ident)):
            try:
                record = await store.put(
                    thread_id=thread, run_id=run, event_type="ai_message", category="message",
                    content={"type": "ai", "id": "m"}, user_id=None,
                )
            except BAD_INPUT as exc:
                assert str(exc), "contract: a rejected id gets an error that says why"
                continue
            assert (record["thread_id"], record["run_id"]) == (thread, run), (
                "contract: ids round-trip faithfully"
            )
            listed = await store.list_events(thread, run, user_id=None)
            assert [core(r) for r in listed] == [core(record)], (
                f"contract: an accepted id ({ident!r}) round-trips faithfully through list_events"
            )
            messages = await store.list_messages(thread, user_id=None)
            assert core(record) in [core(r) for r in messages], (
                "contract: an accepted id round-trips faithfully through list_messages"
            )
            assert await store.delete_by_thread(thread, user_id=None) >= 1

    events_target.run(body)


def test_over_long_id_is_rejected(events_target: Any) -> None:
    async def body(store: RunEventStore) -> None:
        with pytest.raises(BAD_INPUT):
            await store.put(thread_id="t" * 300, run_id="r", event_type="a", category="message", user_id=None)
        with pytest.raises(BAD_INPUT):
            await store.put(thread_id=fresh_id(), run_id="r" * 300, event_type="a", category="message", user_id=None)

    events_target.run(body)


def test_large_and_unusual_content_round_trips(events_target: Any) -> None:
    """A 10 MB message, U+2028/U+0085 line separators and limits at the edge round-trip."""

    async def body(store: RunEventStore) -> None:
        thread = fresh_id("big")
        cases: list[dict[str, Any]] = [
            {"content": "x" * (10 * 1024 * 1024)},
            {"content": {"type": "ai", "id": "big", "content": "é" * (5 * 1024 * 1024)}},
            {"content": "line\u2028sep\u2029para\u0085nel\r\nwin\x0bvt\x0cff\x1cfs end"},
            {"content": ["\u2028", {"k\u2028": "v\u0085"}], "metadata": {"s": "\u2029"}},
            {"content": {"n": 2**63 - 1, "m": -(2**63), "f": 1.5e300, "z": -0.0, "t": True, "u": None}},
            {"event_type": "e" * 32, "category": "c" * 16, "content": ""},
        ]
        try:
            for i, case in enumerate(cases):
                event = {"thread_id": thread, "run_id": f"run-{i}", "event_type": "ai_message",
                         "category": "message", **case}
                try:
                    record = await store.put(**event, user_id=None)
                except BAD_INPUT as exc:
                    assert i == 0 or i == 1, f"contract: valid content must be accepted (case {i}: {exc})"
                    continue
                got = await store.list_events(thread, f"run-{i}", user_id=None)
                assert len(got) == 1 and core(got[0]) == core(record), (
                    f"contract: content round-trips faithfully (case {i})"
                )
                assert got[0]["content"] == case["content"], f"contract: content round-trips faithfully (case {i})"
        finally:
            await store.delete_by_thread(thread, user_id=None)

    events_target.run(body)


def test_read_arguments_are_validated(events_target: Any) -> None:
    async def body(store: RunEventStore) -> None:
        thread = fresh_id("args")
        with pytest.raises(BAD_INPUT):
            await store.list_messages(thread, limit=-1, user_id=None)
        with pytest.raises(BAD_INPUT):
            await store.list_events(thread, "r", event_types="abc", user_id=None)
        assert await store.list_messages(thread, limit=0, user_id=None) == [], "contract: limit=0 is an empty page"

    events_target.run(body)


SEQ_MAX = 2**63 - 1
SEQ_MIN = -(2**63)


def test_cursors_and_limits_beyond_64_bits_are_rejected_everywhere(events_target: Any) -> None:
    """Seqs are signed 64-bit integers: cursors and limits outside that range are bad input."""

    async def body(store: RunEventStore) -> None:
        thread = fresh_id("range")
        await store.put_batch(
            [_message(thread, "r", f"m{i}", event_type="human_message") for i in range(3)],
            user_id=None,
        )
        pages = {
            "list_messages": lambda **kw: store.list_messages(thread, user_id=None, **kw),
            "list_messages_by_run": lambda **kw: store.list_messages_by_run(thread, "r", user_id=None, **kw),
            "list_events": lambda **kw: store.list_events(thread, "r", user_id=None, **kw),
        }
        try:
            for name, page in pages.items():
                cursors = ("after_seq",) if name == "list_events" else ("after_seq", "before_seq")
                for cursor in cursors:
                    for value in (SEQ_MAX + 1, SEQ_MIN - 1, 2**100, -(2**100)):
                        with pytest.raises(BAD_INPUT):
                            await page(**{cursor: value})
                with pytest.raises(BAD_INPUT):
                    await page(limit=SEQ_MAX + 1)
                edge = {
                    "after_seq=SEQ_MAX": (await page(after_seq=SEQ_MAX), []),
                    "after_seq=SEQ_MIN": (len(await page(after_seq=SEQ_MIN)), 3),
                    "limit=SEQ_MAX": (len(await page(limit=SEQ_MAX)), 3),
                }
                if name != "list_events":
                    edge["before_seq=SEQ_MAX"] = (len(await page(before_seq=SEQ_MAX)), 3)
                    edge["before_seq=SEQ_MIN"] = (await page(before_seq=SEQ_MIN), [])
                for case, (got, expected) in edge.items():
                    assert got == expected, (
                        f"contract: cursors and limits at the ends of the 64-bit seq range are "
                        f"accepted and page normally ({name}({case}) gave {got!r}, expected {expected!r})"
                    )
        finally:
            await store.delete_by_thread(thread, user_id=None)

    events_target.run(body)


def test_created_at_at_the_ends_of_the_calendar_round_trips(events_target: Any) -> None:
    async def body(store: RunEventStore) -> None:
        thread = fresh_id("calendar")
        ends = {
            "0001-01-01T00:00:00+00:00": "0001-01-01T00:00:00+00:00",
            "0001-01-01T05:00:00+05:00": "0001-01-01T00:00:00+00:00",
            "9999-12-31T23:59:59.999999Z": "9999-12-31T23:59:59.999999+00:00",
        }
        try:
            for given, normalized in ends.items():
                record = await store.put(
                    thread_id=thread, run_id="r", event_type="e", category="lifecycle",
                    created_at=given, user_id=None,
                )
                assert record["created_at"] == normalized, (
                    f"contract: created_at {given} is accepted and normalized to UTC "
                    f"(got {record['created_at']})"
                )
            stored = [r["created_at"] for r in await store.list_events(thread, "r", user_id=None)]
            assert stored == list(ends.values()), f"contract: created_at round-trips (got {stored})"
        finally:
            await store.delete_by_thread(thread, user_id=None)

    events_target.run(body)


async def _expect(call: Callable[[], Awaitable[Any]], errors: Any, contract: str) -> None:
    try:
        got = await call()
    except errors:
        return
    except Exception as exc:
        raise AssertionError(f"{contract} (raised {type(exc).__name__}: {exc})") from exc
    raise AssertionError(f"{contract} (returned {got!r})")


def test_calls_are_checked_in_one_order(events_target: Any) -> None:
    """Every backend checks a call in one order: its arguments (in signature order), then the
    owner, then answers that need no I/O return, then the store must be open."""

    async def body(store: RunEventStore) -> None:
        bad = ""  # not a thread id
        thread = fresh_id("order")
        no_io: dict[str, Callable[[], Awaitable[Any]]] = {
            "get_message_seqs(bad thread, [])": lambda: store.get_message_seqs(bad, [], user_id=None),
            "find_latest_ai_message_run_ids(bad thread, [])": lambda: store.find_latest_ai_message_run_ids(
                bad, [], user_id=None
            ),
            "get_last_visible_ai_seq_by_run(bad thread, run_ids=[])": lambda: (
                store.get_last_visible_ai_seq_by_run(bad, run_ids=[], user_id=None)
            ),
            "list_events(bad thread, event_types=[])": lambda: store.list_events(
                bad, "r", event_types=[], user_id=None
            ),
            "list_messages(bad thread, limit=0)": lambda: store.list_messages(bad, limit=0, user_id=None),
            "list_messages_by_run(bad run, limit=0)": lambda: store.list_messages_by_run(
                thread, bad, limit=0, user_id=None
            ),
            "list_messages(limit=0, after_seq='1')": lambda: store.list_messages(
                thread, limit=0, after_seq="1", user_id=None  # type: ignore[arg-type]
            ),
        }
        for name, call in no_io.items():
            await _expect(call, BAD_INPUT, f"contract: arguments are checked before an answer that needs no I/O: {name} is bad input")
        # No owner_scope is set: user_id=AUTO (the default) cannot be resolved.
        before_owner: dict[str, Callable[[], Awaitable[Any]]] = {
            "get_message_seqs(bad thread)": lambda: store.get_message_seqs(bad, ["message:a"]),
            "count_messages(bad thread)": lambda: store.count_messages(bad),
            "delete_by_run(bad run)": lambda: store.delete_by_run(thread, bad),
            "put(empty event_type)": lambda: store.put(
                thread_id=thread, run_id="r", event_type="", category="message"
            ),
            "put_batch(bad thread)": lambda: store.put_batch(
                [{"thread_id": bad, "run_id": "r", "event_type": "e", "category": "message"}]
            ),
        }
        for name, call in before_owner.items():
            await _expect(call, BAD_INPUT, f"contract: arguments are checked before the owner: {name} without an owner context is bad input")
        empty_without_owner: dict[str, Callable[[], Awaitable[Any]]] = {
            "get_message_seqs(thread, [])": lambda: store.get_message_seqs(thread, []),
            "find_latest_ai_message_run_ids(thread, [])": lambda: store.find_latest_ai_message_run_ids(thread, []),
            "list_messages(thread, limit=0)": lambda: store.list_messages(thread, limit=0),
            "put_batch([])": lambda: store.put_batch([]),
        }
        for name, call in empty_without_owner.items():
            await _expect(call, OwnerContextMissingError, f"contract: the owner is resolved before an answer that needs no I/O: {name} without an owner context fails")
        await store.close()
        empty_answers: dict[str, tuple[Any, Any]] = {
            "get_message_seqs(thread, [])": (await store.get_message_seqs(thread, [], user_id=None), {}),
            "find_latest_ai_message_run_ids(thread, [])": (
                await store.find_latest_ai_message_run_ids(thread, [], user_id=None), {}
            ),
            "get_last_visible_ai_seq_by_run(run_ids=[])": (
                await store.get_last_visible_ai_seq_by_run(thread, run_ids=[], user_id=None), {}
            ),
            "list_messages(limit=0)": (await store.list_messages(thread, limit=0, user_id=None), []),
            "list_events(event_types=[])": (
                await store.list_events(thread, "r", event_types=[], user_id=None), []
            ),
            "put_batch([])": (await store.put_batch([], user_id=None), []),
        }
        for name, (got, expected) in empty_answers.items():
            assert got == expected, (
                f"contract: an answer that needs no I/O is given even by a closed store ({name} gave {got!r})"
            )
        await _expect(
            lambda: store.list_messages(bad, user_id=None), BAD_INPUT,
            "contract: arguments are checked before the store: bad input to a closed store is bad input",
        )
        await _expect(
            lambda: store.get_message_seqs(thread, []), OwnerContextMissingError,
            "contract: the owner is resolved before the store: a closed store still needs an owner context",
        )
        for name, call in {
            "count_messages": lambda: store.count_messages(thread, user_id=None),
            "list_messages": lambda: store.list_messages(thread, user_id=None),
            "put": lambda: store.put(thread_id=thread, run_id="r", event_type="e", category="message", user_id=None),
            "delete_by_thread": lambda: store.delete_by_thread(thread, user_id=None),
        }.items():
            await _expect(call, RuntimeError, f"contract: a call that needs I/O on a closed store raises RuntimeError ({name})")

    events_target.run(body)


# =====================================================================================
# Normalization and the small rules
# =====================================================================================


def test_records_are_normalized_and_isolated(events_target: Any) -> None:
    async def body(store: RunEventStore) -> None:
        thread = fresh_id("norm")
        content: dict[str, Any] = {"type": "ai", "id": "m", "nested": {"a": [1, 2]}}
        meta = {"task_id": "t1"}
        record = await store.put(
            thread_id=thread, run_id="r", event_type="ai_message", category="message",
            content=content, metadata=meta, created_at="2026-03-04T05:06:07.5+02:00", user_id=None,
        )
        assert record["created_at"] == "2026-03-04T03:06:07.500000+00:00", (
            f"contract: created_at is returned normalized to UTC ISO-8601 (got {record['created_at']})"
        )
        content["nested"]["a"].append(3)
        meta["task_id"] = "changed"
        record_content = record["content"]
        assert isinstance(record_content, dict), "contract: JSON content comes back as it was put"
        record_content["id"] = "mutated"
        record["metadata"]["x"] = 1
        again = await store.list_events(thread, "r", user_id=None)
        assert again[0]["content"] == {"type": "ai", "id": "m", "nested": {"a": [1, 2]}}, (
            "contract: a store keeps its own copy; mutating inputs or returned records changes nothing"
        )
        assert again[0]["metadata"] == {"task_id": "t1"}, "contract: a store keeps its own copy of metadata"
        plain = await store.put(thread_id=thread, run_id="r", event_type="x", category="lifecycle", user_id=None)
        assert plain["metadata"] == {} and plain["content"] == "", (
            "contract: metadata defaults to {} (never None) and content to ''"
        )
        from datetime import datetime

        parsed = datetime.fromisoformat(plain["created_at"])
        assert parsed.utcoffset() is not None, "contract: created_at is timezone-aware ISO-8601"
        assert await store.list_events(thread, "r", event_types=[], user_id=None) == [], (
            "contract: event_types=[] matches nothing"
        )
        assert await store.delete_by_thread(thread, user_id=None) == 2

    events_target.run(body)


def test_unknown_threads_are_empty(events_target: Any) -> None:
    async def body(store: RunEventStore) -> None:
        thread = fresh_id("none")
        assert await store.list_messages(thread, user_id=None) == []
        assert await store.list_events(thread, "r", user_id=None) == []
        assert await store.list_messages_by_run(thread, "r", user_id=None) == []
        assert await store.count_messages(thread, user_id=None) == 0
        assert await store.get_last_visible_ai_seq_by_run(thread, user_id=None) == {}
        assert await store.get_message_seqs(thread, ["message:a"], user_id=None) == {}
        assert await store.find_latest_ai_message_run_ids(thread, ["a"], user_id=None) == {}
        assert await store.delete_by_run(thread, "r", user_id=None) == 0, "contract: deletes return counts"
        assert await store.delete_by_thread(thread, user_id=None) == 0, "contract: deletes return counts"

    events_target.run(body)


def test_trace_content_is_cut_and_marked(events_target: Any) -> None:
    async def body(store: RunEventStore) -> None:
        thread = fresh_id("trace")
        long_text = "ab€" * 20  # 100 bytes; the cut at 50 falls inside a 3-byte character
        record = await store.put(
            thread_id=thread, run_id="r", event_type="trace.step", category="trace",
            content=long_text, metadata={"k": 1}, user_id=None,
        )
        assert record["content"] == long_text.encode()[:50].decode("utf-8", "ignore"), (
            "contract: trace content over run_events.max_trace_content bytes is cut on a "
            f"character boundary (got {record['content']!r})"
        )
        assert record["metadata"] == {"k": 1, "content_truncated": True, "original_byte_length": 100}, (
            "contract: cut trace content is marked with content_truncated and original_byte_length"
        )
        structured = await store.put(
            thread_id=thread, run_id="r", event_type="trace.step", category="trace",
            content={"blob": "z" * 80}, user_id=None,
        )
        assert isinstance(structured["content"], str) and len(structured["content"].encode()) <= 50, (
            "contract: cut structured trace content becomes its JSON text, cut"
        )
        assert structured["metadata"]["original_byte_length"] == len('{"blob":"' + "z" * 80 + '"}')
        short = await store.put(
            thread_id=thread, run_id="r", event_type="trace.step", category="message",
            content="m" * 100, user_id=None,
        )
        assert short["content"] == "m" * 100 and short["metadata"] == {}, (
            "contract: only category=trace content is cut"
        )
        stored = await store.list_events(thread, "r", user_id=None)
        assert [core(r) for r in stored] == [core(record), core(structured), core(short)], (
            "contract: the cut record is what is stored"
        )
        await store.delete_by_thread(thread, user_id=None)

    events_target.run(body, settings={"run_events": {"max_trace_content": 50}})


def test_user_id_auto_without_owner_context_fails(events_target: Any) -> None:
    """``user_id=AUTO`` (the default) needs an owner_scope on every backend, reads and writes."""

    async def body(store: RunEventStore) -> None:
        thread = fresh_id("auto")
        with pytest.raises(OwnerContextMissingError):
            await store.put(thread_id=thread, run_id="r", event_type="a", category="message")
        with pytest.raises(OwnerContextMissingError):
            await store.put_batch([{"thread_id": thread, "run_id": "r", "event_type": "a", "category": "m"}])
        with pytest.raises(OwnerContextMissingError):
            await store.list_messages(thread)
        with pytest.raises(OwnerContextMissingError):
            await store.delete_by_thread(thread)
        with owner_scope(None):
            await store.put(thread_id=thread, run_id="r", event_type="a", category="message")
            assert await store.count_messages(thread) == 1
            assert await store.delete_by_thread(thread) == 1

    events_target.run(body)


@pytest.mark.requires("owner_filter")
def test_owner_filter(events_target: Any) -> None:
    """Declared ``owner_filter``: the owner is stored on writes and filters every read and delete."""

    async def body(store: RunEventStore) -> None:
        thread = fresh_id("own")
        with owner_scope("alice"):
            a1 = await store.put(thread_id=thread, run_id="r1", event_type="ai_message", category="message",
                                 content={"type": "ai", "id": "ma"})
        b1 = await store.put(thread_id=thread, run_id="r1", event_type="ai_message", category="message",
                             content={"type": "ai", "id": "mb"}, user_id="bob")
        (n1,) = await store.put_batch(
            [{"thread_id": thread, "run_id": "r2", "event_type": "ai_message", "category": "message",
              "content": {"type": "ai", "id": "mn"}}], user_id=None,
        )
        _check_owner(events_target, a1, "alice")
        _check_owner(events_target, b1, "bob")
        _check_owner(events_target, n1, None)
        alice = await store.list_messages(thread, user_id="alice")
        assert [r["seq"] for r in alice] == [a1["seq"]], "contract: owner_filter: list_messages shows only the owner's events"
        everyone = await store.list_messages(thread, user_id=None)
        assert len(everyone) == 3, "contract: owner_filter: user_id=None disables the filter"
        with owner_scope("bob"):
            assert await store.count_messages(thread) == 1, "contract: owner_filter: AUTO reads the owner_scope"
            assert [r["seq"] for r in await store.list_events(thread, "r1")] == [b1["seq"]]
            assert [r["seq"] for r in await store.list_messages_by_run(thread, "r1")] == [b1["seq"]]
            assert await store.get_message_seqs(thread, ["message:ma", "message:mb"]) == {"message:mb": b1["seq"]}
            assert await store.find_latest_ai_message_run_ids(thread, ["ma", "mb"]) == {"mb": "r1"}
            assert await store.get_last_visible_ai_seq_by_run(thread) == {"r1": b1["seq"]}
        assert await store.count_messages(thread, user_id="carol") == 0
        existing, created = await store.put_if_absent(
            thread_id=thread, run_id="r1", event_type="ai_message", category="message", user_id="carol",
        )
        assert created is False and existing["seq"] == a1["seq"], (
            "contract: put_if_absent's existence check ignores the owner (one record per "
            "(thread, run, event_type))"
        )
        assert await store.delete_by_run(thread, "r1", user_id="bob") == 1, (
            "contract: owner_filter: deletes remove only the owner's events"
        )
        assert await store.count_messages(thread, user_id=None) == 2
        assert await store.delete_by_thread(thread, user_id="alice") == 1
        assert await store.delete_by_thread(thread, user_id=None) == 1

    events_target.run(body)


@pytest.mark.requires("durable")
def test_durable_data_survives_reopen(events_target: Any) -> None:
    """Declared ``durable``: closing and reopening keeps every event and the seq counter."""
    thread = fresh_id("dur")

    async def write(store: RunEventStore) -> list[dict[str, Any]]:
        return await store.put_batch(  # type: ignore[return-value]
            [{"thread_id": thread, "run_id": f"r{i % 2}", "event_type": "ai_message", "category": "message",
              "content": {"type": "ai", "id": f"m{i}"}} for i in range(5)],
            user_id=None,
        )

    written = events_target.run(write)

    async def reopen(store: RunEventStore) -> None:
        got = await store.list_messages(thread, user_id=None)
        assert [core(r) for r in got] == [core(r) for r in written], (
            "contract: durable backends keep every event across close and reopen"
        )
        nxt = await store.put(thread_id=thread, run_id="r9", event_type="a", category="message", user_id=None)
        assert nxt["seq"] == 6, f"contract: durable backends recover seq on reopen and never reuse one (got {nxt['seq']})"
        await store.delete_by_thread(thread, user_id=None)

    events_target.run(reopen)


# =====================================================================================
# Known edges, written out: each broke a realistic store that random examples can miss
# =====================================================================================


def _ai(thread: str, run: str, mid: str, **extra: Any) -> dict[str, Any]:
    return _message(thread, run, {"type": "ai", "id": mid, "content": mid}, **extra)


def test_seq_after_deletes_is_highest_remaining_plus_one(events_target: Any) -> None:
    """After a delete the next seq is the highest remaining seq + 1: deleting the newest
    run frees its seqs, deleting a middle run does not (no seq is handed out twice), and
    a thread deleted entirely starts again at 1."""

    async def body(store: RunEventStore) -> None:
        thread = fresh_id("seq")
        for run in ("a", "b", "c"):
            await store.put_batch([_ai(thread, run, f"{run}{i}") for i in range(2)], user_id=None)
        steps = [("delete run b (middle)", "b", 7), ("delete run c (newest)", "c", 3)]
        for what, run, expected in steps:
            await store.delete_by_run(thread, run, user_id=None)
            got = await store.put(**_ai(thread, "d", f"after-{run}"), user_id=None)
            assert got["seq"] == expected, (
                f"contract: after a delete the next seq is the highest remaining seq + 1 ({what}: "
                f"expected {expected}, got {got['seq']})"
            )
            await store.delete_by_run(thread, "d", user_id=None)
        await store.delete_by_thread(thread, user_id=None)
        fresh = await store.put(**_ai(thread, "e", "again"), user_id=None)
        assert fresh["seq"] == 1, (
            f"contract: after a delete the next seq is the highest remaining seq + 1, so a thread "
            f"deleted entirely starts again at 1 (got {fresh['seq']})"
        )
        await store.delete_by_thread(thread, user_id=None)

    events_target.run(body)


def test_run_paging_and_limits(events_target: Any) -> None:
    """list_messages_by_run pages one run exactly like list_messages (exclusive cursors);
    list_events honours limit and after_seq, with filters applied before the limit."""

    async def body(store: RunEventStore) -> None:
        thread = fresh_id("runpage")
        events = []
        for i in range(12):
            run = "r1" if i % 3 else "r2"
            category = "message" if i % 2 else "trace"
            events.append(_ai(thread, run, f"m{i}", category=category,
                              event_type="ai_message" if i % 4 else "tool.result",
                              metadata={"task_id": "t1" if i % 5 else "t2"}))
        records = await store.put_batch(events, user_id=None)
        try:
            r1 = [core(r) for r in records if r["run_id"] == "r1"]
            r1_messages = [r for r in r1 if r["category"] == "message"]
            seqs = [r["seq"] for r in r1_messages]
            for after in [None, 0, *seqs]:
                for before in [None, *seqs, 99]:
                    for limit in (1, 2, 100):
                        got = await store.list_messages_by_run(
                            thread, "r1", limit=limit, after_seq=after, before_seq=before, user_id=None
                        )
                        expected = page(r1_messages, limit, before, after)
                        assert [core(r) for r in got] == expected, (
                            f"contract: list_messages_by_run pages one run's messages like list_messages "
                            f"(limit={limit}, after_seq={after}, before_seq={before}; cursors are "
                            f"exclusive); got seqs {[r['seq'] for r in got]}, expected "
                            f"{[r['seq'] for r in expected]}"
                        )
            for limit in (1, 2, 3):
                for after in (None, r1[0]["seq"], r1[2]["seq"]):
                    got = await store.list_events(thread, "r1", limit=limit, after_seq=after, user_id=None)
                    expected = [r for r in r1 if after is None or r["seq"] > after][:limit]
                    assert [core(r) for r in got] == expected, (
                        f"contract: list_events gives the run's first `limit` events above after_seq "
                        f"(exclusive), every category (limit={limit}, after_seq={after}); got seqs "
                        f"{[r['seq'] for r in got]}, expected {[r['seq'] for r in expected]}"
                    )
                for types, task in ((["tool.result"], None), (None, "t2"), (["ai_message"], "t1")):
                    got = await store.list_events(
                        thread, "r1", event_types=types, task_id=task, limit=limit, user_id=None
                    )
                    expected = [
                        r for r in r1
                        if (types is None or r["event_type"] in types)
                        and (task is None or r["metadata"].get("task_id") == task)
                    ][:limit]
                    assert [core(r) for r in got] == expected, (
                        f"contract: list_events applies event_types and task_id before the limit "
                        f"(event_types={types}, task_id={task!r}, limit={limit}); got seqs "
                        f"{[r['seq'] for r in got]}, expected {[r['seq'] for r in expected]}"
                    )
        finally:
            await store.delete_by_thread(thread, user_id=None)

    events_target.run(body)


def test_lookups_pick_the_right_event(events_target: Any) -> None:
    """find_latest_ai_message_run_ids takes the NEWEST AI message with the id (never a
    human or tool message, never a trace); get_message_seqs the EARLIEST; the last visible
    AI seq per run skips middleware callers and is the run's LAST one; empty run_ids is {}."""

    async def body(store: RunEventStore) -> None:
        thread = fresh_id("lookup")
        await store.put_batch(
            [
                _ai(thread, "old", "m1"),  # 1
                _ai(thread, "old", "m2"),  # 2
                _ai(thread, "new", "m1"),  # 3: newer AI m1
                _message(thread, "human-run", {"type": "human", "id": "m1"}, event_type="human_message"),  # 4
                _ai(thread, "trace-run", "m1", category="trace"),  # 5
                _ai(thread, "new", "m3", metadata={"caller": "lead"}),  # 6
                _ai(thread, "new", "m4", metadata={"caller": "middleware:summary"}),  # 7
                _ai(thread, "old", "m5"),  # 8
            ],
            user_id=None,
        )
        try:
            got = await store.find_latest_ai_message_run_ids(thread, ["m1", "m2", "nope"], user_id=None)
            assert got == {"m1": "new", "m2": "old"}, (
                "contract: find_latest_ai_message_run_ids maps each AI message id to the run of its "
                f"NEWEST AI message event (message category, type ai); got {got}"
            )
            seqs = await store.get_message_seqs(thread, ["message:m1", "message:m5"], user_id=None)
            assert seqs == {"message:m1": 1, "message:m5": 8}, (
                f"contract: get_message_seqs maps an identity to its EARLIEST message seq; got {seqs}"
            )
            last = await store.get_last_visible_ai_seq_by_run(thread, user_id=None)
            assert last == {"old": 8, "new": 6}, (
                "contract: get_last_visible_ai_seq_by_run maps each run to its LAST visible AI message "
                f"(a middleware:* caller hides one); got {last}"
            )
            assert await store.get_last_visible_ai_seq_by_run(thread, run_ids=[], user_id=None) == {}, (
                "contract: get_last_visible_ai_seq_by_run with an empty run_ids returns {}"
            )
            assert await store.count_messages(thread, user_id=None) == 7, (
                "contract: count_messages counts the thread's message events only"
            )
        finally:
            await store.delete_by_thread(thread, user_id=None)

    events_target.run(body)


def test_deletes_leave_no_index_behind(events_target: Any) -> None:
    """A deleted run is gone from every read: put_if_absent creates its key again,
    get_message_seqs and find_latest no longer see it, delete_by_run counts every event."""

    async def body(store: RunEventStore) -> None:
        thread = fresh_id("gone")
        await store.put_batch(
            [_ai(thread, "r1", "m1"), _ai(thread, "r1", "x", category="trace", event_type="run.end"),
             _ai(thread, "r2", "m2")],
            user_id=None,
        )
        try:
            deleted = await store.delete_by_run(thread, "r1", user_id=None)
            assert deleted == 2, (
                f"contract: delete_by_run returns how many events (every category) it deleted; got {deleted}"
            )
            record, created = await store.put_if_absent(
                thread_id=thread, run_id="r1", event_type="run.end", category="lifecycle", user_id=None
            )
            assert created is True and record["seq"] == 4, (
                "contract: after delete_by_run, put_if_absent creates the run's (run_id, event_type) "
                f"record again (created={created}, seq={record['seq']})"
            )
            _, other_type = await store.put_if_absent(
                thread_id=thread, run_id="r1", event_type="run.start", category="lifecycle", user_id=None
            )
            assert other_type is True, (
                "contract: put_if_absent keeps one record per (thread_id, run_id, event_type): another "
                "event_type of the same run is created"
            )
            assert await store.get_message_seqs(thread, ["message:m1"], user_id=None) == {}, (
                "contract: after delete_by_run, get_message_seqs no longer finds the deleted messages"
            )
            assert await store.find_latest_ai_message_run_ids(thread, ["m1"], user_id=None) == {}, (
                "contract: after delete_by_run, find_latest_ai_message_run_ids no longer finds them"
            )
        finally:
            await store.delete_by_thread(thread, user_id=None)

    events_target.run(body)


def test_list_runs_counts_each_run(events_target: Any) -> None:
    """list_runs answers the thread's runs by first seq with their event and message counts
    (what a thread deletion removes from the event store), and follows deletes."""

    async def body(store: RunEventStore) -> None:
        thread = fresh_id("runs")
        await store.put_batch(
            [_ai(thread, "r2", "m1"), _ai(thread, "r1", "m2"),
             _ai(thread, "r2", "x", category="trace", event_type="run.end")],
            user_id=None,
        )
        try:
            runs = await store.list_runs(thread, user_id=None)
            got = [(r.run_id, r.events, r.messages, r.first_seq, r.last_seq) for r in runs]
            assert got == [("r2", 2, 1, 1, 3), ("r1", 1, 1, 2, 2)], (
                f"{got} (contract: list_runs gives each run's events, messages, first and last "
                "seq, ordered by first seq)"
            )
            await store.delete_by_run(thread, "r2", user_id=None)
            assert [r.run_id for r in await store.list_runs(thread, user_id=None)] == ["r1"], (
                "contract: list_runs follows delete_by_run"
            )
            assert await store.list_runs(fresh_id("none"), user_id=None) == [], (
                "contract: a thread without events has no runs"
            )
        finally:
            await store.delete_by_thread(thread, user_id=None)

    events_target.run(body)
