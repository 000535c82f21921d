"""``runstore bench ...``: the click group the main CLI attaches (`bench_group`)."""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from runstore.bench.common import BenchSchemaError, dumps, read_jsonl
from runstore.bench.matrix import DEFAULT_PAYLOAD_CAP_BYTES, NO_CACHE, PEERS, plan_checkpoint
from runstore.bench.migrate import METHODS, run_migrate_bench
from runstore.bench.reporter import RichReporter
from runstore.bench.runner import (
    Outcome,
    RunOptions,
    default_postgres_url,
    default_redis_url,
    display_backend,
    run_checkpoint_plan,
    run_measurement_cases,
)
from runstore.bench.summarize import Summary, plot, summarize, to_csv
from runstore.bench.tables import fit, full_width, tables, to_markdown


def _ints(_ctx: click.Context, _param: click.Parameter, value: str | None) -> list[int]:
    if value is None:
        return []
    try:
        return [int(v) for v in str(value).replace(" ", "").split(",") if v]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None


def _strs(_ctx: click.Context, _param: click.Parameter, value: Sequence[str]) -> list[str]:
    out: list[str] = []
    for item in value:
        out.extend(v for v in item.split(",") if v)
    return out


def _strs_option(_ctx: click.Context, _param: click.Parameter, value: str) -> list[str]:
    return [v for v in value.replace(" ", "").split(",") if v]


def _settings(_ctx: click.Context, _param: click.Parameter, value: Sequence[str]) -> dict[str, Any]:
    """``--set a.b=value`` pairs as a nested mapping (values parsed as YAML scalars)."""
    import yaml

    out: dict[str, Any] = {}
    for item in value:
        if "=" not in item:
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}")
        key, raw = item.split("=", 1)
        node = out
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = yaml.safe_load(raw)
    return out


def _default_output(bench: str) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return Path("bench-results") / f"{bench}-{stamp}.jsonl"


def print_summary(
    summary: Summary, *, as_json: bool = False, as_csv: bool = False, wide: bool = False, source: str = "FILE"
) -> None:
    """Render ``summary`` on stdout: tables that fit the output width (every column when
    ``wide``), or JSON or CSV with every value. ``source`` names the file in the note that
    says how to see what was left out."""
    if as_json:
        click.echo(dumps(summary.as_dict()))
        return
    if as_csv:
        click.echo(to_csv(summary), nl=False)
        return
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from runstore.cli.console import err_console, output_width, styled

    width = Console(width=output_width(), markup=False, emoji=False).width
    for title, entries, columns in tables(summary):
        fitted = fit(entries, columns, width, wide=wide)
        table = Table(title=title, box=box.HEAVY_HEAD, show_edge=False, show_lines=False)
        for column in fitted.columns:
            table.add_column(column.header, overflow="fold", no_wrap=not column.name,
                             justify="left" if column.text else "right")
        for row in fitted.rows:
            table.add_row(*row)
        # A wide table is printed at the width it needs; the default one at the output's.
        Console(width=max(width, full_width(fitted)) if wide else width, markup=False, emoji=False).print(table)
        if fitted.left_out:
            import textwrap

            note = (f"left out to fit {width} columns: {', '.join(c.label for c in fitted.left_out)} "
                    f"(every column: runstore bench summarize {source} --wide; every value: --json)")
            click.echo(textwrap.fill(note, width, break_on_hyphens=False))
    for warning in summary.warnings:
        err_console.print(styled(("warning:", "yellow"), f" {warning}"), highlight=False)


def _finish(outcome: Outcome, *, as_json: bool) -> None:
    summary = summarize([read_jsonl(outcome.output)])
    print_summary(summary, as_json=as_json, source=str(outcome.output))
    click.echo(f"rows written to {outcome.output}", err=True)
    for failure in outcome.failures:
        click.echo(f"DIGEST MISMATCH: {failure}", err=True)
    code = outcome.exit_code
    if code == 1:
        click.echo(
            "a correctness check failed (see rows with status digest_mismatch/failed)", err=True
        )
    elif code == 3:
        click.echo("some cases errored or timed out (see rows with status error/timeout)", err=True)
    if code:
        sys.exit(code)


@click.group("bench")
def bench_group() -> None:
    """Benchmark checkpoint savers, event stores, stream bridges and run stores (JSONL + summaries)."""


def _common_run_options(fn: Any, *, repetitions: int = 3) -> Any:
    """Add the options every bench command shares; the case-running ones reach ``fn``
    as one ``run_options: RunOptions``."""

    @functools.wraps(fn)
    def command(
        *,
        timeout_seconds: float,
        profile_dir: Path | None,
        work_dir: Path | None,
        keep_files: bool,
        settings: dict[str, Any],
        **kwargs: Any,
    ) -> Any:
        run_options = RunOptions(
            timeout_seconds=timeout_seconds,
            profile_dir=profile_dir,
            work_dir=work_dir,
            keep_files=keep_files,
            settings=settings,
        )
        return fn(run_options=run_options, **kwargs)

    for option in reversed(
        [
            click.option(
                "--output",
                "-o",
                type=click.Path(dir_okay=False, path_type=Path),
                default=None,
                help="JSONL file to append rows to (default bench-results/<bench>-<time>.jsonl).",
            ),
            click.option("--repetitions", type=int, default=repetitions, show_default=True),
            click.option(
                "--timeout-seconds",
                type=float,
                default=900.0,
                show_default=True,
                help="Per-case limit; a case over it is killed and its row marked timeout.",
            ),
            click.option(
                "--profile-dir",
                type=click.Path(file_okay=False, path_type=Path),
                default=None,
                help="Write one cProfile file per case here (rows are marked profiled).",
            ),
            click.option(
                "--work-dir",
                type=click.Path(file_okay=False, path_type=Path),
                default=None,
                help="Scratch directory for sqlite/jsonl files (default: a temp dir).",
            ),
            click.option("--keep-files", is_flag=True, help="Keep each case's scratch files."),
            click.option(
                "--set",
                "settings",
                multiple=True,
                callback=_settings,
                metavar="KEY=VALUE",
                help="runstore setting for runstore backends, e.g. --set sqlite.synchronous=full.",
            ),
            click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON."),
            click.option("--quiet", "-q", is_flag=True, help="No progress bar."),
        ]
    ):
        command = option(command)
    return command


@bench_group.command("checkpoint")
@click.option(
    "--backends",
    "-b",
    multiple=True,
    callback=_strs,
    help="Saver URLs and/or peers (langgraph:memory, langgraph:sqlite, langgraph:postgres); "
    "comma-separated or repeated. Default: memory:// and langgraph:memory.",
)
@click.option(
    "--updates",
    callback=_ints,
    default="100",
    show_default=True,
    help="Turns per case, e.g. 100,500.",
)
@click.option("--payload-bytes", callback=_ints, default="128", show_default=True)
@click.option("--snapshot-frequencies", callback=_ints, default="10,100", show_default=True)
@click.option(
    "--history-cache",
    "caches",
    multiple=True,
    callback=_strs,
    help="Delta history cache variants: none, memory (runstore's CachedHistorySaver); "
    "e.g. --history-cache none,memory. Default: none.",
)
@click.option("--seed", type=int, default=1, show_default=True)
@click.option(
    "--payload-cap-mib",
    type=float,
    default=DEFAULT_PAYLOAD_CAP_BYTES / 2**20,
    show_default=True,
    help="Skip cells whose estimated full-mode payload exceeds this.",
)
@click.option("--allow-large-cases", is_flag=True, help="Run cells over the payload cap anyway.")
@click.option("--postgres-url", default=None, help="Server for langgraph:postgres.")
@click.option(
    "--fenced",
    is_flag=True,
    help="Also time fenced against unfenced turns on each runstore saver: the fenced thread is "
    "fenced first (afence_thread) and every write carries the token (configurable.runstore_fence); "
    "alternating on two fresh threads: column fenced/unfenced.",
)
@_common_run_options
def checkpoint_cmd(
    backends: list[str],
    updates: list[int],
    payload_bytes: list[int],
    snapshot_frequencies: list[int],
    caches: list[str],
    seed: int,
    payload_cap_mib: float,
    allow_large_cases: bool,
    postgres_url: str | None,
    fenced: bool,
    output: Path | None,
    repetitions: int,
    run_options: RunOptions,
    as_json: bool,
    quiet: bool,
) -> None:
    """Paired full/delta message graphs on each backend, one child process per case."""
    backends = backends or ["memory://", "langgraph:memory"]
    for b in backends:
        if b.startswith("langgraph:") and b not in PEERS:
            raise click.BadParameter(f"unknown peer {b!r}; known: {', '.join(PEERS)}")
    urls = {display_backend(b): b for b in backends}
    cache_urls = {display_backend(c): c for c in caches or [NO_CACHE]}
    if postgres_url is None:
        postgres_url = next(
            (b for b in backends if b.split(":", 1)[0] in ("postgresql", "postgres")),
            default_postgres_url(),
        )
    try:
        plan = plan_checkpoint(
            backends=list(urls),
            updates=updates,
            payload_bytes=payload_bytes,
            snapshot_frequencies=snapshot_frequencies,
            repetitions=repetitions,
            seed=seed,
            caches=list(cache_urls),
            payload_cap_bytes=int(payload_cap_mib * 2**20),
            allow_large_cases=allow_large_cases,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    output = output or _default_output("checkpoint")
    outcome = run_checkpoint_plan(
        plan,
        backend_urls=urls,
        cache_urls=cache_urls,
        output=output,
        options=dataclasses.replace(run_options, postgres_url=postgres_url, fenced=fenced),
        argv=_redacted_argv(),
        params={
            "backends": list(urls),
            "updates": updates,
            "payload_bytes": payload_bytes,
            "snapshot_frequencies": snapshot_frequencies,
            "caches": list(cache_urls),
            "repetitions": repetitions,
            "seed": seed,
            "payload_cap_bytes": int(payload_cap_mib * 2**20),
            "allow_large_cases": allow_large_cases,
            "fenced": fenced,
            "timeout_seconds": run_options.timeout_seconds,
            "settings": run_options.settings,
        },
        reporter=RichReporter(quiet=quiet or as_json),
    )
    _finish(outcome, as_json=as_json)


@bench_group.command("events")
@click.option(
    "--backends",
    "-b",
    multiple=True,
    callback=_strs,
    help="Event store URLs (memory://, jsonl://, sqlite://, postgresql://...). "
    "Default: memory://, jsonl://, sqlite://.",
)
@click.option(
    "--batches", type=int, default=200, show_default=True, help="put_batch calls per case."
)
@click.option("--batch-size", type=int, default=20, show_default=True)
@click.option(
    "--pages", type=int, default=200, show_default=True, help="Page reads per thread size."
)
@click.option("--page-size", type=int, default=50, show_default=True)
@click.option(
    "--thread-sizes",
    callback=_ints,
    default="1000,100000",
    show_default=True,
    help="Events in the threads the page is read from.",
)
@_common_run_options
def events_cmd(
    backends: list[str],
    batches: int,
    batch_size: int,
    pages: int,
    page_size: int,
    thread_sizes: list[int],
    output: Path | None,
    repetitions: int,
    run_options: RunOptions,
    as_json: bool,
    quiet: bool,
) -> None:
    """put_batch and message pages on each event store, next to raw driver inserts/selects."""
    # Random cursors land between two pages in and the thread's end.
    if too_small := [size for size in thread_sizes if size < 2 * page_size]:
        raise click.BadParameter(
            f"thread sizes must be at least 2 x --page-size ({2 * page_size}); got {too_small}",
            param_hint="--thread-sizes",
        )
    backends = backends or ["memory://", "jsonl://", "sqlite://"]
    outcome = run_measurement_cases(
        "events",
        backends,
        output=output or _default_output("events"),
        options=run_options,
        repetitions=repetitions,
        params={
            "batches": batches,
            "batch_size": batch_size,
            "pages": pages,
            "page_size": page_size,
            "thread_sizes": thread_sizes,
        },
        argv=_redacted_argv(),
        reporter=RichReporter(quiet=quiet or as_json),
    )
    _finish(outcome, as_json=as_json)


@bench_group.command("streams")
@click.option(
    "--backends",
    "-b",
    multiple=True,
    callback=_strs,
    help="Stream bridge URLs (memory://, redis://...). Default: memory:// and the test Redis.",
)
@click.option(
    "--events",
    "n_events",
    type=int,
    default=1000,
    show_default=True,
    help="Events per latency run.",
)
@click.option("--throughput-events", type=int, default=5000, show_default=True)
@click.option("--subscribers", callback=_ints, default="1,50", show_default=True)
@_common_run_options
def streams_cmd(
    backends: list[str],
    n_events: int,
    throughput_events: int,
    subscribers: list[int],
    output: Path | None,
    repetitions: int,
    run_options: RunOptions,
    as_json: bool,
    quiet: bool,
) -> None:
    """Publish->receive latency and sustained throughput, next to raw redis-py XADD/XREAD."""
    backends = backends or ["memory://", default_redis_url()]
    outcome = run_measurement_cases(
        "streams",
        backends,
        output=output or _default_output("streams"),
        options=run_options,
        repetitions=repetitions,
        params={
            "events": n_events,
            "throughput_events": throughput_events,
            "subscribers": subscribers,
        },
        argv=_redacted_argv(),
        reporter=RichReporter(quiet=quiet or as_json),
    )
    _finish(outcome, as_json=as_json)


@bench_group.command("runs")
@click.option(
    "--backends",
    "-b",
    multiple=True,
    callback=_strs,
    help="Run store URLs (memory://, sqlite://, postgresql://...). Default: sqlite:// and the "
    "PostgreSQL test server.",
)
@click.option("--cycles", type=int, default=500, show_default=True, help="create+start+finalize cycles.")
@click.option("--renewals", type=int, default=1000, show_default=True, help="renew_lease calls.")
@_common_run_options
def runs_cmd(
    backends: list[str],
    cycles: int,
    renewals: int,
    output: Path | None,
    repetitions: int,
    run_options: RunOptions,
    as_json: bool,
    quiet: bool,
) -> None:
    """Run store rates: create+start+finalize per second and renew_lease per second."""
    outcome = run_measurement_cases(
        "runs",
        backends or ["sqlite://", default_postgres_url()],
        output=output or _default_output("runs"),
        options=run_options,
        repetitions=repetitions,
        params={"cycles": cycles, "renewals": renewals},
        argv=_redacted_argv(),
        reporter=RichReporter(quiet=quiet or as_json),
    )
    _finish(outcome, as_json=as_json)


@bench_group.command("store")
@click.option(
    "--backends",
    "-b",
    multiple=True,
    callback=_strs,
    help="Memory store URLs (sqlite://, postgresql://...). Default: sqlite:// and the "
    "PostgreSQL test server.",
)
@click.option("--items", type=int, default=10_000, show_default=True, help="Items put (and searched).")
@click.option("--calls", type=int, default=1000, show_default=True, help="get and filtered search calls.")
@click.option("--queries", type=int, default=100, show_default=True, help="Semantic search calls.")
@click.option("--dims", type=int, default=384, show_default=True, help="Vector dimensions.")
@_common_run_options
def store_cmd(
    backends: list[str],
    items: int,
    calls: int,
    queries: int,
    dims: int,
    output: Path | None,
    repetitions: int,
    run_options: RunOptions,
    as_json: bool,
    quiet: bool,
) -> None:
    """Memory store rates (put, get, filtered and semantic search) next to LangGraph's
    AsyncSqliteStore / AsyncPostgresStore and a numpy brute-force scan."""
    outcome = run_measurement_cases(
        "store",
        backends or ["sqlite://", default_postgres_url()],
        output=output or _default_output("store"),
        options=run_options,
        repetitions=repetitions,
        params={"items": items, "calls": calls, "queries": queries, "dims": dims},
        argv=_redacted_argv(),
        reporter=RichReporter(quiet=quiet or as_json),
    )
    _finish(outcome, as_json=as_json)


@bench_group.command("threads")
@click.option(
    "--backends",
    "-b",
    multiple=True,
    callback=_strs,
    help="Saver URLs (sqlite://, postgresql://...). Default: sqlite:// and the PostgreSQL test server.",
)
@click.option("--threads", "n_threads", type=int, default=100, show_default=True, help="Threads written.")
@click.option("--turns", type=int, default=500, show_default=True, help="Checkpoints per thread.")
@click.option("--value-bytes", type=int, default=1000, show_default=True, help="Bytes of the value rewritten each turn.")
@click.option("--keep-last", type=int, default=10, show_default=True, help="The sweep's keep_last.")
@click.option("--index-small", type=int, default=1000, show_default=True, help="Thread records for the small list_threads case.")
@click.option("--index-large", type=int, default=100_000, show_default=True, help="Thread records for the large case.")
@_common_run_options
def threads_cmd(
    backends: list[str],
    n_threads: int,
    turns: int,
    value_bytes: int,
    keep_last: int,
    index_small: int,
    index_large: int,
    output: Path | None,
    repetitions: int,
    run_options: RunOptions,
    as_json: bool,
    quiet: bool,
) -> None:
    """Retention (size before/after keep_last + compaction, sweep threads/s) and list_threads
    page time on a small and a large thread index."""
    outcome = run_measurement_cases(
        "threads",
        backends or ["sqlite://", default_postgres_url()],
        output=output or _default_output("threads"),
        options=run_options,
        repetitions=repetitions,
        params={
            "threads": n_threads,
            "turns": turns,
            "value_bytes": value_bytes,
            "keep_last": keep_last,
            "index_small": index_small,
            "index_large": index_large,
        },
        argv=_redacted_argv(),
        reporter=RichReporter(quiet=quiet or as_json),
    )
    _finish(outcome, as_json=as_json)


@bench_group.command("load")
@click.option(
    "--stacks",
    multiple=True,
    callback=_strs,
    help="Stacks: embedded (sqlite + memory bridge), pg+redis, stock (AsyncPostgresSaver + raw "
    "psycopg/redis-py), stock-sqlite (AsyncSqliteSaver + raw sqlite + asyncio queues). "
    "Default: all four.",
)
@click.option("--modes", callback=_strs_option, default="full,delta", show_default=True)
@click.option(
    "--concurrency",
    callback=_ints,
    default="1,8,32,128",
    show_default=True,
    help="Concurrent threads per cell.",
)
@click.option(
    "--processes",
    callback=_ints,
    default="1",
    show_default=True,
    help="Worker processes per cell, e.g. 1,2,4 (threads split round-robin).",
)
@click.option("--turns", type=int, default=5, show_default=True, help="Turns per thread.")
@click.option(
    "--pool-size",
    type=int,
    default=None,
    help="PostgreSQL pool size per process, runstore's and the stock psycopg pool's "
    "(default: runstore's postgres.pool_max_size).",
)
@click.option("--postgres-url", default=None, help="Server for pg+redis and stock.")
@click.option("--redis-url", default=None, help="Server for pg+redis and stock.")
@click.option(
    "--fenced",
    is_flag=True,
    help="Also run each runstore stack fenced, right after it in every cell: each run first "
    "fences its stores as a lease grant does (afence_thread, fence_thread, fence_stream) and "
    "every checkpoint write, event put and stream publish carries the token (stores whose "
    "backend declares fencing): column fenced/unfenced.",
)
@functools.partial(_common_run_options, repetitions=1)
def load_cmd(
    stacks: list[str],
    modes: list[str],
    concurrency: list[int],
    processes: list[int],
    turns: int,
    pool_size: int | None,
    postgres_url: str | None,
    redis_url: str | None,
    fenced: bool,
    output: Path | None,
    repetitions: int,
    run_options: RunOptions,
    as_json: bool,
    quiet: bool,
) -> None:
    """Many threads at once on whole stacks (saver + journal + live stream), next to the stock
    stacks: turns/s, latency percentiles, delivery, errors, pool waits, RSS, digests."""
    from runstore.bench.load import DEFAULT_STACKS, plan_load, run_load

    if pool_size is None:
        from runstore.settings import Settings

        # runstore's pool size (its default, or --set postgres.pool_max_size=N).
        pool_size = int(
            Settings.load(run_options.settings or None).section_values("postgres")["pool_max_size"]
        )
    stacks = stacks or list(DEFAULT_STACKS)
    try:
        cases = plan_load(
            stacks=stacks, modes=modes, concurrency=concurrency, processes=processes,
            turns=turns, pool_size=pool_size, repetitions=repetitions, fenced=fenced,
        )  # fmt: skip
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    outcome = run_load(
        cases,
        output=output or _default_output("load"),
        options=dataclasses.replace(
            run_options,
            postgres_url=postgres_url or default_postgres_url(),
            redis_url=redis_url or default_redis_url(),
        ),
        argv=_redacted_argv(),
        params={
            "stacks": stacks, "modes": modes, "concurrency": concurrency,
            "processes": processes, "turns": turns, "pool_size": pool_size,
            "repetitions": repetitions, "timeout_seconds": run_options.timeout_seconds,
            "settings": run_options.settings, "fenced": fenced,
        },
        reporter=RichReporter(quiet=quiet or as_json),
    )  # fmt: skip
    _finish(outcome, as_json=as_json)


@bench_group.command("migrate")
@click.option("--threads", "sizes", callback=_ints, default="200,2000", show_default=True,
              help="Source sizes in threads, comma-separated.")  # fmt: skip
@click.option("--turns", type=int, default=17, show_default=True, help="Graph turns per thread (3 checkpoints each).")
@click.option("--events", type=int, default=100, show_default=True, help="Events per thread.")
@click.option("--methods", callback=_strs_option, default=",".join(METHODS), show_default=True,
              help="runstore (the migrate engine), naive (alist/aput/aput_writes loop), resume (SIGKILL + rerun, "
              "smallest size only).")  # fmt: skip
@click.option("--naive-max-threads", type=int, default=None,
              help="Skip the naive loop above this many threads (its row says so).")  # fmt: skip
@click.option("--postgres-url", default=None, help="PostgreSQL server; each case gets a fresh schema (dropped after).")
@click.option("--postgres", "postgres_alias", default=None, hidden=True)
@functools.partial(_common_run_options, repetitions=1)
def migrate_bench_cmd(sizes: list[int], turns: int, events: int, methods: list[str], naive_max_threads: int | None,
                      postgres_url: str | None, postgres_alias: str | None, output: Path | None, repetitions: int,
                      run_options: RunOptions, as_json: bool, quiet: bool) -> None:  # fmt: skip
    """sqlite -> PostgreSQL: `runstore migrate` vs a naive alist/aput/aput_writes loop
    (checkpoints/s, peak RSS per size) and a SIGKILLed migration resumed."""

    unknown = sorted(set(methods) - set(METHODS))
    if unknown or not methods:
        raise click.BadParameter(f"unknown methods {unknown}; accepted: {', '.join(METHODS)}", param_hint="--methods")
    if not sizes or min(sizes) < 2:
        raise click.BadParameter("give sizes of at least 2 threads", param_hint="--threads")
    run_options.postgres_url = postgres_url or postgres_alias or default_postgres_url()
    outcome = run_migrate_bench(
        sizes=sizes, turns=turns, events=events, methods=methods, naive_max_threads=naive_max_threads,
        output=output or _default_output("migrate"), options=run_options, repetitions=repetitions,
        argv=_redacted_argv(), reporter=RichReporter(quiet=quiet or as_json),
    )  # fmt: skip
    _finish(outcome, as_json=as_json)


@bench_group.command("summarize")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--csv", "as_csv", is_flag=True, help="Print CSV.")
@click.option("--markdown", "as_markdown", is_flag=True, help="Print Markdown tables.")
@click.option("--wide", is_flag=True, help="Every column, however wide the table gets.")
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Draw storage and write time against turns, and load turns/s and p99 against "
    "concurrency (PNG, needs matplotlib).",
)
def summarize_cmd(
    files: tuple[str, ...], as_json: bool, as_csv: bool, as_markdown: bool, wide: bool, plot_path: str | None
) -> None:
    """Medians over paired successful repetitions, with delta/full and runstore/peer ratios.

    The tables fit the output width (the terminal's, else COLUMNS, else 120): identifying
    columns, then ratios, then absolute figures, as many as fit. --wide prints every column;
    --json and --csv carry every value.
    """
    try:
        loaded = [read_jsonl(f) for f in files]
    except BenchSchemaError as exc:
        raise click.ClickException(str(exc)) from None
    summary = summarize(loaded)
    if as_markdown:
        click.echo(to_markdown(summary, wide=wide), nl=False)
    else:
        print_summary(summary, as_json=as_json, as_csv=as_csv, wide=wide, source=" ".join(files))
    if plot_path:
        try:
            written = plot(summary, plot_path)
        except ImportError:
            raise click.ClickException(
                "--plot needs matplotlib: pip install 'runstore[bench]'"
            ) from None
        for path in written:
            click.echo(f"plot written to {path}", err=True)
        if not written:
            click.echo("nothing to plot (no checkpoint or load rows)", err=True)


def _redacted_argv() -> list[str]:
    from runstore.redaction import redact

    return [redact(a) for a in sys.argv]
