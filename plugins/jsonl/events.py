"""`JsonlEventStore`: run events as one JSON-lines file per run.

Layout: ``{root}/threads/{thread_id}/runs/{run_id}.jsonl``. Each line is one record
encoded with orjson, ``seq`` first, terminated by ``\\n``. Lines are split on ``\\n``
only (orjson never emits a raw newline, while U+2028/U+0085 stay raw inside strings).
A crash mid-append leaves a torn last line: reads skip it, the next append first
terminates it with an invalid suffix (so it is never glued to the new line nor
revived as a record) and seq recovery still counts the seq at its start.

Every file operation runs in a worker thread (one hop per logical operation) while
an in-process per-thread lock serializes writers and gives readers a consistent
view. Not safe for several processes on one directory (no ``cross_process``).

Why one module of this size: the file format (torn-line handling, seq recovery) and
the per-thread locking it depends on are one mechanism; split, neither half could be
checked on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import uuid
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

try:  # POSIX; elsewhere crash recovery of batches is skipped
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

from runstore.cancellation import settle
from runstore.errors import InvalidEventError, InvalidURLError
from runstore.events.identity import message_identity
from runstore.events.owner import AUTO, UserId
from runstore.events.protocol import (
    MESSAGE_CATEGORY,
    EventContent,
    EventRecord,
    Page,
    RunEventStore,
    RunSummary,
    summarize_runs,
)
from runstore.events.records import (
    PreparedEvent,
    ai_message_match,
    is_visible_ai_message,
    normalize_identities,
    normalize_message_ids,
    normalize_run_ids,
    select_page,
    select_run_events,
    validate_id,
)
from runstore.fencing import admit_fence, check_fence
from runstore.standalone import Standalone
from runstore.validation import dumps_bytes, loads

if TYPE_CHECKING:
    from runstore.options import BackendOptions
    from runstore.urls import BackendURL

T = TypeVar("T")

SUFFIX = ".jsonl"
#: Under the root: ``{token}.lock`` (held with flock by a live instance) and
#: ``{token}-{n}.json`` (pre-images of a batch being appended).
JOURNAL_DIR = ".pending"
#: Appended to a torn last line before the next write: makes the fragment invalid JSON
#: whatever it held (an unclosed prefix stays unclosed, a complete object gains garbage).
TORN_TERMINATOR = b" <torn>\n"
_SEQ_PREFIX = re.compile(rb'^\{"seq":(\d+)')
_FIELDS = ("thread_id", "run_id", "event_type", "category", "content", "metadata", "seq", "created_at")


def validate_path_id(value: Any, what: str) -> str:
    """Check an id that becomes a path component: no separators, ``..``, NUL, nor over-long."""
    value = validate_id(value, what)
    if "/" in value or "\\" in value or (os.altsep and os.altsep in value):
        raise InvalidEventError(f"{what} {value[:60]!r} contains a path separator")
    if ".." in value or value == ".":
        raise InvalidEventError(f"{what} {value[:60]!r} contains '..' or is '.'")
    return value


def _record_from(obj: Any) -> EventRecord | None:
    """The record a decoded line holds, or ``None`` if the line is not a record."""
    if not isinstance(obj, dict) or not all(k in obj for k in _FIELDS):
        return None
    if not isinstance(obj["seq"], int) or not isinstance(obj["metadata"], dict):
        return None
    return {k: obj[k] for k in _FIELDS}  # type: ignore[return-value]


def _message_page(records: list[EventRecord], page: Page) -> list[EventRecord]:
    messages = [r for r in records if r["category"] == MESSAGE_CATEGORY]
    return select_page(
        messages, limit=page.limit, before_seq=page.before_seq, after_seq=page.after_seq
    )


def _parse(data: bytes) -> tuple[list[EventRecord], int]:
    """Records of a run file plus the highest seq seen anywhere in it (torn lines too)."""
    lines = data.split(b"\n")
    # The piece after the last "\n" was cut by a crash (or is empty): never a record.
    tail = lines.pop()
    records: list[EventRecord] = []
    top = 0
    for line in [*lines, tail]:
        match = _SEQ_PREFIX.match(line)
        if match:
            top = max(top, int(match.group(1)))
    for line in lines:
        if not line:
            continue
        try:
            record = _record_from(loads(line))
        except ValueError:
            continue  # a torn line terminated by a later append
        if record is not None:
            records.append(record)
    return records, top


class JsonlEventStore(RunEventStore, Standalone):
    """One JSON-lines file per run under a root directory (durable, single process).

    Examples:

    ```python
    import asyncio

    from runstore.plugins.jsonl.events import JsonlEventStore


    async def main() -> None:
        async with JsonlEventStore.from_conn_string("events") as store:
            # user_id=None: events without an owner (a web app wraps its calls in
            # runstore.owner_scope(user) instead)
            await store.put(thread_id="thread-1", run_id="run-1", event_type="human",
                            category="message", content="hello", user_id=None)
            page = await store.list_messages("thread-1", user_id=None)
            print([(event["seq"], event["content"]) for event in page])  # [(1, 'hello')]


    asyncio.run(main())
    ```
    """

    file_scheme: ClassVar[str | None] = "jsonl"

    def __init__(self, root: Path, *, max_trace_content: int = 10240) -> None:
        self.root = root
        self._max_trace = max_trace_content
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )
        #: thread_id -> last seq used, recovered from disk on the first write
        self._last_seq: dict[str, int] = {}
        self._closed = False
        self._token = uuid.uuid4().hex
        self._journal_seq = 0
        self._lock_fd: int | None = None

    @classmethod
    async def open(cls, url: BackendURL, options: BackendOptions) -> JsonlEventStore:
        """Open ``jsonl:///dir`` (relative) or ``jsonl:////abs/dir``; the directory is created."""
        url.check_options(set())
        path = url.file_path()
        if path is None:
            raise InvalidURLError(
                f"{url} names no directory; use jsonl:///relative/dir or jsonl:////absolute/dir"
            )
        store = cls(path, max_trace_content=options.settings.run_events.max_trace_content)
        await asyncio.to_thread(store._start)
        return store

    def _check_id(self, value: Any, what: str) -> str:
        """Ids become path components: no separators, ``..`` or NUL (`validate_path_id`)."""
        return validate_path_id(value, what)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this JsonlEventStore is closed")

    # -- crash recovery of multi-line batches ---------------------------------------

    def _start(self) -> None:
        """Create the root, roll back batches of crashed instances, take our instance lock."""
        journal = self.root / JOURNAL_DIR
        journal.mkdir(parents=True, exist_ok=True)
        for lock_path in journal.glob("*.lock"):
            self._recover(lock_path)
        if fcntl is not None:
            fd = os.open(journal / f"{self._token}.lock", os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._lock_fd = fd

    def _recover(self, lock_path: Path) -> None:
        """Undo the unfinished batches of the instance owning ``lock_path`` if it is gone."""
        if fcntl is None:
            return
        try:
            fd = os.open(lock_path, os.O_RDWR)
        except FileNotFoundError:
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return  # a live instance (in this process or another) holds it
            token = lock_path.stem
            for journal in sorted(lock_path.parent.glob(f"{token}-*.json")):
                try:
                    files = loads(journal.read_bytes())["files"]
                except (ValueError, KeyError, TypeError):
                    files = []  # the journal itself was torn: the appends never started
                for rel, size in files:
                    target = self.root / rel
                    with contextlib.suppress(FileNotFoundError):
                        if target.stat().st_size > size:
                            if size:
                                os.truncate(target, size)
                            else:
                                target.unlink()
                journal.unlink()
            lock_path.unlink()
        finally:
            os.close(fd)

    def _journal_begin(self, groups: dict[Path, list[bytes]]) -> Path:
        """Durably record every file's size before a multi-line append."""
        files = []
        for path in groups:
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                size = 0
            files.append([path.relative_to(self.root).as_posix(), size])
        self._journal_seq += 1
        journal = self.root / JOURNAL_DIR / f"{self._token}-{self._journal_seq}.json"
        with open(journal, "wb") as fh:
            fh.write(dumps_bytes({"files": files}))
            fh.flush()
            os.fsync(fh.fileno())
        return journal

    # -- paths and locking ----------------------------------------------------------

    def _thread_dir(self, thread_id: str) -> Path:
        return self.root / "threads" / thread_id

    def _run_file(self, thread_id: str, run_id: str) -> Path:
        return self._thread_dir(thread_id) / "runs" / f"{run_id}{SUFFIX}"

    def _lock(self, thread_id: str) -> asyncio.Lock:
        lock = self._locks.get(thread_id)
        if lock is None:
            lock = asyncio.Lock()
            self._locks[thread_id] = lock
        return lock

    async def _locked(self, thread_ids: Iterable[str], fn: Callable[[], T]) -> T:
        """Run ``fn`` in a worker thread holding the locks of ``thread_ids``.

        If the caller is cancelled, the locks are still held until the worker
        finishes, so no other writer can interleave with a half-done operation.
        """
        self._check_open()
        locks = [self._lock(t) for t in sorted(set(thread_ids))]
        async with contextlib.AsyncExitStack() as stack:
            for lock in locks:
                await stack.enter_async_context(lock)
            return await settle(asyncio.to_thread(fn))

    # -- disk helpers (worker thread) -----------------------------------------------

    def _fence(self, thread_ids: Iterable[str], fence: int | None) -> None:
        """Refuse a stale ``fence`` on any of the threads, else raise their fences to it.

        Runs under the threads' locks, before the write it guards. Fences live in
        ``{root}/fences/{thread_id}`` (outside the thread's directory, so a deletion of
        the thread's events keeps them).
        """
        if fence is None:
            return
        paths = {t: self.root / "fences" / t for t in set(thread_ids)}
        for thread_id, path in paths.items():
            try:
                current = int(path.read_text())
            except FileNotFoundError:
                current = 0
            admit_fence(fence, current, thread_id=thread_id)
        for path in paths.values():
            path.parent.mkdir(parents=True, exist_ok=True)
            scratch = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
            scratch.write_text(str(fence))
            os.replace(scratch, path)

    def _read_run(self, thread_id: str, run_id: str) -> list[EventRecord]:
        try:
            data = self._run_file(thread_id, run_id).read_bytes()
        except FileNotFoundError:
            return []
        return _parse(data)[0]

    def _run_files(self, thread_id: str) -> list[Path]:
        runs = self._thread_dir(thread_id) / "runs"
        try:
            return [p for p in runs.iterdir() if p.name.endswith(SUFFIX)]
        except FileNotFoundError:
            return []

    def _read_thread(self, thread_id: str) -> tuple[list[EventRecord], int]:
        """All records of a thread in seq order, plus the highest seq on disk."""
        records: list[EventRecord] = []
        top = 0
        for path in self._run_files(thread_id):
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                continue
            found, file_top = _parse(data)
            records.extend(found)
            top = max(top, file_top)
        records.sort(key=lambda r: r["seq"])
        return records, top

    def _next_seq(self, thread_id: str) -> int:
        if thread_id not in self._last_seq:
            self._last_seq[thread_id] = self._read_thread(thread_id)[1]
        return self._last_seq[thread_id] + 1

    def _append_groups(self, groups: dict[Path, list[bytes]]) -> None:
        """Append each file's lines in one write; on any failure restore every file.

        A batch of several lines is journaled first, so a crash half-way is rolled
        back by the next instance that opens the directory (all-or-nothing).
        """
        done: list[tuple[Path, int | None]] = []
        journal = None
        if sum(len(lines) for lines in groups.values()) > 1:
            for path in groups:
                path.parent.mkdir(parents=True, exist_ok=True)
            journal = self._journal_begin(groups)
        try:
            for path, lines in groups.items():
                path.parent.mkdir(parents=True, exist_ok=True)
                with open(path, "ab+") as fh:
                    size = fh.seek(0, os.SEEK_END)
                    done.append((path, size))
                    prefix = b""
                    if size:
                        fh.seek(size - 1)
                        if fh.read(1) != b"\n":
                            prefix = TORN_TERMINATOR
                    fh.write(prefix + b"".join(lines))
                    fh.flush()
                    os.fsync(fh.fileno())
        except BaseException:
            for written, before in done:
                with contextlib.suppress(OSError):
                    if before:
                        os.truncate(written, before)
                    else:
                        written.unlink()
            raise
        finally:
            if journal is not None:
                with contextlib.suppress(OSError):
                    journal.unlink()

    def _write(self, events: list[PreparedEvent]) -> list[EventRecord]:
        """Assign seqs and append; the in-memory counters move only after success."""
        next_seq: dict[str, int] = {}
        records: list[EventRecord] = []
        groups: dict[Path, list[bytes]] = {}
        for event in events:
            seq = next_seq.get(event.thread_id) or self._next_seq(event.thread_id)
            next_seq[event.thread_id] = seq + 1
            record = event.to_record(seq)
            records.append(record)
            line = {"seq": seq, **{k: v for k, v in record.items() if k != "seq"}}
            groups.setdefault(self._run_file(event.thread_id, event.run_id), []).append(
                dumps_bytes(line) + b"\n"
            )
        self._append_groups(groups)
        for thread_id, seq in next_seq.items():
            self._last_seq[thread_id] = seq - 1
        return records

    # -- writes ---------------------------------------------------------------------

    async def put(
        self,
        *,
        thread_id: str,
        run_id: str,
        event_type: str,
        category: str,
        content: EventContent = "",
        metadata: Mapping[str, Any] | None = None,
        created_at: str | None = None,
        user_id: UserId = AUTO,
        fence: int | None = None,
    ) -> EventRecord:
        event, _ = self._write_call(
            self._max_trace, thread_id, run_id, event_type, category, content, metadata,
            created_at, user_id, fence,
        )  # fmt: skip

        def write() -> list[EventRecord]:
            self._fence([event.thread_id], fence)
            return self._write([event])

        records = await self._locked([event.thread_id], write)
        return records[0]

    async def put_batch(
        self,
        events: Sequence[Mapping[str, Any]],
        *,
        user_id: UserId = AUTO,
        fence: int | None = None,
    ) -> list[EventRecord]:
        call = self._batch_call(events, user_id, max_trace_content=self._max_trace, fence=fence)
        if call is None:
            return []
        prepared = call[0]
        threads = [e.thread_id for e in prepared]

        def write() -> list[EventRecord]:
            self._fence(threads, fence)
            return self._write(prepared)

        return await self._locked(threads, write)

    async def put_if_absent(
        self,
        *,
        thread_id: str,
        run_id: str,
        event_type: str,
        category: str,
        content: EventContent = "",
        metadata: Mapping[str, Any] | None = None,
        created_at: str | None = None,
        user_id: UserId = AUTO,
        fence: int | None = None,
    ) -> tuple[EventRecord, bool]:
        event, _ = self._write_call(
            self._max_trace, thread_id, run_id, event_type, category, content, metadata,
            created_at, user_id, fence,
        )  # fmt: skip

        def check_and_write() -> tuple[EventRecord, bool]:
            self._fence([event.thread_id], fence)
            for record in self._read_run(event.thread_id, event.run_id):
                if record["event_type"] == event.event_type:
                    return record, False
            return self._write([event])[0], True

        return await self._locked([event.thread_id], check_and_write)

    async def fence_thread(self, thread_id: str, fence: int) -> None:
        """Raise the thread's fence to ``fence`` under the thread's lock (`StaleFenceError`
        if it is already higher)."""
        thread = self._check_id(thread_id, "thread_id")
        check_fence(fence)
        await self._locked([thread], lambda: self._fence([thread], fence))

    # -- reads ----------------------------------------------------------------------

    async def _thread_records(self, thread_id: str) -> list[EventRecord]:
        return await self._locked([thread_id], lambda: self._read_thread(thread_id)[0])

    async def _run_records(self, thread_id: str, run_id: str) -> list[EventRecord]:
        return await self._locked([thread_id], lambda: self._read_run(thread_id, run_id))

    async def list_messages(
        self,
        thread_id: str,
        *,
        limit: int = 50,
        before_seq: int | None = None,
        after_seq: int | None = None,
        user_id: UserId = AUTO,
    ) -> list[EventRecord]:
        page = self._page_call(thread_id, None, limit, before_seq, after_seq, user_id)
        if page is None:
            return []
        records = await self._thread_records(page.thread_id)
        return _message_page(records, page)

    async def list_events(
        self,
        thread_id: str,
        run_id: str,
        *,
        event_types: Sequence[str] | None = None,
        task_id: str | None = None,
        limit: int = 500,
        after_seq: int | None = None,
        user_id: UserId = AUTO,
    ) -> list[EventRecord]:
        call = self._run_filter_call(
            thread_id, run_id, event_types, task_id, limit, after_seq, user_id
        )
        if call is None:
            return []
        records = await self._run_records(call.thread_id, call.run_id)
        return select_run_events(
            records,
            limit=call.limit,
            after_seq=call.after_seq,
            event_types=call.event_types,
            task_id=call.task_id,
        )

    async def list_messages_by_run(
        self,
        thread_id: str,
        run_id: str,
        *,
        limit: int = 500,
        after_seq: int | None = None,
        before_seq: int | None = None,
        user_id: UserId = AUTO,
    ) -> list[EventRecord]:
        page = self._page_call(thread_id, run_id, limit, before_seq, after_seq, user_id)
        if page is None:
            return []
        records = await self._run_records(page.thread_id, run_id)
        return _message_page(records, page)

    async def count_messages(self, thread_id: str, *, user_id: UserId = AUTO) -> int:
        records = await self._thread_records(self._target_call(thread_id, None, user_id).thread_id)
        return sum(1 for r in records if r["category"] == MESSAGE_CATEGORY)

    async def get_last_visible_ai_seq_by_run(
        self,
        thread_id: str,
        *,
        run_ids: Iterable[str] | None = None,
        user_id: UserId = AUTO,
    ) -> dict[str, int]:
        call = self._lookup_call(thread_id, run_ids, normalize_run_ids, user_id)
        if call is None:
            return {}
        records = await self._thread_records(call.thread_id)
        result: dict[str, int] = {}
        for record in records:
            if (call.keys is None or record["run_id"] in call.keys) and is_visible_ai_message(
                record
            ):
                result[record["run_id"]] = record["seq"]
        return result

    async def get_message_seqs(
        self, thread_id: str, identities: Iterable[str], *, user_id: UserId = AUTO
    ) -> dict[str, int]:
        call = self._lookup_call(thread_id, identities, normalize_identities, user_id)
        if call is None or call.keys is None:
            return {}
        wanted = call.keys
        records = await self._thread_records(call.thread_id)
        result: dict[str, int] = {}
        for record in records:
            if record["category"] != MESSAGE_CATEGORY:
                continue
            identity = message_identity(record["content"])
            if identity in wanted and identity not in result:
                result[identity] = record["seq"]
                if len(result) == len(wanted):
                    break
        return result

    async def find_latest_ai_message_run_ids(
        self, thread_id: str, message_ids: Iterable[str], *, user_id: UserId = AUTO
    ) -> dict[str, str]:
        """One locked read of the whole thread (a consistent snapshot), newest first."""
        call = self._lookup_call(thread_id, message_ids, normalize_message_ids, user_id)
        if call is None or call.keys is None:
            return {}
        pending = call.keys
        records = await self._thread_records(call.thread_id)
        result: dict[str, str] = {}
        for record in reversed(records):
            match = ai_message_match(record, pending)
            if match is not None:
                result[match[0]] = match[1]
                pending.discard(match[0])
                if not pending:
                    break
        return result

    # -- deletes --------------------------------------------------------------------

    async def list_runs(self, thread_id: str, *, user_id: UserId = AUTO) -> list[RunSummary]:
        records = await self._thread_records(self._target_call(thread_id, None, user_id).thread_id)
        return summarize_runs(records)

    async def delete_by_thread(self, thread_id: str, *, user_id: UserId = AUTO) -> int:
        thread = self._target_call(thread_id, None, user_id).thread_id

        def delete() -> int:
            count = len(self._read_thread(thread)[0])
            shutil.rmtree(self._thread_dir(thread), ignore_errors=True)
            self._last_seq.pop(thread, None)
            return count

        return await self._locked([thread], delete)

    async def delete_by_run(self, thread_id: str, run_id: str, *, user_id: UserId = AUTO) -> int:
        target = self._target_call(thread_id, run_id, user_id)
        thread = target.thread_id

        def delete() -> int:
            count = len(self._read_run(thread, run_id))
            with contextlib.suppress(FileNotFoundError):
                self._run_file(thread, run_id).unlink()
            # The next seq follows the highest seq left on disk (same rule as SQL).
            self._last_seq.pop(thread, None)
            return count

        return await self._locked([thread], delete)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            await asyncio.to_thread(self._release, fd)

    def _release(self, fd: int) -> None:
        with contextlib.suppress(OSError):
            (self.root / JOURNAL_DIR / f"{self._token}.lock").unlink()
        os.close(fd)
