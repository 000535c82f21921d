"""The ``redis`` settings section, declared by the redis plugin."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from runstore.settings import bounds


@dataclass(frozen=True)
class RedisSettings:
    """``redis``: client pool and time bounds of the Redis backends.

    The URL options ``socket_connect_timeout``, ``socket_timeout``,
    ``health_check_interval`` and ``operation_timeout`` override the matching settings,
    and so do the TLS options ``sslmode``, ``sslrootcert``, ``sslcert``, ``sslkey``.
    """

    max_connections: int = field(default=64, metadata=bounds(1))
    socket_connect_timeout_seconds: float = field(default=5.0, metadata=bounds(0.001))
    socket_timeout_seconds: float = field(default=10.0, metadata=bounds(0.001))
    #: PING a pooled connection idle longer than this before using it (0: never).
    health_check_interval_seconds: float = field(default=30.0, metadata=bounds(0))
    #: The most one call may take, retries on fresh connections included.
    operation_timeout_seconds: float = field(default=30.0, metadata=bounds(0.001))
    #: TLS of ``rediss://`` URLs (ignored for ``redis://``), libpq's names; the URL options of
    #: the same names win. null: ``verify-full`` against the system's trusted CAs.
    sslmode: Literal["require", "verify-ca", "verify-full"] | None = None
    sslrootcert: str | None = None
    sslcert: str | None = None
    sslkey: str | None = None
