"""Never a verdict without a run: what the pytest plugin checks before and after the suite.

Before collection it refuses what cannot give a verdict (a URL that does not parse or
names no backend, Hypothesis missing, an unknown profile); after selection it checks
that something is left, that every ``@requires`` marker names a capability of the
test's kind, and opens each backend the selected tests need once (the preflight), so a
missing driver, a bad URL option or an unreachable server is one clear message instead
of a failure or skip per test. After the run, a run in which no test ran fails.

Each refusal is a `pytest.UsageError` (exit code 4, one ``ERROR:`` line); under
``runstore check`` it is also written to the report file, and hints name the CLI's
flags instead of pytest's.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pytest

from .session import (
    TARGET_FIXTURES,
    named_backends,
    per_session,
    provisions_of,
    split_kinds,
    suite_timeout,
)

#: How each hint is spelled: (under ``runstore check``, under plain pytest).
_FLAGS = {
    "allow_unreachable": ("--allow-unreachable", "--runstore-allow-unreachable"),
    "profile": ("--profile", "--hypothesis-profile"),
    "keyword": ("-k", "-k"),
    "timeout": ("--timeout", "--runstore-timeout"),
}
#: Default ports, to name ``host:port`` in "cannot reach" when the URL has none.
_DEFAULT_PORTS = {"postgresql": 5432, "postgres": 5432, "redis": 6379, "rediss": 6379}


@dataclass
class _State:
    suite_collected: bool = False
    selected: set[str] = field(default_factory=set)
    ran: int = 0
    refused: bool = False


def _state(config: pytest.Config) -> _State:
    return per_session(config, "_runstore_preflight", _State)


def under_check(config: pytest.Config) -> bool:
    """Whether this pytest is the child of ``runstore check`` (it writes a report file)."""
    return bool(config.getoption("runstore_report", default=None))


def flag(config: pytest.Config, name: str) -> str:
    """A hint's flag as the user typed the command: ``runstore check``'s or pytest's."""
    cli, plain = _FLAGS[name]
    return cli if under_check(config) else plain


def emit_error(config: pytest.Config, message: str) -> None:
    """Write ``message`` as an error record for ``runstore check`` (no-op under plain pytest)."""
    path = config.getoption("runstore_report", default=None)
    if path:
        with Path(path).open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({"type": "error", "message": message}) + "\n")


def refuse(config: pytest.Config, message: str) -> NoReturn:
    """Stop the run with one clear message (exit code 4)."""
    _state(config).refused = True
    emit_error(config, message)
    raise pytest.UsageError(message)


def check_configuration(config: pytest.Config) -> None:
    """At configure time: Hypothesis is installed and every named entry parses and names a backend."""
    from runstore.cli.check import SUITE_KINDS
    from runstore.errors import BackendNotFoundError, MissingDriverError, RunstoreError
    from runstore.loader import get_backends
    from runstore.urls import BackendURL

    for module in ("hypothesis",):
        if importlib.util.find_spec(module) is None:
            refuse(config, str(MissingDriverError("conformance", module, "conformance", needed_by="the conformance suite")))
    registry = get_backends()
    for entry in named_backends(config):
        only, raw = split_kinds(entry)
        try:
            url = BackendURL.parse(raw)
        except RunstoreError as exc:
            refuse(config, str(exc))
        served = [k for k in SUITE_KINDS if registry.of(k).serves(url)]
        if not served:
            schemes = {s for k in SUITE_KINDS for spec in registry.of(k) for s in spec.schemes}
            refuse(config, str(BackendNotFoundError("suite", url.scheme, schemes)))
        if only is not None and not only & set(served):
            refuse(
                config,
                f"{url} provides no {' or '.join(sorted(only))} backend; its scheme serves: "
                f"{', '.join(served)}",
            )


def check_profile(config: pytest.Config, requested: str | None) -> None:
    """An unknown ``--hypothesis-profile`` is refused with the list of profiles."""
    if not requested:
        return
    from hypothesis import settings
    from hypothesis.errors import InvalidArgument

    try:
        settings.get_profile(requested)
    except InvalidArgument:
        known = sorted(getattr(settings, "_profiles", {}) or ("runstore-ci", "runstore-dev", "runstore-nightly"))
        refuse(
            config,
            f"{flag(config, 'profile')} {requested!r}: no such Hypothesis profile; known: {', '.join(known)}",
        )


def _target_params(item: pytest.Item) -> dict[str, str | None]:
    """``{kind: raw URL or None}`` for each target fixture the item is parametrized with."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return {}
    return {k: callspec.params[f] for k, f in TARGET_FIXTURES.items() if f in callspec.params}


def note_collected(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Before selection: check every collected test's markers (a deselected typo is still
    a typo) and remember whether any suite test was collected."""
    _check_markers(config, items)
    _state(config).suite_collected = any(_target_params(item) for item in items)


def after_selection(config: pytest.Config, items: list[pytest.Item]) -> None:
    """After -k/-m: drop kinds nobody named, refuse an empty run, open what is left (preflight)."""
    if not named_backends(config):
        return
    state = _state(config)
    kept = [i for i in items if None not in _target_params(i).values()]
    dropped = [i for i in items if None in _target_params(i).values()]
    if dropped:
        # Tests of a kind no named URL provides: not a skip of the backend, just not its suite.
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    if state.suite_collected and not items:
        keyword = config.getoption("keyword", default="")
        what = f" {flag(config, 'keyword')} {keyword!r}" if keyword else ""
        provided = ", ".join(
            f"{redact_entry(e)} ({', '.join(_kinds_of(e))})" for e in named_backends(config)
        )
        refuse(
            config,
            f"no conformance test matches the selection{what}: nothing would run "
            f"(backends named: {provided})",
        )
    suite_items = [i for i in items if _target_params(i)]
    state.selected = {i.nodeid for i in suite_items}
    _preflight(config, suite_items)


def redact_entry(entry: str) -> str:
    """A backend entry as it can be shown (password masked)."""
    from runstore.urls import redact

    return redact(entry)


def _kinds_of(entry: str) -> list[str]:
    from runstore.cli.check import SUITE_KINDS
    from runstore.loader import get_backends
    from runstore.urls import BackendURL

    only, raw = split_kinds(entry)
    url = BackendURL.parse(raw)
    registry = get_backends()
    return [k for k in SUITE_KINDS if registry.of(k).serves(url) and (only is None or k in only)]


def _check_markers(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse a ``requires`` marker naming an unknown capability, or one its test's kind cannot have.

    Without this a typo would skip its test on every backend, silently and forever.
    """
    from runstore.capabilities import CAPABILITIES, CAPABILITY_KINDS, Kind

    for item in items:
        kinds = [Kind(k) for k, fixture in TARGET_FIXTURES.items() if fixture in getattr(item, "fixturenames", ())]
        for marker in item.iter_markers("requires"):
            for capability in marker.args:
                if capability not in CAPABILITIES:
                    refuse(
                        config,
                        f"{item.nodeid}: @pytest.mark.requires({capability!r}) names no capability; "
                        f"known: {', '.join(sorted(CAPABILITIES))}",
                    )
                allowed = CAPABILITY_KINDS.get(capability, frozenset(Kind))
                for kind in kinds:
                    if kind not in allowed:
                        refuse(
                            config,
                            f"{item.nodeid}: @pytest.mark.requires({capability!r}) on a test of {kind} backends; "
                            f"{capability!r} is a capability of "
                            f"{', '.join(sorted(allowed))} backends only",
                        )


def _host_port(url: Any) -> str:
    default = _DEFAULT_PORTS.get(url.scheme.removeprefix("langgraph-"))
    servers = url.hosts or [(url.host or url.option("host") or "localhost", url.port or url.option("port"))]
    return ", ".join(f"{host}:{port or default}" if port or default else host for host, port in servers)


def _unreachable(exc: BaseException) -> BaseException | None:
    """The connection error behind ``exc`` if it means the server cannot be reached."""
    from runstore.errors import BackendUnavailableError

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, (OSError, ConnectionError)):
            return seen
        if isinstance(seen, BackendUnavailableError):
            return seen.__cause__ or seen
        seen = seen.__cause__
    return None


def _describe(exc: BaseException) -> str:
    from runstore.urls import redact

    detail = redact(str(exc)).strip()
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


def _preflight(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Open each (kind, URL) the selected tests need once, before any test runs."""
    from runstore.capabilities import Kind
    from runstore.errors import MissingDriverError, RunstoreError
    from runstore.urls import BackendURL

    from .harness import BackendTarget, spec_for

    needed: dict[str, list[str]] = {}
    for item in items:
        for kind, raw in _target_params(item).items():
            if raw is not None and kind not in needed.setdefault(raw, []):
                needed[raw].append(kind)
    problems: list[str] = []
    unreachable: dict[str, str] = {}
    allow = bool(config.getoption("runstore_allow_unreachable", default=False))
    bound = suite_timeout(config)
    for raw, kinds in needed.items():
        named = BackendURL.parse(raw)
        specs = {kind: spec_for(Kind(kind), named) for kind in kinds}
        missing = [
            str(MissingDriverError(spec.name, module, spec.extra or spec.name))
            for spec in specs.values()
            if spec is not None and (module := spec.missing_driver()) is not None
        ]
        if missing:
            problems.extend(missing)
            continue
        try:
            import asyncio

            asyncio.run(_knock(named))  # before provisioning, which connects with retries
            provisioned = provisions_of(config).get(raw)
            for kind, spec in specs.items():
                assert spec is not None
                target: BackendTarget[Any] = BackendTarget(
                    kind=Kind(kind), spec=spec, url=provisioned.url, named_url=named
                )
                _probe(target, bound)
        except _OpenTimeout as exc:
            problems.append(
                f"opening {exc.kind} backend {named} did not return within {bound:g}s "
                f"(the per-test bound; {flag(config, 'timeout')} raises it)"
            )
        except Exception as exc:
            cause = _unreachable(exc)
            if cause is not None:
                message = f"cannot reach {_host_port(named)}: {_describe(cause)}"
                if allow:
                    unreachable[raw] = message
                else:
                    problems.append(
                        f"{message} (the server behind {named}; pass "
                        f"{flag(config, 'allow_unreachable')} to skip its tests instead)"
                    )
            elif isinstance(exc, RunstoreError):
                problems.append(str(exc))
            else:
                problems.append(f"cannot open {named}: {_describe(exc)}")
    if problems:
        refuse(config, "\n".join(dict.fromkeys(problems)))
    for item in items:
        for raw in _target_params(item).values():
            if raw in unreachable:
                item.add_marker(pytest.mark.skip(reason=unreachable[raw]))


#: How long the preflight waits for a server's TCP port to answer. A backend's own open
#: retries for its operation timeout (a service may start before its server); a person
#: running `runstore check` learns within seconds that nothing listens there.
KNOCK_SECONDS = 3.0


async def _knock(url: Any) -> None:
    """Raise the `OSError` of connecting to the one TCP server ``url`` names, if it does not answer."""
    import asyncio

    default = _DEFAULT_PORTS.get(url.scheme.removeprefix("langgraph-"))
    host, port = url.host, url.port or default
    if url.hosts or not host or host.startswith("/") or not port:
        return  # several servers, a socket, or a scheme whose port is not known here
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), KNOCK_SECONDS)
    except TimeoutError:
        raise OSError(f"no answer from {host}:{port} within {KNOCK_SECONDS:g}s") from None
    writer.close()


class _OpenTimeout(Exception):
    def __init__(self, kind: str) -> None:
        self.kind = kind


def _probe(target: Any, bound: float) -> None:
    """Open and close one instance, within ``bound`` seconds (0: unbounded)."""
    import asyncio

    async def main() -> None:
        async with asyncio.timeout(bound or None):
            async with target.opener():
                pass

    try:
        asyncio.run(main())
    except TimeoutError as exc:
        if not isinstance(exc.__cause__, asyncio.CancelledError):
            raise  # the backend's own timeout (a connect timeout): reported as unreachable
        raise _OpenTimeout(str(target.kind)) from None


def note_ran(item: pytest.Item) -> None:
    """A selected suite test's body started."""
    state = _state(item.config)
    if item.nodeid in state.selected:
        state.ran += 1


def check_something_ran(session: pytest.Session) -> None:
    """A run in which suite tests were selected but none ran (and none failed) fails."""
    config = session.config
    state = _state(config)
    if not named_backends(config) or not state.selected or state.ran or session.testsfailed:
        return
    if state.refused or session.shouldstop or session.shouldfail:
        return
    if config.getoption("runstore_allow_unreachable", default=False):
        return
    message = (
        f"no conformance test ran: all {len(state.selected)} selected tests were skipped "
        "(the reasons are listed with the results)"
    )
    # Not an error record: `runstore check` shows the skip reasons and its own verdict.
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"ERROR: {message}", red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
