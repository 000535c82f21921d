"""Fenced publishes to stream bridges (capability ``fencing``), checked on any bridge.

``publish`` and ``publish_end`` take ``fence=`` (a run store lease's token) and
``fence_stream(run_id, token)`` raises a run's fence without publishing; a bridge
declaring ``fencing`` refuses an older token with `StaleFenceError` in the same atomic
step as the append, so nothing of a stale worker reaches a subscriber and its END
never ends a stream the new holder is writing (docs/streams.md, "Fenced publishes").
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from runstore.errors import InvalidStreamInputError, StaleFenceError
from runstore.fencing import MAX_FENCE
from runstore.streams.protocol import END, StreamBridge, StreamEvent, StreamItem

from .fencing_workers import refused_as_stale
from .processes import plugins_env
from .session import development_plugins
from .test_streams import assert_events, drain, new_run

pytestmark = pytest.mark.requires("fencing")


def _tokens(items: list[StreamItem]) -> list[Any]:
    return [item.data["token"] if isinstance(item, StreamEvent) else item for item in items]


def test_stale_publish_and_end_after_a_grant_fences_the_run_are_refused(streams_target: Any) -> None:
    """A takeover: the old holder published with token 1, the new holder's grant calls
    fence_stream(run, 2); the old holder's publish and END are refused (StaleFenceError
    naming the run), nothing of them reaches a subscriber, and the stream goes on with
    the new holder's events and END."""

    async def body(bridge: StreamBridge) -> None:
        run_id = new_run()
        first = await bridge.publish(run_id, "values", {"token": 1}, fence=1)
        await bridge.fence_stream(run_id, 2)
        raised = await refused_as_stale(
            bridge.publish(run_id, "values", {"token": "stale"}, fence=1),
            "a publish after fence_stream with a newer token",
        )
        assert (raised.run_id, raised.fence, raised.current) == (run_id, 1, 2), (
            f"contract: StaleFenceError names the run, the stale token and the current one: {raised!r}"
        )
        await refused_as_stale(bridge.publish_end(run_id, fence=1), "a stale END (publish_end)")
        second = await bridge.publish(run_id, "values", {"token": 2}, fence=2)
        await bridge.publish_end(run_id, fence=2)
        got = await drain(bridge.subscribe(run_id), "the new holder's events, then its END")
        assert_events(
            got,
            [StreamEvent(first, "values", {"token": 1}), StreamEvent(second, "values", {"token": 2}), END],
            "fencing: a stale publish reaches no subscriber and a stale END never ends the stream "
            "the new holder is writing",
        )

    streams_target.run(body)


def test_fence_stream_rules(streams_target: Any) -> None:
    """fence_stream creates no stream; an older token is refused, the same one passes;
    unfenced publishes are not checked; tokens compare as integers up to 2**63-1 (not as
    text, not as floats)."""

    async def body(bridge: StreamBridge) -> None:
        run_id = new_run()
        await bridge.fence_stream(run_id, 10)
        assert not await bridge.stream_exists(run_id), "contract: fence_stream publishes nothing"
        await refused_as_stale(bridge.fence_stream(run_id, 9), "fence_stream with an older token")
        await refused_as_stale(bridge.publish(run_id, "values", {"token": 9}, fence=9),
                               "a publish with token 9 after token 10 (compared as integers)")
        await bridge.fence_stream(run_id, 10)
        kept = await bridge.publish(run_id, "values", {"token": 10}, fence=10)
        unfenced = await bridge.publish(run_id, "values", {"token": None})
        await bridge.fence_stream(run_id, MAX_FENCE)
        await refused_as_stale(bridge.publish(run_id, "values", {"token": MAX_FENCE - 1}, fence=MAX_FENCE - 1),
                               "a publish one below the newest token at 2**63-1")
        await bridge.publish_end(run_id, fence=MAX_FENCE)
        got = await drain(bridge.subscribe(run_id), "the fenced run's events, then END")
        assert_events(
            got,
            [StreamEvent(kept, "values", {"token": 10}), StreamEvent(unfenced, "values", {"token": None}), END],
            "fencing: only publishes with the current token (or none) are stored",
        )

    streams_target.run(body)


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2", MAX_FENCE + 1], ids=repr)
def test_bad_token_is_an_input_error(streams_target: Any, bad: Any) -> None:
    """A token that is not an int from 1 to 2**63-1 raises InvalidStreamInputError; nothing is published."""

    async def body(bridge: StreamBridge) -> None:
        run_id = new_run()
        for call in (
            lambda: bridge.publish(run_id, "values", {}, fence=bad),
            lambda: bridge.publish_end(run_id, fence=bad),
            lambda: bridge.fence_stream(run_id, bad),
        ):
            with pytest.raises(InvalidStreamInputError, match="fence"):
                await call()
        assert not await bridge.stream_exists(run_id), "contract: a malformed token publishes nothing"

    streams_target.run(body)


def test_fence_outlives_the_stream(streams_target: Any) -> None:
    """After END and cleanup, a stale publisher cannot start the run's stream again."""

    async def body(bridge: StreamBridge) -> None:
        run_id = new_run()
        await bridge.publish(run_id, "values", {"token": 2}, fence=2)
        await bridge.publish_end(run_id, fence=2)
        await bridge.cleanup(run_id)
        await refused_as_stale(bridge.publish(run_id, "values", {"token": 1}, fence=1),
                               "a publish after the stream was removed")
        assert not await bridge.stream_exists(run_id), (
            "contract: fencing: a stale publish does not bring a removed stream back"
        )

    streams_target.run(body)


async def _race_round(bridge: StreamBridge, yields: int) -> None:
    """An old publisher (token 1) against a grant plus publish of token 2 after ``yields`` turns."""
    run_id = new_run()
    acked: list[int] = []

    async def old() -> None:
        for i in range(1, 200):
            try:
                await bridge.publish(run_id, "values", {"token": 1, "i": i}, fence=1)
            except StaleFenceError:
                return
            acked.append(i)
            await asyncio.sleep(0)

    async def new() -> None:
        for _ in range(yields):
            await asyncio.sleep(0)
        await bridge.fence_stream(run_id, 2)
        # Unfenced, so it lands at once: it marks the grant's place in the stream.
        await bridge.publish(run_id, "values", {"token": "grant", "i": 0})
        await bridge.publish(run_id, "values", {"token": 2, "i": 0}, fence=2)
        await bridge.publish_end(run_id, fence=2)

    await asyncio.gather(old(), new())
    got = await drain(bridge.subscribe(run_id), "the raced run's events, then END")
    tokens = _tokens(got)
    assert tokens[-3:] == ["grant", 2, END] and "grant" not in tokens[:-3], (
        "contract: fencing: no publish of a stale token lands after the newer grant "
        f"(grant after {yields} turns); stream order of tokens: {tokens}"
    )
    stored = [item.data["i"] for item in got if isinstance(item, StreamEvent) and item.data["token"] == 1]
    assert stored == acked, "contract: fencing: exactly the acknowledged publishes are in the stream"


def test_fence_race_in_one_process(streams_target: Any) -> None:
    """A publisher with token 1 races a grant of token 2: nothing of token 1 lands after it."""

    async def body(bridge: StreamBridge) -> None:
        for yields in range(0, 6):
            await _race_round(bridge, yields)

    streams_target.run(body, settings={"stream_bridge": {"queue_maxsize": 1024}})


_STALE_PUBLISHER = textwrap.dedent(
    """
    import asyncio, os, sys
    import runstore
    from runstore.errors import StaleFenceError

    async def main():
        async with runstore.open(streams=os.environ["RUNSTORE_XP_URL"]) as stores:
            run_id = os.environ["RUNSTORE_XP_RUN"]
            outcomes = []
            for call in (lambda: stores.streams.publish(run_id, "values", {"token": 1}, fence=1),
                         lambda: stores.streams.publish_end(run_id, fence=1)):
                try:
                    await call()
                    outcomes.append("accepted")
                except StaleFenceError:
                    outcomes.append("stale")
            print(" ".join(outcomes))

    asyncio.run(main())
    """
)


@pytest.mark.requires("cross_process")
def test_stale_publisher_in_another_process_is_refused(
    streams_target: Any, request: pytest.FixtureRequest
) -> None:
    """A grant in this process fences the run; a publisher in another OS process holding
    the older token gets StaleFenceError for its publish and its END."""

    async def body(bridge: StreamBridge) -> None:
        run_id = new_run()
        await bridge.publish(run_id, "values", {"token": 1}, fence=1)
        await bridge.fence_stream(run_id, 2)
        env = {
            **os.environ,
            "RUNSTORE_XP_URL": streams_target.url.render(hide_password=False),
            "RUNSTORE_XP_RUN": run_id,
            **plugins_env(development_plugins(request.config)),
        }
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _STALE_PUBLISHER, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        out, err = await proc.communicate()
        assert proc.returncode == 0, f"publisher process failed: {err.decode(errors='replace')[-2000:]}"
        assert out.decode().split() == ["stale", "stale"], (
            "contract: fencing: a stale publish and END from another process are refused with "
            f"StaleFenceError (got {out.decode().strip()!r})"
        )
        await bridge.publish(run_id, "values", {"token": 2}, fence=2)
        await bridge.publish_end(run_id, fence=2)
        got = await drain(bridge.subscribe(run_id), "the new holder's events, then END")
        assert _tokens(got) == [1, 2, END], (
            f"contract: fencing: nothing of the stale process reached the stream: {_tokens(got)}"
        )

    streams_target.run(body)
