"""`CheckpointStateAccessor`: the one way a runtime reads and writes thread state.

Every call marks the config with the process's channel mode, runs the mode gate
(a full-mode process refuses delta threads before touching them), and goes through
a small state-only graph built from the thread's effective schema, so delta state
is materialized by LangGraph itself and updates are ordinary checkpoints with
intact parent links (never hand-written ones).
"""

from __future__ import annotations

import re
import threading
import typing
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from functools import lru_cache
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.channels.binop import BinaryOperatorAggregate, _get_overwrite
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    CheckpointTuple,
)
from langgraph.graph import END, START, StateGraph
from langgraph.types import Overwrite, StateSnapshot

from runstore.checkpoint import modes
from runstore.checkpoint.forwarding import DeltaMarkingSaver
from runstore.errors import CheckpointModeError, UndeclaredChannelError

#: Node name the mutation graph uses when the caller gives no ``as_node``.
DEFAULT_AS_NODE = "runstore_state_update"

# Channel names a runtime declares look like identifiers; LangGraph's internal ones
# (``__start__``, ``branch:to:agent``...) never survive a restore (they would schedule tasks).
_USER_CHANNEL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _is_user_channel(name: str) -> bool:
    return bool(_USER_CHANNEL.match(name)) and not name.startswith("__")


_TypedDict: Any = typing.TypedDict


@lru_cache(maxsize=256)
def _loose_schema(keys: frozenset[str]) -> type:
    # Channels present on the thread (or in an update) that no bound schema declares:
    # keep them as plain last-value channels so a mutation never drops them.
    schema = _TypedDict("RunstoreLooseChannels", dict.fromkeys(sorted(keys), Any), total=False)
    return cast(type, schema)


def _graph_max_from_settings() -> int:
    settings = modes.current_settings()
    if settings is None:
        return 64
    return settings.checkpoint_graph_cache.accessor_graph_max


def _marks_delta(saver: Any) -> bool:
    # runstore.open already stacks a DeltaMarkingSaver (possibly under the cache).
    for _ in range(8):
        if isinstance(saver, DeltaMarkingSaver):
            return True
        saver = saver.__dict__.get("inner") if hasattr(saver, "__dict__") else None
        if saver is None:
            return False
    return False


def _noop(state: Any) -> dict[str, Any]:
    return {}


def _thread_id(config: RunnableConfig) -> str:
    thread_id = (config.get("configurable") or {}).get("thread_id")
    if thread_id is None:
        raise ValueError("the config needs configurable.thread_id")
    return str(thread_id)


def _head_config(config: RunnableConfig) -> RunnableConfig:
    configurable = dict(config.get("configurable") or {})
    configurable.pop("checkpoint_id", None)
    configurable.setdefault("checkpoint_ns", "")
    out = dict(config)
    out["configurable"] = configurable
    return cast(RunnableConfig, out)


def _empty_like(value: Any) -> Any:
    # Containers reset to empty (a reducer channel stays usable); anything else to None.
    if isinstance(value, list | dict | set | tuple):
        return type(value)()
    return None


class CheckpointStateAccessor:
    """Reads and writes thread state in the process's checkpoint channel mode.

    Build one with `bind`. ``get``/``history``/``update`` (and ``a``-prefixed async
    twins) mark the config, run the mode gate, and use a one-node state-only graph
    over the thread's effective schema (the thread-state schema plus every schema of
    the bound graph, adapted to the mode).
    """

    def __init__(
        self,
        graph: Any,
        checkpointer: BaseCheckpointSaver[Any],
        *,
        mode: modes.CheckpointChannelMode,
        snapshot_frequency: int,
        extra_schemas: Iterable[type] = (),
        graph_cache_max: int | Callable[[], int] | None = None,
    ) -> None:
        self.mode: modes.CheckpointChannelMode = mode
        self.snapshot_frequency = snapshot_frequency
        self.checkpointer = checkpointer
        self._graph_source = graph
        self._extra_schemas = tuple(extra_schemas)
        self._schemas: tuple[type, ...] | None = None
        self._declared: frozenset[str] | None = None
        # Delta writes are stamped by the proxy itself: update_state does not copy
        # config metadata into the checkpoint it writes.
        self._proxy: BaseCheckpointSaver[Any] = (
            checkpointer
            if mode == "full" or _marks_delta(checkpointer)
            else DeltaMarkingSaver(checkpointer)
        )
        if graph_cache_max is None:
            self._graph_max: Callable[[], int] = _graph_max_from_settings
        elif callable(graph_cache_max):
            self._graph_max = graph_cache_max
        else:
            fixed = int(graph_cache_max)
            self._graph_max = lambda: fixed
        self._graphs: OrderedDict[tuple[type, str], Any] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def bind(
        cls,
        graph: Any,
        checkpointer: BaseCheckpointSaver[Any],
        *,
        mode: str | None = None,
        snapshot_frequency: int | None = None,
        extra_schemas: Iterable[type] = (),
        graph_cache_max: int | Callable[[], int] | None = None,
    ) -> CheckpointStateAccessor:
        """Bind ``graph`` (a `StateGraph`, a compiled graph, a factory returning one, or None).

        ``mode``/``snapshot_frequency`` default to what ``checkpointer`` was opened for by
        `runstore.open`, else `modes.resolve_checkpoint_channel_mode` (frozen -> open
        stores -> YAML/env -> ``full``); the accessor keeps them (nothing is frozen).
        ``graph_cache_max`` bounds the compiled-graph cache; by default
        ``checkpoint_graph_cache.accessor_graph_max`` is re-read at every eviction check.
        """
        opened: tuple[Any, Any] = modes.saver_mode(checkpointer) or (None, None)
        resolved = modes.resolve_checkpoint_channel_mode(mode or opened[0])
        frequency = modes.resolve_snapshot_frequency(snapshot_frequency or opened[1])
        return cls(
            graph,
            checkpointer,
            mode=resolved,
            snapshot_frequency=frequency,
            extra_schemas=extra_schemas,
            graph_cache_max=graph_cache_max,
        )

    # ------------------------------------------------------------------ schema and graphs

    def _bound_schemas(self) -> tuple[type, ...]:
        if self._schemas is None:
            source = self._graph_source
            if source is not None and not hasattr(source, "schemas") and not hasattr(
                source, "builder"
            ) and callable(source):
                source = source()
            builder = getattr(source, "builder", source)
            found: tuple[type, ...] = ()
            if builder is not None:
                schemas = getattr(builder, "schemas", None)
                if schemas is None:
                    raise TypeError(
                        f"cannot read state schemas from {type(builder).__name__}; bind a "
                        "StateGraph, a compiled StateGraph or a factory returning one"
                    )
                found = tuple(schemas)
            self._schemas = found + self._extra_schemas
        return self._schemas

    def _declared_channels(self) -> frozenset[str]:
        if self._declared is None:
            declared: set[str] = {modes.MESSAGES_CHANNEL}
            for schema in self._bound_schemas():
                declared.update(getattr(schema, "__annotations__", {}))
                try:
                    declared.update(typing.get_type_hints(schema))
                except Exception:
                    pass  # unresolvable forward refs: __annotations__ already named them
            self._declared = frozenset(declared)
        return self._declared

    def effective_schema(self, extra_channels: Iterable[str] = ()) -> type:
        """The thread-state schema for this accessor: mode ``messages`` + bound schemas + ``extra_channels``."""
        schemas = self._bound_schemas()
        declared = self._declared_channels()
        loose = frozenset(k for k in extra_channels if _is_user_channel(k) and k not in declared)
        if loose:
            schemas = (*schemas, _loose_schema(loose))
        return modes.get_thread_state_schema(
            self.mode, self.snapshot_frequency, extra_schemas=schemas
        )

    def _compiled(self, schema: type, node: str) -> Any:
        key = (schema, node)
        with self._lock:
            graph = self._graphs.get(key)
            if graph is not None:
                self._graphs.move_to_end(key)
                return graph
        builder: StateGraph[Any, Any, Any, Any] = StateGraph(schema)
        builder.add_node(node, _noop)
        builder.add_edge(START, node)
        builder.add_edge(node, END)
        graph = builder.compile(checkpointer=self._proxy)
        with self._lock:
            self._graphs[key] = graph
            self._graphs.move_to_end(key)
            # Re-read the bound on every check so a settings reload takes effect.
            while len(self._graphs) > max(1, int(self._graph_max())):
                self._graphs.popitem(last=False)
        return graph

    def cached_graph_count(self) -> int:
        """How many compiled graphs the accessor holds (bounded by ``accessor_graph_max``)."""
        return len(self._graphs)

    def _read_graph(self) -> Any:
        try:
            return self._compiled(self.effective_schema(), DEFAULT_AS_NODE)
        except CheckpointModeError:
            raise
        except Exception as exc:
            if self.mode == "delta":
                raise CheckpointModeError(
                    "delta checkpoint mode cannot read thread state without the graph's "
                    f"state schema (building it failed: {exc}); there is no raw fallback "
                    "because delta checkpoints do not store messages in full"
                ) from exc
            return None

    def _config(self, config: RunnableConfig) -> RunnableConfig:
        return modes.inject_checkpoint_mode(config, self.mode)

    # ------------------------------------------------------------------ gate

    def _gate(self, head: CheckpointTuple | None, config: RunnableConfig) -> None:
        if head is not None:
            modes.check_checkpoint_mode(head.metadata, _thread_id(config), self.mode)

    async def _agate(self, config: RunnableConfig) -> None:
        if self.mode == "full":
            self._gate(await self.checkpointer.aget_tuple(_head_config(config)), config)

    def _sgate(self, config: RunnableConfig) -> None:
        if self.mode == "full":
            self._gate(self.checkpointer.get_tuple(_head_config(config)), config)

    # ------------------------------------------------------------------ raw fallback (full only)

    @staticmethod
    def _raw_snapshot(config: RunnableConfig, tup: CheckpointTuple | None) -> StateSnapshot:
        if tup is None:
            return StateSnapshot({}, (), config, None, None, None, (), ())
        values = {
            k: v for k, v in tup.checkpoint["channel_values"].items() if _is_user_channel(k)
        }
        return StateSnapshot(
            values, (), tup.config, tup.metadata, tup.checkpoint["ts"], tup.parent_config, (), ()
        )

    # ------------------------------------------------------------------ get

    async def aget(self, config: RunnableConfig) -> StateSnapshot:
        """The thread's state at ``config`` (its head without a ``checkpoint_id``)."""
        config = self._config(config)
        await self._agate(config)
        graph = self._read_graph()
        if graph is None:
            return self._raw_snapshot(config, await self.checkpointer.aget_tuple(config))
        return cast(StateSnapshot, await graph.aget_state(config))

    def get(self, config: RunnableConfig) -> StateSnapshot:
        """Sync `aget`."""
        config = self._config(config)
        self._sgate(config)
        graph = self._read_graph()
        if graph is None:
            return self._raw_snapshot(config, self.checkpointer.get_tuple(config))
        return cast(StateSnapshot, graph.get_state(config))

    # ------------------------------------------------------------------ history

    @staticmethod
    def _check_limit(limit: int | None) -> None:
        if limit is not None and (isinstance(limit, bool) or limit < 0):
            raise ValueError(f"history limit must be >= 0 or None, got {limit!r}")

    async def ahistory(
        self,
        config: RunnableConfig,
        limit: int | None = None,
        *,
        before: RunnableConfig | None = None,
        filter: dict[str, Any] | None = None,
    ) -> list[StateSnapshot]:
        """Newest-first state history; ``limit=0`` is empty, ``None`` unlimited (pushed to the saver)."""
        self._check_limit(limit)
        if limit == 0:
            return []
        return [s async for s in self._aiter_history(config, limit, before, filter)]

    async def _aiter_history(
        self,
        config: RunnableConfig,
        limit: int | None,
        before: RunnableConfig | None,
        filter: dict[str, Any] | None,
    ) -> AsyncIterator[StateSnapshot]:
        config = self._config(config)
        await self._agate(config)
        graph = self._read_graph()
        if graph is None:
            async for tup in self.checkpointer.alist(
                config, filter=filter, before=before, limit=limit
            ):
                yield self._raw_snapshot(config, tup)
            return
        async for snap in graph.aget_state_history(
            config, filter=filter, before=before, limit=limit
        ):
            yield snap

    def history(
        self,
        config: RunnableConfig,
        limit: int | None = None,
        *,
        before: RunnableConfig | None = None,
        filter: dict[str, Any] | None = None,
    ) -> list[StateSnapshot]:
        """Sync `ahistory`."""
        self._check_limit(limit)
        if limit == 0:
            return []
        return list(self._iter_history(config, limit, before, filter))

    def _iter_history(
        self,
        config: RunnableConfig,
        limit: int | None,
        before: RunnableConfig | None,
        filter: dict[str, Any] | None,
    ) -> Iterator[StateSnapshot]:
        config = self._config(config)
        self._sgate(config)
        graph = self._read_graph()
        if graph is None:
            for tup in self.checkpointer.list(config, filter=filter, before=before, limit=limit):
                yield self._raw_snapshot(config, tup)
            return
        yield from graph.get_state_history(config, filter=filter, before=before, limit=limit)

    # ------------------------------------------------------------------ update

    def _mutation(
        self, head: CheckpointTuple | None, values: Mapping[str, Any], as_node: str | None
    ) -> tuple[Any, dict[str, Any], str]:
        node = as_node or DEFAULT_AS_NODE
        declared = self._declared_channels()
        for key in values:
            if key not in declared:
                # Stored, it would be write-only: reads build state from declared channels.
                raise UndeclaredChannelError(str(key), declared)
        present = set(values)
        if head is not None:
            present.update(head.checkpoint["channel_values"])
        graph = self._compiled(self.effective_schema(present), node)
        writes: dict[str, Any] = {}
        for key, value in values.items():
            channel = graph.channels.get(key)
            reducer = isinstance(channel, BinaryOperatorAggregate | DeltaChannel)
            if reducer and not _get_overwrite(value)[0]:
                # Replace wholesale: a reducer would merge instead.
                value = Overwrite(value)
            writes[key] = value
        return graph, writes, node

    async def aupdate(
        self,
        config: RunnableConfig,
        values: Mapping[str, Any],
        as_node: str | None = None,
    ) -> RunnableConfig:
        """Replace ``values`` wholesale on the checkpoint ``config`` names (the head by default).

        Writes through a one-node state-only graph with ``Overwrite`` on reducer
        channels; channels of every bound schema survive; the new head schedules
        no task. Returns the new checkpoint's config.
        """
        config = self._config(config)
        head = await self.checkpointer.aget_tuple(_head_config(config))
        if self.mode == "full":
            self._gate(head, config)
        graph, writes, node = self._mutation(head, values, as_node)
        return cast(RunnableConfig, await graph.aupdate_state(config, writes, as_node=node))

    def update(
        self,
        config: RunnableConfig,
        values: Mapping[str, Any],
        as_node: str | None = None,
    ) -> RunnableConfig:
        """Sync `aupdate`."""
        config = self._config(config)
        head = self.checkpointer.get_tuple(_head_config(config))
        if self.mode == "full":
            self._gate(head, config)
        graph, writes, node = self._mutation(head, values, as_node)
        return cast(RunnableConfig, graph.update_state(config, writes, as_node=node))

    # ------------------------------------------------------------------ resume and rollback

    def _restore_values(
        self, target: StateSnapshot, head: StateSnapshot | None
    ) -> dict[str, Any]:
        values = dict(target.values or {})
        if head is not None:
            # Head-only channels did not exist at the target: reset them.
            for key, value in (head.values or {}).items():
                if key not in values:
                    values[key] = _empty_like(value)
        values.setdefault(modes.MESSAGES_CHANNEL, [])
        return values

    async def arestore(
        self, config: RunnableConfig, *, as_node: str | None = None
    ) -> RunnableConfig:
        """Make the state at checkpoint ``config`` the thread's current state; return the new head.

        Delta mode linearizes: the materialized target state is written onto the
        current head with ``Overwrite`` (head-only channels reset), so history stays
        one line and a superseded answer can never come back. Full mode keeps
        LangGraph's forking: the new checkpoint is a child of the target.
        """
        config = self._config(config)
        await self._agate(config)
        target = await self.aget(config)
        if not target.values and target.metadata is None:
            raise ValueError(f"no checkpoint at {config.get('configurable')!r} to restore")
        if self.mode == "full":
            fork_from = target.config
            values = self._restore_values(target, None)
            return await self.aupdate(fork_from, values, as_node=as_node)
        head = await self.aget(_head_config(config))
        values = self._restore_values(target, head)
        return await self.aupdate(_head_config(config), values, as_node=as_node)

    def restore(self, config: RunnableConfig, *, as_node: str | None = None) -> RunnableConfig:
        """Sync `arestore`."""
        config = self._config(config)
        self._sgate(config)
        target = self.get(config)
        if not target.values and target.metadata is None:
            raise ValueError(f"no checkpoint at {config.get('configurable')!r} to restore")
        if self.mode == "full":
            return self.update(target.config, self._restore_values(target, None), as_node=as_node)
        head = self.get(_head_config(config))
        return self.update(
            _head_config(config), self._restore_values(target, head), as_node=as_node
        )

    async def arollback(
        self, config: RunnableConfig, *, as_node: str | None = None
    ) -> RunnableConfig:
        """Roll the thread back to a captured pre-run checkpoint (see `arestore`)."""
        return await self.arestore(config, as_node=as_node)

    def rollback(self, config: RunnableConfig, *, as_node: str | None = None) -> RunnableConfig:
        """Sync `arollback`."""
        return self.restore(config, as_node=as_node)

    async def aprepare_resume(self, config: RunnableConfig) -> RunnableConfig:
        """The config to run from when resuming at ``config``.

        Full mode returns it unchanged (LangGraph forks from the older checkpoint).
        Delta mode linearizes an older checkpoint onto the head (`arestore`) and
        returns the thread's head config; the head itself is returned as is.
        """
        config = self._config(config)
        checkpoint_id = (config.get("configurable") or {}).get("checkpoint_id")
        if self.mode == "full" or not checkpoint_id:
            await self._agate(config)
            return config
        head = await self.checkpointer.aget_tuple(_head_config(config))
        if head is not None and head.checkpoint["id"] == checkpoint_id:
            return _head_config(config)
        await self.arestore(config)
        return _head_config(config)
