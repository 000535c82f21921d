"""TTL: the store's `TTLConfig` checked, and expiry times computed on an injectable clock.

An item with a TTL of ``m`` minutes expires ``m`` minutes after its last write or (with
refresh on read) its last read; an expired item is never returned or listed, and a
sweep deletes it. Times come from the store's `runstore.clock.Clock`, so tests move a
`ManualClock` instead of sleeping.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from runstore.errors import InvalidStoreInputError
from runstore.store.inputs import check_minutes

#: The `TTLConfig` keys a runstore store reads (``omit_expired`` is accepted and always on).
TTL_KEYS = ("default_ttl", "refresh_on_read", "sweep_interval_minutes", "omit_expired")


@dataclass(frozen=True)
class TTLRules:
    """A checked `TTLConfig`: the default TTL in minutes (``None``: items never expire
    unless a put gives one), whether reads refresh by default, the sweep interval."""

    default_ttl: float | None = None
    refresh_on_read: bool = True
    sweep_interval_minutes: float | None = None

    @classmethod
    def of(cls, config: Mapping[str, Any] | None) -> TTLRules:
        """Check a LangGraph ``TTLConfig`` (or ``None``) and return its rules."""
        if config is None:
            return cls()
        if not isinstance(config, Mapping):
            raise InvalidStoreInputError(
                f"ttl must be a TTLConfig dict ({', '.join(TTL_KEYS)}), not {type(config).__name__}"
            )
        unknown = sorted(set(config) - set(TTL_KEYS))
        if unknown:
            raise InvalidStoreInputError(
                f"ttl config has unknown keys {unknown}; accepted: {', '.join(TTL_KEYS)}"
            )
        refresh = config.get("refresh_on_read", True)
        if not isinstance(refresh, bool):
            raise InvalidStoreInputError(f"ttl refresh_on_read must be True or False, not {refresh!r}")
        return cls(
            default_ttl=check_minutes(config.get("default_ttl"), "ttl default_ttl"),
            refresh_on_read=refresh,
            sweep_interval_minutes=check_minutes(
                config.get("sweep_interval_minutes"), "ttl sweep_interval_minutes"
            ),
        )

    def as_config(self) -> dict[str, Any]:
        """The rules as a LangGraph ``TTLConfig`` dict (for ``BaseStore.ttl_config``)."""
        return {
            "default_ttl": self.default_ttl,
            "refresh_on_read": self.refresh_on_read,
            "sweep_interval_minutes": self.sweep_interval_minutes,
        }


def expiry(now: datetime, ttl_minutes: float | None) -> datetime | None:
    """When an item written or refreshed at ``now`` with ``ttl_minutes`` expires (``None``: never)."""
    if ttl_minutes is None:
        return None
    return now + timedelta(minutes=ttl_minutes)


def expired(expires_at: datetime | None, now: datetime) -> bool:
    """Whether an item expiring at ``expires_at`` is gone at ``now`` (expiry is inclusive)."""
    return expires_at is not None and expires_at <= now
