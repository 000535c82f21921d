"""`runstore bench runs`: the run store's lifecycle and lease renewal rates.

Each case (one backend, one repetition) runs in a fresh child process and measures:

- ``create_start_finalize``: ``--cycles`` runs, each created, started and finalized
  (three write transactions), round-robin over 16 threads, one after another;
- ``renew``: ``--renewals`` ``renew_lease`` calls on one running run.

There is no raw reference: the figures are compared across backends of one run
(sqlite vs PostgreSQL), as rates per second.
"""

from __future__ import annotations

import asyncio
import uuid
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from runstore.bench.events import _measurement, _time_calls
from runstore.bench.targets import (
    POSTGRES_SCHEMES,
    fresh_schema,
    is_file_url,
    postgres_drop_schema,
    postgres_dsn,
    relocate,
)

THREADS = 16


async def run_runs_case(case: dict[str, Any]) -> dict[str, Any]:
    """Benchmark one run store and return its measurements."""
    from runstore.loader import get_backends
    from runstore.options import BackendOptions
    from runstore.settings import Settings
    from runstore.urls import BackendURL

    label: str = case["backend"]
    url = BackendURL.parse(case["backend_url"])
    work_dir = Path(case["work_dir"])
    await asyncio.to_thread(work_dir.mkdir, parents=True, exist_ok=True)
    spec = get_backends().runs.for_url(url)
    pg_dsn = pg_schema = None
    if url.scheme in POSTGRES_SCHEMES:
        pg_dsn = postgres_dsn(url)
        pg_schema = fresh_schema("rsbench_runs")
        url = url.with_query(schema=pg_schema)
    elif is_file_url(url):
        url, _ = relocate(url, work_dir, "runs.db")
    settings = Settings.load(case.get("settings") or None, runs=url.render(hide_password=False))
    measurements: list[dict[str, Any]] = []
    prefix = uuid.uuid4().hex[:8]
    try:
        async with AsyncExitStack() as stack:
            options = await stack.enter_async_context(BackendOptions.scope(settings))
            store = await spec.open(url, options)

            async def cycle(i: int) -> None:
                created = await store.create(f"{prefix}-t{i % THREADS}")
                run_id = created.run["run_id"]
                await store.start(run_id, "bench", 60)
                await store.finalize(run_id, "bench", "success")

            durations = await _time_calls(case["cycles"], cycle, budget=None)
            measurements.append(
                _measurement(
                    "create_start_finalize", "1", label, durations,
                    units=len(durations), metric="rate_per_s", reference=None,
                )
            )  # fmt: skip
            created = await store.create(f"{prefix}-renew")
            run_id = created.run["run_id"]
            await store.start(run_id, "bench", 60)

            async def renew(_: int) -> None:
                renewed, _cancel = await store.renew_lease(run_id, "bench", 60)
                assert renewed

            durations = await _time_calls(case["renewals"], renew, budget=None)
            measurements.append(
                _measurement(
                    "renew", "1", label, durations,
                    units=len(durations), metric="rate_per_s", reference=None,
                )
            )  # fmt: skip
    finally:
        if pg_dsn is not None and pg_schema is not None:
            await postgres_drop_schema(pg_dsn, pg_schema)
    return {"status": "ok", "measurements": measurements}
