"""Writer processes for the fenced-write races (spawned, so importable by name), and the
check every fencing test makes of a refused write."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from runstore.errors import StaleFenceError

from .processes import errors_travel, with_backend

T = TypeVar("T")

#: One write attempt of a racing writer: (index, began after the newer token was written,
#: "ok" / "stale" / an error text, checkpoint id or task id it wrote).
Attempt = tuple[int, bool, str, str]


async def refused_as_stale(call: Awaitable[Any], what: str) -> StaleFenceError:
    """Await ``call`` and return the `StaleFenceError` it must raise (else the contract fails)."""
    try:
        await call
    except StaleFenceError as exc:
        return exc
    raise AssertionError(
        f"contract: fencing: {what} carrying a stale token is refused with StaleFenceError "
        "(it went through)"
    )


def with_saver(url: str, plugins: list[str], body: Callable[[Any], Awaitable[T]]) -> T:
    """Open the saver at ``url`` in this process (through the registry) and run ``body``."""
    return with_backend("saver", url, plugins, body)


def fenced_config(thread_id: str, fence: int, checkpoint_id: str | None = None) -> Any:
    """A write config of ``thread_id`` carrying the fencing token ``fence``."""
    from runstore.checkpoint.rules import FENCE_KEY

    from .savers_model import config_for

    config = config_for(thread_id, checkpoint_id)
    config["configurable"][FENCE_KEY] = fence
    return config


async def write_once(
    saver: Any, thread_id: str, root: str, fence: int, i: int, tag: str
) -> tuple[str, str]:
    """One fenced write: a put (child of ``root``) on even ``i``, else pending writes on
    ``root``. Returns (outcome, what it wrote): "ok", "stale", or the unexpected error."""
    from .savers_model import make_checkpoint, new_checkpoint_id

    try:
        if i % 2 == 0:
            cid = new_checkpoint_id()
            await saver.aput(
                fenced_config(thread_id, fence, root), make_checkpoint(cid, {}, {}),
                {"writer": tag}, {},
            )  # fmt: skip
            return "ok", cid
        task = f"{tag}-{i}"
        await saver.aput_writes(fenced_config(thread_id, fence, root), [("x", i)], task, "")
        return "ok", task
    except StaleFenceError:
        return "stale", ""
    except Exception as exc:  # reported to the test, which names it
        return f"{type(exc).__name__}: {exc}", ""


async def landed(saver: Any, thread_id: str, root: str) -> list[str]:
    """What the racing writers' writes left on the thread: checkpoint ids other than
    ``root`` and the task ids of ``root``'s pending writes."""
    from .savers_model import config_for

    out: list[str] = []
    async for item in saver.alist(config_for(thread_id)):
        cid = item.config["configurable"]["checkpoint_id"]
        if cid == root:
            out += sorted({w[0] for w in item.pending_writes or []})
        else:
            out.append(cid)
    return out


@errors_travel
def stale_writer(
    url: str,
    plugins: list[str],
    thread_id: str,
    root: str,
    fence: int,
    fenced: Any,
    wrote: Any,
    barrier: Any,
) -> list[Attempt]:
    """Write with ``fence`` until refused, then try a few more times (all must be refused).

    Sets ``wrote`` after its third acknowledged write. Before each attempt it reads
    ``fenced`` (set by the newer writer once its first write with the newer token was
    acknowledged), so the test can tell attempts that began after the newer token was
    in the store.
    """

    async def body(saver: Any) -> list[Attempt]:
        attempts: list[Attempt] = []
        barrier.wait(timeout=120)
        refused = 0
        deadline = time.monotonic() + 120
        i = 0
        while refused < 6 and time.monotonic() < deadline:
            after = bool(fenced.is_set())
            outcome, what = await write_once(saver, thread_id, root, fence, i, "old")
            attempts.append((i, after, outcome, what))
            if outcome != "ok":
                refused += 1
            elif sum(a[2] == "ok" for a in attempts) == 3:
                wrote.set()
            i += 1
        return attempts

    return with_saver(url, plugins, body)


@errors_travel
def fresh_writer(
    url: str,
    plugins: list[str],
    thread_id: str,
    root: str,
    fence: int,
    fenced: Any,
    wrote: Any,
    barrier: Any,
    head_start: float,
) -> tuple[list[Attempt], list[str]]:
    """Once the stale writer has written (``wrote``), and ``head_start`` seconds later, write
    with the newer ``fence``; set ``fenced`` once the first of them is acknowledged, then
    write 10 more. Returns the attempts and what had `landed` right after that first
    acknowledgement: every write of the stale token that ever lands must be in it."""

    async def body(saver: Any) -> tuple[list[Attempt], list[str]]:
        attempts: list[Attempt] = []
        seen: list[str] = []
        barrier.wait(timeout=120)
        await asyncio.to_thread(wrote.wait, 120)
        await asyncio.sleep(head_start)
        for i in range(11):
            outcome, what = await write_once(saver, thread_id, root, fence, i, "new")
            attempts.append((i, True, outcome, what))
            if i == 0 and outcome == "ok":
                fenced.set()
                seen = await landed(saver, thread_id, root)
        return attempts, seen

    return with_saver(url, plugins, body)


async def event_contents(store: Any, thread_id: str) -> list[str]:
    """Every stored event's content on the race's two runs, read page by page (an
    unloaded machine appends more than one page before the newer token arrives)."""
    out: list[str] = []
    for run in ("old", "new"):
        after: int | None = None
        while page := await store.list_events(thread_id, run, after_seq=after, user_id=None):
            out += [str(e["content"]) for e in page]
            after = page[-1]["seq"]
    return out


@errors_travel
def stale_appender(
    url: str, plugins: list[str], thread_id: str, fenced: Any, wrote: Any, barrier: Any
) -> list[Attempt]:
    """Append with token 1 until refused, then a few more times (all must be refused);
    sets ``wrote`` after three acknowledged appends and reads ``fenced`` before each."""

    async def body(store: Any) -> list[Attempt]:
        attempts: list[Attempt] = []
        barrier.wait(timeout=120)
        refused = i = 0
        deadline = time.monotonic() + 120
        while refused < 6 and time.monotonic() < deadline:
            after = bool(fenced.is_set())
            event = {"thread_id": thread_id, "run_id": "old", "event_type": "step",
                     "category": "trace", "content": f"old-{i}"}  # fmt: skip
            try:
                await store.put(**event, user_id=None, fence=1)
                attempts.append((i, after, "ok", f"old-{i}"))
                if sum(a[2] == "ok" for a in attempts) == 3:
                    wrote.set()
            except StaleFenceError:
                attempts.append((i, after, "stale", ""))
                refused += 1
            except Exception as exc:  # reported to the test, which names it
                attempts.append((i, after, f"{type(exc).__name__}: {exc}", ""))
                refused += 1
            i += 1
        return attempts

    return with_backend("events", url, plugins, body)


@errors_travel
def fresh_appender(
    url: str, plugins: list[str], thread_id: str, fenced: Any, wrote: Any, barrier: Any, head_start: float
) -> tuple[list[Attempt], list[str]]:
    """Once the stale appender has written, and ``head_start`` seconds later, append a batch
    with token 2; set ``fenced`` and read what had landed right after it was acknowledged."""

    async def body(store: Any) -> tuple[list[Attempt], list[str]]:
        barrier.wait(timeout=120)
        await asyncio.to_thread(wrote.wait, 120)
        await asyncio.sleep(head_start)
        events = [{"thread_id": thread_id, "run_id": "new", "event_type": "step",
                   "category": "trace", "content": f"new-{k}"} for k in range(3)]  # fmt: skip
        await store.put_batch(events, user_id=None, fence=2)
        fenced.set()
        seen = await event_contents(store, thread_id)
        return [(0, True, "ok", f"new-{k}") for k in range(3)], seen

    return with_backend("events", url, plugins, body)
