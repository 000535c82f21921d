"""``runstore check`` on LangGraph's stock long-term memory stores, each registered as a plugin
declaring what it implements (tests/reference/langgraph_stores.py): InMemoryStore,
AsyncSqliteStore and AsyncPostgresStore, beside runstore's memory store.

Each must pass: the rules a stock store does not keep are capabilities it does not
declare, so their tests skip (docs/store.md lists them). A stock store's own bug under a
rule it does keep would be declared in ``XFAIL`` with its reason; there is none today.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import POSTGRES_URL
from .langgraph_stores import MEMORY, POSTGRES, SQLITE

HERE = Path(__file__).parent
PLUGIN = HERE / "langgraph_stores.py"
XFAIL: dict[str, str] = {}
STORES = {
    "store:langgraph-store-memory": ("langgraph-store-memory://", set(MEMORY)),
    "store:langgraph-store-sqlite": ("langgraph-store-sqlite://", set(SQLITE)),
    "store:langgraph-store-postgresql": ("langgraph-store-" + POSTGRES_URL, set(POSTGRES)),
}


@pytest.mark.postgres
def test_stock_stores_pass_what_they_declare(tmp_path: Path) -> None:
    lines = ["[tool.runstore.conformance]", f"plugins = {json.dumps([str(PLUGIN)])}",
             "[tool.runstore.conformance.xfail]"]
    lines += [f"{json.dumps(pattern)} = {json.dumps(reason)}" for pattern, reason in XFAIL.items()]
    (tmp_path / "pyproject.toml").write_text("\n".join(lines) + "\n")
    out = subprocess.run(
        [sys.executable, "-m", "runstore", "check", "--json", "-k", "test_store",
         *(f"store={url}" for url, _ in STORES.values())],
        capture_output=True, text=True, cwd=tmp_path, timeout=1200,
    )
    assert out.stdout, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["status"] == "passed" and out.returncode == 0, json.dumps(report, indent=1)[:6000]
    for name, (_, declared) in STORES.items():
        backend = report["backends"][name]
        assert backend["failed"] == 0 and backend["run"] > 0, (name, backend)
        assert set(backend["capabilities"]["proven"]) == declared, (name, backend["capabilities"])
        undeclared = [reason for reason in backend["skip_reasons"] if "does not declare capability" not in reason]
        assert not undeclared, (name, undeclared)
