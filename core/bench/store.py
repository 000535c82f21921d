"""`runstore bench store`: the long-term memory store next to LangGraph's own.

Each case (one backend, one repetition) runs in a fresh child process and measures, on
runstore's store and on LangGraph's store for the same database (``AsyncSqliteStore``
in a file of its own, ``AsyncPostgresStore`` in a schema of its own), one after the
other in that process:

- ``put``: ``--items`` ``aput`` calls of a small value, spread over 20 namespaces;
- ``get``: ``--calls`` ``aget`` calls of random stored keys;
- ``filtered_search``: ``--calls`` ``asearch`` calls with an equality filter matching a
  tenth of the items, ``limit=10``;
- ``semantic_search``: ``--queries`` ``asearch(query=...)`` calls, ``limit=10``, over
  ``--items`` items embedded as ``--dims``-dimension vectors (an embeddings function
  handing out precomputed random vectors, so no model is timed), next to a numpy
  brute-force scan of the same vectors held in memory (backend ``numpy``).

Rows carry a reference, so `runstore bench summarize` prints same-run ratios: runstore
against LangGraph per op, semantic search against the numpy scan. LangGraph's semantic
search needs sqlite-vec loaded through ``enable_load_extension`` (absent from Pythons
built without loadable extensions) or pgvector on the server; where that is missing its
row is left out and the case's ``notes`` say why.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import numpy as np

from runstore.bench.events import _measurement, _time_calls
from runstore.bench.targets import (
    POSTGRES_SCHEMES,
    fresh_schema,
    is_file_url,
    postgres_create_schema,
    postgres_drop_schema,
    postgres_dsn,
    relocate,
)

#: Namespaces the items are spread over.
USERS = 20
#: Items that share a filter value (``kind``): a filtered search matches 1/KINDS of them.
KINDS = 10
#: Results per search.
K = 10
#: Items per loading batch of the semantic case.
LOAD_BATCH = 500


def _value(i: int) -> dict[str, Any]:
    return {"text": f"memory {i} about topic {i % 97}", "kind": i % KINDS, "n": i}


class _Vectors:
    """Precomputed unit-free random vectors, handed out by text (the embeddings function)."""

    def __init__(self, items: int, queries: int, dims: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.matrix = rng.standard_normal((items, dims)).astype(np.float32)
        self.queries = rng.standard_normal((queries, dims)).astype(np.float32)
        self._by_text = {_value(i)["text"]: self.matrix[i] for i in range(items)}
        self._by_text.update({f"query {q}": self.queries[q] for q in range(queries)})

    def embed(self, texts: list[str]) -> list[list[float]]:
        return [self._by_text[t].tolist() for t in texts]


def _index(vectors: _Vectors, dims: int) -> Any:
    """The ``IndexConfig`` both stores get."""
    return {"dims": dims, "embed": vectors.embed, "fields": ["text"]}


async def _timed(
    label: str, op: str, n: int, call: Callable[[int], Awaitable[Any]], reference: dict[str, str] | None
) -> dict[str, Any]:
    durations = await _time_calls(n, call, budget=None)
    return _measurement(op, "1", label, durations, units=len(durations), metric="rate_per_s", reference=reference)


async def _kv_ops(store: Any, label: str, params: dict[str, Any], peer: str | None) -> list[dict[str, Any]]:
    """put, get and filtered search on ``store``; ``peer``: the backend label its ratios refer to."""
    items, calls = int(params["items"]), int(params["calls"])
    prefix = "b" + uuid.uuid4().hex[:8]
    rng = random.Random(params.get("seed", 1))

    def ref(op: str) -> dict[str, str] | None:
        return None if peer is None else {"backend": peer, "op": op, "variant": "1"}

    async def put(i: int) -> None:
        await store.aput((prefix, f"u{i % USERS}"), f"k{i}", _value(i), index=False)

    async def get(_: int) -> None:
        i = rng.randrange(items)
        assert await store.aget((prefix, f"u{i % USERS}"), f"k{i}") is not None

    async def search(i: int) -> None:
        found = await store.asearch((prefix,), filter={"kind": i % KINDS}, limit=K)
        assert len(found) == min(K, len(range(i % KINDS, items, KINDS)))

    return [
        await _timed(label, "put", items, put, ref("put")),
        await _timed(label, "get", calls, get, ref("get")),
        await _timed(label, "filtered_search", calls, search, ref("filtered_search")),
    ]


async def _semantic(
    store: Any, label: str, vectors: _Vectors, params: dict[str, Any], reference: dict[str, str] | None
) -> dict[str, Any]:
    from langgraph.store.base import PutOp

    items, queries = int(params["items"]), int(params["queries"])
    prefix = "s" + uuid.uuid4().hex[:8]
    for start in range(0, items, LOAD_BATCH):
        await store.abatch(
            [PutOp((prefix, f"u{i % USERS}"), f"k{i}", _value(i)) for i in range(start, min(items, start + LOAD_BATCH))]
        )

    async def search(q: int) -> None:
        found = await store.asearch((prefix,), query=f"query {q % queries}", limit=K)
        assert len(found) == min(K, items)

    return await _timed(label, "semantic_search", queries, search, reference)


async def _numpy_scan(vectors: _Vectors, queries: int) -> dict[str, Any]:
    """The brute-force reference: cosine of each query against every vector held in memory."""
    matrix = vectors.matrix
    norms = np.linalg.norm(matrix, axis=1)

    async def scan(q: int) -> None:
        query = vectors.queries[q % len(vectors.queries)]
        scores = (matrix @ query) / (norms * float(np.linalg.norm(query)))
        top = np.argpartition(-scores, K)[:K]
        top[np.argsort(-scores[top])]

    return await _timed("numpy", "semantic_search", queries, scan, None)


async def run_store_case(case: dict[str, Any]) -> dict[str, Any]:
    """Benchmark one backend's memory store and LangGraph's peer; return the measurements."""
    from runstore.options import BackendOptions
    from runstore.settings import Settings
    from runstore.urls import BackendURL

    url = BackendURL.parse(case["backend_url"])
    work_dir = Path(case["work_dir"])
    await asyncio.to_thread(work_dir.mkdir, parents=True, exist_ok=True)
    dims, items, queries = int(case["dims"]), int(case["items"]), int(case["queries"])
    vectors = _Vectors(items, queries, dims, int(case.get("seed", 1)))
    postgres = url.scheme in POSTGRES_SCHEMES
    name = "postgres" if postgres else "sqlite"
    if postgres:
        from runstore.plugins.postgres.store import PostgresStore as opener
    else:
        from runstore.plugins.sqlite.store import SqliteStore as opener  # type: ignore[assignment]
    ours, theirs = f"runstore {name}", f"langgraph {name}"
    notes: list[str] = []
    measurements: list[dict[str, Any]] = []
    schemas: list[str] = []
    dsn = postgres_dsn(url) if postgres else None
    try:
        async with AsyncExitStack() as stack:
            if postgres:
                schemas.append(fresh_schema("rsbench_store"))
                url = url.with_query(schema=schemas[-1])
            elif is_file_url(url):
                url, _ = relocate(url, work_dir, "store.db")
            options = await stack.enter_async_context(BackendOptions.scope(Settings.load(None)))
            plain = await opener.open(url, options)
            measurements += await _kv_ops(plain, ours, case, theirs)
            peer = await stack.enter_async_context(await _peer(name, dsn, work_dir, schemas, None))
            measurements += await _kv_ops(peer, theirs, case, None)
            indexed = await opener.open(url, options, index=_index(vectors, dims))
            measurements.append(
                await _semantic(indexed, ours, vectors, case, {"backend": "numpy", "op": "semantic_search", "variant": "1"})
            )
            measurements.append(await _numpy_scan(vectors, queries))
            try:
                peer_indexed = await stack.enter_async_context(
                    await _peer(name, dsn, work_dir, schemas, _index(vectors, dims))
                )
                measurements.append(await _semantic(peer_indexed, theirs, vectors, case, None))
            except Exception as exc:  # no sqlite-vec loading or no pgvector: say so
                notes.append(f"{theirs} semantic search not measured: {type(exc).__name__}: {exc}"[:300])
    finally:
        if dsn is not None:
            for schema in schemas:
                await postgres_drop_schema(dsn, schema)
    return {"status": "ok", "measurements": measurements, "notes": notes}


async def _peer(
    name: str, dsn: str | None, work_dir: Path, schemas: list[str], index: dict[str, Any] | None
) -> Any:
    """An async context manager opening LangGraph's store (set up) on a fresh file or schema."""
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def opened() -> Any:
        if name == "sqlite":
            from langgraph.store.sqlite.aio import AsyncSqliteStore

            path = work_dir / f"langgraph-{uuid.uuid4().hex[:8]}.db"
            async with AsyncSqliteStore.from_conn_string(str(path), index=index) as store:  # type: ignore[arg-type]
                await store.setup()
                yield store
            return
        from langgraph.store.postgres.aio import AsyncPostgresStore

        assert dsn is not None
        schema = fresh_schema("rsbench_lgstore")
        await postgres_create_schema(dsn, schema)
        schemas.append(schema)
        sep = "&" if "?" in dsn else "?"
        conn = f"{dsn}{sep}options=-csearch_path%3D{schema}"
        async with AsyncPostgresStore.from_conn_string(conn, index=index) as store:  # type: ignore[arg-type]
            await store.setup()
            yield store

    return opened()
