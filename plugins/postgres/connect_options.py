"""What a PostgreSQL URL and the ``postgres`` settings say about connecting: TLS, session
parameters, the server kind to accept, and whether a transaction pooler sits in between.

The URL options use libpq's names and meanings (``sslmode``, ``sslrootcert``,
``sslcert``, ``sslkey``, ``application_name``, ``options``, ``target_session_attrs``)
plus runstore's ``pooler``; each overrides the setting of the same name. Everything is
checked when a backend opens, before any connection: a bad value is an
`InvalidURLError` (URL) or `ConfigError` (settings) naming the option and what it
accepts, and a certificate file that cannot be read is named with its option.

TLS is asyncpg's implementation of libpq's rules (``prefer`` tries TLS and falls back;
``require`` encrypts; ``verify-ca`` also checks the certificate chain against
``sslrootcert``; ``verify-full`` also checks the host name; ``PGSSL*`` variables and
``~/.postgresql/`` files fill in what is not given), so a URL means what it means to
psql. ``sslrootcert=system`` (libpq 16) verifies against the system's trusted CAs.
"""

from __future__ import annotations

import os
import re
import ssl
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from runstore.errors import ConfigError
from runstore.settings import with_url_options
from runstore.tls import SYSTEM_ROOTS, check_tls_files

if TYPE_CHECKING:
    from runstore.urls import BackendURL

    from .settings import PostgresSettings

#: The URL options read here (each overrides the ``postgres`` setting of the same name).
CONNECT_OPTIONS = (
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "application_name",
    "options",
    "target_session_attrs",
    "pooler",
)
SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
SESSION_ATTRS = ("any", "primary", "standby", "prefer-standby", "read-write", "read-only")
POOLERS = ("none", "transaction")
_OPTION = re.compile(r"(?:-c\s*|--)([A-Za-z_][A-Za-z0-9_.]*)=(.*)", re.DOTALL)


@dataclass(frozen=True)
class PostgresConnectOptions:
    """The resolved connect options of one PostgreSQL URL (see the module docstring)."""

    sslmode: str | None = None
    sslrootcert: str | None = None
    sslcert: str | None = None
    sslkey: str | None = None
    application_name: str | None = None
    #: Session settings sent at connect (from ``application_name`` and ``options``).
    server_settings: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    target_session_attrs: str | None = None
    pooler: str = "none"

    @classmethod
    def resolve(cls, url: BackendURL, settings: PostgresSettings) -> PostgresConnectOptions:
        """The settings with ``url``'s options applied, checked (see the module docstring)."""
        values = with_url_options(url, settings, "postgres", CONNECT_OPTIONS)
        problem = values.problem

        sslmode = _choice(values["sslmode"], SSL_MODES, lambda m: problem("sslmode", m))
        pooler = _choice(values["pooler"], POOLERS, lambda m: problem("pooler", m)) or "none"
        attrs = _choice(
            values["target_session_attrs"], SESSION_ATTRS, lambda m: problem("target_session_attrs", m)
        )
        rootcert = values["sslrootcert"]
        if rootcert == SYSTEM_ROOTS:
            if sslmode not in (None, "verify-full"):
                raise problem("sslrootcert", "the system's CAs are only used with sslmode=verify-full")
            sslmode = "verify-full"
        check_tls_files(values)
        files = {name: values[name] for name in ("sslrootcert", "sslcert", "sslkey")}
        if sslmode in ("verify-ca", "verify-full") and rootcert is None and not _default_roots():
            raise problem(
                "sslmode",
                f"{sslmode} checks the server's certificate against a CA certificate; give "
                "sslrootcert=/path/to/ca.pem (the CA that signed the server's certificate) or "
                "sslrootcert=system (the system's trusted CAs)",
            )
        if sslmode == "disable" and any(files.values()):
            raise problem("sslmode", "certificate options make no sense with sslmode=disable")
        server_settings: dict[str, str] = {}
        if values["options"]:
            server_settings.update(_parse_options(values["options"], lambda m: problem("options", m)))
        app_name = values["application_name"]
        if app_name is not None:
            if not app_name.isprintable() or not app_name.isascii() or len(app_name) > 63:
                raise problem(
                    "application_name", "must be up to 63 printable ASCII characters (the server cuts or "
                    "garbles anything else)"
                )
            server_settings["application_name"] = app_name
        if url.option("schema") is not None and "search_path" in server_settings:
            raise problem("options", "sets search_path, which the URL's schema option already sets")
        if pooler == "transaction" and settings.saver_synchronous_commit == "off":
            raise ConfigError(
                "config key 'postgres.saver_synchronous_commit' ('off') sets a session parameter, "
                "which a transaction pooler (pooler=transaction) does not keep; set it on the "
                "database role instead: ALTER ROLE <user> SET synchronous_commit = off"
            )
        return cls(
            sslmode=sslmode,
            sslrootcert=rootcert,
            sslcert=files["sslcert"],
            sslkey=files["sslkey"],
            application_name=app_name,
            server_settings=MappingProxyType(server_settings),
            target_session_attrs=attrs,
            pooler=pooler,
        )

    @property
    def prepared_statements(self) -> bool:
        """Whether connections may keep named prepared statements (not behind a transaction pooler)."""
        return self.pooler == "none"

    def connect_args(self) -> dict[str, Any]:
        """Keyword arguments for ``asyncpg.connect`` (through SQLAlchemy's ``connect_args``),
        except the time bounds and ``search_path``, which the engine adds."""
        args: dict[str, Any] = {"server_settings": dict(self.server_settings)}
        if self.target_session_attrs is not None:
            args["target_session_attrs"] = self.target_session_attrs
        if not self.prepared_statements:
            # asyncpg then uses unnamed statements only, re-parsed within one exchange (a
            # pooler may switch server connections between exchanges); SQLAlchemy's own
            # prepared statements get unique names, so two clients never collide on one.
            args["statement_cache_size"] = 0
            args["prepared_statement_cache_size"] = 0
            args["prepared_statement_name_func"] = _unique_statement_name
        if self.sslrootcert == SYSTEM_ROOTS:
            args["ssl"] = self._system_context()
        else:
            tls = {
                name: value
                for name, value in (
                    ("sslmode", self.sslmode),
                    ("sslrootcert", self.sslrootcert),
                    ("sslcert", self.sslcert),
                    ("sslkey", self.sslkey),
                )
                if value is not None
            }
            if tls:
                # asyncpg reads the certificate options only from a DSN; host, user and the
                # rest come from keyword arguments, which win over the DSN.
                args["dsn"] = "postgresql://?" + urlencode(tls)
        return args

    def _system_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context()  # verify-full against the system's CAs
        if self.sslcert is not None:
            context.load_cert_chain(self.sslcert, keyfile=self.sslkey)
        return context


def _unique_statement_name() -> str:
    return f"__runstore_{uuid.uuid4().hex}__"


def _choice(value: str | None, accepted: tuple[str, ...], problem: Any) -> str | None:
    if value is None:
        return None
    if value.lower() not in accepted:
        raise problem(f"must be one of {', '.join(accepted)}")
    return value.lower()


def _default_roots() -> bool:
    """Whether libpq's defaults name a CA file: ``PGSSLROOTCERT`` or ``~/.postgresql/root.crt``."""
    if os.environ.get("PGSSLROOTCERT"):
        return True
    try:
        return (Path.home() / ".postgresql" / "root.crt").is_file()
    except RuntimeError:  # no home directory
        return False


def _parse_options(text: str, problem: Any) -> dict[str, str]:
    r"""libpq's ``options``: ``-c name=value`` or ``--name=value`` items separated by spaces
    (a backslash escapes a space or a backslash in a value)."""
    words: list[str] = []
    current: list[str] = []
    chars = iter(text)
    for ch in chars:
        if ch == "\\":
            current.append(next(chars, ""))
        elif ch.isspace():
            if current:
                words.append("".join(current))
                current = []
        else:
            current.append(ch)
    if current:
        words.append("".join(current))
    settings: dict[str, str] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if word == "-c" and i + 1 < len(words):
            word = "-c" + words[i + 1]
            i += 1
        match = _OPTION.fullmatch(word)
        if match is None:
            raise problem(
                f"cannot read {word!r}; give server settings as '-c name=value' items separated "
                "by spaces, e.g. options=-c statement_timeout=30s (in a URL: "
                "options=-c%20statement_timeout%3D30s)"
            )
        settings[match.group(1)] = match.group(2)
        i += 1
    return settings
