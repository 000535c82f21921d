"""One case of `runstore bench checkpoint`, run inside a fresh child process.

The workload is a message-only graph: each turn sends one human message and one
node answers with one AI message, both ``payload_bytes`` long and seeded, with
deterministic ids. So every backend and mode of a cell must materialize exactly
the same messages, which the canonical digest checks.
"""

from __future__ import annotations

import contextvars
import gc
import random
import time
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from runstore.bench.common import (
    GcTimer,
    Stopwatch,
    canonical_digest,
    latency_summary,
    median,
    peak_rss_bytes,
)
from runstore.bench.targets import SaverTarget

if TYPE_CHECKING:
    from langgraph.checkpoint.base import BaseCheckpointSaver
    from langgraph.graph.state import CompiledStateGraph

#: Saver methods whose calls and time the harness records.
PROBED_METHODS = ("aget_tuple", "aput", "aput_writes", "aget_delta_channel_history")
WARM_READS = 5
PHASES = ("write", "warm", "cold", "parent", "history")

_CALL: contextvars.ContextVar[str] = contextvars.ContextVar("runstore_bench_call", default="")


def make_payloads(seed: int, updates: int, payload_bytes: int) -> list[tuple[str, str]]:
    """The (human, AI) message contents of every turn; the same for every case of a cell."""
    rng = random.Random(seed)
    out: list[tuple[str, str]] = []
    for _ in range(updates):
        pair = tuple(rng.randbytes(payload_bytes // 2 + 1).hex()[:payload_bytes] for _ in range(2))
        out.append((pair[0], pair[1]))
    return out


def thread_state_schema(mode: str, snapshot_frequency: int | None) -> Any:
    """The graph state schema of ``mode``, from runstore's channel modes.

    Falls back to a local ``DeltaChannel`` schema when ``runstore.checkpoint.modes``
    is not available (it is the one place that decides how delta mode is built).
    """
    try:
        from runstore.checkpoint import modes
    except ImportError:
        return _fallback_schema(mode, snapshot_frequency)
    return modes.get_thread_state_schema(mode, snapshot_frequency=snapshot_frequency)


def freeze_mode(mode: str, snapshot_frequency: int | None) -> None:
    """Freeze the child's channel mode like a runtime process does at startup."""
    try:
        from runstore.checkpoint import modes
    except ImportError:
        return
    modes.freeze_checkpoint_channel_mode(mode)
    if snapshot_frequency is not None:
        modes.freeze_checkpoint_snapshot_frequency(snapshot_frequency)


def _fallback_schema(mode: str, snapshot_frequency: int | None) -> Any:
    import functools
    from typing import Annotated, TypedDict

    from langgraph.channels.delta import DeltaChannel
    from langgraph.graph.message import add_messages

    if mode == "full":

        class FullState(TypedDict):
            messages: Annotated[list[Any], add_messages]

        return FullState

    def fold(state: list[Any], writes: Sequence[Any]) -> list[Any]:
        return functools.reduce(add_messages, writes, state)  # type: ignore[arg-type]

    class DeltaState(TypedDict):
        messages: Annotated[
            list[Any], DeltaChannel(fold, snapshot_frequency=snapshot_frequency or 10)
        ]

    return DeltaState


def delta_config(config: dict[str, Any], mode: str) -> dict[str, Any]:
    """``config`` with runstore's delta marker injected (a no-op for full mode)."""
    try:
        from runstore.checkpoint import modes
    except ImportError:
        if mode != "delta":
            return config
        metadata = dict(config.get("metadata") or {})
        metadata["runstore_checkpoint_channel_mode"] = "delta"
        return {**config, "metadata": metadata}
    marked: Any = modes.inject_checkpoint_mode(cast(Any, config), mode)
    return dict(marked)


def build_graph(
    mode: str,
    snapshot_frequency: int | None,
    payloads: Sequence[tuple[str, str]],
    saver: BaseCheckpointSaver[Any],
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """Compile the one-node message graph of ``mode`` over ``saver``."""
    from langchain_core.messages import AIMessage
    from langgraph.graph import END, START, StateGraph

    async def agent(state: Any) -> dict[str, Any]:
        turn = int(str(state["messages"][-1].id).rsplit("-", 1)[1])
        return {"messages": [AIMessage(content=payloads[turn][1], id=f"ai-{turn:06d}")]}

    builder: StateGraph[Any, Any, Any, Any] = StateGraph(
        thread_state_schema(mode, snapshot_frequency)
    )
    builder.add_node("agent", agent)
    builder.add_edge(START, "agent")
    builder.add_edge("agent", END)
    return builder.compile(checkpointer=saver)


def message_digest(messages: Sequence[Any]) -> str:
    """Canonical digest of materialized messages: type, id and content in order."""
    return canonical_digest([m.type, m.id, m.content] for m in messages)


class Probe:
    """Counts and times saver calls, serialized bytes and reducer work, per phase."""

    def __init__(self) -> None:
        self.calls: dict[tuple[str, str], Stopwatch] = {}
        self.reducer: dict[str, Stopwatch] = {p: Stopwatch() for p in PHASES}
        self.checkpoint_rows = 0
        self.write_rows = 0
        self.checkpoint_bytes = 0
        self.write_bytes = 0

    def watch(self, phase: str, method: str) -> Stopwatch:
        """The stopwatch of ``method`` calls during ``phase``."""
        key = (phase, method)
        if key not in self.calls:
            self.calls[key] = Stopwatch()
        return self.calls[key]

    def attach_saver(self, saver: Any) -> None:
        """Wrap ``saver``'s probed methods and its serde on the instance."""
        for name in PROBED_METHODS:
            original = getattr(saver, name, None)
            if original is not None:
                setattr(saver, name, self._wrap(name, original))
        serde = getattr(saver, "serde", None)
        if serde is not None:
            saver.serde = _CountingSerde(serde, self)

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        probe = self

        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            phase = PHASE.get()
            token = _CALL.set(name)
            started = time.perf_counter()
            try:
                return await original(*args, **kwargs)
            finally:
                probe.watch(phase, name).add(started)
                _CALL.reset(token)
                if name == "aput":
                    probe.checkpoint_rows += 1
                elif name == "aput_writes":
                    writes = args[1] if len(args) > 1 else kwargs.get("writes", ())
                    probe.write_rows += len(writes)

        return wrapper

    def attach_reducer(self, graph: Any, channel: str = "messages") -> bool:
        """Time the delta channel's reducer (replay cost); ``False`` if there is none."""
        spec = getattr(graph, "channels", {}).get(channel)
        reducer = getattr(spec, "reducer", None)
        if spec is None or reducer is None:
            return False
        # Channel specs may be shared between compiled graphs: never wrap twice.
        reducer = getattr(reducer, "__bench_inner__", reducer)
        probe = self

        def timed(state: Any, writes: Sequence[Any]) -> Any:
            started = time.perf_counter()
            try:
                return reducer(state, writes)
            finally:
                probe.reducer[PHASE.get()].add(started)

        timed.__bench_inner__ = reducer  # type: ignore[attr-defined]
        spec.reducer = timed
        return True

    def count_bytes(self, size: int) -> None:
        """Attribute ``size`` serialized bytes to the saver call in progress."""
        current = _CALL.get()
        if current == "aput":
            self.checkpoint_bytes += size
        elif current == "aput_writes":
            self.write_bytes += size

    def phase_ms(self, phase: str, method: str) -> float | None:
        """Milliseconds spent in ``method`` during ``phase`` (``None`` if never called)."""
        watch = self.calls.get((phase, method))
        return watch.seconds * 1000.0 if watch else None

    def report(self) -> dict[str, Any]:
        """Per phase, per method: calls and milliseconds."""
        out: dict[str, Any] = {}
        for (phase, method), watch in sorted(self.calls.items()):
            out.setdefault(phase, {})[method] = {
                "calls": watch.calls,
                "ms": round(watch.seconds * 1000.0, 3),
            }
        return out


#: Which part of the case is running ("write", "warm", "cold").
PHASE: contextvars.ContextVar[str] = contextvars.ContextVar(
    "runstore_bench_case_phase", default="write"
)


class _CountingSerde:
    """Delegates to a saver's serde and counts the bytes it produces."""

    def __init__(self, inner: Any, probe: Probe) -> None:
        self._inner = inner
        self._probe = probe

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        kind, data = self._inner.dumps_typed(obj)
        self._probe.count_bytes(len(data))
        return kind, data

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        return self._inner.loads_typed(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def _wrap_cache(
    saver: BaseCheckpointSaver[Any], cache: str, settings: Any, stack: AsyncExitStack
) -> Any:
    """``saver`` behind runstore's `CachedHistorySaver` with a fresh ``cache`` backend.

    ``cache`` is a history-cache backend name (``memory``) or URL (``redis://...``).
    """
    from runstore.checkpoint.cache import CachedHistorySaver
    from runstore.loader import get_backends
    from runstore.options import BackendOptions
    from runstore.settings import Settings
    from runstore.urls import BackendURL

    registry = get_backends().history_caches
    if "://" in cache:
        url = BackendURL.parse(cache)
        spec = registry.for_url(url)
    else:
        spec = registry.get(cache)
        url = BackendURL.parse(f"{spec.schemes[0]}://")
    options = await stack.enter_async_context(BackendOptions.scope(Settings.load(settings or None)))
    backend = await spec.open(url, options)
    return CachedHistorySaver(saver, backend)


async def run_checkpoint_case(case: dict[str, Any]) -> dict[str, Any]:
    """Run one case and return its metrics (the row minus planning fields)."""
    from runstore.checkpoint.contracts import FencingSaver
    from runstore.checkpoint.forwarding import unwrap_saver

    mode: str = case["mode"]
    freq: int | None = case.get("snapshot_frequency")
    updates: int = case["updates"]
    payloads = make_payloads(case["seed"], updates, case["payload_bytes"])
    target = SaverTarget(
        case["backend_url"],
        Path(case["work_dir"]),
        postgres_url=case.get("postgres_url"),
        settings=case.get("settings"),
    )
    freeze_mode(mode, freq)
    result: dict[str, Any] = {}
    probe = Probe()
    thread_id = f"bench-{case.get('case_index', 0)}"
    config: Any = delta_config({"configurable": {"thread_id": thread_id}}, mode)
    stack = AsyncExitStack()
    try:
        started_open = time.perf_counter()
        storage = await target.open()
        result["open_ms"] = (time.perf_counter() - started_open) * 1000.0
        probe.attach_saver(storage)
        saver: Any = storage
        cache_obj = None
        if case.get("cache", "none") != "none":
            saver = cache_obj = await _wrap_cache(
                storage, case.get("cache_url") or case["cache"], case.get("settings"), stack
            )
        graph = build_graph(mode, freq, payloads, saver)
        result["reducer_probed"] = probe.attach_reducer(graph)

        from langchain_core.messages import HumanMessage

        latencies: list[float] = []
        gc.collect()
        result["gc_tracked_objects"] = len(gc.get_objects())
        PHASE.set("write")
        with GcTimer() as gc_timer:
            write_started = time.perf_counter()
            for turn in range(updates):
                t0 = time.perf_counter()
                await graph.ainvoke(
                    {"messages": [HumanMessage(content=payloads[turn][0], id=f"human-{turn:06d}")]},
                    config,
                )
                latencies.append(time.perf_counter() - t0)
            write_total = time.perf_counter() - write_started
        result.update(_write_metrics(latencies, write_total))
        result["write_gc_ms"] = gc_timer.seconds * 1000.0
        result["write_gc_collections"] = gc_timer.collections
        result["write_saver_ms"] = (
            sum(w.seconds for (ph, _), w in probe.calls.items() if ph == "write") * 1000.0
        )
        result["write_history_ms"] = probe.phase_ms("write", "aget_delta_channel_history")
        result["write_reducer_ms"] = probe.reducer["write"].seconds * 1000.0

        PHASE.set("warm")
        warm: list[float] = []
        warm_digest = None
        gc.collect()
        for _ in range(WARM_READS):
            t0 = time.perf_counter()
            state = await graph.aget_state(config)
            warm.append(time.perf_counter() - t0)
            warm_digest = message_digest(state.values.get("messages", []))
        result["warm_read_ms"] = median(w * 1000.0 for w in warm)
        # The saver alone: aget_tuple on the head, what every turn starts with.
        head: list[float] = []
        gc.collect()
        for _ in range(WARM_READS):
            t0 = time.perf_counter()
            await saver.aget_tuple(config)
            head.append(time.perf_counter() - t0)
        result["head_get_tuple_ms"] = median(h * 1000.0 for h in head)
        result.update(_sizes("open", await target.sizes()))
        if cache_obj is not None and hasattr(cache_obj, "stats"):
            try:
                result["cache_stats"] = _jsonable(cache_obj.stats())
            except Exception as exc:  # stats are informative only
                result["cache_stats"] = {"error": repr(exc)}

        result["checkpoint_rows"] = probe.checkpoint_rows
        result["write_rows"] = probe.write_rows
        result["checkpoint_logical_bytes"] = probe.checkpoint_bytes
        result["write_logical_bytes"] = probe.write_bytes
        result["logical_bytes"] = probe.checkpoint_bytes + probe.write_bytes

        # Cold read: a new graph over a reopened saver, as after a process restart.
        PHASE.set("cold")
        reopened = target.durable
        if reopened:
            await target.close()
            result.update(_sizes("closed", await target.sizes()))
            storage = await target.open()
            probe.attach_saver(storage)
            saver = storage
            if case.get("cache", "none") != "none":
                saver = await _wrap_cache(
                    storage, case.get("cache_url") or case["cache"], case.get("settings"), stack
                )
        else:
            result.update(_sizes("closed", {"db_bytes": None, "wal_bytes": None}))
        cold_graph = build_graph(mode, freq, payloads, saver)
        probe.attach_reducer(cold_graph)
        gc.collect()
        t0 = time.perf_counter()
        state = await cold_graph.aget_state(config)
        result["cold_read_ms"] = (time.perf_counter() - t0) * 1000.0
        result["cold_read_reopened"] = reopened
        result["cold_history_ms"] = probe.phase_ms("cold", "aget_delta_channel_history")
        result["replay_ms"] = probe.reducer["cold"].seconds * 1000.0 if mode == "delta" else None
        messages = state.values.get("messages", [])
        # The head of an aligned run is often a snapshot; its parent is then the
        # checkpoint with the longest replay (snapshot_frequency - 1 writes).
        PHASE.set("parent")
        parent_config = state.parent_config
        if parent_config is not None:
            gc.collect()
            t0 = time.perf_counter()
            await cold_graph.aget_state(parent_config)
            result["parent_read_ms"] = (time.perf_counter() - t0) * 1000.0
            result["parent_history_ms"] = probe.phase_ms("parent", "aget_delta_channel_history")
            result["parent_replay_ms"] = (
                probe.reducer["parent"].seconds * 1000.0 if mode == "delta" else None
            )
        if mode == "delta" and parent_config is not None:
            PHASE.set("history")
            result.update(await _history_metrics(storage, parent_config))
        result["messages"] = len(messages)
        result["digest"] = message_digest(messages)
        result["saver_calls"] = probe.report()
        if case.get("fenced") and isinstance(unwrap_saver(storage), FencingSaver):
            result.update(
                await _fence_metrics(cold_graph, unwrap_saver(storage), updates, payloads, mode, thread_id)
            )
        await target.close()
        if result.get("history_matches_base") is False:
            result["status"] = "failed"
            result["error"] = "delta history differs from the base-class walk on the same saver"
        elif warm_digest != result["digest"]:
            result["status"] = "failed"
            result["error"] = "warm and cold reads materialized different messages"
        elif len(messages) != 2 * updates:
            result["status"] = "failed"
            result["error"] = f"expected {2 * updates} messages, materialized {len(messages)}"
        else:
            result["status"] = "ok"
    finally:
        await stack.aclose()
        await target.close()
        await target.cleanup()
    result["peak_rss_bytes"] = peak_rss_bytes()
    return result


def _history_key(entry: Any) -> Any:
    """What must agree between two delta-history answers: seed presence and write ids."""
    writes = []
    for write in entry.get("writes", []):
        value = write[2]
        items = value if isinstance(value, list) else [value]
        writes.append([getattr(m, "id", None) or repr(m)[:80] for m in items])
    return {"seed": "seed" in entry, "writes": writes}


async def _history_metrics(storage: Any, config: Any) -> dict[str, Any]:
    """The saver's delta-history walk vs LangGraph's base-class walk on the same saver.

    Timed on the checkpoint with the longest replay; the answers must agree.
    """
    from langgraph.checkpoint.base import BaseCheckpointSaver

    channels = ["messages"]
    # Collect first: a gen-2 pass triggered by the previous read's allocations
    # would otherwise land inside whichever walk runs next.
    gc.collect()
    t0 = time.perf_counter()
    own = await storage.aget_delta_channel_history(config=config, channels=channels)
    own_s = time.perf_counter() - t0
    gc.collect()
    t0 = time.perf_counter()
    base = await BaseCheckpointSaver.aget_delta_channel_history(
        storage, config=config, channels=channels
    )
    base_s = time.perf_counter() - t0
    own_entry = own.get("messages", {})
    out: dict[str, Any] = {
        "history_writes": len(own_entry.get("writes", [])),
        "history_ms": own_s * 1000.0,
        "history_base_walk_ms": base_s * 1000.0,
        "history_speedup": base_s / own_s if own_s > 0 else None,
        "history_matches_base": _history_key(own_entry) == _history_key(base.get("messages", {})),
    }
    return out


async def _fence_metrics(
    graph: Any,
    saver: Any,
    updates: int,
    payloads: Sequence[tuple[str, str]],
    mode: str,
    thread_id: str,
) -> dict[str, Any]:
    """Fenced vs unfenced turns on one saver: the same turns on two fresh threads, one
    fenced first (``afence_thread``, as a lease grant does) and then carrying its token on
    every write (``configurable.runstore_fence``), alternating turn by turn so both see the
    same machine and the same database size."""
    from langchain_core.messages import HumanMessage

    from runstore.checkpoint.rules import FENCE_KEY

    configs = {
        "unfenced": delta_config({"configurable": {"thread_id": f"{thread_id}-u"}}, mode),
        "fenced": delta_config({"configurable": {"thread_id": f"{thread_id}-f", FENCE_KEY: 2}}, mode),
    }
    # What a worker does on taking a lease: the thread's fence is raised before any write,
    # so every fenced write below is checked against a stored fence, not an absent one.
    await saver.afence_thread(f"{thread_id}-f", 2)
    spent = dict.fromkeys(configs, 0.0)
    for turn in range(updates):
        # Alternate which goes first, so neither always follows the other's commit.
        order = list(configs) if turn % 2 == 0 else list(reversed(configs))
        for name in order:
            t0 = time.perf_counter()
            await graph.ainvoke(
                {"messages": [HumanMessage(content=payloads[turn][0], id=f"human-{turn:06d}")]},
                configs[name],
            )
            spent[name] += time.perf_counter() - t0
    unfenced = updates / spent["unfenced"] if spent["unfenced"] else None
    fenced = updates / spent["fenced"] if spent["fenced"] else None
    return {
        "fence_stale_refused": await _stale_write_refused(graph, configs["fenced"], payloads[0][0], 0),
        "fence_unfenced_turns_per_s": unfenced,
        "fence_fenced_turns_per_s": fenced,
        "fence_turns_ratio": (fenced / unfenced) if fenced and unfenced else None,
    }


async def _stale_write_refused(graph: Any, fenced: Any, text: str, turn: int) -> bool:
    """Whether a turn carrying an older token than the thread's fence is refused (the
    check the fenced turns paid for was really made)."""
    from langchain_core.messages import HumanMessage

    from runstore.checkpoint.rules import FENCE_KEY
    from runstore.errors import StaleFenceError

    stale = {**fenced, "configurable": {**fenced["configurable"], FENCE_KEY: 1}}
    try:
        await graph.ainvoke({"messages": [HumanMessage(content=text, id=f"human-{turn:06d}")]}, stale)
    except StaleFenceError:
        return True
    return False


def _write_metrics(latencies: Sequence[float], total: float) -> dict[str, Any]:
    n = len(latencies)
    out: dict[str, Any] = {
        "write_total_s": total,
        "turns_per_s": n / total if total > 0 else None,
    }
    out.update(latency_summary(latencies, "turn"))
    window = max(1, n // 10)
    mid = max(0, n // 2 - window // 2)
    for name, chunk in (
        ("first", latencies[:window]),
        ("middle", latencies[mid : mid + window]),
        ("last", latencies[-window:]),
    ):
        out[f"window_{name}_ms"] = (sum(chunk) / len(chunk) * 1000.0) if chunk else None
    return out


def _sizes(when: str, sizes: dict[str, int | None]) -> dict[str, int | None]:
    return {f"db_bytes_{when}": sizes.get("db_bytes"), f"wal_bytes_{when}": sizes.get("wal_bytes")}


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    if hasattr(value, "__dict__"):
        return _jsonable(vars(value))
    if hasattr(value, "_asdict"):
        return _jsonable(value._asdict())
    return repr(value)
