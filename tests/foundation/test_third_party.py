"""A third-party plugin, installed only as a dist-info with an entry point, is found and selectable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PLUGIN = '''
import runstore
from runstore.plugins.memory import _open_events


@runstore.hookimpl
def runstore_register_event_stores(registry):
    registry.add("acme", schemes=["acme"], factory=_open_acme, capabilities=["durable"],
                 description="acme events")


async def _open_acme(url, options):
    store = await _open_events(url, options)
    store.acme_url = str(url)
    return store
'''


@pytest.fixture
def site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    (site / "acme_runstore-1.2.3.dist-info").mkdir(parents=True)
    (site / "acme_runstore-1.2.3.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: acme-runstore\nVersion: 1.2.3\n"
    )
    (site / "acme_runstore-1.2.3.dist-info" / "entry_points.txt").write_text(
        "[runstore]\nacme = acme_runstore_plugin\n"
    )
    (site / "acme_runstore_plugin.py").write_text(textwrap.dedent(PLUGIN))
    return site


def _env(site: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(site)
    env.update(extra)
    return env


def test_backends_lists_third_party_plugin(site: Path, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "runstore.cli", "backends", "--json"],
        capture_output=True, text=True, env=_env(site), cwd=tmp_path, check=True,
    )
    rows = {(r["kind"], r["name"]): r for r in json.loads(out.stdout)}
    acme = rows[("events", "acme")]
    assert acme["distribution"] == "acme-runstore" and acme["version"] == "1.2.3"
    assert acme["schemes"] == ["acme"] and acme["capabilities"] == ["durable"]


def test_third_party_backend_selectable_by_url(site: Path, tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        import asyncio, runstore
        async def main():
            async with runstore.open(checkpointer="memory://", events="acme://somewhere", streams="memory://") as stores:
                print(type(stores.events).__name__, stores.events.acme_url)
        asyncio.run(main())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_env(site), cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["MemoryEventStore", "acme://somewhere"]


def test_third_party_plugin_can_be_disabled(site: Path, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "runstore.cli", "backends", "--json"],
        capture_output=True, text=True, env=_env(site, RUNSTORE_DISABLE_PLUGINS="acme"),
        cwd=tmp_path, check=True,
    )
    assert "acme" not in {r["name"] for r in json.loads(out.stdout)}
