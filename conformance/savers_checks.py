"""What the saver suite asserts again and again, shared by its test modules
(`runstore.conformance.test_savers`) and `SaverMachine`: reading a list, a
checkpoint against the model's tree, a delta history against the reference walk.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver

from .savers_model import (
    Tree,
    as_metadata,
    config_for,
    describe_history_mismatch,
    make_checkpoint,
    named,
    new_checkpoint_id,
)

Saver = BaseCheckpointSaver[Any]


async def collect(saver: Saver, config: Any, **kwargs: Any) -> list[Any]:
    """Every tuple ``saver.alist(config, **kwargs)`` yields, in order."""
    return [item async for item in saver.alist(config, **kwargs)]


def checkpoint_ids(items: list[Any]) -> list[str]:
    """The checkpoint id of each listed tuple, in order."""
    return [item.config["configurable"]["checkpoint_id"] for item in items]


def norm_writes(writes: Any) -> list[tuple[Any, ...]]:
    """Pending writes as tuples (a saver may return lists), ``[]`` for none."""
    return [tuple(w) for w in writes or []]


async def check_node(
    saver: Saver,
    tree: Tree,
    index: int,
    thread_id: str | None = None,
    *,
    parent_gone: bool = False,
    writes_contract: str = (
        "pending_writes in writes_sort_key order; first write wins per (task_id, idx), special "
        "negative slots: last write wins"
    ),
) -> None:
    """get_tuple of one node matches the model: values, parent, metadata, pending writes."""
    node = tree.nodes[index]
    got = await saver.aget_tuple(tree.config(index, thread_id))
    assert got is not None, f"contract: get_tuple finds stored checkpoint {node.id} (node {index})"
    assert got.config["configurable"]["checkpoint_id"] == node.id, (
        "contract: get_tuple returns the config of the checkpoint it found"
    )
    assert got.config["configurable"].get("checkpoint_ns", "") == tree.ns, (
        named(f"node {index}: config {got.config['configurable']} (contract: get_tuple returns the "
        "config of the checkpoint it found, with its checkpoint_ns)")
    )
    if got.parent_config is not None:
        assert got.parent_config["configurable"].get("checkpoint_ns", "") == tree.ns, (
            named(f"node {index}: parent_config {got.parent_config['configurable']} (contract: "
            "parent_config names the parent in the same checkpoint_ns)")
        )
    assert got.checkpoint["channel_values"] == tree.channel_values(index), (
        named(f"node {index}: channel_values {got.checkpoint['channel_values']!r} != "
        f"{tree.channel_values(index)!r} (contract: channel_values are exactly what was put at "
        "each channel's version; a value is never carried forward from an older version)")
    )
    assert got.checkpoint["channel_versions"] == node.versions, (
        "contract: channel_versions come back as put"
    )
    expected_parent = tree.nodes[node.parent].id if node.parent is not None and not parent_gone else None
    got_parent = (got.parent_config or {}).get("configurable", {}).get("checkpoint_id")
    assert got_parent == expected_parent, (
        named(f"node {index}: parent {got_parent} != {expected_parent} (contract: parent_config is the "
        "checkpoint named by the config passed to put while it is stored, none once it was deleted)")
    )
    for key, value in node.metadata.items():
        assert got.metadata.get(key) == value, f"contract: metadata[{key!r}] round-trips"
    assert norm_writes(got.pending_writes) == node.writes.ordered(), (
        named(f"node {index}: pending_writes {got.pending_writes!r} != {node.writes.ordered()!r} "
        f"(contract: {writes_contract})")
    )


def check_history(tree: Tree, index: int, channels: list[str], got: Mapping[str, Any]) -> None:
    """The delta history ``got`` for node ``index`` equals the reference parent-link walk."""
    expected = tree.history(index, channels)
    normalized = {
        ch: {**dict(entry), "writes": norm_writes(entry.get("writes"))} for ch, entry in got.items()
    }
    problem = describe_history_mismatch(tree, index, normalized, expected)
    if not problem:
        for ch in channels:
            entry = normalized.get(ch)
            exp = expected[ch]
            if entry is None or entry["writes"] != exp["writes"] or (
                ("seed" in entry, entry.get("seed")) != ("seed" in exp, exp.get("seed"))
            ):
                problem = f"channel {ch!r}: {entry!r} != {exp!r} (contract: delta history)"
                break
    assert not problem, named(f"{problem}\n{tree.spec.describe()}")


async def put_chain_with_metadata(
    saver: Saver, thread: str, metas: list[dict[str, Any]]
) -> list[str]:
    """Put a chain of empty checkpoints on ``thread``, one per metadata; their ids, oldest first."""
    ids: list[str] = []
    parent: str | None = None
    for meta in metas:
        cid = new_checkpoint_id()
        await saver.aput(config_for(thread, parent), make_checkpoint(cid, {}, {}), as_metadata(meta), {})
        ids.append(cid)
        parent = cid
    return ids
