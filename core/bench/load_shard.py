"""One worker process of a `runstore bench load` cell: its share of the threads.

Every thread runs its turns one after another; the threads of a worker run
concurrently on its event loop. A turn is what a runtime does for one run:

1. a live subscriber attaches to the run's stream;
2. the message graph runs with the saver; its node publishes ``STREAM_EVENTS``
   stream events (as a model streams tokens), then answers with one AI message;
3. the stream is ended, the turn's ``JOURNAL_EVENTS`` journal events are appended
   with one ``put_batch``, and the thread's state is read once (``aget_state``), as a
   UI does;
4. the turn ends when the subscriber has received every event in order; the run's
   stream is dropped.

In a fenced case (``--fenced``) each turn is one run holding a lease: before step 1
its stores are fenced with the turn's token (`fence_token`), as a lease grant does,
and every checkpoint write (``configurable.runstore_fence``), journal append and
stream publish of the turn carries it (`runstore.bench.load_stacks` says which stores).

Run as ``python -m runstore.bench.load_shard`` by a cell with several processes:
the shard reads its spec as one JSON line, opens its stack, prints ``READY``, waits
for ``GO`` on stdin (so every worker starts together), runs and prints its result
line.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from runstore.bench.common import RESULT_PREFIX, canonical_digest, peak_rss_bytes

STREAM_EVENTS = 20
JOURNAL_EVENTS = 5
CONTENT_BYTES = 128
#: A turn's subscriber must be done this long after the turn's work (else: lost events).
DRAIN_SECONDS = 60.0
#: Error messages kept per class (the counts are complete).
ERROR_SAMPLES = 3

#: The steps of a turn, timed separately: fencing the run's stores (fenced cases only),
#: the graph run (with its stream publishes), ending the stream, the journal flush, the
#: UI's state read, waiting for the subscriber to drain, dropping the stream.
PHASES = ("fence", "graph", "end", "journal", "read", "drain", "cleanup")

#: The classes of `classify`, as counted in rows (``errors_<class>``).
ERROR_CLASSES = ("locked", "pool", "timeout", "lost", "other")

READY = "READY"
GO = "GO"

#: (thread index, turn, run id, fencing token or None) of the turn the graph node is running.
_TURN: contextvars.ContextVar[tuple[int, int, str, int | None]] = contextvars.ContextVar(
    "runstore_bench_turn"
)
#: The token a stale writer carries in the fenced cases' refusal check (`check_stale_fence`):
#: older than every turn's (`fence_token`).
STALE_FENCE = 1


def thread_id(prefix: str, index: int) -> str:
    """The id of thread ``index`` of a case."""
    return f"{prefix}-t{index:04d}"


def run_id(prefix: str, index: int, turn: int) -> str:
    """The id of the run of ``turn`` on thread ``index``."""
    return f"{prefix}-t{index:04d}-r{turn:04d}"


def fence_token(turn: int) -> int:
    """The fencing token of ``turn``'s run: a new, higher one per run of a thread, as
    successive lease grants give (from 2, so `STALE_FENCE` is older than all)."""
    return turn + 2


def content(kind: str, index: int, turn: int, k: int = 0) -> str:
    """Deterministic text of one message or event (the same for every stack)."""
    head = f"{kind} t{index} r{turn} k{k} "
    return (head * (CONTENT_BYTES // len(head) + 1))[:CONTENT_BYTES]


def journal_events(thread: str, run: str, index: int, turn: int) -> list[dict[str, Any]]:
    """The turn's journal flush: the human and AI messages and three trace steps."""
    kinds = [("human", "message")] + [("trace_step", "trace")] * 3 + [("ai_message", "message")]
    return [
        {
            "thread_id": thread,
            "run_id": run,
            "event_type": event_type,
            "category": category,
            "content": content(event_type, index, turn, k),
            "metadata": {"k": k, "turn": turn},
        }
        for k, (event_type, category) in enumerate(kinds[:JOURNAL_EVENTS])
    ]


def classify(exc: BaseException) -> str:
    """The error class counted in a row: ``locked``, ``pool`` (no pooled connection in
    time), ``lost`` (a stream event missing, duplicated or out of order), ``timeout``
    (a call timed out, waiting for a pool or for the server: the message says) or
    ``other``."""
    from runstore.bench.load_stacks import StreamBroken

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current).lower()
        kind = type(current).__name__
        if "database is locked" in text or "database table is locked" in text:
            return "locked"
        if isinstance(current, StreamBroken):
            return "lost"
        if kind in ("PoolTimeout", "TooManyConnectionsError", "TooManyConnections") or (
            "queuepool limit" in text
            or "too many clients" in text
            or "too many connections" in text
            or "couldn't get a connection" in text
        ):
            return "pool"
        current = current.__cause__ or current.__context__
    timed_out = any(isinstance(e, TimeoutError) or "timed out" in str(e).lower() for e in _chain(exc))
    return "timeout" if timed_out else "other"


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in out:
        out.append(current)
        current = current.__cause__ or current.__context__
    return out


class Metrics:
    """What a worker measured: latencies, counts and errors by class."""

    def __init__(self) -> None:
        self.turn_seconds: list[float] = []
        self.delivery_seconds: list[float] = []
        self.journal_events = 0
        self.stream_events = 0
        self.errors: dict[str, int] = dict.fromkeys(ERROR_CLASSES, 0)
        self.samples: dict[str, list[str]] = {}
        #: Seconds spent in each step of the turns that completed (`PHASES`).
        self.phase_seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)

    def error(self, kind: str, message: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1
        kept = self.samples.setdefault(kind, [])
        if len(kept) < ERROR_SAMPLES:
            kept.append(message[:300])


def build_load_graph(mode: str, stack: Any, metrics: Metrics) -> Any:
    """The message graph of ``mode`` over ``stack.saver``; its node streams, then answers."""
    from langchain_core.messages import AIMessage
    from langgraph.graph import END, START, StateGraph

    from runstore.bench.checkpoint import thread_state_schema

    async def agent(state: Any) -> dict[str, Any]:
        index, turn, run, fence = _TURN.get()
        for i in range(STREAM_EVENTS):
            data = {"i": i, "t": time.perf_counter(), "tok": content("tok", index, turn, i)[:16]}
            await stack.publish(run, data, fence)
        return {"messages": [AIMessage(content=content("ai", index, turn), id=f"ai-{turn:04d}")]}

    builder: Any = StateGraph(thread_state_schema(mode, None))
    builder.add_node("agent", agent)
    builder.add_edge(START, "agent")
    builder.add_edge("agent", END)
    return builder.compile(checkpointer=stack.saver)


async def _subscriber(stack: Any, run: str, metrics: Metrics) -> None:
    from runstore.bench.load_stacks import StreamBroken

    expected = 0
    async for data in stack.subscribe(run):
        now = time.perf_counter()
        i = int(data["i"])
        if i != expected:
            raise StreamBroken(f"{run}: got event {i}, expected {expected} (lost or out of order)")
        expected += 1
        metrics.delivery_seconds.append(now - float(data["t"]))
    if expected != STREAM_EVENTS:
        raise StreamBroken(f"{run}: stream ended after {expected} of {STREAM_EVENTS} events")
    metrics.stream_events += expected


async def run_thread(
    graph: Any, stack: Any, spec: Mapping[str, Any], index: int, metrics: Metrics
) -> None:
    """Every turn of thread ``index``; a failed turn is counted and the next one runs."""
    from langchain_core.messages import HumanMessage

    from runstore.bench.checkpoint import delta_config
    from runstore.checkpoint.rules import FENCE_KEY

    prefix = spec["prefix"]
    thread = thread_id(prefix, index)
    fenced = bool(stack.fenced_stores)
    for turn in range(int(spec["turns"])):
        run = run_id(prefix, index, turn)
        fence = fence_token(turn) if fenced else None
        configurable: dict[str, Any] = {"thread_id": thread}
        if fence is not None and "checkpointer" in stack.fenced_stores:
            configurable[FENCE_KEY] = fence
        config: Any = delta_config({"configurable": configurable}, spec["mode"])
        started = time.perf_counter()
        token = _TURN.set((index, turn, run, fence))
        marks = [started]
        listener: asyncio.Task[None] | None = None
        try:
            if fence is not None:
                # What a worker does on taking the run's lease, before any write.
                await stack.fence_run(thread, run, fence)
            marks.append(time.perf_counter())
            listener = asyncio.create_task(_subscriber(stack, run, metrics))
            await graph.ainvoke(
                {"messages": [HumanMessage(content=content("human", index, turn), id=f"human-{turn:04d}")]},
                config,
            )
            marks.append(time.perf_counter())
            await stack.publish_end(run, fence)
            marks.append(time.perf_counter())
            await stack.put_events(journal_events(thread, run, index, turn), fence)
            metrics.journal_events += JOURNAL_EVENTS
            marks.append(time.perf_counter())
            state = await graph.aget_state(config)
            last = state.values.get("messages", [])[-1:]
            if not last or last[0].content != content("ai", index, turn):
                raise AssertionError(f"{thread}: the state read after turn {turn} misses its answer")
            marks.append(time.perf_counter())
            await asyncio.wait_for(asyncio.shield(listener), DRAIN_SECONDS)
            marks.append(time.perf_counter())
            await stack.finish_run(run)
            marks.append(time.perf_counter())
            metrics.turn_seconds.append(marks[-1] - started)
            for phase, begin, end in zip(PHASES, marks[:-1], marks[1:], strict=True):
                metrics.phase_seconds[phase] += end - begin
        except BaseException as exc:
            if listener is not None:
                if not listener.done():
                    listener.cancel()
                await asyncio.gather(listener, return_exceptions=True)
            if isinstance(exc, asyncio.CancelledError):
                raise
            # The subscriber not done DRAIN_SECONDS after the turn: its events are lost.
            kind = "lost" if isinstance(exc, TimeoutError) else classify(exc)
            metrics.error(kind, f"{thread} turn {turn}: {type(exc).__name__}: {exc}")
        finally:
            _TURN.reset(token)


async def open_shard(spec: Mapping[str, Any]) -> tuple[Any, Any, Metrics]:
    """Open the stack and build the graph (not timed)."""
    from runstore.bench.checkpoint import freeze_mode
    from runstore.bench.load_stacks import make_stack

    freeze_mode(spec["mode"], None)
    stack = make_stack(spec)
    try:
        await stack.open()
    except BaseException:
        await stack.close()
        raise
    metrics = Metrics()
    return stack, build_load_graph(spec["mode"], stack, metrics), metrics


async def run_shard(stack: Any, graph: Any, metrics: Metrics, spec: Mapping[str, Any]) -> dict[str, Any]:
    """Run this worker's threads concurrently and return what it measured."""
    cpu_started = _cpu_seconds()
    started = time.perf_counter()
    await asyncio.gather(
        *(run_thread(graph, stack, spec, index, metrics) for index in spec["threads"])
    )
    elapsed = time.perf_counter() - started
    return {
        "elapsed_s": elapsed,
        "cpu_s": _cpu_seconds() - cpu_started,
        "turn_seconds": metrics.turn_seconds,
        "delivery_seconds": metrics.delivery_seconds,
        "journal_events": metrics.journal_events,
        "stream_events": metrics.stream_events,
        "errors": metrics.errors,
        "phase_seconds": metrics.phase_seconds,
        "error_samples": metrics.samples,
        "pool": stack.pool_stats(),
        "peak_rss_bytes": peak_rss_bytes(),
    }


def _cpu_seconds() -> float:
    """CPU time (user + system) this process used so far, its driver threads included."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def check_threads(
    stack: Any, graph: Any, spec: Mapping[str, Any], indexes: Sequence[int]
) -> dict[str, Any]:
    """After the run: every thread's final state and journal complete and in order.

    Returns ``digest_ok``, up to 5 ``digest_failures`` and ``digest``: a hash over each
    thread's messages and journal (ids and storage-assigned seqs left out), the same
    for every stack and mode of one workload.
    """
    from runstore.bench.checkpoint import delta_config

    prefix, turns = spec["prefix"], int(spec["turns"])
    failures: list[str] = []
    items: list[Any] = []
    for index in indexes:
        thread = thread_id(prefix, index)
        config: Any = delta_config({"configurable": {"thread_id": thread}}, spec["mode"])
        state = await graph.aget_state(config)
        messages = [(m.type, m.content) for m in state.values.get("messages", [])]
        expected_messages = []
        for turn in range(turns):
            expected_messages += [("human", content("human", index, turn)), ("ai", content("ai", index, turn))]
        problems = []
        if messages != expected_messages:
            problems.append(f"{len(messages)} messages, expected {2 * turns} (or content differs)")
        runs = [run_id(prefix, index, turn) for turn in range(turns)]
        feed = await stack.read_feed(thread, runs)
        keys = [row[0] for row in feed]
        journal = [(row[1], row[2], row[3]) for row in feed]
        expected_journal = [
            (e["run_id"], e["event_type"], e["content"])
            for turn in range(turns)
            for e in journal_events(thread, run_id(prefix, index, turn), index, turn)
        ]
        if journal != expected_journal or keys != sorted(set(keys)):
            problems.append(
                f"journal holds {len(journal)} events, expected {len(expected_journal)} "
                "(or out of order)"
            )
        if problems:
            failures.append(f"{thread}: " + "; ".join(problems))
        items.append([index, messages, [(t, c) for _r, t, c in journal]])
    return {
        "digest_ok": not failures,
        "digest_failures": failures[:5],
        "digest_failed_threads": len(failures),
        "digest": canonical_digest(items),
    }


async def check_stale_fence(stack: Any, graph: Any, spec: Mapping[str, Any]) -> dict[str, Any]:
    """After a fenced run: whether each fenced store refuses a write of thread 0's last run
    carrying `STALE_FENCE` (the check the fenced turns paid for was really made).

    Returns ``fence_stale_refused`` (every fenced store refused; ``None`` when none is
    fenced) and ``fence_stale_refused_by`` (per kind)."""
    from langchain_core.messages import HumanMessage

    from runstore.bench.checkpoint import delta_config
    from runstore.checkpoint.rules import FENCE_KEY
    from runstore.errors import StaleFenceError

    prefix, last = spec["prefix"], int(spec["turns"]) - 1
    thread, run = thread_id(prefix, 0), run_id(prefix, 0, last)
    stale_run = f"{run}-stale"

    async def checkpoint() -> None:
        config: Any = delta_config(
            {"configurable": {"thread_id": thread, FENCE_KEY: STALE_FENCE}}, spec["mode"]
        )
        token = _TURN.set((0, last, stale_run, None))
        try:
            await graph.ainvoke({"messages": [HumanMessage(content="stale", id="human-stale")]}, config)
        finally:
            _TURN.reset(token)
            await stack.finish_run(stale_run)

    async def events() -> None:
        await stack.put_events(journal_events(thread, run, 0, last)[:1], STALE_FENCE)

    async def streams() -> None:
        await stack.publish(run, {"i": 0, "t": 0.0, "tok": "stale"}, STALE_FENCE)

    checks = {"checkpointer": checkpoint, "events": events, "streams": streams}
    refused: dict[str, bool] = {}
    for kind in stack.fenced_stores:
        try:
            await checks[kind]()
        except StaleFenceError:
            refused[kind] = True
        else:
            refused[kind] = False
    return {
        "fence_stale_refused": all(refused.values()) if refused else None,
        "fence_stale_refused_by": refused,
    }


async def _serve() -> None:
    """The ``READY`` / ``GO`` protocol of a worker process (see the module docstring)."""
    loop = asyncio.get_running_loop()
    spec = orjson.loads(await loop.run_in_executor(None, sys.stdin.buffer.readline))
    stack = None
    try:
        stack, graph, metrics = await open_shard(spec)
        print(READY, flush=True)
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if line.strip() != GO:
            raise RuntimeError(f"expected {GO!r} on stdin, got {line!r}")
        result = await run_shard(stack, graph, metrics, spec)
        result["status"] = "ok"
    except Exception as exc:
        result = {
            "status": "error",
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(limit=12),
        }
    finally:
        if stack is not None:
            await stack.close()
    sys.stdout.write(RESULT_PREFIX + orjson.dumps(result).decode() + "\n")
    sys.stdout.flush()


def main() -> None:
    """Entry point of ``python -m runstore.bench.load_shard``."""
    asyncio.run(_serve())


if __name__ == "__main__":
    main()
