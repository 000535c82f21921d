"""Broken sqlite saver whose sweep claims are not exclusive: it picks a batch's threads
without looking at other sweepers' live claims (the candidate query forgot
``claimed_until``), so sweepers in several processes sharing one file examine the same
threads. The retention suite must fail it (contract: a sweep claim is exclusive).
"""

from __future__ import annotations

import contextlib
import sqlite3
import tempfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import orjson

from runstore.checkpoint.policy import DryRun, RetentionPolicy, SweepBatch, batch_of, check_sweep
from runstore.checkpoint.rules import checked_ids
from runstore.checkpoint.threads import clock_micros
from runstore.hookspecs import hookimpl
from runstore.options import BackendOptions
from runstore.plugins.sqlite import ops, sql
from runstore.plugins.sqlite.saver import SqliteSaver
from runstore.registry import SaverRegistry
from runstore.urls import BackendURL

NAME = "broken-sweep-claims"
# BUG (on purpose): other sweepers' live claims are not looked at.
CANDIDATES = sql.SWEEP_CANDIDATES.replace("AND (claimed_until IS NULL OR claimed_until <= :now)", "")
assert CANDIDATES != sql.SWEEP_CANDIDATES


def _claim(conn: sqlite3.Connection, policy: RetentionPolicy, now: int, after: str | None, limit: int,
           until: int | None, rescan: bool, only: Sequence[str] | None) -> list[tuple[str, bool]]:
    params = ops.sweep_params(policy, now, after, limit)
    only_text = None if only is None else orjson.dumps(list(only)).decode()
    rows = conn.execute(CANDIDATES, {**params, "rescan": int(rescan), "only": only_text}).fetchall()
    if until is not None and rows:
        conn.execute(sql.CLAIM_THREADS, (until, orjson.dumps([r[0] for r in rows]).decode()))
    return [(r[0], bool(r[1])) for r in rows]


class NonExclusiveClaimsSaver(SqliteSaver):
    async def asweep(self, policy: RetentionPolicy, *, after: str | None = None, limit: int = 100,
                     dry_run: bool = False, claim_seconds: float = 300.0, rescan: bool = False,
                     thread_ids: Sequence[str] | None = None) -> SweepBatch:
        claim = check_sweep(policy, limit, claim_seconds)
        only = None if thread_ids is None else checked_ids(thread_ids, "thread_ids")
        now = clock_micros(self.clock)
        until = None if dry_run else now + claim
        claimed = await self._write(_claim, policy, now, after, limit, until, rescan, only)
        swept: list[Any] = []
        for thread_id, deleted in claimed:
            if deleted:
                continue
            try:
                swept.append(await self._write(ops.sweep_thread, thread_id, policy, now, dry_run, thread=thread_id))
            except DryRun as answer:
                swept.append(answer.swept)
        return batch_of(claimed, swept, limit)


async def _open(url: BackendURL, options: BackendOptions) -> NonExclusiveClaimsSaver:
    path = url.file_path()
    assert path is not None, f"{NAME} needs a file path"
    return await NonExclusiveClaimsSaver.open(BackendURL.for_file("sqlite", path), options)  # type: ignore[return-value]


@hookimpl
def runstore_register_savers(registry: SaverRegistry) -> None:
    registry.add(NAME, schemes=[NAME], factory=_open,
                 capabilities=["durable", "cross_process", "thread_index", "retention"])


@hookimpl
def runstore_conformance_provision(url: BackendURL) -> Any:
    if url.scheme != NAME:
        return None

    @contextlib.asynccontextmanager
    async def scratch() -> AsyncIterator[BackendURL]:
        with tempfile.TemporaryDirectory(prefix="runstore-broken-") as tmp:
            yield BackendURL.for_file(NAME, Path(tmp, "saver.db"))

    return scratch()
