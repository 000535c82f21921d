"""The ``postgres`` settings section, declared by the postgres plugin, and the time bounds
of a PostgreSQL URL (`PostgresTimeouts`: the settings, overridden by URL options)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from runstore.settings import bounds, seconds_with_url

if TYPE_CHECKING:
    from runstore.urls import BackendURL


@dataclass(frozen=True)
class PostgresSettings:
    """``postgres``: connection pool and time bounds of the asyncpg backends.

    The URL options ``connect_timeout``, ``command_timeout`` and ``operation_timeout``
    (seconds) override the matching ``*_seconds`` settings.
    """

    pool_max_size: int = field(default=10, metadata=bounds(1))
    #: At most this many idle connections stay open; more are closed as they come back
    #: (null: ``pool_max_size``, every connection stays open once made).
    pool_max_idle: int | None = field(default=None, metadata=bounds(1))
    #: The longest a connection lives: older ones are replaced at their next checkout (0: never).
    pool_recycle_seconds: float = field(default=300.0, metadata=bounds(0))
    #: Opening a connection, and checking a pooled one that sat idle (one ping).
    connect_timeout_seconds: float = field(default=10.0, metadata=bounds(0.001))
    #: One statement's reply; also what rolling back an interrupted call may take.
    command_timeout_seconds: float = field(default=60.0, metadata=bounds(0.001))
    #: One whole call: waiting for a connection, connecting, statements, retries.
    operation_timeout_seconds: float = field(default=90.0, metadata=bounds(0.001))
    #: ``synchronous_commit`` of the checkpoint saver's writes. ``off`` returns before the
    #: WAL flush: survives an application crash, may lose the last commits (~0.6 s) if the
    #: PostgreSQL server crashes; never corrupts. ``on`` (default) waits for the flush.
    saver_synchronous_commit: Literal["on", "off"] = "on"
    #: TLS, as libpq: null leaves it to ``PGSSLMODE`` (else ``prefer``). The URL options of
    #: the same names win; file options name PEM files (``sslrootcert: system``: the
    #: system's trusted CAs, with ``verify-full``).
    sslmode: Literal["disable", "allow", "prefer", "require", "verify-ca", "verify-full"] | None = None
    sslrootcert: str | None = None
    sslcert: str | None = None
    sslkey: str | None = None
    #: Shown in ``pg_stat_activity`` and the server log.
    application_name: str | None = None
    #: Server settings for every session, libpq style: ``-c statement_timeout=5s -c lock_timeout=2s``.
    options: str | None = None
    #: Which server of a multi-host URL (or behind a failover endpoint) is acceptable.
    target_session_attrs: (
        Literal["any", "primary", "standby", "prefer-standby", "read-write", "read-only"] | None
    ) = None
    #: ``transaction`` behind a pooler that hands out server connections per transaction
    #: (PgBouncer ``pool_mode = transaction``, cloud poolers): no prepared statements, no
    #: session settings. ``none``: a direct connection or a session pooler.
    pooler: Literal["none", "transaction"] = "none"


#: URL options (seconds) that override the ``postgres`` settings of the same name + ``_seconds``.
TIMEOUT_OPTIONS = ("connect_timeout", "command_timeout", "operation_timeout")


@dataclass(frozen=True)
class PostgresTimeouts:
    """The time bounds of PostgreSQL calls, in seconds (docs/reliability.md, PostgreSQL)."""

    connect: float = 10.0
    command: float = 60.0
    operation: float = 90.0

    @classmethod
    def resolve(cls, url: BackendURL, settings: PostgresSettings) -> PostgresTimeouts:
        """The settings with the URL's timeout options applied (bad values: `InvalidURLError`)."""
        values = seconds_with_url(url, settings, TIMEOUT_OPTIONS)
        return cls(
            connect=values["connect_timeout"],
            command=values["command_timeout"],
            operation=values["operation_timeout"],
        )
