"""sqlite-specific tests of `SqliteSaver` (the shared contract lives in the conformance suite)."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import START, StateGraph

from runstore.checkpoint.modes import get_thread_state_schema
from runstore.checkpoint.rules import PREFETCH_MAX_SUPERSTEPS
from runstore.errors import SchemaVersionError, SyncCallOnEventLoopError
from runstore.options import BackendOptions
from runstore.plugins.sqlite import sql
from runstore.plugins.sqlite.saver import SCHEMA_COMPONENT, SCHEMA_MIGRATIONS, SqliteSaver
from runstore.settings import Settings
from runstore.sql.migrations import ensure_schema
from runstore.urls import BackendURL


@pytest.fixture
async def opened(sqlite_url: str) -> AsyncIterator[tuple[SqliteSaver, BackendOptions]]:
    options = BackendOptions()
    saver = await SqliteSaver.open(BackendURL.parse(sqlite_url), options)
    try:
        yield saver, options
    finally:
        await options.aclose()


def cfg(thread: str, checkpoint_id: str | None = None, ns: str = "") -> dict[str, Any]:
    configurable: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ns}
    if checkpoint_id:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def file_writer(saver: SqliteSaver) -> Any:
    """The connection the saver's writes run on: the file's writer, shared with the event store."""
    assert saver._state.file is not None
    writer = saver._state.file._writer
    assert writer is not None
    return writer


class CountHops:
    """Counts the saver's aiosqlite worker-thread hops (its reader's and the file writer's)
    while installed (a ``with`` block)."""

    def __init__(self, saver: SqliteSaver) -> None:
        self.saver = saver
        self.calls = 0
        self.workers: list[Any] = []

    def __enter__(self) -> CountHops:
        self.workers = [self.saver._state.worker, file_writer(self.saver)]
        for worker in self.workers:
            assert worker is not None
            original = worker.run

            async def counting(fn: Any, *args: Any, original: Any = original, **kwargs: Any) -> Any:
                self.calls += 1
                return await original(fn, *args, **kwargs)

            worker.run = counting
        return self

    def __exit__(self, *exc: object) -> None:
        for worker in self.workers:
            del worker.run  # back to the class's method


async def put_chain(
    saver: SqliteSaver, thread: str, values: list[dict[str, Any]], run_id: str = "run"
) -> list[str]:
    """Put a linear chain; ``values[i]`` is checkpoint i's channel_values (channel ``a``)."""
    ids: list[str] = []
    version: str | None = None
    parent: str | None = None
    for i, held in enumerate(values):
        version = saver.get_next_version(version, None)
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = dict(held)
        checkpoint["channel_versions"] = {"a": version}
        out = await saver.aput(
            cfg(thread, parent), checkpoint, {"step": i, "run_id": run_id}, {"a": version}
        )
        parent = out["configurable"]["checkpoint_id"]
        await saver.aput_writes(out, [("a", f"w{i}")], "task", "")
        ids.append(parent)
    return ids


def delta_graph(saver: Any, frequency: int = 3) -> Any:
    schema = get_thread_state_schema("delta", frequency)

    async def agent(state: dict[str, Any]) -> dict[str, Any]:
        return {
            "messages": [AIMessage(content=f"ai{len(state['messages'])}", id=str(uuid.uuid4()))]
        }

    builder = StateGraph(schema)
    builder.add_node("agent", agent)
    builder.add_edge(START, "agent")
    return builder.compile(checkpointer=saver)


async def run_turns(graph: Any, config: dict[str, Any], n: int) -> None:
    for i in range(n):
        await graph.ainvoke(
            {"messages": [HumanMessage(content=f"h{i}", id=str(uuid.uuid4()))]}, config
        )


# --------------------------------------------------------------------------- sync twins


async def test_sync_twins_on_the_loop_thread_raise(opened: tuple[SqliteSaver, Any]) -> None:
    saver, _ = opened
    config = cfg("t")
    calls = [
        lambda: saver.get_tuple(config),
        lambda: saver.list(config),
        lambda: saver.put(config, empty_checkpoint(), {}, {}),
        lambda: saver.put_writes(cfg("t", "x"), [("a", 1)], "task"),
        lambda: saver.delete_thread("t"),
        lambda: saver.copy_thread("t", "u"),
        lambda: saver.prune(["t"]),
        lambda: saver.delete_for_runs(["r"]),
        lambda: saver.get_delta_channel_history(config=config, channels=["a"]),
    ]
    for call in calls:
        with pytest.raises(SyncCallOnEventLoopError, match="event loop thread"):
            call()


async def test_sync_api_from_another_thread(opened: tuple[SqliteSaver, Any]) -> None:
    saver, _ = opened
    ids = await put_chain(saver, "t-sync", [{"a": [0]}, {}, {}])

    def in_thread() -> dict[str, Any]:
        head = saver.get_tuple(cfg("t-sync"))
        listed = [t.config["configurable"]["checkpoint_id"] for t in saver.list(cfg("t-sync"))]
        history = saver.get_delta_channel_history(config=cfg("t-sync"), channels=["a"])
        # writes from this thread are visible to the async side too
        version = saver.get_next_version(None, None)
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"a": ["sync"]}
        checkpoint["channel_versions"] = {"a": version}
        put = saver.put(cfg("t-sync2"), checkpoint, {"source": "sync"}, {"a": version})
        saver.put_writes(put, [("a", "x")], "task")
        saver.copy_thread("t-sync2", "t-sync3")
        return {"head": head, "listed": listed, "history": history}

    got = await asyncio.to_thread(in_thread)
    assert got["head"].config["configurable"]["checkpoint_id"] == ids[-1]
    assert got["listed"] == list(reversed(ids))
    assert got["history"] == {
        "a": {"writes": [("task", "a", "w0"), ("task", "a", "w1")], "seed": [0]}
    }
    copied = await saver.aget_tuple(cfg("t-sync3"))
    assert copied is not None
    assert copied.checkpoint["channel_values"] == {"a": ["sync"]}
    assert copied.pending_writes == [("task", "a", "x")]


# --------------------------------------------------------------------------- durability


async def test_reopen_keeps_everything(sqlite_url: str) -> None:
    url = BackendURL.parse(sqlite_url)
    async with BackendOptions.scope() as options:
        saver = await SqliteSaver.open(url, options)
        ids = await put_chain(saver, "t-durable", [{"a": [1]}, {}, {"a": [3]}])
    async with BackendOptions.scope() as options:
        saver = await SqliteSaver.open(url, options)
        head = await saver.aget_tuple(cfg("t-durable"))
        assert head is not None
        assert head.config["configurable"]["checkpoint_id"] == ids[-1]
        assert head.checkpoint["channel_values"] == {"a": [3]}
        assert head.pending_writes == [("task", "a", "w2")]
        middle = await saver.aget_tuple(cfg("t-durable", ids[1]))
        assert middle is not None and middle.checkpoint["channel_values"] == {}


async def test_real_graph_survives_reopen_in_delta_mode(sqlite_url: str) -> None:
    url = BackendURL.parse(sqlite_url)
    config = {"configurable": {"thread_id": "t-graph"}}
    async with BackendOptions.scope() as options:
        graph = delta_graph(await SqliteSaver.open(url, options))
        await run_turns(graph, config, 5)
        before = (await graph.aget_state(config)).values["messages"]
    async with BackendOptions.scope() as options:
        graph = delta_graph(await SqliteSaver.open(url, options))
        after = (await graph.aget_state(config)).values["messages"]
    assert [m.content for m in after] == [m.content for m in before]
    assert len(after) == 10


# --------------------------------------------------------------------------- processes

_WRITER = textwrap.dedent(
    """
    import asyncio, json, os, sys
    from langgraph.checkpoint.base import empty_checkpoint
    from runstore.options import BackendOptions
    from runstore.plugins.sqlite.saver import SqliteSaver
    from runstore.urls import BackendURL

    async def main():
        job = json.loads(os.environ["JOB"])
        async with BackendOptions.scope() as options:
            saver = await SqliteSaver.open(BackendURL.parse(job["url"]), options)
            for thread in (job["own"], job["shared"]):
                parent, version = None, None
                for i in range(job["n"]):
                    version = saver.get_next_version(version, None)
                    ck = empty_checkpoint()
                    ck["channel_values"] = {"a": [job["name"], i]}
                    ck["channel_versions"] = {"a": version}
                    c = {"configurable": {"thread_id": thread, "checkpoint_ns": job["name"]}}
                    if parent:
                        c["configurable"]["checkpoint_id"] = parent
                    out = await saver.aput(c, ck, {"writer": job["name"]}, {"a": version})
                    await saver.aput_writes(out, [("a", i)], "task")
                    parent = out["configurable"]["checkpoint_id"]

    asyncio.run(main())
    """
)


async def test_two_processes_write_one_file_concurrently(sqlite_url: str) -> None:
    n = 40

    def spawn(name: str) -> subprocess.Popen[str]:
        job = {"url": sqlite_url, "name": name, "own": f"own-{name}", "shared": "shared", "n": n}
        env = dict(os.environ, JOB=json.dumps(job))
        return subprocess.Popen(
            [sys.executable, "-c", _WRITER], env=env, stderr=subprocess.PIPE, text=True
        )

    procs = [spawn("p1"), spawn("p2")]
    for proc in procs:
        _, err = await asyncio.to_thread(proc.communicate, timeout=120)
        # Head and tail: a chained traceback's first frames say which statement failed.
        assert proc.returncode == 0, err if len(err) <= 6000 else f"{err[:3000]}\n...\n{err[-3000:]}"
    async with BackendOptions.scope() as options:
        saver = await SqliteSaver.open(BackendURL.parse(sqlite_url), options)
        for name in ("p1", "p2"):
            own = [t async for t in saver.alist(cfg(f"own-{name}", ns=name))]
            assert len(own) == n
            shared = [t async for t in saver.alist(cfg("shared", ns=name))]
            assert len(shared) == n
            assert all(t.metadata["writer"] == name for t in shared)
            head = shared[0]
            assert head.checkpoint["channel_values"] == {"a": [name, n - 1]}
            assert head.pending_writes == [("task", "a", n - 1)]


# --------------------------------------------------------------------------- schema


async def test_schema_upgrades_from_version_1(sqlite_url: str) -> None:
    from runstore.plugins.sqlite.engine import shared_engine

    url = BackendURL.parse(sqlite_url)
    async with BackendOptions.scope() as options:
        engine = await shared_engine(url, options)
        assert await ensure_schema(engine, SCHEMA_COMPONENT, SCHEMA_MIGRATIONS[:1]) == 1
    path = url.file_path()
    assert path is not None
    with sqlite3.connect(path) as conn:
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        assert "runstore_checkpoints_run_id" not in indexes
    async with BackendOptions.scope() as options:
        saver = await SqliteSaver.open(url, options)
        await put_chain(saver, "t-upgrade", [{"a": [1]}], run_id="r-up")
        await saver.adelete_for_runs(["r-up"])
        assert await saver.aget_tuple(cfg("t-upgrade")) is None
    conn = sqlite3.connect(path)
    try:
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        version = conn.execute(
            "SELECT version FROM runstore_schema_versions WHERE component = ?", (SCHEMA_COMPONENT,)
        ).fetchone()[0]
    finally:
        conn.close()
    assert "runstore_checkpoints_run_id" in indexes
    assert version == len(SCHEMA_MIGRATIONS)


async def test_schema_upgrades_a_file_with_data_from_version_2(sqlite_url: str) -> None:
    """A file written at version 2 (no channel_versions, writes.value) opens at the
    current version: everything reads back, and its rows, whose channel versions are
    unknown, are pruned as if every delta channel their metadata names had one."""
    from runstore.plugins.sqlite.engine import shared_engine

    url = BackendURL.parse(sqlite_url)
    async with BackendOptions.scope() as options:
        engine = await shared_engine(url, options)
        assert await ensure_schema(engine, SCHEMA_COMPONENT, SCHEMA_MIGRATIONS[:2]) == 2
    path = url.file_path()
    assert path is not None
    serde = JsonPlusSerializer()
    delta_md = '{"counters_since_delta_snapshot":{"a":[1,1]}}'
    with sqlite3.connect(path) as conn:
        for cid, parent, metadata, held in (
            ("01", None, "{}", '{"a":"v1"}'),
            ("02", "01", delta_md, "{}"),
            ("03", "02", delta_md, "{}"),
        ):
            record = empty_checkpoint()
            record["id"] = cid
            record.pop("channel_values")
            kind, data = serde.dumps_typed(record)
            conn.execute(
                "INSERT INTO runstore_checkpoints VALUES (?, '', ?, ?, NULL, ?, ?, ?, ?)",
                ("t-old", cid, parent, kind, data, metadata, held),
            )
        kind, data = serde.dumps_typed(["seed"])
        conn.execute(
            "INSERT INTO runstore_checkpoint_blobs VALUES ('t-old', '', 'a', 'v1', ?, ?)",
            (kind, data),
        )
        kind, data = serde.dumps_typed("w2")
        conn.execute(
            "INSERT INTO runstore_checkpoint_writes VALUES ('t-old', '', '02', 'task', 0, '', "
            "'a', ?, ?)",
            (kind, data),
        )
    async with BackendOptions.scope() as options:
        saver = await SqliteSaver.open(url, options)
        head = await saver.aget_tuple(cfg("t-old"))
        assert head is not None and head.config["configurable"]["checkpoint_id"] == "03"
        history = await saver.aget_delta_channel_history(config=head.config, channels=["a"])
        assert history == {"a": {"writes": [("task", "a", "w2")], "seed": ["seed"]}}
        await saver.aprune(["t-old"])
        kept = [t.config["configurable"]["checkpoint_id"] async for t in saver.alist(cfg("t-old"))]
        assert kept == ["03", "02", "01"], "unknown versions keep the whole reconstruction"
        # New rows carry their versions: a named delta channel without one needs nothing.
        out = await saver.aput(
            head.config, empty_checkpoint(), {"counters_since_delta_snapshot": {"b": [1, 1]}}, {}
        )
        await saver.aprune(["t-old"])
        kept = [t.config["configurable"]["checkpoint_id"] async for t in saver.alist(cfg("t-old"))]
        assert kept == [out["configurable"]["checkpoint_id"]]
    with sqlite3.connect(path) as conn:
        columns = {r[1] for r in conn.execute("PRAGMA table_info(runstore_checkpoint_writes)")}
        assert "blob" in columns and "value" not in columns
        (version,) = conn.execute(
            "SELECT version FROM runstore_schema_versions WHERE component = ?", (SCHEMA_COMPONENT,)
        ).fetchone()
        assert version == len(SCHEMA_MIGRATIONS)


async def test_newer_schema_is_refused(sqlite_url: str) -> None:
    url = BackendURL.parse(sqlite_url)
    async with BackendOptions.scope() as options:
        await SqliteSaver.open(url, options)
    path = url.file_path()
    assert path is not None
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(
            "UPDATE runstore_schema_versions SET version = 99 WHERE component = ?",
            (SCHEMA_COMPONENT,),
        )
    conn.close()
    async with BackendOptions.scope() as options:
        with pytest.raises(SchemaVersionError, match="upgrade runstore"):
            await SqliteSaver.open(url, options)


# --------------------------------------------------------------------------- serde


class _XorCipher:
    """A toy cipher (not secure): enough to prove the saver stores only ciphertext."""

    def __init__(self, key: bytes) -> None:
        self.key = key

    def _xor(self, data: bytes) -> bytes:
        return bytes(b ^ self.key[i % len(self.key)] for i, b in enumerate(data))

    def encrypt(self, plaintext: bytes) -> tuple[str, bytes]:
        return "xor", self._xor(plaintext)

    def decrypt(self, ciphername: str, ciphertext: bytes) -> bytes:
        assert ciphername == "xor"
        return self._xor(ciphertext)


async def test_encrypted_serde_round_trip(sqlite_url: str) -> None:
    url = BackendURL.parse(sqlite_url)
    serde = EncryptedSerializer(_XorCipher(b"k3y!"), JsonPlusSerializer())
    secret = "top-secret-value-" + uuid.uuid4().hex
    async with BackendOptions.scope() as options:
        saver = await SqliteSaver.open(url, options, serde=serde)
        version = saver.get_next_version(None, None)
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"a": [secret]}
        checkpoint["channel_versions"] = {"a": version}
        out = await saver.aput(cfg("t-enc"), checkpoint, {}, {"a": version})
        await saver.aput_writes(out, [("a", secret + "-write")], "task")
        got = await saver.aget_tuple(cfg("t-enc"))
        assert got is not None
        assert got.checkpoint["channel_values"] == {"a": [secret]}
        assert got.pending_writes == [("task", "a", secret + "-write")]
        history = await saver.aget_delta_channel_history(config=cfg("t-enc"), channels=["a"])
        assert history == {"a": {"writes": []}}
    path = url.file_path()
    assert path is not None
    conn = sqlite3.connect(path)
    try:
        types = {r[0] for r in conn.execute("SELECT type FROM runstore_checkpoint_blobs")}
        types |= {r[0] for r in conn.execute("SELECT type FROM runstore_checkpoint_writes")}
        stored = b"".join(
            r[0] for r in conn.execute("SELECT blob FROM runstore_checkpoint_blobs")
        ) + b"".join(r[0] for r in conn.execute("SELECT blob FROM runstore_checkpoint_writes"))
    finally:
        conn.close()
    assert all("+xor" in t for t in types), types
    assert secret.encode() not in stored


# --------------------------------------------------------------------------- sharing


async def test_shares_engine_with_event_store(sqlite_url: str) -> None:
    from runstore.plugins.sqlite.events import SqliteEventStore

    url = BackendURL.parse(sqlite_url)
    async with BackendOptions.scope() as options:
        saver = await SqliteSaver.open(url, options)
        store = await SqliteEventStore.open(url, options)
        assert saver.engine is not None and saver.engine is store.engine
        await put_chain(saver, "t-share", [{"a": [1]}])
        assert await saver.aget_tuple(cfg("t-share")) is not None


async def test_runstore_open_shares_one_engine(sqlite_url: str) -> None:
    import runstore

    async with runstore.open(
        checkpointer=sqlite_url, events=sqlite_url, streams="memory://"
    ) as stores:
        saver = stores.checkpointer
        while not isinstance(saver, SqliteSaver) and hasattr(saver, "inner"):
            saver = saver.inner
        assert isinstance(saver, SqliteSaver)
        assert saver.engine is getattr(stores.events, "engine", None)


async def test_synchronous_setting_is_applied(sqlite_url: str) -> None:
    url = BackendURL.parse(sqlite_url)
    for name, level in (("normal", 1), ("full", 2)):
        settings = Settings().merged({"sqlite": {"synchronous": name}})
        async with BackendOptions.scope(settings) as options:
            saver = await SqliteSaver.open(url, options)
            got = await saver._state.hop(lambda conn: conn.execute("PRAGMA synchronous").fetchone()[0])
            assert got == level
            mode = await saver._state.hop(lambda conn: conn.execute("PRAGMA journal_mode").fetchone()[0])
            assert mode == "wal"


# --------------------------------------------------------------------------- hops


async def test_each_operation_is_one_worker_thread_hop(opened: tuple[SqliteSaver, Any]) -> None:
    """Every async operation is a single call onto the aiosqlite thread (a hop costs ~60 us)."""
    saver, _ = opened
    ids = await put_chain(saver, "t-hops", [{"a": [0]}, {}, {}])
    with CountHops(saver) as hops:
        version = saver.get_next_version(None, None)
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"a": [9]}
        checkpoint["channel_versions"] = {"a": version}
        operations = [
            saver.aget_tuple(cfg("t-hops")),
            saver.aget_tuple(cfg("t-hops", ids[0])),
            saver.aput(cfg("t-hops", ids[-1]), checkpoint, {}, {"a": version}),
            saver.aput_writes(cfg("t-hops", ids[-1]), [("a", 1), ("__error__", "x")], "t2"),
            saver.aget_delta_channel_history(config=cfg("t-hops"), channels=["a", "b"]),
            saver.acopy_thread("t-hops", "t-hops2"),
            saver.aprune(["t-hops2"]),
            saver.adelete_for_runs(["nope"]),
            saver.adelete_thread("t-hops2"),
        ]
        for op in operations:
            hops.calls = 0
            await op
            assert hops.calls == 1
        hops.calls = 0
        assert len([t async for t in saver.alist(cfg("t-hops"), limit=3)]) == 3
        assert hops.calls == 1


# --------------------------------------------------------------------------- delta


async def test_native_delta_history_matches_base_walk_with_forks(
    opened: tuple[SqliteSaver, Any],
) -> None:
    saver, _ = opened
    graph = delta_graph(saver, frequency=3)
    config = {"configurable": {"thread_id": "t-fork"}}
    await run_turns(graph, config, 4)
    history = [s async for s in graph.aget_state_history(config)]
    fork_from = history[len(history) // 2].config
    forked = await graph.aupdate_state(
        fork_from, {"messages": [HumanMessage(content="fork", id="fork-1")]}
    )
    await graph.ainvoke(None, forked)
    await run_turns(graph, config, 2)
    async for snapshot in saver.alist(cfg("t-fork")):
        for channels in (["messages"], ["messages", "__start__", "agent", "nope"]):
            native = await saver.aget_delta_channel_history(
                config=snapshot.config, channels=channels
            )
            walked = await BaseCheckpointSaver.aget_delta_channel_history(
                saver, config=snapshot.config, channels=channels
            )
            assert native == walked, snapshot.config


async def test_prune_keep_latest_keeps_reconstruction(opened: tuple[SqliteSaver, Any]) -> None:
    saver, _ = opened
    graph = delta_graph(saver, frequency=4)
    config = {"configurable": {"thread_id": "t-prune"}}
    await run_turns(graph, config, 5)
    before = [m.content for m in (await graph.aget_state(config)).values["messages"]]
    total = len([t async for t in saver.alist(cfg("t-prune"))])
    await saver.aprune(["t-prune"])
    kept = len([t async for t in saver.alist(cfg("t-prune"))])
    assert 1 <= kept < total
    after = [m.content for m in (await graph.aget_state(config)).values["messages"]]
    assert after == before
    await run_turns(graph, config, 1)
    assert len((await graph.aget_state(config)).values["messages"]) == len(before) + 2
    await saver.aprune(["t-prune"], strategy="delete")
    assert await saver.aget_tuple(cfg("t-prune")) is None
    with pytest.raises(ValueError, match="keep_latest"):
        await saver.aprune(["t-prune"], strategy="bogus")


async def test_copy_thread_keeps_delta_state(opened: tuple[SqliteSaver, Any]) -> None:
    saver, _ = opened
    graph = delta_graph(saver, frequency=3)
    await run_turns(graph, {"configurable": {"thread_id": "t-src"}}, 4)
    await saver.acopy_thread("t-src", "t-dst")
    src = (await graph.aget_state({"configurable": {"thread_id": "t-src"}})).values["messages"]
    dst = (await graph.aget_state({"configurable": {"thread_id": "t-dst"}})).values["messages"]
    assert [m.content for m in dst] == [m.content for m in src]


async def test_list_filters_in_sql(opened: tuple[SqliteSaver, Any]) -> None:
    saver, _ = opened
    thread = "t-filter"
    version = None
    parent = None
    metas = [
        {"source": "input", "step": -1, "flag": True, "tags": {"b": 1, "a": [1, 2]}},
        {"source": "loop", "step": 0, "flag": False, "n": None},
        {"source": "loop", "step": 1, "flag": 1, "score": 1.5},
    ]
    ids = []
    for meta in metas:
        version = saver.get_next_version(version, None)
        checkpoint = empty_checkpoint()
        out = await saver.aput(cfg(thread, parent), checkpoint, meta, {})
        parent = out["configurable"]["checkpoint_id"]
        ids.append(parent)

    async def steps(**kw: Any) -> list[int]:
        return [t.metadata["step"] async for t in saver.alist(cfg(thread), **kw)]

    assert await steps(filter={"source": "loop"}) == [1, 0]
    assert await steps(filter={"step": 0}) == [0]
    assert await steps(filter={"flag": True}) == [-1]
    assert await steps(filter={"flag": 1}) == [1]
    assert await steps(filter={"tags": {"a": [1, 2], "b": 1}}) == [-1]
    assert await steps(filter={"n": None}) == [1, 0, -1]
    assert await steps(filter={"score": 1.5}) == [1]
    assert await steps(filter={"source": "loop", "step": 1}) == [1]
    assert await steps(filter={"missing": "x"}) == []
    assert await steps(before=cfg(thread, ids[2])) == [0, -1]
    assert await steps(before=cfg(thread, ids[2]), limit=1) == [0]
    assert await steps(limit=0) == []
    assert [t.metadata["step"] async for t in saver.alist(None, filter={"step": 0})] == [0]


async def test_many_checkpoints_page_through_list(opened: tuple[SqliteSaver, Any]) -> None:
    saver, _ = opened
    ids = await put_chain(saver, "t-page", [{} for _ in range(250)])
    listed = [t.config["configurable"]["checkpoint_id"] async for t in saver.alist(cfg("t-page"))]
    assert listed == list(reversed(ids))
    limited = [t async for t in saver.alist(cfg("t-page"), limit=150)]
    assert len(limited) == 150

    def sync_list() -> list[str]:
        return [t.config["configurable"]["checkpoint_id"] for t in saver.list(cfg("t-page"))]

    assert await asyncio.to_thread(sync_list) == list(reversed(ids))


async def test_concurrent_sync_and_async_writers(opened: tuple[SqliteSaver, Any]) -> None:
    saver, _ = opened
    errors: list[BaseException] = []

    def sync_writer() -> None:
        try:
            version = None
            parent = None
            for _ in range(30):
                version = saver.get_next_version(version, None)
                ck = empty_checkpoint()
                ck["channel_values"] = {"a": 1}
                ck["channel_versions"] = {"a": version}
                out = saver.put(cfg("t-sync-w", parent), ck, {}, {"a": version})
                parent = out["configurable"]["checkpoint_id"]
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=sync_writer)
    thread.start()
    await put_chain(saver, "t-async-w", [{"a": [i]} for i in range(30)])
    await asyncio.to_thread(thread.join)
    assert not errors
    assert len([t async for t in saver.alist(cfg("t-sync-w"))]) == 30
    assert len([t async for t in saver.alist(cfg("t-async-w"))]) == 30


def test_opening_requires_a_file() -> None:
    from runstore.errors import InvalidURLError

    async def main() -> None:
        async with BackendOptions.scope() as options:
            with pytest.raises(InvalidURLError):
                await SqliteSaver.open(BackendURL.parse("sqlite://"), options)
            with pytest.raises(InvalidURLError, match="unknown option"):
                await SqliteSaver.open(BackendURL.parse("sqlite:///x.db?foo=1"), options)

    asyncio.run(main())


def test_plain_ids_survive_path_with_spaces(tmp_path: Path) -> None:
    url = BackendURL.for_file("sqlite", tmp_path / "dir with space" / "a b.db")

    async def main() -> None:
        async with BackendOptions.scope() as options:
            saver = await SqliteSaver.open(url, options)
            await put_chain(saver, "t", [{"a": [1]}])
            assert await saver.aget_tuple(cfg("t")) is not None

    asyncio.run(main())


async def test_get_tuple_prefetches_delta_history_once(opened: tuple[SqliteSaver, Any]) -> None:
    """aget_tuple answers the delta history LangGraph asks for next in the same hop;
    a write in between (or a second ask) goes back to the database."""
    saver, _ = opened
    graph = delta_graph(saver, frequency=50)
    config = {"configurable": {"thread_id": "t-prefetch"}}
    await run_turns(graph, config, 3)
    head = await saver.aget_tuple(config)
    assert head is not None
    assert "messages" not in head.checkpoint["channel_values"]
    reference = await BaseCheckpointSaver.aget_delta_channel_history(
        saver, config=head.config, channels=["messages"]
    )
    with CountHops(saver) as hops:
        head = await saver.aget_tuple(config)
        assert head is not None and hops.calls == 1
        got = await saver.aget_delta_channel_history(config=head.config, channels=["messages"])
        assert hops.calls == 1, "prefetched history must not need a second hop"
        assert got == reference
        again = await saver.aget_delta_channel_history(config=head.config, channels=["messages"])
        assert hops.calls == 2 and again == reference

        # A write after the prefetch invalidates it.
        head = await saver.aget_tuple(config)
        assert head is not None and head.parent_config is not None
        await saver.aput_writes(
            head.parent_config, [("messages", [HumanMessage(content="late", id="late")])], "late"
        )
        hops.calls = 0
        fresh = await saver.aget_delta_channel_history(config=head.config, channels=["messages"])
        assert hops.calls == 1
        assert fresh != reference
        assert fresh == await BaseCheckpointSaver.aget_delta_channel_history(
            saver, config=head.config, channels=["messages"]
        )
        # A checkpoint loaded by id comes without its history: walking ancestors
        # one load at a time must not run one history query per load.
        hops.calls = 0
        by_id = await saver.aget_tuple(head.config)
        assert by_id is not None and hops.calls == 1
        assert await saver.aget_delta_channel_history(
            config=head.config, channels=["messages"]
        ) == fresh
        assert hops.calls == 2, "history of a checkpoint loaded by id is queried when asked for"


async def test_a_prefetched_history_survives_other_threads_writes(
    opened: tuple[SqliteSaver, Any],
) -> None:
    """Under many concurrent threads some other thread is almost always writing: only a
    write of the prefetched thread itself (or of no named thread) drops its history."""
    saver, _ = opened
    graph = delta_graph(saver, frequency=50)
    config = {"configurable": {"thread_id": "t-mine"}}
    await run_turns(graph, config, 3)
    await run_turns(graph, {"configurable": {"thread_id": "t-other"}}, 1)
    head = await saver.aget_tuple(config)
    assert head is not None
    reference = await BaseCheckpointSaver.aget_delta_channel_history(
        saver, config=head.config, channels=["messages"]
    )
    with CountHops(saver) as hops:
        head = await saver.aget_tuple(config)
        other = await saver.aget_tuple({"configurable": {"thread_id": "t-other"}})
        assert head is not None and other is not None
        await saver.aput_writes(
            other.config, [("messages", [HumanMessage(content="o", id="o")])], "other"
        )
        hops.calls = 0
        got = await saver.aget_delta_channel_history(config=head.config, channels=["messages"])
        assert hops.calls == 0, "another thread's write leaves the prefetched history usable"
        assert got == reference
        head = await saver.aget_tuple(config)
        assert head is not None
        await saver.aprune(["t-other"])  # names no single thread: counts for every thread
        hops.calls = 0
        again = await saver.aget_delta_channel_history(config=head.config, channels=["messages"])
        assert hops.calls == 1 and again == reference


async def test_a_long_delta_history_is_not_prefetched(opened: tuple[SqliteSaver, Any]) -> None:
    """Past PREFETCH_MAX_SUPERSTEPS since the snapshot, the head comes alone and the
    history is read when asked for (and still equals the base-class walk)."""
    saver, _ = opened
    ids = await put_chain(saver, "t-long", [{"a": ["seed"]}, {}, {}])
    head = empty_checkpoint()
    head["channel_versions"] = {"a": saver.get_next_version("9", None)}
    md = {"counters_since_delta_snapshot": {"a": [3, PREFETCH_MAX_SUPERSTEPS + 1]}}
    head_cfg = await saver.aput(cfg("t-long", ids[-1]), head, md, dict(head["channel_versions"]))
    expected = await BaseCheckpointSaver.aget_delta_channel_history(
        saver, config=head_cfg, channels=["a"]
    )
    assert expected["a"]["writes"]
    with CountHops(saver) as hops:
        got = await saver.aget_tuple(cfg("t-long"))
        assert got is not None and got.config == head_cfg
        history = await saver.aget_delta_channel_history(config=head_cfg, channels=["a"])
    assert history == expected
    assert hops.calls == 2, "a long history is read on its own"


async def test_values_are_exactly_what_was_put(opened: tuple[SqliteSaver, Any]) -> None:
    """A value not in new_versions is still stored; an absent value is never carried forward."""
    saver, _ = opened
    first = empty_checkpoint()
    first["channel_values"] = {"a": "A1", "b": "B1"}
    first["channel_versions"] = {"a": "1", "b": "1"}
    out1 = await saver.aput(cfg("t-exact"), first, {}, {"a": "1"})  # b not in new_versions
    second = empty_checkpoint()
    second["channel_values"] = {"b": "B1"}  # a absent at the same version
    second["channel_versions"] = {"a": "1", "b": "1"}
    out2 = await saver.aput(out1, second, {}, {})
    got1 = await saver.aget_tuple(out1)
    got2 = await saver.aget_tuple(out2)
    assert got1 is not None and got1.checkpoint["channel_values"] == {"a": "A1", "b": "B1"}
    assert got2 is not None and got2.checkpoint["channel_values"] == {"b": "B1"}


async def test_concurrent_writes_group_commit(opened: tuple[SqliteSaver, Any]) -> None:
    """Writes that overlap share one hop and one transaction; a failing op undoes only itself."""
    saver, _ = opened

    def failing(conn: sqlite3.Connection) -> None:
        conn.execute(
            "INSERT INTO runstore_checkpoint_writes VALUES "
            "('t-group', '', 'x', 'doomed', 0, '', 'a', 'json', X'00')"
        )
        raise RuntimeError("op failed on purpose")

    with CountHops(saver) as hops:
        checkpoints = []
        for i in range(6):
            version = saver.get_next_version(None, None)
            checkpoint = empty_checkpoint()
            checkpoint["channel_values"] = {"a": i}
            checkpoint["channel_versions"] = {"a": version}
            checkpoints.append((checkpoint, version))
        results = await asyncio.gather(
            *(
                saver.aput(cfg(f"t-group-{i}"), ck, {"i": i}, {"a": v})
                for i, (ck, v) in enumerate(checkpoints[:3])
            ),
            saver._write(failing),
            *(
                saver.aput(cfg(f"t-group-{i}"), ck, {"i": i}, {"a": v})
                for i, (ck, v) in enumerate(checkpoints[3:], start=3)
            ),
            return_exceptions=True,
        )
    assert isinstance(results[3], RuntimeError)
    assert hops.calls < 7, "overlapping writes must share hops"
    for i in range(6):
        got = await saver.aget_tuple(cfg(f"t-group-{i}"))
        assert got is not None and got.checkpoint["channel_values"] == {"a": i}
    leftover = await saver._state.hop(
        lambda conn: conn.execute(
            "SELECT count(*) FROM runstore_checkpoint_writes WHERE task_id = 'doomed'"
        ).fetchone()[0]
    )
    assert leftover == 0


async def test_a_lone_write_fails_alone(opened: tuple[SqliteSaver, Any]) -> None:
    """A write with no company still runs in a transaction of its own: its error is its
    own and it leaves nothing behind."""
    saver, _ = opened

    def failing(conn: sqlite3.Connection) -> None:
        conn.execute(
            "INSERT INTO runstore_checkpoint_writes VALUES "
            "('t-lone', '', 'x', 'doomed', 0, '', 'a', 'json', X'00')"
        )
        raise RuntimeError("lone op failed on purpose")

    with pytest.raises(RuntimeError, match="lone op failed"):
        await saver._write(failing)
    count_doomed = "SELECT count(*) FROM runstore_checkpoint_writes WHERE task_id = 'doomed'"
    assert await saver._state.hop(lambda conn: conn.execute(count_doomed).fetchone()[0]) == 0
    assert not await file_writer(saver).run(lambda conn: conn.in_transaction)


async def test_cancelled_writers_leave_all_or_nothing(opened: tuple[SqliteSaver, Any]) -> None:
    """A caller cancelled while its op runs in a batch does not stop the batch (its op
    commits with the others); one cancelled while its op is still queued withdraws it."""
    saver, _ = opened
    release = threading.Event()
    # Hold the writer's thread so the writes below queue deterministically.
    blocker = asyncio.ensure_future(file_writer(saver).run(lambda conn: release.wait(10)))

    def checkpoint(value: str) -> tuple[Any, str]:
        ck = empty_checkpoint()
        version = saver.get_next_version(None, None)
        ck["channel_values"] = {"a": value}
        ck["channel_versions"] = {"a": version}
        return ck, version

    running_ck, v1 = checkpoint("running")
    running = asyncio.ensure_future(saver.aput(cfg("t-cx-run"), running_ck, {}, {"a": v1}))
    company_ck, v2 = checkpoint("company")
    company = asyncio.ensure_future(saver.aput(cfg("t-cx-company"), company_ck, {}, {"a": v2}))
    await asyncio.sleep(0.05)  # both taken into one batch, waiting behind the blocker
    assert not saver._state.file.queue._queue, "both ops were taken into the running batch"
    queued_ck, v3 = checkpoint("queued")
    queued = asyncio.ensure_future(saver.aput(cfg("t-cx-queued"), queued_ck, {}, {"a": v3}))
    await asyncio.sleep(0.05)
    running.cancel()
    queued.cancel()
    release.set()
    await blocker
    for task in (running, queued):
        with pytest.raises(asyncio.CancelledError):
            await task
    await asyncio.wait_for(company, 10)
    await saver._state.file.queue.wait_idle()
    got = await saver.aget_tuple(cfg("t-cx-run"))
    assert got is not None and got.checkpoint["channel_values"] == {"a": "running"}
    assert await saver.aget_tuple(cfg("t-cx-queued")) is None, "a withdrawn op never runs"
    got = await saver.aget_tuple(cfg("t-cx-company"))
    assert got is not None and got.checkpoint["channel_values"] == {"a": "company"}
    assert not await file_writer(saver).run(lambda conn: conn.in_transaction)


async def test_allowlist_clone_shares_connection_state(opened: tuple[SqliteSaver, Any]) -> None:
    """LangGraph may compile graphs with `with_allowlist` copies; they share one queue."""
    saver, _ = opened
    clone = saver.with_allowlist([("tests", "Thing")])
    assert isinstance(clone, SqliteSaver)
    assert clone._state is saver._state
    await asyncio.gather(
        put_chain(saver, "t-orig", [{"a": [i]} for i in range(5)]),
        put_chain(clone, "t-clone", [{"a": [i]} for i in range(5)]),
    )
    await put_chain(saver, "t-orig2", [{"a": [0]}])
    for thread in ("t-orig", "t-clone"):
        listed = [t async for t in saver.alist(cfg(thread))]
        assert len(listed) == 5
        assert listed[0].pending_writes == [("task", "a", "w4")]


async def test_delta_history_stops_on_a_parent_cycle(opened: tuple[SqliteSaver, Any]) -> None:
    """Re-putting a checkpoint under its own id (a parent cycle) must not spin the walk."""
    saver, _ = opened
    checkpoint = empty_checkpoint()
    out = await saver.aput(cfg("t-cycle", checkpoint["id"]), checkpoint, {}, {})
    history = await asyncio.wait_for(
        saver.aget_delta_channel_history(config=out, channels=["a"]), timeout=30
    )
    assert history == {"a": {"writes": []}}


async def test_prune_keeps_no_ancestor_for_an_unwritten_delta_channel(
    opened: tuple[SqliteSaver, Any],
) -> None:
    """A delta channel the counters name but the checkpoint has no version of was never
    written: rebuilding it reads nothing, so keep_latest keeps the head alone (the rule
    the other savers apply; checking only "holds no value" kept the whole chain)."""
    saver, _ = opened
    ids = await put_chain(saver, "t-unwritten", [{"a": [0]}, {"a": [1]}])
    head = empty_checkpoint()
    head["channel_values"] = {"a": [2]}
    head["channel_versions"] = {"a": saver.get_next_version("5", None)}
    md = {"counters_since_delta_snapshot": {"never_written": [2, 2]}}
    out = await saver.aput(cfg("t-unwritten", ids[-1]), head, md, dict(head["channel_versions"]))
    await saver.aprune(["t-unwritten"])
    kept = [t.config["configurable"]["checkpoint_id"] async for t in saver.alist(cfg("t-unwritten"))]
    assert kept == [out["configurable"]["checkpoint_id"]]


async def test_close_commits_writes_already_queued(sqlite_url: str) -> None:
    """aclose waits for queued writes (they commit); calls after it raise."""
    url = BackendURL.parse(sqlite_url)
    async with BackendOptions.scope() as options:
        saver = await SqliteSaver.open(url, options)
        release = threading.Event()
        blocker = asyncio.ensure_future(file_writer(saver).run(lambda conn: release.wait(10)))
        running = asyncio.ensure_future(saver.aput(cfg("t-close-1"), empty_checkpoint(), {}, {}))
        await asyncio.sleep(0.05)  # taken into a batch, waiting behind the blocker
        checkpoint = empty_checkpoint()
        queued = asyncio.ensure_future(saver.aput(cfg("t-close"), checkpoint, {}, {}))
        await asyncio.sleep(0.05)
        assert saver._state.file.queue._queue, "the second write waits in the queue"
        closing = asyncio.ensure_future(saver.aclose())
        await asyncio.sleep(0.05)
        release.set()
        await blocker
        await asyncio.gather(running, queued, closing)
        with pytest.raises(RuntimeError, match="closed"):
            await saver.aget_tuple(cfg("t-close"))
    async with BackendOptions.scope() as options:
        reopened = await SqliteSaver.open(url, options)
        got = await reopened.aget_tuple(cfg("t-close"))
        assert got is not None and got.checkpoint["id"] == checkpoint["id"]


def _pages_written(conn: sqlite3.Connection, statement: str, params: dict[str, Any]) -> int:
    """The pages one commit of ``statement`` adds to the WAL (which starts empty)."""
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("BEGIN IMMEDIATE")
    assert conn.execute(statement, params).rowcount == 1
    conn.execute("COMMIT")
    frames: int = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1]
    return frames


async def test_ordinary_pending_writes_leave_the_status_index_alone(sqlite_url: str) -> None:
    # SQLite rewrites the entries of every index over a column its UPDATE names, changed or
    # not: the record update of writes that cannot change the status must not name it, and
    # then commits one page fewer (the status index's).
    async with BackendOptions.scope() as options:
        saver = await SqliteSaver.open(BackendURL.parse(sqlite_url), options)
        await saver.aput(cfg("t"), empty_checkpoint(), {}, {})
    path = BackendURL.parse(sqlite_url).file_path()
    assert path is not None
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        params = {"thread_id": "t", "ns": "", "checkpoint_id": "x", "now": 1, "added": 1,
                  "bytes": 1, "status": "idle"}  # fmt: skip
        with_status = _pages_written(conn, sql.WRITES_THREAD_STATUS, params)
        without = _pages_written(conn, sql.WRITES_THREAD, params)
        assert without == with_status - 1, (without, with_status)
    finally:
        conn.close()
