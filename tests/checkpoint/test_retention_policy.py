"""The retention policy object: its limits, overrides and settings."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runstore.checkpoint.policy import RetentionPolicy, check_overrides
from runstore.errors import ConfigError, InvalidSaverInputError
from runstore.settings import Settings


@settings(max_examples=5, deadline=None)
@given(keep=st.integers(1, 10), age=st.one_of(st.none(), st.floats(1, 1e6)))
def test_policy_checks_its_limits(keep: int, age: float | None) -> None:
    """Policies take positive limits (a `timedelta` or seconds) and refuse anything else."""
    policy = RetentionPolicy(keep_last=keep, max_age=age)
    assert policy.overridden({"keep_last": None}).keep_last is None
    assert policy.overridden({"max_age": timedelta(seconds=5).total_seconds()}).max_age == 5
    for bad in ({"keep_last": 0}, {"keep_last": True}, {"max_age": 0}, {"idle_ttl": float("inf")}):
        with pytest.raises(InvalidSaverInputError):
            RetentionPolicy(**bad)


def test_policy_from_settings() -> None:
    """The ``retention`` section gives the default policy; bad values name the key."""
    cfg = Settings.load({"retention": {"keep_last": 10, "idle_ttl_seconds": 86400}})
    assert RetentionPolicy.from_settings(cfg) == RetentionPolicy(keep_last=10, idle_ttl=86400)
    assert RetentionPolicy.from_settings(Settings.load({})).empty
    with pytest.raises(ConfigError, match="retention.keep_last"):
        Settings.load({"retention": {"keep_last": 0}})


def test_overrides_are_checked() -> None:
    """Overrides are stored as checked JSON; unknown keys and bad values are refused."""
    assert check_overrides({"keep_last": None, "max_age": timedelta(hours=1)}) == (
        '{"keep_last":null,"max_age":3600.0}'
    )
    assert check_overrides(None) is None
    with pytest.raises(InvalidSaverInputError, match="accepted: keep_last, max_age, idle_ttl"):
        check_overrides({"keepLast": 3})
