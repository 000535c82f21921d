"""Fixtures for installing runstore (and plugin projects) into fresh virtualenvs."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import sysconfig
import venv
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def runstore_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """runstore built as a wheel from this checkout, once per test run."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # xdist workers share their run's temp root: the first builds, the others wait
        # (two builds at once would share the checkout's build/ directory).
        out = tmp_path_factory.getbasetemp().parent / "dist"
    else:
        out = tmp_path_factory.mktemp("dist")
    out.mkdir(exist_ok=True)
    with (out / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not list(out.glob("runstore-*.whl")):
            subprocess.run(
                [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(ROOT)],
                check=True, capture_output=True, text=True,
            )
    (wheel,) = out.glob("runstore-*.whl")
    return wheel


@dataclass
class FreshEnv:
    """A new virtualenv whose dependencies come from ours but holds its own runstore."""

    python: Path
    purelib: Path

    def install(self, *targets: str | Path) -> None:
        """Install wheels or project directories into this environment, without dependencies."""
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
             "--no-build-isolation", "--upgrade", "--target", str(self.purelib),
             *map(str, targets)],
            check=True, capture_output=True, text=True,
        )

    def run(self, *args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """Run this environment's python with ``args``."""
        return subprocess.run(
            [str(self.python), *args], capture_output=True, text=True, cwd=cwd, timeout=timeout
        )


@pytest.fixture
def fresh_env(tmp_path: Path, runstore_wheel: Path) -> FreshEnv:
    """A fresh virtualenv with the runstore wheel installed."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    purelib = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    )
    # A path entry, not a site dir: our dependencies become importable, while the
    # editable finder of the development install stays out.
    (purelib / "zz_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = FreshEnv(python=python, purelib=purelib)
    env.install(runstore_wheel)
    return env
