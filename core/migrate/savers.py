"""Savers as a migration source and destination: LangGraph's saver API, or stored rows
where both savers declare ``bulk_import``.

Reading: the thread ids (the thread index where the saver keeps one, else one pass of
``alist(None)``), then per thread every checkpoint of every namespace oldest first
(``alist``), with its pending writes. Each checkpoint is taken as stored: a delta-mode
``messages`` channel holds only the snapshots the saver stored, and the writes between
them come along as pending writes, so delta history answers the same after the copy.

Writing: ``aput`` under the original parent id plus ``aput_writes`` per task with the
original task ids (every LangGraph saver accepts both), skipping checkpoints the
destination already holds, so a re-run copies nothing twice.

Bulk (`copy_bulk`): between two savers declaring ``bulk_import`` with the same serde,
pages of threads are exported as stored rows and imported insert-if-absent, many
threads per destination transaction (`runstore.checkpoint.bulk`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any

from langgraph.checkpoint.base import WRITES_IDX_MAP, BaseCheckpointSaver, CheckpointTuple

from runstore.checkpoint.bulk import BulkSaver, ThreadRows, rows_bytes
from runstore.checkpoint.contracts import ThreadIndexSaver
from runstore.checkpoint.forwarding import unwrap_saver
from runstore.migrate.fingerprints import fingerprint
from runstore.migrate.records import Blob, CheckpointRecord, PendingWrite

#: Threads fetched per page of the thread index.
THREAD_PAGE = 200


def _thread_config(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id}}


async def thread_ids(saver: BaseCheckpointSaver[Any], *, updated_after: Any = None) -> AsyncIterator[str]:
    """Every thread id of ``saver`` once; with ``updated_after`` (a datetime) and a thread
    index, only threads written since. Without an index, one ``alist(None)`` pass whose
    ids are held in memory (grows with the thread count, not the data)."""
    inner = unwrap_saver(saver)
    if isinstance(inner, ThreadIndexSaver):
        cursor: str | None = None
        while True:
            # Every record is read and ``touched_at`` compared, not ``updated_at`` filtered:
            # a pending write that lands after a pass (a task finishing late) moves only
            # ``touched_at``, and the catch-up must copy it.
            page = await inner.alist_threads(limit=THREAD_PAGE, cursor=cursor)
            for info in page.threads:
                if updated_after is None or info.touched_at > updated_after:
                    yield info.thread_id
            cursor = page.next_cursor
            if cursor is None:
                return
    # Collected before any is handed out: a stock saver holds a lock while its listing is
    # open, and the caller reads each thread with another listing.
    seen: dict[str, None] = {}
    async for item in saver.alist(None):
        seen.setdefault(str(item.config["configurable"]["thread_id"]), None)
    for thread_id in seen:
        yield thread_id


def _blob(serde: Any, value: Any) -> Blob:
    type_, data = serde.dumps_typed(value)
    return Blob(type_, bytes(data))


def record_of(serde: Any, item: CheckpointTuple, parent_versions: Mapping[str, Any] | None) -> CheckpointRecord:
    """The record of one stored checkpoint, its payloads serialized with ``serde``.

    ``new_versions`` are the channels whose version differs from the parent's and whose
    value the saver returned: the blobs this checkpoint stored.
    """
    configurable = item.config["configurable"]
    checkpoint: dict[str, Any] = dict(item.checkpoint)
    values: Mapping[str, Any] = checkpoint.pop("channel_values", None) or {}
    versions: Mapping[str, Any] = checkpoint.get("channel_versions") or {}
    parent = parent_versions or {}
    new_versions = {
        channel: version
        for channel, version in versions.items()
        if channel in values and parent.get(channel) != version
    }
    parent_id = (item.parent_config or {}).get("configurable", {}).get("checkpoint_id")
    return CheckpointRecord(
        thread_id=str(configurable["thread_id"]),
        checkpoint_ns=str(configurable.get("checkpoint_ns", "")),
        checkpoint_id=str(configurable["checkpoint_id"]),
        parent_id=None if parent_id is None else str(parent_id),
        checkpoint=_blob(serde, checkpoint),
        metadata=_blob(serde, dict(item.metadata or {})),
        values={channel: _blob(serde, value) for channel, value in values.items()},
        new_versions=new_versions,
        writes=tuple(
            PendingWrite(str(task_id), str(channel), _blob(serde, value))
            for task_id, channel, value in (item.pending_writes or ())
        ),
    )


async def thread_tuples(saver: BaseCheckpointSaver[Any], thread_id: str) -> list[CheckpointTuple]:
    """Every checkpoint of the thread, every namespace, oldest first (one thread in memory)."""
    items = [item async for item in saver.alist(_thread_config(thread_id))]
    items.reverse()
    # alist answers newest first within a namespace; order by id so parents come first.
    items.sort(key=lambda item: (item.config["configurable"].get("checkpoint_ns", ""),
                                 item.config["configurable"]["checkpoint_id"]))  # fmt: skip
    return items


async def read_thread(saver: BaseCheckpointSaver[Any], thread_id: str) -> list[CheckpointRecord]:
    """The thread's checkpoints as records, parents before children, in the source serde."""
    serde = saver.serde
    items = await thread_tuples(saver, thread_id)
    versions: dict[tuple[str, str], Mapping[str, Any]] = {}
    records = []
    for item in items:
        configurable = item.config["configurable"]
        ns = str(configurable.get("checkpoint_ns", ""))
        parent_id = (item.parent_config or {}).get("configurable", {}).get("checkpoint_id")
        parent = versions.get((ns, str(parent_id))) if parent_id is not None else None
        versions[(ns, str(configurable["checkpoint_id"]))] = item.checkpoint.get("channel_versions") or {}
        records.append(record_of(serde, item, parent))
    return records


def _task_paths(writes: Iterable[PendingWrite]) -> dict[str, str]:
    """Task paths that keep the source's write order on a saver sorting by
    ``(task_path, task_id, idx)``: empty when task ids already sort that way."""
    order: list[str] = []
    for write in writes:
        if write.task_id not in order:
            order.append(write.task_id)
    if order == sorted(order):
        return dict.fromkeys(order, "")
    return {task_id: f"~{position:06d}" for position, task_id in enumerate(order)}


async def write_record(saver: BaseCheckpointSaver[Any], record: CheckpointRecord, serde: Any) -> None:
    """Put one checkpoint and its pending writes under their original ids (the generic
    path every LangGraph saver accepts); payloads are loaded with ``serde``."""

    def load(blob: Blob) -> Any:
        return serde.loads_typed((blob.type, blob.data))

    checkpoint = dict(load(record.checkpoint))
    checkpoint["channel_values"] = {channel: load(blob) for channel, blob in record.values.items()}
    configurable: dict[str, Any] = {"thread_id": record.thread_id, "checkpoint_ns": record.checkpoint_ns}
    if record.parent_id is not None:
        configurable["checkpoint_id"] = record.parent_id
    await saver.aput({"configurable": configurable}, checkpoint, load(record.metadata), dict(record.new_versions))  # type: ignore[arg-type]
    if not record.writes:
        return
    config = {"configurable": {**configurable, "checkpoint_id": record.checkpoint_id}}
    paths = _task_paths(record.writes)
    tasks: dict[str, list[PendingWrite]] = {}
    for write in record.writes:
        tasks.setdefault(write.task_id, []).append(write)
    for task_id, writes in tasks.items():
        # Regular writes first: their position is their idx; special slots map to fixed idxs.
        ordered = [w for w in writes if w.channel not in WRITES_IDX_MAP] + [
            w for w in writes if w.channel in WRITES_IDX_MAP
        ]
        await saver.aput_writes(config, [(w.channel, load(w.value)) for w in ordered], task_id, paths[task_id])  # type: ignore[arg-type]


async def held_checkpoints(saver: BaseCheckpointSaver[Any], thread_id: str) -> dict[tuple[str, str], str]:
    """``(namespace, checkpoint_id) -> fingerprint`` of what the destination holds for the thread."""
    records = await read_thread(saver, thread_id)
    return {(r.checkpoint_ns, r.checkpoint_id): fingerprint(r, saver.serde) for r in records}


# -- bulk_import: rows copied as stored between two savers declaring it -------------------

#: Threads per bulk import (one destination transaction; their rows held at once).
BULK_THREADS = 32
#: Bulk imports in flight at once (each holds one batch).
BULK_WORKERS = 3


def same_serde(a: Any, b: Any) -> bool:
    """Whether bytes ``a`` stored load with ``b`` as they do with ``a``: the same object,
    or the same class with the same settings (a cipher key or any other object must be
    the very same one)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    try:
        settings = [{k: v for k, v in vars(s).items() if not callable(v)} for s in (a, b)]
    except TypeError:
        return False
    return bool(settings[0] == settings[1])


def bulk_pair(source: BaseCheckpointSaver[Any], destination: BaseCheckpointSaver[Any]) -> tuple[BulkSaver, BulkSaver] | None:
    """The two savers to copy rows between, if both declare ``bulk_import`` and share a
    serde; ``None``: go through ``aput``/``aput_writes``."""
    src, dst = unwrap_saver(source), unwrap_saver(destination)
    if isinstance(src, BulkSaver) and isinstance(dst, BulkSaver) and same_serde(source.serde, destination.serde):
        return src, dst
    return None


async def copy_bulk(pair: tuple[BulkSaver, BulkSaver], ids: AsyncIterator[str], ledger: Any, counts: Any,
                    progress: Any, fallback: Callable[[str], Awaitable[bool]]) -> None:  # fmt: skip
    """Copy the threads ``ids`` names as stored rows, `BULK_THREADS` per destination
    transaction, `BULK_WORKERS` transactions at once while the next pages are read.

    A thread some pass of this migration began (``ledger.written``: a catch-up's threads)
    goes straight into the import, which adds only the rows it lacks. A thread the
    destination already holds that this migration never wrote goes through ``fallback``
    (the per-checkpoint path, which compares it and applies ``--on-conflict``; it
    answers whether the thread was written) and then through the import too, which adds
    nothing but the source's times. ``ledger`` and ``counts`` are the engine's
    (`Ledger`, `KindCounts`).
    """
    src, dst = pair
    done = ledger.done.get("saver", {})
    ours = ledger.written.get("saver", set())
    queue: asyncio.Queue[tuple[list[ThreadRows], list[str]] | None] = asyncio.Queue(maxsize=1)

    async def work() -> None:
        while (item := await queue.get()) is not None:
            exported, foreign = item
            kept = [rows for rows in exported if rows.thread_id not in foreign or await fallback(rows.thread_id)]
            for rows in kept:
                ledger.begin("saver", rows.thread_id)
            sizes = {rows.thread_id: (len(rows.checkpoints), rows_bytes(rows)) for rows in kept}
            for imported in await dst.aimport_thread_rows(kept):
                ledger.finish("saver", imported.thread_id)
                if imported.thread_id in foreign:
                    continue  # the fallback counted it
                total, size = sizes[imported.thread_id]
                counts.copied += imported.checkpoints
                counts.present += total - imported.checkpoints
                counts.writes += imported.writes
                counts.bytes += size if imported.checkpoints else 0
            if progress is not None:
                progress("saver", counts.threads, counts.copied)

    async def read(batch: list[str]) -> None:
        held = await dst.aheld_thread_ids(batch)
        foreign = [t for t in batch if t in held and t not in ours]
        await queue.put((await src.aexport_thread_rows(batch), foreign))

    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(BULK_WORKERS):
                group.create_task(work())
            # A worker's failure cancels this loop (the task group), and the others with it.
            batch: list[str] = []
            async for thread_id in ids:
                if thread_id in done:
                    continue
                counts.threads += 1
                batch.append(thread_id)
                if len(batch) == BULK_THREADS:
                    await read(batch)
                    batch = []
            if batch:
                await read(batch)
            for _ in range(BULK_WORKERS):
                await queue.put(None)
    except BaseExceptionGroup as failed:
        if len(failed.exceptions) == 1:  # the caller sees the error itself (a conflict, a lost server)
            raise failed.exceptions[0] from failed
        raise
