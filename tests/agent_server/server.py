"""A real ``langgraph dev`` server in a subprocess, for the Agent Server tests and bench.

`AgentServer` writes a project directory (the test graph, ``langgraph.json`` with or
without runstore's checkpointer and store factories), starts ``langgraph dev --no-browser
--no-reload`` on a free port, waits for ``/ok`` and stops it with SIGINT (the dev
runtime then flushes its own thread and run records to disk, so a restart keeps them).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).parent
LANGGRAPH = Path(sys.executable).parent / "langgraph"
#: Bound on a server's start (import, runtime, checkpointer) and on its stop.
START_TIMEOUT = 90.0
STOP_TIMEOUT = 20.0


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class AgentServer:
    """One ``langgraph dev`` project and the server process serving it."""

    def __init__(self, directory: Path, *, runstore: bool, env: dict[str, str] | None = None) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        shutil.copy(HERE / "graph_app.py", directory / "graph_app.py")
        config: dict[str, object] = {"dependencies": ["."], "graphs": {"agent": "./graph_app.py:graph"}}
        if runstore:
            config["checkpointer"] = {"path": "runstore.agent_server.checkpointer"}
            config["store"] = {"path": "runstore.agent_server.store"}
        (directory / "langgraph.json").write_text(json.dumps(config))
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("RUNSTORE_")},
            "LANGSMITH_TRACING": "false",
            "LANGGRAPH_CLI_NO_ANALYTICS": "1",
            **(env or {}),
        }
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.starts: list[float] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.directory / "server.log"

    def start(self) -> float:
        """Start the server and wait until it answers; the seconds that took."""
        began = time.monotonic()
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [str(LANGGRAPH), "dev", "--no-browser", "--no-reload", "--port", str(self.port)],
                cwd=self.directory, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            )
        while time.monotonic() - began < START_TIMEOUT:
            if self.process.poll() is not None:
                raise RuntimeError(f"langgraph dev exited ({self.process.returncode}):\n{self.tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/ok", timeout=2) as answer:
                    if answer.status == 200:
                        self.starts.append(time.monotonic() - began)
                        return self.starts[-1]
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"langgraph dev did not answer within {START_TIMEOUT}s:\n{self.tail()}")

    def stop(self) -> None:
        """Stop the server gracefully (SIGINT), killing it after `STOP_TIMEOUT`."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGINT)
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_TIMEOUT)

    def restart(self) -> float:
        """Stop and start again on the same files; the start's seconds."""
        self.stop()
        return self.start()

    def tail(self, lines: int = 60) -> str:
        """The end of the server's log."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"
