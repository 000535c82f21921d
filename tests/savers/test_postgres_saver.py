"""PostgreSQL-specific tests of `PostgresSaver` (the shared contract lives in the conformance suite)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
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

from runstore.checkpoint.codec import BLOBS, CHECKPOINTS, WRITES
from runstore.checkpoint.modes import get_thread_state_schema
from runstore.checkpoint.rules import PREFETCH_MAX_SUPERSTEPS
from runstore.errors import SyncCallOnEventLoopError
from runstore.options import BackendOptions
from runstore.plugins.postgres.connections import run_statement_batch
from runstore.plugins.postgres.saver import COMPONENT, SCHEMA_MIGRATIONS, PostgresSaver
from runstore.settings import Settings
from runstore.urls import BackendURL

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
async def opened(postgres_url: str) -> AsyncIterator[PostgresSaver]:
    async with BackendOptions.scope() as options:
        yield await PostgresSaver.open(BackendURL.parse(postgres_url), options)


def cfg(thread: str, checkpoint_id: str | None = None, ns: str = "") -> dict[str, Any]:
    configurable: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ns}
    if checkpoint_id:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


async def put_chain(
    saver: PostgresSaver,
    thread: str,
    values: list[dict[str, Any]],
    run_id: str = "run",
    parent: str | None = None,
) -> list[str]:
    """Put a linear chain; ``values[i]`` is checkpoint i's channel_values (channel ``a``)."""
    ids: list[str] = []
    version: str | None = None
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


async def raw_conn(url: str) -> Any:
    import asyncpg

    parsed = BackendURL.parse(url)
    conn = await asyncpg.connect(parsed.without_query("schema").render(hide_password=False))
    schema = parsed.option("schema")
    if schema:
        await conn.execute(f'SET search_path TO "{schema}"')
    return conn


def delta_graph(saver: Any, frequency: int = 3) -> Any:
    schema = get_thread_state_schema("delta", frequency)

    async def agent(state: dict[str, Any]) -> dict[str, Any]:
        last = state["messages"][-1]
        return {"messages": [AIMessage(content=f"re: {last.content}", id=f"ai-{last.id}")]}

    builder = StateGraph(schema)
    builder.add_node("agent", agent)
    builder.add_edge(START, "agent")
    return builder.compile(checkpointer=saver)


async def run_turns(graph: Any, thread: str, turns: range) -> list[Any]:
    config = {"configurable": {"thread_id": thread}}
    for i in turns:
        await graph.ainvoke(
            {"messages": [HumanMessage(content=f"hi {i}", id=f"h{i}")]},
            {**config, "metadata": {"run_id": f"run-{i}"}},
        )
    state = await graph.aget_state(config)
    return [(m.type, m.id, m.content) for m in state.values["messages"]]


# --------------------------------------------------------------------------- sync twins


async def test_sync_twins_on_the_loop_thread_raise(opened: PostgresSaver) -> None:
    saver = opened
    calls: list[Any] = [
        lambda: saver.get_tuple(cfg("t")),
        lambda: saver.list(cfg("t")),
        lambda: saver.put(cfg("t"), empty_checkpoint(), {}, {}),
        lambda: saver.put_writes(cfg("t", "x"), [("a", 1)], "task"),
        lambda: saver.delete_thread("t"),
        lambda: saver.delete_for_runs(["r"]),
        lambda: saver.copy_thread("t", "u"),
        lambda: saver.prune(["t"]),
        lambda: saver.get_delta_channel_history(config=cfg("t"), channels=["a"]),
    ]
    for call in calls:
        with pytest.raises(SyncCallOnEventLoopError, match="event loop"):
            call()


async def test_sync_api_from_another_thread(opened: PostgresSaver) -> None:
    saver = opened

    def work() -> dict[str, Any]:
        version = saver.get_next_version(None, None)
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"a": ["seed"]}
        checkpoint["channel_versions"] = {"a": version}
        out = saver.put(cfg("t-sync"), checkpoint, {"step": 1, "run_id": "r-sync"}, {"a": version})
        saver.put_writes(out, [("a", "w"), ("b", "x")], "task", "p")
        got = saver.get_tuple(cfg("t-sync"))
        listed = list(saver.list(cfg("t-sync"), filter={"step": 1}))
        child = empty_checkpoint()
        child["channel_versions"] = {"a": saver.get_next_version(version, None)}
        # LangGraph names the delta channels in these counters; prune and delete_for_runs
        # keep what rebuilding them needs.
        delta_md = {"step": 2, "counters_since_delta_snapshot": {"a": [1, 1]}}
        child_cfg = saver.put(out, child, delta_md, dict(child["channel_versions"]))
        history = saver.get_delta_channel_history(config=child_cfg, channels=["a"])
        saver.copy_thread("t-sync", "t-sync-copy")
        copied = len(list(saver.list(cfg("t-sync-copy"))))
        saver.prune(["t-sync-copy"], strategy="keep_latest")
        pruned = len(list(saver.list(cfg("t-sync-copy"))))
        saver.delete_for_runs(["r-sync"])
        after_runs = len(list(saver.list(cfg("t-sync"))))
        saver.delete_thread("t-sync")
        return {
            "got": got,
            "listed": listed,
            "history": history,
            "copied": copied,
            "pruned": pruned,
            "after_runs": after_runs,
            "gone": saver.get_tuple(cfg("t-sync")),
        }

    result = await asyncio.to_thread(work)
    got = result["got"]
    assert got is not None and got.checkpoint["channel_values"] == {"a": ["seed"]}
    assert got.pending_writes == [("task", "a", "w"), ("task", "b", "x")]
    assert [t.metadata["step"] for t in result["listed"]] == [1]
    assert result["history"] == {"a": {"writes": [("task", "a", "w")], "seed": ["seed"]}}
    assert result["copied"] == 2
    # The head holds no value of "a": its parent (the seed) must survive the prune.
    assert result["pruned"] == 2
    # The run's checkpoint is the seed its successor rebuilds "a" from: it stays.
    assert result["after_runs"] == 2
    assert result["gone"] is None


# --------------------------------------------------------------------------- durability, schema


async def test_reopen_keeps_everything(postgres_url: str) -> None:
    url = BackendURL.parse(postgres_url)
    async with BackendOptions.scope() as options:
        saver = await PostgresSaver.open(url, options)
        ids = await put_chain(saver, "t-reopen", [{"a": [0]}, {}, {}])
    async with BackendOptions.scope() as options:
        saver = await PostgresSaver.open(url, options)
        listed = [t async for t in saver.alist(cfg("t-reopen"))]
        assert [t.config["configurable"]["checkpoint_id"] for t in listed] == ids[::-1]
        assert [
            t.parent_config and t.parent_config["configurable"]["checkpoint_id"] for t in listed
        ] == [
            ids[1],
            ids[0],
            None,
        ]
        history = await saver.aget_delta_channel_history(config=cfg("t-reopen"), channels=["a"])
        assert history == {"a": {"writes": [("task", "a", "w0"), ("task", "a", "w1")], "seed": [0]}}


async def test_real_graph_survives_reopen_in_delta_mode(postgres_url: str) -> None:
    url = BackendURL.parse(postgres_url)
    async with BackendOptions.scope() as options:
        saver = await PostgresSaver.open(url, options)
        before = await run_turns(delta_graph(saver), "t-graph", range(7))
    assert len(before) == 14
    async with BackendOptions.scope() as options:
        saver = await PostgresSaver.open(url, options)
        graph = delta_graph(saver)
        state = await graph.aget_state({"configurable": {"thread_id": "t-graph"}})
        assert [(m.type, m.id, m.content) for m in state.values["messages"]] == before
        after = await run_turns(graph, "t-graph", range(7, 9))
        assert after[:14] == before and len(after) == 18


async def test_schema_option_holds_the_tables_and_version(postgres_url: str) -> None:
    async with BackendOptions.scope() as options:
        await PostgresSaver.open(BackendURL.parse(postgres_url), options)
    schema = BackendURL.parse(postgres_url).option("schema")
    conn = await raw_conn(postgres_url)
    try:
        tables = {
            r[0]
            for r in await conn.fetch(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = $1", schema
            )
        }
        version = await conn.fetchval(
            "SELECT version FROM runstore_schema_versions WHERE component = $1", COMPONENT
        )
    finally:
        await conn.close()
    assert {CHECKPOINTS, BLOBS, WRITES} <= tables
    assert version == len(SCHEMA_MIGRATIONS)


async def test_missing_schema_is_created(postgres_url: str) -> None:
    base = BackendURL.parse(postgres_url)
    schema = f"rs_new_{uuid.uuid4().hex[:10]}"
    url = base.with_query(schema=schema)
    try:
        async with BackendOptions.scope() as options:
            saver = await PostgresSaver.open(url, options)
            await put_chain(saver, "t", [{"a": [1]}])
        conn = await raw_conn(url.render(hide_password=False))
        try:
            count = await conn.fetchval(f"SELECT count(*) FROM {CHECKPOINTS}")
        finally:
            await conn.close()
        assert count == 1
    finally:
        conn = await raw_conn(base.without_query("schema").render(hide_password=False))
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()


def test_unknown_url_option_is_rejected(postgres_url: str) -> None:
    from runstore.errors import InvalidURLError

    url = BackendURL.parse(postgres_url).with_query(bogus="1")

    async def go() -> None:
        async with BackendOptions.scope() as options:
            await PostgresSaver.open(url, options)

    with pytest.raises(InvalidURLError, match="bogus"):
        asyncio.run(go())


# --------------------------------------------------------------------------- processes

_WORKER = textwrap.dedent(
    """
    import asyncio, json, sys
    from langgraph.checkpoint.base import empty_checkpoint
    from runstore.options import BackendOptions
    from runstore.plugins.postgres.saver import PostgresSaver
    from runstore.urls import BackendURL

    async def main(url, thread, name, count):
        async with BackendOptions.scope() as options:
            saver = await PostgresSaver.open(BackendURL.parse(url), options)
            parent = None
            for i in range(count):
                cp = empty_checkpoint()
                cp["channel_values"] = {name: [i]}
                cp["channel_versions"] = {name: f"{i + 1:032}.0"}
                cfg = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
                if parent:
                    cfg["configurable"]["checkpoint_id"] = parent
                out = await saver.aput(cfg, cp, {"writer": name, "i": i}, {name: f"{i + 1:032}.0"})
                await saver.aput_writes(out, [(name, f"{name}-{i}")], f"task-{name}")
                parent = out["configurable"]["checkpoint_id"]
        print(json.dumps({"ok": True}))

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
    """
)


def _spawn(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", _WORKER, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )


def test_concurrent_migrations_and_writers_from_two_processes(postgres_url: str) -> None:
    """Two processes open the same fresh schema at once (both migrate) and write one thread."""
    procs = [_spawn(postgres_url, "t-shared", name, "15") for name in ("a", "b")]
    outs = [p.communicate(timeout=180) for p in procs]
    for proc, (out, err) in zip(procs, outs, strict=True):
        assert proc.returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1]) == {"ok": True}

    async def check() -> None:
        async with BackendOptions.scope() as options:
            saver = await PostgresSaver.open(BackendURL.parse(postgres_url), options)
            listed = [t async for t in saver.alist(cfg("t-shared"))]
            assert len(listed) == 30
            for name in ("a", "b"):
                mine = [t for t in listed if t.metadata["writer"] == name]
                assert sorted(t.metadata["i"] for t in mine) == list(range(15))
                for t in mine:
                    i = t.metadata["i"]
                    assert t.checkpoint["channel_values"] == {name: [i]}
                    assert t.pending_writes == [(f"task-{name}", name, f"{name}-{i}")]
        conn = await raw_conn(postgres_url)
        try:
            rows = await conn.fetch(
                "SELECT version FROM runstore_schema_versions WHERE component = $1", COMPONENT
            )
        finally:
            await conn.close()
        assert [r[0] for r in rows] == [len(SCHEMA_MIGRATIONS)]

    asyncio.run(check())


def test_missing_driver_names_the_extra(postgres_url: str) -> None:
    """Without asyncpg, importing the plugin works and opening names the extra to install."""
    script = textwrap.dedent(
        """
        import asyncio, sys
        sys.modules["asyncpg"] = None  # hide the driver: `import asyncpg` raises ImportError
        import runstore.plugins.postgres
        import runstore.plugins.postgres.saver as saver_mod
        from runstore.errors import MissingDriverError
        from runstore.options import BackendOptions
        from runstore.urls import BackendURL

        async def main():
            async with BackendOptions.scope() as options:
                await saver_mod.PostgresSaver.open(BackendURL.parse(sys.argv[1]), options)

        try:
            asyncio.run(main())
        except MissingDriverError as exc:
            print("MISSING:", exc)
        else:
            print("opened?!")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, postgres_url],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    assert "MISSING:" in proc.stdout, proc.stdout + proc.stderr
    assert "pip install 'runstore[postgres]'" in proc.stdout
    assert "asyncpg" in proc.stdout


# --------------------------------------------------------------------------- serde, sharing


class _XorCipher:
    def __init__(self, key: bytes) -> None:
        self.key = key

    def _xor(self, data: bytes) -> bytes:
        return bytes(b ^ self.key[i % len(self.key)] for i, b in enumerate(data))

    def encrypt(self, plaintext: bytes) -> tuple[str, bytes]:
        return "xor", self._xor(plaintext)

    def decrypt(self, ciphername: str, ciphertext: bytes) -> bytes:
        assert ciphername == "xor"
        return self._xor(ciphertext)


async def test_encrypted_serde_round_trip(postgres_url: str) -> None:
    serde = EncryptedSerializer(_XorCipher(b"k3y!"), JsonPlusSerializer())
    secret = "top-secret-value-" + uuid.uuid4().hex
    async with BackendOptions.scope() as options:
        saver = await PostgresSaver.open(BackendURL.parse(postgres_url), options, serde=serde)
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
        child = empty_checkpoint()
        child["channel_versions"] = {"a": saver.get_next_version(version, None)}
        child_cfg = await saver.aput(out, child, {}, dict(child["channel_versions"]))
        history = await saver.aget_delta_channel_history(config=child_cfg, channels=["a"])
        assert history == {"a": {"writes": [("task", "a", secret + "-write")], "seed": [secret]}}
    conn = await raw_conn(postgres_url)
    try:
        types = {r[0] for r in await conn.fetch(f"SELECT type FROM {BLOBS}")}
        types |= {r[0] for r in await conn.fetch(f"SELECT type FROM {WRITES}")}
        stored = b"".join(r[0] for r in await conn.fetch(f"SELECT blob FROM {BLOBS}"))
        stored += b"".join(r[0] for r in await conn.fetch(f"SELECT blob FROM {WRITES}"))
    finally:
        await conn.close()
    assert types and all("+xor" in t for t in types), types
    assert secret.encode() not in stored


async def test_shares_engine_with_event_store(postgres_url: str) -> None:
    from runstore.plugins.postgres.events import PostgresEventStore

    url = BackendURL.parse(postgres_url)
    settings = Settings().merged({"postgres": {"pool_max_size": 2}})
    async with BackendOptions.scope(settings) as options:
        saver = await PostgresSaver.open(url, options)
        store = await PostgresEventStore.open(url, options)
        assert saver.engine is store.engine
        # Connections the saver keeps leased never starve the event store of the shared pool.
        await asyncio.gather(*(put_chain(saver, f"t-pool-{i}", [{"a": [i]}]) for i in range(6)))
        async with store.engine.connect() as conn:
            assert (await conn.exec_driver_sql("SELECT 1")).scalar() == 1
        assert (await saver.aget_tuple(cfg("t-pool-5"))) is not None


async def test_runstore_open_shares_one_engine(postgres_url: str) -> None:
    import runstore
    from runstore.checkpoint.modes import reset_checkpoint_mode_for_tests

    reset_checkpoint_mode_for_tests()
    try:
        async with runstore.open(
            checkpointer=postgres_url, events=postgres_url, streams="memory://"
        ) as stores:
            saver = stores.checkpointer
            while not isinstance(saver, PostgresSaver) and hasattr(saver, "inner"):
                saver = saver.inner
            assert isinstance(saver, PostgresSaver)
            assert saver.engine is getattr(stores.events, "engine", None)
    finally:
        reset_checkpoint_mode_for_tests()


# --------------------------------------------------------------------------- behaviour


async def test_dead_leased_connection_is_replaced(opened: PostgresSaver) -> None:
    saver = opened
    await put_chain(saver, "t-dead", [{"a": [1]}])
    pids = [lease.conn.get_server_pid() for lease in saver._leases._idle]
    assert pids, "the saver keeps a connection leased between calls"
    conn = await raw_conn(str(saver.url.render(hide_password=False)))
    try:
        for pid in pids:
            await conn.execute("SELECT pg_terminate_backend($1)", pid)
    finally:
        await conn.close()
    await asyncio.sleep(0.2)
    got = await saver.aget_tuple(cfg("t-dead"))
    assert got is not None and got.checkpoint["channel_values"] == {"a": [1]}


async def test_concurrent_writes_are_batched_and_all_committed(opened: PostgresSaver) -> None:
    saver = opened
    ids = await put_chain(saver, "t-batch", [{"a": [0]}])

    async def one(i: int) -> None:
        await saver.aput_writes(
            cfg("t-batch", ids[0]), [("a", i), ("__error__", f"e{i}")], f"task-{i}"
        )

    await asyncio.gather(*(one(i) for i in range(40)))
    got = await saver.aget_tuple(cfg("t-batch", ids[0]))
    assert got is not None
    writes = got.pending_writes or []
    assert len(writes) == 1 + 80
    assert ("task-7", "a", 7) in writes and ("task-7", "__error__", "e7") in writes


async def test_failing_write_in_a_batch_fails_alone(opened: PostgresSaver) -> None:
    saver = opened
    ids = await put_chain(saver, "t-batch-err", [{"a": [0]}])

    async def good(i: int) -> None:
        await saver.aput_writes(cfg("t-batch-err", ids[0]), [("a", i)], f"ok-{i}")

    async def bad() -> None:
        # A statement the server rejects, in the same batch as the good ones.
        await saver._commits.submit(("SELECT 1 / $1", (0,)))

    results = await asyncio.gather(
        *(good(i) for i in range(5)),
        bad(),
        *(good(i) for i in range(5, 10)),
        return_exceptions=True,
    )
    errors = [r for r in results if isinstance(r, BaseException)]
    assert len(errors) == 1
    got = await saver.aget_tuple(cfg("t-batch-err", ids[0]))
    assert got is not None
    assert {w[0] for w in got.pending_writes or []} == {"task"} | {f"ok-{i}" for i in range(10)}


async def test_a_write_batch_holds_one_statement_kind(opened: PostgresSaver) -> None:
    saver = opened
    ids = await put_chain(saver, "t-kinds", [{"a": [0]}])
    batches: list[tuple[int, set[str]]] = []
    run_batch = saver._commits._run_batch

    async def recorded(ops: list[Any]) -> Any:
        batches.append((len(ops), {statement for statement, _ in ops}))
        return await run_batch(ops)

    saver._commits._run_batch = recorded  # type: ignore[method-assign]
    # Puts and pending writes in flight together, as LangGraph sends a step's saves.
    await asyncio.gather(
        *(put_chain(saver, f"t-kinds-{i}", [{"a": [i]}]) for i in range(8)),
        *(saver.aput_writes(cfg("t-kinds", ids[0]), [("a", i)], f"task-{i}") for i in range(8)),
    )
    assert all(len(kinds) == 1 for _, kinds in batches), "one statement kind per batch"
    assert max(size for size, _ in batches) > 1, "concurrent writes still share a batch"
    got = await saver.aget_tuple(cfg("t-kinds", ids[0]))
    assert got is not None and len(got.pending_writes or []) == 1 + 8
    for i in range(8):
        tup = await saver.aget_tuple(cfg(f"t-kinds-{i}"))
        assert tup is not None and tup.checkpoint["channel_values"] == {"a": [i]}


async def test_a_mixed_statement_batch_commits_each_kind_and_fails_only_the_bad_one(
    opened: PostgresSaver,
) -> None:
    leases = opened._leases
    table = f"batch_probe_{uuid.uuid4().hex[:8]}"

    async def ddl(conn: Any) -> None:
        await conn.execute(f"CREATE TABLE {table} (k int PRIMARY KEY)")

    await leases.run(ddl, operation="test", write=True)
    insert = f"INSERT INTO {table} VALUES ($1)"
    other = f"INSERT INTO {table} (k) SELECT $1::int"
    try:
        outcomes = await run_statement_batch(
            leases,
            [(insert, (1,)), ("SELECT 1 / $1", (0,)), (other, (3,)), (insert, (2,)),
             (insert, (1,)), (other, (4,))],
        )

        async def keys(conn: Any) -> list[int]:
            return [r[0] for r in await conn.fetch(f"SELECT k FROM {table} ORDER BY k")]

        assert [ok for ok, _ in outcomes] == [True, False, True, True, False, True]
        assert isinstance(outcomes[1][1], Exception) and isinstance(outcomes[4][1], Exception)
        assert await leases.run(keys, operation="test") == [1, 2, 3, 4]
    finally:

        async def drop(conn: Any) -> None:
            await conn.execute(f"DROP TABLE {table}")

        await leases.run(drop, operation="test", write=True)


async def test_native_delta_history_matches_base_walk_with_forks(opened: PostgresSaver) -> None:
    saver = opened
    trunk = await put_chain(saver, "t-fork", [{"a": ["seed"]}] + [{}] * 30)
    left = await put_chain(saver, "t-fork", [{}] * 5, parent=trunk[10])
    right = await put_chain(saver, "t-fork", [{}] * 5, parent=trunk[10])
    for target in (trunk[-1], left[-1], right[-1], trunk[0], trunk[1]):
        config = cfg("t-fork", target)
        native = await saver.aget_delta_channel_history(config=config, channels=["a", "zz"])
        walked = await BaseCheckpointSaver.aget_delta_channel_history(
            saver, config=config, channels=["a", "zz"]
        )
        assert native == walked
    history = await saver.aget_delta_channel_history(config=cfg("t-fork", left[-1]), channels=["a"])
    # seed at trunk[0]; trunk writes w0..w10, then the left fork's own w0..w3.
    assert len(history["a"]["writes"]) == 11 + 4


async def test_prune_and_delete_for_runs_keep_real_graph_state(opened: PostgresSaver) -> None:
    saver = opened
    graph = delta_graph(saver, frequency=4)
    before = await run_turns(graph, "t-prune", range(6))
    await saver.acopy_thread("t-prune", "t-prune-copy")
    await saver.aprune(["t-prune"], strategy="keep_latest")
    kept = [t async for t in saver.alist(cfg("t-prune"))]
    assert 1 <= len(kept) < 18
    state = await graph.aget_state({"configurable": {"thread_id": "t-prune"}})
    assert [(m.type, m.id, m.content) for m in state.values["messages"]] == before
    copy_state = await graph.aget_state({"configurable": {"thread_id": "t-prune-copy"}})
    assert [(m.type, m.id, m.content) for m in copy_state.values["messages"]] == before
    # A middle run's checkpoints are what later runs rebuild their messages from (the
    # last snapshot before run-3 is run-2's input): deleting run-2 keeps them.
    await saver.adelete_for_runs(["run-2"])
    copy_state = await graph.aget_state({"configurable": {"thread_id": "t-prune-copy"}})
    assert [(m.type, m.id, m.content) for m in copy_state.values["messages"]] == before
    # Nothing rebuilds from the last run: deleting it removes all of its checkpoints.
    await saver.adelete_for_runs(["run-5"])
    runs = [t.metadata.get("run_id") async for t in saver.alist(cfg("t-prune-copy"))]
    assert "run-5" not in runs and runs.count("run-4") == 3
    copy_state = await graph.aget_state({"configurable": {"thread_id": "t-prune-copy"}})
    assert [(m.type, m.id, m.content) for m in copy_state.values["messages"]] == before[:10]
    # Heads at other points of the snapshot cycle keep their reconstruction too.
    for turns in (5, 7):
        thread = f"t-prune-{turns}"
        expected = await run_turns(graph, thread, range(turns))
        await saver.aprune([thread], strategy="keep_latest")
        state = await graph.aget_state({"configurable": {"thread_id": thread}})
        assert [(m.type, m.id, m.content) for m in state.values["messages"]] == expected
    await saver.aprune(["t-prune"], strategy="delete")
    assert await saver.aget_tuple(cfg("t-prune")) is None


async def test_metadata_filters_tolerate_mixed_types(opened: PostgresSaver) -> None:
    saver = opened
    for i, step in enumerate([1, "1", 1.0, None, True]):
        checkpoint = empty_checkpoint()
        await saver.aput(cfg("t-filter"), checkpoint, {"step": step, "i": i}, {})
    listed = [t async for t in saver.alist(cfg("t-filter"), filter={"step": 1})]
    # 1 == 1.0 numerically; "1" is a string and True a boolean (never 1).
    assert sorted(t.metadata["i"] for t in listed) == [0, 2]
    assert [t async for t in saver.alist(cfg("t-filter"), filter={"step": float("nan")})] == []
    listed = [t async for t in saver.alist(cfg("t-filter"), filter={"step": "1"})]
    assert [t.metadata["i"] for t in listed] == [1]
    listed = [t async for t in saver.alist(None, filter={"step": None, "i": 3})]
    assert [t.metadata["i"] for t in listed] == [3]


async def test_schema_upgrades_from_version_1(postgres_url: str) -> None:
    from runstore.plugins.postgres.engine import shared_engine
    from runstore.sql.migrations import ensure_schema

    url = BackendURL.parse(postgres_url)
    async with BackendOptions.scope() as options:
        engine = await shared_engine(url, options)
        assert await ensure_schema(engine, COMPONENT, SCHEMA_MIGRATIONS[:1]) == 1
        saver = await PostgresSaver.open(url, options)
        await put_chain(saver, "t-up", [{"a": [1]}])
    conn = await raw_conn(postgres_url)
    try:
        version = await conn.fetchval(
            "SELECT version FROM runstore_schema_versions WHERE component = $1", COMPONENT
        )
        lz4 = await conn.fetchval(
            "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"
        )
        compression = await conn.fetchval(
            "SELECT attcompression FROM pg_attribute WHERE attrelid = $1::regclass"
            " AND attname = 'blob'",
            BLOBS,
        )
    finally:
        await conn.close()
    assert version == len(SCHEMA_MIGRATIONS)
    if lz4:
        assert compression in ("l", b"l")


async def test_cancelled_call_does_not_poison_connections(opened: PostgresSaver) -> None:
    saver = opened
    ids = await put_chain(saver, "t-cancel", [{"a": [1]}])
    blocker = await raw_conn(saver.url.render(hide_password=False))
    try:
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute(
            f"SELECT 1 FROM {CHECKPOINTS} WHERE thread_id = 't-cancel' FOR UPDATE"
        )
        checkpoint = empty_checkpoint()
        checkpoint["id"] = ids[0]
        # Re-putting the locked checkpoint blocks on the row lock; give up waiting.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(saver.aput(cfg("t-cancel"), checkpoint, {}, {}), 0.5)
        await tx.rollback()
    finally:
        await blocker.close()
    for _ in range(5):
        got = await saver.aget_tuple(cfg("t-cancel", ids[0]))
        assert got is not None
    await put_chain(saver, "t-cancel-2", [{"a": [2]}, {}])
    assert await saver.aget_tuple(cfg("t-cancel-2")) is not None


async def test_async_commit_setting_stays_on_saver_connections(postgres_url: str) -> None:
    from runstore.plugins.postgres.events import PostgresEventStore

    url = BackendURL.parse(postgres_url)
    settings = Settings().merged(
        {"postgres": {"saver_synchronous_commit": "off", "pool_max_size": 2}}
    )
    async with BackendOptions.scope(settings) as options:
        saver = await PostgresSaver.open(url, options)
        store = await PostgresEventStore.open(url, options)
        await put_chain(saver, "t-async", [{"a": [1]}, {}])
        got = await saver.aget_tuple(cfg("t-async"))
        assert got is not None
        seen = await saver._leases.run(
            lambda conn: conn.fetchval("SHOW synchronous_commit"), operation="show"
        )
        assert seen == "off"
        # Connections the saver hands back to the shared pool are reset first.
        await saver.aclose()
        async with store.engine.connect() as one, store.engine.connect() as two:
            for conn in (one, two):
                value = (await conn.exec_driver_sql("SHOW synchronous_commit")).scalar()
                assert value == "on"


async def test_carried_values_are_stored_when_missing(opened: PostgresSaver) -> None:
    """A value put under a version it was not stored under before (not in new_versions)
    still comes back; one this process already stored is not serialized again."""
    saver = opened
    version = saver.get_next_version(None, None)
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"a": ["hand-written"]}
    checkpoint["channel_versions"] = {"a": version}
    out = await saver.aput(cfg("t-carry"), checkpoint, {}, {})
    got = await saver.aget_tuple(out)
    assert got is not None and got.checkpoint["channel_values"] == {"a": ["hand-written"]}

    dumped: list[Any] = []
    real = saver.serde

    class Counting:
        def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
            dumped.append(obj)
            return real.dumps_typed(obj)

        def loads_typed(self, data: tuple[str, bytes]) -> Any:
            return real.loads_typed(data)

    saver.serde = Counting()  # type: ignore[assignment]
    child = empty_checkpoint()
    child["channel_values"] = {"a": ["hand-written"]}
    child["channel_versions"] = {"a": version}
    child_cfg = await saver.aput(out, child, {}, {})
    saver.serde = real
    assert ["hand-written"] not in dumped, "a blob this process stored is not re-serialized"
    got = await saver.aget_tuple(child_cfg)
    assert got is not None and got.checkpoint["channel_values"] == {"a": ["hand-written"]}


class CountRoundTrips:
    """Counts the saver's leased-connection calls (one round trip each) from creation on."""

    def __init__(self, saver: PostgresSaver) -> None:
        self.calls = 0
        real_run, real_query = saver._leases.run, saver._leases.query

        async def counting(fn: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return await real_run(fn, **kwargs)

        async def counting_query(method: str, args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return await real_query(method, args, **kwargs)

        saver._leases.run = counting  # type: ignore[method-assign]
        saver._leases.query = counting_query  # type: ignore[method-assign]


async def test_delta_history_is_prefetched_with_the_checkpoint(opened: PostgresSaver) -> None:
    """Loading a delta checkpoint reads its history in the same query; a write in
    between makes the saver ask again; both answers equal the base-class walk."""
    saver = opened
    ids = await put_chain(saver, "t-pre", [{"a": ["seed"]}, {}, {}])
    # Mark the head as LangGraph marks a checkpoint whose delta channel "a" holds no value.
    head = empty_checkpoint()
    head["channel_versions"] = {"a": saver.get_next_version("9", None)}
    md = {"counters_since_delta_snapshot": {"a": [3, 3]}}
    head_cfg = await saver.aput(cfg("t-pre", ids[-1]), head, md, dict(head["channel_versions"]))
    await saver.aput_writes(head_cfg, [("a", "pending")], "task")
    expected = await BaseCheckpointSaver.aget_delta_channel_history(
        saver, config=head_cfg, channels=["a"]
    )
    trips = CountRoundTrips(saver)
    got = await saver.aget_tuple(cfg("t-pre"))
    assert got is not None and got.config == head_cfg
    history = await saver.aget_delta_channel_history(config=got.config, channels=["a"])
    assert trips.calls == 1, "history came with the checkpoint"
    assert history == expected
    # Used once: asking again queries.
    assert await saver.aget_delta_channel_history(config=head_cfg, channels=["a"]) == expected
    assert trips.calls == 2
    # A write between load and history invalidates the prefetched answer.
    await saver.aget_tuple(cfg("t-pre"))
    await saver.aput_writes(cfg("t-pre", ids[0]), [("a", "late")], "late-task")
    trips.calls = 0
    fresh = await saver.aget_delta_channel_history(config=head_cfg, channels=["a"])
    assert trips.calls == 1
    assert ("late-task", "a", "late") in fresh["a"]["writes"]
    # A checkpoint loaded by id comes without its history: walking ancestors one
    # load at a time must not run one history query per load.
    trips.calls = 0
    by_id = await saver.aget_tuple(head_cfg)
    assert by_id is not None and by_id.config == head_cfg
    assert trips.calls == 1
    assert await saver.aget_delta_channel_history(config=head_cfg, channels=["a"]) == fresh
    assert trips.calls == 2, "history of a checkpoint loaded by id is queried when asked for"


async def test_a_long_delta_history_is_not_prefetched(opened: PostgresSaver) -> None:
    """Past PREFETCH_MAX_SUPERSTEPS since the snapshot, the head comes alone and the
    history is queried when asked for (and still equals the base-class walk)."""
    saver = opened
    ids = await put_chain(saver, "t-long", [{"a": ["seed"]}, {}, {}])
    head = empty_checkpoint()
    head["channel_versions"] = {"a": saver.get_next_version("9", None)}
    md = {"counters_since_delta_snapshot": {"a": [3, PREFETCH_MAX_SUPERSTEPS + 1]}}
    head_cfg = await saver.aput(cfg("t-long", ids[-1]), head, md, dict(head["channel_versions"]))
    await saver.aput_writes(cfg("t-long", ids[0]), [("a", "early")], "task")
    expected = await BaseCheckpointSaver.aget_delta_channel_history(
        saver, config=head_cfg, channels=["a"]
    )
    trips = CountRoundTrips(saver)
    got = await saver.aget_tuple(cfg("t-long"))
    assert got is not None and got.config == head_cfg
    assert await saver.aget_delta_channel_history(config=head_cfg, channels=["a"]) == expected
    assert trips.calls == 2, "a long history is queried on its own"


async def test_delta_history_by_id_range_falls_back_to_parent_links(
    opened: PostgresSaver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A linear chain is answered from the checkpoints just below the target; when a
    sibling branch crowds the ancestors out of that range, or holds a newer value than
    the real seed, the recursive walk answers. Every answer equals the base-class walk."""
    from runstore.plugins.postgres import saver as module

    outcomes: list[bool] = []
    real_walk = module.walk_range

    def spying(row: Any, target_id: Any, wanted: Any, prefix: str = "") -> Any:
        rows = real_walk(row, target_id, wanted, prefix)
        outcomes.append(rows is not None)
        return rows

    monkeypatch.setattr(module, "walk_range", spying)

    async def check(target: str) -> None:
        config = cfg("t-range", target)
        got = await opened.aget_delta_channel_history(config=config, channels=["a"])
        expected = await BaseCheckpointSaver.aget_delta_channel_history(
            opened, config=config, channels=["a"]
        )
        assert got == expected
        assert got["a"]["writes"]

    main = await put_chain(opened, "t-range", [{"a": ["seed"]}] + [{}] * 20)
    await check(main[-1])
    assert outcomes == [True], "a linear chain is answered from the id range"

    # A long sibling branch written before the main branch goes on.
    await put_chain(opened, "t-range", [{}] * 80, parent=main[5])
    more = await put_chain(opened, "t-range", [{}] * 3, parent=main[-1])
    await check(more[-1])
    assert outcomes[-1] is False, "ancestors outside the range: parent links answer"

    # A short sibling whose second checkpoint holds a newer value than the real seed.
    short = await put_chain(opened, "t-range-2", [{"a": ["seed"]}] + [{}] * 9)
    await put_chain(opened, "t-range-2", [{}, {"a": ["sibling"]}], parent=short[2])
    tail = await put_chain(opened, "t-range-2", [{}, {}], parent=short[-1])
    config = cfg("t-range-2", tail[-1])
    got = await opened.aget_delta_channel_history(config=config, channels=["a"])
    assert got == await BaseCheckpointSaver.aget_delta_channel_history(
        opened, config=config, channels=["a"]
    )
    assert got["a"]["seed"] == ["seed"]
    assert outcomes[-1] is False, "a sibling's newer holder: parent links answer"


async def test_concurrent_reads_share_one_round_trip(opened: PostgresSaver) -> None:
    """aget_tuple calls queued together go out as one pipelined read, each caller
    getting its own checkpoint (or None for a thread without one)."""
    saver = opened
    heads = {}
    for n in range(4):
        ids = await put_chain(saver, f"t-many-{n}", [{"a": f"v{n}-0"}, {"a": f"v{n}-1"}])
        heads[f"t-many-{n}"] = ids
    trips = CountRoundTrips(saver)
    configs = [cfg(t) for t in heads] + [cfg("t-many-none"), cfg("t-many-0")]
    got = await asyncio.gather(*(saver.aget_tuple(c) for c in configs))
    assert trips.calls == 1, "queued before the first read started: one round trip"
    for n, thread in enumerate(heads):
        one = got[n]
        assert one is not None and one.config["configurable"]["checkpoint_id"] == heads[thread][-1]
        assert one.checkpoint["channel_values"] == {"a": f"v{n}-1"}
    assert got[4] is None, "a thread without checkpoints"
    assert got[5] is not None and got[5] == got[0] and got[5] is not got[0], "each caller decodes its own"
    # By id: the same, keyed by the checkpoint id too.
    trips.calls = 0
    by_id = [cfg(t, ids[0]) for t, ids in heads.items()] + [cfg("t-many-0", "no-such-id")]
    got = await asyncio.gather(*(saver.aget_tuple(c) for c in by_id))
    assert trips.calls == 1
    assert [g.checkpoint["channel_values"] if g else None for g in got] == [
        {"a": f"v{n}-0"} for n in range(4)
    ] + [None]


async def test_reads_refused_together_run_again_alone(
    opened: PostgresSaver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the shared read fails on a statement, each read runs on its own and answers."""
    import asyncpg

    saver = opened
    for n in range(3):
        await put_chain(saver, f"t-alone-{n}", [{"a": f"v{n}"}])

    async def refused(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise asyncpg.exceptions.InsufficientPrivilegeError("permission denied")

    monkeypatch.setattr(asyncpg.Connection, "fetchmany", refused)
    trips = CountRoundTrips(saver)
    got = await asyncio.gather(*(saver.aget_tuple(cfg(f"t-alone-{n}")) for n in range(3)))
    assert [g.checkpoint["channel_values"] if g else None for g in got] == [{"a": f"v{n}"} for n in range(3)]
    assert trips.calls == 4, "the shared read, then one per caller"


async def test_reads_run_alone_stop_at_an_unavailable_database(
    opened: PostgresSaver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a read run alone finds the database unavailable, the rest of its batch get
    that error without a deadline each."""
    import asyncpg

    from runstore.errors import BackendUnavailableError

    saver = opened
    for n in range(3):
        await put_chain(saver, f"t-gone-{n}", [{"a": f"v{n}"}])

    async def refused(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise asyncpg.exceptions.InsufficientPrivilegeError("permission denied")

    async def cancelled(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise asyncpg.exceptions.QueryCanceledError("canceling statement due to statement timeout")

    monkeypatch.setattr(asyncpg.Connection, "fetchmany", refused)
    monkeypatch.setattr(asyncpg.Connection, "fetchrow", cancelled)
    trips = CountRoundTrips(saver)
    got = await asyncio.gather(
        *(saver.aget_tuple(cfg(f"t-gone-{n}")) for n in range(3)), return_exceptions=True
    )
    assert all(isinstance(g, BackendUnavailableError) for g in got), got
    assert trips.calls == 2, "the shared read, then the first read alone"


async def test_grant_fences_share_the_group_commit_and_an_equal_token_writes_nothing(
    opened: PostgresSaver, postgres_url: str
) -> None:
    """`afence_thread` is one statement through the saver's group commit: grants queued
    together go out as one ``executemany`` (one round trip, one commit). It raises the
    thread's fence (creating a record for a new thread), refuses an older token with the
    current one, and leaves the record unwritten for the fence's own token."""
    from runstore.errors import StaleFenceError
    from runstore.plugins.postgres.thread_sql import FENCE_OF_SQL

    calls: list[str] = []
    real = opened._leases.query

    async def counting(method: str, args: Any, **kw: Any) -> Any:
        calls.append(method)
        return await real(method, args, **kw)

    opened._leases.query = counting  # type: ignore[method-assign]
    threads = [f"t-fence-{i}" for i in range(4)]
    await opened.afence_thread("t-fence-first", 1)
    calls.clear()
    await asyncio.gather(*(opened.afence_thread(t, 7) for t in threads))
    assert calls == ["executemany"], calls
    conn = await raw_conn(postgres_url)
    try:
        row = "SELECT fence, checkpoints, xmin::text AS x FROM runstore_threads WHERE thread_id = $1"
        before = await conn.fetchrow(row, threads[0])
        assert (before["fence"], before["checkpoints"]) == (7, 0)
        await opened.afence_thread(threads[0], 7)
        assert await conn.fetchrow(row, threads[0]) == before, "an equal token rewrote the record"
        with pytest.raises(StaleFenceError) as refused:
            await opened.afence_thread(threads[0], 6)
        assert (refused.value.thread_id, refused.value.fence, refused.value.current) == (threads[0], 6, 7)
        await opened.afence_thread(threads[0], 8)
        assert await conn.fetchval(FENCE_OF_SQL, threads[0]) == 8
    finally:
        await conn.close()
