"""The ``runstore bench migrate`` command (the cases are in `runstore.bench.migrate`)."""

from __future__ import annotations

import functools
from pathlib import Path

import click

from runstore.bench.cli import _common_run_options, _ints, _strs_option
from runstore.bench.migrate import METHODS, run_migrate_bench
from runstore.bench.runner import RunOptions


@click.command("migrate")
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
    from runstore.bench.cli import RichReporter, _default_output, _finish, _redacted_argv
    from runstore.bench.runner import default_postgres_url

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
