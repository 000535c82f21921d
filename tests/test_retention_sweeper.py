"""The sweeper across stores: expiry removes a thread from the saver, the event store and
the stream bridge in the documented order, retries idempotently after a failure, dry runs
change nothing; `delete_thread` everywhere with counts; the app task; the CLI."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import runstore
from runstore import cli
from runstore.checkpoint.forwarding import unwrap_saver
from runstore.checkpoint.policy import RetentionPolicy
from runstore.clock import ManualClock
from runstore.conformance.savers_model import config_for, make_checkpoint, new_checkpoint_id
from runstore.errors import InvalidSaverInputError
from runstore.sweeper import Sweeper, SweepReport, delete_thread, start_sweeper, sweep

START = datetime(2030, 1, 1, tzinfo=UTC)


async def _thread(stores: Any, thread: str, checkpoints: int = 3, runs: int = 2) -> None:
    """A thread with checkpoints, two runs of events and a live stream per run."""
    saver = stores.checkpointer
    parent = None
    for i in range(checkpoints):
        cid = new_checkpoint_id()
        version = f"{i + 1:032}.0"
        await saver.aput(
            config_for(thread, parent), make_checkpoint(cid, {"a": i}, {"a": version}), {}, {"a": version}
        )
        parent = cid
    for r in range(runs):
        run = f"{thread}-run{r}"
        for k in range(2):
            await stores.events.put(
                thread_id=thread, run_id=run, event_type="message", category="message",
                content={"type": "ai", "id": f"{run}-{k}", "content": "hi"}, user_id=None,
            )
        await stores.streams.publish(run, "values", {"k": r})


def _open(tmp_path: Path | None = None) -> Any:
    if tmp_path is None:
        return runstore.open(checkpointer="memory://", events="memory://", streams="memory://")
    url = f"sqlite:///{tmp_path / 'app.db'}"
    return runstore.open(checkpointer=url, events=url, streams="memory://")


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_expiry_removes_the_thread_from_every_store(backend: str, tmp_path: Path) -> None:
    async with _open(None if backend == "memory" else tmp_path) as stores:
        saver = unwrap_saver(stores.checkpointer)
        clock = ManualClock(START)
        saver.clock = clock  # type: ignore[attr-defined]
        await _thread(stores, "old")
        clock.advance(100)
        await _thread(stores, "new")
        clock.advance(50)
        policy = RetentionPolicy(idle_ttl=120)
        dry = await sweep(stores, policy, dry_run=True)
        assert (dry.expired, dry.events, dry.streams) == (1, 4, 2)
        assert await stores.events.list_runs("old", user_id=None), "a dry run changes nothing"
        report = await sweep(stores, policy)
        assert report.as_dict() | {"seconds": 0, "threads_per_second": 0} == dry.as_dict() | {
            "seconds": 0, "threads_per_second": 0, "dry_run": False
        }, "a dry run reports what the sweep removes"
        assert (report.expired, report.cleaned, report.events, report.streams) == (1, 1, 4, 2)
        assert report.removed.checkpoints == 3 and report.removed.threads == 1
        assert await saver.aget_thread("old") is None  # type: ignore[attr-defined]
        assert await stores.events.list_runs("old", user_id=None) == []
        assert not await stores.streams.stream_exists("old-run0")
        assert await saver.aget_thread("new") is not None  # type: ignore[attr-defined]
        assert await stores.streams.stream_exists("new-run0")
        again = await sweep(stores, policy)
        assert (again.examined, again.cleaned) == (0, 0), "a finished expiry is not repeated"


async def test_a_failed_cleanup_is_retried_idempotently() -> None:
    async with _open() as stores:
        saver = unwrap_saver(stores.checkpointer)
        clock = ManualClock(START)
        saver.clock = clock  # type: ignore[attr-defined]
        await _thread(stores, "t")
        clock.advance(1000)
        real = stores.events.delete_by_thread
        calls = 0

        async def flaky(thread_id: str, **kwargs: Any) -> int:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise ConnectionError("events store down")
            return await real(thread_id, **kwargs)

        stores.events.delete_by_thread = flaky  # type: ignore[method-assign]
        with pytest.raises(ConnectionError):
            await sweep(stores, RetentionPolicy(idle_ttl=10))
        assert await saver.aget_thread("t") is None, "the saver step committed first"  # type: ignore[attr-defined]
        assert not await stores.streams.stream_exists("t-run0"), "streams went before events"
        retry = await sweep(stores, RetentionPolicy(idle_ttl=10))
        assert (retry.cleaned, retry.events, retry.streams, retry.expired) == (1, 4, 0, 0)
        assert await stores.events.list_runs("t", user_id=None) == []
        assert (await sweep(stores, RetentionPolicy(idle_ttl=10))).cleaned == 0


async def test_the_retention_settings_pace_the_sweeper() -> None:
    """``retention.batch_size`` sizes a pass's batches, ``claim_seconds`` keeps a failed
    sweeper's claim that long, ``interval_seconds`` is the app task's pause."""
    config = {"retention": {"keep_last": 1, "batch_size": 2, "claim_seconds": 50, "interval_seconds": 1}}
    async with runstore.open(config, checkpointer="memory://", events="memory://", streams="memory://") as stores:
        saver = unwrap_saver(stores.checkpointer)
        clock = ManualClock(START)
        saver.clock = clock  # type: ignore[attr-defined]
        threads = [f"t{i}" for i in range(5)]
        for thread in threads:
            await _thread(stores, thread, checkpoints=2, runs=0)
        real = saver._sweep_thread  # type: ignore[attr-defined]

        def dies_on_t0(thread_id: str, *args: Any) -> Any:
            if thread_id == "t0":
                raise ConnectionError("sweeper died")
            return real(thread_id, *args)

        saver._sweep_thread = dies_on_t0  # type: ignore[attr-defined]
        with pytest.raises(ConnectionError):
            await sweep(stores)
        saver._sweep_thread = real  # type: ignore[attr-defined]
        clock.advance(49)
        report = await sweep(stores)
        assert (report.batches, report.examined, report.removed.checkpoints) == (2, 3, 3), (
            "batches of 2; t0 and t1 still claimed by the sweeper that died"
        )
        clock.advance(2)
        report = await sweep(stores)
        assert (report.examined, report.removed.checkpoints) == (2, 2), "their claim lapsed at 50 s"
        clock.advance(1)
        for thread in threads:
            await _thread(stores, thread, checkpoints=2, runs=0)
        reports: list[SweepReport] = []
        two = asyncio.Event()

        def on_report(report: SweepReport) -> None:
            reports.append(report)
            if len(reports) == 2:
                two.set()

        task = start_sweeper(stores, on_report=on_report)
        await asyncio.wait_for(two.wait(), 30)  # the default 300 s pause would time out
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert [r.batches for r in reports] == [3, 1] and reports[0].removed.checkpoints == 10


async def test_delete_thread_everywhere_reports_counts(tmp_path: Path) -> None:
    async with _open(tmp_path) as stores:
        await _thread(stores, "t", checkpoints=4)
        dry = await delete_thread(stores, "t", dry_run=True)
        gone = await delete_thread(stores, "t")
        assert gone == dry
        assert (gone.saver.threads, gone.saver.checkpoints, gone.events, gone.streams) == (1, 4, 4, 2)
        assert gone.saver.bytes > 0 and gone.as_dict()["saver"]["checkpoints"] == 4
        again = await delete_thread(stores, "t")
        assert (again.saver.threads, again.saver.checkpoints, again.events) == (0, 0, 0)


async def test_the_app_task_sweeps_until_cancelled() -> None:
    async with _open() as stores:
        await _thread(stores, "t", checkpoints=5)
        reports: list[SweepReport] = []
        two = asyncio.Event()

        def on_report(report: SweepReport) -> None:
            reports.append(report)
            if len(reports) == 2:
                two.set()

        task = start_sweeper(
            stores, RetentionPolicy(keep_last=2), interval=0.01, compact=True, on_report=on_report
        )
        await asyncio.wait_for(two.wait(), 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert reports[0].removed.checkpoints == 3 and reports[1].removed.checkpoints == 0
        assert reports[0].reclaimed_bytes is None, "memory has nothing to compact"
        with pytest.raises(InvalidSaverInputError):
            start_sweeper(stores, interval=0)
        with pytest.raises(InvalidSaverInputError, match="does not declare retention"):
            Sweeper(object())


def test_cli_run_and_compact(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"

    async def fill() -> None:
        async with runstore.open(checkpointer=url, events=url) as stores:
            for t in range(4):
                saver = stores.checkpointer
                parent = None
                for i in range(12):
                    cid = new_checkpoint_id()
                    version = f"{i + 1:032}.0"
                    await saver.aput(
                        config_for(f"t{t}", parent),
                        make_checkpoint(cid, {"a": "x" * 4000}, {"a": version}), {}, {"a": version},
                    )
                    parent = cid

    asyncio.run(fill())
    size = (tmp_path / "app.db").stat().st_size
    runner = CliRunner()
    dry = runner.invoke(cli.main, ["retention", "run", "--checkpointer", url, "--events", url,
                                   "--keep-last", "2", "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.output)["saver_checkpoints"] == 40
    table = runner.invoke(cli.main, ["retention", "run", "--checkpointer", url, "--events", url,
                                     "--keep-last", "2", "--compact"])
    assert table.exit_code == 0, table.output
    assert "threads examined" in table.output and "saver checkpoints" in table.output
    assert (tmp_path / "app.db").stat().st_size < size / 2, "the file gave its space back"
    assert "reclaimed bytes" in table.output
    compact = runner.invoke(cli.main, ["compact", "--checkpointer", url, "--full", "--json"])
    assert compact.exit_code == 0, compact.output
    assert set(json.loads(compact.output)) == {"before", "after", "reclaimed"}


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
async def test_a_write_timed_before_a_sweep_that_commits_after_it_is_swept_next(backend: str, tmp_path: Path) -> None:
    """A writer takes its time before waiting for the database; a sweep (in another
    process) can commit in between with a later time. The write still counts as written
    since that sweep, whatever the clocks say, so the next sweep looks at the thread."""
    async with _open(None if backend == "memory" else tmp_path) as stores:
        await _write_timed_before_a_sweep(stores)


@pytest.mark.postgres
async def test_a_write_timed_before_a_sweep_is_swept_next_on_postgres(postgres_url: str) -> None:
    async with runstore.open(checkpointer=postgres_url) as stores:
        await _write_timed_before_a_sweep(stores)


async def _write_timed_before_a_sweep(stores: Any) -> None:
    saver = unwrap_saver(stores.checkpointer)
    saver.clock = ManualClock(START)  # type: ignore[attr-defined]
    await _thread(stores, "t", checkpoints=3, runs=0)
    policy = RetentionPolicy(keep_last=2)
    saver.clock = ManualClock(START + timedelta(seconds=100))  # type: ignore[attr-defined]
    assert (await Sweeper(saver).sweep(policy)).removed.checkpoints == 1
    # The writer's time, taken before the sweep committed.
    saver.clock = ManualClock(START + timedelta(seconds=50))  # type: ignore[attr-defined]
    parent = (await saver.aget_tuple(config_for("t", None))).config["configurable"]["checkpoint_id"]
    cid = new_checkpoint_id()
    version = f"{4:032}.0"
    await saver.aput(config_for("t", parent), make_checkpoint(cid, {"a": 4}, {"a": version}), {}, {"a": version})
    saver.clock = ManualClock(START + timedelta(seconds=110))  # type: ignore[attr-defined]
    report = await Sweeper(saver).sweep(policy)
    assert report.removed.checkpoints == 1, report.as_dict()
    assert (await saver.aget_thread("t")).checkpoints == 2  # type: ignore[attr-defined]
