"""`runstore bench threads`: retention and the thread index on one saver.

Each case (one saver backend, one repetition) runs in a fresh child process and measures:

- ``retention``: ``--threads`` threads of ``--turns`` full-mode checkpoints each (a
  ``turn`` channel of ``--value-bytes`` rewritten every turn and a counter), written
  concurrently across threads; then one sweep with ``keep_last=--keep-last`` and a
  compaction. Rows: ``size`` (bytes before the sweep and after sweep + compaction:
  the sqlite file with its WAL, or PostgreSQL's saver tables; ``shrink_ratio``),
  ``sweep`` (threads per second of that first pass, each thread losing
  ``turns - keep_last`` checkpoints), ``compact`` (its time) and ``sweep steady``
  (one more turn per thread, then the next pass: threads per second when each loses one).
- ``list_threads``: the newest page, a metadata-filtered page and a page after a cursor
  halfway down, each 50 threads, on ``--index-small`` and ``--index-large`` thread
  records (inserted straight into the record table: a page reads only that table);
  the large variant's rows reference the small one, so ``ratio`` is large/small.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping
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

PAGE = 50
PAGE_SAMPLES = 200


def _checkpoint(checkpoint_id: str, turn: int, value: str) -> tuple[dict[str, Any], dict[str, str]]:
    versions = {"turn": f"{turn + 1:032}.0", "count": f"{turn + 1:032}.0"}
    checkpoint = {
        "v": 1, "id": checkpoint_id, "ts": "2030-01-01T00:00:00+00:00",
        "channel_values": {"turn": f"{turn}:{value}", "count": turn},
        "channel_versions": versions, "versions_seen": {}, "updated_channels": None,
    }  # fmt: skip
    return checkpoint, versions


async def _size(saver: Any, url: Any, pg: tuple[str, str] | None) -> int:
    if pg is not None:
        from runstore.bench.targets import postgres_schema_bytes

        return await postgres_schema_bytes(*pg)
    path = Path(saver.path)
    return sum(p.stat().st_size for p in (path, path.with_name(path.name + "-wal")) if p.exists())


async def _insert_records(saver: Any, pg: tuple[str, str] | None, count: int, prefix: str) -> None:
    """``count`` live thread records (every 10th with user u1), straight into the table."""
    from runstore.checkpoint.threads import THREADS

    rows = (
        f"SELECT '{prefix}' || substr('000000' || i, -7, 7), i, i, i, 'c', "
        "{meta}, 'idle', 1, 0, 10, i FROM {series}"
    )
    columns = (
        f"INSERT INTO {THREADS} (thread_id, created_at, updated_at, touched_at, "
        "latest_checkpoint_id, metadata, status, checkpoints, writes, bytes, oldest_at) "
    )
    if pg is not None:
        import asyncpg

        conn = await asyncpg.connect(pg[0], server_settings={"search_path": pg[1]})
        try:
            await conn.execute(
                columns
                + rows.replace("substr('000000' || i, -7, 7)", "lpad(i::text, 7, '0')").format(
                    meta="jsonb_build_object('user', 'u' || (i % 10))",
                    series=f"generate_series(1, {count}) AS i",
                )
            )
            await conn.execute(f"ANALYZE {THREADS}")
        finally:
            await conn.close()
        return
    import sqlite3

    def insert() -> None:
        conn = sqlite3.connect(saver.path, timeout=30)
        try:
            conn.execute(
                f"WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < {count}) "
                + columns
                + rows.format(meta="json_object('user', 'u' || (i % 10))", series="s")
            )
            conn.commit()
            conn.execute("ANALYZE")
        finally:
            conn.close()

    await asyncio.to_thread(insert)


async def run_threads_case(case: dict[str, Any]) -> dict[str, Any]:
    """Benchmark retention and thread pages on one saver and return its measurements."""
    from runstore.checkpoint.contracts import CompactingSaver
    from runstore.checkpoint.policy import RetentionPolicy
    from runstore.checkpoint.threads import encode_cursor
    from runstore.loader import get_backends
    from runstore.options import BackendOptions
    from runstore.settings import Settings
    from runstore.sweeper import Sweeper
    from runstore.urls import BackendURL

    label: str = case["backend"]
    url = BackendURL.parse(case["backend_url"])
    work_dir = Path(case["work_dir"])
    await asyncio.to_thread(work_dir.mkdir, parents=True, exist_ok=True)
    spec = get_backends().savers.for_url(url)
    pg: tuple[str, str] | None = None
    if url.scheme in POSTGRES_SCHEMES:
        pg = (postgres_dsn(url), fresh_schema("rsbench_threads"))
        url = url.with_query(schema=pg[1])
    elif is_file_url(url):
        url, _ = relocate(url, work_dir, "threads.db")
    settings = Settings.load(case.get("settings") or None, checkpointer=url.render(hide_password=False))
    measurements: list[dict[str, Any]] = []
    prefix = uuid.uuid4().hex[:6]
    threads, turns, keep = int(case["threads"]), int(case["turns"]), int(case["keep_last"])
    value = "x" * int(case["value_bytes"])
    try:
        async with AsyncExitStack() as stack:
            options = await stack.enter_async_context(BackendOptions.scope(settings))
            saver: Any = await spec.open(url, options)

            heads: dict[int, str | None] = dict.fromkeys(range(threads))

            async def write_thread(t: int, start: int = 0, count: int = turns) -> None:
                parent = heads[t]
                thread = f"{prefix}-t{t:04d}"
                for turn in range(start, start + count):
                    cid = f"{turn:012d}"  # increasing within the thread, as ids must
                    checkpoint, versions = _checkpoint(cid, turn, value)
                    config: dict[str, Any] = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
                    if parent is not None:
                        config["configurable"]["checkpoint_id"] = parent
                    await saver.aput(config, checkpoint, {"step": turn, "source": "loop"}, versions)
                    parent = heads[t] = cid

            await asyncio.gather(*(write_thread(t) for t in range(threads)))
            before = await _size(saver, url, pg)
            sweeper = Sweeper(saver)
            started = time.perf_counter()
            report = await sweeper.sweep(RetentionPolicy(keep_last=keep), batch_size=100)
            swept = time.perf_counter() - started
            started = time.perf_counter()
            compaction = await saver.acompact() if isinstance(saver, CompactingSaver) else None
            compacted = time.perf_counter() - started
            after = await _size(saver, url, pg)
            variant = f"{threads}x{turns} keep {keep}"
            measurements.append({
                "op": "size", "variant": variant, "backend": label, "metric": "shrink_ratio",
                "reference": None, "count": 1, "size_before_bytes": before,
                "size_after_bytes": after, "shrink_ratio": before / after if after else None,
                "checkpoints_removed": report.removed.checkpoints,
                "reclaimed_bytes": compaction.reclaimed if compaction else None,
            })  # fmt: skip
            measurements.append(
                _measurement("sweep", variant, label, [swept], units=report.examined,
                             metric="rate_per_s", reference=None)
            )  # fmt: skip
            measurements.append(
                _measurement("compact", variant, label, [compacted], units=1,
                             metric="p50_ms", reference=None)
            )  # fmt: skip

            # Steady state: one more turn per thread, then the next sweep (one checkpoint
            # of each thread goes).
            await asyncio.gather(*(write_thread(t, turns, 1) for t in range(threads)))
            started = time.perf_counter()
            report = await sweeper.sweep(RetentionPolicy(keep_last=keep), batch_size=100)
            measurements.append(
                _measurement("sweep steady", variant, label, [time.perf_counter() - started],
                             units=report.examined, metric="rate_per_s", reference=None)
            )  # fmt: skip

            small, large = int(case["index_small"]), int(case["index_large"])
            inserted = 0
            for size in (small, large):
                await _insert_records(saver, pg, size - inserted, f"{prefix}-i{size}-")
                inserted = size
                total = size + threads
                middle = encode_cursor("updated_at", (total // 2, ""))
                pages: dict[str, dict[str, Any]] = {
                    "newest": {},
                    "filtered": {"filter": {"user": "u1"}},
                    "cursor": {"cursor": middle},
                }
                for name, kwargs in pages.items():

                    async def page(_: int, kw: Mapping[str, Any] = kwargs) -> None:
                        got = await saver.alist_threads(limit=PAGE, **kw)
                        assert got.threads

                    durations = await _time_calls(PAGE_SAMPLES, page)
                    reference = (
                        None if size == small
                        else {"backend": label, "op": f"list_threads {name}", "variant": f"{small:,}"}
                    )  # fmt: skip
                    measurements.append(
                        _measurement(f"list_threads {name}", f"{size:,}", label, durations,
                                     units=len(durations), metric="p50_ms", reference=reference)
                    )  # fmt: skip
    finally:
        if pg is not None:
            await postgres_drop_schema(*pg)
    return {"status": "ok", "measurements": measurements}
