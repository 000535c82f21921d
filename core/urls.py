"""Backend URLs: parsing, option access and password redaction."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from .errors import InvalidURLError

_REDACTED = "***"


@dataclass(frozen=True)
class BackendURL:
    """A parsed backend URL such as ``postgresql://user:pw@host:5432/db?schema=app``.

    ``str(url)`` and ``repr(url)`` never show the password; use `render` to get the
    real URL for a driver.
    """

    scheme: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    host: str | None = None
    port: int | None = None
    path: str = ""
    query: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def parse(cls, raw: str | BackendURL) -> BackendURL:
        """Parse ``raw``; raise `InvalidURLError` (never echoing a password) when it is malformed."""
        if isinstance(raw, BackendURL):
            return raw
        if not isinstance(raw, str) or "://" not in raw:
            raise InvalidURLError(
                f"not a backend URL: {redact(str(raw))!r}; expected scheme://..., "
                "e.g. memory://, sqlite:///path/app.db, postgresql://user@host/db"
            )
        try:
            parts = urlsplit(raw)
            port = parts.port
        except ValueError as exc:
            raise InvalidURLError(f"malformed backend URL {redact(raw)!r}: {exc}") from None
        scheme = parts.scheme.lower()
        if not scheme:
            raise InvalidURLError(f"backend URL {redact(raw)!r} has no scheme")
        query: dict[str, str] = {}
        for key, value in parse_qsl(parts.query, keep_blank_values=True):
            if key in query:
                raise InvalidURLError(f"URL option {key!r} is given twice in {redact(raw)!r}")
            query[key] = value
        return cls(
            scheme=scheme,
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password is not None else None,
            host=parts.hostname,
            port=port,
            path=unquote(parts.path),
            query=MappingProxyType(query),
        )

    def render(self, *, hide_password: bool = True, include_query: bool = True) -> str:
        """Rebuild the URL text; the password is masked unless ``hide_password=False``."""
        netloc = ""
        if self.username is not None:
            netloc = quote(self.username, safe="")
            if self.password is not None:
                netloc += ":" + (_REDACTED if hide_password else quote(self.password, safe=""))
            netloc += "@"
        if self.host:
            netloc += f"[{self.host}]" if ":" in self.host else self.host
        if self.port is not None:
            netloc += f":{self.port}"
        text = f"{self.scheme}://{netloc}{quote(self.path, safe='/:~')}"
        if include_query and self.query:
            text += "?" + urlencode(dict(self.query))
        return text

    def with_query(self, **changes: str | None) -> BackendURL:
        """Return a copy with query options set (or removed when the value is ``None``)."""
        query = dict(self.query)
        for key, value in changes.items():
            if value is None:
                query.pop(key, None)
            else:
                query[key] = value
        return replace(self, query=MappingProxyType(query))

    def without_query(self, *keys: str) -> BackendURL:
        """Return a copy without the named query options (runstore options a driver must not see)."""
        return self.with_query(**dict.fromkeys(keys))

    def file_path(self) -> Path | None:
        """The filesystem path of a file-backed URL, SQLAlchemy style.

        ``sqlite:///data/app.db`` is the relative path ``data/app.db``;
        ``sqlite:////srv/app.db`` is the absolute ``/srv/app.db``; ``sqlite://`` has none.
        """
        if self.host:
            raise InvalidURLError(
                f"{self} names a host; file URLs look like {self.scheme}:///relative/path "
                f"or {self.scheme}:////absolute/path"
            )
        path = self.path[1:] if self.path.startswith("/") else self.path
        return Path(path) if path else None

    @classmethod
    def for_file(cls, scheme: str, path: str | os.PathLike[str]) -> BackendURL:
        """Build a file URL (``scheme:///...``) for ``path``; the inverse of `file_path`."""
        return cls(scheme=scheme, path="/" + Path(path).as_posix())

    def option(self, key: str, default: str | None = None) -> str | None:
        """Return the query option ``key`` or ``default``."""
        return self.query.get(key, default)

    def check_options(self, accepted: set[str] | frozenset[str]) -> None:
        """Raise `InvalidURLError` if the URL carries a query option outside ``accepted``."""
        unknown = sorted(set(self.query) - set(accepted))
        if unknown:
            raise InvalidURLError(
                f"unknown option(s) {', '.join(map(repr, unknown))} in {self}; "
                f"{self.scheme}:// accepts: {', '.join(sorted(accepted)) or 'no options'}"
            )

    def __str__(self) -> str:
        return self.render()


def redact(text: str) -> str:
    """Mask the password of any URL found in ``text`` (best effort for free-form messages)."""
    import re

    return re.sub(r"(\w[\w+.-]*://[^:/?#@\s]*:)([^@\s/]*)(@)", rf"\1{_REDACTED}\3", text)
