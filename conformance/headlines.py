"""The one line a failure is known by: an ExceptionGroup is shown by what it holds.

`runstore check`, JUnit viewers and pytest's summary show a failure's headline (its
``reprcrash`` message). For an ``ExceptionGroup`` that is "ExceptionGroup: ... (2
sub-exceptions)", which names no contract; the headline becomes the first contained
exception that names one (else the first one), followed by a note on the group.
"""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import Iterator
from typing import Any

import pytest


def _leaves(group: BaseExceptionGroup[Any]) -> Iterator[BaseException]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        elif not isinstance(exc, asyncio.CancelledError):
            yield exc


def group_headline(group: BaseExceptionGroup[Any]) -> str | None:
    """The headline of a failure that is an ExceptionGroup, or ``None`` if it holds nothing."""
    leaves = list(_leaves(group))
    if not leaves:
        return None
    shown = next((e for e in leaves if "contract:" in str(e)), leaves[0])
    text = "".join(traceback.format_exception_only(shown)).strip()
    note = f"{type(group).__name__} {group.message!r}"
    if len(leaves) > 1:
        note = f"one of {len(leaves)} exceptions in {note}"
    return f"{text}\n(raised inside {note})"


class HeadlinesPlugin:
    """Rewrites the headline of a failed test whose exception is an ExceptionGroup."""

    # trylast: the innermost wrapper, so every other wrapper (runstore check's reporter)
    # already sees the new headline.
    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
        report = yield
        excinfo = call.excinfo
        crash = getattr(report.longrepr, "reprcrash", None)
        group = excinfo.value if excinfo is not None else None
        if report.failed and crash is not None and isinstance(group, BaseExceptionGroup):
            headline = group_headline(group)
            if headline is not None:
                crash.message = headline
        return report
