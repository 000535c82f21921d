"""Redis connections of the ``redis`` plugin: URL rules, bounded calls, safe retries.

Every call goes through `RedisCalls.run`, which holds the rules the bridge and the
history cache share:

- Bounded. Connecting waits at most ``socket_connect_timeout``, the replies of one
  round trip at most ``socket_timeout``, and a whole call, retries included, at most
  ``operation_timeout`` (settings ``redis.*_seconds``; URL options of the same names
  without ``_seconds``). The attempts run in runstore's one retry loop
  (`runstore.retry.retried`): each is cut to what is left of the call's deadline, and
  so is its wait for the replies. A pooled connection idle longer than
  ``health_check_interval`` is PINGed before it carries a command.
- Retried only where that cannot write twice. A failure before the command was
  sent (no connection, a refused or timed-out connect, a pooled connection found
  closed or failing its health check) is retried on a fresh connection until the
  operation deadline. A failure after sending is retried only for reads and
  idempotent writes; for any other write its outcome is unknown.
- Reported as `BackendUnavailableError` (driver error as ``__cause__``), whose
  ``write_may_have_happened`` is true exactly when a write was sent and its reply
  never came.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import ssl
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runstore.errors import BackendRefusedError, BackendUnavailableError, InvalidURLError
from runstore.retry import BACKOFF, Deadline, deadline_cause, retried
from runstore.settings import seconds_with_url, with_url_options
from runstore.tls import SYSTEM_ROOTS, TLS_OPTIONS, check_tls_files

if TYPE_CHECKING:
    from runstore.urls import BackendURL

    from .settings import RedisSettings

log = logging.getLogger(__name__)

#: URL options (seconds) that override the ``redis`` settings of the same name + ``_seconds``.
TIMEOUT_OPTIONS = ("socket_connect_timeout", "socket_timeout", "health_check_interval", "operation_timeout")
#: Every URL option the Redis backends accept; runstore reads them all (none reaches redis-py).
URL_OPTIONS = frozenset({"prefix", *TIMEOUT_OPTIONS, *TLS_OPTIONS})
#: The ``sslmode`` values of a ``rediss://`` URL (Redis has no plain fallback).
SSL_MODES = ("require", "verify-ca", "verify-full")


@dataclass(frozen=True)
class RedisTimeouts:
    """The time bounds of Redis calls, in seconds (``health_check_interval`` 0: no checks)."""

    socket_connect_timeout: float = 5.0
    socket_timeout: float = 10.0
    health_check_interval: float = 30.0
    operation_timeout: float = 30.0

    @classmethod
    def resolve(cls, url: BackendURL, settings: RedisSettings) -> RedisTimeouts:
        """The ``redis`` settings with the URL's timeout options applied (bad values: `InvalidURLError`)."""
        return cls(**seconds_with_url(url, settings, TIMEOUT_OPTIONS))


def backend_name(kind: str, url: BackendURL) -> str:
    """How errors and logs name one opened backend: ``"redis stream bridge at redis://host:6379/0"``
    (password masked, options left out), so a message says which server it is about."""
    return f"{kind} at {url.render(include_query=False)}"


def no_database_error(backend: str, database: int, refusal: BaseException) -> InvalidURLError:
    """The error for a server that refused ``SELECT`` of the URL's database (it has fewer)."""
    return InvalidURLError(
        f"{backend}: the server has no database {database}, which the URL path names "
        f"({refusal}); a Redis server has databases 0 up to its 'databases' setting minus 1 "
        "(0-15 by default)"
    )


def database_number(url: BackendURL) -> int:
    """The database of ``redis://host:port/N`` (0 without a path); anything else is `InvalidURLError`."""
    path = url.path.strip("/")
    if not path:
        return 0
    if not (path.isascii() and path.isdigit()):
        raise InvalidURLError(
            f"{url}: the path names the Redis database and must be a number "
            f"(redis://host:6379/0, /1, ...); got {path!r}"
        )
    return int(path)


def tls_arguments(url: BackendURL, settings: RedisSettings) -> dict[str, Any]:
    """redis-py's TLS keyword arguments for ``url`` (none for ``redis://``), from its TLS
    options and the ``redis`` settings; a bad value is `InvalidURLError` / `ConfigError`.

    ``rediss://`` verifies the server's certificate and host name by default
    (``verify-full``) against ``sslrootcert``, else the system's trusted CAs.
    """
    given = [name for name in TLS_OPTIONS if url.option(name) is not None]
    if url.scheme != "rediss":
        if given:
            raise InvalidURLError(
                f"{url}: {', '.join(given)} need TLS; use a rediss:// URL (redis:// is plain TCP)"
            )
        return {}
    values = with_url_options(url, settings, "redis", TLS_OPTIONS)
    mode = (values["sslmode"] or "verify-full").lower()
    if mode not in SSL_MODES:
        raise values.problem("sslmode", f"must be one of {', '.join(SSL_MODES)} (rediss:// is always encrypted)")
    check_tls_files(values)
    args: dict[str, Any] = {
        "ssl_cert_reqs": "none" if mode == "require" else "required",
        "ssl_check_hostname": mode == "verify-full",
    }
    if values["sslrootcert"] not in (None, SYSTEM_ROOTS):
        args["ssl_ca_certs"] = values["sslrootcert"]
    if values["sslcert"] is not None:
        args["ssl_certfile"] = values["sslcert"]
        args["ssl_keyfile"] = values["sslkey"]
    return args


def open_pool(url: BackendURL, settings: RedisSettings, timeouts: RedisTimeouts, *, runstore_options: Sequence[str]) -> Any:
    """A redis-py `BlockingConnectionPool` for ``url`` with runstore's bounds and no driver retries.

    ``runstore_options`` are the URL options runstore reads itself (never passed to
    redis-py). Retries are `RedisCalls`' decision, so redis-py makes none.
    """
    import redis.asyncio as aioredis

    if url.hosts:
        raise InvalidURLError(
            f"{url} lists several servers; a Redis URL names one (a cluster's seed nodes: "
            "redis+cluster://host:port?nodes=host:port,host:port)"
        )
    database_number(url)
    extra: dict[str, Any] = tls_arguments(url, settings)
    try:
        from redis.maint_notifications import MaintNotificationsConfig
    except ImportError:  # redis-py before 7: nothing to turn off
        pass
    else:
        # With maintenance notifications on ("auto"), redis-py stops checking a pooled
        # connection for a close by the server before handing it out.
        extra["maint_notifications_config"] = MaintNotificationsConfig(enabled=False)
    driver_url = url.without_query(*runstore_options, *TLS_OPTIONS).render(hide_password=False)
    return aioredis.BlockingConnectionPool.from_url(
        driver_url,
        max_connections=settings.max_connections,
        timeout=timeouts.operation_timeout,  # waiting for a free connection
        socket_connect_timeout=timeouts.socket_connect_timeout,
        socket_timeout=timeouts.socket_timeout,
        # Health checks are RedisCalls' own: redis-py's would also PING in the middle of its
        # connection handshake pipeline and read a handshake reply as the PONG.
        health_check_interval=0,
        protocol=2,  # raw replies have one shape on every server and redis-py version
        **extra,
    )


def pack(commands: Sequence[Sequence[Any]]) -> bytes | None:
    """The RESP request of ``commands`` whose arguments are all bytes, str or int, else ``None``.

    redis-py's packer checks and converts every argument through several calls; the
    bridge sends tens of arguments per event, so its own commands are packed here in
    one pass. Other argument types (and bool, which redis-py refuses) and two-word command
    names (``"CLIENT SETINFO"``, which redis-py splits) go to redis-py.
    """
    out: list[bytes] = []
    append = out.append
    for command in commands:
        name = command[0]
        if (" " if type(name) is str else b" ") in name:
            return None
        append(b"*%d\r\n" % len(command))
        for arg in command:
            kind = type(arg)
            if kind is bytes:
                append(b"$%d\r\n%b\r\n" % (len(arg), arg))
            elif kind is str:
                data = arg.encode()
                append(b"$%d\r\n%b\r\n" % (len(data), data))
            elif kind is int:
                data = b"%d" % arg
                append(b"$%d\r\n%b\r\n" % (len(data), data))
            else:
                return None
    return b"".join(out)


class _Progress:
    """Whether any attempt of one call has started sending (its outcome is then unknown)."""

    __slots__ = ("sent",)

    def __init__(self) -> None:
        self.sent = False


class _Failed(Exception):
    """One attempt failed; ``sent`` says whether the command may have reached the server."""

    def __init__(self, cause: BaseException, sent: bool, replies: list[Any]) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.sent = sent
        self.replies = replies


def _failed(exc: Exception) -> bool:
    """The retry loop's test: an attempt that failed on its connection (`_Failed`) is retried."""
    return isinstance(exc, _Failed)


def connection_errors() -> tuple[type[BaseException], ...]:
    """Errors that mean the connection (not the command) failed."""
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    return (RedisConnectionError, RedisTimeoutError, OSError, asyncio.TimeoutError)


def _certificate_alert(exc: BaseException) -> bool:
    """A TLS alert about certificates (the server wants a client certificate, or refuses
    ours): as permanent as a wrong password."""
    return isinstance(exc, ssl.SSLError) and "CERTIFICATE" in str(getattr(exc, "reason", "") or "")


def _refused_for_good(exc: BaseException) -> bool:
    """A wrong password, or a server certificate we do not trust: no retry changes either."""
    from redis.exceptions import AuthenticationError, AuthorizationError

    if isinstance(exc, AuthenticationError | AuthorizationError):
        return True
    seen: BaseException | None = exc
    while seen is not None:  # redis-py raises its ConnectionError while handling the SSL error
        if isinstance(seen, ssl.SSLCertVerificationError) or _certificate_alert(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _closed_by_peer(conn: Any) -> bool:
    """Whether a pooled connection already saw the server close or reset it."""
    reader = getattr(conn, "_reader", None)
    writer = getattr(conn, "_writer", None)
    if reader is None or writer is None:
        return False  # not connected: redis-py connects before sending
    return bool(reader.at_eof() or reader.exception() is not None or writer.transport.is_closing())


class RedisCalls:
    """Runs commands on a pool under the rules in the module docstring.

    ``backend`` names the caller in errors (``"redis stream bridge"``). ``outages``
    counts connection failures seen so far, so a reader can tell that the server may
    have restarted since it last looked.
    """

    def __init__(
        self,
        pool: Any,
        timeouts: RedisTimeouts,
        *,
        backend: str,
        retry_backoff: Sequence[float] = BACKOFF,
        owns_pool: bool = True,
    ) -> None:
        self.pool = pool
        #: False for a caller's pool (`RedisStreamBridge.from_client`): `close` leaves it open.
        self.owns_pool = owns_pool
        self.timeouts = timeouts
        self.backend = backend
        self.retry_backoff = tuple(retry_backoff)
        self.outages = 0
        self._cleanups: set[asyncio.Task[None]] = set()  # releases of abandoned checkouts
        #: When each pooled connection last finished an exchange (loop time), for health checks.
        self._used: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()

    async def run(
        self,
        operation: str,
        commands: Sequence[Sequence[Any]],
        *,
        write: bool = False,
        idempotent: bool = True,
        read_timeout: float | None = None,
        # The deadline also bounds retries on fresh connections, which a caller's cancel
        # scope would cut off mid-cleanup (ASYNC109).
        timeout: float | None = None,  # noqa: ASYNC109
        retry: bool = True,
        deadline: Deadline | None = None,
    ) -> list[Any]:
        """Send ``commands`` in one round trip and return their replies, error replies as objects.

        A non-idempotent write (``write=True, idempotent=False``) whose replies were lost
        gets, in place of each missing reply, a `BackendUnavailableError` saying the write
        may have happened; every other failure raises it. ``read_timeout`` replaces
        ``socket_timeout`` for the replies (a blocking XREAD waits longer); ``timeout``
        replaces ``operation_timeout`` as the bound of the whole call, and ``deadline``
        (the deadline of a larger call this one is part of) replaces both. ``retry=False``
        makes one attempt: a lost connection raises at once instead of trying fresh ones.
        """
        if deadline is None:
            deadline = Deadline.after(self.timeouts.operation_timeout if timeout is None else timeout)
        progress = _Progress()

        async def attempt(deadline: Deadline) -> list[Any]:
            try:
                return await self._attempt(commands, read_timeout, progress, deadline)
            except _Failed as failed:
                self.outages += 1
                if not retry or _refused_for_good(failed.cause):
                    # A wrong password or an untrusted certificate stays so: no retry,
                    # nothing was written.
                    if _refused_for_good(failed.cause):
                        raise self._refused(operation, failed.cause) from failed.cause
                    raise self._unavailable(operation, False, failed.cause) from failed.cause
                if failed.sent and write and not idempotent:
                    missing = len(commands) - len(failed.replies)
                    lost = [self._unavailable(operation, True, failed.cause) for _ in range(missing)]
                    return [*failed.replies, *lost]
                raise

        def give_up(last: BaseException | None) -> BackendUnavailableError:
            cause = deadline_cause(last.cause if isinstance(last, _Failed) else last, deadline)
            # Cut mid-attempt: the command may be sitting in a send buffer or a black hole.
            return self._unavailable(operation, write and progress.sent, cause)

        def log_retry(failed: Exception, retries: int) -> None:
            cause = failed.cause if isinstance(failed, _Failed) else failed
            (log.warning if retries == 0 else log.debug)(
                "%s: %s failed (%s); retrying on a fresh connection for up to %gs",
                self.backend, operation, type(cause).__name__, deadline.timeout,
            )

        return await retried(
            attempt, deadline, transient=_failed, give_up=give_up, backoff=self.retry_backoff,
            on_retry=log_retry,
        )

    def _refused(self, operation: str, cause: BaseException) -> BackendRefusedError:
        """A refusal no retry changes, saying what to check."""
        from redis.exceptions import AuthenticationError, AuthorizationError

        hint = (
            "no retry helps: check the user name and password in the URL against the server's "
            "requirepass or ACL users"
            if isinstance(cause, AuthenticationError | AuthorizationError)
            else "no retry helps: check sslrootcert (the CA that signed the server's certificate), "
            "sslcert and sslkey"
        )
        return BackendRefusedError(self.backend, operation, cause, hint=hint)

    def _unavailable(self, operation: str, may_have_written: bool, cause: BaseException) -> BackendUnavailableError:
        return BackendUnavailableError(
            self.backend, operation, write_may_have_happened=may_have_written, cause=cause
        )

    async def _attempt(
        self, commands: Sequence[Sequence[Any]], read_timeout: float | None, progress: _Progress,
        deadline: Deadline,
    ) -> list[Any]:
        """One try of a call; a subclass picks the pool here (a cluster routes by key)."""
        return await self._attempt_on(self.pool, commands, read_timeout, progress, deadline)

    async def _attempt_on(
        self, pool: Any, commands: Sequence[Sequence[Any]], read_timeout: float | None, progress: _Progress,
        deadline: Deadline,
    ) -> list[Any]:
        from redis.exceptions import ResponseError

        errors = connection_errors()
        try:
            conn = await self._checkout(pool)
        except errors as exc:
            raise _Failed(exc, sent=False, replies=[]) from exc
        except ResponseError as exc:
            # The server refused the connection's setup; retrying cannot change its answer.
            raise self._refused_setup(pool, exc) from exc
        replies: list[Any] = []
        # An error reply to our own PING means the connection is out of step: not sent either.
        before_sending: tuple[type[BaseException], ...] = (*errors, ResponseError)
        clean = False
        try:
            try:
                if _closed_by_peer(conn):
                    # Closed while idle in the pool: nothing was sent on it yet.
                    await conn.disconnect(nowait=True)
                    await conn.connect()
                    self._used.pop(conn, None)
                await self._check_health(conn)
            except before_sending as exc:
                raise _Failed(exc, sent=False, replies=[]) from exc
            packed = pack(commands)
            if packed is None:
                packed = conn.pack_commands(commands) if len(commands) > 1 else conn.pack_command(*commands[0])
            progress.sent = True
            try:
                await conn.send_packed_command(packed, check_health=False)
                bound = self.timeouts.socket_timeout if read_timeout is None else read_timeout
                await self._read(conn, len(commands), replies, deadline.cap(bound))
            except errors as exc:
                raise _Failed(exc, sent=True, replies=replies) from exc
            clean = True
            self._used[conn] = asyncio.get_running_loop().time()
            return replies
        finally:
            if not clean:
                # Failed or cancelled mid-exchange: a reply may still be on its way, and
                # the next user would read it as its own. Never reuse such a connection.
                await conn.disconnect(nowait=True)
            await pool.release(conn)

    def _refused_setup(self, pool: Any, exc: BaseException) -> Exception:
        """The error for a server that answered a new connection's setup with an error reply:
        the only one it can refuse is ``SELECT`` of the URL's database (AUTH failures are
        connection errors)."""
        database = pool.connection_kwargs.get("db") or 0
        if database:
            return no_database_error(self.backend, database, exc)
        return self._unavailable("connect", False, exc)

    async def _check_health(self, conn: Any) -> None:
        """PING a connection idle longer than ``health_check_interval`` (a silent network may
        have dropped it) before it carries a command; a fresh connection needs none."""
        from redis.exceptions import ConnectionError as RedisConnectionError

        interval = self.timeouts.health_check_interval
        used = self._used.get(conn)
        if not interval or used is None or asyncio.get_running_loop().time() - used <= interval:
            return
        await conn.send_command("PING", check_health=False)
        if await conn.read_response() not in (b"PONG", "PONG"):
            raise RedisConnectionError("the health check got no PONG")

    async def _checkout(self, pool: Any) -> Any:
        """A pooled connection, connected; a cancelled caller never leaves one half set up.

        redis-py returns a connection to the pool as it stands when its handshake is
        cancelled, with the handshake's replies still to come; so the checkout runs
        shielded (bounded by the socket timeouts), and if its caller is gone the
        connection goes back closed.
        """
        checkout = asyncio.ensure_future(pool.get_connection())
        try:
            return await asyncio.shield(checkout)
        except BaseException:
            release = functools.partial(self._release_closed, pool)
            if not checkout.done():
                checkout.add_done_callback(release)
            elif not checkout.cancelled() and checkout.exception() is None:
                release(checkout)
            raise

    def _release_closed(self, pool: Any, checkout: asyncio.Future[Any]) -> None:
        if checkout.cancelled() or checkout.exception() is not None:
            return
        conn = checkout.result()

        async def release() -> None:
            try:
                await conn.disconnect(nowait=True)
            finally:
                await pool.release(conn)

        task = asyncio.ensure_future(release())
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    # A timed-out read must drop its connection before raising (ASYNC109).
    async def _read(self, conn: Any, count: int, replies: list[Any], timeout: float | None) -> None:  # noqa: ASYNC109
        """Read ``count`` replies into ``replies`` (error replies as objects), all within
        ``timeout`` (``socket_timeout`` if None): one timer per round trip, not one per reply."""
        from redis.exceptions import ResponseError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        bound = self.timeouts.socket_timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(bound):
                for _ in range(count):
                    try:
                        replies.append(await conn.read_response(timeout=math.inf))
                    except ResponseError as exc:
                        replies.append(exc)
        except TimeoutError:
            # The read was cancelled mid-reply: the connection is unusable (redis-py drops it).
            await conn.disconnect(nowait=True)
            raise RedisTimeoutError(f"no reply within {bound:g}s") from None

    async def close(self) -> None:
        """Close every connection of the pool."""
        if self._cleanups:
            await asyncio.gather(*self._cleanups, return_exceptions=True)
        if self.owns_pool:
            await self.pool.disconnect()
