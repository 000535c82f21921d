"""What a PostgreSQL URL and the ``postgres`` settings say about connecting: the servers,
TLS, session parameters, the server kind to accept, and whether a transaction pooler
sits in between.

The servers are libpq's: the URL's host part (a name, an IP address, a Unix-socket
directory percent-encoded as ``%2Fvar%2Frun%2Fpostgresql``, or several of these as
``h1:5432,h2:5433``) or the ``host`` and ``port`` options (``?host=/var/run/postgresql``,
``?host=h1,h2&port=5432,5433``: one port for all hosts or one per host). A directory
means the socket file ``.s.PGSQL.<port>`` in it. Several servers are tried in order until
one accepts and matches ``target_session_attrs``. No server at all leaves it to asyncpg's
libpq defaults (``PGHOST``, then the usual socket directories, then localhost).

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

from runstore.errors import ConfigError, InvalidURLError
from runstore.settings import with_url_options
from runstore.tls import SYSTEM_ROOTS, check_tls_files
from runstore.urls import is_port

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
#: The URL options naming the servers (libpq's; no setting of the same name).
SERVER_OPTIONS = ("host", "port")
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
    #: The servers to try, in order (names, addresses or socket directories); empty: asyncpg's default.
    hosts: tuple[str, ...] = ()
    #: One port for every host, or one per host; empty: ``PGPORT`` or 5432.
    ports: tuple[int, ...] = ()

    @classmethod
    def resolve(cls, url: BackendURL, settings: PostgresSettings) -> PostgresConnectOptions:
        """The settings with ``url``'s options applied, checked (see the module docstring)."""
        hosts, ports = servers(url)
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
            hosts=hosts,
            ports=ports,
        )

    @property
    def prepared_statements(self) -> bool:
        """Whether connections may keep named prepared statements (not behind a transaction pooler)."""
        return self.pooler == "none"

    def connect_args(self) -> dict[str, Any]:
        """Keyword arguments for ``asyncpg.connect`` through SQLAlchemy's ``connect_args``
        (`driver_args` and SQLAlchemy's prepared-statement options), except the time bounds
        and ``search_path``, which the engine adds."""
        args = self.driver_args()
        if not self.prepared_statements:
            # SQLAlchemy's own prepared statements get unique names, so two clients never
            # collide on one server connection.
            args["prepared_statement_cache_size"] = 0
            args["prepared_statement_name_func"] = _unique_statement_name
        return args

    def driver_args(self) -> dict[str, Any]:
        """Keyword arguments for ``asyncpg.connect`` itself (servers, TLS, session settings,
        the statement cache), without user, password, database and time bounds."""
        args: dict[str, Any] = {"server_settings": dict(self.server_settings)}
        if self.hosts:
            args["host"] = list(self.hosts)
        if self.ports:
            args["port"] = list(self.ports) if len(self.ports) > 1 else self.ports[0]
        if self.target_session_attrs is not None:
            args["target_session_attrs"] = self.target_session_attrs
        if not self.prepared_statements:
            # asyncpg then uses unnamed statements only, re-parsed within one exchange (a
            # pooler may switch server connections between exchanges).
            args["statement_cache_size"] = 0
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


def servers(url: BackendURL) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The hosts and ports ``url`` names (see the module docstring), checked; `InvalidURLError`
    says what is wrong and what is accepted."""
    in_authority = url.hosts or (((url.host, url.port),) if url.host else ())
    host_option, port_option = url.option("host"), url.option("port")
    if host_option is not None and in_authority:
        raise InvalidURLError(
            f"{url} names its server twice, in the host part and in the host option; give one: "
            "postgresql://user@host:5432/db or postgresql://user@/db?host=/var/run/postgresql"
        )
    if port_option is not None and (url.port is not None or any(port for _, port in url.hosts)):
        raise InvalidURLError(f"{url} gives a port both in the host part and in the port option; give one")
    if host_option is None:
        hosts = tuple(host for host, _ in in_authority)
        given = [port for _, port in in_authority] if in_authority else [url.port]
        # libpq's default for a host whose port is not written; asyncpg needs them all.
        ports = () if not any(given) else tuple(port or 5432 for port in given)
    else:
        hosts = tuple(host_option.split(","))
        ports = () if url.port is None else (url.port,)
    for host in hosts:
        _check_host(url, host)
    if port_option is not None:
        ports = tuple(_port(url, item) for item in port_option.split(","))
        if len(ports) > 1 and len(ports) != max(len(hosts), 1):
            raise InvalidURLError(
                f"{url} gives {len(ports)} ports for {len(hosts) or 'the default'} host(s); give one "
                "port for all hosts or one per host, in the same order (host=h1,h2&port=5432,5433)"
            )
    return hosts, ports


def _check_host(url: BackendURL, host: str) -> None:
    if not host.strip():
        raise InvalidURLError(
            f"{url} has an empty host in its host list; give names, addresses or socket "
            "directories separated by commas, e.g. host=h1,h2 or host=/var/run/postgresql"
        )
    if host.startswith("@"):
        raise InvalidURLError(
            f"{url}: host {host!r} is an abstract Unix socket, which asyncpg cannot reach; "
            "give the socket's directory as an absolute path"
        )
    if "/" in host and not host.startswith("/"):
        raise InvalidURLError(
            f"{url}: host {host!r} looks like a relative socket directory; a Unix-socket directory "
            "must be an absolute path, e.g. host=/var/run/postgresql"
        )
    if not host.startswith("/") and (any(ch.isspace() for ch in host) or re.fullmatch(r"[^:]+:\d*", host)):
        raise InvalidURLError(
            f"{url}: cannot read host {host!r}; give host names or addresses without ports, and "
            "the ports in the port option (host=h1,h2&port=5432,5433)"
        )


def _port(url: BackendURL, text: str) -> int:
    if not is_port(text.strip()):
        raise InvalidURLError(
            f"{url}: port {text!r} must be a number from 1 to 65535 (several: port=5432,5433, one per host)"
        )
    return int(text.strip())


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


#: What to fix for a server answer that no retry changes, by SQLSTATE.
_REFUSAL_HINTS = {
    "3D000": "no retry helps: create the database (CREATE DATABASE ...) or correct its name in the URL path",
    "28P01": "no retry helps: check the user name and password in the URL (percent-encoded) against the server's role",
    "28000": "no retry helps: create the role, or correct the user name in the URL, or add a pg_hba.conf entry "
             "for this user, database and address",
    "42501": "no retry helps: grant the role the privilege named (CONNECT on the database, CREATE on the "
             "database or schema), or create the schema beforehand",
    "3F000": "no retry helps: create the schema or correct ?schema= in the URL",
}


def refusal_hint(cause: BaseException) -> str | None:
    """What to fix when ``cause`` (a driver error) is a refusal no retry changes (a missing
    database, role, schema or privilege, a wrong password, an untrusted certificate), else ``None``."""
    if isinstance(cause, ssl.SSLCertVerificationError):
        return ("no retry helps: the server's certificate is not trusted; give sslrootcert= the CA that "
                "signed it (or check the host name with sslmode=verify-full)")
    return _REFUSAL_HINTS.get(str(getattr(cause, "sqlstate", "") or ""))
