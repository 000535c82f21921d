"""The built wheel, installed into a fresh virtualenv, imports every package from anywhere."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = [
    "runstore", "runstore.checkpoint", "runstore.sql", "runstore.bench", "runstore.plugins",
    "runstore.plugins.memory", "runstore.plugins.jsonl", "runstore.plugins.sqlite",
    "runstore.plugins.postgres", "runstore.plugins.redis", "runstore.conformance",
    "runstore.conformance.plugin",
]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(ROOT)],
        check=True, capture_output=True, text=True,
    )
    (wheel,) = out.glob("runstore-*.whl")
    return wheel


def test_wheel_installs_and_imports_from_anywhere(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    target = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    # Dependencies come from our environment through a path entry (not a site dir, so the
    # editable finder of the development install stays out); runstore itself from the wheel.
    Path(target, "zz_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
         "--target", target, str(wheel)],
        check=True, capture_output=True, text=True,
    )
    code = (
        "import importlib, runstore\n"
        f"for name in {PACKAGES!r}: importlib.import_module(name)\n"
        "print(runstore.__file__)\n"
        "print(sorted(s.name for s in runstore.get_backends().events))\n"
    )
    run_dir = tmp_path / "elsewhere"
    run_dir.mkdir()
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, cwd=run_dir)
    assert out.returncode == 0, out.stderr
    location, backends = out.stdout.splitlines()
    assert location.startswith(target), f"runstore imported from {location}, not the wheel"
    assert backends == "['jsonl', 'memory', 'postgres', 'sqlite']"


def test_editable_install_imports_from_anywhere(tmp_path: Path) -> None:
    code = "import importlib\n" + "".join(f"importlib.import_module({p!r})\n" for p in PACKAGES)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
