"""`ForwardingSaver`: a `BaseCheckpointSaver` that hands every call to an inner saver.

The history cache and the accessor's marking proxy subclass it and override only
what they change, so they work over any saver (ours, the stock ones, a third party's).
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Collection, Iterator, Mapping, Sequence
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
)


class ForwardingSaver(BaseCheckpointSaver[Any]):
    """Delegate every saver method to ``inner``; unknown attributes are forwarded too."""

    def __init__(self, inner: BaseCheckpointSaver[Any]) -> None:
        # No super().__init__: the serializer is the inner saver's, not a new default.
        self.inner = inner
        self.serde = inner.serde

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes this class lacks (backend-specific extras).
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def config_specs(self) -> list[Any]:
        return self.inner.config_specs

    def with_allowlist(self, extra_allowlist: Collection[tuple[str, ...]]) -> ForwardingSaver:
        inner = self.inner.with_allowlist(extra_allowlist)
        if inner is self.inner:
            return self
        clone = copy.copy(self)
        clone.inner = inner
        clone.serde = inner.serde
        return clone

    def get_next_version(self, current: Any, channel: None) -> Any:
        return self.inner.get_next_version(current, channel)

    # ---------------------------------------------------------------- sync

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self.inner.get_tuple(config)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        return self.inner.list(config, filter=filter, before=before, limit=limit)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self.inner.put(config, checkpoint, metadata, new_versions)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        return self.inner.put_writes(config, writes, task_id, task_path)

    def delete_thread(self, thread_id: str, **fence: Any) -> None:
        # ``fence=`` only when given: a stock inner saver takes the thread id alone.
        return self.inner.delete_thread(thread_id, **fence)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        return self.inner.delete_for_runs(run_ids)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        return self.inner.copy_thread(source_thread_id, target_thread_id)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        return self.inner.prune(thread_ids, strategy=strategy)

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return self.inner.get_delta_channel_history(config=config, channels=channels)

    # ---------------------------------------------------------------- async

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self.inner.aget_tuple(config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        async for item in self.inner.alist(config, filter=filter, before=before, limit=limit):
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await self.inner.aput(config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        return await self.inner.aput_writes(config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str, **fence: Any) -> None:
        return await self.inner.adelete_thread(thread_id, **fence)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        return await self.inner.adelete_for_runs(run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        return await self.inner.acopy_thread(source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        return await self.inner.aprune(thread_ids, strategy=strategy)

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return await self.inner.aget_delta_channel_history(config=config, channels=channels)


class DeltaMarkingSaver(ForwardingSaver):
    """Stamps ``runstore_checkpoint_channel_mode: "delta"`` on every checkpoint it writes.

    `runstore.open` wraps the saver in it in delta mode (and the accessor's graphs
    write through it), so the marker does not depend on callers remembering
    `inject_checkpoint_mode`. Right after a snapshot LangGraph's own counters are
    absent, so without the marker such a checkpoint would look like full mode.
    """

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self.inner.put(config, checkpoint, _marked(metadata), new_versions)

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await self.inner.aput(config, checkpoint, _marked(metadata), new_versions)


def _marked(metadata: CheckpointMetadata) -> CheckpointMetadata:
    from runstore.checkpoint.modes import MODE_METADATA_KEY

    out: dict[str, Any] = dict(metadata)
    out[MODE_METADATA_KEY] = "delta"
    return cast(CheckpointMetadata, out)


def unwrap_saver(saver: BaseCheckpointSaver[Any]) -> BaseCheckpointSaver[Any]:
    """The backend saver under any `ForwardingSaver` wrappers (``saver`` itself if none).

    ``runstore.open`` in delta mode returns the saver wrapped (`DeltaMarkingSaver`, and
    `CachedHistorySaver` where the history cache is on); this reaches the class behind
    them (a `SqliteSaver`, a `PostgresSaver`) for its backend-specific attributes.
    """
    while isinstance(saver, ForwardingSaver):
        saver = saver.inner
    return saver
