"""``runstore retention run`` and ``runstore compact``: the sweeper and compaction on the command line."""

from __future__ import annotations

import asyncio
from typing import Any

import click
from rich.table import Table


def _open_kwargs(
    config: str | None, checkpointer: str | None, events: str | None, streams: str | None, runs: str | None
) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"config": config}
    for kind, url in (("checkpointer", checkpointer), ("events", events), ("streams", streams), ("runs", runs)):
        if url is not None:
            kwargs[kind] = url
    return kwargs


def _store_options(fn: Any) -> Any:
    for option in reversed(
        [
            click.option("--config", type=click.Path(dir_okay=False), help="A runstore.yaml (default: RUNSTORE_CONFIG or ./runstore.yaml)."),
            click.option("--checkpointer", help="Checkpoint saver URL (overrides the config)."),
            click.option("--events", help="Event store URL: its events go with expired threads."),
            click.option("--streams", help="Stream bridge URL: its run streams go with expired threads."),
            click.option("--runs", help="Run store URL: more run ids whose streams go."),
            click.option("--json", "as_json", is_flag=True, help="Print the result as JSON."),
        ]
    ):
        fn = option(fn)
    return fn


@click.group("retention")
def retention_group() -> None:
    """Apply the retention policy (docs/threads.md)."""


@retention_group.command("run")
@_store_options
@click.option("--keep-last", type=click.IntRange(min=1), help="Checkpoints kept per thread and namespace.")
@click.option("--max-age", type=click.FloatRange(min=1), help="Seconds a checkpoint is kept.")
@click.option("--idle-ttl", type=click.FloatRange(min=1), help="Seconds without a write after which a thread expires.")
@click.option("--batch-size", type=click.IntRange(1, 10_000), help="Threads per batch (default: retention.batch_size).")
@click.option("--dry-run", is_flag=True, help="Report what would go; change nothing.")
@click.option("--rescan", is_flag=True, help="Look at threads already swept (after a policy change).")
@click.option("--compact", "compact_after", is_flag=True, help="Give freed space back to the file system afterwards (sqlite).")
def run_cmd(
    config: str | None,
    checkpointer: str | None,
    events: str | None,
    streams: str | None,
    runs: str | None,
    as_json: bool,
    keep_last: int | None,
    max_age: float | None,
    idle_ttl: float | None,
    batch_size: int | None,
    dry_run: bool,
    rescan: bool,
    compact_after: bool,
) -> None:
    """One sweep pass: trim and expire threads in bounded batches, then a summary.

    Limits given here replace the configured ``retention`` policy's; without any, the
    configured policy applies. Several processes may run this at once (PostgreSQL
    claims batches with SKIP LOCKED).
    """
    # Imported here: `python -m runstore.cli` loads this module while the command runs as __main__.
    from runstore.cli.console import console, emit_json
    report = asyncio.run(
        _run(
            _open_kwargs(config, checkpointer, events, streams, runs),
            (keep_last, max_age, idle_ttl),
            batch_size,
            dry_run,
            rescan,
            compact_after,
            as_json,
        )
    )
    if as_json:
        emit_json(report.as_dict())
        return
    table = Table(title="runstore retention" + (" (dry run: nothing changed)" if dry_run else ""))
    table.add_column("what")
    table.add_column("count", justify="right")
    for key, value in report.as_dict().items():
        if key != "dry_run":
            table.add_row(key.replace("_", " "), "-" if value is None else f"{value:,}" if isinstance(value, int) else str(value))
    console.print(table)


async def _run(
    open_kwargs: dict[str, Any],
    limits: tuple[int | None, float | None, float | None],
    batch_size: int | None,
    dry_run: bool,
    rescan: bool,
    compact_after: bool,
    as_json: bool,
) -> Any:
    from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

    from runstore.checkpoint.policy import RetentionPolicy
    from runstore.cli.console import progress_bar
    from runstore.stores import open as open_stores
    from runstore.sweeper import SweepReport, sweep

    async with open_stores(**open_kwargs) as stores:
        policy = RetentionPolicy.from_settings(stores.settings)
        if any(v is not None for v in limits):
            policy = RetentionPolicy(*limits)
        kwargs: dict[str, Any] = {"dry_run": dry_run, "rescan": rescan, "compact": compact_after}
        if batch_size is not None:
            kwargs["batch_size"] = batch_size
        with progress_bar(
            SpinnerColumn(),
            TextColumn("retention", style="bold", markup=False),
            TextColumn("{task.description}", markup=False),
            TimeElapsedColumn(),
            off=as_json,
        ) as progress:
            task = progress.add_task("starting", total=None)

            def on_batch(report: SweepReport) -> None:
                progress.update(
                    task,
                    description=(
                        f"batches {report.batches}  threads {report.examined:,}  "
                        f"expired {report.expired:,}  checkpoints {report.removed.checkpoints:,}  "
                        f"bytes {report.removed.bytes:,}"
                    ),
                )

            report = await sweep(stores, policy, progress=on_batch, **kwargs)
        return report


@click.command("compact")
@click.option("--config", type=click.Path(dir_okay=False), help="A runstore.yaml (default: RUNSTORE_CONFIG or ./runstore.yaml).")
@click.option("--checkpointer", help="Checkpoint saver URL (overrides the config).")
@click.option("--full", is_flag=True, help="sqlite: VACUUM (rewrite the file); PostgreSQL: VACUUM FULL (locks the tables).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def compact_cmd(config: str | None, checkpointer: str | None, full: bool, as_json: bool) -> None:
    """Give the space deleted checkpoints held back to the file system (docs/threads.md)."""
    from runstore.cli.console import console, emit_json
    result = asyncio.run(_compact(_open_kwargs(config, checkpointer, None, None, None), full))
    if as_json:
        emit_json(result.as_dict())
        return
    table = Table(title="runstore compact")
    table.add_column("bytes before", justify="right")
    table.add_column("bytes after", justify="right")
    table.add_column("reclaimed", justify="right")
    table.add_row(f"{result.before:,}", f"{result.after:,}", f"{result.reclaimed:,}")
    console.print(table)


async def _compact(open_kwargs: dict[str, Any], full: bool) -> Any:
    from runstore.checkpoint.contracts import CompactingSaver
    from runstore.checkpoint.forwarding import unwrap_saver
    from runstore.cli.console import status
    from runstore.errors import ConfigError
    from runstore.stores import open as open_stores

    async with open_stores(**open_kwargs) as stores:
        saver = unwrap_saver(stores.checkpointer)
        if not isinstance(saver, CompactingSaver):
            raise ConfigError(
                f"{type(saver).__name__} has nothing to compact (no acompact; memory holds no file)"
            )
        with status("compacting"):
            return await saver.acompact(full=full)
