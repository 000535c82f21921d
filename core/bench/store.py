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
  brute-force scan of the same vectors held in memory (backend ``numpy``), which embeds
  its query through the same wrapper, so the embedding call costs both sides alike.

After the puts both databases are analyzed (``ANALYZE``: the planner statistics a
database that has run a while has; a fresh PostgreSQL table planned a filtered search
8 times slower without them). Each op alternates between the two stores call by call (who goes first alternating
too), so a machine whose load changes during the run slows both alike. Rows carry a
reference, so `runstore bench summarize` prints same-run ratios: runstore against
LangGraph per op, semantic search against the numpy scan (timed alternating with it). LangGraph's semantic
search needs sqlite-vec loaded through ``enable_load_extension`` (absent from Pythons
built without loadable extensions) or pgvector on the server; where that is missing its
row is left out and the case's ``notes`` say why.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import numpy as np

from runstore.bench.events import _measurement
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

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [self._by_text[t].tolist() for t in texts]


def _index(vectors: _Vectors, dims: int) -> Any:
    """The ``IndexConfig`` both stores get."""
    return {"dims": dims, "embed": vectors.embed, "fields": ["text"]}


Call = Callable[[int], Awaitable[Any]]


async def _alternating(n: int, first: Call, second: Call) -> tuple[list[float], list[float]]:
    """``n`` calls of each, alternating call by call (who goes first alternating too), so a
    machine whose load changes during the run slows both alike; durations of each."""
    times: tuple[list[float], list[float]] = ([], [])
    for i in range(n):
        order = ((0, first), (1, second)) if i % 2 == 0 else ((1, second), (0, first))
        for side, call in order:
            t0 = time.perf_counter()
            await call(i)
            times[side].append(time.perf_counter() - t0)
    return times


def _pair(
    op: str, labels: tuple[str, str], times: tuple[list[float], list[float]]
) -> list[dict[str, Any]]:
    """Rows for one op on both targets; the first's ratio refers to the second."""
    ours, theirs = labels
    reference = {"backend": theirs, "op": op, "variant": "1"}
    return [
        _measurement(op, "1", ours, times[0], units=len(times[0]), metric="rate_per_s", reference=reference),
        _measurement(op, "1", theirs, times[1], units=len(times[1]), metric="rate_per_s", reference=None),
    ]


def _kv_calls(store: Any, params: dict[str, Any]) -> dict[str, Call]:
    """put, get and filtered search calls on ``store`` (its own namespace root)."""
    items = int(params["items"])
    prefix = "b" + uuid.uuid4().hex[:8]
    rng = random.Random(params.get("seed", 1))

    async def put(i: int) -> None:
        await store.aput((prefix, f"u{i % USERS}"), f"k{i}", _value(i), index=False)

    async def get(_: int) -> None:
        i = rng.randrange(items)
        assert await store.aget((prefix, f"u{i % USERS}"), f"k{i}") is not None

    async def search(i: int) -> None:
        found = await store.asearch((prefix,), filter={"kind": i % KINDS}, limit=K)
        assert len(found) == min(K, len(range(i % KINDS, items, KINDS)))

    return {"put": put, "get": get, "filtered_search": search}


async def _kv_ops(
    ours: Any,
    theirs: Any,
    labels: tuple[str, str],
    params: dict[str, Any],
    analyze: Callable[[], Awaitable[None]],
) -> list[dict[str, Any]]:
    """put, get and filtered search, runstore's store and LangGraph's alternating;
    ``analyze`` runs after the puts (both databases' statistics, as autovacuum would)."""
    a, b = _kv_calls(ours, params), _kv_calls(theirs, params)
    counts = {"put": int(params["items"]), "get": int(params["calls"]), "filtered_search": int(params["calls"])}
    rows: list[dict[str, Any]] = []
    for op, n in counts.items():
        rows += _pair(op, labels, await _alternating(n, a[op], b[op]))
        if op == "put":
            await analyze()
    return rows


async def _analyze(dsn: str | None, schemas: list[str], files: list[Path]) -> None:
    """``ANALYZE`` every table of ``schemas`` (PostgreSQL) or of ``files`` (sqlite): the
    planner statistics a database that has run a while has, for both stores alike."""
    if dsn is not None:
        import asyncpg

        conn = await asyncpg.connect(dsn)
        try:
            tables = await conn.fetch(
                "SELECT schemaname, tablename FROM pg_catalog.pg_tables WHERE schemaname = ANY($1::text[])",
                schemas,
            )
            for schema, table in tables:
                await conn.execute(f'ANALYZE "{schema}"."{table}"')
        finally:
            await conn.close()
        return

    def run() -> None:
        import sqlite3

        for path in files:
            with sqlite3.connect(path) as conn:
                conn.execute("ANALYZE")

    await asyncio.to_thread(run)


async def _load(store: Any, items: int) -> str:
    """Put ``items`` embedded items in a fresh namespace root; return its label."""
    from langgraph.store.base import PutOp

    prefix = "s" + uuid.uuid4().hex[:8]
    for start in range(0, items, LOAD_BATCH):
        await store.abatch(
            [PutOp((prefix, f"u{i % USERS}"), f"k{i}", _value(i)) for i in range(start, min(items, start + LOAD_BATCH))]
        )
    return prefix


def _semantic_call(store: Any, prefix: str, items: int, queries: int) -> Call:
    async def search(q: int) -> None:
        found = await store.asearch((prefix,), query=f"query {q % queries}", limit=K)
        assert len(found) == min(K, items)

    return search


def _numpy_call(vectors: _Vectors) -> Call:
    """The brute-force reference: cosine of a query against every vector held in memory.

    The query is embedded through the same wrapper the stores use (LangGraph's
    ``ensure_embeddings``, which runs a plain function on an executor thread), so the
    embedding costs both sides alike."""
    from langgraph.store.base import ensure_embeddings

    embeddings = ensure_embeddings(vectors.embed)
    matrix = vectors.matrix
    norms = np.linalg.norm(matrix, axis=1)

    async def scan(q: int) -> None:
        query = np.asarray(await embeddings.aembed_query(f"query {q % len(vectors.queries)}"), dtype=np.float32)
        scores = (matrix @ query) / (norms * float(np.linalg.norm(query)))
        top = np.argpartition(-scores, K)[:K]
        top[np.argsort(-scores[top])]

    return scan


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
    files: list[Path] = []
    dsn = postgres_dsn(url) if postgres else None
    try:
        async with AsyncExitStack() as stack:
            if postgres:
                schemas.append(fresh_schema("rsbench_store"))
                url = url.with_query(schema=schemas[-1])
            elif is_file_url(url):
                url, path = relocate(url, work_dir, "store.db")
                files.append(path)
            options = await stack.enter_async_context(BackendOptions.scope(Settings.load(None)))
            plain = await opener.open(url, options)
            peer = await stack.enter_async_context(await _peer(name, dsn, work_dir, schemas, None, files))
            measurements += await _kv_ops(
                plain, peer, (ours, theirs), case, lambda: _analyze(dsn, schemas, files)
            )
            indexed = await opener.open(url, options, index=_index(vectors, dims))
            search = _semantic_call(indexed, await _load(indexed, items), items, queries)
            measurements += _pair(
                "semantic_search", (ours, "numpy"), await _alternating(queries, search, _numpy_call(vectors))
            )
            try:
                peer_indexed = await stack.enter_async_context(
                    await _peer(name, dsn, work_dir, schemas, _index(vectors, dims), [])
                )
                theirs_search = _semantic_call(peer_indexed, await _load(peer_indexed, items), items, queries)
                times = await _alternating(queries, search, theirs_search)
                measurements.append(
                    _measurement("semantic_search", "1", theirs, times[1], units=len(times[1]),
                                 metric="rate_per_s", reference=None)
                )
            except Exception as exc:  # no sqlite-vec loading or no pgvector: say so
                notes.append(f"{theirs} semantic search not measured: {type(exc).__name__}: {exc}"[:300])
    finally:
        if dsn is not None:
            for schema in schemas:
                await postgres_drop_schema(dsn, schema)
    return {"status": "ok", "measurements": measurements, "notes": notes}


async def _peer(
    name: str,
    dsn: str | None,
    work_dir: Path,
    schemas: list[str],
    index: dict[str, Any] | None,
    files: list[Path],
) -> Any:
    """An async context manager opening LangGraph's store (set up) on a fresh file or schema."""
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def opened() -> Any:
        if name == "sqlite":
            from langgraph.store.sqlite.aio import AsyncSqliteStore

            path = work_dir / f"langgraph-{uuid.uuid4().hex[:8]}.db"
            files.append(path)
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
