"""A batch's ops checked before any I/O, namespace listings, and the batch's plan.

`check_ops` turns LangGraph's ops into checked ones (or raises `InvalidStoreInputError`
before anything is read or written). A runstore store applies a batch's ops in order:
each sees the puts before it. `plan_batch` cuts the ordered ops into runs a backend may
execute together without changing that (consecutive reads; consecutive puts, the last
put of a key winning), which is how one batch becomes few statements.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from langgraph.store.base import GetOp, ListNamespacesOp, MatchCondition, Op, PutOp, SearchOp

from runstore.errors import InvalidStoreInputError
from runstore.store.filters import Condition, compile_filter
from runstore.store.indexing import check_index_arg
from runstore.store.inputs import (
    WILDCARD,
    check_key,
    check_labels,
    check_minutes,
    check_namespace,
    check_page,
    check_value,
)


@dataclass(frozen=True)
class Get:
    """A checked `GetOp`."""

    namespace: tuple[str, ...]
    key: str
    refresh_ttl: bool


@dataclass(frozen=True)
class Put:
    """A checked `PutOp`: ``value`` ``None`` deletes; ``ttl`` in minutes (``None``: none)."""

    namespace: tuple[str, ...]
    key: str
    value: dict[str, Any] | None
    index: tuple[str, ...] | bool | None
    ttl: float | None


@dataclass(frozen=True)
class Search:
    """A checked `SearchOp`."""

    prefix: tuple[str, ...]
    conditions: tuple[Condition, ...]
    query: str | None
    limit: int
    offset: int
    refresh_ttl: bool


@dataclass(frozen=True)
class ListNamespaces:
    """A checked `ListNamespacesOp`: ``("prefix" | "suffix", labels)`` conditions."""

    conditions: tuple[tuple[str, tuple[str, ...]], ...]
    max_depth: int | None
    limit: int
    offset: int


Checked = Get | Put | Search | ListNamespaces


def _refresh(value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidStoreInputError(f"refresh_ttl must be True or False, not {value!r}")
    return value


def check_op(op: Op) -> Checked:
    """One LangGraph op, checked; an op of another type is an `InvalidStoreInputError`."""
    if isinstance(op, GetOp):
        return Get(check_labels(op.namespace, "namespace"), check_key(op.key), _refresh(op.refresh_ttl))
    if isinstance(op, PutOp):
        namespace, key = check_namespace(op.namespace), check_key(op.key)
        if op.value is None:
            return Put(namespace, key, None, None, None)
        return Put(
            namespace, key, check_value(op.value), check_index_arg(op.index), check_minutes(op.ttl, "ttl")
        )
    if isinstance(op, SearchOp):
        if op.query is not None and not isinstance(op.query, str):
            raise InvalidStoreInputError(f"search query must be a string or None, not {op.query!r}")
        limit, offset = check_page(op.limit, op.offset, "search")
        return Search(
            check_labels(op.namespace_prefix, "namespace prefix"),
            compile_filter(op.filter),
            op.query or None,
            limit,
            offset,
            _refresh(op.refresh_ttl),
        )
    if isinstance(op, ListNamespacesOp):
        conditions: list[tuple[str, tuple[str, ...]]] = []
        for condition in op.match_conditions or ():
            if not isinstance(condition, MatchCondition) or condition.match_type not in ("prefix", "suffix"):
                raise InvalidStoreInputError(
                    f"list_namespaces takes MatchCondition('prefix' | 'suffix', labels), not {condition!r}"
                )
            conditions.append((condition.match_type, check_labels(condition.path, condition.match_type)))
        depth = op.max_depth
        if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 1):
            raise InvalidStoreInputError(f"max_depth must be a whole number >= 1 or None, not {depth!r}")
        limit, offset = check_page(op.limit, op.offset, "list_namespaces")
        return ListNamespaces(tuple(conditions), depth, limit, offset)
    raise InvalidStoreInputError(
        f"a store batch takes GetOp, PutOp, SearchOp and ListNamespacesOp, not {type(op).__name__}"
    )


def check_ops(ops: Iterable[Op]) -> list[Checked]:
    """Every op of a batch checked, before any of them runs."""
    return [check_op(op) for op in ops]


def matches_labels(namespace: Sequence[str], match_type: str, labels: Sequence[str]) -> bool:
    """Whether ``namespace`` starts (``prefix``) or ends (``suffix``) with ``labels``,
    ``*`` matching any one label."""
    if len(namespace) < len(labels):
        return False
    part = namespace[: len(labels)] if match_type == "prefix" else namespace[len(namespace) - len(labels) :]
    return all(want in (WILDCARD, got) for got, want in zip(part, labels, strict=True))


def list_namespaces(namespaces: Iterable[tuple[str, ...]], op: ListNamespaces) -> list[tuple[str, ...]]:
    """The answer to ``op`` over the namespaces holding items: matching ones, cut to
    ``max_depth`` labels, distinct, in tuple order, then paged."""
    found = {
        ns[: op.max_depth] if op.max_depth is not None else ns
        for ns in namespaces
        if all(matches_labels(ns, kind, labels) for kind, labels in op.conditions)
    }
    return sorted(found)[op.offset : op.offset + op.limit]


def within(namespace: Sequence[str], prefix: Sequence[str]) -> bool:
    """Whether ``namespace`` is ``prefix`` or lies under it (a search's scope)."""
    return tuple(namespace[: len(prefix)]) == tuple(prefix)


def plan_batch(ops: Sequence[Checked]) -> list[list[tuple[int, Checked]]]:
    """Cut ordered ops into runs executable together, keeping each op's position.

    A run is consecutive reads (`Get`, `Search`, `ListNamespaces`) or consecutive puts;
    within a put run only the last put of each ``(namespace, key)`` is kept, since no read
    between them could see the earlier ones.
    """
    runs: list[list[tuple[int, Checked]]] = []
    for position, op in enumerate(ops):
        writing = isinstance(op, Put)
        if runs and isinstance(runs[-1][0][1], Put) == writing:
            runs[-1].append((position, op))
        else:
            runs.append([(position, op)])
    for run in runs:
        if isinstance(run[0][1], Put):
            last: dict[tuple[tuple[str, ...], str], int] = {}
            for i, (_, op) in enumerate(run):
                assert isinstance(op, Put)
                last[(op.namespace, op.key)] = i
            run[:] = [entry for i, entry in enumerate(run) if last[(entry[1].namespace, entry[1].key)] == i]  # type: ignore[union-attr]
    return runs
