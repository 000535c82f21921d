"""`SaverMachine`: the saver suite's Hypothesis state machine (exported by
`runstore.conformance.machines`, where subclassing it is described).
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from typing import Any

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT, _DeltaSnapshot

from runstore.checkpoint.rules import FENCE_KEY
from runstore.errors import InvalidSaverInputError, StaleFenceError, ThreadDeletedError

from .savers_checks import Saver, checkpoint_ids, collect, norm_writes
from .savers_model import (
    COUNTERS_KEY,
    EMPTY,
    KINDS,
    MISSING_CHANNEL,
    ROOT_KINDS,
    TASKS,
    SaverModel,
    Stored,
    as_metadata,
    config_for,
    make_checkpoint,
    named,
    new_checkpoint_id,
    new_thread_id,
)

_MACHINE_CHANNELS = ("a", "b")
_MACHINE_NAMESPACES = ("", "child:1")
_FULL_KINDS = ("plain", "unchanged", "ephemeral")
#: A task keeps one path; path order differs from task id order, so a saver that drops
#: or ignores task_path sorts pending writes differently.
_MACHINE_TASK_PATHS = {"task-a": "~", "task-b": "", "task-c": "~__pregel_pull, n1"}

#: How often each rare operation ran in this process (what the suite's profiles draw;
#: also reported to Hypothesis as events, for ``--hypothesis-show-statistics``).
FIRED: Counter[str] = Counter()


def fired(name: str) -> None:
    """Count one run of the rare operation ``name``."""
    FIRED[name] += 1
    event(f"saver machine: {name}")


class SaverMachine(RuleBasedStateMachine):
    """Random saver operations checked against `SaverModel` after every step.

    Threads (the first two ids ``t`` and ``t0``), two namespaces each; puts on the latest
    or an older parent (forks), with now and then a checkpoint id older than the head
    (written late); pending writes;
    get by id; list with thread, namespace, filter, before and limit; and, as declared,
    copy_thread, prune, delete_for_runs and the sync twins (each call picks the sync or
    the async API). ``mode`` is ``full`` (every channel stores a value or keeps its
    version) or ``delta`` (delta steps, snapshots, plain seeds).
    """

    mode = "delta"

    def __init__(self, session: Any) -> None:
        super().__init__()
        self.session = session
        self.saver: Saver = session.backend
        self.target = session.target
        self.tag = new_thread_id("machine")
        # The second thread's id extends the first's (``t``/``t0``): every thread-scoped
        # call, delete and listing must name exactly one thread.
        self.threads: list[str] = []
        first = self.new_thread()
        self.threads += [first, first + "0"]
        self.runs = [new_thread_id("run"), new_thread_id("run")]
        self.model = SaverModel()
        self.versions: dict[tuple[str, str, str], Any] = {}
        self.late_ids = [new_checkpoint_id() for _ in range(3)]
        self.counter = itertools.count(1)
        self.sync = self.target.has("sync_api")
        #: (thread, namespace, id, operation) of every checkpoint deleted so far
        self.deleted: list[tuple[str, str, str, str]] = []
        #: the contract of the last operation, named when the invariant fails after it
        self.last_contract = "put stores the checkpoint"
        #: id -> the operation that deleted it, for checkpoints put again after a delete
        self.reput: dict[str, str] = {}
        #: deleted threads (tombstones) -> a root checkpoint id they held, for late writes
        self.tombstones: dict[str, str] = {}
        #: the fencing token each thread was last fenced with
        self.fences: dict[str, int] = {}

    def new_thread(self) -> str:
        """A fresh thread id that sorts after every id this machine made before. Steps pick
        from lists sorted by thread id (`deleted`), so with random ids a replay of the same
        steps could pick another item, and Hypothesis would report the failure as flaky
        data generation instead of the broken contract."""
        return new_thread_id(f"sm{len(self.threads):02d}")

    def everything(self) -> set[tuple[str, str, str]]:
        return {
            (tid, ns, cid)
            for tid, namespaces in self.model.threads.items()
            for ns, entries in namespaces.items() for cid in entries
        }

    def forget(self, before: set[tuple[str, str, str]], operation: str, contract: str) -> None:
        self.deleted += [(*key, operation) for key in sorted(before - self.everything())]
        self.last_contract = contract

    # -- calling the saver --------------------------------------------------------

    def call(self, use_sync: bool, name: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``name`` through the sync twin (from a worker thread) or the async API."""
        if use_sync and self.sync:
            method = getattr(self.saver, name)
            if name == "list":
                return self.session.run(asyncio.to_thread(lambda: list(method(*args, **kwargs))))
            return self.session.run(asyncio.to_thread(method, *args, **kwargs))
        method = getattr(self.saver, "a" + name)
        if name == "list":
            return self.session.run(collect(self.saver, *args, **kwargs))
        return self.session.run(method(*args, **kwargs))

    def api(self, use_sync: bool) -> str:
        return "sync" if use_sync and self.sync else "async"

    def stored(self, thread: int, ns: int, pick: int) -> Stored | None:
        ids = self.model.ids(self.threads[thread], _MACHINE_NAMESPACES[ns])
        if not ids:
            return None
        return self.model.ns(self.threads[thread], _MACHINE_NAMESPACES[ns])[ids[pick % len(ids)]]

    def check_tuple(self, got: Any, thread: str, ns: str, stored: Stored, where: str) -> None:
        assert got is not None, f"{where}: contract: get_tuple finds stored checkpoint {stored.id}"
        configurable = got.config["configurable"]
        assert (configurable.get("checkpoint_id"), configurable.get("checkpoint_ns", "")) == (stored.id, ns), (
            f"{where}: contract: get_tuple returns the config of the checkpoint it found, with its "
            f"checkpoint_ns (got {configurable})"
        )
        assert got.checkpoint["channel_values"] == stored.channel_values(), (
            named(f"{where}: channel_values {got.checkpoint['channel_values']!r} != {stored.channel_values()!r} "
            "(contract: channel_values are exactly what was put at each channel's version)")
        )
        assert got.checkpoint["channel_versions"] == stored.versions, (
            f"{where}: contract: channel_versions come back as put"
        )
        parent = (got.parent_config or {}).get("configurable", {})
        if stored.parent is not None:
            assert (parent.get("checkpoint_id"), parent.get("checkpoint_ns", "")) == (stored.parent, ns), (
                named(f"{where}: parent_config {parent} (contract: parent_config names the parent checkpoint "
                f"{stored.parent} in the same thread and namespace)")
            )
        else:
            assert not parent, named(
                f"{where}: parent_config {parent} (contract: a root checkpoint, or one whose parent "
                "was deleted, has no parent_config)"
            )
        for key, value in stored.metadata.items():
            assert got.metadata.get(key) == value, f"{where}: contract: metadata[{key!r}] round-trips"
        if stored.id in self.reput:
            assert norm_writes(got.pending_writes) == stored.writes.ordered(), (
                named(f"{where}: pending_writes {got.pending_writes!r} of a checkpoint deleted by "
                f"{self.reput[stored.id]} and put again (contract: {self.reput[stored.id]} deletes the "
                "pending writes of the checkpoints it deletes, not only the checkpoints)")
            )
        assert norm_writes(got.pending_writes) == stored.writes.ordered(), (
            named(f"{where}: pending_writes {got.pending_writes!r} != {stored.writes.ordered()!r} (contract: "
            "pending_writes are the writes put on this checkpoint, in writes_sort_key order; first "
            "write wins per (task_id, idx); deleted and copied checkpoints share none)")
        )

    # -- writes ---------------------------------------------------------------------

    @rule(
        thread=st.integers(0, 1), ns=st.integers(0, 1), parent=st.one_of(st.none(), st.integers(0, 20)),
        kinds=st.data(), run=st.integers(0, 1), late=st.booleans(), kind=st.sampled_from(["x", "y"]),
        use_sync=st.booleans(),
    )
    def put(self, thread: int, ns: int, parent: int | None, kinds: Any, run: int, late: bool,
            kind: str, use_sync: bool) -> None:
        self.do_put(thread, ns, parent, kinds, run, late, kind, use_sync)

    @initialize(data=st.data())
    def seed(self, data: Any) -> None:
        """Every run starts from two short chains (with writes) per thread and namespace, so
        forks, namespaces and the extended operations meet real state from the first step."""
        for thread, ns, step in itertools.product((0, 1), (0, 1), range(3)):
            self.do_put(thread, ns, 0 if step else None, data, step % 2, False, "xy"[step % 2], False)
            task = TASKS[step]
            self.do_put_writes(thread, ns, 0, task, ["a", "other"], False)

    def do_put(self, thread: int, ns: int, parent: int | None, kinds: Any, run: int, late: bool,
               kind: str, use_sync: bool) -> None:
        tid, ns_name = self.threads[thread], _MACHINE_NAMESPACES[ns]
        base = self.stored(thread, ns, parent) if parent is not None else None
        options = _FULL_KINDS if self.mode == "full" else KINDS
        versions = dict(base.versions) if base else {}
        values = dict(base.values) if base else {}
        delta = set(base.delta) if base else set()
        new_versions: dict[str, Any] = {}
        for ch in _MACHINE_CHANNELS:
            choice = kinds.draw(st.sampled_from(options if base else ROOT_KINDS if self.mode == "delta"
                                                else ("plain", "ephemeral")), label=f"kind {ch}")
            if choice in ("unchanged", "absent") or (choice == "unchanged" and ch not in versions):
                continue
            delta.discard(ch)
            if choice == "delta":
                delta.add(ch)
            key = (tid, ns_name, ch)
            version = self.saver.get_next_version(self.versions.get(key), None)
            self.versions[key] = new_versions[ch] = versions[ch] = version
            marker = [next(self.counter) * 1000 + ord(ch)]
            values[ch] = (
                _DeltaSnapshot(marker) if choice == "snapshot" else marker if choice == "plain" else EMPTY
            )
        if base is not None and base.id != self.model.ids(tid, ns_name)[0]:
            fired("fork (put on an older parent)")
        cid = self.late_ids.pop() if late and self.late_ids else new_checkpoint_id()
        if cid in self.model.ns(tid, ns_name):
            cid = new_checkpoint_id()
        metadata: dict[str, Any] = {
            "source": "loop", "step": next(self.counter), "run_id": self.runs[run],
            "tag": self.tag, "kind": kind,
        }
        if delta:
            metadata[COUNTERS_KEY] = {ch: [1, 1] for ch in sorted(delta)}
        stored = Stored(cid, base.id if base else None, versions, values, delta, self.runs[run], metadata)
        checkpoint = make_checkpoint(cid, stored.channel_values(), versions)
        got = self.call(use_sync, "put", config_for(tid, stored.parent, ns_name), checkpoint,
                        dict(metadata), new_versions)
        configurable = got["configurable"]
        assert (configurable.get("thread_id"), configurable.get("checkpoint_ns", ""),
                configurable.get("checkpoint_id")) == (tid, ns_name, cid), (
            f"contract: put ({self.api(use_sync)}) returns the config of the stored checkpoint, with "
            f"its thread_id and checkpoint_ns (got {configurable})"
        )
        self.model.add(tid, ns_name, stored)
        if stored.parent is None:
            self.tombstones.pop(tid, None)  # a put without a parent starts a deleted thread again
        self.last_contract = "put stores the checkpoint in its thread and namespace only"

    @rule(
        thread=st.integers(0, 1), ns=st.integers(0, 1), pick=st.integers(0, 20),
        task=st.sampled_from(TASKS),
        channels=st.one_of(
            st.lists(st.sampled_from([*_MACHINE_CHANNELS, "other"]), min_size=1, max_size=3),
            st.just([ERROR]),  # special writes come in calls of their own, as in LangGraph
        ),
        use_sync=st.booleans(),
    )
    def put_writes(self, thread: int, ns: int, pick: int, task: str, channels: list[str],
                   use_sync: bool) -> None:
        self.do_put_writes(thread, ns, pick, task, channels, use_sync)

    def do_put_writes(self, thread: int, ns: int, pick: int, task: str, channels: list[str],
                      use_sync: bool) -> None:
        path = _MACHINE_TASK_PATHS[task]
        stored = self.stored(thread, ns, pick)
        if stored is None:
            return
        writes = [(ch, next(self.counter)) for ch in channels]
        tid, ns_name = self.threads[thread], _MACHINE_NAMESPACES[ns]
        self.call(use_sync, "put_writes", config_for(tid, stored.id, ns_name), writes, task, path)
        stored.writes.put(task, path, writes)
        self.last_contract = "put_writes adds writes to the checkpoint it names, and to no other"

    @rule(pick=st.integers(0, 20), use_sync=st.booleans())
    def put_deleted_id_again(self, pick: int, use_sync: bool) -> None:
        """A deleted checkpoint's id put again (no values, no writes) must read back empty:
        a delete empties every table, not only the checkpoints."""
        # A survivor whose parent was deleted lost that link, so bringing the parent back
        # leaves the survivor a root.
        candidates = self.deleted
        if not candidates:
            return
        tid, ns, cid, operation = candidates[pick % len(candidates)]
        self.deleted.remove((tid, ns, cid, operation))
        if cid in self.model.ns(tid, ns):
            return
        metadata = {"source": "loop", "step": next(self.counter), "run_id": self.runs[0],
                    "tag": self.tag, "kind": "x"}
        self.call(use_sync, "put", config_for(tid, None, ns), make_checkpoint(cid, {}, {}), dict(metadata), {})
        self.model.add(tid, ns, Stored(cid, None, {}, {}, set(), self.runs[0], metadata))
        self.tombstones.pop(tid, None)
        self.reput[cid] = operation
        fired("put a deleted id again")

    # -- reads ----------------------------------------------------------------------

    @rule(thread=st.integers(0, 1), ns=st.integers(0, 1), pick=st.one_of(st.none(), st.integers(0, 20)),
          use_sync=st.booleans())
    def get(self, thread: int, ns: int, pick: int | None, use_sync: bool) -> None:
        tid, ns_name = self.threads[thread], _MACHINE_NAMESPACES[ns]
        stored = self.model.latest(tid, ns_name) if pick is None else self.stored(thread, ns, pick)
        where = f"get_tuple ({self.api(use_sync)}, {'latest' if pick is None else 'by id'})"
        got = self.call(use_sync, "get_tuple", config_for(tid, None if pick is None or stored is None
                                                          else stored.id, ns_name))
        if stored is None:
            assert got is None, f"{where}: contract: get_tuple of an empty thread or namespace is None"
            return
        if pick is None:
            assert got is not None and got.checkpoint["id"] == stored.id, (
                f"{where}: contract: get_tuple without checkpoint_id returns the checkpoint with the "
                f"highest id ({stored.id}), not the last written (got {got.checkpoint['id'] if got else None})"
            )
        self.check_tuple(got, tid, ns_name, stored, where)

    @rule(
        thread=st.integers(0, 1), ns=st.one_of(st.none(), st.integers(0, 1)),
        kind=st.one_of(st.none(), st.sampled_from(["x", "y"])),
        before=st.one_of(st.none(), st.integers(0, 20)), limit=st.one_of(st.none(), st.integers(0, 4)),
        use_sync=st.booleans(),
    )
    def list_thread(self, thread: int, ns: int | None, kind: str | None, before: int | None,
                    limit: int | None, use_sync: bool) -> None:
        tid = self.threads[thread]
        if tid in self.tombstones:
            fired("list a deleted thread while its tombstone stands")
        elif self.deleted:
            fired("list a thread after a delete")
        namespaces = _MACHINE_NAMESPACES if ns is None else [_MACHINE_NAMESPACES[ns]]
        rows = [(cid, n) for n in namespaces for cid in self.model.ids(tid, n)]
        kwargs: dict[str, Any] = {}
        if kind is not None:
            kwargs["filter"] = {"kind": kind}
            rows = [(c, n) for c, n in rows if self.model.ns(tid, n)[c].metadata["kind"] == kind]
        if before is not None and ns is not None:
            stored = self.stored(thread, ns, before)
            if stored is not None:
                kwargs["before"] = config_for(tid, stored.id, namespaces[0])
                rows = [(c, n) for c, n in rows if c < stored.id]
        config = config_for(tid) if ns is None else config_for(tid, ns=namespaces[0])
        if ns is None:
            del config["configurable"]["checkpoint_ns"]
        got = self.call(use_sync, "list", config, **kwargs)
        got_rows = [(t.config["configurable"]["checkpoint_id"], t.config["configurable"].get("checkpoint_ns", ""))
                    for t in got]
        expected = sorted(rows, reverse=True)
        if ns is None:  # order across namespaces is not specified
            got_rows, expected = sorted(got_rows), sorted(expected)
        elif limit is not None:
            got_rows = [
                (t.config["configurable"]["checkpoint_id"], t.config["configurable"].get("checkpoint_ns", ""))
                for t in self.call(use_sync, "list", config, limit=limit, **kwargs)
            ]
            kwargs["limit"] = limit
            expected = expected[:limit]
        assert got_rows == expected, (
            named(f"list ({self.api(use_sync)}, thread, checkpoint_ns={'any' if ns is None else namespaces[0]!r}, "
            f"{kwargs}) -> {got_rows} != {expected} (contract: list returns the thread's checkpoints "
            "of that namespace (every namespace without checkpoint_ns), newest first by checkpoint id; "
            "filter is metadata equality, before is exclusive, limit caps the result after filtering)")
        )
        for item in got:
            cid, n = item.config["configurable"]["checkpoint_id"], item.config["configurable"].get("checkpoint_ns", "")
            if cid in self.model.ns(tid, n):
                self.check_tuple(item, tid, n, self.model.ns(tid, n)[cid], f"list ({self.api(use_sync)}) item")

    @rule(kind=st.one_of(st.none(), st.sampled_from(["x", "y"])), use_sync=st.booleans())
    def list_everywhere(self, kind: str | None, use_sync: bool) -> None:
        flt: dict[str, Any] = {"tag": self.tag}
        if self.tombstones:
            fired("list every thread while a tombstone stands")
        if kind is not None:
            flt["kind"] = kind
        got = sorted(
            (t.config["configurable"]["thread_id"], t.config["configurable"].get("checkpoint_ns", ""),
             t.config["configurable"]["checkpoint_id"])
            for t in self.call(use_sync, "list", None, filter=flt)
        )
        expected = sorted(
            (tid, n, cid)
            for tid, namespaces in self.model.threads.items() for n, entries in namespaces.items()
            for cid, s in entries.items() if kind is None or s.metadata["kind"] == kind
        )
        assert got == expected, (
            f"contract: list(None, filter=...) ({self.api(use_sync)}) returns exactly the matching "
            f"checkpoints of every thread and namespace\nfilter={flt}: found {len(got)}, the model "
            f"{len(expected)}; missing {sorted(set(expected) - set(got))[:3]}, extra "
            f"{sorted(set(got) - set(expected))[:3]}"
        )

    @rule(thread=st.integers(0, 1), ns=st.integers(0, 1), pick=st.integers(0, 20),
          channels=st.lists(st.sampled_from([*_MACHINE_CHANNELS, MISSING_CHANNEL]), min_size=1, unique=True),
          use_sync=st.booleans())
    def delta_history(self, thread: int, ns: int, pick: int, channels: list[str], use_sync: bool) -> None:
        stored = self.stored(thread, ns, pick)
        if stored is None:
            return
        tid, ns_name = self.threads[thread], _MACHINE_NAMESPACES[ns]
        got = self.call(use_sync, "get_delta_channel_history",
                        config=config_for(tid, stored.id, ns_name), channels=channels)
        expected = self.model.history(tid, ns_name, stored.id, channels)
        normalized = {ch: {**dict(e), "writes": norm_writes(e.get("writes"))} for ch, e in got.items()}
        assert normalized == expected, (
            named(f"delta history ({self.api(use_sync)}) of {stored.id} for {channels}: {normalized} != "
            f"{expected} (contract: delta history walks parent links over what is stored, writes oldest "
            "first, seed at the nearest ancestor holding a value)")
        )

    # -- extended operations ----------------------------------------------------------

    @rule(source=st.integers(0, 1), use_sync=st.booleans())
    def copy_thread(self, source: int, use_sync: bool) -> None:
        if not self.target.has("copy_thread") or len(self.threads) >= 4:
            return
        target = self.new_thread()
        self.call(use_sync, "copy_thread", self.threads[source], target)
        self.model.copy_thread(self.threads[source], target)
        fired("copy_thread")
        self.last_contract = (
            "copy_thread copies every checkpoint of every namespace, with its writes, into the "
            "target and leaves the source as it was"
        )
        for ch, n in itertools.product(_MACHINE_CHANNELS, _MACHINE_NAMESPACES):
            if (self.threads[source], n, ch) in self.versions:
                self.versions[(target, n, ch)] = self.versions[(self.threads[source], n, ch)]
        # The copy replaces the source in the machine's view half the time, so later steps
        # write on the copy and the source must stay as it was.
        self.threads.append(target)
        self.threads[0], self.threads[-1] = self.threads[-1], self.threads[0]

    @rule(which=st.sets(st.integers(0, 1), min_size=1), strategy=st.sampled_from(["keep_latest", "delete"]),
          use_sync=st.booleans())
    def prune(self, which: set[int], strategy: str, use_sync: bool) -> None:
        if not self.target.has("prune"):
            return
        threads = [self.threads[i] for i in sorted(which)]
        before = self.everything()
        self.call(use_sync, "prune", threads, strategy=strategy)
        for tid in threads:
            self.model.prune(tid, strategy)
        fired(f"prune {strategy}")
        self.forget(before, "prune", "prune (keep_latest) keeps, per namespace of every thread named, exactly the latest checkpoint and the ancestors its delta reconstruction reads; prune (delete) removes the threads")

    @rule(runs=st.sets(st.integers(0, 1), min_size=1), use_sync=st.booleans())
    def delete_for_runs(self, runs: set[int], use_sync: bool) -> None:
        if not self.target.has("delete_for_runs"):
            return
        before = self.everything()
        self.call(use_sync, "delete_for_runs", [self.runs[r] for r in sorted(runs)])
        self.model.delete_for_runs({self.runs[r] for r in runs})
        fired("delete_for_runs")
        self.forget(before, "delete_for_runs", "delete_for_runs deletes the runs' checkpoints in every thread and namespace, except ancestors a surviving checkpoint's delta reconstruction reads")

    @rule(thread=st.integers(0, 1), use_sync=st.booleans())
    def delete_thread(self, thread: int, use_sync: bool) -> None:
        before = self.everything()
        tid = self.threads[thread]
        root = self.model.ids(tid, "")
        self.call(use_sync, "delete_thread", tid)
        self.model.delete_thread(tid)
        if root:
            self.tombstones[tid] = root[0]
        fired("delete_thread")
        if any(other != tid and other.startswith(tid) for other in self.model.threads):
            fired("delete_thread of an id another live thread extends")
        self.forget(before, "delete_thread", "delete_thread removes every namespace of the thread and nothing else")

    # -- invariants -------------------------------------------------------------------

    @invariant()
    def every_checkpoint_matches(self) -> None:
        for tid in set(self.threads) | set(self.model.threads):
            if tid in self.tombstones:
                fired("invariant: a deleted thread listed against the model")
            for ns in _MACHINE_NAMESPACES:
                listed = self.session.run(collect(self.saver, config_for(tid, ns=ns)))
                assert checkpoint_ids(listed) == self.model.ids(tid, ns), (
                    named(f"thread {tid} namespace {ns!r}: list -> {checkpoint_ids(listed)} != {self.model.ids(tid, ns)} "
                    f"(contract: {self.last_contract})")
                )
                entries = self.model.ns(tid, ns)
                for item in listed:
                    stored = entries[item.config["configurable"]["checkpoint_id"]]
                    self.check_tuple(item, tid, ns, stored, f"thread {tid} checkpoint {stored.id} "
                                     f"(last operation: {self.last_contract})")

    def teardown(self) -> None:
        for tid in set(self.threads) | set(self.model.threads):
            self.session.run(self.saver.adelete_thread(tid))


class ThreadIndexSaverMachine(SaverMachine):
    """`SaverMachine` for a saver declaring ``thread_index``: after every step each
    thread's record and `list_threads` agree with the model, and two more steps write
    where the saver must refuse (a deleted thread; with ``fencing``, a stale token),
    after which the record must read as before. (A subclass, so a saver without the
    index draws exactly the steps it always drew.)"""

    # -- refused writes (thread_index, fencing) -----------------------------------------

    def record(self, tid: str) -> Any:
        return self.session.run(self.saver.aget_thread(tid))  # type: ignore[attr-defined]

    @rule(pick=st.integers(0, 20), special=st.sampled_from(["a", INTERRUPT, ERROR]), on_put=st.booleans())
    def write_to_a_deleted_thread(self, pick: int, special: str, on_put: bool) -> None:
        """A write continuing a deleted thread (deleted now, unless one is) is refused and
        leaves no record behind."""
        deleted_now = not self.tombstones
        if deleted_now:
            thread = pick % 2
            if not self.model.ids(self.threads[thread], ""):
                return
            self.delete_thread(thread, False)
        tid = sorted(self.tombstones)[pick % len(self.tombstones)]
        parent = self.tombstones[tid]
        fired("write to a deleted thread refused")
        try:
            if on_put:
                self.session.run(self.saver.aput(
                    config_for(tid, parent), make_checkpoint(new_checkpoint_id(), {}, {}),
                    as_metadata({"source": "loop", "step": next(self.counter), "tag": self.tag, "kind": "x"}), {}))
            else:
                self.session.run(self.saver.aput_writes(config_for(tid, parent), [(special, 1)], "late", ""))
        except ThreadDeletedError:
            pass
        else:
            raise AssertionError(
                f"contract: a write continuing a deleted thread raises ThreadDeletedError "
                f"({'put' if on_put else 'put_writes ' + special} on {tid} went through)"
            )
        assert self.record(tid) is None, (
            "contract: a refused write leaves the thread record as it was (a deleted thread stays deleted)"
        )
        self.last_contract = "a write refused on a deleted thread stores nothing"
        if deleted_now:
            self.last_contract = f"delete_thread removes every namespace of the thread and nothing else; {self.last_contract}"

    @precondition(lambda self: self.target.has("fencing"))
    @rule(thread=st.integers(0, 1), ns=st.integers(0, 1), pick=st.integers(0, 20),
          special=st.sampled_from(["a", INTERRUPT, ERROR]), on_put=st.booleans())
    def stale_write(self, thread: int, ns: int, pick: int, special: str, on_put: bool) -> None:
        """After the thread is fenced with a newer token, a write carrying the one before is
        refused, in any namespace, and the thread's record reads as before it."""
        stored = self.stored(thread, ns, pick)
        if stored is None:
            return
        tid, ns_name = self.threads[thread], _MACHINE_NAMESPACES[ns]
        token = self.fences.get(tid, 0) + 2
        self.session.run(self.saver.afence_thread(tid, token))  # type: ignore[attr-defined]
        self.fences[tid] = token
        before = self.record(tid)
        config = config_for(tid, stored.id, ns_name)
        config["configurable"][FENCE_KEY] = token - 1
        fired("stale write refused")
        try:
            if on_put:
                self.session.run(self.saver.aput(
                    config, make_checkpoint(new_checkpoint_id(), {}, {}),
                    as_metadata({"source": "loop", "step": next(self.counter), "tag": self.tag, "kind": "x"}), {}))
            else:
                self.session.run(self.saver.aput_writes(config, [(special, 1)], "stale", ""))
        except StaleFenceError:
            pass
        else:
            raise AssertionError(
                f"contract: fencing: {'put' if on_put else 'put_writes ' + special} carrying a stale token "
                f"is refused with StaleFenceError (namespace {ns_name!r})"
            )
        after = self.record(tid)
        assert after == before, (
            f"contract: a refused write leaves the thread record as it was\n before: {before}\n after:  {after}"
        )
        self.last_contract = "a write refused for a stale token stores nothing"

    @precondition(lambda self: self.target.has("checked_ids"))
    @rule(thread=st.integers(0, 1), ns=st.integers(0, 1), pick=st.integers(0, 20))
    def unstorable_metadata(self, thread: int, ns: int, pick: int) -> None:
        """A put whose metadata no saver can store alike (a lone surrogate) is refused, and
        the thread's record reads as before it (the invariants: nothing listed either)."""
        stored = self.stored(thread, ns, pick)
        if stored is None:
            return
        tid, ns_name = self.threads[thread], _MACHINE_NAMESPACES[ns]
        before = self.record(tid)
        fired("unstorable metadata refused")
        metadata = {"source": "loop", "step": next(self.counter), "tag": self.tag, "kind": "x", "note": "bad\ud800"}
        try:
            self.session.run(self.saver.aput(
                config_for(tid, stored.id, ns_name), make_checkpoint(new_checkpoint_id(), {}, {}),
                as_metadata(metadata), {}))
        except InvalidSaverInputError:
            pass
        else:
            raise AssertionError(
                "contract: metadata no saver can store alike (a lone surrogate) is refused with "
                f"InvalidSaverInputError (namespace {ns_name!r}; it was stored)"
            )
        after = self.record(tid)
        assert after == before, (
            f"contract: a refused write leaves the thread record as it was\n before: {before}\n after:  {after}"
        )
        self.last_contract = "a put refused for its metadata stores nothing"

    @invariant()
    def thread_index_matches(self) -> None:
        """With ``thread_index``: each thread's record (or its absence, deleted or never
        written) and the threads list_threads shows agree with the model."""
        threads = set(self.threads) | set(self.model.threads) | set(self.tombstones)
        for tid in sorted(threads):
            count = sum(len(self.model.ids(tid, ns)) for ns in _MACHINE_NAMESPACES)
            info = self.record(tid)
            if count == 0:
                assert info is None, (
                    f"thread {tid}: get_thread -> {info} (contract: a thread without checkpoints, "
                    f"deleted or never written, has no record; last operation: {self.last_contract})"
                )
                continue
            root = self.model.ids(tid, "")
            got = (None, None) if info is None else (info.checkpoints, info.latest_checkpoint_id)
            want = (count, root[0] if root else got[1])
            assert got == want, named(
                f"thread {tid}: get_thread (checkpoints, latest root checkpoint) {got} != {want} "
                f"(contract: the thread record counts every checkpoint and names the latest root "
                f"checkpoint; last operation: {self.last_contract})"
            )
        fired("thread index checked against the model")
        if self.tombstones:
            fired("thread index checked while a tombstone stands")
        listed = {
            t.thread_id
            for t in self.session.run(
                self.saver.alist_threads(filter={"tag": self.tag}, limit=1000)  # type: ignore[attr-defined]
            ).threads
        }
        expected = {tid for tid in threads if self.model.ids(tid, "")}
        assert listed == expected, named(
            f"list_threads(filter=tag) -> {sorted(listed)} != {sorted(expected)} (contract: "
            f"list_threads shows every live thread and no deleted one; last operation: {self.last_contract})"
        )
