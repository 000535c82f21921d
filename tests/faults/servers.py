"""Throwaway servers and a fault-injecting TCP proxy for the fault tests.

Fault tests stop, kill and cut off servers, so they never use the shared PostgreSQL
and Redis of the test run (ports 5432/6379): each starts its own, on a free port in a
temporary directory, and removes it afterwards.

`PostgresServer`
    A PostgreSQL 15 cluster from ``/usr/lib/postgresql/15/bin`` (``RUNSTORE_PG_BIN``
    overrides). ``initdb`` runs once per process; each server copies that template
    data directory, so a server costs a copy and a start (well under a second). When
    we run as root, every server process and file belongs to the OS user
    ``postgres``. Trust authentication on 127.0.0.1 only (any password is accepted,
    which the secrets tests rely on); no Unix socket; ``fsync=off``, which changes
    nothing for process crashes (the WAL is still written before a commit returns),
    only for power loss, which no test simulates. Faults: `PostgresServer.stop`
    (``pg_ctl -m fast``), `PostgresServer.crash` (``-m immediate``: no checkpoint, crash
    recovery at the next start), `PostgresServer.sigkill` (SIGKILL to the postmaster
    and every backend), `PostgresServer.terminate_connections` (kill client
    sessions while the server stays up), then `PostgresServer.start` again on the
    same port and data. ``settings=`` (postgresql.conf lines), ``files=`` (written
    into the data directory, owned by the server user, mode 0600) and ``hba=``
    (pg_hba.conf lines placed first) let a test turn on, e.g., ``ssl=on`` with its
    own ``server.crt``/``server.key``; `PostgresServer.configure` changes them
    between a stop and a start.

`RedisServer`
    ``redis-server`` on a free port with its own directory, no persistence unless
    ``persistent=True`` (append-only file fsynced on every write, so an acknowledged
    write survives SIGKILL). Faults: `RedisServer.stop` (SIGTERM: a clean
    shutdown), `RedisServer.sigkill`, `RedisServer.kill_clients` (``CLIENT KILL``
    of every client connection), then `RedisServer.start` again on the same port.
    ``args=`` are appended to the command line (cluster mode, say); readiness is read
    from the server log, so it does not depend on the plain-TCP port. ``tls=`` (a
    `Certificates`) serves TLS only on the port (``tls_auth_clients=True``: a client
    certificate signed by its CA is required); a binary built without TLS raises
    `ServerUnavailable`.

`RedisClusterServers`
    A throwaway Redis Cluster (3 masters with a replica each by default) of
    `RedisServer` nodes, formed with ``redis-cli --cluster create``; fault: SIGKILL a
    master and wait for its replica to take over.

`Certificates`
    A throwaway certificate authority and certificates signed by it (``openssl``):
    a server certificate for ``127.0.0.1`` (and ``localhost`` unless told otherwise)
    and client certificates by common name. `PostgresServer.tls` and `RedisServer.tls`
    turn TLS on with them.

`PgBouncer`
    A PgBouncer (``pgbouncer`` on PATH, ``RUNSTORE_PGBOUNCER`` overrides) in transaction
    mode on a free port in front of a PostgreSQL server (the shared one is fine: it only
    adds a pooler, no faults), trust authentication for the users it is given, a small
    server pool so client transactions share server connections. Not a fault server: the
    pooler tests use it to check what ``pooler=transaction`` promises through a real one.

`TcpProxy`
    A TCP proxy the test puts between a client and a server (``proxy.url(url)``
    rewrites a backend URL to go through it). Modes: `TcpProxy.pass_traffic`
    (default), `TcpProxy.blackhole` (a half-open network: new connections are
    accepted and held, existing ones stop forwarding in both directions; what was
    held is delivered when traffic passes again, as TCP retransmission would), and
    `TcpProxy.drop` (close every current connection, by RST unless
    ``reset=False``). It runs on its own thread and event loop, so it keeps working
    while a test's loop is blocked, and its methods may be called from any thread.

Use them as context managers, or through the fixtures of ``tests/faults/conftest.py``
(``postgres_server``, ``redis_server``, ``tcp_proxy``). A missing binary raises
`ServerUnavailable`; the fixtures turn it into a skip (a failure under ``CI=true``).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import dataclasses
import functools
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, Self, TypeVar

from runstore.urls import BackendURL

T = TypeVar("T")

HOST = "127.0.0.1"
PG_BIN = Path(os.environ.get("RUNSTORE_PG_BIN", "/usr/lib/postgresql/15/bin"))
PG_USER = "postgres"
#: How long a server may take to start or stop before the test fails.
START_TIMEOUT = 60.0
#: Ports of the shared test servers; never handed out, never touched.
SHARED_PORTS = frozenset({5432, 6379})


class ServerUnavailable(RuntimeError):
    """A server binary (initdb, pg_ctl, redis-server) is missing or cannot run here."""


_HANDED_OUT: set[int] = set()

# How many times a server's first start picks new ports when the ones it was given
# were taken before it bound them.
PORT_ATTEMPTS = 5
PORT_TAKEN = "address already in use"  # as redis-server, PostgreSQL and uvicorn say it, case aside


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now and that this process
    has not handed out before (the kernel may offer a just-closed port again)."""
    while True:
        with socket.socket() as sock:
            sock.bind((HOST, 0))
            port = int(sock.getsockname()[1])
        if port not in SHARED_PORTS and port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


class OnChosenPorts:
    """A server whose ports `free_port` chose. A free port is only free when asked:
    another process (the other test worker's clients, say) may bind it before the server
    does, so the first start picks new ports and tries again when one was taken. Later
    starts keep the ports clients know; ports a test named are never changed.

    A subclass sets ``_choose_ports``, and gives ``_start`` (raising an error whose text
    carries the server's own words when it fails), ``_repick_ports``, ``start`` and
    ``close``; as a context manager it is started on entry and closed on exit."""

    _choose_ports: bool

    def start(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        raise NotImplementedError

    def _repick_ports(self) -> None:
        raise NotImplementedError

    def _start_on_ports(self) -> None:
        if not self._choose_ports:
            self._start()
            return
        self._choose_ports = False
        for attempt in range(PORT_ATTEMPTS):
            try:
                self._start()
                return
            except Exception as exc:
                if attempt == PORT_ATTEMPTS - 1 or PORT_TAKEN not in str(exc).lower():
                    raise
            self._repick_ports()


def _wait_for(predicate: Callable[[], bool], what: str, timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.02)


def _read_from(path: Path, offset: int) -> str:
    """What a server wrote to its log file after ``offset`` (nothing when there is no log)."""
    if not path.exists():
        return ""
    with path.open("rb") as log:
        log.seek(offset)
        return log.read().decode(errors="replace")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _scratch_dir(prefix: str, owner: str | None) -> Path:
    # Not pytest's tmp_path: it is private to root, and the postgres user must reach it.
    root = Path(tempfile.mkdtemp(prefix=prefix))
    if owner is not None:
        shutil.chown(root, owner, owner)
    return root


# -- certificates -------------------------------------------------------------------------


class Certificates:
    """A throwaway CA in a temporary directory and certificates it signs (PEM files).

    ``ca`` is the CA certificate a client verifies against; ``server_cert`` /
    ``server_key`` the server's (names ``server_names``: IP addresses and DNS names).
    `client` issues a client certificate for a common name (a PostgreSQL user name).
    """

    def __init__(self, *, server_names: Sequence[str] = ("127.0.0.1", "localhost")) -> None:
        if shutil.which("openssl") is None:
            raise ServerUnavailable("no openssl on PATH to make test certificates")
        self.root = _scratch_dir("runstore-certs-", None)
        self.root.chmod(0o755)
        atexit.register(shutil.rmtree, self.root, True)
        self.ca = self.root / "ca.crt"
        self._ca_key = self.root / "ca.key"
        self._openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                      "-subj", "/CN=runstore throwaway CA", "-keyout", str(self._ca_key), "-out", str(self.ca))
        alt = ",".join(f"IP:{n}" if n.replace(".", "").isdigit() else f"DNS:{n}" for n in server_names)
        self.server_cert, self.server_key = self.issue("server", "runstore test server", alt)

    def _openssl(self, *args: str) -> None:
        result = subprocess.run(["openssl", *args], cwd=self.root, capture_output=True, text=True,
                                timeout=START_TIMEOUT)
        if result.returncode != 0:
            raise RuntimeError(f"openssl {args[0]} failed: {result.stderr.strip()}")

    def issue(self, name: str, common_name: str, subject_alt_names: str | None = None) -> tuple[Path, Path]:
        """Sign a certificate for ``common_name``; return its certificate and key paths."""
        cert, key, csr = (self.root / f"{name}.{ext}" for ext in ("crt", "key", "csr"))
        self._openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={common_name}",
                      "-keyout", str(key), "-out", str(csr))
        ext = self.root / f"{name}.ext"
        ext.write_text(f"subjectAltName={subject_alt_names}\n" if subject_alt_names else "basicConstraints=CA:FALSE\n")
        self._openssl("x509", "-req", "-in", str(csr), "-CA", str(self.ca), "-CAkey", str(self._ca_key),
                      "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", str(cert))
        key.chmod(0o600)
        return cert, key

    def client(self, common_name: str) -> tuple[Path, Path]:
        """A client certificate and key for ``common_name`` (e.g. a PostgreSQL user)."""
        return self.issue(f"client-{common_name}", common_name)


# -- PostgreSQL ---------------------------------------------------------------------------


def _as_root() -> bool:
    return os.geteuid() == 0


def _pg_run(args: Sequence[str], *, cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a PostgreSQL binary, as the postgres OS user when we are root."""
    as_user: dict[str, Any] = {}
    env = {**os.environ, "LC_ALL": "C.UTF-8"}
    if _as_root():
        as_user = {"user": PG_USER, "group": PG_USER, "extra_groups": []}
        # libpq (psql) looks for ~/.postgresql certificates: root's home is not readable.
        env["HOME"] = str(cwd)
    try:
        result = subprocess.run(
            list(args), cwd=cwd, capture_output=True, text=True, timeout=START_TIMEOUT, env=env, **as_user,
        )
    except (FileNotFoundError, PermissionError, KeyError) as exc:
        raise ServerUnavailable(f"cannot run {args[0]}: {exc}") from exc
    if check and result.returncode != 0:
        raise RuntimeError(
            f"{Path(args[0]).name} failed ({result.returncode}): {result.stderr.strip() or result.stdout.strip()}"
        )
    return result


@functools.cache
def _pg_template() -> Path:
    """One initdb'd data directory per process, copied by every `PostgresServer`."""
    if not (PG_BIN / "initdb").exists():
        raise ServerUnavailable(f"no initdb in {PG_BIN} (set RUNSTORE_PG_BIN)")
    root = _scratch_dir("runstore-pg-template-", PG_USER if _as_root() else None)
    atexit.register(shutil.rmtree, root, True)
    _pg_run(
        [str(PG_BIN / "initdb"), "-D", str(root / "data"), "-U", PG_USER, "--auth=trust",
         "-E", "UTF8", "--locale=C.UTF-8", "--no-sync"],
        cwd=root,
    )
    return root / "data"


class PostgresServer(OnChosenPorts):
    """A throwaway PostgreSQL cluster on a free port; see the module docstring."""

    def __init__(
        self,
        *,
        settings: Mapping[str, str] | None = None,
        files: Mapping[str, str | bytes] | None = None,
        hba: Sequence[str] = (),
        port: int | None = None,
    ) -> None:
        template = _pg_template()
        self._choose_ports = port is None
        self.port = port or free_port()
        self.host = HOST
        self.root = _scratch_dir("runstore-pg-", PG_USER if _as_root() else None)
        self.data_dir = self.root / "data"
        self.log_path = self.root / "server.log"
        # cp -a keeps the postgres ownership and the 0700 mode the server insists on.
        subprocess.run(["cp", "-a", str(template), str(self.data_dir)], check=True)
        self._base_conf = (self.data_dir / "postgresql.conf").read_text()
        self._base_hba = (self.data_dir / "pg_hba.conf").read_text()
        self.configure(settings=settings or {}, files=files or {}, hba=hba)

    def configure(
        self,
        *,
        settings: Mapping[str, str] | None = None,
        files: Mapping[str, str | bytes] | None = None,
        hba: Sequence[str] | None = None,
    ) -> None:
        """Set extra server settings, data-directory files and pg_hba lines (next start).

        ``settings`` replaces the previous extra settings; ``files`` adds files
        (e.g. ``{"server.key": pem}``); ``hba`` replaces the previous extra lines.
        """
        if settings is not None:
            conf = {
                "port": str(self.port),
                "listen_addresses": HOST,
                "unix_socket_directories": "",
                "shared_buffers": "16MB",
                "max_connections": "60",
                "fsync": "off",
                "full_page_writes": "off",
                **settings,
            }
            lines = [f"{key} = '{value}'" for key, value in conf.items()]
            self._write("postgresql.conf", self._base_conf + "\n" + "\n".join(lines) + "\n")
        if hba is not None:
            self._write("pg_hba.conf", "".join(f"{line}\n" for line in hba) + self._base_hba)
        for name, content in (files or {}).items():
            self._write(name, content)

    def tls(self, certs: Certificates, *, hba: Sequence[str] = ()) -> None:
        """Turn on ``ssl`` with ``certs`` (client certificates checked against its CA) at
        the next start; ``hba`` lines go first (e.g. ``hostssl all alice 127.0.0.1/32 cert``)."""
        self.configure(
            settings={"ssl": "on", "ssl_cert_file": "server.crt", "ssl_key_file": "server.key",
                      "ssl_ca_file": "root.crt"},
            files={"server.crt": certs.server_cert.read_bytes(), "server.key": certs.server_key.read_bytes(),
                   "root.crt": certs.ca.read_bytes()},
            hba=hba,
        )

    def _write(self, name: str, content: str | bytes) -> None:
        path = self.data_dir / name
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        path.chmod(0o600)
        if _as_root():
            shutil.chown(path, PG_USER, PG_USER)

    # -- lifecycle ------------------------------------------------------------------

    def _pg_ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _pg_run([str(PG_BIN / "pg_ctl"), "-D", str(self.data_dir), *args], cwd=self.root, check=check)

    @property
    def pid(self) -> int | None:
        """The postmaster's pid while a postmaster.pid file names a live process."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (FileNotFoundError, ValueError):
            return None
        return pid if _pid_alive(pid) else None

    @property
    def running(self) -> bool:
        """Whether the postmaster is alive."""
        return self.pid is not None

    def start(self) -> None:
        """Start the server and wait until it accepts connections (after any crash recovery)."""
        self._start_on_ports()

    def _start(self) -> None:
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        try:
            self._pg_ctl("start", "-w", "-t", str(int(START_TIMEOUT)), "-l", str(self.log_path))
        except RuntimeError as exc:
            # pg_ctl only says the server did not start; the reason is in the log.
            raise RuntimeError(f"{exc}\n{_read_from(self.log_path, offset)}") from exc

    def _repick_ports(self) -> None:
        old = f"port = '{self.port}'"
        self.port = free_port()
        conf = (self.data_dir / "postgresql.conf").read_text()
        self._write("postgresql.conf", conf.replace(old, f"port = '{self.port}'"))

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m mode``: ``smart``, ``fast`` (default) or ``immediate``."""
        if self.running:
            self._pg_ctl("stop", "-w", "-m", mode)

    def crash(self) -> None:
        """Immediate shutdown (``-m immediate``): no checkpoint; the next start recovers from WAL."""
        self.stop("immediate")

    def sigkill(self) -> None:
        """SIGKILL the postmaster and every backend at once, as a machine crash would."""
        pid = self.pid
        if pid is None:
            return
        # pg_ctl starts the postmaster as a session leader: its pid is the process group
        # of every backend, which would otherwise outlive it and hold the shared memory.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        _wait_for(lambda: not _pid_alive(pid), "the killed postmaster to go")
        _wait_for(lambda: not self._group_alive(pid), "the killed backends to go")

    @staticmethod
    def _group_alive(pgid: int) -> bool:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True

    def restart(self, mode: str = "fast") -> None:
        """Stop (``mode``) and start again on the same port and data."""
        self.stop(mode)
        self.start()

    def close(self) -> None:
        """Stop immediately and remove the cluster's directory."""
        try:
            if self.running:
                self.crash()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    # -- access ---------------------------------------------------------------------

    def url(self, database: str = "postgres", *, user: str = PG_USER, password: str | None = None,
            **query: str) -> str:
        """A ``postgresql://`` URL of this server (any password passes trust authentication)."""
        return BackendURL(
            scheme="postgresql", username=user, password=password, host=self.host,
            port=self.port, path=f"/{database}", query=query,
        ).render(hide_password=False)

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run ``sql`` with psql (unaligned, tuples only) and return its output."""
        result = _pg_run(
            [str(PG_BIN / "psql"), "-h", self.host, "-p", str(self.port), "-U", PG_USER,
             "-d", database, "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql],
            cwd=self.root,
        )
        return result.stdout.strip()

    def terminate_connections(self, database: str | None = None) -> int:
        """Kill every client session (of ``database``, or all) while the server stays up."""
        where = f"AND datname = '{database}'" if database else "AND datname IS NOT NULL"
        out = self.psql(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            f"WHERE pid <> pg_backend_pid() AND backend_type = 'client backend' {where}"
        )
        return int(out or 0)

    def log(self) -> str:
        """The server log so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


# -- Redis --------------------------------------------------------------------------------


class RedisServer(OnChosenPorts):
    """A throwaway ``redis-server`` on a free port; see the module docstring."""

    binary = os.environ.get("RUNSTORE_REDIS_SERVER", "redis-server")

    def __init__(
        self,
        *,
        args: Sequence[str] = (),
        persistent: bool = False,
        port: int | None = None,
        tls: Certificates | None = None,
        tls_auth_clients: bool = False,
    ) -> None:
        if shutil.which(self.binary) is None:
            raise ServerUnavailable(f"no {self.binary} on PATH (set RUNSTORE_REDIS_SERVER)")
        if tls is not None:
            self.check_tls_support()
        self.tls = tls
        self.tls_auth_clients = tls_auth_clients
        self._choose_ports = port is None
        self.port = port or free_port()
        self.host = HOST
        self.persistent = persistent
        self.args = list(args)
        self.root = _scratch_dir("runstore-redis-", None)
        self.log_path = self.root / "server.log"
        self._process: subprocess.Popen[bytes] | None = None

    def _command_line(self) -> list[str]:
        durability = (
            ["--appendonly", "yes", "--appendfsync", "always"] if self.persistent
            else ["--appendonly", "no"]
        )
        listen = ["--port", str(self.port)]
        if self.tls is not None:
            # TLS only, on `port`: a plain connection to it fails.
            listen = ["--port", "0", "--tls-port", str(self.port),
                      "--tls-cert-file", str(self.tls.server_cert), "--tls-key-file", str(self.tls.server_key),
                      "--tls-ca-cert-file", str(self.tls.ca),
                      "--tls-auth-clients", "yes" if self.tls_auth_clients else "no"]
        return [
            self.binary, *listen, "--bind", self.host, "--dir", str(self.root),
            "--save", "", *durability, "--logfile", str(self.log_path), "--daemonize", "no",
            *self.args,
        ]

    @classmethod
    def check_tls_support(cls) -> None:
        """Raise `ServerUnavailable` unless the binary was built with TLS (``BUILD_TLS=yes``)."""
        try:
            probe = subprocess.run([cls.binary, "--port", "0", "--tls-port", "0"], capture_output=True,
                                   text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ServerUnavailable(f"cannot run {cls.binary}: {exc}") from exc
        # A TLS build accepts the directive and exits for having no port to listen on.
        if "not listen anywhere" not in probe.stdout + probe.stderr:
            raise ServerUnavailable(
                f"{cls.binary} was built without TLS support (tls-port refused: "
                f"{(probe.stdout + probe.stderr).strip()[-200:]})"
            )

    @property
    def pid(self) -> int | None:
        """The server's pid while it runs."""
        if self._process is None or self._process.poll() is not None:
            return None
        return self._process.pid

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self.pid is not None

    def start(self) -> None:
        """Start the server and wait until its log says it accepts connections."""
        if not self.running:
            self._start_on_ports()

    def _repick_ports(self) -> None:
        self.port = free_port()
        # A cluster node's bus port came from `free_port` as well.
        if "--cluster-port" in self.args:
            at = self.args.index("--cluster-port") + 1
            self.args[at] = str(free_port())

    def _start(self) -> None:
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._process = subprocess.Popen(
            self._command_line(), cwd=self.root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            start_new_session=True,
        )
        process = self._process

        def ready() -> bool:
            if process.poll() is not None:
                stderr = ""
                if process.stderr:
                    stderr = process.stderr.read().decode(errors="replace")
                    process.stderr.close()
                raise RuntimeError(f"redis-server exited ({process.returncode}): {stderr}{self._log_from(offset)}")
            return "Ready to accept connections" in self._log_from(offset)

        _wait_for(ready, f"redis-server on port {self.port}")

    def _log_from(self, offset: int) -> str:
        return _read_from(self.log_path, offset)

    def _signal(self, sig: int) -> None:
        process = self._process
        if process is None or process.poll() is not None:
            return
        process.send_signal(sig)
        process.wait(START_TIMEOUT)
        if process.stderr:
            process.stderr.close()

    def stop(self) -> None:
        """A clean shutdown (SIGTERM); with ``persistent=True`` the data survives."""
        self._signal(signal.SIGTERM)

    def sigkill(self) -> None:
        """SIGKILL the server; only what the append-only file holds survives."""
        self._signal(signal.SIGKILL)

    def restart(self) -> None:
        """Stop cleanly and start again on the same port and directory."""
        self.stop()
        self.start()

    def close(self) -> None:
        """Kill the server and remove its directory."""
        try:
            self.sigkill()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    # -- access ---------------------------------------------------------------------

    def url(self, db: int = 0, *, password: str | None = None, username: str | None = None,
            scheme: str = "redis", **query: str) -> str:
        """A ``redis://`` URL of this server.

        Redis refuses AUTH when it has no password, so give ``password`` only to a server
        started with ``args=["--requirepass", password]``.
        """
        return BackendURL(
            scheme=scheme, username=username if username is not None else (None if password is None else ""),
            password=password, host=self.host, port=self.port, path=f"/{db}", query=query,
        ).render(hide_password=False)

    def command(self, *args: str | int | bytes) -> Any:
        """Send one command with a short-lived client and return the reply."""
        import redis

        tls: dict[str, Any] = {}
        if self.tls is not None:
            tls = {"ssl": True, "ssl_ca_certs": str(self.tls.ca)}
            if self.tls_auth_clients:
                cert, key = self.tls.client("runstore-test-admin")
                tls.update(ssl_certfile=str(cert), ssl_keyfile=str(key))
        client = redis.Redis(host=self.host, port=self.port, socket_timeout=10, socket_connect_timeout=10, **tls)
        try:
            return client.execute_command(*args)
        finally:
            client.close()

    def kill_clients(self) -> int:
        """Close every client connection (``CLIENT KILL TYPE normal``) while the server stays up."""
        return int(self.command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"))

    def log(self) -> str:
        """The server log so far."""
        return self._log_from(0)


class RedisClusterServers:
    """A throwaway Redis Cluster: ``masters`` masters with ``replicas`` replicas each, every
    node a `RedisServer` (cluster mode, no persistence) on its own free port.

    ``redis-cli --cluster create`` spreads the slots in equal ranges over the masters;
    `RedisClusterServers.start` returns once every node reports ``cluster_state:ok`` and
    every replica's link to its master is up. ``node_timeout_ms`` is the cluster's
    failure-detection time, short so a failover takes seconds. Fault: SIGKILL one
    master (`RedisClusterServers.kill`), then `RedisClusterServers.wait_for_failover`
    until its replica owns its slots.
    """

    cli = os.environ.get("RUNSTORE_REDIS_CLI", "redis-cli")

    def __init__(self, *, masters: int = 3, replicas: int = 1, node_timeout_ms: int = 1000) -> None:
        if shutil.which(self.cli) is None:
            raise ServerUnavailable(f"no {self.cli} on PATH (set RUNSTORE_REDIS_CLI)")
        self.masters = masters
        self.replicas = replicas
        # Validity factor 0: a replica always stands for election, however long ago it
        # last heard from its master (a quiet test cluster would otherwise refuse).
        args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(node_timeout_ms), "--cluster-replica-validity-factor", "0",
                "--repl-ping-replica-period", "1"]
        self.nodes: list[RedisServer] = []
        try:
            for _ in range(masters * (1 + replicas)):
                # The bus port gets its own free port (the default, port + 10000, may be taken).
                self.nodes.append(RedisServer(args=[*args, "--cluster-port", str(free_port())]))
        except BaseException:
            self.close()
            raise

    def start(self) -> None:
        """Start every node, form the cluster and wait until it serves every slot."""
        for node in self.nodes:
            node.start()
        create = subprocess.run(
            [self.cli, "--cluster", "create", *(f"{n.host}:{n.port}" for n in self.nodes),
             "--cluster-replicas", str(self.replicas), "--cluster-yes"],
            capture_output=True, text=True, timeout=START_TIMEOUT,
        )
        if create.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {create.stdout[-2000:]}{create.stderr[-2000:]}")
        self.wait_until_ok()

    def _info(self, node: RedisServer, section: str) -> dict[str, Any]:
        """``CLUSTER INFO`` / ``INFO replication`` as a dict (redis-py parses INFO itself)."""
        raw = node.command(*section.split())
        if isinstance(raw, dict):
            return raw
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)

    def wait_until_ok(self) -> None:
        """Wait until every live node says ``cluster_state:ok`` and knows every node, and
        every live replica's replication link is up."""
        def ok() -> bool:
            try:
                live = self.live()
                for node in live:
                    info = self._info(node, "CLUSTER INFO")
                    if info.get("cluster_state") != "ok" or int(info.get("cluster_known_nodes", 0)) != len(self.nodes):
                        return False
                    replication = self._info(node, "INFO replication")
                    if replication.get("role") == "slave" and replication.get("master_link_status") != "up":
                        return False
                return True
            except Exception:
                return False

        _wait_for(ok, "the redis cluster to be ok")

    def live(self) -> list[RedisServer]:
        """The nodes whose process runs."""
        return [node for node in self.nodes if node.running]

    def master_ports(self) -> set[int]:
        """The ports of the nodes that own slots, as a live node sees it now."""
        reply = self.live()[0].command("CLUSTER", "SLOTS")
        return {int(entry[2][1]) for entry in reply}

    def owner(self, key: str | bytes) -> RedisServer:
        """The node that owns ``key``'s hash slot now."""
        slot = int(self.live()[0].command("CLUSTER", "KEYSLOT", key))
        for start, end, master, *_ in self.live()[0].command("CLUSTER", "SLOTS"):
            if int(start) <= slot <= int(end):
                return next(node for node in self.nodes if node.port == int(master[1]))
        raise LookupError(f"no node owns slot {slot}")

    def wait_replicated(self) -> None:
        """Wait until every live master's replicas have acknowledged all its writes."""
        def caught_up() -> bool:
            for node in self.live():
                info = self._info(node, "INFO replication")
                if info.get("role") != "master":
                    continue
                links = [v for k, v in info.items() if k.startswith("slave") and k[5:].isdigit()]
                if any(int(link["offset"]) != int(info["master_repl_offset"]) for link in links):
                    return False
            return True

        _wait_for(caught_up, "the replicas to catch up")

    def kill(self, node: RedisServer) -> None:
        """SIGKILL one node (its replica takes over after the node timeout)."""
        node.sigkill()

    def wait_for_failover(self, dead: RedisServer) -> None:
        """Wait until the live nodes serve every slot again without ``dead``."""
        def moved() -> bool:
            try:
                return dead.port not in self.master_ports()
            except Exception:
                return False

        _wait_for(moved, f"a replica to take over from port {dead.port}")
        self.wait_until_ok_without(dead)

    def wait_until_ok_without(self, dead: RedisServer) -> None:
        """Wait until every live node says ``cluster_state:ok`` (the dead one still counts as known)."""
        def ok() -> bool:
            try:
                return all(self._info(n, "CLUSTER INFO").get("cluster_state") == "ok" for n in self.live())
            except Exception:
                return False

        _wait_for(ok, "the redis cluster to be ok after a failover")

    def close(self) -> None:
        """Kill every node and remove its directory."""
        for node in self.nodes:
            node.close()

    def __enter__(self) -> RedisClusterServers:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def url(self, *, scheme: str = "redis+cluster", **query: str) -> str:
        """A ``redis+cluster://`` URL: the first node, the others as ``nodes`` seeds."""
        first, *rest = self.nodes
        nodes = ",".join(f"{n.host}:{n.port}" for n in rest)
        return BackendURL(scheme=scheme, host=first.host, port=first.port,
                          query={"nodes": nodes, **query}).render(hide_password=False)


# -- TCP proxy ----------------------------------------------------------------------------


class _Link:
    """One proxied connection: the client side, the upstream side and their two pumps."""

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.tasks: list[asyncio.Task[None]] = []

    def abort(self, reset: bool) -> None:
        for writer in (self.client, self.upstream):
            if writer is None:
                continue
            sock = writer.get_extra_info("socket")
            if reset and sock is not None:
                with contextlib.suppress(OSError):
                    # Linger 0: close sends RST, as a dying middlebox or peer host would.
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        for task in self.tasks:
            task.cancel()


class PgBouncer(OnChosenPorts):
    """A throwaway PgBouncer in transaction mode on a free port, in front of ``server``
    (host, port); see the module docstring."""

    binary = os.environ.get("RUNSTORE_PGBOUNCER", "pgbouncer")

    def __init__(self, server: tuple[str, int], *, users: Sequence[str] = (PG_USER,),
                 pool_size: int = 2, port: int | None = None) -> None:
        if shutil.which(self.binary) is None and not Path(self.binary).exists():
            raise ServerUnavailable(f"no {self.binary} on PATH (set RUNSTORE_PGBOUNCER)")
        self.server = server
        self.users = list(users)
        self.pool_size = pool_size
        self._choose_ports = port is None
        self.port = port or free_port()
        self.host = HOST
        # PgBouncer refuses to run as root: its files belong to the postgres OS user then.
        self._owner = PG_USER if _as_root() else None
        self.root = _scratch_dir("runstore-pgbouncer-", self._owner)
        self.log_path = self.root / "pgbouncer.log"
        self._process: subprocess.Popen[bytes] | None = None

    def _write_config(self) -> Path:
        users = self.root / "users.txt"
        users.write_text("".join(f'"{user}" ""\n' for user in self.users))
        config = self.root / "pgbouncer.ini"
        host, port = self.server
        config.write_text(
            "[databases]\n"
            f"* = host={host} port={port}\n"
            "[pgbouncer]\n"
            f"listen_addr = {self.host}\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {users}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {self.pool_size}\n"
            "max_client_conn = 200\n"
            "server_reset_query =\n"
            "ignore_startup_parameters = extra_float_digits\n"
            f"logfile = {self.log_path}\n"
        )
        for path in (users, config):
            if self._owner is not None:
                shutil.chown(path, self._owner, self._owner)
        return config

    def _start(self) -> None:
        config = self._write_config()
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        as_user: dict[str, Any] = (
            {"user": self._owner, "group": self._owner, "extra_groups": []} if self._owner else {}
        )
        self._process = subprocess.Popen(
            [self.binary, str(config)], cwd=self.root, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, start_new_session=True, **as_user,
        )
        process = self._process

        def ready() -> bool:
            if process.poll() is not None:
                stderr = process.stderr.read().decode(errors="replace") if process.stderr else ""
                raise RuntimeError(
                    f"pgbouncer exited ({process.returncode}): {stderr}{_read_from(self.log_path, offset)}"
                )
            return "process up" in _read_from(self.log_path, offset)

        _wait_for(ready, f"pgbouncer on port {self.port}")

    def _repick_ports(self) -> None:
        self.port = free_port()

    def start(self) -> None:
        """Start PgBouncer and wait until its log says it is up."""
        if self._process is None or self._process.poll() is not None:
            self._start_on_ports()

    def close(self) -> None:
        """Stop PgBouncer and remove its directory."""
        process = self._process
        try:
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGINT)  # a fast shutdown
                try:
                    process.wait(START_TIMEOUT)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(START_TIMEOUT)
            if process is not None and process.stderr:
                process.stderr.close()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str, *, user: str = PG_USER, **query: str) -> BackendURL:
        """A ``postgresql://`` URL of ``database`` through this PgBouncer."""
        return BackendURL(scheme="postgresql", username=user, host=self.host, port=self.port,
                          path=f"/{database}").with_query(**query)


class TcpProxy:
    """A TCP proxy on a free port that can pass, drop or black-hole traffic; see the module docstring."""

    def __init__(self, target_port: int, target_host: str = HOST) -> None:
        if target_port in SHARED_PORTS and os.environ.get("RUNSTORE_FAULTS_ALLOW_SHARED") != "1":
            # Black-holing the shared servers' clients is harmless to the servers, but a
            # fault test has no business depending on them.
            raise ValueError(f"fault tests proxy their own servers, not the shared port {target_port}")
        self.target = (target_host, target_port)
        self.host = HOST
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._open = asyncio.Event()  # set: traffic passes; clear: black hole
        self._links: set[_Link] = set()
        self.accepted = 0

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(START_TIMEOUT)

    def start(self) -> None:
        """Listen on a free port of 127.0.0.1 and start passing traffic."""
        self._thread.start()

        async def listen() -> int:
            self._open.set()
            self._server = await asyncio.start_server(self._handle, self.host, 0)
            return int(self._server.sockets[0].getsockname()[1])

        self.port = self._call(listen())

    def close(self) -> None:
        """Stop listening, drop every connection and stop the proxy's thread."""
        if not self._thread.is_alive():
            return

        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            for link in list(self._links):
                link.abort(reset=False)
            self._links.clear()

        try:
            self._call(shutdown())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(START_TIMEOUT)
            self._loop.close()

    def __enter__(self) -> TcpProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def url(self, url: str) -> str:
        """``url`` with its host and port replaced by the proxy's (password kept)."""
        parsed = dataclasses.replace(BackendURL.parse(url), host=self.host, port=self.port)
        return parsed.render(hide_password=False)

    # -- faults ---------------------------------------------------------------------

    def pass_traffic(self) -> None:
        """Forward in both directions, including whatever the black hole held."""
        self._loop.call_soon_threadsafe(self._open.set)

    def blackhole(self) -> None:
        """Accept and hold new connections; stop forwarding on existing ones (half-open network)."""
        self._call(self._clear())

    async def _clear(self) -> None:
        self._open.clear()

    def drop(self, *, reset: bool = True) -> int:
        """Close every current connection on both sides (RST unless ``reset=False``); return how many."""

        async def drop_all() -> int:
            links = list(self._links)
            for link in links:
                link.abort(reset)
            self._links.difference_update(links)
            return len(links)

        return self._call(drop_all())

    @property
    def connections(self) -> int:
        """How many client connections are open through the proxy now."""
        return self._call(self._count())

    async def _count(self) -> int:
        return len(self._links)

    # -- plumbing -------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        link = _Link(writer)
        self._links.add(link)
        try:
            await self._open.wait()  # a black hole accepts, then never answers
            try:
                up_reader, up_writer = await asyncio.open_connection(*self.target)
            except OSError:
                link.abort(reset=True)
                return
            link.upstream = up_writer
            if link not in self._links:  # dropped while connecting
                link.abort(reset=True)
                return
            link.tasks = [
                asyncio.ensure_future(self._pump(reader, up_writer)),
                asyncio.ensure_future(self._pump(up_reader, writer)),
            ]
            await asyncio.gather(*link.tasks, return_exceptions=True)
        finally:
            self._links.discard(link)
            link.abort(reset=False)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                await self._open.wait()  # held, not lost, while black-holed
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            # One side closed: close the other, so neither end waits for the other forever.
            with contextlib.suppress(Exception):
                writer.close()
