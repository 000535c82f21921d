"""`runstore bench streams`: publish -> receive latency and sustained throughput.

Each case (one bridge, one repetition) runs in a fresh child process and measures,
for every ``--subscribers`` count:

- ``latency``: one event at a time (the next is published when every subscriber
  got the previous one); publish -> receive per delivery, p50/p99.
- ``throughput``: ``--throughput-events`` published back to back; events/s until
  every subscriber has seen the last one.

References in the same child: for Redis, raw redis-py ``XADD`` / ``XREAD BLOCK`` on
the same server (and ``XADD`` pipelined by 100 for the publish rate); for the
memory bridge, plain ``asyncio.Queue`` fan-out.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from runstore.bench.common import latency_summary
from runstore.bench.targets import redis_delete_prefix

PAD = "x" * 100
PIPELINE = 100


def _latency_row(
    label: str, subscribers: int, samples: Sequence[float], reference: str | None
) -> dict[str, Any]:
    s = latency_summary(samples, "lat")
    return {
        "op": "latency",
        "variant": f"{subscribers} sub",
        "backend": label,
        "metric": "p50_ms",
        "reference": {"backend": reference, "op": "latency", "variant": f"{subscribers} sub"}
        if reference
        else None,
        "count": len(samples),
        "p50_ms": s["lat_p50_ms"],
        "p95_ms": s["lat_p95_ms"],
        "p99_ms": s["lat_p99_ms"],
        "mean_ms": s["lat_mean_ms"],
    }


def _rate_row(
    label: str,
    op: str,
    subscribers: int,
    events: int,
    seconds: float,
    reference: Mapping[str, str] | None,
) -> dict[str, Any]:
    return {
        "op": op,
        "variant": f"{subscribers} sub",
        "backend": label,
        "metric": "rate_per_s",
        "reference": dict(reference) if reference else None,
        "count": events,
        "seconds": seconds,
        "rate_per_s": events / seconds if seconds > 0 else None,
    }


class _Fanout:
    """Tracks deliveries: per event id, how many subscribers got it and when."""

    def __init__(self, subscribers: int) -> None:
        self.subscribers = subscribers
        self.sent: dict[int, float] = {}
        self.samples: list[float] = []
        self.counts: dict[int, int] = {}
        self.done: dict[int, asyncio.Event] = {}
        self.last_seen = [-1] * subscribers

    def expect(self, i: int) -> asyncio.Event:
        ev = self.done[i] = asyncio.Event()
        self.counts[i] = 0
        return ev

    def received(self, sub: int, i: int, now: float) -> None:
        self.last_seen[sub] = i
        started = self.sent.get(i)
        if started is not None:
            self.samples.append(now - started)
        if i in self.counts:
            self.counts[i] += 1
            if self.counts[i] == self.subscribers:
                self.done[i].set()


async def _measure(
    subscribers: int,
    n_latency: int,
    n_throughput: int,
    subscribe: Callable[[str, int, _Fanout, asyncio.Event], Coroutine[Any, Any, None]],
    publish: Callable[[str, int], Coroutine[Any, Any, Any]],
    finish: Callable[[str], Coroutine[Any, Any, Any]],
) -> tuple[list[float], float]:
    """Run the latency and throughput phases on one stream implementation."""
    # latency: ping-pong, one event outstanding
    run_id = f"lat-{uuid.uuid4().hex[:8]}"
    fan = _Fanout(subscribers)
    ready = asyncio.Event()
    tasks = [asyncio.create_task(subscribe(run_id, s, fan, ready)) for s in range(subscribers)]
    warm = fan.expect(-1)
    await publish(run_id, -1)  # every subscriber is attached once it sees this
    await asyncio.wait_for(warm.wait(), 60)
    for i in range(n_latency):
        done = fan.expect(i)
        fan.sent[i] = time.perf_counter()
        await publish(run_id, i)
        await asyncio.wait_for(done.wait(), 60)
    await finish(run_id)
    await asyncio.wait_for(asyncio.gather(*tasks), 60)
    samples = fan.samples[:]
    # throughput: publish back to back, wait for the last event everywhere
    run_id = f"thr-{uuid.uuid4().hex[:8]}"
    fan = _Fanout(subscribers)
    tasks = [asyncio.create_task(subscribe(run_id, s, fan, ready)) for s in range(subscribers)]
    warm = fan.expect(-1)
    await publish(run_id, -1)
    await asyncio.wait_for(warm.wait(), 60)
    last = fan.expect(n_throughput - 1)
    started = time.perf_counter()
    for i in range(n_throughput):
        await publish(run_id, i)
    await asyncio.wait_for(last.wait(), 300)
    elapsed = time.perf_counter() - started
    await finish(run_id)
    await asyncio.wait_for(asyncio.gather(*tasks), 60)
    return samples, elapsed


INFLIGHT = 64
CONCURRENT_RUNS = 4


async def _concurrent_publish(
    n_events: int,
    publish: Callable[[str, int], Coroutine[Any, Any, Any]],
    finish: Callable[[str], Coroutine[Any, Any, Any]],
) -> float:
    """Seconds to publish ``n_events`` with ``INFLIGHT`` concurrent publishers over several runs."""
    run_ids = [f"conc-{uuid.uuid4().hex[:8]}-{r}" for r in range(CONCURRENT_RUNS)]
    numbers = iter(range(n_events))

    async def publisher(w: int) -> None:
        run_id = run_ids[w % CONCURRENT_RUNS]
        for i in numbers:  # shared iterator: every event is published exactly once
            await publish(run_id, i)

    started = time.perf_counter()
    await asyncio.gather(*(publisher(w) for w in range(INFLIGHT)))
    elapsed = time.perf_counter() - started
    for run_id in run_ids:
        await finish(run_id)
    return elapsed


def _concurrent_row(label: str, n: int, seconds: float, reference: str | None) -> dict[str, Any]:
    ref_op, ref_variant = (
        ("publish_pipelined", f"pipeline {PIPELINE}")
        if reference == "raw:redis-py"
        else ("publish_concurrent", f"{INFLIGHT} in-flight")
    )
    row = _rate_row(
        label,
        "publish_concurrent",
        0,
        n,
        seconds,
        {"backend": reference, "op": ref_op, "variant": ref_variant} if reference else None,
    )
    row["variant"] = f"{INFLIGHT} in-flight"
    return row


async def _bridge_measurements(
    bridge: Any, label: str, case: Mapping[str, Any], reference: str | None
) -> list[dict[str, Any]]:
    from runstore.streams.protocol import END, StreamEvent, StreamGap

    async def subscribe(run_id: str, sub: int, fan: _Fanout, ready: asyncio.Event) -> None:
        async for item in bridge.subscribe(run_id, heartbeat_interval=3600):
            if item is END:
                return
            if isinstance(item, StreamGap):
                raise RuntimeError(f"{label}: subscriber {sub} fell behind (gap)")
            if isinstance(item, StreamEvent):
                fan.received(sub, int(item.data["i"]), time.perf_counter())

    async def publish(run_id: str, i: int) -> Any:
        return await bridge.publish(run_id, "bench", {"i": i, "pad": PAD})

    async def finish(run_id: str) -> None:
        await bridge.publish_end(run_id)
        await bridge.cleanup(run_id)

    out: list[dict[str, Any]] = []
    for subs in case["subscribers"]:
        samples, elapsed = await _measure(
            subs, case["events"], case["throughput_events"], subscribe, publish, finish
        )
        out.append(_latency_row(label, subs, samples, reference))
        out.append(
            _rate_row(
                label,
                "throughput",
                subs,
                case["throughput_events"],
                elapsed,
                {"backend": reference, "op": "throughput", "variant": f"{subs} sub"}
                if reference
                else None,
            )
        )
    seconds = await _concurrent_publish(case["throughput_events"], publish, finish)
    out.append(_concurrent_row(label, case["throughput_events"], seconds, reference))
    return out


async def _queue_measurements(label: str, case: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The in-process floor: one asyncio.Queue per subscriber."""
    queues: dict[str, list[asyncio.Queue[Any]]] = {}

    async def subscribe(run_id: str, sub: int, fan: _Fanout, ready: asyncio.Event) -> None:
        q = queues[run_id][sub]
        while True:
            item = await q.get()
            if item is None:
                return
            fan.received(sub, item["i"], time.perf_counter())

    async def publish(run_id: str, i: int) -> None:
        for q in queues[run_id]:
            q.put_nowait({"i": i, "pad": PAD})

    async def finish(run_id: str) -> None:
        for q in queues.pop(run_id, []):
            q.put_nowait(None)

    out: list[dict[str, Any]] = []
    for subs in case["subscribers"]:

        async def publish_with_setup(run_id: str, i: int, _subs: int = subs) -> None:
            if run_id not in queues:
                queues[run_id] = [asyncio.Queue() for _ in range(_subs)]
            await publish(run_id, i)

        # queues must exist before subscribers start
        async def subscribe_with_setup(
            run_id: str, sub: int, fan: _Fanout, ready: asyncio.Event, _subs: int = subs
        ) -> None:
            if run_id not in queues:
                queues[run_id] = [asyncio.Queue() for _ in range(_subs)]
            await subscribe(run_id, sub, fan, ready)

        samples, elapsed = await _measure(
            subs,
            case["events"],
            case["throughput_events"],
            subscribe_with_setup,
            publish_with_setup,
            finish,
        )
        out.append(_latency_row(label, subs, samples, None))
        out.append(_rate_row(label, "throughput", subs, case["throughput_events"], elapsed, None))

    async def put_only(run_id: str, i: int) -> None:
        if run_id not in queues:
            queues[run_id] = [asyncio.Queue()]
        queues[run_id][0].put_nowait({"i": i, "pad": PAD})

    seconds = await _concurrent_publish(case["throughput_events"], put_only, finish)
    out.append(_concurrent_row(label, case["throughput_events"], seconds, None))
    return out


async def _redis_measurements(
    redis_url: str, prefix: str, label: str, case: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Raw redis-py: XADD awaited one by one, XREAD BLOCK per subscriber connection."""
    import redis.asyncio as redis

    max_subs = max(case["subscribers"])
    client = redis.Redis.from_url(redis_url, max_connections=max(max_subs, INFLIGHT) + 8)
    keys: list[str] = []
    out: list[dict[str, Any]] = []
    try:

        def key_of(run_id: str) -> str:
            key = f"{prefix}raw:{run_id}"
            if key not in keys:
                keys.append(key)
            return key

        async def subscribe(run_id: str, sub: int, fan: _Fanout, ready: asyncio.Event) -> None:
            key = key_of(run_id)
            last = "0-0"
            while True:
                reply: Any = await client.xread({key: last}, block=1000, count=500)
                for _stream, entries in reply or []:
                    for entry_id, fields in entries:
                        last = entry_id
                        if b"end" in fields:
                            return
                        fan.received(sub, int(fields[b"i"]), time.perf_counter())

        async def publish(run_id: str, i: int) -> Any:
            return await client.xadd(key_of(run_id), {"i": i, "pad": PAD})

        async def finish(run_id: str) -> None:
            await client.xadd(key_of(run_id), {"end": 1})

        for subs in case["subscribers"]:
            samples, elapsed = await _measure(
                subs, case["events"], case["throughput_events"], subscribe, publish, finish
            )
            out.append(_latency_row(label, subs, samples, None))
            out.append(
                _rate_row(label, "throughput", subs, case["throughput_events"], elapsed, None)
            )
        # The publish side alone, pipelined by 100: the rate redis-py itself reaches, which
        # the bridge's publish throughput is measured against.
        key = key_of(f"pipe-{uuid.uuid4().hex[:8]}")
        n = case["throughput_events"]
        started = time.perf_counter()
        for start in range(0, n, PIPELINE):
            pipe = client.pipeline(transaction=False)
            for i in range(start, min(n, start + PIPELINE)):
                pipe.xadd(key, {"i": i, "pad": PAD})
            await pipe.execute()
        row = _rate_row(label, "publish_pipelined", 0, n, time.perf_counter() - started, None)
        row["variant"] = f"pipeline {PIPELINE}"
        out.append(row)
    finally:
        if keys:
            await client.delete(*keys)
        await client.aclose()
    return out


async def run_streams_case(case: dict[str, Any]) -> dict[str, Any]:
    """Benchmark one bridge (and its reference) and return its measurements."""
    from runstore.loader import get_backends
    from runstore.options import BackendOptions
    from runstore.settings import Settings
    from runstore.urls import BackendURL

    label: str = case["backend"]
    url = BackendURL.parse(case["backend_url"])
    await asyncio.to_thread(Path(case["work_dir"]).mkdir, parents=True, exist_ok=True)
    spec = get_backends().streams.for_url(url)
    is_redis = url.scheme in ("redis", "rediss")
    prefix = f"rsbench:{uuid.uuid4().hex[:10]}:"
    if is_redis:
        url = url.with_query(prefix=prefix)
    # Room for the whole throughput run: a gap would end a subscriber early.
    overrides: dict[str, Any] = dict(case.get("settings") or {})
    bridge_settings = dict(overrides.get("stream_bridge") or {})
    bridge_settings.setdefault("queue_maxsize", int(case["throughput_events"]) + 16)
    overrides["stream_bridge"] = bridge_settings
    if is_redis:
        redis_settings = dict(overrides.get("redis") or {})
        redis_settings.setdefault("max_connections", max(case["subscribers"]) + 16)
        overrides["redis"] = redis_settings
    settings = Settings.load(overrides, streams=url.render(hide_password=False))
    reference = "raw:redis-py" if is_redis else "raw:asyncio.Queue"
    measurements: list[dict[str, Any]] = []
    async with AsyncExitStack() as stack:
        options = await stack.enter_async_context(BackendOptions.scope(settings))
        bridge = await spec.open(url, options)
        measurements.extend(await _bridge_measurements(bridge, label, case, reference))
    if is_redis:
        raw_url = url.without_query("prefix").render(hide_password=False)
        measurements.extend(await _redis_measurements(raw_url, prefix, "raw:redis-py", case))
        await redis_delete_prefix(raw_url, prefix)
    else:
        measurements.extend(await _queue_measurements("raw:asyncio.Queue", case))
    return {"status": "ok", "measurements": measurements}


