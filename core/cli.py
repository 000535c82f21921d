"""The ``runstore`` command: list backends, run the conformance suite, benchmark."""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from . import __version__
from .errors import RunstoreError
from .redaction import redact

# Tables stay readable when piped: rich would otherwise wrap them to 80 columns. Markup
# and emoji codes are off: every string is printed as it is (an install hint such as
# 'runstore[postgres]', a test id such as test_x[memory], a path with :memory:);
# styled parts are `Text` objects built with `styled`.
console = Console(width=None if sys.stdout.isatty() else 160, markup=False, emoji=False)
err_console = Console(stderr=True, markup=False, emoji=False)


def styled(*parts: str | tuple[str, str]) -> Text:
    """Literal text with styled pieces: ``styled(("FAILED", "red"), " ", nodeid)``."""
    return Text.assemble(*parts)


def _emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="runstore")
def main() -> None:
    """Pluggable storage backends for LangGraph agent runtimes."""


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
def backends(as_json: bool) -> None:
    """List every registered backend and every plugin settings section.

    Backends: kind, name, schemes, capabilities, plugin, driver. Settings sections:
    name, plugin, keys with their defaults. ``--json`` prints ``{"backends": [...],
    "settings": [...]}``.
    """
    from .loader import get_backends

    registered = get_backends()
    rows: list[dict[str, Any]] = []
    for spec in registered.all():
        missing = spec.missing_driver()
        rows.append(
            {
                "kind": str(spec.kind),
                "name": spec.name,
                "schemes": list(spec.schemes),
                "capabilities": sorted(spec.capabilities),
                "plugin": spec.plugin.name,
                "distribution": spec.plugin.distribution,
                "version": spec.plugin.version,
                "driver_installed": missing is None,
                "install": None if missing is None else f"pip install 'runstore[{spec.extra}]'",
                "description": spec.description,
            }
        )
    sections = [_section_row(section) for section in registered.settings]
    if as_json:
        _emit_json({"backends": rows, "settings": sections})
        return
    table = Table(title="runstore backends", show_lines=False)
    for column in ("kind", "name", "schemes", "capabilities", "plugin"):
        table.add_column(column)
    table.add_column("driver", no_wrap=True)  # an install command stays on one line
    for row in rows:
        driver = (
            styled(("installed", "green"))
            if row["driver_installed"]
            else styled(("missing", "red"), f": {row['install']}")
        )
        table.add_row(
            row["kind"],
            row["name"],
            ", ".join(f"{s}://" for s in row["schemes"]),
            ", ".join(row["capabilities"]) or "-",
            _plugin_label(row),
            driver,
        )
    console.print(table)
    table = Table(title="plugin settings sections", show_lines=False)
    for column in ("section", "keys (default)", "plugin", "description"):
        table.add_column(column)
    for section in sections:
        keys = ", ".join(f"{k['key']}={k['default']}" for k in section["keys"])
        table.add_row(section["section"], keys, _plugin_label(section), section["description"])
    console.print(table)


def _plugin_label(row: dict[str, Any]) -> str:
    label = str(row["plugin"])
    if row["distribution"]:
        label += f" ({row['distribution']} {row['version']})"
    return label


def _section_row(section: Any) -> dict[str, Any]:
    """A settings section as plain data: its keys with their defaults and what they accept."""
    import dataclasses
    import typing

    from .settings import accepted_values

    hints = typing.get_type_hints(section.schema)
    defaults = section.schema()
    keys = [
        {
            "key": f.name,
            "default": getattr(defaults, f.name),
            "accepts": accepted_values(hints[f.name], f.metadata),
        }
        for f in dataclasses.fields(section.schema)
    ]
    return {
        "section": section.name,
        "plugin": section.plugin.name,
        "distribution": section.plugin.distribution,
        "version": section.plugin.version,
        "description": section.description,
        "keys": keys,
    }


def _default_urls() -> list[str]:
    """The configured backends, each limited to the kinds it is configured for."""
    from .check import SUITE_KINDS
    from .settings import Settings

    settings = Settings.load()
    kinds_by_url: dict[str, list[str]] = {}
    for setting, kind in zip(("checkpointer", "events", "streams", "runs"), SUITE_KINDS, strict=True):
        kinds_by_url.setdefault(getattr(settings, setting), []).append(kind)
    return [f"{','.join(kinds)}={url}" for url, kinds in kinds_by_url.items()]


@main.command()
@click.argument("urls", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--junit-xml", type=click.Path(dir_okay=False), help="Also write a JUnit XML report.")
@click.option("--plugin", "plugins", multiple=True, help="Register a runstore plugin module or .py file first.")
@click.option("--profile", help="Hypothesis profile: runstore-dev, runstore-ci or runstore-nightly.")
@click.option("-k", "keyword", help="Only run suite tests matching this pytest -k expression.")
@click.option("--show-log", is_flag=True, help="Print pytest's output after the matrix.")
@click.option("--timeout", type=click.FloatRange(min=0), default=None,
              help="Seconds each suite test may take (default 300; 0 = no bound).")
def check(
    urls: tuple[str, ...],
    as_json: bool,
    junit_xml: str | None,
    plugins: tuple[str, ...],
    profile: str | None,
    keyword: str | None,
    show_log: bool,
    timeout: float | None,
) -> None:
    """Run the conformance suite against backend URLs (default: the configured backends).

    Server backends are checked in a scratch database, schema or key prefix that is
    dropped afterwards; file backends in a temporary directory. Your data is not touched.
    """
    from .check import SUITE_KINDS, run_suite, split_backend_entry
    from .errors import BackendNotFoundError
    from .loader import get_backends, register_plugin_spec
    from .urls import BackendURL

    for plugin in plugins:
        register_plugin_spec(plugin)
    targets = list(urls) or _default_urls()
    registry = get_backends()
    for entry in targets:
        parsed = BackendURL.parse(split_backend_entry(entry)[1])
        if not any(registry.of(kind).serves(parsed) for kind in SUITE_KINDS):
            schemes = {s for kind in SUITE_KINDS for spec in registry.of(kind) for s in spec.schemes}
            raise BackendNotFoundError("runstore", parsed.scheme, schemes)
    shown = ", ".join(redact(u) for u in targets)
    extra_args = ["--runstore-timeout", str(timeout)] if timeout is not None else []
    if as_json:
        result = run_suite(
            targets, plugins=plugins, profile=profile, junit_xml=junit_xml, keyword=keyword,
            extra_args=extra_args,
        )
    else:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        err_console.print(f"runstore check: {shown}")
        with Progress(
            TextColumn("conformance", style="bold", markup=False),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}", markup=False),
            console=err_console,
            transient=False,
        ) as progress:
            task = progress.add_task("collecting", total=None)

            def on_progress(done: int, total: int, record: dict[str, Any] | None) -> None:
                label = ""
                if record is not None:
                    label = f"{record.get('kind') or ''}:{record.get('backend') or ''} {record['suite']}"
                    if record["outcome"] == "failed":
                        progress.console.print(styled(("FAILED", "red"), f" {record['nodeid']}"))
                progress.update(task, completed=done, total=total or None, description=label)

            result = run_suite(
                targets, plugins=plugins, profile=profile, junit_xml=junit_xml,
                keyword=keyword, extra_args=extra_args, on_progress=on_progress,
            )
    if as_json:
        _emit_json(result.to_json())
    else:
        _print_matrix(result)
        if show_log or (not result.ok and not result.records):
            console.print(result.log)
    sys.exit(0 if result.ok else 1)


def _print_matrix(result: Any) -> None:
    matrix = result.matrix()
    suites = sorted({suite for row in matrix.values() for suite in row})
    table = Table(title="conformance matrix (passed/failed/skipped)")
    table.add_column("backend")
    table.add_column("level")
    for suite in suites:
        table.add_column(suite, justify="center")
    style = {"passed": "green", "failed": "red", "skipped": "yellow"}
    for backend in sorted(matrix):
        cells: list[str | Text] = []
        for suite in suites:
            cell = matrix[backend].get(suite)
            if cell is None:
                cells.append("")
                continue
            text = f"{cell.counts['passed'] + cell.counts['xfailed']}/{cell.counts['failed'] + cell.counts['xpassed']}/{cell.counts['skipped']}"
            cells.append(styled((text, style[cell.status])))
        table.add_row(backend, result.level(backend), *cells)
    console.print(table)
    reasons: dict[str, int] = {}
    for row in matrix.values():
        for cell in row.values():
            for reason, count in cell.skip_reasons.items():
                reasons[reason] = reasons.get(reason, 0) + count
    for reason, count in sorted(reasons.items()):
        console.print(styled(("skipped", "yellow"), f" x{count}: {reason}"))
    for row in matrix.values():
        for cell in row.values():
            for failure in cell.failures:
                console.print(
                    styled(("FAILED", "red"), f" {failure['nodeid']}\n    {failure.get('message') or ''}")
                )
    verdict = ("all conformance tests passed", "green") if result.ok else ("conformance failures", "red")
    console.print(styled(f"{result.collected} tests: ", verdict))


@main.command("new-plugin")
@click.argument("name")
@click.option("--kind", type=click.Choice(["saver", "events", "streams", "runs"]), default="events",
              show_default=True,
              help="Which kind of backend the skeleton implements.")
@click.option("--directory", type=click.Path(file_okay=False), default=".", show_default=True,
              help="Where to create the runstore-NAME project.")
def new_plugin(name: str, kind: str, directory: str) -> None:
    """Write a minimal third-party plugin project: entry point, backend skeleton, CI test."""
    from pathlib import Path

    from .scaffold import new_plugin as scaffold

    written = scaffold(name, Path(directory), kind=kind)
    root = written[0].parent
    console.print(f"created {root} ({len(written)} files)")
    console.print(f"next: cd {root} && pip install -e '.[test]' && runstore check {name.replace('_', '-')}://")


def _attach_bench() -> None:
    import importlib

    try:
        bench = importlib.import_module(".bench.cli", __package__)
    except ImportError:
        return
    main.add_command(bench.bench_group)


_attach_bench()


def _attach_retention() -> None:
    from .retention_cli import compact_cmd, retention_group

    main.add_command(retention_group)
    main.add_command(compact_cmd)


_attach_retention()


def run() -> None:
    """Console entry point with friendly errors for runstore's own exceptions."""
    try:
        main(standalone_mode=True)
    except RunstoreError as exc:
        err_console.print(styled(("error:", "red"), f" {redact(str(exc))}"))
        sys.exit(2)


if __name__ == "__main__":
    run()
