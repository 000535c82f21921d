"""CachedHistorySaver: equal to the uncached walk on generated trees; purge; backends; outages."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.types import _DeltaSnapshot

import runstore
from runstore import CachedHistorySaver
from runstore.checkpoint.forwarding import unwrap_saver
from runstore.options import BackendOptions
from runstore.plugins.memory.cache import MemoryHistoryCache
from runstore.plugins.redis.cache import RedisHistoryCache
from runstore.urls import BackendURL

CHANNELS = ["messages", "notes"]


@st.composite
def trees(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Checkpoint trees: parents (forks allowed), seeds (snapshot/plain), writes per node."""
    n = draw(st.integers(1, 12))
    nodes: list[dict[str, Any]] = []
    for i in range(n):
        parent = None if i == 0 else draw(st.integers(0, i - 1) | st.just(i - 1))
        values: dict[str, Any] = {}
        for ch in CHANNELS:
            kind = draw(st.sampled_from(["none", "none", "snapshot", "plain"]))
            if kind == "snapshot":
                values[ch] = _DeltaSnapshot([HumanMessage(f"s{i}{ch}", id=f"s{i}{ch}")])
            elif kind == "plain":
                values[ch] = [HumanMessage(f"p{i}{ch}", id=f"p{i}{ch}")]
        # write batches: (task, task_path, channels); a repeated task re-puts its
        # slots (first write wins), paths reorder tasks like parallel branches do
        batches = draw(st.lists(
            st.tuples(st.integers(0, 2), st.sampled_from(["", "~a", "~b"]),
                      st.lists(st.sampled_from(CHANNELS), min_size=1, max_size=3)),
            max_size=3,
        ))
        # LangGraph (async durability) may put a step's writes before the put of the
        # checkpoint they belong to has run
        writes_first = draw(st.booleans())
        nodes.append({"parent": parent, "values": values, "batches": batches,
                      "writes_first": writes_first})
    return nodes


async def _put_batches(
    saver: Any, config: dict[str, Any], i: int, batches: list[Any], task_ids: list[str]
) -> None:
    for b, (task, path, channels) in enumerate(batches):
        await saver.aput_writes(
            config,
            [(ch, [HumanMessage(f"w{i}.{b}.{k}", id=f"w{i}.{b}.{k}")]) for k, ch in enumerate(channels)],
            task_ids[task],
            path,
        )


async def build(saver: Any, thread_id: str, nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    configs: list[dict[str, Any]] = []
    for i, node in enumerate(nodes):
        checkpoint = empty_checkpoint()
        checkpoint["id"] = str(uuid6(clock_seq=i))
        checkpoint["channel_values"] = dict(node["values"])
        versions = {ch: f"{i:08d}.{ch}" for ch in node["values"]}
        checkpoint["channel_versions"] = versions
        conf: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ""}
        if node["parent"] is not None:
            conf["checkpoint_id"] = configs[node["parent"]]["configurable"]["checkpoint_id"]
        batches = node.get("batches")
        if batches is None:  # simple form: one task writing node["writes"]
            batches = [(0, "", node["writes"])] if node["writes"] else []
        task_ids = [str(uuid.UUID(int=(i << 8) + t)) for t in range(3)]
        own = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "",
                                "checkpoint_id": checkpoint["id"]}}
        if node.get("writes_first"):
            await _put_batches(saver, own, i, batches, task_ids)
        cfg = await saver.aput({"configurable": conf}, checkpoint, {"step": i}, versions)
        if not node.get("writes_first"):
            await _put_batches(saver, own, i, batches, task_ids)
        configs.append(cfg)
    return configs


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=trees(), order=st.lists(st.integers(0, 100), min_size=1, max_size=30),
       max_entries=st.integers(1, 20), depth=st.integers(0, 4), through_cache=st.booleans())
async def test_cached_history_equals_uncached(
    nodes: list[dict[str, Any]], order: list[int], max_entries: int, depth: int,
    through_cache: bool,
) -> None:
    inner = InMemorySaver()
    cached = CachedHistorySaver(inner, MemoryHistoryCache(max_entries), max_compose_depth=depth)
    # written through the wrapper (parent links learned from put) or behind its back
    configs = await build(cached if through_cache else inner, f"t-{uuid.uuid4().hex}", nodes)
    for k in order:
        cfg = configs[k % len(configs)]
        channels = CHANNELS if k % 3 else CHANNELS[:1]
        want = await inner.aget_delta_channel_history(config=cfg, channels=channels)
        got = await cached.aget_delta_channel_history(config=cfg, channels=channels)
        assert got == want, "contract: cached delta history equals the uncached walk"
    stats = cached.stats()
    assert stats["cache_errors"] == 0
    if through_cache and len(nodes) > 2:
        note(f"stats {stats}")


async def test_hits_composition_and_purge() -> None:
    inner = InMemorySaver()
    cache = MemoryHistoryCache(100)
    cached = CachedHistorySaver(inner, cache)
    nodes = [{"parent": i - 1 if i else None, "values": {}, "writes": ["messages"]} for i in range(6)]
    configs = await build(inner, "t-purge", nodes)
    for cfg in configs:  # oldest first: each miss composes from its parent's entry
        await cached.aget_delta_channel_history(config=cfg, channels=["messages"])
    assert cached.stats()["composed"] >= 4
    again = await cached.aget_delta_channel_history(config=configs[-1], channels=["messages"])
    assert cached.stats()["hits"] >= 1
    assert [w[2][0].content for w in again["messages"]["writes"]] == [f"w{i}.0.0" for i in range(5)]
    # head (no checkpoint_id) resolves to an immutable id
    head = await cached.aget_delta_channel_history(
        config={"configurable": {"thread_id": "t-purge", "checkpoint_ns": ""}}, channels=["messages"])
    assert head == again
    assert len(cache) > 0
    await cached.adelete_thread("t-purge")
    assert len(cache) == 0, "contract: deleting a thread purges its entries"


async def test_memory_cache_copies_on_read_and_write() -> None:
    cache = MemoryHistoryCache(4)
    msg = HumanMessage("x", id="1")
    entry = {"writes": [("t", "messages", [msg])]}
    await cache.set("t", "k", entry)  # type: ignore[arg-type]
    msg.content = "mutated after set"
    got = await cache.get("t", "k")
    assert got["writes"][0][2][0].content == "x"
    got["writes"][0][2][0].content = "mutated after get"
    assert (await cache.get("t", "k"))["writes"][0][2][0].content == "x"
    for i in range(6):
        await cache.set("t", f"k{i}", entry)  # type: ignore[arg-type]
    assert len(cache) == 4, "LRU bound"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _redis_cache(url: str, **settings: Any) -> RedisHistoryCache:
    opts = BackendOptions(settings=runstore.Settings.load({"checkpoint_cache": settings}, env={}))
    return await RedisHistoryCache.open(BackendURL.parse(url), opts)


async def test_redis_outage_degrades_to_uncached() -> None:
    cache = await _redis_cache(f"redis://127.0.0.1:{_closed_port()}/0")
    inner = InMemorySaver()
    cached = CachedHistorySaver(inner, cache)
    nodes = [{"parent": i - 1 if i else None, "values": {}, "writes": ["messages"]} for i in range(4)]
    configs = await build(inner, "t-outage", nodes)
    for cfg in configs:
        want = await inner.aget_delta_channel_history(config=cfg, channels=["messages"])
        assert await cached.aget_delta_channel_history(config=cfg, channels=["messages"]) == want
    await cached.adelete_thread("t-outage")
    await cache.clear()
    assert cache.errors > 0, "the outage was seen, and swallowed"
    await cache.close()


class _FlakyClient:
    """Wraps a client; every call raises a redis-style error."""

    def __getattr__(self, name: str) -> Any:
        from redis.exceptions import ConnectionError as RedisConnectionError

        def fail(*args: Any, **kwargs: Any) -> Any:
            raise RedisConnectionError("injected")

        return fail


async def test_redis_injected_errors_and_bad_values_are_misses() -> None:
    cache = RedisHistoryCache(_FlakyClient())
    assert await cache.get("t", "k") is None
    await cache.set("t", "k", {"writes": []})
    await cache.purge_thread("t")

    class Garbage:
        async def hget(self, *a: Any) -> bytes:
            return b"not-a-type\x00\xff\xfe"

    bad = RedisHistoryCache(Garbage())
    assert await bad.get("t", "k") is None, "an undecodable value is a miss, not a wrong answer"


@pytest.mark.redis
async def test_redis_cache_round_trip_and_purge(redis_url: str) -> None:
    cache = await _redis_cache(redis_url, key_prefix="hist:", ttl_seconds=60)
    inner = InMemorySaver()
    cached = CachedHistorySaver(inner, cache)
    nodes = [{"parent": i - 1 if i else None,
              "values": {"messages": _DeltaSnapshot([HumanMessage("s", id="s")])} if i == 0 else {},
              "writes": ["messages"]} for i in range(5)]
    configs = await build(inner, "t-redis", nodes)
    for _ in range(2):
        for cfg in configs:
            want = await inner.aget_delta_channel_history(config=cfg, channels=["messages"])
            assert await cached.aget_delta_channel_history(config=cfg, channels=["messages"]) == want
    assert cached.stats()["hits"] >= len(configs) and cache.errors == 0
    prefix = BackendURL.parse(redis_url).option("prefix", "")
    keys = [k async for k in cache.client.scan_iter(match=f"{prefix}hist:*")]
    assert keys and all(k.decode().startswith(f"{prefix}hist:") for k in keys)
    assert 0 < await cache.client.ttl(keys[0]) <= 60
    await cached.adelete_thread("t-redis")
    assert [k async for k in cache.client.scan_iter(match=f"{prefix}hist:*")] == []
    await cache.close()


async def test_open_wraps_only_in_delta_with_entries() -> None:
    base = {"checkpointer": "memory://", "events": "memory://", "streams": "memory://"}
    async with runstore.open({**base, "checkpoint_channel_mode": "delta"}) as stores:
        assert isinstance(stores.checkpointer, CachedHistorySaver)
        assert isinstance(stores.checkpointer.cache, MemoryHistoryCache)
    from runstore.checkpoint import modes

    modes.reset_checkpoint_mode_for_tests()
    async with runstore.open({**base, "checkpoint_channel_mode": "delta",
                              "checkpoint_cache": {"max_entries": 0}}) as stores:
        assert not isinstance(stores.checkpointer, CachedHistorySaver)
    modes.reset_checkpoint_mode_for_tests()
    async with runstore.open(base) as stores:
        assert not isinstance(stores.checkpointer, CachedHistorySaver), "full mode: no cache"


async def test_open_caches_only_where_it_pays(tmp_path: Path, postgres_url: str) -> None:
    from runstore.checkpoint import modes

    sqlite_url = BackendURL.for_file("sqlite", tmp_path / "c.db").render()
    for url in (sqlite_url, postgres_url):
        modes.reset_checkpoint_mode_for_tests()
        async with runstore.open({"checkpoint_channel_mode": "delta"}, checkpointer=url) as stores:
            assert not isinstance(stores.checkpointer, CachedHistorySaver), (
                "runstore's SQL savers read history in one trip: no cache by default"
            )
            assert type(unwrap_saver(stores.checkpointer)).__name__ in ("SqliteSaver", "PostgresSaver")
        modes.reset_checkpoint_mode_for_tests()
        async with runstore.open({"checkpoint_channel_mode": "delta",
                                  "checkpoint_cache": {"enabled": "on"}}, checkpointer=url) as stores:
            assert isinstance(stores.checkpointer, CachedHistorySaver), "enabled: on wraps any saver"
    modes.reset_checkpoint_mode_for_tests()
    async with runstore.open({"checkpoint_channel_mode": "delta", "checkpoint_cache": {"enabled": "off"}},
                             checkpointer="memory://") as stores:
        assert not isinstance(stores.checkpointer, CachedHistorySaver)


@pytest.mark.redis
async def test_open_with_redis_cache(redis_url: str) -> None:
    base = {"checkpointer": "memory://", "events": "memory://", "streams": "memory://"}
    async with runstore.open({**base, "checkpoint_channel_mode": "delta",
                              "checkpoint_cache": {"type": "redis", "url": redis_url}}) as stores:
        assert isinstance(stores.checkpointer.cache, RedisHistoryCache)


async def test_open_in_delta_marks_every_checkpoint_without_inject() -> None:
    from runstore.checkpoint import modes

    from .graphs import chat_builder, turn

    base = {"checkpointer": "memory://", "events": "memory://", "streams": "memory://"}
    async with runstore.open({**base, "checkpoint_channel_mode": "delta",
                              "checkpoint_delta": {"snapshot_frequency": 5}}) as stores:
        graph = chat_builder("delta", 5).compile(checkpointer=stores.checkpointer)
        cfg = {"configurable": {"thread_id": "t-plain"}}  # no inject_checkpoint_mode
        for q in ("a", "b", "c"):
            await turn(graph, cfg, q)
        metas = [t.metadata async for t in stores.checkpointer.alist(cfg)]
        assert metas and all(modes.is_delta_metadata(m) for m in metas)
        assert all(m.get(modes.MODE_METADATA_KEY) == "delta" for m in metas), (
            "contract: every delta checkpoint carries the marker (snapshot ones too)"
        )
        state = await graph.aget_state(cfg)
        assert len(state.values["messages"]) == 6
        assert stores.checkpointer.stats()["misses"] > 0
        # the accessor over the opened stack: updates marked, state intact
        acc = runstore.CheckpointStateAccessor.bind(chat_builder("delta", 5), stores.checkpointer)
        await acc.aupdate(cfg, {"todos": ["x"]})
        head = await stores.checkpointer.aget_tuple(cfg)
        assert head.metadata.get(modes.MODE_METADATA_KEY) == "delta"
        assert len((await acc.aget(cfg)).values["messages"]) == 6


async def test_observed_composition_needs_target_and_parent_put_here() -> None:
    inner = InMemorySaver()
    cached = CachedHistorySaver(inner, MemoryHistoryCache(64))
    nodes = [{"parent": i - 1 if i else None, "values": {}, "writes": ["messages"]} for i in range(4)]
    configs = await build(cached, "t-obs", nodes)
    for cfg in configs:
        want = await inner.aget_delta_channel_history(config=cfg, channels=["messages"])
        assert await cached.aget_delta_channel_history(config=cfg, channels=["messages"]) == want
    assert cached.stats()["observed"] > 0
    # a second wrapper that saw none of the puts must read, and agree
    other = CachedHistorySaver(inner, MemoryHistoryCache(64))
    got = await other.aget_delta_channel_history(config=configs[-1], channels=["messages"])
    assert got == await inner.aget_delta_channel_history(config=configs[-1], channels=["messages"])
    assert other.stats()["observed"] == 0


async def test_reput_of_a_known_checkpoint_is_not_trusted() -> None:
    inner = InMemorySaver()
    cached = CachedHistorySaver(inner, MemoryHistoryCache(64))
    nodes = [{"parent": i - 1 if i else None, "values": {}, "writes": ["messages"]} for i in range(3)]
    configs = await build(cached, "t-reput", nodes)
    parent = await inner.aget_tuple(configs[1])
    await cached.aput(parent.parent_config, parent.checkpoint, parent.metadata, {})
    # without distrust, the re-put would reset what the wrapper saw at checkpoint 1
    # and drop the write put there before: the answer must still match the saver
    got = await cached.aget_delta_channel_history(config=configs[2], channels=["messages"])
    want = await inner.aget_delta_channel_history(config=configs[2], channels=["messages"])
    assert got == want and len(want["messages"]["writes"]) == 2
