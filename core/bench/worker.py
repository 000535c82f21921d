"""Child-process entry point: ``python -m runstore.bench.worker`` runs one case.

The parent writes the case as JSON on stdin; the child prints one line
``RUNSTORE-BENCH-RESULT <json>`` on stdout. Anything else the child prints (driver
warnings, say) is ignored. A fresh process per case keeps caches, pools, garbage
and peak RSS of one case out of the next.
"""

from __future__ import annotations

import asyncio
import sys
import time
import traceback
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import orjson

from runstore.bench.common import RESULT_PREFIX


def _runner(bench: str) -> Callable[[dict[str, Any]], Coroutine[Any, Any, dict[str, Any]]]:
    if bench == "checkpoint":
        from runstore.bench.checkpoint import run_checkpoint_case

        return run_checkpoint_case
    if bench == "events":
        from runstore.bench.events import run_events_case

        return run_events_case
    if bench == "streams":
        from runstore.bench.streams import run_streams_case

        return run_streams_case
    if bench == "runs":
        from runstore.bench.runs import run_runs_case

        return run_runs_case
    if bench == "store":
        from runstore.bench.store import run_store_case

        return run_store_case
    if bench == "threads":
        from runstore.bench.threads import run_threads_case

        return run_threads_case
    if bench == "load":
        from runstore.bench.load import run_load_case

        return run_load_case
    if bench == "migrate":
        from runstore.bench.migrate import run_migrate_case

        return run_migrate_case
    if bench == "selftest":
        return _selftest_case
    raise ValueError(f"unknown benchmark {bench!r}")


async def _selftest_case(case: dict[str, Any]) -> dict[str, Any]:
    """A trivial case for the harness's own tests (sleep, fail or return a digest)."""
    await asyncio.sleep(float(case.get("sleep", 0)))
    if case.get("fail"):
        raise RuntimeError("selftest failure requested")
    return {"status": "ok", "digest": case.get("digest", "d")}


#: Imported before a profiled case starts, so profiles show the case, not imports.
_WARM_IMPORTS = {
    "checkpoint": (
        "langchain_core.messages",
        "langgraph.graph",
        "langgraph.checkpoint.memory",
        "runstore.checkpoint.modes",
        "runstore.checkpoint.cache",
        "runstore.loader",
    ),
    "events": ("runstore.loader", "runstore.sql"),
    "streams": ("runstore.loader", "runstore.streams.protocol"),
    "runs": ("runstore.loader", "runstore.runs.sql"),
    "threads": ("runstore.loader", "runstore.sweeper"),
    "load": ("langchain_core.messages", "langgraph.graph", "runstore.loader"),
    "migrate": ("runstore.migrate.transfer", "runstore.loader"),
}


def _warm_imports(bench: str) -> None:
    import importlib

    for name in _WARM_IMPORTS.get(bench, ()):
        try:
            importlib.import_module(name)
        except ImportError:
            pass


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    """Run ``case`` (optionally under cProfile) and return its result, never raising."""
    runner = _runner(case["bench"])
    _warm_imports(case["bench"])
    started = time.perf_counter()
    result: dict[str, Any]
    profile_path = case.get("profile_path")
    try:
        if profile_path:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
            try:
                result = asyncio.run(runner(case))
            finally:
                profiler.disable()
                Path(profile_path).parent.mkdir(parents=True, exist_ok=True)
                profiler.dump_stats(profile_path)
        else:
            result = asyncio.run(runner(case))
    except Exception as exc:
        result = {
            "status": "error",
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(limit=12),
        }
    result.setdefault("status", "ok")
    result["case_seconds"] = time.perf_counter() - started
    return result


def main() -> None:
    """Read a case from stdin, run it, print the result line."""
    case = orjson.loads(sys.stdin.buffer.read())
    result = run_case(case)
    sys.stdout.write(RESULT_PREFIX + orjson.dumps(result, default=str).decode() + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
