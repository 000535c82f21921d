"""`runstore new-plugin` writes a project that installs next to runstore and runs the suite:
it fails cleanly while the skeleton is empty and passes once the methods are filled in."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from runstore.errors import ConfigError
from runstore.scaffold import new_plugin

from .conftest import FreshEnv

FILLED = '''
"""A memory-backed implementation: every method comes from runstore's memory store."""

from runstore.plugins.memory.events import MemoryEventStore


class AcmeEventStore(MemoryEventStore):
    """The skeleton, filled in by delegating to the in-process store."""
'''

def _suite(env: FreshEnv, project: Path) -> subprocess.CompletedProcess[str]:
    return env.run(
        "-m", "pytest", "-p", "no:cacheprovider", "-q",
        "--hypothesis-profile", "runstore-ci", cwd=project, timeout=900,
    )


def test_scaffold_rejects_bad_names(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="lowercase identifier"):
        new_plugin("Bad-Name", tmp_path)
    with pytest.raises(ConfigError, match="unknown kind"):
        new_plugin("ok", tmp_path, kind="teleport")


def test_template_fails_cleanly_then_passes_when_filled(fresh_env: FreshEnv, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "runstore.cli", "new-plugin", "acme", "--directory", str(tmp_path)],
        capture_output=True, text=True, check=True,
    )
    project = tmp_path / "runstore-acme"
    assert "created" in out.stdout and (project / "pyproject.toml").is_file()
    fresh_env.install(project)

    listed = fresh_env.run("-m", "runstore.cli", "backends", "--json", cwd=tmp_path)
    acme = [r for r in json.loads(listed.stdout)["backends"] if r["name"] == "acme"]
    assert acme and acme[0]["distribution"] == "runstore-acme" and acme[0]["schemes"] == ["acme"]

    empty = _suite(fresh_env, project)
    assert empty.returncode == 1, empty.stdout[-3000:] + empty.stderr[-3000:]
    assert "NotImplementedError" in empty.stdout
    assert "INTERNALERROR" not in empty.stdout + empty.stderr
    assert " error" not in empty.stdout.splitlines()[-1], empty.stdout.splitlines()[-1]

    (project / "runstore_acme" / "events.py").write_text(FILLED)
    fresh_env.install(project)
    filled = _suite(fresh_env, project)
    assert filled.returncode == 0, filled.stdout[-5000:] + filled.stderr[-3000:]
    assert " passed" in filled.stdout.splitlines()[-1]
