"""The commands: a summary table that fits 120 columns and carries no control lines off
a terminal, ``--json``, export then import, refusals as runstore errors."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from runstore.cli import console as cli_console
from runstore.cli.main import main
from runstore.errors import SameBackendError
from runstore.migrate.endpoints import open_endpoint
from runstore.urls import BackendURL

from .data import write_events, write_graph_threads


async def populate(url: str) -> None:
    async with open_endpoint(url, ["saver", "events"]) as side:
        await write_graph_threads(side.saver)
        await write_events(side.events)


def test_migrate_prints_a_plain_table_then_json_then_export_and_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The CLI's console takes its width when first imported, which in a test process may
    # be inside another test's CliRunner with its own COLUMNS: pin what a piped run gets.
    monkeypatch.setattr(cli_console.console, "width", cli_console.PIPED_WIDTH)
    a, b, c = (BackendURL.for_file("sqlite", tmp_path / n).render() for n in ("a.db", "b.db", "c.db"))
    asyncio.run(populate(a))
    runner = CliRunner()
    result = runner.invoke(main, ["migrate", a, b, "--mode", "delta"], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert "verify: every thread matches" in result.output and "26 checkpoints" in result.output
    assert "\x1b" not in result.output and "\r" not in result.output
    assert max(len(line) for line in result.output.splitlines()) <= 120
    result = runner.invoke(main, ["migrate", a, b, "--mode", "delta", "--json"])
    report = json.loads(result.output)
    assert report["pass_kind"] == "catch-up" and report["counts"]["saver"]["copied"] == 0 and report["ok"]
    archive = tmp_path / "a.gz"
    result = runner.invoke(main, ["export", a, "-o", str(archive), "--json"])
    assert json.loads(result.output)["checkpoints"] == 26
    result = runner.invoke(main, ["import", str(archive), c, "--mode", "delta", "--json"])
    assert result.exit_code == 0 and json.loads(result.output)["counts"]["events"]["copied"] == 15
    result = runner.invoke(main, ["migrate", a, a])
    assert isinstance(result.exception, SameBackendError)
