"""Shared pieces of the benchmark harness: the JSONL schema, run metadata, statistics."""

from __future__ import annotations

import gc
import hashlib
import importlib.metadata
import os
import platform
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import orjson

#: Bumped when a row's meaning changes; readers refuse rows from a newer major version.
SCHEMA_VERSION = 1

#: Starts the one stdout line on which a case's child process reports its result
#: (`runstore.bench.worker` writes it, `runstore.bench.runner` reads it).
RESULT_PREFIX = "RUNSTORE-BENCH-RESULT "

#: Distributions whose versions go into every run record.
TRACKED_DISTRIBUTIONS = (
    "runstore",
    "langgraph",
    "langgraph-checkpoint",
    "langgraph-checkpoint-sqlite",
    "langgraph-checkpoint-postgres",
    "langchain-core",
    "aiosqlite",
    "asyncpg",
    "psycopg",
    "redis",
    "hiredis",
    "sqlalchemy",
    "orjson",
)


class BenchSchemaError(ValueError):
    """A JSONL file is not benchmark output this version of runstore can read."""


def git_sha(cwd: str | os.PathLike[str] | None = None) -> str | None:
    """The commit the benchmarked code came from, or ``None`` outside a git checkout."""
    where = Path(cwd) if cwd else Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    sha = out.stdout.strip()
    if out.returncode != 0 or not sha:
        return None
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=5,
        check=False,
    )
    return sha + ("-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")


def library_versions() -> dict[str, str | None]:
    """Installed versions of the libraries whose speed the numbers depend on."""
    versions: dict[str, str | None] = {}
    for dist in TRACKED_DISTRIBUTIONS:
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return versions


def platform_info() -> dict[str, Any]:
    """Where the numbers were measured."""
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "system": platform.system(),
        "release": platform.release(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "hostname": platform.node(),
    }


def run_record(bench: str, argv: Sequence[str], params: Mapping[str, Any]) -> dict[str, Any]:
    """The first line of every output file: what ran, where, with which libraries."""
    return {
        "schema_version": SCHEMA_VERSION,
        "record": "run",
        "run_id": uuid.uuid4().hex,
        "bench": bench,
        "started_at": datetime.now(UTC).isoformat(),
        "git_sha": git_sha(),
        "versions": library_versions(),
        "platform": platform_info(),
        "argv": list(argv),
        "params": dict(params),
    }


class JsonlWriter:
    """Appends records to a JSONL file, flushing each line so a killed run keeps its rows."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: TextIO = self.path.open("a", encoding="utf-8")

    def write(self, record: Mapping[str, Any]) -> None:
        """Write one record as one line, passwords masked (rows quote URLs, argv, errors)."""
        from runstore.redaction import redact

        self._fh.write(redact(dumps(record)) + "\n")
        self._fh.flush()

    def close(self) -> None:
        """Close the file."""
        self._fh.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def dumps(record: Mapping[str, Any]) -> str:
    """One record as compact JSON (non-JSON values such as paths become strings)."""
    return orjson.dumps(record, default=str, option=orjson.OPT_NON_STR_KEYS).decode()


@dataclass
class BenchFile:
    """The records of one benchmark output file."""

    path: str
    runs: list[dict[str, Any]] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)


def read_jsonl(path: str | os.PathLike[str]) -> BenchFile:
    """Read one output file, checking every record's ``schema_version``."""
    result = BenchFile(path=str(path))
    with Path(path).open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise BenchSchemaError(f"{path}:{lineno}: not JSON ({exc})") from None
            if not isinstance(record, dict):
                raise BenchSchemaError(f"{path}:{lineno}: a record must be a JSON object")
            version = record.get("schema_version")
            if not isinstance(version, int):
                raise BenchSchemaError(f"{path}:{lineno}: record has no integer schema_version")
            if version > SCHEMA_VERSION:
                raise BenchSchemaError(
                    f"{path}:{lineno}: schema_version {version} is newer than this "
                    f"runstore reads ({SCHEMA_VERSION}); upgrade runstore"
                )
            kind = record.get("record")
            if kind == "run":
                result.runs.append(record)
            elif kind == "row":
                result.rows.append(record)
            else:
                raise BenchSchemaError(f"{path}:{lineno}: unknown record type {kind!r}")
    return result


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) by linear interpolation; ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def median(values: Iterable[float | None]) -> float | None:
    """Median of the non-``None`` values, or ``None``."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def latency_summary(seconds: Sequence[float], prefix: str) -> dict[str, float | None]:
    """p50/p95/p99/mean of a list of durations, in milliseconds, keys prefixed."""
    ms = [s * 1000.0 for s in seconds]
    return {
        f"{prefix}_p50_ms": percentile(ms, 50),
        f"{prefix}_p95_ms": percentile(ms, 95),
        f"{prefix}_p99_ms": percentile(ms, 99),
        f"{prefix}_mean_ms": (sum(ms) / len(ms)) if ms else None,
    }


def canonical_digest(items: Iterable[Any]) -> str:
    """A stable sha256 over JSON-able items (order matters, key order does not)."""
    h = hashlib.sha256()
    for item in items:
        h.update(orjson.dumps(item, option=orjson.OPT_SORT_KEYS))
        h.update(b"\n")
    return h.hexdigest()


def peak_rss_bytes() -> int | None:
    """Peak resident set size of this process so far (Linux/macOS), or ``None``."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return int(peak if sys.platform == "darwin" else peak * 1024)


class Stopwatch:
    """Accumulates elapsed time and a call count across many short sections."""

    __slots__ = ("calls", "seconds")

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0

    def add(self, started: float) -> None:
        """Record one section that began at ``started`` (a `time.perf_counter` value)."""
        self.seconds += time.perf_counter() - started
        self.calls += 1

    def reset(self) -> None:
        """Forget everything recorded."""
        self.seconds = 0.0
        self.calls = 0


class GcTimer:
    """Time spent in the cyclic garbage collector while active, per generation.

    Installed as a `gc.callbacks` entry by ``with GcTimer() as t:``. Collections are
    part of what a saver costs (a driver stack that keeps many objects alive makes
    every full collection longer), so the harness reports them instead of hiding them.
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self._started = 0.0

    def _callback(self, phase: str, info: Mapping[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started
            self.collections[int(info["generation"])] += 1

    def __enter__(self) -> GcTimer:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


