"""Small, backend-neutral helpers that checkpoint savers share.

Nothing here touches storage: these are the rules every saver has to apply the
same way (which ids are accepted, write slots, which ancestors
a delta reconstruction needs), kept in one place so the memory, sqlite and
PostgreSQL savers (and third-party ones) agree. The metadata filter rule lives in
`runstore.checkpoint.filters`.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import WRITES_IDX_MAP

from runstore.errors import InvalidSaverInputError
from runstore.fencing import MAX_FENCE
from runstore.fencing import check_fence as _check_fence
from runstore.moved import moved_attribute
from runstore.validation import check_text

R = TypeVar("R")

#: LangGraph's per-checkpoint metadata naming the delta channels not snapshotted there.
DELTA_COUNTERS_KEY = "counters_since_delta_snapshot"
#: `aget_tuple` on a thread's head prefetches its delta history only up to this many
#: supersteps since the last snapshot: beyond, the history costs more than the round
#: trip it saves, and a caller that wants only the head would pay for all of it.
PREFETCH_MAX_SUPERSTEPS = 256

__all__ = [
    "DELTA_COUNTERS_KEY",
    "FENCE_KEY",
    "MAX_FENCE",
    "PREFETCH_MAX_SUPERSTEPS",
    "PRUNE_STRATEGIES",
    "PRUNE_STRATEGY_ALIASES",
    "THREAD_ID_METADATA_KEY",
    "check_channels",
    "check_fence",
    "check_prune_strategy",
    "check_put",
    "check_put_writes",
    "checked_ids",
    "checked_text",
    "checkpoint_config",
    "config_address",
    "config_fence",
    "delta_channels",
    "history_channels",
    "is_last_write_wins",
    "missing_delta_channels",
    "reconstruction_ancestors",
    "renamed_thread_metadata",
    "worth_prefetching",
    "write_slot",
]


def write_slot(channel: str, idx: int) -> int:
    """The storage index of the ``idx``-th write of a task: special channels get their
    fixed negative slot (`WRITES_IDX_MAP`), everything else keeps its position."""
    return WRITES_IDX_MAP.get(channel, idx)


def is_last_write_wins(slot: int) -> bool:
    """Whether a write stored at ``slot`` replaces an existing one (special negative
    slots: errors, interrupts, resumes) instead of being ignored (first write wins)."""
    return slot < 0


def checkpoint_config(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> RunnableConfig:
    """The config that addresses one stored checkpoint."""
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": checkpoint_ns,
            "checkpoint_id": checkpoint_id,
        }
    }


def checked_text(value: Any, field: str, *, empty_ok: bool = False) -> str:
    """``value`` as the text a saver stores for ``field`` (an id, a namespace, a channel).

    Non-str values (an int thread id, a UUID) are stored as their ``str``. Raises
    `InvalidSaverInputError` naming ``field`` for ``None``, an empty string (unless
    ``empty_ok``), a NUL character or a lone surrogate: no saver can store those the
    same way (PostgreSQL text rejects NUL, sqlite and JSON reject lone surrogates).
    """
    if value is None:
        raise InvalidSaverInputError(f"{field} is required; accepted: a non-empty string")
    text = value if isinstance(value, str) else str(value)
    if not text and not empty_ok:
        raise InvalidSaverInputError(f"{field} must be a non-empty string")
    if not text.isascii() or "\x00" in text:  # plain text (below) needs no more checks
        check_text(text, field, InvalidSaverInputError)
    return text


def _all_plain(texts: Iterable[Any]) -> bool:
    """Whether every item is plain text (a str of ASCII without NUL), which every saver
    stores as it is: one pass over their concatenation settles the usual case on every
    call's path; anything else is checked item by item, with its own message."""
    try:
        joined = "".join(texts)
    except TypeError:  # not a str
        return False
    return joined.isascii() and "\x00" not in joined


#: A write's channel (of ``(channel, value)``).
_channel_of = operator.itemgetter(0)


def check_channels(versions: Mapping[str, Any], where: str) -> None:
    """Check the channel names and text versions of ``versions``: no NUL, no lone
    surrogate (`checked_text`; empty names and versions are allowed)."""
    if _all_plain([*versions, *(v for v in versions.values() if isinstance(v, str))]):
        return
    for channel, version in versions.items():
        checked_text(channel, f"a channel name in {where}", empty_ok=True)
        if isinstance(version, str):
            checked_text(version, f"the version of channel {channel!r} in {where}", empty_ok=True)


def check_put(
    config: RunnableConfig, checkpoint: Mapping[str, Any], new_versions: Mapping[str, Any]
) -> tuple[str, str, str | None, str]:
    """Check a ``put``'s ids and channels; ``(thread_id, checkpoint_ns, parent_id, checkpoint_id)``."""
    thread_id, checkpoint_ns, parent_id = config_address(config)
    checkpoint_id = checked_text(checkpoint.get("id"), "checkpoint id")
    versions = checkpoint.get("channel_versions") or {}
    values = checkpoint.get("channel_values") or {}
    if not _all_plain(
        [*versions, *versions.values(), *new_versions, *new_versions.values(), *values]
    ):
        check_channels(versions, "channel_versions")
        check_channels(new_versions, "new_versions")
        check_channels(dict.fromkeys(values, 0), "channel_values")
    return thread_id, checkpoint_ns, parent_id, checkpoint_id


def check_put_writes(
    config: RunnableConfig, writes: Iterable[tuple[str, Any]], task_id: Any, task_path: Any
) -> tuple[str, str, str, str, str]:
    """Check a ``put_writes``'s ids and channels;
    ``(thread_id, checkpoint_ns, checkpoint_id, task_id, task_path)``."""
    thread_id, checkpoint_ns, checkpoint_id = config_address(config)
    if checkpoint_id is None:
        raise InvalidSaverInputError(
            "put_writes needs config['configurable']['checkpoint_id'] (the checkpoint the "
            "writes belong to)"
        )
    if not _all_plain(map(_channel_of, writes)):
        for channel, _ in writes:
            checked_text(channel, "a write's channel", empty_ok=True)
    return (
        thread_id,
        checkpoint_ns,
        checkpoint_id,
        checked_text(task_id, "task_id"),
        checked_text(task_path, "task_path", empty_ok=True),
    )


def checked_ids(ids: Iterable[Any], field: str) -> list[str]:
    """Each of ``ids`` (thread or run ids) as checked text (`checked_text`)."""
    if isinstance(ids, str):
        raise InvalidSaverInputError(f"{field} must be a sequence of ids, not one string")
    return [checked_text(i, f"an id in {field}") for i in ids]


def history_channels(channels: Iterable[str]) -> list[str]:
    """The distinct channels of a delta-history request, in order, checked."""
    return [checked_text(ch, "channel") for ch in dict.fromkeys(channels)]


#: ``prune`` strategies every saver accepts.
PRUNE_STRATEGIES = ("keep_latest", "delete")
#: Other names a saver accepts for them: LangGraph's Agent Server sends ``delete_all``.
PRUNE_STRATEGY_ALIASES = {"delete_all": "delete"}


def check_prune_strategy(strategy: str) -> str:
    """The `PRUNE_STRATEGIES` name ``strategy`` means (an alias resolved);
    `InvalidSaverInputError` (a `ValueError`) naming every accepted name otherwise."""
    canonical = PRUNE_STRATEGY_ALIASES.get(strategy, strategy) if isinstance(strategy, str) else None
    if canonical not in PRUNE_STRATEGIES:
        accepted = [*PRUNE_STRATEGIES, *(f"{a} (= {c})" for a, c in PRUNE_STRATEGY_ALIASES.items())]
        raise InvalidSaverInputError(
            f"unknown prune strategy {strategy!r}; accepted: {', '.join(accepted)}"
        )
    return str(canonical)


#: The metadata key naming a checkpoint's thread (LangGraph's Agent Server writes it).
THREAD_ID_METADATA_KEY = "thread_id"


def renamed_thread_metadata(metadata: Mapping[str, Any], source: str, target: str) -> dict[str, Any] | None:
    """``metadata`` of a checkpoint copied from thread ``source`` to ``target``: its
    `THREAD_ID_METADATA_KEY` rewritten when it names ``source``; ``None`` when nothing changes."""
    if metadata.get(THREAD_ID_METADATA_KEY) != source:
        return None
    return {**metadata, THREAD_ID_METADATA_KEY: target}


def config_address(config: RunnableConfig) -> tuple[str, str, str | None]:
    """``(thread_id, checkpoint_ns, checkpoint_id or None)`` named by a config, checked.

    ``thread_id`` is required; ``checkpoint_ns`` defaults to ``""`` (the root graph).
    """
    configurable = (config or {}).get("configurable") or {}
    thread_id = configurable.get("thread_id")
    ns = configurable.get("checkpoint_ns")
    if ns is None:
        ns = ""
    checkpoint_id = configurable.get("checkpoint_id")
    if thread_id and _all_plain((thread_id, ns, checkpoint_id or "")):
        return thread_id, ns, checkpoint_id or None
    thread_id = checked_text(thread_id, "config['configurable']['thread_id']")
    checkpoint_ns = checked_text(ns, "checkpoint_ns", empty_ok=True)
    return (
        thread_id,
        checkpoint_ns,
        checked_text(checkpoint_id, "checkpoint_id") if checkpoint_id else None,
    )


#: The ``configurable`` key a fenced write's token travels under (a run store lease's
#: ``fence``); a write without it is not fenced.
FENCE_KEY = "runstore_fence"


def check_fence(value: Any, what: str = "fence") -> int:
    """A fencing token: an int from 1 to `MAX_FENCE` (not a bool); else `InvalidSaverInputError`."""
    return _check_fence(value, what, InvalidSaverInputError)


def config_fence(config: RunnableConfig | None) -> int | None:
    """The fencing token a write's config carries (``configurable.runstore_fence``), checked;
    ``None`` when it carries none (the write is not fenced)."""
    value = ((config or {}).get("configurable") or {}).get(FENCE_KEY)
    return None if value is None else check_fence(value, f"config['configurable'][{FENCE_KEY!r}]")


def worth_prefetching(metadata: Mapping[str, Any] | None) -> bool:
    """Whether the head's delta history is short enough to fetch along with it.

    Reads the supersteps since the last snapshot from LangGraph's counters
    (``{channel: [updates, supersteps]}``); malformed counters count as short.
    """
    counters = (metadata or {}).get(DELTA_COUNTERS_KEY)
    if not isinstance(counters, Mapping):
        return True
    for value in counters.values():
        if isinstance(value, list | tuple) and len(value) > 1:
            steps = value[1]
            if isinstance(steps, int | float) and steps > PREFETCH_MAX_SUPERSTEPS:
                return False
    return True


def delta_channels(metadata: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The delta channels a checkpoint's metadata names (``counters_since_delta_snapshot``).

    LangGraph lists every `DeltaChannel` there whose counters are non-zero, i.e. each
    one not snapshotted at that checkpoint. Only these need their history to rebuild:
    an ordinary channel with nothing stored (a consumed trigger, say) is just empty.
    """
    counters = (metadata or {}).get(DELTA_COUNTERS_KEY)
    if not isinstance(counters, Mapping):
        return ()
    return tuple(sorted(str(k) for k in counters))


def missing_delta_channels(
    metadata: Mapping[str, Any] | None,
    channel_versions: Collection[str] | None,
    valued: Collection[str],
) -> list[str]:
    """The delta channels a reconstruction at one checkpoint rebuilds from its ancestors.

    Those its metadata names (`delta_channels`) that have a version there
    (``channel_versions``) but hold no value (``valued``). A delta channel without a
    version was never written: it is empty and needs no history. ``None`` for
    ``channel_versions`` means unknown (rows stored before the versions were kept):
    every named channel is then taken to have one, which keeps more, never less.
    """
    return [
        ch
        for ch in delta_channels(metadata)
        if ch not in valued and (channel_versions is None or ch in channel_versions)
    ]


def reconstruction_ancestors(
    start_id: str,
    channels: Iterable[str],
    parent_of: Callable[[str], str | None],
    valued_channels: Callable[[str], Collection[str]],
) -> list[str]:
    """Ancestors (nearest first) a delta reconstruction of ``channels`` at ``start_id`` reads.

    Walks parent links from ``start_id``'s parent; each channel stops at the first
    ancestor holding a value for it (``valued_channels(id)``). Savers keep these when
    pruning or deleting so a surviving checkpoint still rebuilds the same state; pass
    as ``channels`` the start checkpoint's `missing_delta_channels`.
    ``parent_of`` returns ``None`` for a root or a checkpoint that no longer exists.
    """
    remaining = set(channels)
    chain: list[str] = []
    current = parent_of(start_id) if remaining else None
    seen: set[str] = set()
    while current is not None and remaining and current not in seen:
        seen.add(current)
        chain.append(current)
        remaining.difference_update(valued_channels(current))
        current = parent_of(current)
    return chain


# The sync-twin helpers serve every kind, so they live in `runstore.twins` now.
__getattr__ = moved_attribute(__name__, {"run_sync": "runstore.twins", "ensure_off_loop": "runstore.twins"})
