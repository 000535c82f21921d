"""Every public backend class (what a built-in plugin's factory opens) shows its use in an
``Examples:`` block, and each example runs as written (server URLs swapped for the test
servers; the Redis Cluster one is only parsed: it needs a cluster)."""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import io
import re
from pathlib import Path
from typing import Any

import pytest

from runstore.loader import get_backends

KINDS = ("saver", "events", "streams", "runs")
#: What each kind's example prints (its comments say so too).
PRINTS = {
    "saver": ["{'count': 2}", "{'count': 2}"],
    "events": ["[(1, 'hello')]"],
    "streams": ["StreamEvent(id='0-1', event='values', data={'count': 1})", "END"],
    "runs": ["success"],
}
POSTGRES = "postgresql://app@localhost:5432/app"
REDIS = re.compile(r'"redis://localhost:6379/0\?prefix=app:"')


def _classes() -> list[tuple[str, type]]:
    found = []
    registry = get_backends()
    for kind in KINDS:
        for spec in registry.of(kind):
            factory = spec.factory
            if not isinstance(factory, str) or not factory.startswith("runstore.plugins."):
                continue  # a third party's or a test's plugin
            module, _, attr = factory.partition(":")
            found.append((kind, getattr(importlib.import_module(module), attr.split(".")[0])))
    return found


CLASSES = _classes()


def _example(cls: type) -> str:
    doc = inspect.getdoc(cls) or ""
    assert "\nExamples:\n" in doc, f"{cls.__name__} has no Examples: block"
    after = doc.split("\nExamples:\n", 1)[1]
    match = re.search(r"```python\n(.*?)\n```", after, re.S)
    assert match, f"{cls.__name__}: Examples: holds no ```python block"
    return match.group(1)


def test_every_builtin_kind_has_backend_classes() -> None:
    assert {kind for kind, _ in CLASSES} == set(KINDS)
    assert len(CLASSES) >= 13


@pytest.mark.parametrize(("kind", "cls"), CLASSES, ids=[cls.__name__ for _, cls in CLASSES])
def test_the_example_imports_the_class_and_parses(kind: str, cls: type) -> None:
    code = _example(cls)
    tree = ast.parse(code)
    imported = {
        (node.module, alias.name)
        for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert (cls.__module__, cls.__name__) in imported, imported


@pytest.mark.parametrize(("kind", "cls"), CLASSES, ids=[cls.__name__ for _, cls in CLASSES])
def test_the_example_runs(kind: str, cls: type, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                          request: pytest.FixtureRequest) -> None:
    code = _example(cls)
    if "redis+cluster://" in code:
        pytest.skip("needs a Redis Cluster (the cluster bridge runs on one in tests/faults)")
    if POSTGRES in code:
        code = code.replace(POSTGRES, request.getfixturevalue("postgres_url"))
    if REDIS.search(code):
        code = REDIS.sub(repr(request.getfixturevalue("redis_url")), code)
    monkeypatch.chdir(tmp_path)  # the file examples write where they stand
    out = io.StringIO()
    namespace: dict[str, Any] = {"__name__": "__example__"}
    with contextlib.redirect_stdout(out):
        exec(compile(code, f"<{cls.__name__} example>", "exec"), namespace)
    printed = out.getvalue().splitlines()
    assert printed == PRINTS[kind], printed
