"""The saver contract for put and get_tuple: round trips, the latest checkpoint, metadata,
isolation from callers' objects, namespaces, ``saver.serde`` and the ids a saver refuses.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given
from langgraph.checkpoint.serde.base import maybe_add_typed_methods

from ..savers_checks import (
    Saver,
    check_history,
    check_node,
    checkpoint_ids,
    collect,
    norm_writes,
    put_chain_with_metadata,
)
from ..savers_metadata import JSON_FORMS, NO_JSON_FORM, UNMATCHABLE, same_json
from ..savers_model import (
    as_metadata,
    checkpoint_trees,
    config_for,
    make_checkpoint,
    named,
    new_checkpoint_id,
    new_thread_id,
    write_tree,
)


def test_put_then_get_roundtrip(saver_target: Any) -> None:
    """A put checkpoint comes back by id and as the latest, with metadata and values."""

    async def body(saver: Saver) -> None:
        thread = new_thread_id()
        early, first, second = new_checkpoint_id(), new_checkpoint_id(), new_checkpoint_id()
        v1 = saver.get_next_version(None, None)
        values = {"messages": ["hi", {"k": [1, 2.5, None]}], "count": 3}
        cfg = await saver.aput(
            config_for(thread),
            make_checkpoint(first, values, {"messages": v1, "count": v1}),
            as_metadata({"source": "input", "step": -1, "custom": "x"}),
            {"messages": v1, "count": v1},
        )
        assert cfg["configurable"]["checkpoint_id"] == first, (
            "contract: put returns the config of the stored checkpoint"
        )
        assert cfg["configurable"]["thread_id"] == thread
        v2 = saver.get_next_version(v1, None)
        await saver.aput(
            cfg,
            make_checkpoint(second, {**values, "count": 4}, {"messages": v1, "count": v2}),
            {"source": "loop", "step": 0},
            {"count": v2},
        )
        latest = await saver.aget_tuple(config_for(thread))
        assert latest is not None and latest.checkpoint["id"] == second, (
            "contract: get_tuple without checkpoint_id returns the latest checkpoint"
        )
        assert latest.checkpoint["channel_values"] == {**values, "count": 4}, (
            "contract: unchanged channels resolve to the value stored at their version"
        )
        assert latest.parent_config is not None
        assert latest.parent_config["configurable"]["checkpoint_id"] == first
        one = await saver.aget_tuple(config_for(thread, first))
        assert one is not None and one.checkpoint["channel_values"] == values
        assert one.metadata.get("custom") == "x" and one.metadata.get("step") == -1
        assert one.parent_config is None, "contract: a root checkpoint has no parent_config"
        assert await saver.aget_tuple(config_for(thread, new_checkpoint_id())) is None, (
            "contract: get_tuple of an unknown checkpoint id is None"
        )
        assert await saver.aget_tuple(config_for(new_thread_id())) is None, (
            "contract: get_tuple of an unknown thread is None"
        )
        other_ns = await saver.aget_tuple(config_for(thread, ns="child:1"))
        assert other_ns is None, "contract: checkpoint namespaces are separate"
        # Written last, but its id is the oldest (another process, a copy): not the latest.
        await saver.aput(config_for(thread, second), make_checkpoint(early, values, {"messages": v1, "count": v1}),
                         {"source": "loop", "step": 1}, {})
        latest = await saver.aget_tuple(config_for(thread))
        assert latest is not None and latest.checkpoint["id"] == second, (
            "contract: the latest checkpoint is the one with the highest checkpoint id, not the last "
            f"written (got {latest.checkpoint['id'] if latest else None})"
        )
        listed = checkpoint_ids(await collect(saver, config_for(thread)))
        assert listed == [second, first, early], (
            f"contract: list returns checkpoints newest first by checkpoint id, not by write order (got {listed})"
        )
        # A chain, not one step: a saver whose versions are unordered (random, hashed) must
        # fail every run, not the runs where two draws happened to come out in order.
        chain = [v1, v2]
        while len(chain) < 12:
            chain.append(saver.get_next_version(chain[-1], None))
        assert all(later > earlier for earlier, later in itertools.pairwise(chain)), (
            f"contract: get_next_version returns a version greater than the current one "
            f"({' -> '.join(map(repr, chain))}); LangGraph compares versions to see what changed"
        )

    saver_target.run(body)


def test_config_metadata_is_merged_into_checkpoint_metadata(saver_target: Any) -> None:
    """Like the stock savers (`get_checkpoint_metadata`), put merges the config's
    ``metadata`` and plain ``configurable`` values into the stored metadata; runstore's
    channel-mode marker and run ids travel this way."""

    async def body(saver: Saver) -> None:
        thread, cid = new_thread_id(), new_checkpoint_id()
        config = config_for(thread)
        config["metadata"] = {"runstore_checkpoint_channel_mode": "delta", "run_id": "run-1"}
        config["configurable"]["user_tag"] = "blue"
        config["configurable"]["__private"] = "hidden"
        await saver.aput(config, make_checkpoint(cid, {}, {}), {"source": "input", "step": -1}, {})
        got = await saver.aget_tuple(config_for(thread, cid))
        assert got is not None
        md = got.metadata
        assert md.get("runstore_checkpoint_channel_mode") == "delta" and md.get("run_id") == "run-1", (
            named(f"{md} (contract: config metadata is merged into checkpoint metadata)")
        )
        assert md.get("user_tag") == "blue", "contract: plain configurable values join the metadata"
        assert "__private" not in md and "thread_id" not in md and "checkpoint_id" not in md, (
            "contract: dunder and addressing keys stay out of the metadata"
        )
        assert md.get("source") == "input" and md.get("step") == -1
        listed = checkpoint_ids(await collect(saver, None, filter={"user_tag": "blue", "run_id": "run-1"}))
        assert cid in listed, "contract: merged metadata is searchable with list(filter=...)"

    saver_target.run(body)


def test_stored_state_is_isolated_from_callers(saver_target: Any) -> None:
    """Mutating what was put (LangGraph updates versions_seen in place) or what was read
    never changes what the saver returns next."""

    async def body(saver: Saver) -> None:
        thread, cid = new_thread_id(), new_checkpoint_id()
        v = saver.get_next_version(None, None)
        checkpoint = make_checkpoint(cid, {"items": [1, 2], "d": {"k": "v"}}, {"items": v, "d": v})
        checkpoint["versions_seen"] = {"node": {"items": v}}
        metadata: Any = {"source": "loop", "step": 1, "tags": ["a"]}
        cfg = await saver.aput(config_for(thread), checkpoint, metadata, {"items": v, "d": v})
        await saver.aput_writes(cfg, [("items", [3])], "task", "")
        checkpoint["channel_values"]["items"].append(99)
        checkpoint["channel_versions"]["items"] = "bogus"
        checkpoint["versions_seen"]["node"]["items"] = "bogus"
        metadata["tags"].append("b")

        def check(got: Any, after: str) -> None:
            assert got is not None, f"contract: get_tuple finds the checkpoint ({after})"
            checkpoint = got.checkpoint
            # Versions first: a saver holding them by reference loses the values with them.
            assert checkpoint["channel_versions"] == {"items": v, "d": v}, (
                named(f"channel_versions {checkpoint['channel_versions']!r} ({after}) (contract: stored "
                "channel_versions are isolated from the caller's objects; LangGraph updates them "
                "in place after put)")
            )
            assert checkpoint["versions_seen"] == {"node": {"items": v}}, (
                named(f"versions_seen {checkpoint['versions_seen']!r} ({after}) (contract: stored "
                "versions_seen is isolated from the caller's objects; LangGraph updates it in place)")
            )
            assert checkpoint["channel_values"] == {"items": [1, 2], "d": {"k": "v"}}, (
                named(f"channel_values {checkpoint['channel_values']!r} ({after}) (contract: stored "
                "channel_values are isolated from the caller's objects)")
            )
            assert got.metadata.get("step") == 1 and got.metadata.get("tags") == ["a"], (
                named(f"metadata {got.metadata!r} ({after}) (contract: stored metadata is isolated from "
                "the caller's objects)")
            )
            assert norm_writes(got.pending_writes) == [("task", "items", [3])], (
                named(f"pending_writes {got.pending_writes!r} ({after}) (contract: stored writes are "
                "isolated from the caller's objects)")
            )

        first = await saver.aget_tuple(cfg)
        check(first, "after the caller mutated what it put")
        assert first is not None and first.pending_writes
        first.checkpoint["channel_values"]["items"].append(100)
        first.checkpoint["channel_values"]["d"]["k"] = "changed"
        first.checkpoint["versions_seen"]["node"]["items"] = "changed"
        first.checkpoint["channel_versions"]["d"] = "changed"
        first.metadata["step"] = 42
        first.pending_writes[0][2].append(4)
        check(await saver.aget_tuple(cfg), "after the caller mutated what it read")

    saver_target.run(body)


def test_tree_get_tuple_matches_model(saver_target: Any) -> None:
    """Every node of a generated tree reads back exactly as the model says."""
    with saver_target.session() as session:

        @given(spec=checkpoint_trees())
        def check(spec: Any) -> None:
            async def body() -> None:
                saver = session.backend
                tree = await write_tree(saver, spec)
                for i in range(len(tree.nodes)):
                    await check_node(saver, tree, i)
                listed = checkpoint_ids(await collect(saver, config_for(tree.thread_id)))
                assert listed == sorted((n.id for n in tree.nodes), reverse=True), (
                    "contract: list returns every checkpoint of the thread, newest first"
                )

            session.run(body())

        check()


def test_checkpoint_namespaces_are_independent(saver_target: Any) -> None:
    """Two namespaces of one thread (a graph and its subgraph) keep separate checkpoints,
    writes, latest and delta history; delete_thread removes both."""
    with saver_target.session() as session:

        @given(outer=checkpoint_trees(max_nodes=5), inner=checkpoint_trees(max_nodes=5))
        def check(outer: Any, inner: Any) -> None:
            async def body() -> None:
                saver = session.backend
                thread = new_thread_id()
                trees = [
                    await write_tree(saver, outer, thread, ""),
                    await write_tree(saver, inner, thread, "child:1"),
                ]
                for tree in trees:
                    for i in range(len(tree.nodes)):
                        await check_node(saver, tree, i)
                    latest = await saver.aget_tuple(config_for(thread, ns=tree.ns))
                    assert latest is not None and latest.checkpoint["id"] == tree.nodes[-1].id, (
                        "contract: the latest checkpoint is per namespace"
                    )
                    listed = checkpoint_ids(await collect(saver, config_for(thread, ns=tree.ns)))
                    assert listed == sorted((n.id for n in tree.nodes), reverse=True), (
                        "contract: list with checkpoint_ns lists that namespace only"
                    )
                    got = await saver.aget_delta_channel_history(
                        config=tree.config(tree.spec.target), channels=tree.spec.query
                    )
                    check_history(tree, tree.spec.target, tree.spec.query, got)
                await saver.adelete_thread(thread)
                for tree in trees:
                    assert await saver.aget_tuple(config_for(thread, ns=tree.ns)) is None, (
                        "contract: delete_thread removes every namespace of the thread"
                    )

            session.run(body())

        check()


class _RecordingSerde:
    """Wraps a serde, counts calls and scrambles bytes, like an encrypting serde would."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.dumped = 0
        self.loaded = 0
        self.objects: list[Any] = []

    def saw(self, value: Any) -> bool:
        """Whether ``value`` was dumped, alone or inside a dumped container (a saver may
        serialize a whole checkpoint or a batch of writes in one call)."""

        def holds(obj: Any, depth: int = 0) -> bool:
            if obj == value:
                return True
            if depth > 6:
                return False
            if isinstance(obj, dict):
                return any(holds(v, depth + 1) for v in obj.values())
            if isinstance(obj, list | tuple):
                return any(holds(v, depth + 1) for v in obj)
            return False

        return any(holds(obj) for obj in self.objects)

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        self.dumped += 1
        self.objects.append(obj)
        kind, data = self.inner.dumps_typed(obj)
        return f"rec+{kind}", bytes(reversed(data))

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        self.loaded += 1
        kind, raw = data
        assert kind.startswith("rec+"), (
            f"contract: stored data is what saver.serde produced (got type {kind!r})"
        )
        return self.inner.loads_typed((kind[4:], bytes(reversed(raw))))


def test_values_and_writes_go_through_saver_serde(saver_target: Any) -> None:
    """Channel values and writes are serialized with ``saver.serde`` (so encrypted serdes work)."""

    async def body(saver: Saver) -> None:
        recording = _RecordingSerde(saver.serde)
        saver.serde = maybe_add_typed_methods(recording)
        thread, cid = new_thread_id(), new_checkpoint_id()
        v1 = saver.get_next_version(None, None)
        cfg = await saver.aput(
            config_for(thread), make_checkpoint(cid, {"secret": ["s3cr3t"]}, {"secret": v1}),
            {"source": "input", "step": -1}, {"secret": v1},
        )
        await saver.aput_writes(cfg, [("secret", "w1")], "task", "")
        assert recording.saw(["s3cr3t"]), (
            "contract: channel values are serialized with saver.serde, read at call time (an "
            "encrypting serde set after opening must see them)"
        )
        assert recording.saw("w1"), (
            "contract: pending-write values are serialized with saver.serde, read at call time"
        )
        got = await saver.aget_tuple(cfg)
        assert got is not None and got.checkpoint["channel_values"] == {"secret": ["s3cr3t"]}
        assert norm_writes(got.pending_writes) == [("task", "secret", "w1")]
        assert recording.loaded >= 2, "contract: values and writes are loaded with saver.serde"

    saver_target.run(body)


#: Text no saver can store the same way: PostgreSQL text refuses NUL, and a lone
#: surrogate is not Unicode (sqlite and JSON encoders refuse it).
_UNSTORABLE = {"a NUL character": "bad\x00id", "a lone surrogate": "bad\ud800id"}


@pytest.mark.requires("checked_ids")
def test_unstorable_ids_are_refused_by_name_and_nothing_is_written(saver_target: Any) -> None:
    """Ids holding a NUL or a lone surrogate raise InvalidSaverInputError naming the field,
    on reads and writes, and leave the store as it was."""
    from runstore.errors import InvalidSaverInputError

    async def body(saver: Saver) -> None:
        tag = new_thread_id("tag")
        thread = new_thread_id()
        [cid] = await put_chain_with_metadata(saver, thread, [{"tag": tag}])
        await saver.aput_writes(config_for(thread, cid), [("a", "kept")], "task")
        head = config_for(thread, cid)
        for label, bad in _UNSTORABLE.items():
            calls: list[tuple[str, Any]] = [
                (
                    "thread_id",
                    lambda bad=bad: saver.aput(
                        config_for(bad),
                        make_checkpoint(new_checkpoint_id(), {}, {}),
                        as_metadata({"tag": tag}),
                        {},
                    ),
                ),
                (
                    "checkpoint_ns",
                    lambda bad=bad: saver.aput(
                        config_for(thread, ns=bad),
                        make_checkpoint(new_checkpoint_id(), {}, {}),
                        as_metadata({"tag": tag}),
                        {},
                    ),
                ),
                (
                    "checkpoint id",
                    lambda bad=bad: saver.aput(
                        config_for(thread, cid), make_checkpoint(bad, {}, {}), as_metadata({"tag": tag}), {}
                    ),
                ),
                ("task_id", lambda bad=bad: saver.aput_writes(head, [("a", "bad")], bad)),
                ("channel", lambda bad=bad: saver.aput_writes(head, [(bad, "bad")], "task-2")),
                ("thread_id", lambda bad=bad: saver.aget_tuple(config_for(bad))),
                ("thread_id", lambda bad=bad: collect(saver, config_for(bad))),
                ("thread_id", lambda bad=bad: saver.adelete_thread(bad)),
                (
                    "channel",
                    lambda bad=bad: saver.aget_delta_channel_history(config=head, channels=[bad]),
                ),
            ]
            for field_name, call in calls:
                with pytest.raises(InvalidSaverInputError) as raised:
                    await call()
                message = str(raised.value)
                assert field_name in message, (
                    f"{label} in {field_name}: {message!r} (contract: the error names "
                    "the field and what is accepted)"
                )
        stored = await collect(saver, None, filter={"tag": tag})
        assert checkpoint_ids(stored) == [cid], (
            "contract: a refused put writes nothing (no checkpoint, in any thread)"
        )
        assert norm_writes(stored[0].pending_writes) == [("task", "a", "kept")], (
            "contract: refused put_writes write nothing"
        )

    saver_target.run(body)


#: Metadata no saver can store alike: a lone surrogate anywhere (no JSON encoder takes it),
#: a NUL in a nested string or key (PostgreSQL JSON refuses it).
_UNSTORABLE_METADATA: dict[str, dict[str, Any]] = {
    "a lone surrogate": {"note": "bad\ud800"},
    "a NUL in a nested string": {"nested": {"note": "bad\x00text"}},
    "a NUL in a nested key": {"nested": {"bad\x00key": 1}},
}


@pytest.mark.requires("checked_ids")
def test_unstorable_metadata_is_refused_and_nothing_is_written(saver_target: Any) -> None:
    """Metadata no saver can store alike raises InvalidSaverInputError naming the metadata,
    before anything is written (savers.md "Rows": the memory saver too)."""
    from runstore.errors import InvalidSaverInputError

    async def body(saver: Saver) -> None:
        tag = new_thread_id("tag")
        thread = new_thread_id()
        [cid] = await put_chain_with_metadata(saver, thread, [{"tag": tag}])
        for label, bad in _UNSTORABLE_METADATA.items():
            try:
                await saver.aput(
                    config_for(thread, cid), make_checkpoint(new_checkpoint_id(), {}, {}),
                    as_metadata({"tag": tag, **bad}), {},
                )
            except InvalidSaverInputError as exc:
                assert "metadata" in str(exc), (
                    f"contract: unstorable metadata ({label}) is refused naming the metadata: {exc}"
                )
            else:
                raise AssertionError(
                    f"contract: metadata no saver can store alike ({label}) is refused with "
                    "InvalidSaverInputError (it was stored)"
                )
        stored = await collect(saver, None, filter={"tag": tag})
        assert checkpoint_ids(stored) == [cid], (
            f"contract: a put refused for its metadata writes nothing; the thread holds {checkpoint_ids(stored)}"
        )

    saver_target.run(body)


@pytest.mark.requires("checked_ids")
def test_metadata_reads_back_in_its_json_form(saver_target: Any) -> None:
    """Metadata reads back in the JSON form every saver stores (savers.md "Rows"): an int
    beyond 64 bits as its text, NaN and infinities as null, a datetime, date or UUID as
    its ISO or hex text, tuples and sets as arrays, non-str keys as their text, an Enum as
    its value, other objects as their str; alike from get_tuple and list, and a filter by
    the value as put finds it (with ``typed_filters``). Values with no such form are
    refused with InvalidSaverInputError saying what is accepted; nothing written."""
    from runstore.errors import InvalidSaverInputError

    async def body(saver: Saver) -> None:
        thread, tag = new_thread_id(), new_thread_id("tag")
        ids: dict[str, str] = {}
        parent: str | None = None
        for label, (value, _) in JSON_FORMS.items():
            cid = new_checkpoint_id()
            try:
                await saver.aput(
                    config_for(thread, parent), make_checkpoint(cid, {}, {}),
                    as_metadata({"tag": tag, "case": label, "v": value}), {},
                )
            except Exception as exc:
                raise AssertionError(
                    named(f"contract: metadata reads back in its JSON form: put of {label} "
                          f"({value!r:.60}) raised {type(exc).__name__}: {exc}")
                ) from exc
            ids[label] = parent = cid
        listed = {item.metadata.get("case"): item.metadata for item in await collect(saver, config_for(thread))}
        for label, (value, expected) in JSON_FORMS.items():
            got = await saver.aget_tuple(config_for(thread, ids[label]))
            assert got is not None, f"contract: get_tuple finds the checkpoint holding {label}"
            for how, metadata in (("get_tuple", got.metadata), ("list", listed.get(label, {}))):
                assert same_json(metadata.get("v"), expected), named(
                    f"contract: metadata reads back in its JSON form: {label} ({value!r:.60}) "
                    f"-> {metadata.get('v')!r:.80} from {how}, expected {expected!r}"
                )
            if not saver_target.has("typed_filters"):
                continue
            wanted = [] if label in UNMATCHABLE else [ids[label]]
            for shown, flt in (("as put", value), ("in its JSON form", expected)):
                if flt is None:
                    continue
                found = checkpoint_ids(await collect(saver, config_for(thread), filter={"v": flt}))
                assert found == wanted, named(
                    f"contract: metadata reads back in its JSON form: filter by {label} {shown} "
                    f"({flt!r:.60}) found {len(found)} checkpoint(s), expected {len(wanted)}"
                )
        for label, value in NO_JSON_FORM.items():
            try:
                await saver.aput(
                    config_for(thread, parent), make_checkpoint(new_checkpoint_id(), {}, {}),
                    as_metadata({"tag": tag, "v": value}), {},
                )
            except InvalidSaverInputError as exc:
                assert "metadata" in str(exc) and "accepted" in str(exc), named(
                    f"contract: metadata with no JSON form ({label}) is refused saying what is "
                    f"accepted: {exc}"
                )
            except Exception as exc:
                raise AssertionError(
                    named(f"contract: metadata with no JSON form ({label}) is refused with "
                          f"InvalidSaverInputError, not {type(exc).__name__}: {exc}")
                ) from exc
            else:
                raise AssertionError(named(
                    f"contract: metadata with no JSON form ({label}) is refused with "
                    "InvalidSaverInputError (it was stored)"
                ))
        stored = await collect(saver, None, filter={"tag": tag})
        assert sorted(checkpoint_ids(stored)) == sorted(ids.values()), named(
            "contract: a put refused for metadata with no JSON form writes nothing"
        )

    saver_target.run(body)
