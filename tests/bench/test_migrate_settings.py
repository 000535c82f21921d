"""`bench migrate --set KEY=VALUE` reaches both sides of every case (the runstore engine,
the naive loop, the checks around them), as the other benches apply it to every runstore
backend. A real sqlite source and the PostgreSQL server (a fresh schema per case)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from runstore.bench import migrate as bench_migrate
from runstore.options import BackendOptions
from runstore.settings import Settings
from runstore.urls import BackendURL

from ..conftest import POSTGRES_URL


@pytest.mark.parametrize("method", ["runstore", "naive"])
async def test_set_values_open_both_sides_of_a_migrate_case(method: str, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    source = tmp_path / "source.db"
    total = await bench_migrate.populate(source, 2, 1, 0)
    seen: list[dict[str, Any]] = []
    scope = BackendOptions.scope

    @contextlib.asynccontextmanager
    async def spy(settings: Settings | None = None) -> AsyncIterator[BackendOptions]:
        assert settings is not None
        seen.append(settings.section_values("sqlite"))
        async with scope(settings) as options:
            yield options

    monkeypatch.setattr(BackendOptions, "scope", spy)
    case = {"postgres_url": POSTGRES_URL, "case_index": 0, "work_dir": str(tmp_path / "case"), "method": method,
            "source_url": BackendURL.for_file("sqlite", source).render(), "source_checkpoints": total, "threads": 2,
            "settings": {"sqlite": {"busy_timeout_ms": 4321}}}  # fmt: skip
    row = await bench_migrate.run_migrate_case(case)
    assert row.get("status", "ok") == "ok" and row["dest_checkpoints"] == total
    # Every open: both sides before the clock, the copy's two, the destination count after.
    assert len(seen) >= 5 and all(values["busy_timeout_ms"] == 4321 for values in seen)
