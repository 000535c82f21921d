"""`runstore bench events`: put_batch and message pages, next to raw driver SQL.

Each case (one backend, one repetition) runs in a fresh child process and measures,
on the store and, for SQL backends, on a plain table written with the raw driver
(aiosqlite and stdlib sqlite3 for sqlite, asyncpg for PostgreSQL):

- ``put_batch``: ``--batches`` batches of ``--batch-size`` events to one thread;
  the raw reference reads ``max(seq)`` and inserts the same rows with
  ``executemany`` in one transaction.
- ``page_latest`` / ``page_before``: the newest message page and pages below a
  random cursor, on threads of each ``--thread-sizes`` events (half messages,
  half traces, interleaved); the raw reference runs the same indexed SELECT.
"""

from __future__ import annotations

import functools
import random
import sqlite3
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from .common import latency_summary
from .runner import CaseRunner, Outcome, Reporter, RunOptions, display_backend
from .targets import (
    POSTGRES_SCHEMES,
    fresh_schema,
    is_file_url,
    postgres_create_schema,
    postgres_drop_schema,
    postgres_dsn,
    relocate,
)

CONTENT_BYTES = 200
POPULATE_CHUNK = 500


def make_events(thread_id: str, start: int, count: int, rng: random.Random) -> list[dict[str, Any]]:
    """``count`` events alternating message / trace, with seeded content."""
    out = []
    for i in range(start, start + count):
        message = i % 2 == 0
        out.append(
            {
                "thread_id": thread_id,
                "run_id": f"run-{i // 100}",
                "event_type": "ai_message" if message else "trace_step",
                "category": "message" if message else "trace",
                "content": rng.randbytes(CONTENT_BYTES // 2).hex(),
                "metadata": {"i": i, "task_id": f"t{i % 7}"},
            }
        )
    return out


def _measurement(
    op: str,
    variant: str,
    backend: str,
    durations: Sequence[float],
    *,
    units: int,
    metric: str,
    reference: Mapping[str, str] | None,
) -> dict[str, Any]:
    total = sum(durations)
    out: dict[str, Any] = {
        "op": op,
        "variant": variant,
        "backend": backend,
        "metric": metric,
        "reference": dict(reference) if reference else None,
        "count": len(durations),
        "rate_per_s": (units / total) if total > 0 else None,
    }
    summary = latency_summary(durations, "lat")
    out["p50_ms"] = summary["lat_p50_ms"]
    out["p95_ms"] = summary["lat_p95_ms"]
    out["p99_ms"] = summary["lat_p99_ms"]
    out["mean_ms"] = summary["lat_mean_ms"]
    return out


#: A timed loop stops early after this many seconds once it has this many samples,
#: so a slow backend (JSONL pages on a 100k-event thread) cannot stall the run.
BUDGET_SECONDS = 20.0
MIN_SAMPLES = 10


async def _time_calls(
    n: int, call: Callable[[int], Awaitable[Any]], *, budget: float | None = BUDGET_SECONDS
) -> list[float]:
    durations = []
    started = time.perf_counter()
    for i in range(n):
        t0 = time.perf_counter()
        await call(i)
        durations.append(time.perf_counter() - t0)
        if budget is not None and i + 1 >= MIN_SAMPLES and t0 - started > budget:
            break
    return durations


# --------------------------------------------------------------------------- raw references


class RawSqlite:
    """The reference for sqlite: one plain events table, aiosqlite or stdlib sqlite3."""

    DDL = (
        "CREATE TABLE IF NOT EXISTS raw_events (id INTEGER PRIMARY KEY, thread_id TEXT NOT NULL, "
        "run_id TEXT NOT NULL, event_type TEXT NOT NULL, category TEXT NOT NULL, content TEXT, "
        "metadata TEXT NOT NULL, seq INTEGER NOT NULL, created_at TEXT NOT NULL, "
        "UNIQUE (thread_id, seq))",
        "CREATE INDEX IF NOT EXISTS raw_events_msg ON raw_events (thread_id, category, seq)",
    )
    INSERT = (
        "INSERT INTO raw_events (thread_id, run_id, event_type, category, content, metadata, "
        "seq, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
    )
    PAGE = (
        "SELECT thread_id, run_id, event_type, category, content, metadata, seq, created_at "
        "FROM raw_events WHERE thread_id = ? AND category = 'message' AND seq < ? "
        "ORDER BY seq DESC LIMIT ?"
    )

    def __init__(self, path: Path, synchronous: str) -> None:
        self.path = path
        self.synchronous = synchronous.upper()

    def _pragmas(self, conn: Any) -> list[str]:
        return ["PRAGMA journal_mode=WAL", f"PRAGMA synchronous={self.synchronous}"]

    @staticmethod
    def rows(events: Sequence[Mapping[str, Any]], first_seq: int) -> list[tuple[Any, ...]]:
        now = datetime.now(UTC).isoformat()
        return [
            (
                e["thread_id"],
                e["run_id"],
                e["event_type"],
                e["category"],
                e["content"],
                orjson.dumps(e["metadata"]).decode(),
                first_seq + i,
                now,
            )
            for i, e in enumerate(events)
        ]

    @staticmethod
    def decode(rows: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
        keys = ("thread_id", "run_id", "event_type", "category", "content", "metadata", "seq")
        out = []
        for row in reversed(rows):
            rec = dict(zip(keys, row, strict=False))
            rec["metadata"] = orjson.loads(row[5])
            rec["created_at"] = row[7]
            out.append(rec)
        return out


async def _raw_aiosqlite(
    raw: RawSqlite, label: str, params: Mapping[str, Any], rng: random.Random
) -> list[dict[str, Any]]:
    import aiosqlite

    out: list[dict[str, Any]] = []
    async with aiosqlite.connect(str(raw.path), isolation_level=None) as conn:
        for pragma in raw._pragmas(conn):
            await conn.execute(pragma)
        for ddl in raw.DDL:
            await conn.execute(ddl)
        batch_size = params["batch_size"]

        async def put(i: int) -> None:
            events = make_events("raw-put", i * batch_size, batch_size, rng)
            await conn.execute("BEGIN IMMEDIATE")
            cur = await conn.execute(
                "SELECT coalesce(max(seq), 0) FROM raw_events WHERE thread_id = ?", ("raw-put",)
            )
            row = await cur.fetchone()
            await conn.executemany(raw.INSERT, raw.rows(events, int(row[0]) + 1 if row else 1))
            await conn.execute("COMMIT")

        durations = await _time_calls(params["batches"], put)
        out.append(
            _measurement(
                "put_batch",
                str(batch_size),
                label,
                durations,
                units=params["batches"] * batch_size,
                metric="rate_per_s",
                reference=None,
            )
        )
        for size in params["thread_sizes"]:
            thread = f"raw-page-{size}"
            for start in range(0, size, POPULATE_CHUNK):
                n = min(POPULATE_CHUNK, size - start)
                await conn.execute("BEGIN")
                await conn.executemany(
                    raw.INSERT, raw.rows(make_events(thread, start, n, rng), start + 1)
                )
                await conn.execute("COMMIT")
            out.extend(
                await _page_measurements(
                    label,
                    size,
                    params,
                    functools.partial(_aiosqlite_page, conn, raw, thread),
                    reference=None,
                )
            )
    return out


async def _aiosqlite_page(
    conn: Any, raw: RawSqlite, thread: str, before: int | None, limit: int
) -> list[dict[str, Any]]:
    cur = await conn.execute(raw.PAGE, (thread, before if before is not None else 2**62, limit))
    return raw.decode(await cur.fetchall())


async def _raw_sqlite3(
    raw: RawSqlite, label: str, params: Mapping[str, Any], rng: random.Random
) -> list[dict[str, Any]]:
    conn = sqlite3.connect(str(raw.path), isolation_level=None)
    try:
        for pragma in raw._pragmas(conn):
            conn.execute(pragma)
        for ddl in raw.DDL:
            conn.execute(ddl)
        batch_size = params["batch_size"]

        async def put(i: int) -> None:
            events = make_events("raw3-put", i * batch_size, batch_size, rng)
            conn.execute("BEGIN IMMEDIATE")
            row = conn.execute(
                "SELECT coalesce(max(seq), 0) FROM raw_events WHERE thread_id = ?", ("raw3-put",)
            ).fetchone()
            conn.executemany(raw.INSERT, raw.rows(events, int(row[0]) + 1))
            conn.execute("COMMIT")

        durations = await _time_calls(params["batches"], put)
        return [
            _measurement(
                "put_batch",
                str(batch_size),
                label,
                durations,
                units=params["batches"] * batch_size,
                metric="rate_per_s",
                reference=None,
            )
        ]
    finally:
        conn.close()


async def _raw_asyncpg(
    dsn: str, schema: str, label: str, params: Mapping[str, Any], rng: random.Random
) -> list[dict[str, Any]]:
    import asyncpg

    out: list[dict[str, Any]] = []
    conn = await asyncpg.connect(dsn, server_settings={"search_path": schema})
    try:
        await conn.execute(
            "CREATE TABLE raw_events (id BIGSERIAL PRIMARY KEY, thread_id TEXT NOT NULL, "
            "run_id TEXT NOT NULL, event_type TEXT NOT NULL, category TEXT NOT NULL, "
            "content TEXT, metadata JSONB NOT NULL, seq BIGINT NOT NULL, "
            "created_at TIMESTAMPTZ NOT NULL, UNIQUE (thread_id, seq))"
        )
        await conn.execute("CREATE INDEX raw_events_msg ON raw_events (thread_id, category, seq)")
        insert = (
            "INSERT INTO raw_events (thread_id, run_id, event_type, category, content, metadata, "
            "seq, created_at) VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8)"
        )

        def rows(events: Sequence[Mapping[str, Any]], first: int) -> list[tuple[Any, ...]]:
            now = datetime.now(UTC)
            return [
                (
                    e["thread_id"],
                    e["run_id"],
                    e["event_type"],
                    e["category"],
                    e["content"],
                    orjson.dumps(e["metadata"]).decode(),
                    first + i,
                    now,
                )
                for i, e in enumerate(events)
            ]

        batch_size = params["batch_size"]

        async def put(i: int) -> None:
            events = make_events("raw-put", i * batch_size, batch_size, rng)
            async with conn.transaction():
                top = await conn.fetchval(
                    "SELECT coalesce(max(seq), 0) FROM raw_events WHERE thread_id = $1", "raw-put"
                )
                await conn.executemany(insert, rows(events, int(top) + 1))

        durations = await _time_calls(params["batches"], put)
        out.append(
            _measurement(
                "put_batch",
                str(batch_size),
                label,
                durations,
                units=params["batches"] * batch_size,
                metric="rate_per_s",
                reference=None,
            )
        )
        page_sql = (
            "SELECT thread_id, run_id, event_type, category, content, metadata, seq, created_at "
            "FROM raw_events WHERE thread_id = $1 AND category = 'message' AND seq < $2 "
            "ORDER BY seq DESC LIMIT $3"
        )

        async def page(thread: str, before: int | None, limit: int) -> list[dict[str, Any]]:
            fetched = await conn.fetch(
                page_sql, thread, before if before is not None else 2**62, limit
            )
            result = []
            for r in reversed(fetched):
                rec = dict(r)
                rec["metadata"] = orjson.loads(rec["metadata"])
                rec["created_at"] = rec["created_at"].isoformat()
                result.append(rec)
            return result

        for size in params["thread_sizes"]:
            thread = f"raw-page-{size}"
            for start in range(0, size, POPULATE_CHUNK):
                n = min(POPULATE_CHUNK, size - start)
                async with conn.transaction():
                    await conn.executemany(
                        insert, rows(make_events(thread, start, n, rng), start + 1)
                    )
            out.extend(
                await _page_measurements(
                    label,
                    size,
                    params,
                    functools.partial(page, thread),
                    reference=None,
                )
            )
    finally:
        await conn.close()
    return out


async def _page_measurements(
    label: str,
    size: int,
    params: Mapping[str, Any],
    page: Callable[[int | None, int], Awaitable[list[dict[str, Any]]]],
    *,
    reference: str | None,
) -> list[dict[str, Any]]:
    """Newest-page and random-cursor page latencies on a thread of ``size`` events."""
    limit = params["page_size"]
    n = params["pages"]
    rng = random.Random(size)
    first = await page(None, limit)
    if len(first) != min(limit, size // 2):
        raise AssertionError(
            f"{label}: newest page on a {size}-event thread returned {len(first)} rows"
        )
    latest = await _time_calls(n, lambda _i: page(None, limit))
    cursors = [rng.randint(limit * 2, size) for _ in range(n)]
    before = await _time_calls(n, lambda i: page(cursors[i], limit))
    n_latest, n_before = len(latest), len(before)
    ref = (lambda op: {"backend": reference, "op": op, "variant": str(size)}) if reference else None
    return [
        _measurement(
            "page_latest",
            str(size),
            label,
            latest,
            units=n_latest,
            metric="p50_ms",
            reference=ref("page_latest") if ref else None,
        ),
        _measurement(
            "page_before",
            str(size),
            label,
            before,
            units=n_before,
            metric="p50_ms",
            reference=ref("page_before") if ref else None,
        ),
    ]


# --------------------------------------------------------------------------- the case


async def run_events_case(case: dict[str, Any]) -> dict[str, Any]:
    """Benchmark one event store (and its raw reference) and return its measurements."""
    from ..loader import get_backends
    from ..options import BackendOptions
    from ..settings import Settings
    from ..urls import BackendURL

    label: str = case["backend"]
    url = BackendURL.parse(case["backend_url"])
    work_dir = Path(case["work_dir"])
    work_dir.mkdir(parents=True, exist_ok=True)
    spec = get_backends().events.for_url(url)
    rng = random.Random(case.get("seed", 1))
    pg_dsn = pg_schema = None
    if url.scheme in POSTGRES_SCHEMES:
        pg_dsn = postgres_dsn(url)
        pg_schema = fresh_schema("rsbench_ev")
        url = url.with_query(schema=pg_schema)
    elif is_file_url(url):
        url, _ = relocate(url, work_dir, "events" if url.scheme == "jsonl" else "events.db")
    settings = Settings.load(case.get("settings") or None, events=url.render(hide_password=False))
    measurements: list[dict[str, Any]] = []
    raw_schema = None
    raw_labels: list[str] = []
    try:
        async with AsyncExitStack() as stack:
            options = await stack.enter_async_context(BackendOptions.scope(settings))
            store = await spec.open(url, options)
            stack.push_async_callback(store.close)
            batch_size = case["batch_size"]
            if url.scheme == "sqlite":
                raw_labels = ["raw:aiosqlite", "raw:sqlite3"]
            elif url.scheme in POSTGRES_SCHEMES:
                raw_labels = ["raw:asyncpg"]
            reference = raw_labels[0] if raw_labels else None

            async def put(i: int) -> None:
                await store.put_batch(
                    make_events("bench-put", i * batch_size, batch_size, rng), user_id=None
                )

            durations = await _time_calls(case["batches"], put)
            measurements.append(
                _measurement(
                    "put_batch",
                    str(batch_size),
                    label,
                    durations,
                    units=case["batches"] * batch_size,
                    metric="rate_per_s",
                    reference={"backend": reference, "op": "put_batch", "variant": str(batch_size)}
                    if reference
                    else None,
                )
            )
            for size in case["thread_sizes"]:
                thread = f"bench-page-{size}-{uuid.uuid4().hex[:6]}"
                for start in range(0, size, POPULATE_CHUNK):
                    n = min(POPULATE_CHUNK, size - start)
                    await store.put_batch(make_events(thread, start, n, rng), user_id=None)

                async def page(before: int | None, limit: int, t: str = thread) -> list[Any]:
                    return list(
                        await store.list_messages(t, limit=limit, before_seq=before, user_id=None)
                    )

                measurements.extend(
                    await _page_measurements(label, size, case, page, reference=reference)
                )
        # Raw references run after the store is closed, on their own table.
        if url.scheme == "sqlite":
            synchronous = str(settings.sqlite.synchronous)
            raw = RawSqlite(work_dir / "raw-aiosqlite.db", synchronous)
            measurements.extend(await _raw_aiosqlite(raw, "raw:aiosqlite", case, rng))
            raw3 = RawSqlite(work_dir / "raw-sqlite3.db", synchronous)
            measurements.extend(await _raw_sqlite3(raw3, "raw:sqlite3", case, rng))
        elif pg_dsn is not None:
            raw_schema = fresh_schema("rsbench_raw")
            await postgres_create_schema(pg_dsn, raw_schema)
            measurements.extend(await _raw_asyncpg(pg_dsn, raw_schema, "raw:asyncpg", case, rng))
    finally:
        if pg_dsn is not None and pg_schema is not None:
            await postgres_drop_schema(pg_dsn, pg_schema)
        if pg_dsn is not None and raw_schema is not None:
            await postgres_drop_schema(pg_dsn, raw_schema)
    # The page on a large thread vs a small one (the 1.5x target).
    sizes = sorted(case["thread_sizes"])
    if len(sizes) >= 2:
        for op in ("page_latest", "page_before"):
            small = next(
                (
                    m
                    for m in measurements
                    if m["backend"] == label and m["op"] == op and m["variant"] == str(sizes[0])
                ),
                None,
            )
            large = next(
                (
                    m
                    for m in measurements
                    if m["backend"] == label and m["op"] == op and m["variant"] == str(sizes[-1])
                ),
                None,
            )
            if small and large:
                large["size_ratio"] = large["p50_ms"] / small["p50_ms"] if small["p50_ms"] else None
    return {"status": "ok", "measurements": measurements}


def run_measurement_cases(
    bench: str,
    backends: Sequence[str],
    *,
    output: Path,
    options: RunOptions,
    repetitions: int,
    params: Mapping[str, Any],
    argv: Sequence[str],
    reporter: Reporter | None,
) -> Outcome:
    """Run one child per (repetition, backend); each measurement becomes one row."""
    runner = CaseRunner(
        bench,
        output,
        options,
        argv=argv,
        params={
            **params,
            "backends": [display_backend(b) for b in backends],
            "repetitions": repetitions,
        },
        reporter=reporter,
    )
    runner.reporter.start(repetitions * len(backends))
    try:
        for rep in range(repetitions):
            for raw in backends:
                label = display_backend(raw)
                case_params = {
                    "case_id": f"{label}|r{rep}",
                    "case_backend": label,
                    "repetition": rep,
                    "seed": rep + 1,
                    **params,
                }
                row = runner.execute(case_params, {"backend": label, "backend_url": raw})
                measurements = row.pop("measurements", None) or []
                if row.get("status") != "ok" or not measurements:
                    runner.reporter.warn(f"{label}: {row.get('status')}: {row.get('error')}")
                    row.setdefault("backend", label)
                    runner.emit([row])
                    continue
                rows = []
                for m in measurements:
                    rows.append({**row, **m})
                runner.emit(rows)
    finally:
        outcome = runner.close()
    return outcome


def run_events(
    backends: Sequence[str],
    *,
    output: Path,
    options: RunOptions,
    repetitions: int,
    params: Mapping[str, Any],
    argv: Sequence[str],
    reporter: Reporter | None = None,
) -> Outcome:
    """`runstore bench events`."""
    return run_measurement_cases(
        "events",
        backends,
        output=output,
        options=options,
        repetitions=repetitions,
        params=params,
        argv=argv,
        reporter=reporter,
    )
