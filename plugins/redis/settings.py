"""The ``redis`` settings section, declared by the redis plugin."""

from __future__ import annotations

from dataclasses import dataclass, field

from runstore.settings import bounds


@dataclass(frozen=True)
class RedisSettings:
    """``redis``: client pool of the Redis backends."""

    max_connections: int = field(default=64, metadata=bounds(1))
