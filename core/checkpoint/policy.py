"""Retention: the policy, the per-thread overrides, and which checkpoints a sweep removes.

A saver applies retention one thread at a time, inside one transaction of its own
(docs/threads.md, "Retention"). What it removes is decided here, without I/O, so
every saver removes the same checkpoints:

- ``idle_ttl``: a thread not written for that long (``touched_at``, the last write of
  any kind) expires whole: the saver deletes it and leaves its tombstone, and the
  sweeper then deletes its events and stream keys.
- ``keep_last`` N: per (thread, namespace), checkpoints older than the N newest go.
- ``max_age``: per (thread, namespace), checkpoints created longer ago than that go.

Whatever the limits say, a sweep never removes the latest checkpoint of a namespace
(a resume starts there: its pending writes, interrupts and resume values go only with
it), and never an ancestor a kept checkpoint's delta reconstruction reads (the saver's
one ancestor rule, `saverbase.reconstruction_ancestors`, applied until every kept
checkpoint's needs are kept too), so each kept checkpoint still loads to the same values.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import orjson

from runstore.checkpoint.rules import missing_delta_channels, reconstruction_ancestors
from runstore.checkpoint.threads import Removed
from runstore.errors import InvalidSaverInputError

if TYPE_CHECKING:
    from runstore.settings import Settings

__all__ = [
    "OVERRIDE_KEYS",
    "CheckpointGraph",
    "Compaction",
    "DryRun",
    "RetentionPolicy",
    "SweepBatch",
    "ThreadPlan",
    "ThreadSwept",
    "batch_of",
    "check_overrides",
    "check_sweep",
    "claimable",
    "due",
    "expired",
    "kept_checkpoints",
    "plan_thread",
]

#: The limits a thread may override (seconds for the two durations); ``None`` as a
#: value lifts that limit for the thread, a missing key takes the policy's.
OVERRIDE_KEYS = ("keep_last", "max_age", "idle_ttl")

_MICROS = 1_000_000


def _seconds(value: Any, what: str) -> float | None:
    """A duration (seconds or `timedelta`) as positive finite seconds, checked."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidSaverInputError(
            f"{what} must be a duration in seconds (a positive number or a timedelta) or None, "
            f"not {value!r}"
        )
    if value <= 0:
        raise InvalidSaverInputError(f"{what} must be positive, not {value!r}")
    return float(value)


def _count(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidSaverInputError(f"{what} must be an int >= 1 or None, not {value!r}")
    return value


@dataclass(frozen=True)
class RetentionPolicy:
    """What retention keeps. ``None`` lifts a limit; a policy with none removes nothing.

    ``keep_last``: checkpoints kept per (thread, namespace); ``max_age``: seconds (or a
    `timedelta`) a checkpoint is kept after its creation; ``idle_ttl``: seconds (or a
    `timedelta`) after a thread's last write at which the whole thread expires.
    """

    keep_last: int | None = None
    max_age: float | None = None
    idle_ttl: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "keep_last", _count(self.keep_last, "keep_last"))
        object.__setattr__(self, "max_age", _seconds(self.max_age, "max_age"))
        object.__setattr__(self, "idle_ttl", _seconds(self.idle_ttl, "idle_ttl"))

    @classmethod
    def from_settings(cls, settings: Settings) -> RetentionPolicy:
        """The policy of the ``retention`` settings section."""
        section = settings.retention
        return cls(
            keep_last=section.keep_last,
            max_age=section.max_age_seconds,
            idle_ttl=section.idle_ttl_seconds,
        )

    @property
    def empty(self) -> bool:
        """Whether the policy removes nothing (no limit set)."""
        return self.keep_last is None and self.max_age is None and self.idle_ttl is None

    def overridden(self, overrides: Mapping[str, Any] | None) -> RetentionPolicy:
        """This policy with a thread's stored overrides applied (see `OVERRIDE_KEYS`)."""
        if not overrides:
            return self
        changes = {k: overrides[k] for k in OVERRIDE_KEYS if k in overrides}
        try:
            return replace(self, **changes)
        except InvalidSaverInputError:
            return self  # a stored override no longer valid: the defaults, never less kept

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return {"keep_last": self.keep_last, "max_age": self.max_age, "idle_ttl": self.idle_ttl}


def check_overrides(overrides: Mapping[str, Any] | None) -> str | None:
    """A thread's retention overrides checked, as the JSON text the savers store
    (``None``: clear them). Bad input raises `InvalidSaverInputError` naming it."""
    if overrides is None:
        return None
    if not isinstance(overrides, Mapping):
        raise InvalidSaverInputError(
            f"retention overrides must be a mapping with keys from {', '.join(OVERRIDE_KEYS)}, "
            f"not {type(overrides).__name__}"
        )
    unknown = sorted(set(map(str, overrides)) - set(OVERRIDE_KEYS))
    if unknown:
        raise InvalidSaverInputError(
            f"unknown retention override {unknown[0]!r}; accepted: {', '.join(OVERRIDE_KEYS)}"
        )
    checked: dict[str, Any] = {}
    if "keep_last" in overrides:
        checked["keep_last"] = _count(overrides["keep_last"], "keep_last")
    for key in ("max_age", "idle_ttl"):
        if key in overrides:
            checked[key] = _seconds(overrides[key], key)
    return orjson.dumps(checked).decode()


# --------------------------------------------------------------------------- planning


class CheckpointGraph:
    """The checkpoints of one (thread, namespace): parent links, creation times and
    which channels hold a value, for deciding what a removal may take."""

    def __init__(self, rows: Iterable[tuple[Any, ...]]) -> None:
        """``rows``: ``(checkpoint_id, parent_id, run_id, metadata, value_versions,
        channel_versions, created_at)``; the three JSON columns as text, dicts or ``None``."""
        self.parent: dict[str, str | None] = {}
        self.run_id: dict[str, str | None] = {}
        self.created_at: dict[str, int] = {}
        self.valued: dict[str, set[str]] = {}
        self.missing: dict[str, list[str]] = {}
        for row in rows:
            cid, parent, run_id, metadata, value_versions, channel_versions = row[:6]
            self.parent[cid] = parent
            self.run_id[cid] = run_id
            self.created_at[cid] = int(row[6]) if len(row) > 6 and row[6] is not None else 0
            self.valued[cid] = valued = set(_loaded(value_versions) or ())
            versions = _loaded(channel_versions)
            self.missing[cid] = missing_delta_channels(_loaded(metadata), versions, valued)

    def needed(self, checkpoint_id: str) -> list[str]:
        """Ancestors (nearest first) a delta reconstruction at ``checkpoint_id`` reads."""
        return reconstruction_ancestors(
            checkpoint_id,
            self.missing.get(checkpoint_id, ()),
            self.parent.get,
            lambda cid: self.valued.get(cid, ()),
        )

    def with_needs(self, keep: Iterable[str]) -> set[str]:
        """``keep`` and every ancestor a kept checkpoint's reconstruction reads, until closed
        (an ancestor kept for one channel may itself rebuild another)."""
        kept: set[str] = set()
        todo = [cid for cid in keep if cid in self.parent]
        while todo:
            cid = todo.pop()
            if cid in kept:
                continue
            kept.add(cid)
            todo.extend(a for a in self.needed(cid) if a not in kept and a in self.parent)
        return kept


def _loaded(value: Any) -> Any:
    if value is None or isinstance(value, Mapping | list):
        return value
    return orjson.loads(value)


def kept_checkpoints(graph: CheckpointGraph, policy: RetentionPolicy, now: int) -> set[str]:
    """The checkpoints of one namespace ``policy`` keeps at ``now`` (microseconds): the
    latest, the ``keep_last`` newest not older than ``max_age``, and what they rebuild from."""
    ids = sorted(graph.parent)
    if not ids:
        return set()
    keep = set(ids if policy.keep_last is None else ids[-policy.keep_last :])
    if policy.max_age is not None:
        cutoff = now - int(policy.max_age * _MICROS)
        keep = {cid for cid in keep if graph.created_at[cid] >= cutoff}
    keep.add(ids[-1])  # the head: where a resume starts, with its pending writes
    return graph.with_needs(keep)


@dataclass(frozen=True)
class ThreadPlan:
    """What a sweep does to one thread: expire it whole, or remove ``doomed`` checkpoints
    per namespace; ``sweep_after`` is when it next needs a look without new writes."""

    expire: bool
    doomed: dict[str, list[str]] = field(default_factory=dict)
    sweep_after: int | None = None


def expired(policy: RetentionPolicy, *, now: int, touched_at: int) -> bool:
    """Whether ``idle_ttl`` has passed since the thread's last write (times in microseconds)."""
    return policy.idle_ttl is not None and touched_at + int(policy.idle_ttl * _MICROS) <= now


def plan_thread(
    graphs: Callable[[], Mapping[str, CheckpointGraph]],
    policy: RetentionPolicy,
    *,
    now: int,
    touched_at: int,
) -> ThreadPlan:
    """Decide one thread's sweep (times in microseconds). ``graphs`` loads the thread's
    namespaces; it is not called when the thread expires whole."""
    if expired(policy, now=now, touched_at=touched_at):
        return ThreadPlan(expire=True)
    expires_at = None if policy.idle_ttl is None else touched_at + int(policy.idle_ttl * _MICROS)
    doomed: dict[str, list[str]] = {}
    due: list[int] = [] if expires_at is None else [expires_at]
    if policy.keep_last is not None or policy.max_age is not None:
        for ns, graph in graphs().items():
            kept = kept_checkpoints(graph, policy, now)
            gone = sorted(set(graph.parent) - kept)
            if gone:
                doomed[ns] = gone
            if policy.max_age is not None:
                # The oldest kept checkpoint that age alone may take decides the next look.
                head = max(graph.parent) if graph.parent else None
                ages = [graph.created_at[c] for c in kept if c != head]
                if ages:
                    due.append(min(ages) + int(policy.max_age * _MICROS))
    return ThreadPlan(expire=False, doomed=doomed, sweep_after=min(due) if due else None)


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Compaction:
    """Storage size before and after a compaction (bytes: a sqlite file with its WAL, or
    PostgreSQL's total relation sizes of the saver's tables)."""

    before: int
    after: int

    @property
    def reclaimed(self) -> int:
        """Bytes given back (never negative)."""
        return max(self.before - self.after, 0)

    def as_dict(self) -> dict[str, int]:
        """JSON-able form."""
        return {"before": self.before, "after": self.after, "reclaimed": self.reclaimed}


class DryRun(Exception):
    """Raised inside a saver's sweep transaction in a dry run, so the transaction rolls
    back; carries the answer the sweep would have given (`ThreadSwept`)."""

    def __init__(self, swept: ThreadSwept) -> None:
        super().__init__(swept.thread_id)
        self.swept = swept


@dataclass(frozen=True)
class ThreadSwept:
    """One thread's part of a sweep: expired whole or trimmed, and what went from the saver."""

    thread_id: str
    expired: bool
    removed: Removed


@dataclass(frozen=True)
class SweepBatch:
    """One bounded batch of a saver's sweep.

    ``threads``: the threads examined, with what went (each examined by one sweeper
    only: it holds a claim on them). ``cleanup``: deleted threads whose events and
    stream keys still need deleting (tombstones the sweeper has not finished), for
    `runstore.sweeper`. ``cursor``: pass back as ``after`` for the next batch;
    ``None`` when this pass over the threads is done.
    """

    threads: list[ThreadSwept]
    cleanup: list[str]
    cursor: str | None

    @property
    def removed(self) -> Removed:
        """What the batch removed from the saver, summed."""
        total = Removed()
        for swept in self.threads:
            total += swept.removed
        return total


#: Threads one sweep batch may claim at most.
MAX_SWEEP_BATCH = 10_000


def check_sweep(policy: Any, limit: Any, claim_seconds: Any) -> int:
    """Check a sweep's arguments; the claim's length in microseconds."""
    if not isinstance(policy, RetentionPolicy):
        raise InvalidSaverInputError(
            f"policy must be a runstore.RetentionPolicy, not {type(policy).__name__}"
        )
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_SWEEP_BATCH:
        raise InvalidSaverInputError(
            f"limit must be an int from 1 to {MAX_SWEEP_BATCH}, not {limit!r}"
        )
    seconds = _seconds(claim_seconds, "claim_seconds")
    if seconds is None:
        raise InvalidSaverInputError("claim_seconds must be a positive number of seconds")
    return int(seconds * _MICROS)


def batch_of(
    claimed: Collection[tuple[str, bool]], swept: Iterable[ThreadSwept | None], limit: int
) -> SweepBatch:
    """The `SweepBatch` of a claim ``(thread_id, deleted)`` and the sweeps of its live threads."""
    done = [s for s in swept if s is not None]
    cleanup = sorted({t for t, deleted in claimed if deleted} | {s.thread_id for s in done if s.expired})
    last = max((t for t, _ in claimed), default=None)
    return SweepBatch(done, cleanup, last if len(claimed) >= limit else None)


def due(
    policy: RetentionPolicy,
    now: int,
    *,
    has_overrides: bool,
    touched_at: int,
    checkpoints: int,
    oldest_at: int | None,
    swept_at: int | None,
    sweep_after: int | None,
    rescan: bool = False,
) -> bool:
    """Whether a live thread is a sweep candidate (the SQL savers' ``SWEEP_CANDIDATES``
    says the same): idle past the TTL, or some limit may touch it and it was not swept
    since its last write, is due again, or ``rescan`` (the policy changed) asks."""
    if checkpoints <= 0:
        return False
    if expired(policy, now=now, touched_at=touched_at):
        return True
    may = (
        has_overrides
        or (policy.keep_last is not None and checkpoints > policy.keep_last)
        or (
            policy.max_age is not None
            and oldest_at is not None
            and oldest_at <= now - int(policy.max_age * _MICROS)
        )
    )
    fresh = swept_at is not None and touched_at <= swept_at and not rescan
    return may and (not fresh or (sweep_after is not None and sweep_after <= now))


def claimable(claimed_until: int | None, now: int) -> bool:
    """Whether a thread's sweep claim has lapsed (or it has none)."""
    return claimed_until is None or claimed_until <= now
