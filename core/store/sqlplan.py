"""SQL text shared by the SQL long-term memory stores (sqlite, PostgreSQL).

Both SQL stores keep one row per item and one row per embedded field, keyed by the
namespace and the key. The namespace is stored as bytes: each label's UTF-8 followed
by a zero byte (``('users', 'u1')`` is ``b'users\\0u1\\0'``; a label never holds a NUL,
so the bytes decode back to one tuple). Two reasons:

* bytes compare as the tuples do (UTF-8 keeps code point order and the zero byte sorts
  below every label byte), so ``ORDER BY updated_at DESC, namespace, key`` is the order
  `runstore.store` gives every search: newest first, ties by namespace then key, and
  pages never overlap;
* a namespace prefix is one index range (`prefix_condition`): ``('a',)`` is every
  namespace from ``b'a\\0'`` up to ``b'a\\1'``, so a search under a prefix reads only
  that slice of the primary key (an equality OR a range instead was three times slower
  on sqlite with 10,000 items).

`FilterSql.render` turns a search filter's conditions into SQL over the stored JSON,
meaning what `runstore.store.filters.holds` means. A condition the SQL decides exactly
(``$eq``/``$ne`` with a string, number, boolean or ``None``, the ordering operators) is
*exact*; any other (equality with a list or an object, a path the database cannot
address as object keys) renders as ``TRUE`` and is left to the shared evaluator on the
rows the SQL returned. Only a filter whose conditions are all exact lets the database
apply ``LIMIT`` and ``OFFSET``.

Nothing here knows a particular database: each store passes its `FilterSql` subclass
(how it extracts and types a JSON member). SQL uses ``?`` placeholders.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runstore.store.filters import Condition

#: What ends each label in the stored namespace.
TERMINATOR = b"\0"


def encode_namespace(namespace: Sequence[str]) -> bytes:
    """The stored bytes of a (checked) namespace: each label's UTF-8, then a zero byte."""
    return b"".join(label.encode() + TERMINATOR for label in namespace)


def decode_namespace(stored: bytes | memoryview) -> tuple[str, ...]:
    """The namespace tuple of its stored bytes."""
    return tuple(part.decode() for part in bytes(stored).split(TERMINATOR)[:-1])


def prefix_condition(column: str, prefix: Sequence[str], params: list[Any]) -> str:
    """SQL true for namespaces starting with ``prefix`` (``TRUE`` for the empty prefix):
    one range on the column, which the primary key's index serves."""
    if not prefix:
        return "TRUE"
    low = encode_namespace(prefix)
    params.extend([low, low[:-1] + b"\1"])
    return f"({column} >= ? AND {column} < ?)"


@dataclass
class RenderedFilter:
    """A filter as SQL: ``sql`` (``?`` placeholders, ``params`` in order) and whether the
    SQL alone decides it (``exact``; else the rows must be checked in Python too)."""

    sql: str = "TRUE"
    params: list[Any] = field(default_factory=list)
    exact: bool = True


class FilterSql:
    """Renders a filter's conditions (`runstore.store.filters.Condition`) as SQL over the
    JSON column, with the meaning `runstore.store.filters.holds` gives them; subclasses
    say how their database reads a JSON member."""

    #: The names `member_type` gives strings, numbers (any of), ``true``, ``false`` and null.
    string_types: tuple[str, ...] = ("string",)
    number_types: tuple[str, ...] = ("number",)
    true_types: tuple[str, ...] = ("true",)
    false_types: tuple[str, ...] = ("false",)
    null_type: str = "null"

    def reaches(self, path: tuple[str, ...]) -> bool:
        """Whether the database can address ``path`` exactly as a chain of object keys."""
        return True

    def member_type(self, path: tuple[str, ...], params: list[Any]) -> str:
        """SQL for the JSON type name of the member at ``path`` (NULL when it is missing)."""
        raise NotImplementedError

    def member(self, path: tuple[str, ...], params: list[Any]) -> str:
        """SQL for the member at ``path`` as a value `operand` compares with."""
        raise NotImplementedError

    def operand(self, value: str | int | float, params: list[Any]) -> str:
        """SQL for a bound string or number compared with `member` (default ``?``)."""
        params.append(value)
        return "?"

    def text_member(self, path: tuple[str, ...], params: list[Any]) -> str:
        """SQL for a string member ordered by code point against `text_operand`."""
        return self.member(path, params)

    def text_operand(self, value: str, params: list[Any]) -> str:
        """SQL for a bound string compared with `text_member` (default `operand`)."""
        return self.operand(value, params)

    def equal_needs_type(self, wanted: str | int | float) -> bool:
        """Whether ``member = operand`` needs the member's type checked too to mean JSON
        equality with ``wanted`` (default: always; a database saves a JSON call where not)."""
        return True

    def boolean(self, path: tuple[str, ...], wanted: bool, params: list[Any]) -> str:
        """SQL true when the member at ``path`` is the JSON boolean ``wanted``."""
        return self._type_in(path, self.true_types if wanted else self.false_types, params)

    def render(self, conditions: Sequence[Condition]) -> RenderedFilter:
        """``conditions`` (checked) as SQL; one the SQL cannot decide exactly becomes ``TRUE``."""
        out = RenderedFilter()
        clauses: list[str] = []
        for condition in conditions:
            clause = self._condition(condition, out.params) if self.reaches(condition.path) else None
            if clause is None:
                out.exact = False
            else:
                clauses.append(clause)
        if clauses:
            out.sql = " AND ".join(clauses)
        return out

    def _condition(self, condition: Condition, params: list[Any]) -> str | None:
        path, op, operand = condition.path, condition.op, condition.operand
        if op in ("$eq", "$ne"):
            # Scratch list: a condition is dropped whole when it cannot be rendered.
            inner: list[Any] = []
            equal = self._equal(path, operand, inner)
            if equal is None:
                return None
            params.extend(inner)
            return equal if op == "$eq" else f"NOT {equal}"
        symbol = _ORDERING[op]
        if isinstance(operand, str):
            kind = self._type_in(path, self.string_types, params)
            member = self.text_member(path, params)
            return f"({kind} AND {member} {symbol} {self.text_operand(operand, params)})"
        if not _is_number(operand):
            return None
        kind = self._type_in(path, self.number_types, params)
        return f"({kind} AND {self.member(path, params)} {symbol} {self.operand(operand, params)})"

    def _equal(self, path: tuple[str, ...], wanted: Any, params: list[Any]) -> str | None:
        """SQL that is never NULL: true when the member equals ``wanted`` as JSON."""
        if wanted is None:
            # None equals a missing member (type NULL) or a JSON null.
            kind = self.member_type(path, params)
            params.append(self.null_type)
            return f"COALESCE({kind} = ?, TRUE)"
        if isinstance(wanted, bool):
            return self.boolean(path, wanted, params)
        if isinstance(wanted, str):
            names = self.string_types
        elif _is_number(wanted):
            names = self.number_types
        else:
            return None
        if self.equal_needs_type(wanted):
            # The comparison first: it rules out most rows, and the type check (another
            # parse of the value on sqlite) then runs only on the rows it kept.
            equal = f"COALESCE({self.member(path, params)} = {self.operand(wanted, params)}, FALSE)"
            kind = self._type_in(path, names, params)
            return f"({equal} AND {kind})"
        return f"COALESCE({self.member(path, params)} = {self.operand(wanted, params)}, FALSE)"

    def _type_in(self, path: tuple[str, ...], names: tuple[str, ...], params: list[Any]) -> str:
        kind = self.member_type(path, params)
        params.extend(names)
        marks = ", ".join("?" for _ in names)
        return f"COALESCE({kind} IN ({marks}), FALSE)"


_ORDERING = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}


def _is_number(value: Any) -> bool:
    """A finite JSON number (not a bool) every SQL store binds exactly (int64 at most)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return -(2**63) <= value < 2**63
    return isinstance(value, float) and math.isfinite(value)
