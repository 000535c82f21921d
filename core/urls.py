"""Backend URLs: parsing, option access and password masking.

URLs are parsed by `urllib.parse.urlsplit` (RFC 3986), the rule the drivers (asyncpg,
redis-py) apply to the text runstore hands them, so runstore and the driver agree on
which part is the password. Characters that end the host part (``/ ? #``), whitespace
and control characters must be percent-encoded in a user name or password; a URL that
breaks this is an `InvalidURLError` that quotes none of it beyond the scheme.

The host part may name a Unix-socket directory, percent-encoded
(``postgresql://user@%2Fvar%2Frun%2Fpostgresql/db``; the path keeps its case), or list
several servers (``postgresql://user@h1:5432,h2:5433/db``, in `BackendURL.hosts`);
which backends accept these is each backend's business.

A parsed URL becomes text in one place, `BackendURL.render`, which masks the password
unless a driver asks for the real URL. Every password a URL carries is remembered for
`runstore.redaction.redact`, which masks it in free text.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from runstore.errors import InvalidURLError
from runstore.redaction import REDACTED, redact, remember_secret

_ENCODE_HINT = (
    "percent-encode / ? # @ : % [ ] and spaces in the user name and password "
    "(e.g. / as %2F, # as %23, @ as %40)"
)


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
    #: Every ``(host, port)`` of an authority that lists several servers
    #: (``h1:5432,h2:5433``), in order; `host` and `port` are then ``None``.
    hosts: tuple[tuple[str, int | None], ...] = ()

    def __post_init__(self) -> None:
        remember_secret(self.password)
        if self.hosts and (self.host is not None or self.port is not None):
            raise ValueError("a BackendURL with hosts has no host or port of its own")

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
        # Only the scheme is quoted back until the password is known to be where it belongs;
        # until then its likeliest place is remembered, so `redact` masks it in later text.
        shown = f"{raw.partition('://')[0]}://..."
        remember_secret(_likely_password(raw))
        authority = re.split(r"[/?#]", raw.partition("://")[2], maxsplit=1)[0]
        if any(ch.isspace() or not ch.isprintable() for ch in authority):
            # Allowed in a file path (sqlite:///my data/app.db), never in user, password or host.
            raise InvalidURLError(
                f"backend URL {shown!r} holds whitespace or control characters before its path; {_ENCODE_HINT}"
            )
        try:
            parts = urlsplit(raw)
            # A list of servers has no one port; its items are read below.
            port = None if "," in parts.netloc.rpartition("@")[2] else parts.port
        except ValueError:
            parts = None  # raised below: urlsplit's message quotes the text, the context too
        if parts is None:
            raise InvalidURLError(
                f"malformed backend URL {shown!r}: the part after :// up to the first / ? or # "
                f"must be [user[:password]@]host[:port]; {_ENCODE_HINT}"
            )
        if "#" in raw:
            raise InvalidURLError(f"backend URL {shown!r} holds a '#' (URLs here have no fragment); {_ENCODE_HINT}")
        if parts.netloc and "@" not in parts.netloc and ("@" in parts.path or not (parts.hostname or "," in parts.netloc)):
            # "user:pa/ss@host": the host part ended at the password's '/'.
            raise InvalidURLError(
                f"malformed backend URL {shown!r}: an '@' after the host part, or no host; {_ENCODE_HINT}"
            )
        password = unquote(parts.password) if parts.password is not None else None
        remember_secret(password)
        scheme = parts.scheme.lower()
        if not scheme:
            raise InvalidURLError(f"backend URL {redact(raw)!r} has no scheme")
        query: dict[str, str] = {}
        for key, value in parse_qsl(parts.query, keep_blank_values=True):
            if key in query:
                raise InvalidURLError(f"URL option {key!r} is given twice in {redact(raw)!r}")
            query[key] = value
        username = unquote(parts.username) if parts.username is not None else None
        host = parts.hostname
        hosts: tuple[tuple[str, int | None], ...] = ()
        server = parts.netloc.rpartition("@")[2]
        if "," in server:
            if not all(server.split(",")):
                raise InvalidURLError(
                    f"backend URL {shown!r} has an empty entry in its host list {redact(server)!r}; "
                    "list servers as host:port,host:port"
                )
            host, hosts = None, tuple(_server(item, shown) for item in server.split(","))
        elif host and "%" in host and not server.startswith("["):
            # urlsplit lowercases the encoded text; a socket directory's path must keep its case.
            host = _server(server, shown)[0]
        return cls(
            scheme=scheme,
            username=username if username or password is not None else None,
            password=password,
            host=host,
            hosts=hosts,
            port=port,
            path=unquote(parts.path),
            query=MappingProxyType(query),
        )

    def render(self, *, hide_password: bool = True, include_query: bool = True) -> str:
        """Rebuild the URL text; the password is masked unless ``hide_password=False``.

        This is where a URL becomes text: everything runstore prints, logs or raises
        shows a URL through it (``str(url)``).
        """
        netloc = ""
        if self.username is not None or self.password is not None:
            netloc = quote(self.username or "", safe="")
            if self.password is not None:
                netloc += ":" + (REDACTED if hide_password else quote(self.password, safe=""))
            netloc += "@"
        if self.hosts:
            netloc += ",".join(_render_server(host, port) for host, port in self.hosts)
        else:
            netloc += _render_server(self.host, self.port)
        text = f"{self.scheme}://{netloc}{quote(self.path, safe='/:~')}"
        if include_query and self.query:
            # Paths and lists stay readable (host=/var/run/postgresql, port=5432,5433).
            text += "?" + urlencode(dict(self.query), safe="/:,")
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
        if self.host or self.hosts:
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


def is_port(text: str) -> bool:
    """Whether ``text`` is a TCP port number, 1 to 65535 (ASCII digits only)."""
    return text.isascii() and text.isdigit() and 0 < int(text) < 65536


def _server(item: str, shown: str) -> tuple[str, int | None]:
    """One ``host[:port]`` of an authority, the host percent-decoded: an IPv6 address loses
    its brackets, a host name is lowercased, a socket directory (``/...``) keeps its case."""
    if item.startswith("["):
        host, _, port_text = item[1:].partition("]")
        if port_text and not port_text.startswith(":"):
            raise InvalidURLError(f"backend URL {shown!r}: cannot read the host {redact(item)!r}")
        port_text = port_text[1:]
    else:
        host, _, port_text = item.partition(":")
        host = unquote(host)
    if not host:
        raise InvalidURLError(f"backend URL {shown!r}: {redact(item)!r} names no host; list servers as host:port")
    if port_text and not is_port(port_text):
        raise InvalidURLError(
            f"backend URL {shown!r}: the port of {redact(item)!r} must be a number from 1 to 65535"
        )
    return (host if host.startswith("/") else host.lower()), (int(port_text) if port_text else None)


def _render_server(host: str | None, port: int | None) -> str:
    """``host[:port]`` as an authority writes it (a socket directory percent-encoded)."""
    text = "" if not host else f"[{host}]" if ":" in host and not host.startswith("/") else quote(host, safe="")
    return text if port is None else f"{text}:{port}"


def _likely_password(raw: str) -> str | None:
    """What a malformed URL most likely holds as its password: from the first ':' after the
    scheme's '//' up to the last '@' (None when there is no such pair)."""
    rest = raw.partition("://")[2]
    at = rest.rfind("@")
    user_info = rest[:at] if at >= 0 else ""
    return user_info.partition(":")[2] or None
