"""Fencing tokens: the one definition of what a run's ``fence`` is and how it is checked.

A lease grant issues a token from a per-thread counter that only grows; a store that
declares ``fencing`` refuses a write whose token is older than the newest it has seen
for the thread. Every store applies the checks defined here.
"""

from __future__ import annotations

from typing import Any

from runstore.errors import InvalidEventError, RunstoreError

#: Fencing tokens are SQL ``BIGINT``s from 1.
MAX_FENCE = 2**63 - 1


def check_fence(value: Any, what: str = "fence", error: type[RunstoreError] = InvalidEventError) -> int:
    """A fencing token (a run's ``fence``): an int from 1 to `MAX_FENCE`, not a bool; else ``error``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_FENCE:
        raise error(
            f"{what} must be a fencing token (an int from 1 to {MAX_FENCE}, e.g. a run's "
            f"'fence'), not {value!r}"
        )
    return value
