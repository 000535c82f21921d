"""The ``postgres`` settings section, declared by the postgres plugin."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from runstore.settings import bounds


@dataclass(frozen=True)
class PostgresSettings:
    """``postgres``: connection pool of the asyncpg backends."""

    pool_max_size: int = field(default=10, metadata=bounds(1))
    pool_recycle_seconds: float = field(default=300.0, metadata=bounds(0))
    command_timeout_seconds: float = field(default=60.0, metadata=bounds(0.001))
    #: ``synchronous_commit`` of the checkpoint saver's writes. ``off`` returns before the
    #: WAL flush: survives an application crash, may lose the last commits (~0.6 s) if the
    #: PostgreSQL server crashes; never corrupts. ``on`` (default) waits for the flush.
    saver_synchronous_commit: Literal["on", "off"] = "on"
