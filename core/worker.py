"""A worker loop over the run store: run work under a lease, fenced, and recover orphans.

The loop docs/runs.md ("Worker loop") describes, as importable code::

    worker = Worker(stores.runs, stores.checkpointer, owner="worker-1",
                    streams=stores.streams, events=stores.events)
    done = await worker.run_graph(graph, "thread-1", {"messages": [...]})
    recovered = await worker.recover()          # periodically, on every worker

`Worker.execute` is the heart: fence every store of the run with the lease's token
(`runstore.fencing.fence_stores`: saver, event store, stream bridge; older tokens are
refused from then on), run the work with the token in its config and fenced handles
of the event store and bridge (`Lease.events`, `Lease.streams`), renew the lease in
the background every ``ttl / 3`` seconds, and finalize. When a renewal says the
lease is lost, or a write is refused as stale, the work is cancelled and nothing
more is written: the run belongs to whoever claimed it. A pending cancel request
stops the work and finalizes the run as ``cancelled``/``interrupted``.

Every run that ends through a worker, normally or by recovery, ends its stream (END
on the stream bridge) and gets one completion event (`COMPLETION_EVENT`, written with
``put_if_absent``, so a recovery after a worker that died between the two writes none
twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from runstore.checkpoint.rules import FENCE_KEY
from runstore.errors import InvalidEventError, LeaseLostError, StaleFenceError
from runstore.fencing import FenceGrant, fence_stores
from runstore.runs.protocol import CancelAction, RunRecord, RunStore, check_id, check_seconds

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import BaseCheckpointSaver

    from runstore.events.protocol import RunEventStore
    from runstore.streams.protocol import StreamBridge

log = logging.getLogger("runstore.worker")

T = TypeVar("T")

#: ``event_type`` of the event every run ending through a worker gets (one per run).
COMPLETION_EVENT = "run_completed"
#: Its category.
COMPLETION_CATEGORY = "lifecycle"
#: ``stop_reason`` of a run that recovery ended because its worker stopped renewing.
WORKER_LOST = "worker_lost"

Outcome = Literal["finished", "lost"]


class FencedEvents:
    """The event store as a lease's holder writes it: every append goes to the lease's
    thread and run and carries its token, so a holder that lost the lease is refused.

    ``put``, ``put_batch`` and ``put_if_absent`` take the store's keywords without
    ``thread_id``, ``run_id`` and ``fence`` (the handle supplies them; a batch's
    mappings may name the lease's thread and run, no other). Reads go to the store.
    """

    def __init__(self, store: RunEventStore, thread_id: str, run_id: str, fence: int) -> None:
        self.store = store
        self.thread_id = thread_id
        self.run_id = run_id
        self.fence = fence

    def _event(self, event: Mapping[str, Any]) -> dict[str, Any]:
        for key in ("thread_id", "run_id"):
            if key in event and event[key] != getattr(self, key):
                raise InvalidEventError(
                    f"a lease's event handle writes {key}={getattr(self, key)!r} only (its token "
                    f"fences that thread), not {event[key]!r}; use the store itself for other runs"
                )
        if "fence" in event:
            raise InvalidEventError("a lease's event handle supplies fence itself; drop the fence argument")
        return {**event, "thread_id": self.thread_id, "run_id": self.run_id}

    async def put(self, **event: Any) -> Any:
        """`RunEventStore.put` on the lease's run, fenced."""
        return await self.store.put(**self._event(event), fence=self.fence)

    async def put_batch(self, events: Sequence[Mapping[str, Any]], **kwargs: Any) -> Any:
        """`RunEventStore.put_batch` on the lease's run, fenced."""
        if "fence" in kwargs:
            raise InvalidEventError("a lease's event handle supplies fence itself; drop the fence argument")
        return await self.store.put_batch([self._event(e) for e in events], **kwargs, fence=self.fence)

    async def put_if_absent(self, **event: Any) -> Any:
        """`RunEventStore.put_if_absent` on the lease's run, fenced."""
        return await self.store.put_if_absent(**self._event(event), fence=self.fence)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


class FencedStream:
    """The stream bridge as a lease's holder publishes: to the lease's run, with its token
    (a bridge that predates ``fence=`` gets none), so a stale publish or END is refused."""

    def __init__(self, bridge: StreamBridge, run_id: str, fence: int) -> None:
        self.bridge = bridge
        self.run_id = run_id
        self.fence = fence
        self._fenced = "fence" in inspect.signature(bridge.publish).parameters

    async def publish(self, event: str, data: Any) -> str:
        """`StreamBridge.publish` on the lease's run, fenced."""
        if self._fenced:
            return await self.bridge.publish(self.run_id, event, data, fence=self.fence)
        return await self.bridge.publish(self.run_id, event, data)

    async def publish_end(self) -> None:
        """`StreamBridge.publish_end` on the lease's run, fenced."""
        if self._fenced:
            await self.bridge.publish_end(self.run_id, fence=self.fence)
        else:
            await self.bridge.publish_end(self.run_id)


@dataclass(frozen=True)
class Lease:
    """A run this worker holds: the record `RunStore.start`/`claim_expired` returned, and
    handles of the worker's event store and bridge fenced with its token (``None`` when
    the worker has none). Write the run's events and stream through them."""

    run: RunRecord
    events: FencedEvents | None = field(default=None, compare=False)
    streams: FencedStream | None = field(default=None, compare=False)

    @property
    def fence(self) -> int:
        """The lease's fencing token."""
        fence = self.run["fence"]
        assert fence is not None, "a started or claimed run has a token"
        return fence

    @property
    def grant(self) -> FenceGrant:
        """What the lease fences: its thread, run and token."""
        return FenceGrant(self.run["thread_id"], self.run["run_id"], self.fence)

    def config(self, config: RunnableConfig | Mapping[str, Any] | None = None) -> RunnableConfig:
        """``config`` with the run's thread and the lease's token in ``configurable``: what
        the graph runs with, so every checkpoint write it makes is fenced."""
        base: dict[str, Any] = dict(config or {})
        base["configurable"] = {
            **(base.get("configurable") or {}),
            "thread_id": self.run["thread_id"],
            "run_id": self.run["run_id"],
            FENCE_KEY: self.fence,
        }
        return base  # type: ignore[return-value]


@dataclass(frozen=True)
class WorkResult(Generic[T]):
    """How a run went on this worker.

    ``outcome`` is ``"finished"`` (this worker finalized ``run``) or ``"lost"`` (the lease
    was lost: another worker may own the run, and this one wrote nothing more).
    ``result`` is the work's return value when it completed.
    """

    run: RunRecord
    outcome: Outcome
    result: T | None = None


class Worker:
    """Runs work under run store leases; see the module docstring.

    ``ttl`` is the lease length, renewed every ``renew_every`` seconds (default
    ``ttl / 3``); ``grace`` is how long after a lease ended `recover` may claim it (above
    the clock skew between workers). ``streams`` and ``events`` are optional: without
    them no END is published and no completion event written.
    """

    def __init__(
        self,
        runs: RunStore,
        saver: BaseCheckpointSaver[Any] | None,
        *,
        owner: str,
        ttl: float = 30.0,
        grace: float = 5.0,
        renew_every: float | None = None,
        streams: StreamBridge | None = None,
        events: RunEventStore | None = None,
    ) -> None:
        self.runs = runs
        self.saver = saver
        self.owner = check_id(owner, "owner")
        self.ttl = check_seconds(ttl, "ttl")
        self.grace = check_seconds(grace, "grace", minimum=0)
        self.renew_every = self.ttl / 3 if renew_every is None else check_seconds(renew_every, "renew_every")
        self.streams = streams
        self.events = events

    # -- starting and running -----------------------------------------------------------

    async def start(self, thread_id: str, **create: Any) -> Lease:
        """Create a run on ``thread_id`` (`RunStore.create` keywords, e.g.
        ``multitask_strategy``) and start it under this worker's lease."""
        created = await self.runs.create(thread_id, **create)
        run = await self.runs.start(created.run["run_id"], self.owner, self.ttl)
        return self.lease(run)

    def lease(self, run: RunRecord) -> Lease:
        """The `Lease` of a run this worker was granted, with its fenced handles."""
        fence = run["fence"]
        assert fence is not None, "a started or claimed run has a token"
        return Lease(
            run,
            events=None if self.events is None else FencedEvents(self.events, run["thread_id"], run["run_id"], fence),
            streams=None if self.streams is None else FencedStream(self.streams, run["run_id"], fence),
        )

    async def fence(self, lease: Lease) -> None:
        """Fence every store of the run with the lease's token (saver, event store, bridge),
        so each refuses writes of older tokens from now on; `StaleFenceError` if a newer
        token already fenced one of them."""
        await fence_stores(lease.grant, (self.saver, self.events, self.streams))

    async def run_graph(
        self,
        graph: Any,
        thread_id: str,
        inputs: Any,
        config: Mapping[str, Any] | None = None,
        **create: Any,
    ) -> WorkResult[Any]:
        """Create, start and `execute` a LangGraph run of ``graph`` on ``thread_id``;
        its updates go to the run's stream when the worker has a stream bridge."""
        lease = await self.start(thread_id, **create)
        return await self.execute(lease, lambda held: self.invoke(graph, inputs, held, config))

    async def invoke(
        self, graph: Any, inputs: Any, lease: Lease, config: Mapping[str, Any] | None = None
    ) -> Any:
        """Run ``graph`` with the lease's config; publish each update on the run's stream
        (fenced: `Lease.streams`)."""
        stream = lease.streams or (self.lease(lease.run).streams if self.streams is not None else None)
        if stream is None:
            return await graph.ainvoke(inputs, lease.config(config))
        last: Any = None
        async for mode, chunk in graph.astream(
            inputs, lease.config(config), stream_mode=["updates", "values"]
        ):
            if mode == "values":
                last = chunk
            else:
                await stream.publish("updates", chunk)
        return last

    async def execute(self, lease: Lease, work: Callable[[Lease], Awaitable[T]]) -> WorkResult[T]:
        """Run ``work(lease)`` under the lease: fence, renew in the background, finalize.

        Stops (cancels the work, writes nothing more, returns ``outcome="lost"``) when a
        renewal fails or a store refuses a write as stale. A pending cancel request
        cancels the work and finalizes the run as its action says.
        """
        run_id = lease.run["run_id"]
        if lease.events is None and lease.streams is None:
            lease = self.lease(lease.run)  # a Lease built by hand: give it its handles
        try:
            await self.fence(lease)
        except StaleFenceError:
            return await self._lost(lease, "a newer token already fenced the run's stores")
        task = asyncio.ensure_future(work(lease))
        stop: list[str | CancelAction] = []
        renewer = asyncio.ensure_future(self._renew(lease, task, stop))
        try:
            result = await task
        except asyncio.CancelledError:
            if not stop:
                raise  # our caller was cancelled: the lease simply expires
            if stop[0] == "lost":
                return await self._lost(lease, "the lease was lost")
            action = stop[0]
            status = "interrupted" if action == "rollback" else "cancelled"
            return await self._finish(lease, status, stop_reason=action)
        except StaleFenceError:
            return await self._lost(lease, "a store refused a write as stale")
        except Exception as exc:
            return await self._finish(lease, "error", error=f"{type(exc).__name__}: {exc}")
        finally:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer
            if not task.done():
                task.cancel()
        log.debug("run %s finished on %s", run_id, self.owner)
        return await self._finish(lease, "success", result=result)

    async def _renew(self, lease: Lease, task: asyncio.Future[Any], stop: list[str | CancelAction]) -> None:
        """Renew every ``renew_every`` seconds; on a lost lease or a cancel request, record
        why in ``stop`` and cancel the work."""
        while not task.done():
            await asyncio.sleep(self.renew_every)
            try:
                renewed, cancel = await self.runs.renew_lease(lease.run["run_id"], self.owner, self.ttl)
            except Exception as exc:  # the store is unreachable: keep trying until the lease ends
                log.warning("renewing run %s failed (%s); retrying", lease.run["run_id"], exc)
                continue
            if not renewed or cancel is not None:
                stop.append("lost" if not renewed else cancel)  # type: ignore[arg-type]
                task.cancel()
                return

    async def _finish(
        self,
        lease: Lease,
        status: Any,
        *,
        stop_reason: str | None = None,
        error: str | None = None,
        result: Any = None,
    ) -> WorkResult[Any]:
        try:
            run = await self.runs.finalize(
                lease.run["run_id"], self.owner, status, stop_reason=stop_reason, error=error
            )
        except LeaseLostError:
            return await self._lost(lease, "the lease ended before finalize")
        await self.complete(run)
        return WorkResult(run, "finished", result)

    async def _lost(self, lease: Lease, why: str) -> WorkResult[Any]:
        log.warning("run %s: %s; %s stops writing", lease.run["run_id"], why, self.owner)
        run = await self.runs.get(lease.run["run_id"])
        return WorkResult(run or lease.run, "lost")

    async def complete(self, run: RunRecord) -> None:
        """End the run's stream (END) and write its completion event once (``put_if_absent``),
        both carrying the lease's token: a worker that lost the run ends nothing."""
        lease = self.lease(run)
        if lease.events is not None:
            await lease.events.put_if_absent(
                event_type=COMPLETION_EVENT,
                category=COMPLETION_CATEGORY,
                content={"status": run["status"], "stop_reason": run["stop_reason"], "error": run["error"]},
                user_id=None,
            )
        if lease.streams is not None:
            await lease.streams.publish_end()

    # -- orphan recovery ----------------------------------------------------------------

    async def recover(
        self, work: Callable[[Lease], Awaitable[Any]] | None = None, *, limit: int = 100
    ) -> list[WorkResult[Any]]:
        """Claim runs whose lease ended ``grace`` seconds ago and end them.

        Each claimed run's stores are fenced with the new token first (`fence`), so its
        dead (or stalled) worker can no longer write any of them. With ``work``, the run is then executed
        again under the new lease (``work`` resumes it, e.g. ``graph.ainvoke(None,
        lease.config())`` continues from the last checkpoint); without, it is finalized
        as ``error`` with ``stop_reason`` `WORKER_LOST`. Either way its stream ends and it
        gets its completion event.
        """
        claimed = await self.runs.claim_expired(self.owner, self.ttl, grace=self.grace, limit=limit)
        results: list[WorkResult[Any]] = []
        for run in claimed:
            lease = self.lease(run)
            if work is not None:
                results.append(await self.execute(lease, work))
                continue
            try:
                await self.fence(lease)
            except StaleFenceError:
                # A newer grant fenced the run meanwhile (a later claim): it is theirs.
                results.append(await self._lost(lease, "a newer token already fenced the run's stores"))
                continue
            status = "cancelled" if run["cancel_action"] is not None else "error"
            results.append(
                await self._finish(
                    lease,
                    status,
                    stop_reason=WORKER_LOST,
                    error="the worker holding the lease stopped renewing it (taken over by recovery)",
                )
            )
        return results


__all__ = ["COMPLETION_EVENT", "WORKER_LOST", "FencedEvents", "FencedStream", "Lease", "WorkResult", "Worker"]
