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

import asyncio
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

from runstore.bench.common import latency_summary
from runstore.bench.targets import (
    POSTGRES_SCHEMES,
    fresh_schema,
    is_file_url,
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
#
# The raw references write and read the store's OWN table (created by the store
# under test, in the same database) with the same columns and the same indexed
# page query, so a store/raw ratio measures the code path, not a schema difference.


def _store_table() -> tuple[str, tuple[str, ...], str]:
    from runstore.events.schema import INSERT_COLUMNS, RECORD_COLUMNS, TABLE

    return TABLE, tuple(INSERT_COLUMNS), RECORD_COLUMNS


def raw_rows(
    events: Sequence[Mapping[str, Any]], first_seq: int, columns: Sequence[str]
) -> list[tuple[Any, ...]]:
    """Insert tuples for the store's table, in its column order (JSON encoded like the store)."""
    now = datetime.now(UTC).isoformat()
    out = []
    for i, e in enumerate(events):
        meta = e["metadata"]
        values = {
            "thread_id": e["thread_id"],
            "seq": first_seq + i,
            "run_id": e["run_id"],
            "event_type": e["event_type"],
            "category": e["category"],
            "content": e["content"],
            "content_json": False,
            "metadata": orjson.dumps(meta).decode(),
            "created_at": now,
            "user_id": None,
            "task_id": meta.get("task_id") if isinstance(meta.get("task_id"), str) else None,
            "visible_ai": e["category"] == "message" and e["event_type"] == "ai_message",
        }
        out.append(tuple(values.get(c) for c in columns))
    return out


def decode_rows(rows: Sequence[Sequence[Any]], record_columns: str) -> list[dict[str, Any]]:
    """Records from raw rows, oldest first, metadata decoded (what a store returns)."""
    names = [c.strip() for c in record_columns.split(",")]
    out = []
    for row in reversed(rows):
        rec = dict(zip(names, row, strict=False))
        rec["metadata"] = orjson.loads(rec["metadata"])
        if rec.get("content_json"):
            rec["content"] = orjson.loads(rec["content"])
        out.append(rec)
    return out


async def _raw_sqlite(
    driver: str,
    path: Path,
    synchronous: str,
    label: str,
    params: Mapping[str, Any],
    rng: random.Random,
) -> list[dict[str, Any]]:
    """aiosqlite (``driver="aiosqlite"``) or stdlib sqlite3 in-thread, on the store's file."""
    table, columns, record_columns = _store_table()
    insert = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
    max_seq = f"SELECT coalesce(max(seq), 0) FROM {table} WHERE thread_id = ?"
    page_sql = (
        f"SELECT {record_columns} FROM {table} WHERE thread_id = ? AND category = 'message' "
        "AND seq < ? ORDER BY seq DESC LIMIT ?"
    )
    pragmas = ["PRAGMA journal_mode=WAL", f"PRAGMA synchronous={synchronous.upper()}"]
    batch_size = params["batch_size"]
    out: list[dict[str, Any]] = []
    put_thread = f"{label}-put"
    if driver == "sqlite3":
        conn3 = sqlite3.connect(str(path), isolation_level=None)
        try:
            for pragma in pragmas:
                conn3.execute(pragma)

            async def put3(i: int) -> None:
                events = make_events(put_thread, i * batch_size, batch_size, rng)
                conn3.execute("BEGIN IMMEDIATE")
                top = conn3.execute(max_seq, (put_thread,)).fetchone()[0]
                conn3.executemany(insert, raw_rows(events, int(top) + 1, columns))
                conn3.execute("COMMIT")

            durations = await _time_calls(params["batches"], put3)
        finally:
            conn3.close()
        return [
            _measurement(
                "put_batch",
                str(batch_size),
                label,
                durations,
                units=len(durations) * batch_size,
                metric="rate_per_s",
                reference=None,
            )
        ]
    import aiosqlite

    async with aiosqlite.connect(str(path), isolation_level=None) as conn:
        for pragma in pragmas:
            await conn.execute(pragma)

        async def put(i: int) -> None:
            events = make_events(put_thread, i * batch_size, batch_size, rng)
            await conn.execute("BEGIN IMMEDIATE")
            cur = await conn.execute(max_seq, (put_thread,))
            row = await cur.fetchone()
            await conn.executemany(insert, raw_rows(events, int(row[0]) + 1 if row else 1, columns))
            await conn.execute("COMMIT")

        durations = await _time_calls(params["batches"], put)
        out.append(
            _measurement(
                "put_batch",
                str(batch_size),
                label,
                durations,
                units=len(durations) * batch_size,
                metric="rate_per_s",
                reference=None,
            )
        )
        for size in params["thread_sizes"]:
            thread = f"{label}-page-{size}"
            for start in range(0, size, POPULATE_CHUNK):
                n = min(POPULATE_CHUNK, size - start)
                await conn.execute("BEGIN IMMEDIATE")
                await conn.executemany(
                    insert, raw_rows(make_events(thread, start, n, rng), start + 1, columns)
                )
                await conn.execute("COMMIT")

            async def page(before: int | None, limit: int, t: str = thread) -> list[dict[str, Any]]:
                cur = await conn.execute(
                    page_sql, (t, before if before is not None else 2**62, limit)
                )
                return decode_rows(list(await cur.fetchall()), record_columns)

            out.extend(await _page_measurements(label, size, params, page, reference=None))
    return out


async def _raw_asyncpg(
    dsn: str, schema: str, label: str, params: Mapping[str, Any], rng: random.Random
) -> list[dict[str, Any]]:
    """asyncpg on the store's table in the store's schema."""
    import asyncpg

    table, columns, record_columns = _store_table()
    insert = (
        f"INSERT INTO {table} ({', '.join(columns)}) "
        f"VALUES ({', '.join(f'${i}' for i in range(1, len(columns) + 1))})"
    )
    max_seq = f"SELECT coalesce(max(seq), 0) FROM {table} WHERE thread_id = $1"
    page_sql = (
        f"SELECT {record_columns} FROM {table} WHERE thread_id = $1 AND category = 'message' "
        "AND seq < $2 ORDER BY seq DESC LIMIT $3"
    )
    out: list[dict[str, Any]] = []
    conn = await asyncpg.connect(dsn, server_settings={"search_path": schema})
    try:
        batch_size = params["batch_size"]
        put_thread = f"{label}-put"

        async def put(i: int) -> None:
            events = make_events(put_thread, i * batch_size, batch_size, rng)
            async with conn.transaction():
                top = await conn.fetchval(max_seq, put_thread)
                await conn.executemany(insert, raw_rows(events, int(top) + 1, columns))

        durations = await _time_calls(params["batches"], put)
        out.append(
            _measurement(
                "put_batch",
                str(batch_size),
                label,
                durations,
                units=len(durations) * batch_size,
                metric="rate_per_s",
                reference=None,
            )
        )
        for size in params["thread_sizes"]:
            thread = f"{label}-page-{size}"
            for start in range(0, size, POPULATE_CHUNK):
                n = min(POPULATE_CHUNK, size - start)
                async with conn.transaction():
                    await conn.executemany(
                        insert, raw_rows(make_events(thread, start, n, rng), start + 1, columns)
                    )

            async def page(before: int | None, limit: int, t: str = thread) -> list[dict[str, Any]]:
                fetched = await conn.fetch(
                    page_sql, t, before if before is not None else 2**62, limit
                )
                return decode_rows([tuple(r) for r in fetched], record_columns)

            out.extend(await _page_measurements(label, size, params, page, reference=None))
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
    from runstore.loader import get_backends
    from runstore.options import BackendOptions
    from runstore.settings import Settings
    from runstore.urls import BackendURL

    label: str = case["backend"]
    url = BackendURL.parse(case["backend_url"])
    work_dir = Path(case["work_dir"])
    await asyncio.to_thread(work_dir.mkdir, parents=True, exist_ok=True)
    spec = get_backends().events.for_url(url)
    rng = random.Random(case.get("seed", 1))
    pg_dsn = pg_schema = None
    if url.scheme in POSTGRES_SCHEMES:
        pg_dsn = postgres_dsn(url)
        pg_schema = fresh_schema("rsbench_ev")
        url = url.with_query(schema=pg_schema)
    store_path: Path | None = None
    if url.scheme not in POSTGRES_SCHEMES and is_file_url(url):
        url, store_path = relocate(
            url, work_dir, "events" if url.scheme == "jsonl" else "events.db"
        )
    settings = Settings.load(case.get("settings") or None, events=url.render(hide_password=False))
    measurements: list[dict[str, Any]] = []
    raw_labels: list[str] = []
    try:
        async with AsyncExitStack() as stack:
            options = await stack.enter_async_context(BackendOptions.scope(settings))
            store = await spec.open(url, options)
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
        # Raw references run after the store is closed, on the store's own table.
        if url.scheme == "sqlite" and store_path is not None:
            synchronous = str(settings.section_values("sqlite").get("synchronous", "normal"))
            measurements.extend(
                await _raw_sqlite("aiosqlite", store_path, synchronous, "raw:aiosqlite", case, rng)
            )
            measurements.extend(
                await _raw_sqlite("sqlite3", store_path, synchronous, "raw:sqlite3", case, rng)
            )
        elif pg_dsn is not None and pg_schema is not None:
            measurements.extend(await _raw_asyncpg(pg_dsn, pg_schema, "raw:asyncpg", case, rng))
    finally:
        if pg_dsn is not None and pg_schema is not None:
            await postgres_drop_schema(pg_dsn, pg_schema)
    # The page on a large thread vs a small one: keyset paging should cost about the same
    # (within 1.5x) whatever the thread's size.
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
