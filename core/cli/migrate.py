"""``runstore migrate``, ``runstore export`` and ``runstore import`` (docs/migrate.md)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import click
from rich.table import Table

_KINDS_HELP = "Comma-separated kinds to move: saver, events, runs, store (default: every kind both sides serve)."


def _kinds(value: str | None) -> list[str] | None:
    return [k.strip() for k in value.split(",") if k.strip()] if value else None


def _mode(value: str | None) -> str:
    if value is not None:
        return value
    from runstore.settings import Settings

    return str(Settings.load().checkpoint_channel_mode)


def _store_index(ref: str | None) -> Any:
    """The index config the ``--store-index`` function returns (`PluginError` naming what
    could not be imported or called)."""
    if ref is None:
        return None
    from runstore.registry import resolve_factory

    return resolve_factory(ref, where="--store-index")()


def _copy_options(fn: Any) -> Any:
    for option in reversed(
        [
            click.option("--kinds", help=_KINDS_HELP),
            click.option("--dry-run", is_flag=True, help="Say what would be copied (counts, sizes, conflicts); write nothing."),
            click.option("--on-conflict", type=click.Choice(["fail", "skip", "overwrite"]), default="fail", show_default=True,
                         help="A destination thread whose content differs: refuse before writing, leave it, or replace it."),
            click.option("--verify/--no-verify", default=True, show_default=True,
                         help="Compare per-thread digests of both sides afterwards; differing threads exit 1."),
            click.option("--mode", type=click.Choice(["full", "delta"]),
                         help="The checkpoint channel mode the destination runs in (default: the configured one)."),
            click.option("--ledger", type=click.Path(dir_okay=False, path_type=Path),
                         help="The progress ledger (default: beside a sqlite destination, else .runstore/migrations/)."),
            click.option("--include-active", is_flag=True,
                         help="Copy running (leased) runs as orphaned, for the destination's recovery to end them."),
            click.option("--store-index", metavar="MODULE:FUNCTION",
                         help="A function returning the destination store's index config (LangGraph IndexConfig: "
                              "dims, embed, fields): copied items are embedded with it. Without it they carry no vectors."),
            click.option("--json", "as_json", is_flag=True, help="Print the report as JSON."),
        ]
    ):
        fn = option(fn)
    return fn


def _run_copy(coro_factory: Any, as_json: bool, options: Any) -> None:
    from runstore.cli.console import console, emit_json
    from runstore.errors import VerifyMismatchError

    with _progress(as_json) as progress:
        options.progress = progress
        report = asyncio.run(coro_factory())
    if as_json:
        emit_json(report.to_json())
    else:
        _print_report(report)
    if any(report.mismatches.values()):
        if not as_json:
            console.print(str(VerifyMismatchError(report.mismatches)))
        sys.exit(1)


class _progress:
    """A progress line (counts and rate) on an interactive terminal (`progress_bar`);
    nothing on a pipe, in a log or with --json."""

    def __init__(self, as_json: bool) -> None:
        self._off = as_json
        self._bar: Any = None
        self._tasks: dict[str, Any] = {}

    def __enter__(self) -> Any:
        from rich.progress import ProgressColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
        from rich.text import Text

        from runstore.cli.console import progress_bar

        class TransferRate(ProgressColumn):
            def render(self, task: Any) -> Text:
                return Text(f"{task.speed or 0:,.0f}/s")

        bar = progress_bar(
            SpinnerColumn(), TextColumn("{task.description}", markup=False),
            TextColumn("{task.completed:,} copied, {task.fields[threads]:,} threads", markup=False),
            TransferRate(), TimeElapsedColumn(), off=self._off,
        )  # fmt: skip
        if bar.disable:
            return None
        self._bar = bar
        bar.__enter__()

        def update(kind: str, threads: int, copied: int) -> None:
            label = {"saver": "checkpoints", "events": "events", "runs": "runs", "store": "store items"}[kind]
            if kind not in self._tasks:
                self._tasks[kind] = bar.add_task(label, total=None, threads=0)
            bar.update(self._tasks[kind], completed=copied, threads=threads)

        return update

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def _print_report(report: Any) -> None:
    from runstore.cli.console import console, styled

    what = "would copy" if report.dry_run else "copied"
    table = Table(title=f"runstore migrate: pass {report.pass_number} ({report.pass_kind})"
                  + (" - dry run, nothing written" if report.dry_run else ""))  # fmt: skip
    for column, justify in (("kind", "left"), ("threads", "right"), (what, "right"), ("already there", "right"),
                            ("pending writes", "right"), ("size", "right"), ("conflicts", "left")):  # fmt: skip
        table.add_column(column, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for kind, c in report.counts.items():
        shown = ", ".join(c.conflicts[:5]) + (" ..." if len(c.conflicts) > 5 else "")
        unit = {"saver": "checkpoints", "events": "events", "runs": "runs", "store": "items"}[kind]
        # The store's row counts namespaces in the threads column.
        threads = f"{c.threads:,}" + (" namespaces" if kind == "store" else "")
        table.add_row(kind, threads, f"{c.copied:,} {unit}", f"{c.present:,}",
                      f"{c.writes:,}" if kind == "saver" else "-", _size(c.bytes) if kind in ("saver", "store") else "-",
                      shown or "-")  # fmt: skip
    console.print(table)
    for note in report.notes:
        console.print(f"note: {note}")
    console.print(f"from {report.source} to {report.destination} in {report.seconds:.1f}s")
    if report.verified:
        bad = {k: v for k, v in report.mismatches.items() if v}
        console.print(styled(("verify: every thread matches", "green")) if not bad
                      else styled(("verify: threads differ", "red")))  # fmt: skip


@click.command("migrate")
@click.argument("source")
@click.argument("destination")
@_copy_options
def migrate_cmd(source: str, destination: str, kinds: str | None, dry_run: bool, on_conflict: str, verify: bool,
                mode: str | None, ledger: Path | None, include_active: bool, store_index: str | None,
                as_json: bool) -> None:  # fmt: skip
    """Copy every thread with its history, event feed and runs, and every store item, from
    SOURCE to DESTINATION.

    Both are backend URLs (LangGraph's stock saver and store as SOURCE: langgraph+sqlite:///path.db,
    langgraph+postgresql://...). Rerun the same command to continue an interrupted copy
    or to catch up with what the source got since the last pass; a finished migration
    copies nothing. Exit 0: copied and verified; 1: verify found differing threads; 2: refused.
    """
    from runstore.migrate.engine import MigrateOptions
    from runstore.migrate.transfer import run_migrate

    options = MigrateOptions(kinds=(), dry_run=dry_run, on_conflict=on_conflict, verify=verify,  # type: ignore[arg-type]
                             destination_mode=_mode(mode), ledger=ledger, include_active=include_active,
                             store_index=_store_index(store_index))  # fmt: skip
    _run_copy(lambda: run_migrate(source, destination, options, _kinds(kinds)), as_json, options)


@click.command("export")
@click.argument("url")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The archive file to write (gzip'd JSON lines).")  # fmt: skip
@click.option("--kinds", help=_KINDS_HELP.replace("both sides serve", "the URL serves"))
@click.option("--json", "as_json", is_flag=True, help="Print the counts as JSON.")
def export_cmd(url: str, output: Path, kinds: str | None, as_json: bool) -> None:
    """Write everything URL holds into one versioned, compressed archive FILE."""
    from runstore.cli.console import console, emit_json
    from runstore.migrate.transfer import run_export

    result = asyncio.run(run_export(url, output, _kinds(kinds)))
    if as_json:
        emit_json(result)
        return
    console.print(f"exported {result['checkpoints']:,} checkpoints and {result['events']:,} events "
                  f"({', '.join(f'{k}: {v:,} threads' for k, v in result['threads'].items())}) to {output}")  # fmt: skip


@click.command("import")
@click.argument("archive", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.argument("url")
@_copy_options
def import_cmd(archive: Path, url: str, kinds: str | None, dry_run: bool, on_conflict: str, verify: bool,
               mode: str | None, ledger: Path | None, include_active: bool, store_index: str | None,
               as_json: bool) -> None:  # fmt: skip
    """Load an ARCHIVE written by ``runstore export`` into the backend at URL, then verify
    the backend against the archive. Resumable like ``runstore migrate``."""
    from runstore.migrate.engine import MigrateOptions
    from runstore.migrate.transfer import run_import

    options = MigrateOptions(kinds=(), dry_run=dry_run, on_conflict=on_conflict, verify=verify,  # type: ignore[arg-type]
                             destination_mode=_mode(mode), ledger=ledger, include_active=include_active,
                             store_index=_store_index(store_index))  # fmt: skip
    _run_copy(lambda: run_import(archive.resolve(), url, options, _kinds(kinds)), as_json, options)
