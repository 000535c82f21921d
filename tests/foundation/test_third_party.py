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
import dataclasses

from runstore.hookspecs import hookimpl
import runstore
from runstore.plugins.memory.events import MemoryEventStore
from runstore.settings import bounds


@dataclasses.dataclass(frozen=True)
class AcmeSettings:
    region: str = "eu"
    retries: int = dataclasses.field(default=3, metadata=bounds(0, 10))


@hookimpl
def runstore_register_event_stores(registry):
    registry.add("acme", schemes=["acme"], factory=_open_acme, capabilities=["durable"],
                 description="acme events")


@hookimpl
def runstore_register_settings(registry):
    registry.add("acme", AcmeSettings, description="where acme lives")


async def _open_acme(url, options):
    store = await MemoryEventStore.open(url, options)
    store.acme_url = str(url)
    store.acme_settings = options.settings.section(AcmeSettings)
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
    listed = json.loads(out.stdout)
    rows = {(r["kind"], r["name"]): r for r in listed["backends"]}
    acme = rows[("events", "acme")]
    assert acme["distribution"] == "acme-runstore" and acme["version"] == "1.2.3"
    assert acme["schemes"] == ["acme"] and acme["capabilities"] == ["durable"]
    (section,) = [s for s in listed["settings"] if s["section"] == "acme"]
    assert section["distribution"] == "acme-runstore" and section["description"] == "where acme lives"
    assert section["keys"] == [
        {"key": "region", "default": "eu", "accepts": "a string"},
        {"key": "retries", "default": 3, "accepts": "an integer from 0 to 10"},
    ]


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


SETTINGS_PROBE = textwrap.dedent(
    """
    import asyncio, sys, runstore
    async def main():
        config = sys.argv[1] if len(sys.argv) > 1 else None
        try:
            async with runstore.open(config, events="acme://x", streams="memory://",
                                     checkpointer="memory://") as stores:
                print(stores.events.acme_settings)
        except runstore.ConfigError as exc:
            print("ConfigError:", exc)
    asyncio.run(main())
    """
)


def test_third_party_settings_section_from_env_and_yaml(site: Path, tmp_path: Path) -> None:
    def probe(*args: str, **env: str) -> str:
        out = subprocess.run(
            [sys.executable, "-c", SETTINGS_PROBE, *args], capture_output=True, text=True,
            env=_env(site, **env), cwd=tmp_path,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    assert probe() == "AcmeSettings(region='eu', retries=3)"
    assert probe(RUNSTORE_ACME__RETRIES="7") == "AcmeSettings(region='eu', retries=7)"
    (tmp_path / "acme.yaml").write_text("acme:\n  region: us\n")
    assert probe(str(tmp_path / "acme.yaml"), RUNSTORE_ACME__RETRIES="1") == (
        "AcmeSettings(region='us', retries=1)"
    )
    assert probe(RUNSTORE_ACME__RETRYS="1") == (
        "ConfigError: unknown config key 'acme.retrys' in section 'acme'; accepted: region, retries"
    )
    assert probe(RUNSTORE_ACME__RETRIES="11") == (
        "ConfigError: config key 'acme.retries' must be an integer from 0 to 10; got '11'"
    )


def test_third_party_plugin_can_be_disabled(site: Path, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "runstore.cli", "backends", "--json"],
        capture_output=True, text=True, env=_env(site, RUNSTORE_DISABLE_PLUGINS="acme"),
        cwd=tmp_path, check=True,
    )
    listed = json.loads(out.stdout)
    assert "acme" not in {r["name"] for r in listed["backends"]}
    assert "acme" not in {s["section"] for s in listed["settings"]}
