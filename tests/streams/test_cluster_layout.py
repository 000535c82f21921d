"""Key layout and URL rules of the Redis Cluster bridge, without a server."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

import runstore
from runstore.errors import ConfigError, InvalidURLError
from runstore.plugins.redis.client import RedisTimeouts
from runstore.plugins.redis.cluster import SLOTS, ClusterCalls, command_slot, seed_nodes
from runstore.plugins.redis.cluster_streams import SLOT_GROUPS, TAGS, RedisClusterStreamBridge
from runstore.urls import BackendURL

CONFIG = {"checkpointer": "memory://", "events": "memory://", "runs": "memory://"}
RUN_IDS = ["r", "run-1", "{x}", "a}b{c", "}", "ünï", "x" * 300, *(f"run-{n}" for n in range(200))]


def test_each_group_tag_sits_in_its_own_share_of_the_slots() -> None:
    assert len(TAGS) == SLOT_GROUPS
    for group, tag in enumerate(TAGS):
        assert key_slot(tag.encode()) * SLOT_GROUPS // SLOTS == group


def test_a_runs_stream_and_its_groups_control_stream_share_a_slot() -> None:
    calls = ClusterCalls(lambda address: None, [("127.0.0.1", 1)], RedisTimeouts(), backend="test")
    bridge = RedisClusterStreamBridge(calls, prefix="app:")
    groups = set()
    for run_id in RUN_IDS:
        key = bridge.key(run_id)
        group = bridge._group(key)
        groups.add(group)
        assert key_slot(key) == key_slot(bridge._control_key(group)) == key_slot(TAGS[group].encode())
        # The commands a run's reader sends stay in that slot.
        xread = ("XREAD", "COUNT", 5, "BLOCK", 10, "STREAMS", bridge._control_key(group), key, "0-0", "0-0")
        assert command_slot(xread) == key_slot(key)
    assert groups == set(range(SLOT_GROUPS)), "runs spread over every group"


def test_seed_nodes_come_from_the_host_and_the_nodes_option() -> None:
    url = BackendURL.parse("redis+cluster://h1:7000?nodes=h2:7001,[::1]:7002")
    assert seed_nodes(url) == [("h1", 7000), ("h2", 7001), ("::1", 7002)]


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+cluster://127.0.0.1:1/1", "only database 0"),
        ("redis+cluster://127.0.0.1:1?prefix=app{1}:", "must not contain"),
        ("redis+cluster://127.0.0.1:1?nodes=h2", "host:port"),
        ("redis+cluster://127.0.0.1:1?nodes=h2:x", "host:port"),
        ("redis+cluster://127.0.0.1:1?database=2", "database"),
    ],
)
async def test_bad_cluster_urls_are_refused_before_any_io(url: str, says: str) -> None:
    with pytest.raises(InvalidURLError, match=says):
        async with runstore.open(CONFIG, streams=url):
            pass


async def test_the_cluster_bridge_needs_more_connections_than_slot_groups() -> None:
    with pytest.raises(ConfigError, match="max_connections"):
        async with runstore.open({**CONFIG, "redis": {"max_connections": SLOT_GROUPS}},
                                 streams="redis+cluster://127.0.0.1:1"):
            pass
