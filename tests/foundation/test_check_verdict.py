"""Never a pass without a run: each way a conformance run could say nothing is refused with
one clear message, through ``runstore check`` and through ``pytest --runstore-backend``."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from runstore.cli.check import CheckResult

MISSING_DRIVER_PLUGIN = """
import runstore
from runstore.hookspecs import hookimpl
from runstore.plugins.memory.events import MemoryEventStore


async def _open(url, options):
    return MemoryEventStore()


@hookimpl
def runstore_register_event_stores(registry):
    registry.add("nodriver", schemes=["nodriver"], factory=_open, drivers=["runstore_no_such_driver"],
                 extra="nodriver")
"""

#: Two savers whose names hold '-': each keeps its own row; one of them is broken.
ZOO_PLUGIN = """
import runstore
from runstore.hookspecs import hookimpl
from langgraph.checkpoint.memory import InMemorySaver


class Forgetful(InMemorySaver):
    async def aget_tuple(self, config):
        return None


async def _memory(url, options):
    return InMemorySaver()


async def _forgetful(url, options):
    return Forgetful()


@hookimpl
def runstore_register_savers(registry):
    registry.add("zoo-lg-memory", schemes=["zoo-lg-memory"], factory=_memory)
    registry.add("zoo-minimal", schemes=["zoo-minimal"], factory=_forgetful)
"""

#: A saver that never answers: the run is interrupted while it waits.
HANGING_PLUGIN = """
import asyncio
import os
import runstore
from runstore.hookspecs import hookimpl
from langgraph.checkpoint.memory import InMemorySaver


class Hanging(InMemorySaver):
    async def aput(self, *args, **kwargs):
        open(os.environ["HANG_MARKER"], "w").close()
        await asyncio.sleep(3600)


async def _open(url, options):
    return Hanging()


@hookimpl
def runstore_register_savers(registry):
    registry.add("hanging", schemes=["hanging"], factory=_open)
"""


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _check(*args: str, cwd: Path, prelude: str = "") -> subprocess.CompletedProcess[str]:
    code = f"import sys\n{prelude}\nfrom runstore.cli.main import run\nsys.argv = ['runstore', 'check', *sys.argv[1:]]\nrun()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=cwd, timeout=600
    )


def _pytest(*args: str, cwd: Path, prelude: str = "") -> subprocess.CompletedProcess[str]:
    code = f"import sys\n{prelude}\nimport pytest\nsys.exit(pytest.main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, "--pyargs", "runstore.conformance", "-p", "no:cacheprovider",
         "-q", "-c", os.devnull, "--rootdir", str(cwd), *args],
        capture_output=True, text=True, cwd=cwd, timeout=600,
    )


def _one_error(out: subprocess.CompletedProcess[str], text: str) -> None:
    """Exactly one clear message: it appears once, with no traceback and no INTERNALERROR."""
    both = out.stdout + out.stderr
    assert both.count(text) == 1, both
    assert "Traceback" not in both and "INTERNALERROR" not in both, both


#: Hypothesis "not installed": what the checks look up says so (the suite then never imports it).
BLOCK_HYPOTHESIS = (
    "import importlib.util; _find = importlib.util.find_spec\n"
    "importlib.util.find_spec = lambda name, package=None: None if name == 'hypothesis' else _find(name, package)"
)


@pytest.mark.parametrize(
    "case",
    ["unreachable", "no-match", "missing-driver", "missing-hypothesis", "bad-option", "bad-profile"],
)
def test_each_way_to_say_nothing_is_refused_once(case: str, tmp_path: Path) -> None:
    plugin = tmp_path / "nodriver_plugin.py"
    plugin.write_text(MISSING_DRIVER_PLUGIN)
    port = _closed_port()
    cases: dict[str, tuple[list[str], list[str], str, str, str]] = {
        # case: (check args, pytest args, expected text, hint under check, hint under pytest)
        "unreachable": (
            [f"postgresql://postgres@127.0.0.1:{port}/test"],
            ["--runstore-backend", f"postgresql://postgres@127.0.0.1:{port}/test"],
            f"cannot reach 127.0.0.1:{port}: ConnectionRefusedError",
            "--allow-unreachable", "--runstore-allow-unreachable",
        ),
        "no-match": (
            ["memory://", "-k", "no_such_test_anywhere"],
            ["--runstore-backend", "memory://", "-k", "no_such_test_anywhere"],
            "no conformance test matches the selection -k 'no_such_test_anywhere'", "", "",
        ),
        "missing-driver": (
            ["nodriver://", "--plugin", str(plugin)],
            ["--runstore-backend", "nodriver://", "--runstore-plugin", str(plugin)],
            "pip install 'runstore[nodriver]'", "", "",
        ),
        "missing-hypothesis": (
            ["memory://"], ["--runstore-backend", "memory://", "-p", "no:hypothesispytest"],
            "pip install 'runstore[conformance]'", "", "",
        ),
        "bad-option": (
            ["memory://?schem=a"], ["--runstore-backend", "memory://?schem=a"],
            "unknown option(s) 'schem' in memory://?schem=a", "", "",
        ),
        "bad-profile": (
            ["memory://", "--profile", "runstore-cii"],
            ["--runstore-backend", "memory://", "--hypothesis-profile", "runstore-cii"],
            "'runstore-cii': no such Hypothesis profile; known:", "--profile", "--hypothesis-profile",
        ),
    }
    check_args, pytest_args, text, cli_hint, pytest_hint = cases[case]
    prelude = BLOCK_HYPOTHESIS if case == "missing-hypothesis" else ""

    out = _check(*check_args, cwd=tmp_path, prelude=prelude)
    assert out.returncode == 2, out.stdout + out.stderr
    _one_error(out, text)
    assert cli_hint in out.stderr and (not pytest_hint or pytest_hint == cli_hint or pytest_hint not in out.stderr)
    if case == "bad-profile":
        assert "runstore-dev" in out.stderr and "runstore-nightly" in out.stderr

    out = _pytest(*pytest_args, cwd=tmp_path, prelude=prelude)
    assert out.returncode == pytest.ExitCode.USAGE_ERROR, out.stdout + out.stderr
    _one_error(out, text)
    assert pytest_hint in out.stderr


def test_unreachable_backends_skip_only_when_allowed(tmp_path: Path) -> None:
    dead = f"postgresql://postgres@127.0.0.1:{_closed_port()}/test"
    out = _check("memory://", dead, "--allow-unreachable", "--json", "-k", "roundtrip", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout)
    assert result["backends"]["saver:memory"]["level"] == "full"
    postgres = result["backends"]["saver:postgres"]
    assert postgres["run"] == 0 and postgres["level"] == "untested"
    assert any(r.startswith("cannot reach 127.0.0.1:") for r in postgres["skip_reasons"])


def test_relative_plugin_path_works(tmp_path: Path) -> None:
    (tmp_path / "zoo_plugin.py").write_text(ZOO_PLUGIN)
    out = _check("zoo-lg-memory://", "--plugin", "zoo_plugin.py", "--json", "-k", "roundtrip", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout)["backends"]["saver:zoo-lg-memory"]["passed"] == 1


def test_runstore_check_reads_the_project_s_pyproject(tmp_path: Path) -> None:
    """The child pytest runs in a temporary directory; the author's [tool.runstore.conformance]
    still holds: its backends, plugins (relative to the pyproject), xfail entries and timeout."""
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "zoo_plugin.py").write_text(ZOO_PLUGIN)
    (tmp_path / "pyproject.toml").write_text(
        "[tool.runstore.conformance]\n"
        'backends = ["zoo-minimal://"]\n'
        'plugins = ["plugins/zoo_plugin.py"]\n'
        "timeout = 42\n"
        'xfail = { "test_savers.py::*test_put_then_get_roundtrip*" = "forgets what it saved" }\n'
    )
    # No URL and no --plugin: both come from the pyproject; the broken saver's failure is
    # a declared known failure, so the run passes.
    out = _check("--json", "-k", "test_put_then_get_roundtrip", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout)
    assert result["timeout"] == 42
    (suite,) = result["backends"]["saver:zoo-minimal"]["suites"].values()
    assert (suite["xfailed"], suite["failed"]) == (1, 0), suite

    # From another folder with --config; --timeout still overrides the file.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    config = str(tmp_path / "pyproject.toml")
    out = _check("--config", config, "--timeout", "7", "--json", "-k", "test_put_then_get_roundtrip", cwd=elsewhere)
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout)
    assert result["timeout"] == 7
    assert f"--config {config}" in result["replay"]

    out = _check("--config", str(elsewhere / "pyproject.toml"), cwd=elsewhere)
    assert out.returncode == 2, out.stdout + out.stderr
    _one_error(out, f"--config: {elsewhere / 'pyproject.toml'} does not exist")


def test_runstore_check_runs_a_preset_of_the_project(tmp_path: Path) -> None:
    """``--preset NAME`` adds that preset's backends from [tool.runstore.conformance.presets],
    as ``--runstore-preset`` does under pytest; an unknown name is refused before running."""
    (tmp_path / "pyproject.toml").write_text(
        "[tool.runstore.conformance]\n"
        'backends = ["zoo-minimal://"]\n'
        'presets = { quick = ["saver=memory://"], other = ["events=memory://"], none = [], '
        'one = "memory://" }\n'
    )
    out = _check("--preset", "quick", "--json", "-k", "test_put_then_get_roundtrip", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    # The preset replaces the project's default backends (zoo-minimal:// would not even load).
    assert set(json.loads(out.stdout)["backends"]) == {"saver:memory"}

    out = _check("--preset", "nope", cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    _one_error(
        out, "--preset 'nope': not in [tool.runstore.conformance.presets]; known: none, one, other, quick"
    )
    # A preset that is not a non-empty list of URLs is refused, not read letter by letter or
    # quietly replaced by the project's default backends.
    for name, shown in (("none", "[]"), ("one", "'memory://'")):
        out = _check("--preset", name, cwd=tmp_path)
        assert out.returncode == 2, out.stdout + out.stderr
        _one_error(out, f"--preset '{name}': [tool.runstore.conformance.presets] {name} = {shown}; accepted:")


def test_nothing_ran_fails(tmp_path: Path) -> None:
    # memory:// declares no cross_process: every selected test skips, so nothing was proven.
    out = _check("events=memory://", "-k", "cross_process", cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "no conformance test ran" in out.stdout
    out = _pytest("--runstore-backend", "events=memory://", "-k", "cross_process", cwd=tmp_path)
    assert out.returncode == pytest.ExitCode.TESTS_FAILED, out.stdout + out.stderr
    assert out.stdout.count("no conformance test ran") == 1


def test_report_rows_per_backend_counts_profile_and_replay(tmp_path: Path) -> None:
    (tmp_path / "zoo_plugin.py").write_text(ZOO_PLUGIN)
    junit = tmp_path / "report.xml"
    args = ["zoo-lg-memory://", "zoo-minimal://", "sqlite://", "--plugin", "zoo_plugin.py", "-k",
            "roundtrip or unknown_threads or cross_process_writer"]
    out = _check(*args, "--json", "--junit-xml", str(junit), cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    result = json.loads(out.stdout)
    backends = result["backends"]
    # Names holding '-' keep their rows; sqlite:// provides no stream bridge, so no streams row.
    assert {"saver:zoo-lg-memory", "saver:zoo-minimal", "saver:sqlite", "events:sqlite"} <= set(backends)
    assert not any(label.startswith(("streams:", "saver:zoo:")) for label in backends)
    assert backends["saver:zoo-lg-memory"]["level"] == "partial"  # declares no cross_process
    broken = backends["saver:zoo-minimal"]
    assert broken["level"] == "failing" and broken["failed"] == 1 and broken["run"] == 1
    failure = next(f for s in broken["suites"].values() for f in s["failures"])
    assert failure["replay"].startswith("runstore check saver=zoo-minimal:// --plugin ")
    assert failure["replay"].endswith("-k test_put_then_get_roundtrip")
    assert "--plugin" in failure["replay"] and str(tmp_path / "zoo_plugin.py") in failure["replay"]
    sqlite = backends["saver:sqlite"]
    assert "cross_process" in sqlite["capabilities"]["proven"]
    assert "copy_thread" in sqlite["capabilities"]["unproven"]
    assert result["run"] == sum(b["run"] for b in backends.values())
    assert result["profile"] == "runstore-ci" and result["derandomized"] is True
    assert result["status"] == "failed"
    props = {p.get("name"): p.get("value") for p in ET.parse(junit).iter("property")}
    assert props["runstore.profile"] == "runstore-ci"
    assert props["runstore.saver:zoo-minimal.level"] == "failing"
    assert "cross_process" in props["runstore.saver:sqlite.capabilities.proven"]

    out = _check(*args, cwd=tmp_path)
    assert "FAILED saver:zoo-minimal " in out.stdout
    assert "replay: runstore check" in out.stdout and "Hypothesis profile runstore-ci" in out.stdout


def test_randomized_profile_reports_its_seed(tmp_path: Path) -> None:
    out = _check("memory://", "--profile", "runstore-dev", "-k", "roundtrip", "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout)
    assert result["profile"] == "runstore-dev" and result["derandomized"] is False
    assert result["seed"] and f"--seed {result['seed']}" in result["replay"]


def test_an_interrupted_run_is_never_passed(tmp_path: Path) -> None:
    (tmp_path / "hanging_plugin.py").write_text(HANGING_PLUGIN)
    marker = tmp_path / "hanging"
    code = "import sys\nfrom runstore.cli.main import run\nsys.argv = ['runstore', *sys.argv[1:]]\nrun()"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "check", "memory://", "hanging://", "--plugin", "hanging_plugin.py",
         "--json", "-k", "roundtrip"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        env={**os.environ, "HANG_MARKER": str(marker)},
        # Python turns SIGINT into KeyboardInterrupt only if it was not ignored at start
        # (a background job ignores it): what a user's Ctrl-C reaches.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        start_new_session=True,  # so a failure below can end the child pytest too
    )
    deadline = time.monotonic() + 300
    while not marker.exists():  # memory's test passed, hanging's now waits forever
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    try:
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, stdout + stderr
    result = json.loads(stdout)
    assert result["ok"] is False and result["status"] == "interrupted"
    for row in result["backends"].values():
        assert row["level"] == "interrupted"
        assert all(s["status"] != "passed" for s in row["suites"].values())


def test_interrupted_at_every_level_of_the_json() -> None:
    record = {"type": "result", "nodeid": "t.py::test_a[memory]", "name": "test_a", "kind": "saver",
              "backend": "memory", "suite": "savers", "outcome": "passed", "requires": ["prune"]}
    result = CheckResult(records=[record], returncode=-9, collected=5, log="", finished=False,
                         session={"backends": {"saver:memory": {"capabilities": ["prune"]}}})
    summary = result.to_json()
    assert summary["status"] == "interrupted" and summary["ok"] is False
    row = summary["backends"]["saver:memory"]
    assert row["level"] == "interrupted" and row["suites"]["savers"]["status"] == "interrupted"
    assert row["capabilities"]["proven"] == []
