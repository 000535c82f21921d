"""The Agent Server's prune path on runstore's factory: its gRPC ``Checkpointer.Prune``
(what a deployment's core engine calls) sends ``keep_latest`` and ``delete_all`` through
the server's own adapter to ``aprune``, which must do what they say.

``langgraph dev``'s in-memory runtime deletes pruned threads itself and never calls
``aprune``, so a child process loads the checkpointer as the server does (from
``LANGGRAPH_CHECKPOINTER``) and drives the server's servicer directly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("langgraph_api", reason="the agent-server extra is not installed")

ROOT = Path(__file__).parents[2]
#: What ``langgraph dev`` puts in the server's environment for the in-memory runtime.
DEV_ENV = {
    "MIGRATIONS_PATH": "__inmem",
    "DATABASE_URI": ":memory:",
    "REDIS_URI": "fake",
    "LANGGRAPH_RUNTIME_EDITION": "inmem",
    "LANGSMITH_LANGGRAPH_API_VARIANT": "local_dev",
    "LANGGRAPH_CHECKPOINTER": json.dumps({"path": "runstore.agent_server.checkpointer"}),
}


@pytest.mark.parametrize("mode", ["full", "delta"])
def test_server_prune_reaches_runstore(tmp_path: Path, mode: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNSTORE_")}
    env.update(DEV_ENV)
    env["RUNSTORE_CHECKPOINTER_URL"] = f"sqlite:///{tmp_path}/checkpoints.db"
    env["RUNSTORE_CHECKPOINT_CHANNEL_MODE"] = mode
    done = subprocess.run(
        [sys.executable, "-m", "tests.agent_server.prune_child"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["KEEP_LATEST"] == {"kept": 1, "doomed": 3}, got
    assert got["DELETE_ALL"] == {"kept": 1, "doomed": 0}, (
        f"the server's delete_all prune did not reach runstore: {got['DELETE_ALL']}"
    )
