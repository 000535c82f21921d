"""Generated checkpoint trees and the plain-Python reference the saver suite checks against.

A `TreeSpec` (drawn by `checkpoint_trees`) describes a thread as nodes written in
index order, each naming its parent, what it stores per channel and the writes put
on it. `write_tree` puts it into a saver and returns a `Tree` model that knows, for
every node, the channel values a saver must return, its pending writes in
``writes_sort_key`` order and the delta history a parent-link walk yields.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from hypothesis import strategies as st
from langgraph.checkpoint.base import WRITES_IDX_MAP, BaseCheckpointSaver, CheckpointMetadata
from langgraph.checkpoint.serde.types import _DeltaSnapshot

from runstore.checkpoint.rules import DELTA_COUNTERS_KEY

#: Stored-value kinds per channel per node. ``delta`` = new version, nothing stored
#: (what a DeltaChannel does between snapshots; the channel is named in the metadata
#: ``counters_since_delta_snapshot`` as LangGraph does); ``snapshot`` = `_DeltaSnapshot`;
#: ``plain`` = a pre-delta value (migration seed); ``unchanged`` = version kept;
#: ``ephemeral`` = new version, nothing stored, not a delta channel (a consumed
#: trigger channel: reconstruction does not need its history).
KINDS = ("delta", "delta", "unchanged", "snapshot", "plain", "ephemeral")
ROOT_KINDS = ("absent", "delta", "snapshot", "plain", "ephemeral")
COUNTERS_KEY = DELTA_COUNTERS_KEY
TASKS = ("task-b", "task-a", "task-c")
PATHS = ("~", "", "~__pregel_pull, n2", "~__pregel_pull, n1")
MISSING_CHANNEL = "never_written"

_id_lock = threading.Lock()
_id_clock = 0


def new_checkpoint_id() -> str:
    """A UUID-shaped checkpoint id, strictly increasing within this process."""
    global _id_clock
    with _id_lock:
        _id_clock = max(_id_clock + 1, time.time_ns() // 100)
        tick = _id_clock
    digits = f"{tick:020x}"[-20:] + os.urandom(6).hex()
    return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"


def new_thread_id(prefix: str = "t") -> str:
    """A fresh thread (or run) id: the suite shares one storage per session."""
    return f"{prefix}-{uuid.uuid4().hex}"


def make_checkpoint(
    checkpoint_id: str, values: Mapping[str, Any], versions: Mapping[str, Any]
) -> Any:
    """A LangGraph checkpoint dict (the shape `aput` receives)."""
    return {
        "v": 1,
        "id": checkpoint_id,
        "ts": datetime.now(UTC).isoformat(),
        "channel_values": dict(values),
        "channel_versions": dict(versions),
        "versions_seen": {},
        "updated_channels": None,
    }


def as_metadata(values: Mapping[str, Any]) -> CheckpointMetadata:
    """``values`` as checkpoint metadata (LangGraph's TypedDict names its own keys; savers store any)."""
    return cast(CheckpointMetadata, dict(values))


def config_for(thread_id: str, checkpoint_id: str | None = None, ns: str = "") -> Any:
    """A config addressing a thread (and optionally one checkpoint)."""
    configurable: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ns}
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


class WritesModel:
    """Reference for one checkpoint's pending writes: first write wins per (task_id, idx)
    for normal channels, the last wins for special negative slots."""

    def __init__(self) -> None:
        self.by_key: dict[tuple[str, int], tuple[str, str, Any, str]] = {}

    def put(self, task_id: str, task_path: str, writes: Sequence[tuple[str, Any]]) -> None:
        for idx, (channel, value) in enumerate(writes):
            slot = WRITES_IDX_MAP.get(channel, idx)
            key = (task_id, slot)
            if key in self.by_key and slot >= 0:
                continue
            self.by_key[key] = (task_id, channel, value, task_path)

    def ordered(self) -> list[tuple[str, str, Any]]:
        """``(task_id, channel, value)`` in ``writes_sort_key`` = (task_path, task_id, idx) order."""
        keys = sorted(self.by_key, key=lambda k: (self.by_key[k][3], k[0], k[1]))
        return [self.by_key[k][:3] for k in keys]


@dataclass
class NodeSpec:
    """One checkpoint to write: parent index, per-channel kind, write batches, run."""

    parent: int | None
    kinds: dict[str, str]
    batches: list[tuple[str, str, list[str]]]
    run: int = 0


@dataclass
class TreeSpec:
    """A generated thread: nodes in write order, the history query to check."""

    channels: list[str]
    nodes: list[NodeSpec]
    target: int
    query: list[str]

    def describe(self) -> str:
        lines = [f"channels={self.channels} target={self.target} query={self.query}"]
        for i, node in enumerate(self.nodes):
            lines.append(f"  node {i}: parent={node.parent} kinds={node.kinds} run={node.run}")
        return "\n".join(lines)


@st.composite
def checkpoint_trees(
    draw: st.DrawFn, max_nodes: int = 9, linear: bool = False, runs: int = 1
) -> TreeSpec:
    """Random checkpoint trees: linear chains, forks written after their siblings,
    snapshots, plain pre-delta seeds, unchanged versions, several channels, writes."""
    channels = ["a", "b", "c"][: draw(st.integers(1, 3))]
    count = draw(st.integers(1, max_nodes))
    nodes: list[NodeSpec] = []
    for i in range(count):
        if i == 0:
            parent = None
        elif linear:
            parent = i - 1
        else:
            parent = draw(st.one_of(st.just(i - 1), st.integers(0, i - 1)))
        kinds = {
            ch: draw(st.sampled_from(ROOT_KINDS if parent is None else KINDS)) for ch in channels
        }
        batches = draw(
            st.lists(
                st.tuples(
                    st.sampled_from(TASKS),
                    st.sampled_from(PATHS),
                    st.lists(st.sampled_from([*channels, "other"]), max_size=3),
                ),
                max_size=3,
            )
        )
        run = draw(st.integers(0, runs - 1)) if runs > 1 else 0
        nodes.append(NodeSpec(parent, kinds, batches, run))
    target = draw(st.integers(0, count - 1))
    query = draw(st.lists(st.sampled_from([*channels, MISSING_CHANNEL]), min_size=1, unique=True))
    return TreeSpec(channels, nodes, target, query)


EMPTY = object()  # "version exists, nothing stored"


@dataclass
class Node:
    """A written node: its id, parent, and what the saver must return for it."""

    index: int
    id: str
    parent: int | None
    versions: dict[str, Any]
    values: dict[str, Any]  # the value a saver must return per channel (EMPTY if none)
    writes: WritesModel = field(default_factory=WritesModel)
    run_id: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    batches: list[tuple[str, str, list[tuple[str, Any]]]] = field(default_factory=list)
    # Delta channels with nothing stored here (named in the counters metadata).
    delta_channels: set[str] = field(default_factory=set)


@dataclass
class Tree:
    """The reference model of a written tree."""

    thread_id: str
    nodes: list[Node]
    spec: TreeSpec
    write_owner: dict[Any, int] = field(default_factory=dict)  # write value -> node index
    run_ids: list[str] = field(default_factory=list)
    ns: str = ""

    def config(self, index: int, thread_id: str | None = None) -> Any:
        return config_for(thread_id or self.thread_id, self.nodes[index].id, self.ns)

    def channel_values(self, index: int) -> dict[str, Any]:
        return {ch: v for ch, v in self.nodes[index].values.items() if v is not EMPTY}

    def ancestors(self, index: int) -> list[int]:
        """Parent-link ancestors, nearest first (excluding ``index``)."""
        out: list[int] = []
        current = self.nodes[index].parent
        while current is not None:
            out.append(current)
            current = self.nodes[current].parent
        return out

    def history(self, index: int, channels: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The reference walk: parent links from ``index``'s parent; per channel stop at the
        nearest ancestor storing a value (its writes included); writes oldest first."""
        return walk_history([self.nodes[anc] for anc in self.ancestors(index)], channels)

    def needed_ancestors(self, index: int) -> set[int]:
        """Ancestors a delta reconstruction at ``index`` reads (for prune / delete_for_runs):
        the walk for each delta channel (named in the counters metadata) with nothing stored."""
        unvalued = set(self.unvalued(index))
        needed: set[int] = set()
        for anc in self.ancestors(index):
            if not unvalued:
                break
            needed.add(anc)
            unvalued -= {ch for ch, v in self.nodes[anc].values.items() if v is not EMPTY}
        return needed

    def unvalued(self, index: int) -> list[str]:
        """Delta channels that ``index`` rebuilds from history (nothing stored there)."""
        return sorted(self.nodes[index].delta_channels)


def walk_history(ancestors: Sequence[Any], channels: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The reference delta walk over ``ancestors`` (nearest first, each with ``values`` and
    ``writes``): per channel stop at the nearest one storing a value (its writes included,
    the value as seed); writes oldest first."""
    result: dict[str, dict[str, Any]] = {}
    for ch in channels:
        blocks: list[list[tuple[str, str, Any]]] = []
        entry: dict[str, Any] = {}
        for anc in ancestors:
            blocks.append([w for w in anc.writes.ordered() if w[1] == ch])
            value = anc.values.get(ch, EMPTY)
            if value is not EMPTY:
                entry["seed"] = value
                break
        entry["writes"] = [w for block in reversed(blocks) for w in block]
        result[ch] = entry
    return result


def fold(history: Mapping[str, Any]) -> list[Any]:
    """Materialize a channel from its history with a list-append reducer."""
    seed = history.get("seed", EMPTY)
    if seed is EMPTY:
        state: list[Any] = []
    elif isinstance(seed, _DeltaSnapshot):
        state = list(seed.value)
    else:
        state = list(seed)
    return state + [value for _, _, value in history["writes"]]


async def write_tree(
    saver: BaseCheckpointSaver[Any], spec: TreeSpec, thread_id: str | None = None, ns: str = ""
) -> Tree:
    """Put ``spec`` into ``saver`` (async API) and return its reference model."""
    tree = _plan(saver, spec, thread_id)
    tree.ns = ns
    for put_args, write_calls in _operations(tree):
        _check_put_result(await saver.aput(*put_args), tree, put_args[1]["id"])
        for args in write_calls:
            await saver.aput_writes(*args)
    return tree


def _check_put_result(config: Any, tree: Tree, checkpoint_id: str) -> None:
    configurable = (config or {}).get("configurable", {})
    got = (configurable.get("thread_id"), configurable.get("checkpoint_ns", ""), configurable.get("checkpoint_id"))
    assert got == (tree.thread_id, tree.ns, checkpoint_id), (
        named(f"put returned {configurable} (contract: put returns the config of the stored checkpoint, "
        "with its thread_id and checkpoint_ns: LangGraph writes the next step under it)")
    )


def write_tree_sync(
    saver: BaseCheckpointSaver[Any], spec: TreeSpec, thread_id: str | None = None
) -> Tree:
    """Put ``spec`` into ``saver`` with the sync twins and return its reference model."""
    tree = _plan(saver, spec, thread_id)
    for put_args, write_calls in _operations(tree):
        _check_put_result(saver.put(*put_args), tree, put_args[1]["id"])
        for args in write_calls:
            saver.put_writes(*args)
    return tree


def _plan(saver: BaseCheckpointSaver[Any], spec: TreeSpec, thread_id: str | None) -> Tree:
    thread_id = thread_id or new_thread_id()
    runs = max(3, max(node.run for node in spec.nodes) + 1)
    tree = Tree(thread_id, [], spec, run_ids=[new_thread_id("run") for _ in range(runs)])
    counter = itertools.count(1)
    last_version: dict[str, Any] = {}
    for i, nspec in enumerate(spec.nodes):
        parent = tree.nodes[nspec.parent] if nspec.parent is not None else None
        versions = dict(parent.versions) if parent else {}
        values = dict(parent.values) if parent else {}
        delta_channels = set(parent.delta_channels) if parent else set()
        for ch, kind in nspec.kinds.items():
            if kind in ("unchanged", "absent"):
                continue
            delta_channels.discard(ch)
            if kind == "delta":
                delta_channels.add(ch)
            # One version sequence per channel and thread: forks never reuse a version.
            version = saver.get_next_version(last_version.get(ch), None)
            last_version[ch] = version
            versions[ch] = version
            marker = [10_000 * (i + 1) + ord(ch)]
            if kind == "snapshot":
                values[ch] = _DeltaSnapshot(marker)
            elif kind == "plain":
                values[ch] = marker
            else:
                values[ch] = EMPTY
        node = Node(i, new_checkpoint_id(), nspec.parent, versions, values)
        node.delta_channels = delta_channels
        node.run_id = tree.run_ids[nspec.run]
        node.metadata = {"source": "loop", "step": i, "run_id": node.run_id, "parents": {}}
        if delta_channels:
            node.metadata[COUNTERS_KEY] = {ch: [1, i + 1] for ch in sorted(delta_channels)}
        for task_id, task_path, chans in nspec.batches:
            batch = []
            for ch in chans:
                value = next(counter)
                tree.write_owner[value] = i
                batch.append((ch, value))
            node.writes.put(task_id, task_path, batch)
            node.batches.append((task_id, task_path, batch))
        tree.nodes.append(node)
    return tree


def _operations(tree: Tree) -> list[tuple[tuple[Any, ...], list[tuple[Any, ...]]]]:
    ops = []
    for node in tree.nodes:
        spec = tree.spec.nodes[node.index]
        parent_id = tree.nodes[node.parent].id if node.parent is not None else None
        new_versions = {
            ch: node.versions[ch]
            for ch, kind in spec.kinds.items()
            if kind not in ("unchanged", "absent")
        }
        # Like LangGraph in full mode, unchanged channels still appear in channel_values.
        values = {ch: v for ch, v in node.values.items() if v is not EMPTY}
        checkpoint = make_checkpoint(node.id, values, node.versions)
        put_args = (
            config_for(tree.thread_id, parent_id, tree.ns),
            checkpoint,
            dict(node.metadata),
            new_versions,
        )
        writes = [
            (config_for(tree.thread_id, node.id, tree.ns), batch, task_id, task_path)
            for task_id, task_path, batch in node.batches
        ]
        ops.append((put_args, writes))
    return ops


def describe_history_mismatch(
    tree: Tree, index: int, got: Mapping[str, Any], expected: Mapping[str, Any]
) -> str:
    """Name the broken contract for a delta-history mismatch."""
    on_path = set(tree.ancestors(index))
    problems: list[str] = []
    for ch, exp in expected.items():
        entry = got.get(ch)
        if entry is None:
            problems.append(f"channel {ch!r} not answered (contract: every requested channel answered)")
            continue
        values = [w[2] for w in entry.get("writes", [])]
        owners = {tree.write_owner.get(v) for v in values}
        foreign = sorted(o for o in owners if o is not None and o not in on_path)
        if index in foreign:
            problems.append(
                f"channel {ch!r} includes the target's own writes "
                "(contract: delta history excludes the target's writes)"
            )
            foreign.remove(index)
        if foreign:
            problems.append(
                f"channel {ch!r} includes writes of nodes {foreign} that are not ancestors of node "
                f"{index} (contract: delta history follows parent links; a fork never sees a "
                "sibling branch's writes)"
            )
        if ("seed" in entry) != ("seed" in exp) or entry.get("seed") != exp.get("seed"):
            problems.append(
                f"channel {ch!r} seed {entry.get('seed', '<absent>')!r} != {exp.get('seed', '<absent>')!r} "
                "(contract: seed is the value at the nearest ancestor holding one)"
            )
        got_writes = [tuple(w) for w in entry.get("writes", [])]
        if got_writes != exp["writes"]:
            if sorted(map(repr, got_writes)) == sorted(map(repr, exp["writes"])):
                problems.append(
                    f"channel {ch!r} writes out of order (contract: delta history writes oldest "
                    "first, writes_sort_key order within a checkpoint)"
                )
            elif not foreign:
                problems.append(
                    f"channel {ch!r} writes {got_writes} != {exp['writes']} (contract: delta history "
                    "walks parent links to the seed ancestor, includes its writes)"
                )
    return "; ".join(problems)


# --------------------------------------------------------------------------- saver model


@dataclass
class Stored:
    """One checkpoint as the model holds it: what a saver must return for it."""

    id: str
    parent: str | None
    versions: dict[str, Any]
    values: dict[str, Any]  # EMPTY where nothing is stored at that version
    delta: set[str]  # delta channels with nothing stored here (named in the counters)
    run: str
    metadata: dict[str, Any]
    writes: WritesModel = field(default_factory=WritesModel)

    def channel_values(self) -> dict[str, Any]:
        return {ch: v for ch, v in self.values.items() if v is not EMPTY}


class SaverModel:
    """A plain-dict model of a saver: thread -> namespace -> checkpoint id -> `Stored`.

    Every rule of docs/savers.md that the state machine exercises is written here as
    plainly as possible: latest is the highest id, list is newest first, deletes
    empty every table, prune and delete_for_runs keep exactly what a surviving
    checkpoint's delta reconstruction reads.
    """

    def __init__(self) -> None:
        self.threads: dict[str, dict[str, dict[str, Stored]]] = {}

    def ns(self, thread: str, ns: str) -> dict[str, Stored]:
        return self.threads.get(thread, {}).get(ns, {})

    def add(self, thread: str, ns: str, stored: Stored) -> None:
        self.threads.setdefault(thread, {}).setdefault(ns, {})[stored.id] = stored

    def latest(self, thread: str, ns: str) -> Stored | None:
        entries = self.ns(thread, ns)
        return entries[max(entries)] if entries else None

    def ids(self, thread: str, ns: str) -> list[str]:
        """Newest first: the order `list` returns."""
        return sorted(self.ns(thread, ns), reverse=True)

    def ancestors(self, thread: str, ns: str, checkpoint_id: str) -> list[Stored]:
        """Stored parent-link ancestors, nearest first; the walk stops at a deleted one."""
        entries = self.ns(thread, ns)
        out: list[Stored] = []
        current = entries[checkpoint_id].parent
        while current is not None and current in entries:
            out.append(entries[current])
            current = entries[current].parent
        return out

    def needed(self, thread: str, ns: str, checkpoint_id: str) -> set[str]:
        """Ancestors a delta reconstruction at ``checkpoint_id`` reads."""
        remaining = set(self.ns(thread, ns)[checkpoint_id].delta)
        needed: set[str] = set()
        for anc in self.ancestors(thread, ns, checkpoint_id):
            if not remaining:
                break
            needed.add(anc.id)
            remaining -= {ch for ch, v in anc.values.items() if v is not EMPTY}
        return needed

    def history(self, thread: str, ns: str, checkpoint_id: str, channels: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The reference delta walk over what is still stored."""
        return walk_history(self.ancestors(thread, ns, checkpoint_id), channels)

    def delete_thread(self, thread: str) -> None:
        self.threads.pop(thread, None)

    def copy_thread(self, source: str, target: str) -> None:
        for ns, entries in self.threads.get(source, {}).items():
            for stored in entries.values():
                clone = Stored(
                    stored.id, stored.parent, dict(stored.versions), dict(stored.values),
                    set(stored.delta), stored.run, dict(stored.metadata),
                )
                clone.writes.by_key = dict(stored.writes.by_key)
                self.add(target, ns, clone)

    def prune(self, thread: str, strategy: str) -> None:
        if strategy == "delete":
            self.delete_thread(thread)
            return
        for ns, entries in self.threads.get(thread, {}).items():
            if not entries:
                continue
            head = max(entries)
            keep = {head, *self.needed(thread, ns, head)}
            _remove(entries, set(entries) - keep)

    def delete_for_runs(self, runs: set[str]) -> None:
        for thread, namespaces in self.threads.items():
            for ns, entries in namespaces.items():
                doomed = {cid for cid, s in entries.items() if s.run in runs}
                for cid in set(entries) - doomed:
                    doomed -= self.needed(thread, ns, cid)
                _remove(entries, doomed)


def _remove(entries: dict[str, Stored], doomed: set[str]) -> None:
    """Delete ``doomed``; a survivor whose parent went no longer names one (docs/threads.md)."""
    for cid in doomed:
        del entries[cid]
    for stored in entries.values():
        if stored.parent in doomed:
            stored.parent = None


def named(message: str) -> str:
    """Lead an assertion message with the contract it names: ``"... (contract: X) ..."``
    becomes ``"contract: X"`` then the details on the next line, so the headline a report
    shows (often cut after a line) says which rule broke, not a long repr."""
    start = message.find("(contract: ")
    if start < 0:
        return message
    depth = 0
    for end in range(start, len(message)):
        depth += {"(": 1, ")": -1}.get(message[end], 0)
        if depth == 0:
            rule = message[start + len("(contract: "):end]
            rest = (message[:start] + message[end + 1:]).strip()
            return f"contract: {rule}\n{rest}"
    return message
