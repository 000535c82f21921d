"""`runstore check`: run the conformance suite in a subprocess and summarize it as a matrix.

The parent never imports pytest: it starts ``python -m pytest --pyargs
runstore.conformance`` with a reporting plugin that writes one JSON line per test,
tails that file for live progress, and folds the lines into a backend x suite matrix.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import tomllib
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runstore.errors import ConfigError, RunstoreError
from runstore.loader import normalize_plugin_spec
from runstore.redaction import redact
from runstore.urls import BackendURL

OUTCOMES = ("passed", "failed", "skipped", "xfailed", "xpassed")
SUITE_KINDS = ("saver", "events", "streams", "runs", "store", "history_cache")
#: The keys ``[tool.runstore.conformance]`` accepts.
PROJECT_KEYS = ("backends", "presets", "plugins", "xfail", "timeout")


@dataclass(frozen=True)
class ProjectConfig:
    """``[tool.runstore.conformance]`` of a plugin project: what its suite runs default to.

    Keys: ``backends`` (URLs used when none are named), ``presets`` (name -> URLs),
    ``plugins`` (modules or files, relative to the pyproject, to load first), ``xfail``
    (test pattern -> reason; each match becomes a strict xfail) and ``timeout`` (the
    per-test bound in seconds).
    """

    #: The pyproject.toml read (``None``: there was none).
    path: Path | None
    settings: dict[str, Any]

    @property
    def base(self) -> Path:
        """The folder a relative plugin file is resolved in (the pyproject's)."""
        return self.path.parent if self.path is not None else Path.cwd()

    def plugins(self) -> list[str]:
        """The ``plugins`` entries as the loader takes them (files made absolute)."""
        return [normalize_plugin_spec(spec, self.base) for spec in self.settings.get("plugins", [])]

    def preset_backends(self, names: Sequence[str], *, option: str) -> list[str]:
        """The backend entries of the presets ``names``, in order. A name that is not in
        ``presets`` is a `ConfigError` naming ``option`` and the known presets; so is a preset
        that is not a non-empty list of URLs (an empty one would quietly test the defaults)."""
        presets = self.settings.get("presets", {})
        entries: list[str] = []
        for name in names:
            if name not in presets:
                raise ConfigError(
                    f"{option} {name!r}: not in [tool.runstore.conformance.presets]; "
                    f"known: {', '.join(sorted(presets)) or 'none'}"
                )
            urls = presets[name]
            if not urls or not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
                raise ConfigError(
                    f"{option} {name!r}: [tool.runstore.conformance.presets] {name} = {urls!r}; "
                    'accepted: a non-empty list of backend URLs, e.g. ["acme://"]'
                )
            entries += urls
        return entries


def read_project_config(path: str | os.PathLike[str] | None = None, *, option: str = "--config") -> ProjectConfig:
    """Read ``[tool.runstore.conformance]`` from ``path`` (default: ./pyproject.toml, if there).

    A ``path`` that does not exist, a file that is not TOML or an unknown key is a
    `ConfigError` naming ``option`` or the file.
    """
    chosen = Path(path) if path else Path.cwd() / "pyproject.toml"
    if not chosen.is_file():
        if path:
            raise ConfigError(f"{option}: {chosen} does not exist")
        return ProjectConfig(None, {})
    try:
        with chosen.open("rb") as fh:
            data = tomllib.load(fh).get("tool", {}).get("runstore", {}).get("conformance", {})
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{chosen} is not valid TOML: {exc}") from exc
    unknown = set(data) - set(PROJECT_KEYS)
    if unknown:
        raise ConfigError(
            f"[tool.runstore.conformance] in {chosen}: unknown keys {sorted(unknown)}; "
            f"accepted: {', '.join(PROJECT_KEYS)}"
        )
    return ProjectConfig(chosen.resolve(), data)


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
    interrupted: bool = False

    @property
    def ran(self) -> int:
        """Tests whose body ran (passed, failed, or an expected failure either way)."""
        return self.counts["passed"] + self.counts["failed"] + self.counts["xfailed"] + self.counts["xpassed"]

    @property
    def status(self) -> str:
        """``failed`` if anything failed, else ``interrupted`` if the run was cut short,
        else ``passed``, else ``skipped``."""
        if self.counts["failed"] or self.counts["xpassed"]:
            return "failed"
        if self.interrupted:
            return "interrupted"
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
    #: Refusals from the suite's preflight (unreachable server, missing driver, ...).
    errors: list[str] = field(default_factory=list)
    #: The ``session`` record: Hypothesis profile and seed, the per-test bound, each
    #: backend's URL and capabilities.
    session: dict[str, Any] = field(default_factory=dict)
    #: Whether the child pytest finished (wrote its last record) on its own.
    finished: bool = True
    #: The command line that reruns this check (the URLs, plugins, profile and seed).
    command: list[str] = field(default_factory=list)
    #: The backend entries as shown in `command` (passwords masked).
    urls: list[str] = field(default_factory=list)
    #: Whether unreachable backends were allowed to skip (then an empty run is no failure).
    allow_unreachable: bool = False

    @property
    def interrupted(self) -> bool:
        """Cut short: killed, interrupted (Ctrl-C, pytest -x) or ended before its last test."""
        if self.errors:
            return False
        return not self.finished or self.returncode == 2 or self.returncode < 0

    def _final(self) -> list[dict[str, Any]]:
        final: dict[str, dict[str, Any]] = {}
        for record in self.records:
            previous = final.get(record["nodeid"])
            if previous is None or record["outcome"] == "failed":
                final[record["nodeid"]] = record
        return list(final.values())

    def matrix(self) -> dict[str, dict[str, Cell]]:
        """``{backend label: {suite: Cell}}``, one final outcome per test."""
        out: dict[str, dict[str, Cell]] = defaultdict(dict)
        for record in self._final():
            label = backend_label(record)
            cell = out[label].setdefault(record["suite"], Cell(interrupted=self.interrupted))
            cell.counts[record["outcome"]] += 1
            if record["outcome"] == "skipped" and record.get("reason"):
                cell.skip_reasons[record["reason"]] += 1
            if record["outcome"] in ("failed", "xpassed"):
                cell.failures.append(record)
        return dict(out)

    def level(self, backend: str) -> str:
        """Conformance level of one backend: ``full``, ``partial`` (capability skips),
        ``failing``, ``interrupted`` (the run was cut short) or ``untested``."""
        cells = self.matrix().get(backend, {})
        if any(c.status == "failed" for c in cells.values()):
            return "failing"
        if self.interrupted:
            return "interrupted"
        if not any(c.ran for c in cells.values()):
            return "untested"
        if any(c.counts["skipped"] for c in cells.values()):
            return "partial"
        return "full"

    def totals(self, cells: Any = None) -> Counter[str]:
        """run/passed/failed/skipped over ``cells`` (default: every cell)."""
        if cells is None:
            cells = [c for row in self.matrix().values() for c in row.values()]
        out: Counter[str] = Counter()
        for cell in cells:
            out["run"] += cell.ran
            out["passed"] += cell.counts["passed"] + cell.counts["xfailed"]
            out["failed"] += cell.counts["failed"] + cell.counts["xpassed"]
            out["skipped"] += cell.counts["skipped"]
        return out

    def capabilities(self, backend: str) -> dict[str, list[str]]:
        """The backend's declared capabilities: ``proven`` (a test requiring it ran and
        every such test passed), ``failed`` and ``unproven`` (no such test ran)."""
        declared = self.session.get("backends", {}).get(backend, {}).get("capabilities", [])
        outcomes: dict[str, set[str]] = defaultdict(set)
        for record in self._final():
            if backend_label(record) == backend:
                for capability in record.get("requires") or ():
                    outcomes[capability].add(record["outcome"])
        out: dict[str, list[str]] = {"proven": [], "failed": [], "unproven": []}
        for capability in declared:
            seen = outcomes.get(capability, set())
            if seen & {"failed", "xpassed"}:
                out["failed"].append(capability)
            elif seen & {"passed"} and not self.interrupted:
                out["proven"].append(capability)
            else:
                out["unproven"].append(capability)
        return out

    @property
    def status(self) -> str:
        """``error`` (refused before running), ``failed``, ``interrupted``, ``empty``
        (nothing ran), ``skipped`` (nothing ran, unreachable backends allowed) or ``passed``."""
        if self.errors:
            return "error"
        if any(c.status == "failed" for row in self.matrix().values() for c in row.values()):
            return "failed"
        if self.interrupted:
            return "interrupted"
        if not self.totals()["run"]:
            return "skipped" if self.allow_unreachable else "empty"
        if self.returncode != 0:
            return "failed"
        return "passed"

    @property
    def ok(self) -> bool:
        """Whether the run completed, ran at least one test, and nothing failed."""
        return self.status in ("passed", "skipped")

    @property
    def profile(self) -> str | None:
        """The Hypothesis profile the suite ran under."""
        return self.session.get("profile")

    @property
    def seed(self) -> str | None:
        """The Hypothesis seed (``None`` when derandomized: each test seeds itself)."""
        seed = self.session.get("seed")
        return None if seed is None else str(seed)

    def replay(self, test: str | None = None, record: dict[str, Any] | None = None) -> str:
        """One command that reruns this check, or only ``test`` (a test function name) on
        the backend of ``record`` (a result record)."""
        cmd = list(self.command)
        if test is not None:
            cmd = [*_drop_option(cmd, "-k"), "-k", test]
        if record is not None and record.get("url") and record.get("kind"):
            rest = [part for part in cmd[2:] if part not in self.urls]
            cmd = [*cmd[:2], f"{record['kind']}={redact(record['url'])}", *rest]
        return " ".join(shlex.quote(part) for part in cmd)

    def to_json(self) -> dict[str, Any]:
        """A machine-readable summary (the JUnit report carries the same properties)."""
        matrix = self.matrix()
        totals = self.totals()
        return {
            "ok": self.ok,
            "status": self.status,
            "errors": list(self.errors),
            "collected": self.collected,
            **{k: totals[k] for k in ("run", "passed", "failed", "skipped")},
            "pytest_exit_code": self.returncode,
            "profile": self.profile,
            "seed": self.seed,
            "derandomized": self.session.get("derandomized"),
            "timeout": self.session.get("timeout"),
            "replay": self.replay(),
            "backends": {
                backend: self._backend_json(backend, rows) for backend, rows in sorted(matrix.items())
            },
        }

    def _backend_json(self, backend: str, rows: dict[str, Cell]) -> dict[str, Any]:
        info = self.session.get("backends", {}).get(backend, {})
        totals = self.totals(rows.values())
        reasons: Counter[str] = Counter()
        for cell in rows.values():
            reasons.update(cell.skip_reasons)
        return {
            "kind": info.get("kind"),
            "name": info.get("name"),
            "url": info.get("url"),
            "level": self.level(backend),
            **{k: totals[k] for k in ("run", "passed", "failed", "skipped")},
            "skip_reasons": dict(reasons.most_common()),
            "capabilities": self.capabilities(backend),
            "suites": {
                suite: {
                    "status": cell.status,
                    "run": cell.ran,
                    **{k: cell.counts[k] for k in OUTCOMES},
                    "skip_reasons": dict(cell.skip_reasons),
                    "failures": [
                        {
                            "test": f["nodeid"],
                            "message": f.get("message"),
                            "replay": self.replay(
                                f.get("name") or f["nodeid"].rsplit("::", 1)[-1], f
                            ),
                        }
                        for f in cell.failures
                    ],
                }
                for suite, cell in sorted(rows.items())
            },
        }

    def annotate_junit(self, path: Path) -> None:
        """Add the JSON summary's properties (profile, seed, replay, each backend's level and
        proven capabilities) to a JUnit report's test suite."""
        import xml.etree.ElementTree as ET

        tree = ET.parse(path)
        root = tree.getroot()
        suite = root.find("testsuite") if root.tag == "testsuites" else root
        if suite is None:
            return
        props = suite.find("properties")
        if props is None:
            props = ET.Element("properties")
            suite.insert(0, props)
        summary = self.to_json()
        values: dict[str, Any] = {
            "runstore.status": summary["status"],
            "runstore.profile": summary["profile"],
            "runstore.seed": summary["seed"],
            "runstore.timeout": summary["timeout"],
            "runstore.replay": summary["replay"],
        }
        for label, row in summary["backends"].items():
            values[f"runstore.{label}.level"] = row["level"]
            values[f"runstore.{label}.counts"] = (
                f"run={row['run']} passed={row['passed']} failed={row['failed']} skipped={row['skipped']}"
            )
            values[f"runstore.{label}.capabilities.proven"] = ",".join(row["capabilities"]["proven"])
        for name, value in values.items():
            ET.SubElement(props, "property", name=name, value="" if value is None else str(value))
        if self.errors:
            # A refused run (unreachable server, bad URL, missing extra) ran no test; CI
            # systems that read only JUnit still show why, as one errored test case.
            case = ET.SubElement(suite, "testcase", classname="runstore.cli.check", name="preflight", time="0")
            error = ET.SubElement(case, "error", message=self.errors[0])
            error.text = "\n".join(self.errors)
            for attr in ("tests", "errors"):
                suite.set(attr, str(int(suite.get(attr, "0") or 0) + 1))
        tree.write(path, encoding="utf-8", xml_declaration=True)


def _drop_option(cmd: list[str], option: str) -> list[str]:
    out: list[str] = []
    skip = False
    for part in cmd:
        if skip:
            skip = False
            continue
        if part == option:
            skip = True
            continue
        out.append(part)
    return out


def backend_label(record: dict[str, Any]) -> str:
    """``kind:name`` for a result record, the name exactly as the test id has it (``-``
    when the test had no backend)."""
    if record.get("kind") is None:
        return "-"
    return f"{record['kind']}:{record.get('backend') or '?'}"


def check_suite_installed() -> None:
    """Raise `MissingDriverError` naming the ``conformance`` extra if pytest or Hypothesis is missing."""
    import importlib.util

    from runstore.errors import MissingDriverError

    for module in ("pytest", "hypothesis"):
        if importlib.util.find_spec(module) is None:
            raise MissingDriverError("conformance", module, "conformance", needed_by="runstore check")


def run_suite(
    urls: Sequence[str],
    *,
    plugins: Sequence[str] = (),
    profile: str | None = None,
    seed: int | None = None,
    allow_unreachable: bool = False,
    junit_xml: str | None = None,
    keyword: str | None = None,
    project: ProjectConfig | None = None,
    extra_args: Sequence[str] = (),
    on_progress: Callable[[int, int, dict[str, Any] | None], None] | None = None,
) -> CheckResult:
    """Run the conformance suite against ``urls`` in a child pytest and collect the outcomes.

    Everything read back from the child (records, log, the JUnit report) has its
    passwords masked: the child quotes URLs in messages and tracebacks. A Ctrl-C stops
    the child and returns what ran, marked interrupted.
    """
    check_suite_installed()
    for entry in urls:
        # Parsing makes `redact` know each password, whatever the child writes it as.
        with contextlib.suppress(RunstoreError):
            BackendURL.parse(split_backend_entry(entry)[1])
    # The child runs in a temporary directory: plugin files are named absolutely.
    plugins = [normalize_plugin_spec(p, Path.cwd()) for p in plugins]
    command = ["runstore", "check", *(redact(u) for u in urls)]
    for plugin in plugins:
        command += ["--plugin", plugin]
    if profile:
        command += ["--profile", profile]
    if seed is not None:
        command += ["--seed", str(seed)]
    if keyword:
        command += ["-k", keyword]
    if allow_unreachable:
        command += ["--allow-unreachable"]
    if project is not None and project.path is not None and project.path != (Path.cwd() / "pyproject.toml").resolve():
        command += ["--config", str(project.path)]
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
            cmd += ["--runstore-plugin", plugin]
        if profile:
            cmd += ["--hypothesis-profile", profile]
        if seed is not None:
            cmd += ["--hypothesis-seed", str(seed)]
        if allow_unreachable:
            cmd += ["--runstore-allow-unreachable"]
        if junit_xml:
            cmd += ["--junitxml", str(Path(junit_xml).resolve())]
        if keyword:
            cmd += ["-k", keyword]
        if project is not None and project.path is not None:
            cmd += ["--runstore-config", str(project.path)]
        cmd += list(extra_args)
        result = CheckResult(
            records=[], returncode=0, collected=0, log="", finished=False, command=command,
            urls=[redact(u) for u in urls], allow_unreachable=allow_unreachable,
        )
        with log_path.open("w") as log, report.open() as feed:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
            try:
                while True:
                    finished = proc.poll() is not None
                    for line in feed.readlines():
                        _take(result, json.loads(redact(line)), on_progress)
                    if finished:
                        break
                    time.sleep(0.1)
            except KeyboardInterrupt:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                for line in feed.readlines():
                    with contextlib.suppress(ValueError):
                        _take(result, json.loads(redact(line)), None)
                result.finished = False
        result.returncode = proc.returncode
        result.log = redact(log_path.read_text(errors="replace"))
        if not result.finished and not result.errors and proc.returncode in (3, 4):
            # pytest refused before our plugin could say why (an INTERNALERROR, a usage error
            # of pytest's own): its last lines are the one message there is.
            tail = [line for line in result.log.strip().splitlines() if line.strip()][-3:]
            result.errors.append("the conformance run could not start: " + " / ".join(tail))
        if junit_xml and Path(junit_xml).is_file():
            junit = Path(junit_xml)
            junit.write_text(redact(junit.read_text(encoding="utf-8")), encoding="utf-8")
            with contextlib.suppress(Exception):
                result.annotate_junit(junit)
        return result


def _take(
    result: CheckResult,
    record: dict[str, Any],
    on_progress: Callable[[int, int, dict[str, Any] | None], None] | None,
) -> None:
    kind = record["type"]
    if kind == "collected":
        result.collected = record["count"]
        if on_progress:
            on_progress(0, result.collected, None)
    elif kind == "session":
        result.session = record
    elif kind == "error":
        result.errors.append(record["message"])
    elif kind == "finished":
        result.finished = True
    else:
        result.records.append(record)
        if on_progress:
            done = len({r["nodeid"] for r in result.records})
            on_progress(done, result.collected, record)
