"""The saver API beyond LangGraph's `BaseCheckpointSaver`, declared per capability.

A saver that declares a capability (`runstore.capabilities`) promises the methods of
its Protocol here: ``thread_index`` -> `ThreadIndexSaver`, ``retention`` ->
`RetentionSaver`, ``fencing`` -> `FencingSaver`, and so on (`CONTRACTS`). With
``sync_api`` it also promises the synchronous twins of those (`SYNC_CONTRACTS`).
`runstore.registry.BackendSpec.open` holds every saver it opens to its declaration
(`check_saver`): one that declares a capability but lacks a method of it is refused
with `PluginError` naming the methods, before anything calls them.

The sweeper, the worker and the CLI ask for an extension with ``isinstance`` against
these runtime-checkable Protocols, on the saver behind any wrappers (`unwrap_saver`),
instead of probing attribute names one by one. ``isinstance`` sees only whether each
method exists; `missing_methods` also refuses the ``NotImplementedError`` defaults
`BaseCheckpointSaver` carries for ``acopy_thread``, ``aprune`` and the like.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from runstore.errors import PluginError

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        DeltaChannelHistory,
    )

    from runstore.checkpoint.policy import Compaction, RetentionPolicy, SweepBatch
    from runstore.checkpoint.threads import Removed, ThreadInfo, ThreadPage

__all__ = [
    "CONTRACTS",
    "SYNC_CONTRACTS",
    "CompactingSaver",
    "CopyingSaver",
    "DeltaHistorySaver",
    "FencingSaver",
    "PruningSaver",
    "RetentionSaver",
    "RunDeletingSaver",
    "SyncCopyingSaver",
    "SyncDeltaHistorySaver",
    "SyncPruningSaver",
    "SyncRunDeletingSaver",
    "SyncSaver",
    "SyncThreadIndexSaver",
    "ThreadIndexSaver",
    "check_saver",
    "contract_methods",
    "missing_methods",
    "promised",
]


# -- async contracts, one per capability ------------------------------------------------


@runtime_checkable
class ThreadIndexSaver(Protocol):
    """``thread_index``: a per-thread record kept with the writes (docs/threads.md)."""

    async def aget_thread(self, thread_id: str) -> ThreadInfo | None:
        """The thread's record, or ``None`` for a thread never written or deleted."""
        ...

    async def alist_threads(
        self,
        *,
        filter: Mapping[str, Any] | None = None,
        status: str | None = None,
        updated_after: Any = None,
        updated_before: Any = None,
        order_by: str = "updated_at",
        limit: int = 50,
        cursor: str | None = None,
    ) -> ThreadPage:
        """One page of threads matching the filters, with the cursor of the next."""
        ...

    async def atouch_thread(self, thread_id: str) -> bool:
        """Count a read as activity (idle expiry); ``False`` for an unknown thread."""
        ...


@runtime_checkable
class RetentionSaver(Protocol):
    """``retention``: a `RetentionPolicy` applied in claimed batches (`runstore.sweeper`)."""

    async def asweep(
        self,
        policy: RetentionPolicy,
        *,
        after: str | None = None,
        limit: int = 100,
        dry_run: bool = False,
        claim_seconds: float = 300.0,
        rescan: bool = False,
        thread_ids: Sequence[str] | None = None,
    ) -> SweepBatch:
        """Claim one batch of threads after ``after`` and sweep each with ``policy``."""
        ...

    async def aset_thread_retention(self, thread_id: str, overrides: Mapping[str, Any] | None) -> None:
        """Override the policy for one thread (``None``: back to the defaults)."""
        ...

    async def afinish_cleanup(self, thread_ids: Sequence[str]) -> None:
        """Mark deleted threads' tombstones done once their events and streams are gone."""
        ...

    async def apurge_threads(self, thread_ids: Sequence[str], *, dry_run: bool = False) -> Removed:
        """Delete threads whole, leaving tombstones; say what went (or would go)."""
        ...


@runtime_checkable
class FencingSaver(Protocol):
    """``fencing``: refuse writes carrying a token older than one the thread has seen."""

    async def afence_thread(self, thread_id: str, fence: int) -> None:
        """Raise the thread's fence to ``fence`` (`StaleFenceError` if a newer one passed)."""
        ...


@runtime_checkable
class CopyingSaver(Protocol):
    """``copy_thread``: copy a thread with its whole parent chain."""

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write of ``source_thread_id`` to ``target_thread_id``."""
        ...


@runtime_checkable
class PruningSaver(Protocol):
    """``prune``: drop old checkpoints while every delta reconstruction stays intact."""

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Prune each thread with ``strategy``."""
        ...


@runtime_checkable
class RunDeletingSaver(Protocol):
    """``delete_for_runs``: delete what given runs wrote."""

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints and writes of ``run_ids``."""
        ...


@runtime_checkable
class DeltaHistorySaver(Protocol):
    """``delta_history``: the delta-history walk done natively, not by LangGraph's default."""

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """The writes to ``channels`` since their last snapshot, oldest first."""
        ...


# -- sync_api: LangGraph's sync methods, and the sync twins of the contracts above -------


@runtime_checkable
class SyncSaver(Protocol):
    """``sync_api``: LangGraph's synchronous saver methods, each written (not the default)."""

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (or the thread's latest)."""
        ...

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints matching ``config`` and ``filter``, newest first."""
        ...

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint."""
        ...

    def put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        """Store a task's pending writes."""
        ...

    def delete_thread(self, thread_id: str) -> None:
        """Delete a thread."""
        ...


@runtime_checkable
class SyncThreadIndexSaver(Protocol):
    """``thread_index`` with ``sync_api``: the index's synchronous reads."""

    def get_thread(self, thread_id: str) -> ThreadInfo | None:
        """`ThreadIndexSaver.aget_thread`, synchronously."""
        ...

    def list_threads(
        self,
        *,
        filter: Mapping[str, Any] | None = None,
        status: str | None = None,
        updated_after: Any = None,
        updated_before: Any = None,
        order_by: str = "updated_at",
        limit: int = 50,
        cursor: str | None = None,
    ) -> ThreadPage:
        """`ThreadIndexSaver.alist_threads`, synchronously."""
        ...


@runtime_checkable
class SyncCopyingSaver(Protocol):
    """``copy_thread`` with ``sync_api``."""

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """`CopyingSaver.acopy_thread`, synchronously."""
        ...


@runtime_checkable
class SyncPruningSaver(Protocol):
    """``prune`` with ``sync_api``."""

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """`PruningSaver.aprune`, synchronously."""
        ...


@runtime_checkable
class SyncRunDeletingSaver(Protocol):
    """``delete_for_runs`` with ``sync_api``."""

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """`RunDeletingSaver.adelete_for_runs`, synchronously."""
        ...


@runtime_checkable
class SyncDeltaHistorySaver(Protocol):
    """``delta_history`` with ``sync_api``."""

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """`DeltaHistorySaver.aget_delta_channel_history`, synchronously."""
        ...


# -- extras no capability names -----------------------------------------------------------


@runtime_checkable
class CompactingSaver(Protocol):
    """A saver whose storage can give freed space back (sqlite, PostgreSQL): what
    ``runstore compact`` and ``sweep(compact=True)`` call; optional, no capability."""

    async def acompact(self, *, full: bool = False) -> Compaction:
        """Return the space deleted rows held to the file system (``full``: rewrite it all)."""
        ...


#: The Protocol each saver capability promises; capabilities absent here (``durable``,
#: ``typed_filters``, ...) are behaviour of the base methods, which the suite checks.
CONTRACTS: dict[str, type] = {
    "thread_index": ThreadIndexSaver,
    "retention": RetentionSaver,
    "fencing": FencingSaver,
    "copy_thread": CopyingSaver,
    "prune": PruningSaver,
    "delete_for_runs": RunDeletingSaver,
    "delta_history": DeltaHistorySaver,
    "sync_api": SyncSaver,
}

#: What a capability adds when ``sync_api`` is declared beside it.
SYNC_CONTRACTS: dict[str, type] = {
    "thread_index": SyncThreadIndexSaver,
    "copy_thread": SyncCopyingSaver,
    "prune": SyncPruningSaver,
    "delete_for_runs": SyncRunDeletingSaver,
    "delta_history": SyncDeltaHistorySaver,
}


def contract_methods(protocol: type) -> tuple[str, ...]:
    """The method names ``protocol`` declares, in definition order."""
    return tuple(
        name for name, value in vars(protocol).items() if not name.startswith("_") and callable(value)
    )


def promised(capabilities: Iterable[str]) -> Iterator[tuple[str, type]]:
    """``(capability, Protocol)`` for each contract ``capabilities`` promise; the sync
    twins come under ``sync_api``."""
    declared = sorted(set(capabilities))
    for capability in declared:
        if capability in CONTRACTS:
            yield capability, CONTRACTS[capability]
    if "sync_api" in declared:
        for capability in declared:
            if capability in SYNC_CONTRACTS:
                yield "sync_api", SYNC_CONTRACTS[capability]


def missing_methods(saver: object, capabilities: Iterable[str]) -> dict[str, list[str]]:
    """Capability -> the methods of its contracts ``saver`` lacks (only capabilities lacking some).

    A method counts as present when the saver (behind any `ForwardingSaver` wrappers)
    has it callable and it is not `BaseCheckpointSaver`'s own ``NotImplementedError``
    default.
    """
    from langgraph.checkpoint.base import BaseCheckpointSaver

    from runstore.checkpoint.forwarding import unwrap_saver

    inner: Any = unwrap_saver(saver) if isinstance(saver, BaseCheckpointSaver) else saver
    found: dict[str, list[str]] = {}
    for capability, protocol in promised(capabilities):
        for name in contract_methods(protocol):
            default = getattr(BaseCheckpointSaver, name, None)
            written = callable(getattr(inner, name, None)) and (
                default is None or getattr(type(inner), name, None) is not default
            )
            if not written:
                found.setdefault(capability, []).append(name)
    return found


def check_saver(saver: object, capabilities: Iterable[str], *, where: str) -> None:
    """Refuse ``saver`` with `PluginError` if it lacks a method of a capability it declares.

    The message names, per capability, the missing methods, e.g. ``declares retention
    but lacks asweep``.
    """
    missing = missing_methods(saver, capabilities)
    if missing:
        lacks = "; ".join(f"declares {cap} but lacks {', '.join(names)}" for cap, names in missing.items())
        raise PluginError(
            f"{where}: {type(saver).__name__} {lacks}. Write the missing methods "
            "(runstore.checkpoint.contracts lists each capability's) or stop declaring the capability"
        )

