"""`runstore new-plugin`: write a minimal third-party plugin project to start from.

The backend skeleton is generated from the protocol's abstract methods, so it always
matches the contract of the installed runstore.
"""

from __future__ import annotations

import inspect
import keyword
import re
import textwrap
from pathlib import Path
from typing import Any

from runstore.errors import ConfigError

KINDS = {
    "saver": ("saver", "BaseCheckpointSaver", "runstore_register_savers", "SaverRegistry"),
    "events": ("events", "RunEventStore", "runstore_register_event_stores", "EventStoreRegistry"),
    "streams": ("streams", "StreamBridge", "runstore_register_stream_bridges", "StreamBridgeRegistry"),
    "runs": ("runs", "RunStore", "runstore_register_run_stores", "RunStoreRegistry"),
    "store": ("store", "StoreBase", "runstore_register_stores", "StoreRegistry"),
    "history_cache": ("cache", "HistoryCacheBackend", "runstore_register_history_caches", "HistoryCacheRegistry"),
}
#: The generated class is named ``<Name><suffix>`` (``AcmeSaver``, ``AcmeEventStore``, ...).
CLASS_SUFFIX = {
    "saver": "Saver",
    "events": "EventStore",
    "streams": "StreamBridge",
    "runs": "RunStore",
    "store": "Store",
    "history_cache": "HistoryCache",
}
#: The suite module that checks each kind.
SUITES = {
    "saver": "test_savers",
    "events": "test_events",
    "streams": "test_streams",
    "runs": "test_runs",
    "store": "test_store",
    "history_cache": "test_history_cache",
}
#: A saver's contract is the async API of LangGraph's BaseCheckpointSaver, whose methods
#: are not abstract (they raise NotImplementedError): the ones a saver must write.
SAVER_METHODS = ("aget_tuple", "alist", "aput", "aput_writes", "adelete_thread")
#: A store subclasses runstore's `StoreBase`, which routes LangGraph's get/put/search/...
#: through ``batch``/``abatch`` after runstore's input checks: a store writes the two
#: batch methods, and ``asweep_expired`` (the retention sweeper calls it on every pass).
STORE_METHODS = ("abatch", "batch", "asweep_expired")
#: A history cache's protocol is a `typing.Protocol`, whose methods are not abstract: the ones
#: to write (``close`` is written, empty: runstore calls it on every open's exit).
HISTORY_CACHE_METHODS = ("clear", "get", "purge_thread", "set")
#: Methods written for the kind, after ``open``.
_WRITTEN = {
    "history_cache": [
        "",
        "async def close(self) -> None:",
        '    """Release what ``open`` acquired (connections); nothing yet."""',
    ],
}

_HEADER = {
    "saver": (
        "from collections.abc import AsyncIterator, Sequence\n"
        "from typing import Any\n\n"
        "from langchain_core.runnables import RunnableConfig\n"
        "from langgraph.checkpoint.base import (\n"
        "    BaseCheckpointSaver,\n"
        "    ChannelVersions,\n"
        "    Checkpoint,\n"
        "    CheckpointMetadata,\n"
        "    CheckpointTuple,\n"
        ")\n\n"
        "from runstore.options import BackendOptions\n"
        "from runstore.urls import BackendURL\n"
    ),
    "runs": (
        "from collections.abc import Iterable, Mapping\n"
        "from typing import Any\n\n"
        "from runstore.options import BackendOptions\n"
        "from runstore.runs.protocol import (\n"
        "    CancelAction,\n"
        "    CreateResult,\n"
        "    MultitaskStrategy,\n"
        "    RunRecord,\n"
        "    RunStatus,\n"
        "    RunStore,\n"
        ")\n"
        "from runstore.urls import BackendURL\n"
    ),
    "events": (
        "from collections.abc import Iterable, Mapping, Sequence\n"
        "from typing import Any\n\n"
        "from runstore.events.protocol import EventContent, EventRecord, RunEventStore, RunSummary\n"
        "from runstore.events.owner import AUTO, UserId\n"
        "from runstore.options import BackendOptions\n"
        "from runstore.urls import BackendURL\n"
    ),
    "store": (
        "from collections.abc import Iterable\n"
        "from typing import Any\n\n"
        "from runstore.options import BackendOptions\n"
        "from runstore.store import StoreBase\n"
        "from runstore.store.base import store_config\n"
        "from runstore.urls import BackendURL\n"
    ),
    "history_cache": (
        "from langgraph.checkpoint.base import DeltaChannelHistory\n\n"
        "from runstore.checkpoint.cache import HistoryCacheBackend\n"
        "from runstore.options import BackendOptions\n"
        "from runstore.urls import BackendURL\n"
    ),
    "streams": (
        "from collections.abc import AsyncGenerator\n"
        "from typing import Any\n\n"
        "from runstore.options import BackendOptions\n"
        "from runstore.streams.protocol import StreamBridge, StreamItem\n"
        "from runstore.urls import BackendURL\n"
    ),
}


#: A class docstring that says more than the protocol's name.
_CLASS_DOC = {
    "history_cache": (
        '    """A runstore delta-history cache (``checkpoint_cache.type``).\n\n'
        "    ``get`` returns ``None`` on a miss and otherwise a copy equal to the entry last\n"
        "    ``set`` at (thread_id, key); ``purge_thread`` removes exactly that thread's entries.\n"
        "    It may forget an entry, never answer with another one (docs/checkpoint-modes.md).\n"
        '    """\n'
    ),
    "store": (
        '    """A runstore long-term memory store (LangGraph ``BaseStore``), built on `StoreBase`.\n\n'
        "    `StoreBase` turns get/put/search/delete/list_namespaces, sync and async, into ops\n"
        "    for ``batch``/``abatch``, and holds the clock and the checked index/TTL configs.\n"
        "    Start each batch with ``runstore.store.check_ops(ops)``: it refuses bad input\n"
        "    before any I/O and hands back checked ops; `runstore.store` has the filter,\n"
        "    namespace, TTL and ranking rules to build the rest on.\n"
        '    """\n'
    ),
}


def _protocol(kind: str) -> type[Any]:
    from langgraph.checkpoint.base import BaseCheckpointSaver

    from runstore import events, runs, streams
    from runstore.checkpoint.cache import HistoryCacheBackend
    from runstore.store import StoreBase

    return {
        "saver": BaseCheckpointSaver,
        "events": events.RunEventStore,
        "streams": streams.StreamBridge,
        "runs": runs.RunStore,
        "store": StoreBase,
        "history_cache": HistoryCacheBackend,
    }[kind]


def _contract_methods(kind: str) -> list[str]:
    """The methods a backend of ``kind`` must write, in name order."""
    if kind == "saver":
        return sorted(SAVER_METHODS)
    if kind == "store":
        return sorted(STORE_METHODS)
    if kind == "history_cache":
        return sorted(HISTORY_CACHE_METHODS)
    return sorted(getattr(_protocol(kind), "__abstractmethods__", ()))


def _method_source(name: str, fn: Any) -> str:
    signature = inspect.signature(fn)
    params: list[str] = []
    star_done = False
    for param in signature.parameters.values():
        if param.kind is param.KEYWORD_ONLY and not star_done:
            params.append("*")
            star_done = True
        text = param.name
        if param.annotation is not inspect.Parameter.empty:
            text += f": {param.annotation}"
        if param.default is not inspect.Parameter.empty:
            text += f" = {param.default!r}"
        params.append(text)
    returns = ""
    if signature.return_annotation is not inspect.Signature.empty:
        returns = f" -> {signature.return_annotation}"
    generator = inspect.isasyncgenfunction(fn)
    prefix = "async def" if generator or inspect.iscoroutinefunction(fn) else "def"
    # The first paragraph of the protocol's docstring, on one line.
    doc = " ".join((inspect.getdoc(fn) or "").split("\n\n")[0].split())
    body = f'raise NotImplementedError("{name}: not implemented yet")'
    if generator:
        body += "\n        yield  # an async generator: yield each result"
    head = f"    {prefix} {name}({', '.join(params)}){returns}:"
    if len(head) > 88:
        inner = "".join(f"        {p},\n" for p in params)
        head = f"    {prefix} {name}(\n{inner}    ){returns}:"
    lines = [head]
    if doc:
        lines.append(f'        """{doc}"""')
    lines.append(f"        {body}")
    return "\n".join(lines)


def backend_skeleton(kind: str, class_name: str) -> str:
    """Source of a backend class whose every abstract method raises NotImplementedError."""
    protocol = _protocol(kind)
    methods = [_method_source(name, getattr(protocol, name)) for name in _contract_methods(kind)]
    # A store hands runstore.open's store_index/store_ttl to StoreBase, which checks them.
    construct = (
        ["index, ttl = store_config(options)", "return cls(index=index, ttl=ttl)"]
        if kind == "store"
        else ["return cls()"]
    )
    opener = "\n".join(
        [
            "",
            "@classmethod",
            f"async def open(cls, url: BackendURL, options: BackendOptions) -> {class_name}:",
            '    """Open the backend for ``url``; runstore calls this through the registry."""',
            "    url.check_options(set())",
            *(f"    {line}" for line in construct),
            *_WRITTEN.get(kind, []),
        ]
    )
    return (
        f'"""The {kind} backend. Fill in each method; `runstore check` tells you what is left."""\n\n'
        "from __future__ import annotations\n\n"
        f"{_HEADER[kind]}\n\n"
        f"class {class_name}({protocol.__name__}):\n"
        + _CLASS_DOC.get(kind, f'    """A runstore {protocol.__name__}."""\n')
        + textwrap.indent(opener, "    ").rstrip()
        + "\n\n"
        + "\n\n".join(methods)
        + "\n"
    )


def new_plugin(name: str, directory: Path, *, kind: str = "events") -> list[Path]:
    """Write the project ``runstore-NAME`` under ``directory``; return the files written."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or keyword.iskeyword(name):
        raise ConfigError(
            f"plugin name {name!r} must be a lowercase identifier ([a-z][a-z0-9_]*); "
            "it becomes the URL scheme and the package suffix"
        )
    if kind not in KINDS:
        raise ConfigError(f"unknown kind {kind!r}; accepted: {', '.join(KINDS)}")
    module, _, hook, registry = KINDS[kind]
    package = f"runstore_{name}"
    class_name = "".join(part.title() for part in name.split("_")) + CLASS_SUFFIX[kind]
    root = directory / f"runstore-{name.replace('_', '-')}"
    if root.exists() and any(root.iterdir()):
        raise ConfigError(f"{root} exists and is not empty; choose another directory")
    scheme = name.replace("_", "-")
    files = {
        "pyproject.toml": f'''\
            [build-system]
            requires = ["setuptools>=69"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "runstore-{scheme}"
            version = "0.1.0"
            description = "A runstore {kind} backend: {scheme}://"
            requires-python = ">=3.11"
            dependencies = ["runstore"]

            [project.optional-dependencies]
            test = ["runstore[conformance]"]

            # runstore finds the plugin through this entry point.
            [project.entry-points.runstore]
            {name} = "{package}"

            [tool.setuptools]
            packages = ["{package}"]

            [tool.pytest.ini_options]
            testpaths = ["tests"]

            # The conformance suite reads this: the URLs to check, and known failures
            # as data (each becomes a strict xfail), e.g.
            # xfail = {{ "test_events.py::*::test_something*" = "why" }}
            [tool.runstore.conformance]
            backends = ["{scheme}://"]
        ''',
        f"{package}/__init__.py": f'''\
            """runstore plugin `{name}`: registers the {scheme}:// {kind} backend."""

            from __future__ import annotations

            from runstore.hookspecs import hookimpl
            from runstore.registry import {registry}


            @hookimpl
            def {hook}(registry: {registry}) -> None:
                registry.add(
                    "{name}",
                    schemes=["{scheme}"],
                    # Imported on first open, so listing backends never imports your driver.
                    factory="{package}.{module}:{class_name}.open",
                    # Declare only what you implement; the suite verifies each one.
                    capabilities=[],
                    description="{scheme}:// {kind} backend",
                )
        ''',
        f"{package}/{module}.py": None,
        "tests/test_conformance.py": f'''\
            """Run runstore's conformance suite against {scheme}:// (see [tool.runstore.conformance])."""

            from runstore.conformance.{SUITES[kind]} import *  # noqa: F403
        ''',
        ".github/workflows/conformance.yml": f'''\
            name: runstore conformance
            on: [push, pull_request]
            jobs:
              conformance:
                runs-on: ubuntu-latest
                steps:
                  - uses: actions/checkout@v4
                  - uses: actions/setup-python@v5
                    with:
                      python-version: "3.11"
                  - run: pip install -e '.[test]'
                  - run: runstore check {scheme}:// --profile runstore-ci --junit-xml conformance.xml
        ''',
        "README.md": f'''\
            # runstore-{scheme}

            A [runstore](https://pypi.org/project/runstore/) {kind} backend for `{scheme}://` URLs.

            ```bash
            pip install -e '.[test]'
            runstore backends              # lists {name}
            runstore check {scheme}://     # the conformance matrix
            pytest                         # the same suite under pytest
            ```
        ''',
    }
    written: list[Path] = []
    for relative, content in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        text = backend_skeleton(kind, class_name) if content is None else textwrap.dedent(content)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
