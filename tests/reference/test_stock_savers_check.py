"""``runstore check`` on savers we did not write, each registered as a plugin declaring
what it implements: LangGraph's stock InMemorySaver, AsyncSqliteSaver and
AsyncPostgresSaver, and a saver declaring no optional capability.

Each must pass: a test of a capability group a saver never declared is skipped, whatever
other ``requires`` markers the test carries (a test's own ``requires("cross_process")``
once hid its module's ``requires("fencing")``, so the suite failed AsyncSqliteSaver on
fencing it never claimed). A failure that is a stock saver's own bug would be declared in
``XFAIL`` with its reason; there is none today. The saver state machines are left out
to keep this fast: the default conformance run (tests/conformance/) runs them on the
same savers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import POSTGRES_URL

HERE = Path(__file__).parent
PLUGINS = [HERE / "langgraph_memory.py", HERE / "langgraph_sql.py", HERE / "minimal_saver.py"]
#: Stock-saver bugs the suite finds, as ``[tool.runstore.conformance] xfail`` entries
#: (test pattern -> reason). Each would be a strict xfail: it must keep failing.
XFAIL: dict[str, str] = {}
SAVERS = {
    "saver:langgraph-memory": ("langgraph-memory://", {"delta_history", "sync_api"}),
    "saver:langgraph-sqlite": ("langgraph-sqlite://", {"delta_history", "sync_api", "durable", "cross_process"}),
    "saver:langgraph-postgresql": ("langgraph-" + POSTGRES_URL,
                                   {"delta_history", "sync_api", "durable", "cross_process"}),
    "saver:minimal": ("minimal://", set()),
}


@pytest.mark.postgres
def test_stock_savers_pass_what_they_declare(tmp_path: Path) -> None:
    lines = ["[tool.runstore.conformance]", f"plugins = {json.dumps([str(p) for p in PLUGINS])}", "[tool.runstore.conformance.xfail]"]
    lines += [f"{json.dumps(pattern)} = {json.dumps(reason)}" for pattern, reason in XFAIL.items()]
    (tmp_path / "pyproject.toml").write_text("\n".join(lines) + "\n")
    out = subprocess.run(
        [sys.executable, "-m", "runstore", "check", "--json", "-k", "not state_machine",
         *(f"saver={url}" for url, _ in SAVERS.values())],
        capture_output=True, text=True, cwd=tmp_path, timeout=1200,
    )
    assert out.stdout, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert report["status"] == "passed" and out.returncode == 0, json.dumps(report, indent=1)[:6000]
    for name, (_, declared) in SAVERS.items():
        backend = report["backends"][name]
        assert backend["failed"] == 0 and backend["run"] > 0, (name, backend)
        assert set(backend["capabilities"]["proven"]) == declared, (name, backend["capabilities"])
        undeclared = [reason for reason in backend["skip_reasons"] if "does not declare capability" not in reason]
        assert not undeclared, (name, undeclared)
    minimal = report["backends"]["saver:minimal"]["suites"]
    assert minimal["fencing"]["run"] == minimal["retention"]["run"] == minimal["threads"]["run"] == 0
