"""The Redis stream bridge on a real Redis Cluster (``redis+cluster://``).

Each test starts its own throwaway cluster (3 masters, a replica each) on free local
ports. The stream-bridge conformance suite runs against the cluster URL in a child
pytest, as a user would run it; the failover test SIGKILLs a master while
subscribers wait and checks that every subscriber resumes from its position (or gets
a gap), never hangs and never receives an event twice.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import runstore
from runstore.conformance.harness import service_unavailable
from runstore.streams.protocol import END, StreamEvent, StreamGap, StreamItem

from .servers import RedisClusterServers, ServerUnavailable

pytestmark = [pytest.mark.faults, pytest.mark.timeout(600)]

CONFIG = {"checkpointer": "memory://", "events": "memory://", "runs": "memory://"}


@pytest.fixture
def redis_cluster() -> Iterator[RedisClusterServers]:
    """A started throwaway 3-master Redis Cluster with one replica per master."""
    try:
        cluster = RedisClusterServers()
    except ServerUnavailable as exc:
        service_unavailable("a throwaway Redis Cluster", exc)
        raise
    with cluster:
        yield cluster


def test_the_stream_bridge_conformance_suite_passes_on_a_cluster(
    redis_cluster: RedisClusterServers, tmp_path: Path
) -> None:
    report = tmp_path / "streams.xml"
    cmd = [
        sys.executable, "-m", "pytest", "--pyargs", "runstore.conformance.test_streams",
        "-c", os.devnull, "--rootdir", str(tmp_path), "-p", "no:cacheprovider", "-q",
        "--junitxml", str(report), "--runstore-backend", redis_cluster.url(),
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert report.exists(), f"the suite did not run:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    cases = list(ET.parse(report).getroot().iter("testcase"))
    failed = [c.get("name") for c in cases if c.find("failure") is not None or c.find("error") is not None]
    skipped = [c.get("name") for c in cases if c.find("skipped") is not None]
    assert not failed, f"failed on the cluster: {failed}\n{proc.stdout[-6000:]}"
    assert len(cases) - len(skipped) >= 20, f"too few tests ran ({len(cases)}, skipped {skipped})"
    assert proc.returncode == 0, proc.stdout[-4000:]


async def _follow(bridge: Any, run_id: str, items: list[StreamItem]) -> None:
    async for item in bridge.subscribe(run_id, heartbeat_interval=0.5):
        if item is not runstore.streams.HEARTBEAT:
            items.append(item)


async def _until(predicate: Any, what: str) -> None:
    for _ in range(1500):  # 30 s
        if predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


async def test_subscribers_ride_out_a_master_failover(redis_cluster: RedisClusterServers, fault_report: Any) -> None:
    async with runstore.open(CONFIG, streams=redis_cluster.url(prefix="failover:")) as stores:
        bridge = stores.streams
        runs = [f"run-{n}" for n in range(24)]  # spread over the slot groups, so over every master

        async def first_three(run_id: str) -> list[str]:
            return [await bridge.publish(run_id, "values", {"n": n}) for n in range(3)]

        # Concurrent producers: their publishes are pipelined per slot group.
        ids = await asyncio.gather(*(first_three(run_id) for run_id in runs))
        assert ids == [["0-1", "0-2", "0-3"]] * len(runs)
        redis_cluster.wait_replicated()  # what the replica has is what survives the kill
        received: dict[str, list[StreamItem]] = {run_id: [] for run_id in runs}
        followers = [asyncio.create_task(_follow(bridge, r, received[r])) for r in runs]
        await _until(lambda: all(len(items) == 3 for items in received.values()), "the subscribers' first events")

        victim = redis_cluster.owner(bridge.key(runs[0]))
        on_victim = [r for r in runs if redis_cluster.owner(bridge.key(r)) is victim]
        redis_cluster.kill(victim)
        # Published while the master is dead: retried until its replica takes over.
        await bridge.publish(runs[0], "values", {"n": 3})
        # The publish went through the promoted replica; another node's slot map learns
        # of the failover by gossip, a moment later on a busy machine.
        await _until(lambda: victim.port not in redis_cluster.master_ports(), "the cluster's view of the failover")
        for run_id in runs:
            for n in range(4 if run_id == runs[0] else 3, 6):
                await bridge.publish(run_id, "values", {"n": n})
            await bridge.publish_end(run_id)

        done, pending = await asyncio.wait(followers, timeout=60)
        assert not pending, f"{len(pending)} subscribers hang after the failover"
        for task in done:
            task.result()
        resumed = 0
        for run_id, items in received.items():
            events = [item for item in items if isinstance(item, StreamEvent)]
            ids = [event.id for event in events]
            assert ids == [f"0-{n}" for n in range(1, len(ids) + 1)], f"{run_id}: duplicates or a hole: {ids}"
            assert [event.data["n"] for event in events] == list(range(len(events)))
            assert items[-1] is END or isinstance(items[-1], StreamGap), f"{run_id}: ended with {items[-1]!r}"
            resumed += items[-1] is END and len(ids) == 6
        # Nothing was lost (the replicas had every write), so every subscriber resumed.
        assert resumed == len(runs), f"{len(runs) - resumed} of {len(runs)} got a gap; {len(on_victim)} on the victim"
        fault_report.add("redis cluster: a master SIGKILLed while subscribers wait", trials=1,
                         acknowledged=6 * len(runs), lost=0, duplicated=0, runs_on_the_killed_master=len(on_victim))
        for run_id in runs:
            await bridge.cleanup(run_id)


async def test_the_history_cache_works_on_a_cluster_and_rides_out_a_failover(
    redis_cluster: RedisClusterServers,
) -> None:
    from runstore.loader import get_backends
    from runstore.options import BackendOptions
    from runstore.plugins.redis.cache import RedisHistoryCache
    from runstore.urls import BackendURL

    url = BackendURL.parse(redis_cluster.url(prefix="cache:"))
    spec = get_backends().history_caches.for_url(url)
    assert spec.name == "redis-cluster"
    options = BackendOptions(settings=runstore.Settings.load({}, env={}))
    cache = await spec.open(url, options)
    assert isinstance(cache, RedisHistoryCache)
    try:
        threads = [f"thread-{n}" for n in range(12)]  # on every master
        owners = {redis_cluster.owner(cache._key(t)).port for t in threads}
        assert len(owners) == 3, "the threads should span every master"
        for n, thread in enumerate(threads):
            await cache.set(thread, "k", {"writes": [("messages", n)]})
        for n, thread in enumerate(threads):
            assert await cache.get(thread, "k") == {"writes": [("messages", n)]}
        await cache.purge_thread(threads[0])
        assert await cache.get(threads[0], "k") is None
        redis_cluster.wait_replicated()

        victim = redis_cluster.owner(cache._key(threads[1]))
        redis_cluster.kill(victim)
        for thread in threads:  # a miss or a hit, never an exception
            await cache.get(thread, "k")
        redis_cluster.wait_for_failover(victim)
        await asyncio.sleep(1.1)  # past the cache's back-off after a connection failure
        for n, thread in enumerate(threads[1:], start=1):
            assert await cache.get(thread, "k") == {"writes": [("messages", n)]}
        await cache.clear()
        assert all([await cache.get(t, "k") is None for t in threads])
    finally:
        await cache.close()


async def test_a_single_server_behind_a_cluster_url_is_refused_by_name(redis_server: Any) -> None:
    from runstore.errors import InvalidURLError

    url = f"redis+cluster://{redis_server.host}:{redis_server.port}"
    with pytest.raises(InvalidURLError, match="not a cluster node.*use redis://"):
        async with runstore.open(CONFIG, streams=url):
            pass


async def test_without_a_fresh_slot_map_the_failover_is_not_survived(
    redis_cluster: RedisClusterServers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The failover test's teeth: a router that keeps its first slot map fails it."""
    from runstore.errors import BackendUnavailableError
    from runstore.plugins.redis.cluster import ClusterCalls

    first_map: dict[int, Any] = {}
    refresh = ClusterCalls._refresh

    async def stale_refresh(self: ClusterCalls, deadline: Any) -> None:
        if id(self) not in first_map:
            await refresh(self, deadline)
            first_map[id(self)] = self._owners
        self._owners = first_map[id(self)]

    monkeypatch.setattr(ClusterCalls, "_refresh", stale_refresh)
    async with runstore.open(CONFIG, streams=redis_cluster.url(prefix="stale:", operation_timeout="3")) as stores:
        bridge = stores.streams
        await bridge.publish("run-0", "values", {"n": 0})
        victim = redis_cluster.owner(bridge.key("run-0"))
        redis_cluster.kill(victim)
        redis_cluster.wait_for_failover(victim)
        with pytest.raises(BackendUnavailableError) as caught:
            await bridge.publish("run-0", "values", {"n": 1})
        assert caught.value.write_may_have_happened is False
