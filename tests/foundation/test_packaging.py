"""The built wheel, installed into a fresh virtualenv, imports every package from anywhere."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .conftest import FreshEnv

PACKAGES = [
    "runstore", "runstore.checkpoint", "runstore.sql", "runstore.bench", "runstore.plugins",
    "runstore.plugins.memory", "runstore.plugins.jsonl", "runstore.plugins.sqlite",
    "runstore.plugins.postgres", "runstore.plugins.redis", "runstore.conformance",
    "runstore.conformance.plugin",
]


def test_wheel_installs_and_imports_from_anywhere(fresh_env: FreshEnv, tmp_path: Path) -> None:
    code = (
        "import importlib, runstore\n"
        "from runstore.loader import get_backends\n"
        f"for name in {PACKAGES!r}: importlib.import_module(name)\n"
        "print(runstore.__file__)\n"
        "print(sorted(s.name for s in get_backends().events))\n"
    )
    run_dir = tmp_path / "elsewhere"
    run_dir.mkdir()
    out = fresh_env.run("-c", code, cwd=run_dir)
    assert out.returncode == 0, out.stderr
    location, backends = out.stdout.splitlines()
    assert location.startswith(str(fresh_env.purelib)), f"runstore imported from {location}, not the wheel"
    assert backends == "['jsonl', 'memory', 'postgres', 'sqlite']"


def test_editable_install_imports_from_anywhere(tmp_path: Path) -> None:
    code = "import importlib\n" + "".join(f"importlib.import_module({p!r})\n" for p in PACKAGES)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
