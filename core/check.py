"""`runstore check`: run the conformance suite in a subprocess and summarize it as a matrix.

The parent never imports pytest: it starts ``python -m pytest --pyargs
runstore.conformance`` with a reporting plugin that writes one JSON line per test,
tails that file for live progress, and folds the lines into a backend x suite matrix.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError, RunstoreError
from .loader import normalize_plugin_spec
from .redaction import redact
from .urls import BackendURL

OUTCOMES = ("passed", "failed", "skipped", "xfailed", "xpassed")
SUITE_KINDS = ("saver", "events", "streams", "runs")


def split_backend_entry(entry: str) -> tuple[frozenset[str] | None, str]:
    """Split a suite backend entry: ``"saver,events=sqlite:///a.db"`` -> (kinds, URL).

    A bare URL means every kind its scheme serves (``None``).
    """
    head, sep, rest = entry.partition("=")
    if not sep or "://" in head:
        return None, entry
    kinds = frozenset(k.strip() for k in head.split(",") if k.strip())
    unknown = sorted(kinds - set(SUITE_KINDS))
    if unknown or not kinds:
        raise ConfigError(
            f"backend entry {redact(entry)!r}: unknown kind(s) {unknown}; accepted: "
            f"{', '.join(SUITE_KINDS)} (e.g. streams=memory://)"
        )
    return kinds, rest


@dataclass
class Cell:
    """The outcomes of one suite on one backend."""

    counts: Counter[str] = field(default_factory=Counter)
    skip_reasons: Counter[str] = field(default_factory=Counter)
    failures: list[dict[str, Any]] = field(default_factory=list)

    @property
    def status(self) -> str:
        """``failed`` if anything failed, else ``passed``, else ``skipped``."""
        if self.counts["failed"] or self.counts["xpassed"]:
            return "failed"
        if self.counts["passed"] or self.counts["xfailed"]:
            return "passed"
        return "skipped"


@dataclass
class CheckResult:
    """Everything `runstore check` learned: per-test records and the matrix they fold into."""

    records: list[dict[str, Any]]
    returncode: int
    collected: int
    log: str

    def matrix(self) -> dict[str, dict[str, Cell]]:
        """``{backend label: {suite: Cell}}``, one final outcome per test."""
        final: dict[str, dict[str, Any]] = {}
        for record in self.records:
            previous = final.get(record["nodeid"])
            if previous is None or record["outcome"] == "failed":
                final[record["nodeid"]] = record
        out: dict[str, dict[str, Cell]] = defaultdict(dict)
        for record in final.values():
            label = backend_label(record)
            cell = out[label].setdefault(record["suite"], Cell())
            cell.counts[record["outcome"]] += 1
            if record["outcome"] == "skipped" and record.get("reason"):
                cell.skip_reasons[record["reason"]] += 1
            if record["outcome"] in ("failed", "xpassed"):
                cell.failures.append(record)
        return dict(out)

    def level(self, backend: str) -> str:
        """Conformance level of one backend: ``full``, ``partial`` (capability skips) or ``failing``."""
        cells = self.matrix().get(backend, {})
        if any(c.status == "failed" for c in cells.values()):
            return "failing"
        if any(c.counts["skipped"] for c in cells.values()):
            return "partial"
        return "full" if cells else "untested"

    @property
    def ok(self) -> bool:
        """Whether the run completed without a failure."""
        return self.returncode in (0, 5) and not any(
            cell.status == "failed" for row in self.matrix().values() for cell in row.values()
        )

    def to_json(self) -> dict[str, Any]:
        """A machine-readable summary."""
        matrix = self.matrix()
        return {
            "ok": self.ok,
            "collected": self.collected,
            "pytest_exit_code": self.returncode,
            "backends": {
                backend: {
                    "level": self.level(backend),
                    "suites": {
                        suite: {
                            "status": cell.status,
                            **{k: cell.counts[k] for k in OUTCOMES},
                            "skip_reasons": dict(cell.skip_reasons),
                            "failures": [
                                {"test": f["nodeid"], "message": f.get("message")}
                                for f in cell.failures
                            ],
                        }
                        for suite, cell in sorted(rows.items())
                    },
                }
                for backend, rows in sorted(matrix.items())
            },
        }


def backend_label(record: dict[str, Any]) -> str:
    """``kind:name`` for a result record (``-`` when the test had no backend)."""
    if record.get("kind") is None:
        return "-"
    return f"{record['kind']}:{record.get('backend') or '?'}"


def run_suite(
    urls: Sequence[str],
    *,
    plugins: Sequence[str] = (),
    profile: str | None = None,
    junit_xml: str | None = None,
    keyword: str | None = None,
    extra_args: Sequence[str] = (),
    on_progress: Callable[[int, int, dict[str, Any] | None], None] | None = None,
) -> CheckResult:
    """Run the conformance suite against ``urls`` in a child pytest and collect the outcomes.

    Everything read back from the child (records, log, the JUnit report) has its
    passwords masked: the child quotes URLs in messages and tracebacks.
    """
    for entry in urls:
        # Parsing makes `redact` know each password, whatever the child writes it as.
        with contextlib.suppress(RunstoreError):
            BackendURL.parse(split_backend_entry(entry)[1])
    with tempfile.TemporaryDirectory(prefix="runstore-check-") as tmp:
        report = Path(tmp, "report.jsonl")
        report.touch()
        log_path = Path(tmp, "pytest.log")
        cmd = [
            sys.executable, "-m", "pytest", "--pyargs", "runstore.conformance",
            "-p", "runstore.conformance.report", "--runstore-report", str(report),
            "-p", "no:cacheprovider", "-q", "-rN", "--tb=short",
            # The suite is a library: do not pick up the caller's pytest config or conftests.
            "-c", os.devnull, "--rootdir", tmp,
        ]
        for url in urls:
            cmd += ["--runstore-backend", url]
        for plugin in plugins:
            # The child runs in a temporary directory: a plugin file is named absolutely.
            cmd += ["--runstore-plugin", normalize_plugin_spec(plugin, Path.cwd())]
        if profile:
            cmd += ["--hypothesis-profile", profile]
        if junit_xml:
            cmd += ["--junitxml", str(Path(junit_xml).resolve())]
        if keyword:
            cmd += ["-k", keyword]
        cmd += list(extra_args)
        records: list[dict[str, Any]] = []
        collected = 0
        with log_path.open("w") as log, report.open() as feed:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
            while True:
                finished = proc.poll() is not None
                for line in feed.readlines():
                    record = json.loads(redact(line))
                    if record["type"] == "collected":
                        collected = record["count"]
                        if on_progress:
                            on_progress(0, collected, None)
                    else:
                        records.append(record)
                        if on_progress:
                            done = len({r["nodeid"] for r in records})
                            on_progress(done, collected, record)
                if finished:
                    break
                time.sleep(0.1)
        if junit_xml and Path(junit_xml).is_file():
            junit = Path(junit_xml)
            junit.write_text(redact(junit.read_text(encoding="utf-8")), encoding="utf-8")
        return CheckResult(
            records=records,
            returncode=proc.returncode,
            collected=collected,
            log=redact(log_path.read_text(errors="replace")),
        )
