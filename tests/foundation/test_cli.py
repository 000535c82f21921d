"""The runstore command, run as a subprocess with its output parsed."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

import runstore

FORGETFUL_SAVER = '''
import runstore
from runstore.hookspecs import hookimpl
from langgraph.checkpoint.memory import InMemorySaver


class ForgetfulSaver(InMemorySaver):
    """Broken on purpose: loses every checkpoint it is given."""

    async def aget_tuple(self, config):
        return None


async def _open(url, options):
    return ForgetfulSaver()


@hookimpl
def runstore_register_savers(registry):
    registry.add("forgetful", schemes=["forgetful"], factory=_open)
'''


def _runstore(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runstore.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=600,
        env={**os.environ, "COLUMNS": "250"},  # these tests read cell contents: no wrapping inside cells
    )


def test_version(tmp_path: Path) -> None:
    out = _runstore("--version", cwd=tmp_path)
    assert out.returncode == 0
    assert out.stdout.strip() == f"runstore, version {runstore.__version__}"


def test_backends_json_and_table(tmp_path: Path) -> None:
    listed = json.loads(_runstore("backends", "--json", cwd=tmp_path).stdout)
    rows = listed["backends"]
    names = {(r["kind"], r["name"]) for r in rows}
    assert {("saver", "sqlite"), ("events", "jsonl"), ("streams", "redis")} <= names
    pg = next(r for r in rows if (r["kind"], r["name"]) == ("events", "postgres"))
    assert pg["schemes"] == ["postgresql", "postgres"] and pg["driver_installed"] is True
    assert "cross_process" in pg["capabilities"] and pg["distribution"] == "runstore"
    sections = {s["section"]: s for s in listed["settings"]}
    assert {"sqlite", "postgres", "redis"} <= set(sections)
    sqlite = sections["sqlite"]
    assert sqlite["plugin"] == "sqlite" and sqlite["distribution"] == "runstore"
    assert {"key": "busy_timeout_ms", "default": 5000, "accepts": "an integer from 0 to 2147483647"} in sqlite["keys"]
    table = _runstore("backends", cwd=tmp_path).stdout
    assert "jsonl://" in table and "installed" in table and "owner_filter" in table
    assert "plugin settings sections" in table and "busy_timeout_ms=5000" in table


def test_check_passes_and_reports_json(tmp_path: Path) -> None:
    out = _runstore("check", "memory://", "--json", "--profile", "runstore-ci", "-k", "roundtrip", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout)
    assert result["ok"] is True and result["collected"] >= 1
    saver = result["backends"]["saver:memory"]
    assert saver["level"] == "full"
    assert sum(s["passed"] for s in saver["suites"].values()) >= 1


def test_check_fails_a_broken_backend_with_junit(tmp_path: Path) -> None:
    plugin = tmp_path / "forgetful_plugin.py"
    plugin.write_text(textwrap.dedent(FORGETFUL_SAVER))
    junit = tmp_path / "report.xml"
    out = _runstore(
        "check", "forgetful://", "--plugin", str(plugin), "--json", "--junit-xml", str(junit),
        "-k", "roundtrip", cwd=tmp_path,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    result = json.loads(out.stdout)
    assert result["ok"] is False
    backend = result["backends"]["saver:forgetful"]
    assert backend["level"] == "failing"
    failures = [f for s in backend["suites"].values() for f in s["failures"]]
    assert failures and all("roundtrip" in f["test"] for f in failures)
    suite = ET.parse(junit).getroot()
    assert int(suite.find("testsuite").get("failures") if suite.tag == "testsuites" else suite.get("failures")) >= 1


def test_check_table_output(tmp_path: Path) -> None:
    out = _runstore("check", "memory://", "-k", "roundtrip", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "conformance matrix" in out.stdout and "saver:memory" in out.stdout
    assert "all conformance tests that ran passed" in out.stdout


def test_check_unknown_scheme_is_a_clear_error(tmp_path: Path) -> None:
    out = _runstore("check", "nosuch://x", cwd=tmp_path)
    assert out.returncode == 2
    assert "'nosuch'" in out.stderr and "memory://" in out.stderr


def test_check_never_prints_passwords(tmp_path: Path) -> None:
    out = _runstore("check", "nosuch://u:hunter2@h/db", cwd=tmp_path)
    assert "hunter2" not in out.stdout + out.stderr


def test_check_defaults_to_the_configured_backends_per_kind(tmp_path: Path) -> None:
    (tmp_path / "runstore.yaml").write_text("checkpointer: memory://\nevents: jsonl:///ev\nstreams: memory://\n")
    out = _runstore("check", "--json", "-k", "roundtrip or unknown_threads or publish_order", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    backends = set(json.loads(out.stdout)["backends"])
    # memory:// serves every kind, but it is configured only as checkpointer and bridge.
    assert backends == {"saver:memory", "events:jsonl", "streams:memory"}
    assert not (tmp_path / "ev").exists(), "check runs in a scratch location, never on the configured data"


def test_check_rejects_unknown_kind_prefix(tmp_path: Path) -> None:
    out = _runstore("check", "sewers=memory://", cwd=tmp_path)
    assert out.returncode == 2
    assert "unknown kind(s) ['sewers']" in out.stderr


# -- every message keeps its square brackets (rich markup is off) ----------------------

MISSING_DRIVER_PLUGIN = '''
import runstore
from runstore.hookspecs import hookimpl
from runstore.plugins.memory.events import MemoryEventStore


async def _open(url, options):
    return MemoryEventStore()


@hookimpl
def runstore_register_event_stores(registry):
    registry.add("bracketed", schemes=["bracketed"], factory=_open, drivers=["runstore_no_such_driver"],
                 extra="bracketed")
'''


def _in_process(*args: str) -> tuple[int, str]:
    """Run the CLI in this process (so test plugins registered here are seen); exit code and output."""
    from click.testing import CliRunner

    from runstore import cli
    from runstore.cli.console import console

    width = console.width
    console.width = 250  # cell contents whole on one line, as the assertions read them
    try:
        result = CliRunner().invoke(cli.main, list(args))
    finally:
        console.width = width
    return result.exit_code, result.output


def test_backends_table_prints_install_hints_with_brackets(tmp_path: Path) -> None:
    from runstore import loader

    module = tmp_path / "bracketed_plugin.py"
    module.write_text(MISSING_DRIVER_PLUGIN)
    loader.register_plugin_spec(str(module))
    try:
        code, out = _in_process("backends")
    finally:
        loader.unregister_plugin("bracketed_plugin")
        loader.reset()
    assert code == 0, out
    assert "pip install 'runstore[bracketed]'" in out


def test_new_plugin_messages_keep_brackets(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "runstore", "new-plugin", "acme", "--directory", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "pip install -e '.[test]' && runstore check acme://" in out.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "runstore", "new-plugin", "Bad-Name", "--directory", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )
    assert bad.returncode == 2
    assert "([a-z][a-z0-9_]*)" in bad.stderr


def test_errors_keep_brackets(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from runstore.errors import MissingDriverError

    def fail(**_: Any) -> None:
        raise MissingDriverError("postgres", "asyncpg", "postgres")

    # The module, not the package attribute `main` (the click group it re-exports).
    command = importlib.import_module("runstore.cli.main")
    monkeypatch.setattr(command, "main", fail)
    with pytest.raises(SystemExit) as exited:
        command.run()
    assert exited.value.code == 2
    assert "pip install 'runstore[postgres]'" in capsys.readouterr().err


def test_check_failures_keep_test_ids_with_brackets(tmp_path: Path) -> None:
    plugin = tmp_path / "forgetful_plugin.py"
    plugin.write_text(textwrap.dedent(FORGETFUL_SAVER))
    out = _runstore("check", "forgetful://", "--plugin", str(plugin), "-k", "roundtrip", cwd=tmp_path)
    assert out.returncode == 1
    # The failure lines name the parametrized test ids whole, brackets included.
    assert "[forgetful]" in out.stdout and "FAILED" in out.stdout


def test_python_dash_m_runstore(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "runstore", "--version"], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"runstore, version {runstore.__version__}"


def test_bench_is_a_subcommand(tmp_path: Path) -> None:
    out = _runstore("bench", "--help", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "summarize" in out.stdout
