"""Running benchmark cases in child processes, with timeouts and progress."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from runstore.bench.common import RESULT_PREFIX, SCHEMA_VERSION, JsonlWriter, run_record
from runstore.bench.matrix import PEER_PREFIX, CheckpointCase, CheckpointPlan, check_cell_digests

#: Row statuses that mean "the code under test is wrong" (exit code 1).
CORRECTNESS_FAILURES = frozenset({"digest_mismatch", "failed"})
#: Row statuses that mean "the case did not finish" (exit code 3).
INCOMPLETE = frozenset({"error", "timeout"})


def default_postgres_url() -> str:
    """The PostgreSQL server for ``langgraph:postgres`` when ``--postgres-url`` is not given."""
    return os.environ.get(
        "RUNSTORE_BENCH_POSTGRES_URL",
        os.environ.get("RUNSTORE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"),
    )


def default_redis_url() -> str:
    """The Redis server for raw redis-py references when none is named."""
    return os.environ.get(
        "RUNSTORE_BENCH_REDIS_URL",
        os.environ.get("RUNSTORE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"),
    )


def display_backend(raw: str) -> str:
    """The label of a backend in rows and on screen: the URL with its password masked."""
    if raw.startswith(PEER_PREFIX) or raw.startswith("raw:"):
        return raw
    from runstore.redaction import redact
    from runstore.urls import BackendURL

    url, sep, suffix = raw.partition("|")
    try:
        return str(BackendURL.parse(url)) + sep + suffix
    except Exception:
        return redact(raw)


def backend_name(raw: str) -> str:
    """The registered backend name behind ``raw`` (``sqlite`` for both ``sqlite://`` and the peer)."""
    raw = raw.partition("|")[0]
    if raw.startswith(PEER_PREFIX):
        return raw[len(PEER_PREFIX) :]
    if raw.startswith("raw:"):
        return raw
    from runstore.loader import get_backends

    try:
        return get_backends().savers.for_url(raw).name
    except Exception:
        from runstore.urls import BackendURL

        return BackendURL.parse(raw).scheme


def run_child(
    case: Mapping[str, Any], timeout: float | None, *, python: str | None = None
) -> dict[str, Any]:
    """Run one case in a fresh ``python -m runstore.bench.worker`` and return its result."""
    cmd = [python or sys.executable, "-m", "runstore.bench.worker"]
    env = dict(os.environ)
    env.setdefault("PYTHONHASHSEED", "0")
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(orjson.dumps(dict(case), default=str), timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        proc.communicate()
        return {"status": "timeout", "error": f"case exceeded --timeout-seconds {timeout:g}"}
    except BaseException:
        # Ctrl-C reaches only our process group; the child has its own session.
        _kill(proc)
        proc.wait()
        raise
    for line in reversed(out.decode("utf-8", "replace").splitlines()):
        if line.startswith(RESULT_PREFIX):
            result: dict[str, Any] = orjson.loads(line[len(RESULT_PREFIX) :])
            return result
    tail = err.decode("utf-8", "replace").strip().splitlines()[-12:]
    return {
        "status": "error",
        "error": f"worker exited with code {proc.returncode} without a result",
        "traceback": "\n".join(tail),
    }


def _kill(proc: subprocess.Popen[bytes]) -> None:
    # The child runs in its own session: take down anything it started with it.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


@dataclass
class RunOptions:
    """How cases run: timeout, profiling, scratch space, services, settings."""

    timeout_seconds: float | None = 600.0
    profile_dir: Path | None = None
    work_dir: Path | None = None
    keep_files: bool = False
    postgres_url: str | None = None
    redis_url: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    #: checkpoint: also time fenced against unfenced turns on runstore savers.
    fenced: bool = False

    def __repr__(self) -> str:
        from runstore.redaction import masked_repr

        return masked_repr(self)


class Reporter:
    """Progress callbacks; the CLI plugs rich in, tests use this silent default."""

    def start(self, total: int) -> None:
        """``total`` cases are about to run."""

    def case_started(self, label: str) -> None:
        """A case began."""

    def case_finished(self, label: str, row: Mapping[str, Any]) -> None:
        """A case ended with ``row``."""

    def warn(self, message: str) -> None:
        """Something the user should know (skipped cells, failures)."""

    def stop(self) -> None:
        """Every case ran."""


@dataclass
class Outcome:
    """What a benchmark run produced."""

    output: Path
    rows: list[dict[str, Any]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """0 ok, 1 a correctness check failed, 3 a case errored or timed out."""
        statuses = {r.get("status") for r in self.rows}
        if statuses & CORRECTNESS_FAILURES:
            return 1
        if statuses & INCOMPLETE:
            return 3
        return 0


def _case_label(case: Mapping[str, Any]) -> str:
    return str(case.get("case_id"))


class CaseRunner:
    """Runs case dicts in child processes and turns results into JSONL rows."""

    def __init__(
        self,
        bench: str,
        output: Path,
        options: RunOptions,
        *,
        argv: Sequence[str] = (),
        params: Mapping[str, Any] | None = None,
        reporter: Reporter | None = None,
        child: Callable[[Mapping[str, Any], float | None], dict[str, Any]] = run_child,
    ) -> None:
        self.bench = bench
        self.options = options
        self.reporter = reporter or Reporter()
        self.child = child
        self.outcome = Outcome(output=output)
        self.run = run_record(bench, argv, params or {})
        self._writer = JsonlWriter(output)
        self._writer.write(self.run)
        self._own_work_dir = options.work_dir is None
        self.work_root = Path(options.work_dir or tempfile.mkdtemp(prefix="runstore-bench-"))
        self.work_root.mkdir(parents=True, exist_ok=True)
        self._index = 0

    def row(self, params: Mapping[str, Any], result: Mapping[str, Any]) -> dict[str, Any]:
        """A JSONL row: the envelope, the case parameters, then the result."""
        row: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "record": "row",
            "run_id": self.run["run_id"],
            "bench": self.bench,
        }
        row.update(params)
        row.update(result)
        return row

    def execute(self, params: Mapping[str, Any], secrets: Mapping[str, Any]) -> dict[str, Any]:
        """Run one case: ``params`` go into the row, ``secrets`` (real URLs) only to the child."""
        self._index += 1
        label = _case_label(params)
        case_dir = self.work_root / f"case-{self._index:04d}"
        case: dict[str, Any] = {
            **params,
            **secrets,
            "bench": self.bench,
            "case_index": self._index,
            "work_dir": str(case_dir),
            "postgres_url": self.options.postgres_url,
            "redis_url": self.options.redis_url,
            "settings": self.options.settings,
            # A case that says whether it is fenced (a load case) keeps its own word.
            "fenced": params.get("fenced", self.options.fenced),
        }
        profiled = self.options.profile_dir is not None
        if profiled:
            assert self.options.profile_dir is not None
            safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in label)
            case["profile_path"] = str(self.options.profile_dir / f"{self._index:04d}-{safe}.prof")
        self.reporter.case_started(label)
        try:
            result = self.child(case, self.options.timeout_seconds)
        finally:
            if not self.options.keep_files:
                shutil.rmtree(case_dir, ignore_errors=True)
        result = dict(result)
        result["profiled"] = profiled
        if profiled:
            result["profile_path"] = case["profile_path"]
        row = self.row(params, result)
        self.reporter.case_finished(label, row)
        return row

    def emit(self, rows: Iterable[dict[str, Any]]) -> None:
        """Write finished rows (after cross-row checks changed their status)."""
        for row in rows:
            self._writer.write(row)
            self.outcome.rows.append(row)

    def close(self) -> Outcome:
        """Close the output file and remove the scratch directory."""
        self._writer.close()
        if self._own_work_dir and not self.options.keep_files:
            shutil.rmtree(self.work_root, ignore_errors=True)
        self.reporter.stop()
        return self.outcome


def run_checkpoint_plan(
    plan: CheckpointPlan,
    *,
    backend_urls: Mapping[str, str],
    cache_urls: Mapping[str, str] | None = None,
    output: Path,
    options: RunOptions,
    argv: Sequence[str] = (),
    params: Mapping[str, Any] | None = None,
    reporter: Reporter | None = None,
    child: Callable[[Mapping[str, Any], float | None], dict[str, Any]] = run_child,
) -> Outcome:
    """Run every case of ``plan``, checking digests per cell, writing rows as cells finish.

    ``backend_urls`` maps each displayed backend label to the URL the child opens.
    """
    runner = CaseRunner(
        "checkpoint", output, options, argv=argv, params=params, reporter=reporter, child=child
    )
    reporter = runner.reporter
    for warning in plan.warnings:
        reporter.warn(warning)
    reporter.start(len(plan.runnable))
    try:
        cells: dict[str, list[CheckpointCase]] = {}
        for case in plan.cases:
            cells.setdefault(case.cell_id, []).append(case)
        for cell_cases in cells.values():
            rows: list[dict[str, Any]] = []
            for case in cell_cases:
                case_params = case.params()
                case_params["backend_name"] = backend_name(
                    backend_urls.get(case.backend, case.backend)
                )
                if case.skipped:
                    rows.append(
                        runner.row(
                            case_params,
                            {"status": "skipped", "error": case.skip_reason, "profiled": False},
                        )
                    )
                    continue
                secrets = {
                    "backend_url": backend_urls.get(case.backend, case.backend),
                    "cache_url": (cache_urls or {}).get(case.cache, case.cache),
                }
                rows.append(runner.execute(case_params, secrets))
            for failure in check_cell_digests(rows):
                runner.outcome.failures.append(failure)
                reporter.warn("DIGEST MISMATCH " + failure)
            for row in rows:
                if row.get("status") in INCOMPLETE or row.get("status") == "failed":
                    reporter.warn(f"{row['case_id']}: {row.get('status')}: {row.get('error')}")
            runner.emit(rows)
    finally:
        outcome = runner.close()
    return outcome


def run_measurement_cases(
    bench: str,
    backends: Sequence[str],
    *,
    output: Path,
    options: RunOptions,
    repetitions: int,
    params: Mapping[str, Any],
    argv: Sequence[str],
    reporter: Reporter | None,
    child: Callable[[Mapping[str, Any], float | None], dict[str, Any]] = run_child,
) -> Outcome:
    """Run one child per (repetition, backend); each measurement becomes one row."""
    runner = CaseRunner(
        bench,
        output,
        options,
        argv=argv,
        params={
            **params,
            "backends": [display_backend(b) for b in backends],
            "repetitions": repetitions,
        },
        reporter=reporter,
        child=child,
    )
    runner.reporter.start(repetitions * len(backends))
    try:
        for rep in range(repetitions):
            for raw in backends:
                label = display_backend(raw)
                case_params = {
                    "case_id": f"{label}|r{rep}",
                    "case_backend": label,
                    "repetition": rep,
                    "seed": rep + 1,
                    **params,
                }
                row = runner.execute(case_params, {"backend": label, "backend_url": raw})
                measurements = row.pop("measurements", None) or []
                if row.get("status") != "ok" or not measurements:
                    runner.reporter.warn(f"{label}: {row.get('status')}: {row.get('error')}")
                    row.setdefault("backend", label)
                    runner.emit([row])
                    continue
                rows = []
                for m in measurements:
                    rows.append({**row, **m})
                runner.emit(rows)
    finally:
        outcome = runner.close()
    return outcome
