"""The ``runstore`` command: list backends, run the conformance suite, benchmark."""

from __future__ import annotations

import sys
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from runstore import __version__
from runstore.cli.console import console, emit_json, err_console, styled
from runstore.errors import RunstoreError
from runstore.redaction import redact


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
    from runstore.loader import get_backends

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
        emit_json({"backends": rows, "settings": sections})
        return
    table = Table(title="runstore backends", show_lines=False)
    for column in ("kind", "name", "schemes", "capabilities", "plugin", "driver"):
        # Long cells wrap inside their column (names whole, never cut with an ellipsis).
        table.add_column(column, overflow="fold")
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
        table.add_column(column, overflow="fold")
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

    from runstore.settings import accepted_values

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
    from runstore.checkpoint.cache import history_cache_url
    from runstore.loader import get_backends
    from runstore.settings import Settings

    settings = Settings.load()
    kinds_by_url: dict[str, list[str]] = {}
    for setting, kind in (("checkpointer", "saver"), ("events", "events"), ("streams", "streams"),
                          ("runs", "runs"), ("store", "store")):
        kinds_by_url.setdefault(getattr(settings, setting), []).append(kind)
    # The history cache only where one would be opened (docs/checkpoint-modes.md).
    cache = history_cache_url(settings, get_backends()) if settings.checkpoint_cache.enabled != "off" else None
    if cache is not None:
        kinds_by_url.setdefault(cache.render(hide_password=False), []).append("history_cache")
    return [f"{','.join(kinds)}={url}" for url, kinds in kinds_by_url.items()]


@main.command()
@click.argument("urls", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--junit-xml", type=click.Path(dir_okay=False), help="Also write a JUnit XML report.")
@click.option("--plugin", "plugins", multiple=True, help="Register a runstore plugin module or .py file first.")
@click.option("--profile", help="Hypothesis profile: runstore-ci (default), runstore-dev or runstore-nightly.")
@click.option("--seed", type=int, help="Hypothesis seed for a randomized profile (the report shows the one used).")
@click.option("-k", "keyword", help="Only run suite tests matching this pytest -k expression.")
@click.option("--allow-unreachable", is_flag=True,
              help="Skip the tests of a backend whose server cannot be reached instead of failing.")
@click.option("--show-log", is_flag=True, help="Print pytest's output after the matrix.")
@click.option("--timeout", type=click.FloatRange(min=0), default=None,
              help="Seconds each suite test may take (default 300, or `timeout` of the project; 0 = no bound).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="Read [tool.runstore.conformance] from this file (default: ./pyproject.toml).")
@click.option("--preset", "presets", multiple=True,
              help="Add the backends of a preset from [tool.runstore.conformance.presets].")
def check(
    urls: tuple[str, ...],
    as_json: bool,
    junit_xml: str | None,
    plugins: tuple[str, ...],
    profile: str | None,
    seed: int | None,
    keyword: str | None,
    allow_unreachable: bool,
    show_log: bool,
    timeout: float | None,
    config_path: str | None,
    presets: tuple[str, ...],
) -> None:
    """Run the conformance suite against backend URLs and ``--preset`` backends (default: the
    project's ``backends``, else the configured backends).

    ``[tool.runstore.conformance]`` of ./pyproject.toml (or ``--config``) applies as
    under pytest: its ``plugins`` are loaded, its ``xfail`` entries and ``timeout`` hold.

    Server backends are checked in a scratch database, schema or key prefix that is
    dropped afterwards; file backends in a temporary directory. Your data is not touched.
    Exit code: 0 all ran tests passed, 1 a failure (or nothing ran), 2 refused before
    running (the message says why), 130 interrupted.
    """
    import random
    from pathlib import Path

    from runstore.cli.check import (
        SUITE_KINDS,
        check_suite_installed,
        read_project_config,
        run_suite,
        split_backend_entry,
    )
    from runstore.errors import BackendNotFoundError
    from runstore.loader import get_backends, normalize_plugin_spec, register_plugin_spec
    from runstore.urls import BackendURL

    check_suite_installed()
    project = read_project_config(config_path)
    for plugin in dict.fromkeys([*project.plugins(), *(normalize_plugin_spec(p, Path.cwd()) for p in plugins)]):
        register_plugin_spec(plugin)
    named = [*urls, *project.preset_backends(presets, option="--preset")]
    targets = named or list(project.settings.get("backends", [])) or _default_urls()
    registry = get_backends()
    for entry in targets:
        parsed = BackendURL.parse(split_backend_entry(entry)[1])
        if not any(registry.of(kind).serves(parsed) for kind in SUITE_KINDS):
            schemes = {s for kind in SUITE_KINDS for spec in registry.of(kind) for s in spec.schemes}
            raise BackendNotFoundError("runstore", parsed.scheme, schemes)
    if seed is None and profile and profile != "runstore-ci":
        # A randomized run is replayable only with its seed: pick it here and report it.
        seed = random.SystemRandom().getrandbits(32)
    options: dict[str, Any] = {
        "plugins": plugins, "profile": profile, "seed": seed, "junit_xml": junit_xml,
        "keyword": keyword, "allow_unreachable": allow_unreachable, "project": project,
        "extra_args": ["--runstore-timeout", str(timeout)] if timeout is not None else [],
    }
    shown = ", ".join(redact(u) for u in targets)
    if as_json:
        result = run_suite(targets, **options)
    else:
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

        from runstore.cli.check import backend_label
        from runstore.cli.console import progress_bar

        err_console.print(f"runstore check: {shown}")
        with progress_bar(
            TextColumn("conformance", style="bold", markup=False),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}", markup=False),
        ) as progress:
            task = progress.add_task("collecting", total=None)

            def on_progress(done: int, total: int, record: dict[str, Any] | None) -> None:
                label = ""
                if record is not None:
                    label = f"{backend_label(record)} {record['suite']}"
                    if record["outcome"] == "failed":
                        progress.console.print(
                            styled(("FAILED", "red"), f" {backend_label(record)} {record['nodeid']}")
                        )
                progress.update(task, completed=done, total=total or None, description=label)

            result = run_suite(targets, on_progress=on_progress, **options)
    if as_json:
        emit_json(result.to_json())
    elif result.errors:
        for message in result.errors:
            err_console.print(styled(("error:", "red"), f" {message}"), soft_wrap=True)
    else:
        _print_report(result)
        if show_log or (not result.ok and not result.records):
            console.print(result.log)
    status = result.status
    sys.exit({"passed": 0, "skipped": 0, "error": 2, "interrupted": 130}.get(status, 1))


def _print_report(result: Any) -> None:
    """The matrix (one row per kind and backend), skip reasons, failures with their replay
    command, the Hypothesis profile and seed, and the verdict."""
    summary = result.to_json()
    matrix = result.matrix()
    # One row per backend; its suites stacked in one cell (a column per suite would not
    # fit a terminal once a run covers several kinds).
    table = Table(title="conformance matrix (per suite: passed/failed/skipped)")
    for column in ("backend", "level", "run", "passed", "failed", "skipped"):
        table.add_column(column, justify="left" if column in ("backend", "level") else "right", overflow="fold")
    table.add_column("suites", no_wrap=True)
    table.add_column("capabilities proven", overflow="fold")
    style = {"passed": "green", "failed": "red", "skipped": "yellow", "interrupted": "magenta"}
    for backend in sorted(matrix):
        row = summary["backends"][backend]
        suites = Text()
        for suite, cell in sorted(matrix[backend].items()):
            passed = cell.counts["passed"] + cell.counts["xfailed"]
            failed = cell.counts["failed"] + cell.counts["xpassed"]
            suites.append("\n" if suites else "")
            suites.append(f"{suite} {passed}/{failed}/{cell.counts['skipped']}", style=style[cell.status])
        caps = row["capabilities"]
        proven = ", ".join(caps["proven"]) or "-"
        if caps["failed"]:
            proven += f" (failed: {', '.join(caps['failed'])})"
        table.add_row(
            backend, row["level"], str(row["run"]), str(row["passed"]), str(row["failed"]),
            str(row["skipped"]), suites, proven,
        )
    console.print(table)
    for backend, row in sorted(summary["backends"].items()):
        for reason, count in row["skip_reasons"].items():
            console.print(styled(("skipped", "yellow"), f" {backend} x{count}: {reason}"))
    for backend, row in sorted(summary["backends"].items()):
        for suite in row["suites"].values():
            for failure in suite["failures"]:
                console.print(styled(
                    ("FAILED", "red"),
                    f" {backend} {failure['test']}\n    {failure.get('message') or ''}\n"
                    f"    replay: {failure['replay']}",
                ))
    if summary["derandomized"]:
        console.print(f"Hypothesis profile {summary['profile']} (derandomized: each test's examples are fixed)")
    elif summary["profile"]:
        console.print(f"Hypothesis profile {summary['profile']}, seed {summary['seed']}")
    if summary["timeout"] is not None:
        console.print(f"each test phase bounded at {summary['timeout']:g}s" if summary["timeout"] else "no per-test bound")
    console.print(f"replay: {summary['replay']}")
    counts = f"{summary['run']} ran: {summary['passed']} passed, {summary['failed']} failed; {summary['skipped']} skipped"
    verdict = {
        "passed": ("all conformance tests that ran passed", "green"),
        "failed": ("conformance failures", "red"),
        "interrupted": ("interrupted: no verdict", "magenta"),
        "empty": ("no conformance test ran: no verdict", "red"),
        "skipped": ("no conformance test ran (unreachable backends skipped, as allowed)", "yellow"),
    }[summary["status"]]
    console.print(styled(f"{counts}: ", verdict))


@main.command("schema-sql")
@click.argument("url")
@click.option("--kind", "kinds", multiple=True, type=click.Choice(["checkpointer", "events", "runs", "store"]),
              help="Only these kinds (default: every kind whose backend serves URL).")
def schema_sql(url: str, kinds: tuple[str, ...]) -> None:
    """Print the SQL that would bring URL's runstore tables up to date, applying nothing.

    For a DBA: run it with a role that may create tables (the migrations are rehearsed
    in a transaction that is rolled back), review the script, apply it; the application
    then needs no DDL privileges. Prints nothing when the schema is current.
    """
    import asyncio

    from runstore.loader import get_backends
    from runstore.options import BackendOptions
    from runstore.settings import Settings
    from runstore.urls import BackendURL

    parsed = BackendURL.parse(url)
    registry = get_backends()
    wanted = kinds or ("checkpointer", "events", "runs", "store")
    specs = [(kind, registry.of(_SUITE_KIND[kind]).for_url(parsed)) for kind in wanted
             if kinds or registry.of(_SUITE_KIND[kind]).serves(parsed)]

    async def scripts() -> list[str]:
        out: list[str] = []
        async with BackendOptions.scope(Settings.load()) as options:
            options.migrate = False
            for kind, spec in specs:
                store = await spec.open(parsed, options)
                closer = getattr(store, "close", None)
                if closer is not None and not hasattr(store, "aclose"):
                    options.on_close(closer)
                script = await store.schema_sql() if hasattr(store, "schema_sql") else ""
                if script:
                    out.append(f"-- runstore {kind} ({spec.name})\n{script}")
        return out

    for script in asyncio.run(scripts()):
        click.echo(script)


#: `runstore schema-sql --kind` names -> registry kinds.
_SUITE_KIND = {"checkpointer": "saver", "events": "events", "runs": "runs", "store": "store"}


@main.command("new-plugin")
@click.argument("name")
@click.option("--kind", type=click.Choice(["saver", "events", "streams", "runs", "store", "history_cache"]),
              default="events", show_default=True,
              help="Which kind of backend the skeleton implements.")
@click.option("--directory", type=click.Path(file_okay=False), default=".", show_default=True,
              help="Where to create the runstore-NAME project.")
def new_plugin(name: str, kind: str, directory: str) -> None:
    """Write a minimal third-party plugin project: entry point, backend skeleton, CI test."""
    from pathlib import Path

    from runstore.cli.scaffold import new_plugin as scaffold

    written = scaffold(name, Path(directory), kind=kind)
    root = written[0].parent
    console.print(f"created {root} ({len(written)} files)")
    console.print(f"next: cd {root} && pip install -e '.[test]' && runstore check {name.replace('_', '-')}://")


def _attach_bench() -> None:
    import importlib

    try:
        bench = importlib.import_module("runstore.bench.cli")
    except ImportError:
        return
    main.add_command(bench.bench_group)


_attach_bench()


def _attach_retention() -> None:
    from runstore.cli.retention import compact_cmd, retention_group

    main.add_command(retention_group)
    main.add_command(compact_cmd)


_attach_retention()


def _attach_migrate() -> None:
    from runstore.cli.migrate import export_cmd, import_cmd, migrate_cmd

    main.add_command(migrate_cmd)
    main.add_command(export_cmd)
    main.add_command(import_cmd)


_attach_migrate()


def _plain_help(command: click.Command) -> None:
    """Help texts without the reST markup of the docstrings they come from: ````--json````
    and ```timeout``` would be shown with their backticks; a terminal gets 'x' instead."""
    import re

    def plain(text: str | None) -> str | None:
        return None if text is None else re.sub(r"`{1,2}([^`]+)`{1,2}", r"'\1'", text)

    command.help = plain(command.help)
    command.short_help = plain(command.short_help)
    for param in command.params:
        if isinstance(param, click.Option):
            param.help = plain(param.help)
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _plain_help(sub)


_plain_help(main)


def run() -> None:
    """Console entry point with friendly errors for runstore's own exceptions."""
    try:
        main(standalone_mode=True)
    except RunstoreError as exc:
        err_console.print(styled(("error:", "red"), f" {redact(str(exc))}"), soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    run()
