"""Stream bridge on Redis Streams: ``redis://host:6379/0?prefix=app:``.

One Redis Stream per run, key ``<prefix>stream:<run_id>``. Entries get the ids
``0-1, 0-2, ...`` (``XADD ... 0-*``), so consecutive events have consecutive ids
and a reader can prove from the ids alone that it skipped nothing. A data entry
holds ``e`` (event name) and ``d`` (orjson payload); END is an entry with the single
field ``end``, added with ``MAXLEN queue_maxsize + 1`` so it never evicts data.

Readers: one blocking ``XREAD`` per bridge instance (the "waker") covers every run
this process follows and fans the entries out to its subscribers; what this process
publishes reaches its own subscribers straight from the publish reply (it carries
the id). A subscriber only takes entries that continue its own position without a
hole; otherwise it reads a consistent bounds-plus-range snapshot in one Lua call,
which yields the gap.

Writes and snapshots of every run go out through one shared pipeline: one round trip
carries whatever calls were issued meanwhile (a `runstore.batching` queue whose batch is
one pipeline, `_send_batch`), since per-call round trips were most of the bridge's client
CPU under many concurrent runs.

Every Redis call goes through `RedisCalls` (bounded, retried only where that cannot
write twice). ``XADD ... 0-*`` is not idempotent (a second send appends a second
entry with the next id), so a publish is retried only when it provably never reached
the server; publishing END, cleanup and every read are idempotent and retried (alone,
when their shared pipeline's reply was lost).

Fencing: a run's fence is the key ``<prefix>fence:<run_id>`` (with the stream's hash
tag on a cluster, so both keys share a slot); a fenced publish or END is one script
that compares its token with the fence, raises it and appends, atomically. The fence
key lives ``stream_ttl_seconds`` after its last raise, past the stream's END window.
Unfenced publishes run the unfenced scripts, as before.

Publishing (ids ``0-<seq>``, END never evicting data) and reading (the waker, the gap
proof from ids alone) are two halves of one entry layout and id scheme, so both stay in
this module; the Lua scripts and the pipeline's calls are in
`runstore.plugins.redis.scripts`, the followed streams' caches and the subscribers'
positions in `runstore.plugins.redis.watches`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import orjson

from runstore.batching import BatchQueue, Outcome
from runstore.errors import (
    BackendUnavailableError,
    ConfigError,
    InvalidStreamInputError,
    StaleFenceError,
    StreamEndedError,
)
from runstore.retry import Deadline
from runstore.settings import Settings
from runstore.standalone import Standalone
from runstore.streams.protocol import (
    END,
    StreamBridge,
    StreamEvent,
    StreamGap,
    StreamItem,
    check_event,
    check_run_id,
    check_stream_data,
    check_stream_fence,
    heartbeat_loop,
    parse_event_id,
    resolve_heartbeat,
)
from runstore.urls import BackendURL

from . import scripts
from .client import TIMEOUT_OPTIONS, URL_OPTIONS, RedisCalls, RedisTimeouts, backend_name, open_pool
from .settings import RedisSettings
from .watches import Cursor, Watch, entry_fields, entry_item, entry_seq

if TYPE_CHECKING:
    from runstore.options import BackendOptions
    from runstore.urls import BackendURL

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "runstore:"
BACKEND = "redis stream bridge"
#: Upper bound of one blocking XREAD of the waker (it is woken earlier for new runs).
WAKER_BLOCK_MS = 5000

def _poke_commands(control: bytes) -> list[tuple[Any, ...]]:
    """Add an entry to a waker's control stream (ending its XREAD) and keep the stream an hour."""
    return [("XADD", control, "MAXLEN", "1", "*", "w", "1"), ("PEXPIRE", control, 3_600_000)]


def _settled(future: asyncio.Future[Any]) -> None:
    """Retrieve a best-effort call's outcome, so a failure is not logged as never retrieved."""
    if not future.cancelled():
        future.exception()




class RedisStreamBridge(StreamBridge, Standalone):
    """`StreamBridge` on Redis Streams; several processes share runs through one Redis.

    Examples:

    ```python
    import asyncio

    from runstore.plugins.redis.streams import RedisStreamBridge


    async def main() -> None:
        async with RedisStreamBridge.from_conn_string("redis://localhost:6379/0?prefix=app:") as bridge:
            await bridge.publish("run-1", "values", {"count": 1})
            await bridge.publish_end("run-1")
            async for item in bridge.subscribe("run-1"):  # replays, then follows until END
                print(item)  # StreamEvent(id='0-1', event='values', data={'count': 1}), then END


    asyncio.run(main())
    ```

    `RedisStreamBridge.from_client(client, prefix="app:")` runs it on your redis.asyncio client (never closed here).
    """

    supports_cross_process = True

    def __init__(
        self,
        calls: RedisCalls,
        *,
        prefix: str = DEFAULT_PREFIX,
        queue_maxsize: int = 256,
        heartbeat_interval: float = 15.0,
        stream_ttl_seconds: float = 86400,
        late_subscriber_window: float = 60.0,
    ) -> None:
        self.calls = calls
        self.prefix = prefix
        self.queue_maxsize = queue_maxsize
        self.heartbeat_interval = resolve_heartbeat(None, heartbeat_interval)
        self.stream_ttl_ms = max(1, int(stream_ttl_seconds * 1000))
        self.late_subscriber_window_ms = max(1, int(late_subscriber_window * 1000))
        timeouts = calls.timeouts
        # The blocking read must end well inside the socket timeout, or it would count as dead.
        self.waker_block_ms = max(1, min(WAKER_BLOCK_MS, int(timeouts.socket_timeout * 500)))
        self._watches: dict[bytes, Watch] = {}
        self._control = f"{prefix}ctl:{uuid.uuid4().hex}".encode()
        # One waker per group of streams one XREAD may cover (one group here; a cluster has more).
        self._wakers: dict[Any, asyncio.Task[None]] = {}
        self._waker_idle: dict[Any, asyncio.Event] = {}
        #: Per group: its waker's XREAD is out and no poke was sent since (see `_wake`).
        self._blocked: dict[Any, bool] = {}
        # The shared pipeline: calls issued while a round trip is out go in the next one, in
        # call order; a caller cancelled while its call is queued withdraws it (nothing sent),
        # once sent it only stops waiting. A cluster splits each batch by slot group.
        self._pipeline: BatchQueue[scripts.Call] = BatchQueue(self._send_batch)
        self._closed = False

    @classmethod
    async def open(cls, url: BackendURL, options: BackendOptions) -> RedisStreamBridge:
        """Open a pooled client (at most ``redis.max_connections``) and check the server answers.

        URL options: ``prefix`` and the timeouts (``socket_timeout``,
        ``socket_connect_timeout``, ``health_check_interval``, ``operation_timeout``, in
        seconds), which override the ``redis`` settings.
        """
        url.check_options(URL_OPTIONS)
        settings = options.settings
        if settings.section(RedisSettings).max_connections < 2:
            raise ConfigError(
                "redis.max_connections must be >= 2 for the redis stream bridge "
                "(one connection is its blocking reader)"
            )
        timeouts = RedisTimeouts.resolve(url, settings.section(RedisSettings))
        try:
            pool = open_pool(url, settings.section(RedisSettings), timeouts, runstore_options=("prefix", *TIMEOUT_OPTIONS))
        except ImportError:  # pragma: no cover - the registry checks the driver first
            from runstore.errors import MissingDriverError

            raise MissingDriverError("redis", "redis", "redis") from None
        return await cls._opened(RedisCalls(pool, timeouts, backend=backend_name(BACKEND, url)), url, options)

    @classmethod
    async def _opened(cls, calls: RedisCalls, url: BackendURL, options: BackendOptions) -> RedisStreamBridge:
        """The bridge on ``calls`` once the server answers a PING (``calls`` closed if not)."""
        try:
            await calls.run("open", [("PING",)])
        except BaseException:
            await calls.close()
            raise
        return cls._with_settings(calls, url.option("prefix", DEFAULT_PREFIX) or "", options.settings)

    @classmethod
    def _with_settings(cls, calls: RedisCalls, prefix: str, settings: Settings) -> RedisStreamBridge:
        bridge = settings.stream_bridge
        return cls(
            calls,
            prefix=prefix,
            queue_maxsize=bridge.queue_maxsize,
            heartbeat_interval=bridge.heartbeat_interval_seconds,
            stream_ttl_seconds=bridge.stream_ttl_seconds,
            late_subscriber_window=bridge.late_subscriber_window_seconds,
        )

    @classmethod
    @asynccontextmanager
    async def from_client(
        cls,
        client: Any,
        *,
        prefix: str = DEFAULT_PREFIX,
        config: Mapping[str, Any] | str | os.PathLike[str] | Settings | None = None,
    ) -> AsyncIterator[RedisStreamBridge]:
        """The bridge on the caller's ``redis.asyncio.Redis`` client, which it never closes.

        The client must return bytes (no ``decode_responses``) and speak RESP2 (the
        default ``protocol``), and its pool must allow two connections (one is the
        bridge's blocking reader). ``config`` as in ``from_conn_string``: the ``redis``
        section bounds each call, ``stream_bridge`` sets retention and cadence.
        """
        pool = client.connection_pool
        kwargs = getattr(pool, "connection_kwargs", {})
        if kwargs.get("decode_responses") or str(kwargs.get("protocol") or 2) != "2":
            raise ConfigError(
                "the redis stream bridge needs a client that returns bytes over RESP2: create it "
                "without decode_responses and with the default protocol (2)"
            )
        settings = Settings.load(config)
        timeouts = RedisTimeouts.resolve(BackendURL(scheme="redis"), settings.section(RedisSettings))
        calls = RedisCalls(pool, timeouts, backend=BACKEND, owns_pool=False)
        await calls.run("open", [("PING",)])
        bridge = cls._with_settings(calls, prefix, settings)
        try:
            yield bridge
        finally:
            await bridge.close()

    def key(self, run_id: str) -> bytes:
        """The Redis key of a run's stream (a run id that is not a non-empty string is refused)."""
        return f"{self.prefix}stream:{check_run_id(run_id)}".encode()

    def fence_key(self, run_id: str) -> bytes:
        """The Redis key of a run's fence: its stream key with ``fence:`` for ``stream:``
        (so a cluster's hash tag, and with it the slot, is the stream's)."""
        prefix = self.prefix.encode()
        return prefix + b"fence:" + self.key(run_id)[len(prefix) + len(b"stream:"):]

    async def fence_stream(self, run_id: str, fence: int) -> None:
        """Raise the run's fence key to ``fence`` (`StaleFenceError` if it is higher); idempotent."""
        key = self.fence_key(run_id)
        token = check_stream_fence(fence)
        await self._pipelined(
            "fence_stream", key, script=scripts.FENCE, args=(str(token), self.stream_ttl_ms), write=True,
            fence=(run_id, fence),
        )

    # -- publishing ---------------------------------------------------------------

    async def publish(self, run_id: str, event: str, data: Any, *, fence: int | None = None) -> str:
        """XADD one event (exact MAXLEN, TTL refreshed); retried only if it was never sent.

        Goes out in the bridge's shared pipeline (see `_send_batch`), in call order. A
        publish whose reply was lost raises `BackendUnavailableError` with
        ``write_may_have_happened=True``; it is never sent twice. A caller cancelled
        before its publish was sent publishes nothing; after, the event is in the
        stream (the script is atomic) and its followers here still get it.
        """
        key = self.key(run_id)
        check_event(event)
        data = check_stream_data(data)
        fence = check_stream_fence(fence)
        try:
            payload = orjson.dumps(data)
        except TypeError as exc:  # orjson.JSONEncodeError
            raise InvalidStreamInputError(
                f"redis stream data must be JSON-serializable (dict, list, str, int within 64 bits, "
                f"float, bool, None; dataclasses and datetimes too): {exc}"
            ) from exc
        if fence is None:
            call = scripts.Call(
                "publish", key, script=scripts.PUBLISH,
                args=(self.queue_maxsize, self.stream_ttl_ms, event, payload), publish=(run_id, event, payload),
            )
        else:  # the same round trip: the token check is part of the one script
            call = scripts.Call(
                "publish", key, script=scripts.PUBLISH_FENCED, keys=(self.fence_key(run_id),),
                args=(self.queue_maxsize, self.stream_ttl_ms, event, payload, str(fence)),
                publish=(run_id, event, payload), fence=(run_id, fence),
            )
        reply = await self._pipeline.submit(call)
        return reply.decode() if isinstance(reply, bytes) else str(reply)

    def _reply_error(self, call: scripts.Call, exc: BaseException) -> BaseException:
        """A script's error reply as the runstore error it stands for (else ``exc``)."""
        text = str(exc)
        if call.fence is not None and text.startswith(scripts.STALE):
            run_id, fence = call.fence
            return StaleFenceError(None, fence, int(text.split()[1]), run_id=run_id)
        if call.publish is not None and scripts.ENDED in text:
            return StreamEndedError(f"run {call.publish[0]!r} already published END; no more events")
        return exc

    async def _pipelined(
        self, operation: str, key: bytes, *, script: scripts.LuaScript | None = None, args: Sequence[Any] = (),
        command: tuple[Any, ...] = (), write: bool, end: bool = False,
        keys: tuple[bytes, ...] = (), fence: tuple[str, int] | None = None,
    ) -> Any:
        """An idempotent call in the shared pipeline; sent again alone if its reply was lost.

        The pipeline carries publishes, so it is never resent as a whole; this call may
        be, within what is left of its own deadline.
        """
        deadline = Deadline.after(self.calls.timeouts.operation_timeout)
        call = scripts.Call(operation, key, script=script, args=args, command=command, end=end, keys=keys, fence=fence)
        try:
            return await self._pipeline.submit(call)
        except BackendUnavailableError as exc:
            if not exc.write_may_have_happened:
                raise
            if deadline.left() <= 0:
                raise BackendUnavailableError(
                    self.calls.backend, operation, write_may_have_happened=write, cause=exc.__cause__ or exc
                ) from exc.__cause__
        (reply,) = await self.calls.run(operation, [call.request(False)], write=write, deadline=deadline)
        if script is not None and scripts.no_script(reply):
            (reply,) = await self.calls.run(operation, [call.request(True)], write=write, deadline=deadline)
        if isinstance(reply, Exception):
            raise self._reply_error(call, reply)
        self._deliver(call, reply)
        return reply

    async def _send_batch(self, batch: list[scripts.Call]) -> list[Outcome]:
        """Send ``batch`` in one round trip: one outcome per call, in order.

        Calls whose script the server lacked (a restart, ``SCRIPT FLUSH``: nothing ran) go
        again by text within the batch's deadline; an error of a round trip is the outcome
        of every call it carried that has none yet.
        """
        outcomes: dict[int, Outcome] = {}
        todo = list(range(len(batch)))
        by_text = False
        # One deadline for the batch: resending it by text after NOSCRIPT gets what is left.
        deadline = Deadline.after(self.calls.timeouts.operation_timeout)
        try:
            while todo:
                calls = [batch[i] for i in todo]
                if len(calls) == 1:
                    operation = calls[0].operation
                else:
                    operation = f"{'/'.join(dict.fromkeys(call.operation for call in calls))} (pipeline of {len(calls)})"
                replies = await self.calls.run(
                    operation, [call.request(by_text) for call in calls], write=True, idempotent=False,
                    deadline=deadline,
                )
                retry = []
                for i, reply in zip(todo, replies, strict=True):
                    call = batch[i]
                    if call.script is not None and not by_text and scripts.no_script(reply):
                        retry.append(i)
                    elif isinstance(reply, Exception):
                        outcomes[i] = (False, self._reply_error(call, reply))
                    else:
                        # Followers here get it even if its caller was cancelled meanwhile.
                        self._deliver(call, reply)
                        outcomes[i] = (True, reply)
                todo, by_text = retry, True
        except Exception as exc:
            for i in todo:
                outcomes[i] = (False, exc)
        return [outcomes[i] for i in range(len(batch))]

    def _deliver(self, call: scripts.Call, reply: Any) -> None:
        """Hand a published event or END to this process's followers of its stream at once.

        The reply holds the entry's id, so the followers need not wait for the reader's
        next XREAD; the reader skips what they already have.
        """
        watch = self._watches.get(call.key)
        if watch is None or not isinstance(reply, bytes):
            return
        if call.publish is not None:
            _run_id, event, payload = call.publish
            watch.put(entry_seq(reply), StreamEvent(reply.decode(), event, orjson.loads(payload)))
        elif call.end:
            watch.put(entry_seq(reply), END)
        else:
            return
        watch.notify()

    async def publish_end(self, run_id: str, *, fence: int | None = None) -> None:
        """Append END (never evicting data) and shorten the stream's life to the window;
        a stale ``fence`` refuses it (`StaleFenceError`)."""
        key = self.key(run_id)
        token = check_stream_fence(fence)
        if token is None:
            await self._pipelined(
                "publish_end", key, script=scripts.PUBLISH_END,
                args=(self.queue_maxsize + 1, self.late_subscriber_window_ms), write=True, end=True,
            )
            return
        await self._pipelined(
            "publish_end", key, script=scripts.PUBLISH_END_FENCED, keys=(self.fence_key(run_id),),
            args=(self.queue_maxsize + 1, self.late_subscriber_window_ms, str(token), self.stream_ttl_ms),
            write=True, end=True, fence=(run_id, token),
        )

    async def cleanup(self, run_id: str, *, delay: float = 0) -> None:
        """Delete the run's stream now, or let it expire after ``delay`` seconds."""
        key = self.key(run_id)
        if delay > 0:
            await self._pipelined("cleanup", key, command=("PEXPIRE", key, max(1, int(delay * 1000))), write=True)
        else:
            await self._pipelined("cleanup", key, command=("DEL", key), write=True)
            watch = self._watches.get(key)
            if watch is not None:
                watch.recheck += 1
                watch.notify()

    async def stream_exists(self, run_id: str) -> bool:
        """Whether the run's stream key exists (live, or finished inside its window)."""
        (count,) = await self.calls.run("stream_exists", [("EXISTS", self.key(run_id))])
        return bool(count)

    async def close(self) -> None:
        """Stop the reader, drop the control key and close the pool (idempotent)."""
        if self._closed:
            return
        self._closed = True
        wakers = list(self._wakers.values())
        if wakers:
            # Wake the blocked XREADs instead of only cancelling them: they would otherwise
            # hold their connections until the block ends.
            for idle in self._waker_idle.values():
                idle.set()
            await asyncio.gather(*(self._poke(group) for group in self._wakers), return_exceptions=True)
            with contextlib.suppress(BaseException):
                await asyncio.wait(wakers, timeout=2)
            for waker in wakers:
                waker.cancel()
            await asyncio.gather(*wakers, return_exceptions=True)
        # Let queued publishes finish (their callers are waiting) and pokes settle.
        await self._pipeline.wait_idle()
        for watch in self._watches.values():
            watch.error = RuntimeError("stream bridge closed")
            watch.notify()
        for group in self._wakers:  # a control stream exists only where a waker ran
            with contextlib.suppress(Exception):
                await self._quick("close", [("DEL", self._control_key(group))])
        await self.calls.close()

    async def _quick(self, operation: str, commands: Sequence[Sequence[Any]]) -> None:
        """A best-effort write: one attempt, bounded by one connect and one reply (a bridge
        closing against a dead server must not spend its retry budget on cleanup)."""
        timeouts = self.calls.timeouts
        await self.calls.run(
            operation, commands, write=True, retry=False,
            timeout=timeouts.socket_connect_timeout + timeouts.socket_timeout,
        )

    # -- reading ------------------------------------------------------------------

    async def _snapshot(self, key: bytes, after: int) -> tuple[int, Any, list[Any]] | None:
        """(first sequence, last entry, entries after ``after``) in one atomic call; None if absent."""
        reply = await self._pipelined(
            "subscribe", key, script=scripts.SNAPSHOT, args=(after, self.queue_maxsize + 1), write=False
        )
        if not reply:
            return None
        first_id, last_entry, entries = reply
        return entry_seq(first_id), last_entry, entries

    def subscribe(
        self,
        run_id: str,
        *,
        last_event_id: str | None = None,
        heartbeat_interval: float | None = None,
    ) -> AsyncGenerator[StreamItem, None]:
        """Replay after ``last_event_id`` (everything retained without one), then follow live.

        Heartbeats keep coming while a read is stuck (an unresponsive server); a read
        that fails for ``redis.operation_timeout_seconds`` raises `BackendUnavailableError`.
        """
        interval = resolve_heartbeat(heartbeat_interval, self.heartbeat_interval)
        return self._follow(self.key(run_id), last_event_id, interval)

    async def _follow(
        self, key: bytes, last_event_id: str | None, interval: float
    ) -> AsyncGenerator[StreamItem, None]:
        cursor = Cursor()
        watch = self._watch(key)
        reading: asyncio.Task[list[StreamItem]] | None = None
        try:
            # The first item comes after the subscription has taken its position.
            first = await self._start(key, cursor, last_event_id, watch)
            recheck = watch.recheck

            # heartbeat_loop's poll: ``timeout`` is a budget, and running out returns [].
            async def poll(timeout: float) -> Sequence[StreamItem]:  # noqa: ASYNC109
                nonlocal first, recheck, reading
                if first:
                    items, first = first, []
                    return items
                loop = asyncio.get_running_loop()
                deadline = loop.time() + timeout
                if reading is None:
                    since = watch.news.version
                    cached = self._cached(cursor, watch)
                    if cached:
                        return cached
                    if cached is not None:
                        notified = await watch.news.wait(timeout, since)
                        if watch.error is not None:
                            raise watch.error
                        if notified and watch.recheck == recheck:
                            cached = self._cached(cursor, watch)
                            if cached is not None:
                                return cached
                        # Idle, or told the stream may be gone: a snapshot also sees removal.
                        recheck = watch.recheck
                    # A read runs as a task: while it is stuck, heartbeats go on.
                    reading = loop.create_task(self._read(key, cursor, watch))
                done, _ = await asyncio.wait({reading}, timeout=max(0.0, deadline - loop.time()))
                if not done:
                    return []
                task, reading = reading, None
                return task.result()

            async for item in heartbeat_loop(poll, interval):
                yield item
        finally:
            if reading is not None:
                reading.cancel()
                with contextlib.suppress(BaseException):
                    await reading
            self._unwatch(watch)

    async def _start(
        self, key: bytes, cursor: Cursor, last_event_id: str | None, watch: Watch
    ) -> list[StreamItem]:
        parsed = parse_event_id(last_event_id) if last_event_id is not None else None
        valid = parsed is not None and parsed[0] == 0
        after = parsed[1] if valid and parsed is not None else (0 if last_event_id is None else 2**62)
        outages, before = self.calls.outages, watch.latest
        snapshot = await self._snapshot(key, after)
        cursor.outages = outages
        if snapshot is None:
            return []  # nothing published yet: follow from the start of the stream
        first_seq, last_entry, entries = snapshot
        last_seq = entry_seq(last_entry[0])
        watch.observe(last_seq, before)
        cursor.seen = True
        if last_event_id is None:
            cursor.pos = first_seq - 1
        elif valid and parsed is not None and parsed[1] <= last_seq:
            cursor.pos = parsed[1]
            cursor.requested = last_event_id
        else:
            # Malformed or unknown cursor: the live tail, which still ends with END.
            ended = entry_fields(last_entry[1]).get(b"end") is not None
            cursor.pos = last_seq - 1 if ended else last_seq
            cursor.requested = self._id(cursor.pos) if cursor.pos > 0 else None
            if ended:
                return [END]
            return []
        return self._consume(cursor, first_seq, last_entry, entries)

    def _consume(
        self, cursor: Cursor, first_seq: int, last_entry: Any, entries: list[Any]
    ) -> list[StreamItem]:
        """Turn a snapshot into items: a gap if the cursor's successor was evicted or lost."""
        last_seq = entry_seq(last_entry[0])
        if cursor.pos + 1 < first_seq or last_seq < cursor.pos:
            # Evicted before we read it, or the stream went back (lost and published again).
            return [StreamGap(cursor.requested, self._id(first_seq), self._last_data_id(last_entry))]
        items: list[StreamItem] = []
        for entry_id, flat in entries:
            seq = entry_seq(entry_id)
            if seq <= cursor.pos:
                continue
            item = entry_item(entry_id, entry_fields(flat))
            items.append(item)
            cursor.pos = seq
            if isinstance(item, StreamEvent):
                cursor.requested = item.id
        return items

    @staticmethod
    def _id(seq: int) -> str:
        return f"0-{seq}"

    def _last_data_id(self, last_entry: Any) -> str | None:
        seq = entry_seq(last_entry[0])
        if entry_fields(last_entry[1]).get(b"end") is not None:
            seq -= 1
        return self._id(seq) if seq > 0 else None

    def _cached(self, cursor: Cursor, watch: Watch) -> list[StreamItem] | None:
        """New items for the cursor from the shared cache; ``None`` when a snapshot is needed."""
        if watch.latest <= cursor.pos:
            return []
        cached = watch.after(cursor.pos)
        if cached is None:
            return None
        items: list[StreamItem] = []
        for seq, item in cached:
            items.append(item)
            cursor.pos = seq
            if isinstance(item, StreamEvent):
                cursor.requested = item.id
        cursor.seen = True
        return items

    async def _read(self, key: bytes, cursor: Cursor, watch: Watch) -> list[StreamItem]:
        outages, before = self.calls.outages, watch.latest
        snapshot = await self._snapshot(key, cursor.pos)
        if snapshot is None:
            if cursor.seen and self.calls.outages != cursor.outages:
                # Gone across a connection failure: the server may have restarted and lost
                # it. Unlike a removal (END), nothing says the run finished.
                return [StreamGap(cursor.requested, None, None)]
            # The stream was removed under a follower: nothing more will come.
            return [END] if cursor.seen else []
        cursor.outages = outages
        first_seq, last_entry, entries = snapshot
        cursor.seen = True
        watch.observe(entry_seq(last_entry[0]), before)
        return self._consume(cursor, first_seq, last_entry, entries)

    # -- the waker: one blocking XREAD for every followed stream ---------------------

    def _group(self, key: bytes) -> Any:
        """Which waker reads ``key``: here one for every stream (a cluster bridge has one per
        slot group, since one XREAD may only cover keys of one hash slot)."""
        return None

    def _control_key(self, group: Any) -> bytes:
        """The control stream a new subscription of ``group`` pokes to wake its waker."""
        return self._control

    def _watch(self, key: bytes) -> Watch:
        if self._closed:
            raise RuntimeError("stream bridge is closed")
        watch = self._watches.get(key)
        if watch is None:
            watch = self._watches[key] = Watch(key, self.queue_maxsize, self._group(key))
            self._ensure_waker(watch.group)
            self._wake(watch.group)
        watch.refs += 1
        return watch

    def _unwatch(self, watch: Watch) -> None:
        watch.refs -= 1
        if watch.refs <= 0 and self._watches.get(watch.key) is watch:
            del self._watches[watch.key]

    def _wake(self, group: Any) -> None:
        """Make ``group``'s waker read a stream just added to it.

        A waker blocked in an XREAD sent before the stream was followed is poked (an
        entry in its control stream ends the XREAD) through the shared pipeline, once
        per XREAD however many streams were added meanwhile; a waker between reads
        includes the stream in its next XREAD anyway.
        """
        idle = self._waker_idle.get(group)
        if idle is not None:
            idle.set()
        if not self._blocked.get(group):
            return
        self._blocked[group] = False
        control = self._control_key(group)
        for command in _poke_commands(control):
            # Best effort: a failed poke only delays the stream to the XREAD's next return.
            self._pipeline.post(scripts.Call("poke", control, command=command)).add_done_callback(_settled)

    async def _poke(self, group: Any) -> None:
        idle = self._waker_idle.get(group)
        if idle is not None:
            idle.set()
        control = self._control_key(group)
        with contextlib.suppress(Exception):
            await self._quick("poke", _poke_commands(control))

    def _ensure_waker(self, group: Any) -> None:
        waker = self._wakers.get(group)
        if waker is None or waker.done():
            self._waker_idle.setdefault(group, asyncio.Event())
            self._wakers[group] = asyncio.get_running_loop().create_task(self._wake_loop(group))

    def _group_watches(self, group: Any) -> dict[bytes, Watch]:
        return {key: watch for key, watch in self._watches.items() if watch.group == group}

    async def _wake_loop(self, group: Any) -> None:
        control = self._control_key(group)
        idle = self._waker_idle[group]
        control_last: bytes = b"0-0"
        block_ms = self.waker_block_ms
        while not self._closed:
            watches = self._group_watches(group)
            if not watches:
                idle.clear()
                await idle.wait()
                continue
            streams: dict[bytes, Any] = {control: control_last}
            for key, watch in watches.items():
                streams[key] = f"0-{watch.latest}"
            command = ("XREAD", "COUNT", self.queue_maxsize + 1, "BLOCK", block_ms, "STREAMS",
                       *streams, *streams.values())
            outages = self.calls.outages
            # From here on a newly followed stream is not in this XREAD: `_wake` pokes.
            self._blocked[group] = True
            try:
                timeouts = self.calls.timeouts
                (reply,) = await self.calls.run(
                    "subscribe (reader)", [command],
                    read_timeout=block_ms / 1000 + timeouts.socket_timeout,
                    timeout=block_ms / 1000 + timeouts.operation_timeout,
                )
                if isinstance(reply, Exception):
                    raise reply
                news = reply or ()
            except Exception as exc:
                # Retried until the operation deadline already: the current followers raise
                # it; later subscribers start over.
                error = exc if isinstance(exc, BackendUnavailableError) else BackendUnavailableError(
                    self.calls.backend, "subscribe (reader)", write_may_have_happened=False, cause=exc
                )
                for key, watch in self._group_watches(group).items():
                    watch.error = error
                    watch.notify()
                    del self._watches[key]
                continue
            finally:
                self._blocked[group] = False
            if self.calls.outages != outages:
                # Reconnected after a failure: the server may have restarted and lost
                # streams, so every follower takes a fresh snapshot.
                for watch in self._group_watches(group).values():
                    watch.recheck += 1
                    watch.notify()
            for key, entries in news:
                if key == control:
                    if entries:
                        control_last = entries[-1][0]
                    continue
                follower = self._watches.get(key)
                if follower is not None and entries and follower.add(entries):
                    follower.notify()
            # Let the woken subscribers run before this task spends time on the next XREAD.
            await asyncio.sleep(0)
