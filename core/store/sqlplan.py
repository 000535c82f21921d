"""SQL text shared by the SQL long-term memory stores (sqlite, PostgreSQL).

Both SQL stores keep one row per item and one row per embedded field, with the
namespace stored as its labels joined by ``.`` (a label never holds a dot, so the text
decodes back to one tuple). This module turns the parts of a `SearchOp` and a
`ListNamespacesOp` that a database can answer into SQL with ``?`` placeholders:

* `prefix_condition`: a namespace prefix as an index range on the text column
  (``prefix = 'a.b' OR 'a.b.' <= prefix < 'a.b/'``: ``/`` is the character after ``.``),
  so a search under a prefix reads only that slice of the primary key;
* `FilterSql.render`: a search filter as SQL over the stored JSON. A term the SQL
  decides exactly (equality with a string, number or boolean, the comparison operators
  with a number) is *exact*; any other term renders as ``TRUE`` and is left to the
  shared Python evaluator on the rows the SQL returned. Only a filter whose terms are
  all exact lets the database apply ``LIMIT`` and ``OFFSET``.

Nothing here knows a particular database: each store passes its `FilterSql` subclass
(how it extracts and types a JSON member).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: What joins a namespace's labels in the ``prefix`` column.
SEPARATOR = "."
#: The character right after `SEPARATOR`: ``'a.' <= text < 'a/'`` is everything under ``a``.
_AFTER_SEPARATOR = chr(ord(SEPARATOR) + 1)

#: Filter keys a JSON path can name without quoting.
_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_RANGE_OPERATORS = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}


def encode_namespace(namespace: Sequence[str]) -> str:
    """The ``prefix`` column text of a (validated) namespace."""
    return SEPARATOR.join(namespace)


def decode_namespace(text: str) -> tuple[str, ...]:
    """The namespace tuple of a ``prefix`` column text."""
    return tuple(text.split(SEPARATOR))


def prefix_condition(column: str, prefix: Sequence[str], params: list[Any]) -> str:
    """SQL true for namespaces starting with ``prefix`` (``TRUE`` for the empty prefix).

    A range on the column, so the primary key's index serves it. The column must sort
    by code point (sqlite's ``BINARY``, PostgreSQL's ``COLLATE "C"``).
    """
    if not prefix:
        return "TRUE"
    text = encode_namespace(prefix)
    params.extend([text, text + SEPARATOR, text + _AFTER_SEPARATOR])
    return f"({column} = ? OR ({column} >= ? AND {column} < ?))"


@dataclass
class RenderedFilter:
    """A filter as SQL: ``sql`` (``?`` placeholders, ``params`` in order) and whether the
    SQL alone decides it (``exact``; else the rows must be checked in Python too)."""

    sql: str = "TRUE"
    params: list[Any] = field(default_factory=list)
    exact: bool = True


class FilterSql:
    """Renders filter terms over a JSON column; subclasses say how their database reads JSON."""

    #: The JSON column.
    column = "value"

    def member_type(self, key: str, params: list[Any]) -> str:
        """SQL for the JSON type of top-level member ``key`` (see `type_names`)."""
        raise NotImplementedError

    def member_scalar(self, key: str, params: list[Any]) -> str:
        """SQL for member ``key`` as a value `operand` compares with."""
        raise NotImplementedError

    def operand(self, value: str | int | float, params: list[Any]) -> str:
        """SQL for a bound string or number compared with `member_scalar` (default ``?``)."""
        params.append(value)
        return "?"

    #: The names `member_type` gives strings, numbers (any of), ``true`` and ``false``.
    string_types: tuple[str, ...] = ("string",)
    number_types: tuple[str, ...] = ("number",)
    true_types: tuple[str, ...] = ("true",)
    false_types: tuple[str, ...] = ("false",)

    def render(self, filter: Mapping[str, Any] | None) -> RenderedFilter:
        """``filter`` (already validated) as SQL; non-exact terms become ``TRUE``."""
        out = RenderedFilter()
        if not filter:
            return out
        clauses: list[str] = []
        for key, wanted in filter.items():
            clause = self._term(key, wanted, out.params)
            if clause is None:
                out.exact = False
            else:
                clauses.append(clause)
        out.sql = " AND ".join(clauses) if clauses else "TRUE"
        return out

    def _term(self, key: str, wanted: Any, params: list[Any]) -> str | None:
        if not isinstance(key, str) or not _PLAIN_KEY.match(key):
            return None
        if isinstance(wanted, Mapping) and wanted and all(str(k).startswith("$") for k in wanted):
            parts: list[str] = []
            for operator, operand in wanted.items():
                part = self._operator(key, operator, operand, params)
                if part is None:
                    return None
                parts.append(part)
            return " AND ".join(parts)
        return self._equal(key, wanted, params)

    def _operator(self, key: str, operator: str, operand: Any, params: list[Any]) -> str | None:
        if operator == "$eq":
            return self._equal(key, operand, params)
        if operator == "$ne":
            # Scratch list: the term is dropped whole when the equality cannot be rendered.
            inner: list[Any] = []
            equal = self._equal(key, operand, inner)
            if equal is None:
                return None
            params.extend(inner)
            return f"NOT COALESCE({equal}, FALSE)"
        symbol = _RANGE_OPERATORS.get(operator)
        if symbol is None or not _is_number(operand):
            return None
        kind = self._type_in(key, self.number_types, params)
        scalar = self.member_scalar(key, params)
        return f"({kind} AND {scalar} {symbol} {self.operand(operand, params)})"

    def boolean(self, key: str, wanted: bool, params: list[Any]) -> str:
        """SQL true when member ``key`` is the JSON boolean ``wanted``."""
        return self._type_in(key, self.true_types if wanted else self.false_types, params)

    def _equal(self, key: str, wanted: Any, params: list[Any]) -> str | None:
        if isinstance(wanted, bool):
            return self.boolean(key, wanted, params)
        if isinstance(wanted, str):
            kind = self._type_in(key, self.string_types, params)
            scalar = self.member_scalar(key, params)
            return f"({kind} AND {scalar} = {self.operand(wanted, params)})"
        if _is_number(wanted):
            kind = self._type_in(key, self.number_types, params)
            scalar = self.member_scalar(key, params)
            return f"({kind} AND {scalar} = {self.operand(wanted, params)})"
        return None

    def _type_in(self, key: str, names: tuple[str, ...], params: list[Any]) -> str:
        kind = self.member_type(key, params)
        if len(names) == 1:
            params.append(names[0])
            return f"COALESCE({kind} = ?, FALSE)"
        params.extend(names)
        marks = ", ".join("?" for _ in names)
        return f"COALESCE({kind} IN ({marks}), FALSE)"


def _is_number(value: Any) -> bool:
    """A finite JSON number (not a bool) every SQL store binds exactly (int64 at most)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return -(2**63) <= value < 2**63
    return isinstance(value, float) and value == value and value not in (float("inf"), float("-inf"))
