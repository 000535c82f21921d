"""The runstore command, run as a subprocess with its output parsed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import runstore

FORGETFUL_SAVER = '''
import runstore
from langgraph.checkpoint.memory import InMemorySaver


class ForgetfulSaver(InMemorySaver):
    """Broken on purpose: loses every checkpoint it is given."""

    async def aget_tuple(self, config):
        return None


async def _open(url, options):
    return ForgetfulSaver()


@runstore.hookimpl
def runstore_register_savers(registry):
    registry.add("forgetful", schemes=["forgetful"], factory=_open)
'''


def _runstore(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runstore.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=600
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
    assert "all conformance tests passed" in out.stdout


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
