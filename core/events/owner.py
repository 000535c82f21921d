"""The owner filter: ``user_id=AUTO`` reads the owner of the current request context."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Final

from runstore.errors import OwnerContextMissingError


class _Auto:
    """Type of `AUTO`; a singleton."""

    _instance: _Auto | None = None

    def __new__(cls) -> _Auto:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "AUTO"

    def __reduce__(self) -> str:
        return "AUTO"


#: Default of every ``user_id`` parameter: take the owner from `owner_scope`.
AUTO: Final = _Auto()
AutoType = _Auto

_UNSET: Final = object()
_current: ContextVar[object] = ContextVar("runstore_owner", default=_UNSET)

UserId = str | None | _Auto


@contextmanager
def owner_scope(user_id: str | None) -> Iterator[None]:
    """Set the request owner for the block; ``None`` means "no owner filter"."""
    if user_id is not None and not isinstance(user_id, str):
        raise TypeError(f"user_id must be a string or None, not {type(user_id).__name__}")
    token = _current.set(user_id)
    try:
        yield
    finally:
        _current.reset(token)


def current_owner() -> str | None:
    """The owner set by the enclosing `owner_scope`; raise `OwnerContextMissingError` if none."""
    value = _current.get()
    if value is _UNSET:
        raise OwnerContextMissingError(
            "user_id=AUTO needs an owner in the request context: wrap the call in "
            "runstore.owner_scope(user_id), or pass user_id='...' (filter) or user_id=None (no filter)"
        )
    return value  # type: ignore[return-value]


def resolve_owner(user_id: UserId) -> str | None:
    """Turn a ``user_id`` argument into the owner to filter on (``None`` = no filter)."""
    if isinstance(user_id, _Auto):
        return current_owner()
    if user_id is not None and not isinstance(user_id, str):
        raise TypeError(f"user_id must be a string, None or AUTO, not {type(user_id).__name__}")
    return user_id
