"""Semantic search: the store's ``index`` config checked, the texts each put embeds, the
embedding vectors checked, and cosine scores.

Which texts an item embeds: the store's ``fields`` (default ``["$"]``, the whole value
as JSON), a field a value lacks being skipped; or the put's own ``index`` list, where a
field the value lacks is an error (it names what to embed, so a typo is caught);
``index=False`` embeds nothing. Field paths are LangGraph's (``"a.b"``, ``"a[*].b"``,
``"a[0]"``); a path matching several texts embeds each, and an item's score is the best
of its vectors'.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runstore.errors import InvalidStoreInputError

if TYPE_CHECKING:
    from langchain_core.embeddings import Embeddings

#: The keys of LangGraph's ``IndexConfig`` a runstore store reads.
INDEX_KEYS = ("dims", "embed", "fields")
WHOLE_VALUE = "$"


@dataclass(frozen=True)
class IndexRules:
    """A checked ``IndexConfig``: vector size, the embeddings and the default fields."""

    dims: int
    embeddings: Embeddings
    fields: tuple[str, ...] = (WHOLE_VALUE,)
    #: The config as given (``BaseStore.index_config``).
    config: Mapping[str, Any] | None = None

    @classmethod
    def of(cls, config: Mapping[str, Any] | None) -> IndexRules | None:
        """Check a LangGraph ``IndexConfig`` (``None``: no semantic search)."""
        if config is None:
            return None
        if not isinstance(config, Mapping):
            raise InvalidStoreInputError(
                f"index must be an IndexConfig dict ({', '.join(INDEX_KEYS)}), not {type(config).__name__}"
            )
        unknown = sorted(k for k in config if k not in INDEX_KEYS and not str(k).startswith("__"))
        if unknown:
            raise InvalidStoreInputError(
                f"index config has unknown keys {unknown}; accepted: {', '.join(INDEX_KEYS)}"
            )
        dims = config.get("dims")
        if isinstance(dims, bool) or not isinstance(dims, int) or dims < 1:
            raise InvalidStoreInputError(f"index dims must be a whole number >= 1, not {dims!r}")
        if config.get("embed") is None:
            raise InvalidStoreInputError(
                "index needs 'embed': a LangChain Embeddings, a function texts -> vectors "
                "(sync or async) or a provider string"
            )
        from langgraph.store.base import ensure_embeddings

        fields = check_fields(config.get("fields") or [WHOLE_VALUE], "index fields")
        return cls(dims, ensure_embeddings(config["embed"]), fields, dict(config))


def check_fields(fields: Any, what: str) -> tuple[str, ...]:
    """A list of field paths: non-empty strings."""
    if isinstance(fields, str) or not isinstance(fields, Sequence):
        raise InvalidStoreInputError(f"{what} must be a list of field paths, e.g. ['text'], not {fields!r}")
    for path in fields:
        if not isinstance(path, str) or not path:
            raise InvalidStoreInputError(f"{what} holds {path!r}; a field path is a non-empty string")
    return tuple(fields)


def check_index_arg(index: Any) -> tuple[str, ...] | bool | None:
    """A put's ``index`` argument: ``None`` (the store's fields), ``False`` or a field list."""
    if index is None or index is False:
        return index
    return check_fields(index, "put index")


def texts_to_embed(
    value: Mapping[str, Any], index: tuple[str, ...] | bool | None, rules: IndexRules
) -> list[tuple[str, str]]:
    """``(path, text)`` pairs a put of ``value`` embeds (a path matching several texts
    gives ``path.0``, ``path.1``...); a field of an explicit ``index`` list that the value
    lacks raises `InvalidStoreInputError`."""
    from langgraph.store.base import get_text_at_path

    if index is False:
        return []
    explicit = index is not None and index is not True
    fields = index if explicit else rules.fields
    out: list[tuple[str, str]] = []
    for path in fields:  # type: ignore[union-attr]
        texts = get_text_at_path(dict(value), path)
        if not texts and explicit:
            raise InvalidStoreInputError(
                f"put index names field {path!r}, which the value does not have (keys: "
                f"{', '.join(map(repr, value)) or 'none'}); index fields present in the value, "
                "or pass index=False"
            )
        if len(texts) == 1:
            out.append((path, texts[0]))
        else:
            out.extend((f"{path}.{i}", text) for i, text in enumerate(texts))
    return out


def check_vectors(vectors: Any, count: int, dims: int) -> list[list[float]]:
    """The embeddings' answer for ``count`` texts: ``count`` vectors of ``dims`` finite numbers."""
    if not isinstance(vectors, Sequence) or len(vectors) != count:
        got = len(vectors) if isinstance(vectors, Sequence) else type(vectors).__name__
        raise InvalidStoreInputError(f"the embeddings returned {got} vectors for {count} texts")
    out: list[list[float]] = []
    for vector in vectors:
        if not isinstance(vector, Sequence) or len(vector) != dims:
            size = len(vector) if isinstance(vector, Sequence) else type(vector).__name__
            raise InvalidStoreInputError(
                f"the embeddings returned a vector of {size} dimensions; the store's index has dims={dims}"
            )
        numbers = [float(x) for x in vector]
        if not all(math.isfinite(x) for x in numbers):
            raise InvalidStoreInputError("the embeddings returned a vector holding NaN or infinity")
        out.append(numbers)
    return out


def cosine(query: Sequence[float], vectors: Sequence[Sequence[float]]) -> list[float]:
    """Cosine similarity of ``query`` with each of ``vectors`` (0.0 against a zero vector)."""
    if not vectors:
        return []
    try:
        import numpy as np
    except ImportError:  # numpy is optional: the same arithmetic, slower
        qn = math.sqrt(sum(x * x for x in query))
        out = []
        for v in vectors:
            norm = math.sqrt(sum(x * x for x in v)) * qn
            out.append(sum(a * b for a, b in zip(query, v, strict=True)) / norm if norm else 0.0)
        return out
    q = np.asarray(query, dtype=np.float64)
    m = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(m, axis=1) * np.linalg.norm(q)
    dots = m @ q
    scores = np.divide(dots, norms, out=np.zeros_like(dots), where=norms != 0)
    return [float(s) for s in scores]
