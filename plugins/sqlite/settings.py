"""The ``sqlite`` settings section, declared by the sqlite plugin."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from runstore.settings import bounds


@dataclass(frozen=True)
class SqliteSettings:
    """``sqlite``: durability and locking of sqlite files.

    ``synchronous: normal`` (WAL) survives an application crash but may lose the last
    commits on power loss; ``full`` fsyncs every commit like the stock LangGraph saver.
    """

    synchronous: Literal["normal", "full"] = "normal"
    busy_timeout_ms: int = field(default=5000, metadata=bounds(0))
