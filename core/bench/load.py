"""`runstore bench load`: production-shaped load on whole stacks, next to the stock stacks.

A *case* is one (stack, mode, concurrency, processes, repetition): ``concurrency``
threads, split round-robin over ``processes`` worker processes, each running
``turns`` turns (`runstore.bench.load_shard` says what a turn does). The case's child
process prepares fresh storage once, starts the workers (or, with one process, runs
the threads itself), releases them together, collects what they measured, checks
every thread's final state and journal, and drops the storage.

Cases of one (mode, concurrency, processes, repetition) form a *cell*: they run the
same workload back to back, so their digests must agree and ``summarize`` divides
each runstore stack by its stock peer (`LOAD_PEERS`).

With ``fenced`` (``--fenced``) a cell also runs each runstore stack fenced, right after
it: every run fences its stores first and every write carries the token
(`runstore.bench.load_shard`); the row says which stores were fenced
(``fenced_stores``) and whether each refuses a stale token after the run
(``fence_stale_refused``), and ``summarize`` divides the fenced stack by the unfenced one.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from runstore.bench.common import RESULT_PREFIX, latency_summary, percentile
from runstore.bench.load_shard import ERROR_CLASSES, PHASES
from runstore.bench.load_stacks import STACKS, make_stack, stack_spec
from runstore.bench.runner import INCOMPLETE, CaseRunner, Outcome, Reporter, RunOptions, run_child
from runstore.bench.servercpu import per_turn_ms, server_cpu_seconds

DEFAULT_STACKS = ("embedded", "stock-sqlite", "pg+redis", "stock")
#: The longest result line a worker may print (it carries every latency sample).
RESULT_LINE_LIMIT = 256 * 2**20
#: How long a worker may take to open its stack and say READY.
READY_SECONDS = 120.0


@dataclass(frozen=True)
class LoadCase:
    """One child-process run: one stack at one concurrency, mode and process count."""

    case_id: str
    cell_id: str
    stack: str
    mode: str
    concurrency: int
    processes: int
    turns: int
    pool_size: int
    repetition: int
    #: Every run fences its stores and carries the token on every write.
    fenced: bool = False

    @property
    def peer(self) -> bool:
        """Whether the stack is a stock peer."""
        return STACKS[self.stack]

    def params(self) -> dict[str, Any]:
        """The case's fields, as they appear in a JSONL row."""
        data = asdict(self)
        data["peer"] = self.peer
        return data


def plan_load(
    *,
    stacks: Sequence[str],
    modes: Sequence[str],
    concurrency: Sequence[int],
    processes: Sequence[int],
    turns: int,
    pool_size: int,
    repetitions: int,
    fenced: bool = False,
) -> list[LoadCase]:
    """Expand the matrix into cases in run order.

    The stacks of a cell run back to back (their order reversed on odd repetitions), so
    a runstore stack and its peer see the same machine; with ``fenced`` each runstore
    stack is followed by its fenced case (the stock stacks have no fences). A cell whose
    process count exceeds its concurrency is left out (a worker needs at least one thread).
    """
    if unknown := [s for s in stacks if s not in STACKS]:
        raise ValueError(f"unknown stack(s) {unknown}; known: {', '.join(STACKS)}")
    if bad := [m for m in modes if m not in ("full", "delta")]:
        raise ValueError(f"unknown mode(s) {bad}; accepted: full, delta")
    if not stacks or not modes or not concurrency or not processes:
        raise ValueError("give at least one stack, mode, concurrency and process count")
    if any(c < 1 for c in concurrency) or any(p < 1 for p in processes):
        raise ValueError("concurrency and processes must be >= 1")
    if turns < 1 or pool_size < 1 or repetitions < 1:
        raise ValueError("turns, pool size and repetitions must be >= 1")
    cases: list[LoadCase] = []
    for rep in range(repetitions):
        for procs in processes:
            for conc in concurrency:
                if procs > conc:
                    continue
                for mode in modes:
                    cell = f"c{conc}|p{procs}|{mode}|t{turns}|r{rep}"
                    variants = [
                        (stack, fence)
                        for stack in stacks
                        for fence in ((False, True) if fenced and not STACKS[stack] else (False,))
                    ]
                    ordered = variants if rep % 2 == 0 else list(reversed(variants))
                    for stack, fence in ordered:
                        name = f"{stack}+fenced" if fence else stack
                        cases.append(
                            LoadCase(
                                case_id=f"{name}|{cell}", cell_id=cell, stack=stack, mode=mode,
                                concurrency=conc, processes=procs, turns=turns,
                                pool_size=pool_size, repetition=rep, fenced=fence,
                            )
                        )  # fmt: skip
    return cases


# --------------------------------------------------------------------------- the case (child)


def _shards(case: Mapping[str, Any], spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    n = int(case["processes"])
    prefix = f"load-{uuid.uuid4().hex[:8]}"
    return [
        {
            **spec,
            "prefix": prefix,
            "turns": case["turns"],
            "threads": list(range(k, int(case["concurrency"]), n)),
        }
        for k in range(n)
    ]


async def _spawn(
    shards: Sequence[Mapping[str, Any]],
) -> tuple[list[dict[str, Any]], dict[str, float] | None]:
    """Start one worker per shard, release them together once all are READY, collect;
    also return the servers' CPU reading taken as they were released."""
    from runstore.bench.load_shard import GO, READY

    procs = []
    for shard in shards:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "runstore.bench.load_shard",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            limit=RESULT_LINE_LIMIT,
        )  # fmt: skip
        assert proc.stdin is not None
        proc.stdin.write(orjson.dumps(shard) + b"\n")
        await proc.stdin.drain()
        procs.append(proc)

    async def read_result(proc: Any) -> dict[str, Any]:
        while True:
            line = (await proc.stdout.readline()).decode("utf-8", "replace")
            if not line:
                await proc.wait()
                return {"status": "error", "error": f"worker exited with code {proc.returncode}"}
            if line.startswith(RESULT_PREFIX):
                result: dict[str, Any] = orjson.loads(line[len(RESULT_PREFIX) :])
                return result
            if line.strip() == READY:
                return {"status": READY}

    try:
        ready = await asyncio.wait_for(asyncio.gather(*(read_result(p) for p in procs)), READY_SECONDS)
        failed = [r for r in ready if r.get("status") != READY]
        if failed:
            raise RuntimeError(f"a worker failed to open its stack: {failed[0].get('error')}")
        servers_at_go = server_cpu_seconds()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(GO.encode() + b"\n")
            await proc.stdin.drain()
        results = list(await asyncio.gather(*(read_result(p) for p in procs)))
        for proc in procs:
            await proc.wait()
        return results, servers_at_go
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


def _merge(results: Sequence[Mapping[str, Any]], case: Mapping[str, Any]) -> dict[str, Any]:
    """One row from the workers' results: rates over the slowest worker's time."""
    turn_s = [s for r in results for s in r["turn_seconds"]]
    delivery_s = [s for r in results for s in r["delivery_seconds"]]
    elapsed = max(r["elapsed_s"] for r in results)
    out: dict[str, Any] = {
        "threads": int(case["concurrency"]),
        "elapsed_s": elapsed,
        "turns_done": len(turn_s),
        "turns_per_s": len(turn_s) / elapsed if elapsed > 0 else None,
        "events_per_s": sum(r["journal_events"] for r in results) / elapsed if elapsed > 0 else None,
        "stream_events_per_s": sum(r["stream_events"] for r in results) / elapsed
        if elapsed > 0
        else None,
    }
    out.update(latency_summary(turn_s, "turn"))
    # CPU the workers used per completed turn: what bounds turns/s once the cores are busy.
    cpu = sum(r["cpu_s"] for r in results)
    out["cpu_s"] = cpu
    out["cpu_ms_per_turn"] = cpu / len(turn_s) * 1000.0 if turn_s else None
    # Mean milliseconds per completed turn in each step (where a turn's time goes).
    phases = {p: sum(r["phase_seconds"][p] for r in results) for p in PHASES}
    out["phase_ms"] = {p: (v / len(turn_s) * 1000.0 if turn_s else None) for p, v in phases.items()}
    deliveries = latency_summary(delivery_s, "delivery")
    out["delivery_p50_ms"] = deliveries["delivery_p50_ms"]
    out["delivery_p99_ms"] = deliveries["delivery_p99_ms"]
    out["delivery_max_ms"] = percentile([s * 1000.0 for s in delivery_s], 100)
    errors = {k: sum(int(r["errors"].get(k, 0)) for r in results) for k in ERROR_CLASSES}
    for kind in ERROR_CLASSES:
        out[f"errors_{kind}"] = errors[kind]
    out["errors_total"] = sum(errors.values())
    samples: dict[str, list[str]] = {}
    for r in results:
        for kind, texts in r.get("error_samples", {}).items():
            samples.setdefault(kind, []).extend(texts)
    out["error_samples"] = {k: v[:3] for k, v in samples.items()}
    pools = [r["pool"] for r in results]
    for key in ("pool_wait_ms", "pool_checkouts", "pool_queued", "pool_errors"):
        values = [p.get(key) for p in pools if p.get(key) is not None]
        out[key] = sum(values) if values else None
    maxes = [p["pool_wait_max_ms"] for p in pools if p.get("pool_wait_max_ms") is not None]
    out["pool_wait_max_ms"] = max(maxes) if maxes else None
    rss = [r["peak_rss_bytes"] for r in results if r.get("peak_rss_bytes")]
    out["peak_rss_bytes"] = max(rss) if rss else None
    out["peak_rss_total_bytes"] = sum(rss) if rss else None
    return out


async def run_load_case(case: dict[str, Any]) -> dict[str, Any]:
    """Run one case (see the module docstring) and return its metrics."""
    from runstore.bench.load_shard import check_threads, open_shard, run_shard

    await asyncio.to_thread(Path(case["work_dir"]).mkdir, parents=True, exist_ok=True)
    spec = stack_spec(case, postgres_url=case.get("postgres_url"), redis_url=case.get("redis_url"))
    shards = _shards(case, spec)
    owner = make_stack(spec)
    try:
        await owner.prepare()
        if len(shards) == 1:
            stack, graph, metrics = await open_shard(shards[0])
            try:
                servers_before = server_cpu_seconds()
                results = [await run_shard(stack, graph, metrics, shards[0])]
                servers_after = server_cpu_seconds()
                check = await check_threads(stack, graph, shards[0], range(case["concurrency"]))
                fence = await _fence_check(stack, graph, shards[0])
            finally:
                await stack.close()
        else:
            results, servers_before = await _spawn(shards)
            servers_after = server_cpu_seconds()
            failed = [r for r in results if r.get("status") != "ok"]
            if failed:
                return {
                    "status": "error",
                    "error": f"a worker failed: {failed[0].get('error')}",
                    "traceback": failed[0].get("traceback"),
                }
            stack, graph, _ = await open_shard(shards[0])
            try:
                check = await check_threads(stack, graph, shards[0], range(case["concurrency"]))
                fence = await _fence_check(stack, graph, shards[0])
            finally:
                await stack.close()
    finally:
        await owner.teardown()
    result = _merge(results, case)
    result.update(per_turn_ms(servers_before, servers_after, result["turns_done"]))
    result.update(check)
    result.update(fence)
    if result["errors_total"] or not check["digest_ok"]:
        result["status"] = "failed"
        result["error"] = (
            f"{result['errors_total']} turn error(s) "
            + ", ".join(f"{k}={result[f'errors_{k}']}" for k in ERROR_CLASSES if result[f"errors_{k}"])
            + ("" if check["digest_ok"] else f"; {check['digest_failed_threads']} incomplete thread(s)")
        )
    elif fence.get("fence_stale_refused") is False:
        result["status"] = "failed"
        accepted = [k for k, v in fence["fence_stale_refused_by"].items() if not v]
        result["error"] = f"fenced store(s) {', '.join(accepted)} accepted a write with a stale token"
    else:
        result["status"] = "ok"
    return result


async def _fence_check(stack: Any, graph: Any, spec: Mapping[str, Any]) -> dict[str, Any]:
    """The row's fencing fields: which stores were fenced and, if any, whether each
    refuses a stale token (`runstore.bench.load_shard.check_stale_fence`)."""
    from runstore.bench.load_shard import check_stale_fence

    out: dict[str, Any] = {"fenced_stores": list(stack.fenced_stores)}
    if stack.fenced_stores:
        out.update(await check_stale_fence(stack, graph, spec))
    return out


# --------------------------------------------------------------------------- the run (parent)


def check_load_digests(rows: list[dict[str, Any]]) -> list[str]:
    """Mark ``digest_mismatch`` on every row of a cell whose complete rows disagree.

    The stacks of a cell replay the same turns, so their final states and journals
    must hash the same. Returns one message per failing cell.
    """
    by_cell: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_cell.setdefault(row["cell_id"], []).append(row)
    failures = []
    for cell_id, cell_rows in by_cell.items():
        done = [r for r in cell_rows if r.get("status") == "ok" and r.get("digest")]
        if len({r["digest"] for r in done}) <= 1:
            continue
        failures.append(
            f"{cell_id}: stacks ended with different states/journals: "
            + ", ".join(f"{r['stack']}={str(r['digest'])[:12]}" for r in done)
        )
        for r in done:
            r["status"] = "digest_mismatch"
            r["error"] = "stacks of one cell ended with different states/journals"
    return failures


def run_load(
    cases: Sequence[LoadCase],
    *,
    output: Path,
    options: RunOptions,
    argv: Sequence[str] = (),
    params: Mapping[str, Any] | None = None,
    reporter: Reporter | None = None,
    child: Callable[[Mapping[str, Any], float | None], dict[str, Any]] = run_child,
) -> Outcome:
    """Run ``cases`` one child each, checking digests per cell, writing rows per cell.

    A failing row is written with its status; a stock stack's errors are findings
    about the peer, so only runstore stacks' failures change the exit code.
    """
    runner = CaseRunner(
        "load", output, options, argv=argv, params=params, reporter=reporter, child=child
    )
    runner.reporter.start(len(cases))
    try:
        cells: dict[str, list[LoadCase]] = {}
        for case in cases:
            cells.setdefault(case.cell_id, []).append(case)
        for cell_cases in cells.values():
            rows = [runner.execute(case.params(), {}) for case in cell_cases]
            for failure in check_load_digests(rows):
                runner.outcome.failures.append(failure)
                runner.reporter.warn("DIGEST MISMATCH " + failure)
            for row in rows:
                status = row.get("status")
                if status == "failed" and row.get("peer"):
                    # The peer's errors are measurements, not a runstore failure.
                    row["status"] = "ok"
                    row["peer_failed"] = True
                    runner.reporter.warn(f"{row['case_id']}: stock stack errors: {row.get('error')}")
                elif status in INCOMPLETE or status == "failed":
                    runner.reporter.warn(f"{row['case_id']}: {status}: {row.get('error')}")
            runner.emit(rows)
    finally:
        outcome = runner.close()
    return outcome
