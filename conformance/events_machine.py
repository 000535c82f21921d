"""`EventStoreMachine`: the event store suite's Hypothesis state machine (exported by
`runstore.conformance.machines`, where subclassing it is described).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable
from typing import Any

from hypothesis import event as hypothesis_event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from runstore.events.protocol import RunEventStore, RunSummary

from .events_model import (
    CATEGORIES,
    EVENT_TYPES,
    MESSAGE_IDS,
    ThreadModel,
    check_owner,
    core,
    created_ats,
    fresh_id,
    message_contents,
    metadatas,
    page,
    utc_iso,
)

#: ``run-a`` is a prefix of ``run-a0``: every run-scoped call must name exactly one run.
RUNS = ["run-a", "run-a0", "run-c"]
#: Who writes: no owner, or one of two (on backends declaring ``owner_filter`` every read
#: as an owner sees only that owner's events; elsewhere the owner is ignored).
OWNERS = [None, "alice", "bob"]

#: How often each rare operation ran in this process (also reported as Hypothesis events).
FIRED: Counter[str] = Counter()


def fired(name: str) -> None:
    """Count one run of the rare operation ``name``."""
    FIRED[name] += 1
    hypothesis_event(f"event store machine: {name}")


def run_summaries(records: list[dict[str, Any]]) -> list[RunSummary]:
    """The model's answer to ``list_runs``: per run its event and message counts and its
    first and last seq, ordered by first seq."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(records, key=lambda r: r["seq"]):
        runs.setdefault(r["run_id"], []).append(r)
    return [
        RunSummary(run, len(rows), sum(r["category"] == "message" for r in rows), rows[0]["seq"], rows[-1]["seq"])
        for run, rows in runs.items()
    ]
limits = st.integers(min_value=0, max_value=8)
cursors = st.one_of(st.none(), st.integers(min_value=-1, max_value=45))


class EventStoreMachine(RuleBasedStateMachine):
    """Drives writes, every read and deletes; checks each answer against `ThreadModel`."""

    def __init__(self, session: Any) -> None:
        super().__init__()
        self.session = session
        self.store: RunEventStore = session.backend
        self.target = session.target
        base = fresh_id("sm")
        # One thread id is a prefix of the other: every thread-scoped call must name one.
        self.threads = [base, base + "0"]
        self.model = {t: ThreadModel() for t in self.threads}
        #: (thread, seq) -> the owner the event was written with
        self.owners: dict[tuple[str, int], str | None] = {}
        #: threads a delete has removed events from (listings after it are labelled)
        self.deleted: set[str] = set()

    def past_the_end(self, rows: list[dict[str, Any]], what: str, read: Any) -> None:
        """A page after the last of ``rows`` (what ``read(after_seq)`` could show) is empty."""
        if not rows:
            return
        fired(f"{what}: a page after the last row")
        got = self.call(read(rows[-1]["seq"]))
        assert got == [], (
            f"contract: {what} after_seq={rows[-1]['seq']} (the last row it could show) is an empty page; "
            f"got seqs {[r['seq'] for r in got]}"
        )

    def call(self, coro: Awaitable[Any]) -> Any:
        return self.session.run(coro)

    def _expect_record(self, got: dict[str, Any], event: dict[str, Any], owner: str | None = None) -> None:
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
        check_owner(self.target, got, owner)

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

    def _add(self, record: dict[str, Any], owner: str | None) -> None:
        self.model[record["thread_id"]].add(core(record))
        self.owners[(record["thread_id"], record["seq"])] = owner

    @rule(t=st.integers(0, 1), event=events, owner=st.sampled_from(OWNERS))
    def put(self, t: int, event: dict[str, Any], owner: str | None) -> None:
        event = {"thread_id": self.threads[t], **event}
        got = self.call(self.store.put(**event, user_id=owner))
        self._expect_record(got, event, owner)
        self._add(got, owner)

    @rule(batch=st.lists(st.tuples(st.integers(0, 1), events), max_size=5), owner=st.sampled_from(OWNERS))
    def put_batch(self, batch: list[tuple[int, dict[str, Any]]], owner: str | None) -> None:
        events = [{"thread_id": self.threads[t], **e} for t, e in batch]
        got = self.call(self.store.put_batch(events, user_id=owner))
        assert len(got) == len(events), "contract: put_batch returns one record per event, in order"
        by_thread: dict[str, list[int]] = {}
        for record, event in zip(got, events, strict=True):
            self._expect_record(record, event, owner)
            by_thread.setdefault(event["thread_id"], []).append(record["seq"])
        for seqs in by_thread.values():
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), (
                f"contract: a batch gets one contiguous seq block per thread, in input order: {seqs}"
            )
        for record in got:
            self._add(record, owner)

    @rule(t=st.integers(0, 1), event=events, owner=st.sampled_from(OWNERS), again=st.booleans())
    def put_if_absent(self, t: int, event: dict[str, Any], owner: str | None, again: bool) -> None:
        event = {"thread_id": self.threads[t], **event}
        model = self.model[event["thread_id"]]
        if again and model.records:
            # Half the time the key of the thread's last event: a duplicate to refuse.
            event.update(run_id=model.records[-1]["run_id"], event_type=model.records[-1]["event_type"])
        existing = model.find_key(event["run_id"], event["event_type"])
        got, created = self.call(self.store.put_if_absent(**event, user_id=owner))
        if existing is not None:
            fired("put_if_absent of an existing key")
            if self.owners.get((event["thread_id"], existing["seq"])) != owner:
                fired("put_if_absent of a key another owner wrote")
            assert created is False and core(got) == existing, (
                "contract: put_if_absent returns the existing (thread, run, event_type) record "
                f"with created=False\n got: {core(got)} created={created}\n existing: {existing}"
            )
        else:
            assert created is True, "contract: put_if_absent creates a record when none exists"
            self._expect_record(got, event, owner)
            self._add(got, owner)

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
        self.past_the_end(
            self.model[thread].messages, "list_messages",
            lambda last: self.store.list_messages(thread, limit=limit + 1, after_seq=last, user_id=None),
        )  # fmt: skip

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
        self.past_the_end(
            self.model[thread].run_events(run), "list_events",
            lambda last: self.store.list_events(thread, run, limit=limit + 1, after_seq=last, user_id=None),
        )  # fmt: skip

    @rule(t=st.integers(0, 1), run=st.sampled_from(RUNS), limit=limits, before=cursors, after=cursors,
          latest=st.booleans())
    def list_messages_by_run(
        self, t: int, run: str, limit: int, before: int | None, after: int | None, latest: bool
    ) -> None:
        thread = self.threads[t]
        if latest and self.model[thread].messages:
            run = self.model[thread].messages[-1]["run_id"]  # half the time a run with messages
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
        self.past_the_end(
            rows, "list_messages_by_run",
            lambda last: self.store.list_messages_by_run(thread, run, limit=limit + 1, after_seq=last, user_id=None),
        )  # fmt: skip

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

    @rule(t=st.integers(0, 1), owner=st.sampled_from(["alice", "bob", "carol"]))
    def read_as_owner(self, t: int, owner: str) -> None:
        """Every read as one owner, through an owner_scope: on a backend declaring
        ``owner_filter`` each sees exactly that owner's events (lists, counts, run lists,
        lookups); elsewhere the owner is ignored."""
        from runstore.events.owner import owner_scope

        thread = self.threads[t]
        records = self.model[thread].records
        if self.target.has("owner_filter"):
            records = [r for r in records if self.owners.get((thread, r["seq"])) == owner]
        seen = ThreadModel(records=list(records))
        fired("every read as one owner")
        if any(self.owners.get((thread, r["seq"])) != owner for r in self.model[thread].records):
            fired("every read as one owner, with events of others in the thread")
        where = f"contract: owner_filter: every read is scoped to the owner ({owner!r} through owner_scope)"
        ids = set(MESSAGE_IDS)
        identities = {f"message:{m}" for m in MESSAGE_IDS} | {"tool:call_1", "tool:call_2"}

        def call(awaitable: Awaitable[Any]) -> Any:
            async def scoped() -> Any:
                with owner_scope(owner):  # inside the session's loop, where the call runs
                    return await awaitable

            return self.call(scoped())

        got = call(self.store.list_messages(thread, limit=10_000))
        assert [core(r) for r in got] == seen.messages, f"{where}: list_messages"
        assert call(self.store.count_messages(thread)) == len(seen.messages), f"{where}: count_messages"
        if len(seen.messages) > 1:
            # A page from a cursor: the scope holds on paged reads, not only whole listings.
            after = seen.messages[0]["seq"]
            got = call(self.store.list_messages(thread, limit=2, after_seq=after))
            assert [core(r) for r in got] == page(seen.messages, 2, None, after), (
                f"{where}: list_messages(limit=2, after_seq={after})"
            )
        assert list(call(self.store.list_runs(thread))) == run_summaries(seen.records), (
            f"{where}: list_runs (runs, event and message counts, first and last seq)"
        )
        for run in RUNS:
            got = call(self.store.list_events(thread, run, limit=10_000))
            assert [core(r) for r in got] == seen.run_events(run), f"{where}: list_events({run!r})"
            got = call(self.store.list_messages_by_run(thread, run, limit=10_000))
            assert [core(r) for r in got] == [r for r in seen.messages if r["run_id"] == run], (
                f"{where}: list_messages_by_run({run!r})"
            )
        assert call(self.store.get_last_visible_ai_seq_by_run(thread)) == seen.last_visible(None), (
            f"{where}: get_last_visible_ai_seq_by_run"
        )
        assert call(self.store.get_message_seqs(thread, identities)) == seen.message_seqs(identities), (
            f"{where}: get_message_seqs"
        )
        assert call(self.store.find_latest_ai_message_run_ids(thread, ids)) == seen.latest_ai_runs(ids), (
            f"{where}: find_latest_ai_message_run_ids"
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
        self.deleted.add(thread)
        fired("delete_by_run")

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
        self.deleted.add(thread)
        fired("delete_by_thread")

    # -- invariants -----------------------------------------------------------------

    @invariant()
    def thread_matches_model(self) -> None:
        for thread in self.threads:
            model = self.model[thread]
            if thread in self.deleted:
                fired("invariant: listings and counts after a delete")
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
            self.past_the_end(
                model.messages, "invariant: list_messages",
                lambda last, thread=thread: self.store.list_messages(thread, limit=10, after_seq=last, user_id=None),
            )  # fmt: skip
            runs = list(self.call(self.store.list_runs(thread, user_id=None)))
            assert runs == run_summaries(model.records), (
                "contract: list_runs counts each run of the thread (events, messages, first and last "
                f"seq), ordered by first seq, and no run of another thread\n got:      {runs}\n"
                f" expected: {run_summaries(model.records)}"
            )

    def teardown(self) -> None:
        for thread in self.threads:
            self.call(self.store.delete_by_thread(thread, user_id=None))
