"""A worker loop over the run store: run work under a lease, fenced, and recover orphans.

The loop docs/runs.md ("Worker loop") describes, as importable code::

    worker = Worker(stores.runs, stores.checkpointer, owner="worker-1",
                    streams=stores.streams, events=stores.events)
    done = await worker.run_graph(graph, "thread-1", {"messages": [...]})
    recovered = await worker.recover()          # periodically, on every worker

`Worker.execute` is the heart: fence the saver with the lease's token (older tokens
are refused from then on), run the work with the token in its config, renew the
lease in the background every ``ttl / 3`` seconds, and finalize. When a renewal says
the lease is lost, or a write is refused as stale, the work is cancelled and nothing
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
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from runstore.checkpoint.contracts import FencingSaver
from runstore.checkpoint.rules import FENCE_KEY
from runstore.errors import LeaseLostError, StaleFenceError
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


@dataclass(frozen=True)
class Lease:
    """A run this worker holds: the record `RunStore.start`/`claim_expired` returned."""

    run: RunRecord

    @property
    def fence(self) -> int:
        """The lease's fencing token."""
        fence = self.run["fence"]
        assert fence is not None, "a started or claimed run has a token"
        return fence

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


class _Stop(Exception):
    """Raised into the work when the renewer learns it must stop (internal)."""


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
        return Lease(run)

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
        """Run ``graph`` with the lease's config; publish each update on the run's stream."""
        if self.streams is None:
            return await graph.ainvoke(inputs, lease.config(config))
        last: Any = None
        async for mode, chunk in graph.astream(
            inputs, lease.config(config), stream_mode=["updates", "values"]
        ):
            if mode == "values":
                last = chunk
            else:
                await self.streams.publish(lease.run["run_id"], "updates", chunk)
        return last

    def _fencing_saver(self) -> FencingSaver | None:
        """The saver behind its wrappers when it can be fenced ahead of a write (`FencingSaver`);
        ``None`` for no saver or one without fencing (its writes still carry the token)."""
        if self.saver is None:
            return None
        from runstore.checkpoint.forwarding import unwrap_saver

        saver = unwrap_saver(self.saver)
        return saver if isinstance(saver, FencingSaver) else None

    async def execute(self, lease: Lease, work: Callable[[Lease], Awaitable[T]]) -> WorkResult[T]:
        """Run ``work(lease)`` under the lease: fence, renew in the background, finalize.

        Stops (cancels the work, writes nothing more, returns ``outcome="lost"``) when a
        renewal fails or the saver refuses a write as stale. A pending cancel request
        cancels the work and finalizes the run as its action says.
        """
        run_id = lease.run["run_id"]
        fencing = self._fencing_saver()
        if fencing is not None:
            try:
                await fencing.afence_thread(lease.run["thread_id"], lease.fence)
            except StaleFenceError:
                return await self._lost(lease, "a newer token already fenced the thread")
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
            return await self._lost(lease, "the saver refused a write as stale")
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
        """End the run's stream (END) and write its completion event once (``put_if_absent``,
        carrying the lease's token)."""
        if self.events is not None:
            await self.events.put_if_absent(
                thread_id=run["thread_id"],
                run_id=run["run_id"],
                event_type=COMPLETION_EVENT,
                category=COMPLETION_CATEGORY,
                content={"status": run["status"], "stop_reason": run["stop_reason"], "error": run["error"]},
                user_id=None,
                # Fenced like the graph's writes: a worker that lost the run writes no end.
                fence=run["fence"],
            )
        if self.streams is not None:
            await self.streams.publish_end(run["run_id"])

    # -- orphan recovery ----------------------------------------------------------------

    async def recover(
        self, work: Callable[[Lease], Awaitable[Any]] | None = None, *, limit: int = 100
    ) -> list[WorkResult[Any]]:
        """Claim runs whose lease ended ``grace`` seconds ago and end them.

        Each claimed run's thread is fenced with the new token first, so its dead (or
        stalled) worker can no longer write it. With ``work``, the run is then executed
        again under the new lease (``work`` resumes it, e.g. ``graph.ainvoke(None,
        lease.config())`` continues from the last checkpoint); without, it is finalized
        as ``error`` with ``stop_reason`` `WORKER_LOST`. Either way its stream ends and it
        gets its completion event.
        """
        claimed = await self.runs.claim_expired(self.owner, self.ttl, grace=self.grace, limit=limit)
        results: list[WorkResult[Any]] = []
        for run in claimed:
            lease = Lease(run)
            if work is not None:
                results.append(await self.execute(lease, work))
                continue
            fencing = self._fencing_saver()
            if fencing is not None:
                with contextlib.suppress(StaleFenceError):
                    await fencing.afence_thread(run["thread_id"], lease.fence)
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


__all__ = ["COMPLETION_EVENT", "WORKER_LOST", "Lease", "WorkResult", "Worker"]
