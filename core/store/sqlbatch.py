"""One `abatch` of a SQL memory store, prepared before it reaches the database.

A SQL store turns LangGraph's ops into *steps* here, on the event loop, before any
statement runs: every op is validated, the texts of the batch's puts are embedded in
one call and each search's query once, and each filter is rendered to SQL
(`runstore.store.sqlplan`). Only then does the store run the steps, in order, in one
transaction. So bad input (an invalid namespace, a value that is not JSON, a filter
operator that does not exist, an embedding of the wrong length, an index field the
value lacks) is raised before anything is written, and a batch's ops see each other
in order because they run one after another in that transaction.

`Scorer` ranks embedded items for a search in Python (numpy) where the database has
no vector function; `list_namespaces` applies a `ListNamespacesOp` to the distinct
namespaces a database returned.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from langgraph.store.base import Item, Op, SearchItem

from runstore.clock import from_micros
from runstore.store.filters import Condition, matches
from runstore.store.indexing import IndexRules, check_vectors, texts_to_embed
from runstore.store.ops import Get, ListNamespaces, Put, Search, check_ops
from runstore.store.ops import list_namespaces as _list_namespaces
from runstore.store.sqlplan import FilterSql, RenderedFilter, encode_namespace
from runstore.validation import dumps, loads

if TYPE_CHECKING:
    import numpy as np

#: Microseconds in a minute (TTLs are minutes, stamps microseconds).
MINUTE_MICROS = 60_000_000


@dataclass(frozen=True)
class GetStep:
    """A `GetOp`: read one item (refreshing its TTL if asked)."""

    namespace: tuple[str, ...]
    prefix: bytes
    key: str
    refresh: bool


@dataclass(frozen=True)
class PutStep:
    """A `PutOp`: write (``value_text`` set) or delete (``None``) one item.

    ``vectors``: the item's embedded fields (``None``: not indexed, old vectors dropped).
    """

    namespace: tuple[str, ...]
    prefix: bytes
    key: str
    value_text: str | None
    ttl_minutes: float | None
    vectors: list[tuple[str, np.ndarray]] | None


@dataclass(frozen=True)
class SearchStep:
    """A `SearchOp`: its namespace prefix, rendered filter and paging, and the query's
    embedding when it is a semantic search."""

    namespace_prefix: tuple[str, ...]
    conditions: tuple[Condition, ...]
    rendered: RenderedFilter
    query_vector: np.ndarray | None
    limit: int
    offset: int
    refresh: bool

    def keep(self, value: dict[str, Any]) -> bool:
        """Whether an item the SQL returned passes the whole filter (the shared evaluator)."""
        return self.rendered.exact or matches(self.conditions, value)


@dataclass(frozen=True)
class ListStep:
    """A `ListNamespacesOp`, applied to the distinct namespaces the database returns."""

    op: ListNamespaces


Step = GetStep | PutStep | SearchStep | ListStep


async def prepare(ops: Iterable[Op], index: IndexRules | None, filters: FilterSql) -> list[Step]:
    """Check and embed ``ops``; one step per op, in order (module docstring). ``index``:
    the store's index rules (``None``: no semantic search).

    Raises `InvalidStoreInputError` for bad input before anything is written.
    """
    checked = check_ops(ops)
    # Texts to embed: (op position, field path, text); each query once.
    texts: list[tuple[int, str, str]] = []
    queries: dict[str, np.ndarray | None] = {}
    for position, op in enumerate(checked):
        if isinstance(op, Put) and op.value is not None and index is not None:
            texts.extend((position, path, text) for path, text in texts_to_embed(op.value, op.index, index))
        elif isinstance(op, Search) and op.query and index is not None:
            queries.setdefault(op.query, None)
    vectors = await _embed(index, [text for _, _, text in texts], list(queries))
    by_op: dict[int, list[tuple[str, np.ndarray]]] = {}
    for (position, path, _), vector in zip(texts, vectors[: len(texts)], strict=True):
        by_op.setdefault(position, []).append((path, vector))
    for query, vector in zip(queries, vectors[len(texts) :], strict=True):
        queries[query] = vector
    steps: list[Step] = []
    for position, op in enumerate(checked):
        if isinstance(op, Get):
            steps.append(GetStep(op.namespace, encode_namespace(op.namespace), op.key, op.refresh_ttl))
        elif isinstance(op, Put):
            indexed = index is not None and op.value is not None and op.index is not False
            steps.append(
                PutStep(
                    namespace=op.namespace,
                    prefix=encode_namespace(op.namespace),
                    key=op.key,
                    value_text=None if op.value is None else dumps(op.value),
                    ttl_minutes=op.ttl,
                    vectors=by_op.get(position, []) if indexed else None,
                )
            )
        elif isinstance(op, Search):
            steps.append(
                SearchStep(
                    namespace_prefix=op.prefix,
                    conditions=op.conditions,
                    rendered=filters.render(op.conditions),
                    query_vector=queries.get(op.query) if op.query else None,
                    limit=op.limit,
                    offset=op.offset,
                    refresh=op.refresh_ttl,
                )
            )
        else:
            steps.append(ListStep(op))
    return steps


async def _embed(
    index: IndexRules | None, documents: Sequence[str], queries: Sequence[str]
) -> list[np.ndarray]:
    """Embed ``documents`` (one call) and each of ``queries``; the vectors checked against
    the index's ``dims`` (`runstore.store.indexing.check_vectors`), as float32."""
    if index is None or not (documents or queries):
        return []
    embeddings = index.embeddings
    calls: list[Any] = []
    if documents:
        calls.append(embeddings.aembed_documents(list(documents)))
    calls.extend(embeddings.aembed_query(query) for query in queries)
    results = await asyncio.gather(*calls)
    raw: list[Sequence[float]] = []
    if documents:
        raw.extend(results[0])
        results = results[1:]
    raw.extend(results)
    checked = check_vectors(raw, len(documents) + len(queries), index.dims)
    import numpy as np  # semantic search only (runstore[vectors])

    return [np.asarray(vector, dtype=np.float32) for vector in checked]


def expires_at(now_micros: int, ttl_minutes: float | None) -> int | None:
    """The expiry stamp of an item written or refreshed at ``now_micros``: the TTL in whole
    microseconds, half rounded up (`EXPIRY_SQL` computes the same in SQL)."""
    if ttl_minutes is None:
        return None
    return now_micros + math.floor(ttl_minutes * MINUTE_MICROS + 0.5)


def expiry_sql(ttl_column: str) -> str:
    """`expires_at` in SQL, for a ``now`` parameter (``?``) and the TTL column ``ttl_column``."""
    return f"? + CAST(floor({ttl_column} * {MINUTE_MICROS} + 0.5) AS BIGINT)"


def item_of(prefix_namespace: tuple[str, ...], key: str, value: str | bytes | dict[str, Any], created: int, updated: int) -> Item:
    """An `Item` from a row's columns (stamps in microseconds)."""
    return Item(
        value=value if isinstance(value, dict) else loads(value),
        key=key,
        namespace=prefix_namespace,
        created_at=_stamp(created),
        updated_at=_stamp(updated),
    )


def search_item_of(item: Item, score: float | None) -> SearchItem:
    """``item`` as a `SearchItem` with ``score``."""
    return SearchItem(
        namespace=item.namespace,
        key=item.key,
        value=item.value,
        created_at=item.created_at,
        updated_at=item.updated_at,
        score=score,
    )


def _stamp(micros: int) -> datetime:
    return from_micros(int(micros))


class Scorer:
    """Cosine scores of embedded fields against one query, best field per item."""

    def __init__(self, query: np.ndarray) -> None:
        import numpy as np

        norm = float(np.linalg.norm(query))
        self._query = query / norm if norm else query

    def best(self, keys: Sequence[Any], blobs: Sequence[bytes], dims: int) -> dict[Any, float]:
        """The highest cosine similarity per key over ``blobs`` (float32 vectors of ``dims``);
        a blob of another length (written under other ``dims``) is skipped."""
        import numpy as np

        width = dims * 4
        kept = [(k, b) for k, b in zip(keys, blobs, strict=True) if len(b) == width]
        if not kept:
            return {}
        matrix = np.frombuffer(b"".join(b for _, b in kept), dtype=np.float32).reshape(len(kept), dims)
        norms = np.linalg.norm(matrix, axis=1)
        norms[norms == 0] = 1.0
        scores = (matrix @ self._query) / norms
        best: dict[Any, float] = {}
        for (key, _), score in zip(kept, scores.tolist(), strict=True):
            if key not in best or score > best[key]:
                best[key] = score
        return best


#: A row as the SQL stores read items: prefix, key, value (JSON text or decoded),
#: created_at, updated_at, ttl_minutes.
ItemRow = tuple[Any, ...]


def rank(
    rows: Sequence[ItemRow],
    vectors: Sequence[tuple[bytes, str, bytes]],
    step: SearchStep,
    dims: int,
) -> list[tuple[ItemRow, float | None]]:
    """A semantic search's page ranked in Python: ``rows`` (the candidates, already past the
    SQL conditions) kept by the whole filter, scored by their best vector in ``vectors``
    (``(prefix, key, float32 blob)``), best first, unembedded items last; ties in the
    order of a plain search (newest update first, then namespace and key)."""
    assert step.query_vector is not None
    kept = [row for row in rows if step.keep(decoded(row[2]))]
    best = Scorer(step.query_vector).best([(p, k) for p, k, _ in vectors], [b for _, _, b in vectors], dims)
    kept.sort(key=lambda r: (r[0], r[1]))
    kept.sort(key=lambda r: -int(r[4]))
    scored = [(row, best.get((row[0], row[1]))) for row in kept]
    scored.sort(key=lambda pair: (pair[1] is None, -(pair[1] or 0.0)))
    return page(scored, step)


def rank_keys(
    vectors: Sequence[Sequence[Any]], query: np.ndarray, dims: int, top: int
) -> tuple[list[tuple[bytes, str, float]], int]:
    """The ``top`` best ``(prefix, key, score)`` of the items with a vector in ``vectors``
    (rows of ``(prefix, key, updated_at, float32 blob)``; an item's score is its best
    vector's), best first, ties newest first, then by namespace and key (a plain search's
    order); and how many items have a vector. Scored with numpy, and only the items that
    can reach the ``top`` are sorted (sorting all 10,000 in Python cost more than scoring)."""
    import numpy as np

    width = dims * 4
    kept = [r for r in vectors if len(r[3]) == width]
    if not kept or top <= 0:
        return [], len({(r[0], r[1]) for r in kept})
    slots: dict[tuple[bytes, str], int] = {}
    item_of_row = np.fromiter(
        (slots.setdefault((r[0], r[1]), len(slots)) for r in kept), dtype=np.int64, count=len(kept)
    )
    matrix = np.frombuffer(b"".join(r[3] for r in kept), dtype=np.float32).reshape(len(kept), dims)
    norms = np.linalg.norm(matrix, axis=1)
    norms[norms == 0] = 1.0
    norm = float(np.linalg.norm(query))
    scores = (matrix @ (query / norm if norm else query)) / norms
    if len(slots) == len(kept):
        best = scores  # one vector per item: slots were handed out in row order
    else:
        best = np.full(len(slots), -np.inf, dtype=scores.dtype)
        np.maximum.at(best, item_of_row, scores)
    keys = list(slots)
    if top < len(keys):
        # Every item scoring at least the top-th best, ties included, then sorted exactly.
        cut = np.partition(-best, top - 1)[top - 1]
        chosen = np.nonzero(-best <= cut)[0].tolist()
    else:
        chosen = list(range(len(keys)))
    chosen_set = set(chosen)
    stamps: dict[int, int] = {}
    for row, i in enumerate(item_of_row.tolist()):
        if i in chosen_set:
            stamps[i] = int(kept[row][2])
    values = best.tolist()
    order = sorted(chosen, key=lambda i: (-values[i], -stamps[i], keys[i][0], keys[i][1]))[:top]
    return [(keys[i][0], keys[i][1], values[i]) for i in order], len(keys)


def page(rows: list[Any], step: SearchStep) -> list[Any]:
    """The ``offset``/``limit`` slice of a search's ordered matches."""
    return rows[step.offset : step.offset + step.limit]


def decoded(value: str | bytes | dict[str, Any]) -> Any:
    """A value column as read: JSON text, or already decoded by the driver."""
    return value if isinstance(value, dict) else loads(value)


def list_namespaces(namespaces: Iterable[tuple[str, ...]], op: ListNamespaces) -> list[tuple[str, ...]]:
    """``op`` applied to the distinct namespaces a store holds (the shared matching rules)."""
    return _list_namespaces(namespaces, op)
