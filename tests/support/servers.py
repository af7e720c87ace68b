"""Real servers for the locstatus test suite: ZooKeeper (single node and
ensemble) and a MongoDB-wire server.

Why this module is shaped the way it is
---------------------------------------

* **Real servers, not fakes.**  locstatus' correctness lives in how it reacts to
  session expiry, leader loss, CAS conflicts and restarts.  Mocks cannot prove
  any of that, so the suite talks to actual ZooKeeper and MongoDB-wire
  processes that it can stop, restart and ``kill -9``.

* **No Docker required.**  CI and developer machines often have no Docker
  engine.  :func:`docker_available` answers in well under a second (socket
  connect + ``GET /_ping`` with a 0.5 s timeout, cached), and every server has
  a local-process path that is the *primary*, tested path:

  - ZooKeeper runs as a plain JVM from the Debian ``zookeeper`` package (or a
    tarball at ``$ZOOKEEPER_HOME``).  The classpath is built from the jar's
    manifest, plus ``slf4j-simple`` so the server actually writes a log (the
    Debian jar only ships ``slf4j-api``, which would log to nowhere).
  - The MongoDB-wire server is SecantusDB (``secantusd-py``), a pure-Python
    mongod look-alike installed in the venv.  ``LOCSTATUS_TEST_MONGO_URI``
    points the suite at an existing server instead, and with Docker the
    testcontainers ``MongoDbContainer`` is used.

* **Processes are owned by PID.**  Every server is a child started with
  ``start_new_session=True`` (so a Ctrl-C in the terminal does not race our own
  teardown) and is stopped by its PID: SIGTERM, bounded wait, SIGKILL.  An
  ``atexit`` hook kills anything a crashed test left behind.  Nothing is ever
  killed by name.

* **Free ports, fixed for a handle's lifetime.**  Ports are picked by binding
  port 0 on 127.0.0.1.  A handle keeps its port (and data directory) across
  ``stop()``/``start()`` so restart tests see the same connection string and the
  same data.  The first start of a single server retries on a fresh port if the
  chosen one was grabbed in the meantime (``Address already in use``).

* **Fast, small, testable timings.**  JVMs run with ``-Xmx256m -XX:+UseSerialGC
  -XX:TieredStopAtLevel=1``; ZooKeeper uses ``tickTime=200`` so the minimum
  session timeout is 400 ms (tests can use 1-2 s sessions) while
  ``maxSessionTimeout`` is raised to 60 s so ordinary clients are not capped
  at 4 s.  ``zookeeper.forceSync=no`` skips fsync: a ``kill -9`` still keeps
  everything that reached the OS page cache, which is what tests exercise.

* **Failures explain themselves.**  If a server does not answer within the
  timeout (30 s by default) :class:`ServerStartError` carries the command line
  and the tail of the server's log file.

* **Readiness via ZooKeeper's 4-letter words** (``srvr``), not via kazoo, so
  this module has no client-library dependency for ZooKeeper and the same probe
  reports ``Mode: leader|follower|standalone`` for :meth:`ZooKeeperEnsemble.leader`.

No pytest fixtures live here on purpose: ``conftest.py`` wires these handles
into fixtures with the scopes it needs.  Every handle is also a context
manager, and ``close()`` is the always-safe teardown call.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import glob
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self
from urllib.parse import urlparse

if TYPE_CHECKING:
    from pymongo import MongoClient

__all__ = [
    "DEFAULT_START_TIMEOUT",
    "Ensemble",
    "ExternalMongo",
    "MongoHandle",
    "MongoKind",
    "SecantusMongo",
    "ServerControlUnsupported",
    "ServerStartError",
    "TestcontainersMongo",
    "ZKHandle",
    "ZooKeeperEnsemble",
    "ZooKeeperServer",
    "docker_available",
    "four_letter_word",
    "free_ports",
    "start_ensemble",
    "start_mongo",
    "start_zookeeper",
    "zookeeper_available",
    "zookeeper_classpath",
]

DEFAULT_START_TIMEOUT = 30.0
"""Seconds a server gets to answer before :class:`ServerStartError`."""

STOP_GRACE = 15.0
"""Seconds between SIGTERM and SIGKILL in ``stop()``."""

LOG_TAIL_LINES = 40

MONGO_URI_ENV = "LOCSTATUS_TEST_MONGO_URI"
NO_DOCKER_ENV = "LOCSTATUS_TEST_NO_DOCKER"
ZK_CLASSPATH_ENV = "LOCSTATUS_ZK_CLASSPATH"

_DEBIAN_JAVA_DIR = Path("/usr/share/java")

PathLike = str | os.PathLike[str]


class ServerStartError(RuntimeError):
    """A server process did not become ready; the message has its log tail."""


class ServerControlUnsupported(RuntimeError):
    """stop/start/kill was called on a server this module does not own
    (``LOCSTATUS_TEST_MONGO_URI``)."""


# --------------------------------------------------------------------------
# process bookkeeping
# --------------------------------------------------------------------------

_LIVE: dict[int, subprocess.Popen[bytes]] = {}


def _register(proc: subprocess.Popen[bytes]) -> None:
    _LIVE[proc.pid] = proc


def _unregister(proc: subprocess.Popen[bytes]) -> None:
    _LIVE.pop(proc.pid, None)


@atexit.register
def _kill_leftovers() -> None:
    """Last-resort cleanup: SIGKILL every child this module started and that a
    test forgot to stop.  Only our own PIDs are touched."""
    for proc in list(_LIVE.values()):
        with contextlib.suppress(OSError):
            proc.kill()
        with contextlib.suppress(Exception):
            proc.wait(timeout=5)
    _LIVE.clear()


def _terminate(proc: subprocess.Popen[bytes], grace: float = STOP_GRACE) -> None:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL.  Always reaps."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
            proc.send_signal(signal.SIGCONT)  # in case it was pause()d
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(timeout=10)
    _unregister(proc)


def _kill9(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(timeout=10)
    _unregister(proc)


def _spawn(
    cmd: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``cmd`` with stdout+stderr appended to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(f"\n===== {time.strftime('%H:%M:%S')} starting: {' '.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(env) if env is not None else None,
            close_fds=True,
        )
    _register(proc)
    return proc


def _log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<no log: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


def _start_error(what: str, why: str, cmd: Sequence[str], log_path: Path) -> ServerStartError:
    return ServerStartError(
        f"{what} {why}\n  command: {' '.join(cmd)}\n  log: {log_path}\n"
        f"---- last {LOG_TAIL_LINES} log lines ----\n{_log_tail(log_path)}"
    )


def _bind_conflict(log_path: Path) -> bool:
    return "Address already in use" in _log_tail(log_path, 200)


def _set_aside(log_path: Path, attempt: int) -> None:
    """Keep a failed attempt's log, but out of the way of the next attempt."""
    with contextlib.suppress(OSError):
        log_path.rename(log_path.with_name(f"{log_path.name}.failed-{attempt}"))


# --------------------------------------------------------------------------
# ports, docker
# --------------------------------------------------------------------------


def free_ports(n: int = 1) -> list[int]:
    """``n`` distinct currently-free TCP ports on 127.0.0.1 (bind to port 0;
    all sockets are held open together so the ports are distinct)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@functools.cache
def docker_available() -> bool:
    """True iff a Docker engine answers ``GET /_ping`` within 0.5 s.

    Looks at ``$DOCKER_HOST`` (``unix://`` or ``tcp://``), else
    ``/var/run/docker.sock`` and the rootless ``$XDG_RUNTIME_DIR/docker.sock``.
    ``LOCSTATUS_TEST_NO_DOCKER=1`` forces False.  The result is cached.
    """
    if os.environ.get(NO_DOCKER_ENV, "") not in ("", "0"):
        return False
    targets: list[tuple[int, Any]] = []
    host = os.environ.get("DOCKER_HOST", "")
    if host:
        url = urlparse(host)
        if url.scheme == "unix":
            targets.append((socket.AF_UNIX, url.path))
        elif url.scheme in ("tcp", "http", "https") and url.hostname:
            targets.append((socket.AF_INET, (url.hostname, url.port or 2375)))
        else:
            return False
    else:
        candidates = ["/var/run/docker.sock"]
        if xdg := os.environ.get("XDG_RUNTIME_DIR"):
            candidates.append(os.path.join(xdg, "docker.sock"))
        targets.extend((socket.AF_UNIX, p) for p in candidates if os.path.exists(p))
    tls = os.environ.get("DOCKER_TLS_VERIFY", "") not in ("", "0")
    return any(_docker_ping(family, addr, tls) for family, addr in targets)


def _docker_ping(family: int, addr: Any, tls: bool) -> bool:
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(0.5)
            s.connect(addr)
            if tls:
                # Speaking TLS needs the client certs; a TCP accept is enough.
                return True
            s.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            data = b""
            while len(data) < 4096:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
                if b"\r\n\r\n" in data and data.rstrip().endswith(b"OK"):
                    break
    except OSError:
        return False
    return data.startswith(b"HTTP/") and b" 200 " in data.split(b"\r\n", 1)[0]


# --------------------------------------------------------------------------
# ZooKeeper
# --------------------------------------------------------------------------


def _manifest_classpath(jar: Path) -> list[str]:
    try:
        with zipfile.ZipFile(jar) as zf:
            manifest = zf.read("META-INF/MANIFEST.MF").decode("utf-8", "replace")
    except (OSError, KeyError, zipfile.BadZipFile):
        return []
    # Manifest lines are wrapped at 72 bytes; continuation lines start with " ".
    unfolded = re.sub(r"\r?\n ", "", manifest)
    for line in unfolded.splitlines():
        if line.startswith("Class-Path:"):
            entries = line.split(":", 1)[1].split()
            return [str((jar.parent / e) if not os.path.isabs(e) else Path(e)) for e in entries]
    return []


@functools.cache
def zookeeper_classpath() -> str:
    """Classpath for a ZooKeeper server JVM, or "" if ZooKeeper is not installed.

    Order: ``$LOCSTATUS_ZK_CLASSPATH`` verbatim; ``$ZOOKEEPER_HOME/lib/*.jar``
    (+ ``$ZOOKEEPER_HOME/*.jar``) for an Apache tarball; else the Debian
    package: ``/usr/share/java/zookeeper.jar`` plus every existing entry of its
    manifest ``Class-Path`` plus an SLF4J binding so the server logs.
    """
    if explicit := os.environ.get(ZK_CLASSPATH_ENV):
        return explicit
    if home := os.environ.get("ZOOKEEPER_HOME"):
        jars = sorted(glob.glob(os.path.join(home, "lib", "*.jar")))
        jars += sorted(glob.glob(os.path.join(home, "*.jar")))
        if jars:
            return os.pathsep.join(jars)
    main_jar = _DEBIAN_JAVA_DIR / "zookeeper.jar"
    if not main_jar.is_file():
        return ""
    entries = [str(main_jar)]
    for extra in [*_manifest_classpath(main_jar), str(_DEBIAN_JAVA_DIR / "zookeeper-jute.jar")]:
        if os.path.isfile(extra) and extra not in entries:
            entries.append(extra)
    for binding in ("slf4j-simple.jar", "slf4j-log4j12.jar"):
        candidate = _DEBIAN_JAVA_DIR / binding
        if candidate.is_file():
            entries.append(str(candidate))
            if binding == "slf4j-log4j12.jar":
                log4j = _DEBIAN_JAVA_DIR / "log4j-1.2.jar"
                if log4j.is_file():
                    entries.append(str(log4j))
            break
    return os.pathsep.join(entries)


def _java() -> str | None:
    if home := os.environ.get("JAVA_HOME"):
        candidate = Path(home) / "bin" / "java"
        if candidate.is_file():
            return str(candidate)
    return shutil.which("java")


def zookeeper_available() -> bool:
    """True if a java binary and a ZooKeeper classpath were found (or Docker
    could be used instead)."""
    return (_java() is not None and zookeeper_classpath() != "") or docker_available()


JVM_OPTS: tuple[str, ...] = (
    "-Xms32m",
    "-Xmx256m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",
    "-Djava.net.preferIPv4Stack=true",
    "-Dzookeeper.admin.enableServer=false",
    "-Dzookeeper.forceSync=no",
    # Election connections to a dead peer on localhost are refused at once,
    # but keep the connect timeout short anyway (default 5 s).
    "-Dzookeeper.cnxTimeout=1000",
    "-Dorg.slf4j.simpleLogger.defaultLogLevel=info",
    "-Dorg.slf4j.simpleLogger.showDateTime=true",
    "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
)

STANDALONE_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
QUORUM_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"


def four_letter_word(
    port: int, cmd: str = "srvr", host: str = "127.0.0.1", timeout: float = 1.0
) -> str:
    """Send a ZooKeeper 4-letter word and return the reply ("" on any error)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(cmd.encode("ascii"))
            chunks: list[bytes] = []
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                chunks.append(chunk)
    except OSError:
        return ""
    return b"".join(chunks).decode("utf-8", "replace")


_MODE_RE = re.compile(r"^Mode:\s*(\w+)", re.MULTILINE)


class ZooKeeperServer:
    """One ZooKeeper server JVM, standalone or an ensemble member.

    The port and data directory are fixed at construction and survive
    ``stop()``/``start()``/``kill()``.  ``start()`` blocks until the server
    serves requests (``srvr`` reports a Mode) or raises :class:`ServerStartError`.
    """

    def __init__(
        self,
        base_dir: PathLike,
        *,
        port: int | None = None,
        tick_time_ms: int = 200,
        myid: int | None = None,
        peers: Mapping[int, tuple[int, int]] | None = None,
        extra_config: Mapping[str, str | int] | None = None,
        jvm_opts: Sequence[str] = JVM_OPTS,
    ) -> None:
        """
        :param base_dir: directory for ``zoo.cfg``, ``data/`` and ``zookeeper.log``.
        :param port: client port (default: a free one).
        :param myid: this member's id when part of an ensemble.
        :param peers: ``{myid: (quorum_port, election_port)}`` of *all* members
            (including this one); omit for a standalone server.
        """
        self.base_dir = Path(base_dir)
        self.data_dir = self.base_dir / "data"
        self.config_path = self.base_dir / "zoo.cfg"
        self.log_path = self.base_dir / "zookeeper.log"
        self.port: int = port if port is not None else free_ports(1)[0]
        self.tick_time_ms = tick_time_ms
        self.myid = myid
        self.peers: dict[int, tuple[int, int]] = dict(peers or {})
        self.extra_config: dict[str, str | int] = dict(extra_config or {})
        self.jvm_opts = list(jvm_opts)
        self._proc: subprocess.Popen[bytes] | None = None

    # -- public properties --------------------------------------------------

    @property
    def hosts(self) -> str:
        """kazoo connection string, ``"127.0.0.1:<port>"``."""
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """PID of the running JVM, None when stopped."""
        return self._proc.pid if self.running and self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def is_member(self) -> bool:
        return bool(self.peers)

    def mode(self) -> str | None:
        """``leader`` / ``follower`` / ``standalone`` / ``observer``, or None
        when the server is down or not serving (e.g. no quorum)."""
        if not self.running:
            return None
        m = _MODE_RE.search(four_letter_word(self.port, "srvr"))
        return m.group(1) if m else None

    # -- lifecycle -----------------------------------------------------------

    def command(self) -> list[str]:
        java = _java()
        classpath = zookeeper_classpath()
        if java is None or not classpath:
            raise ServerStartError(
                "ZooKeeper cannot be started: "
                + (
                    "no java binary (set JAVA_HOME or PATH)"
                    if java is None
                    else "no ZooKeeper jars (install Debian 'zookeeper', or set "
                    f"ZOOKEEPER_HOME / {ZK_CLASSPATH_ENV})"
                )
            )
        main = QUORUM_MAIN if self.is_member else STANDALONE_MAIN
        return [java, *self.jvm_opts, "-cp", classpath, main, str(self.config_path)]

    def _write_config(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cfg: dict[str, str | int] = {
            "tickTime": self.tick_time_ms,
            "minSessionTimeout": 2 * self.tick_time_ms,
            "maxSessionTimeout": 60000,
            "dataDir": str(self.data_dir),
            "clientPort": self.port,
            "clientPortAddress": "127.0.0.1",
            "admin.enableServer": "false",
            "4lw.commands.whitelist": "*",
            "maxClientCnxns": 0,
            "preAllocSize": 4096,  # KB; default 64 MB per txn log file
            "autopurge.purgeInterval": 0,
        }
        if self.is_member:
            cfg.update(
                {
                    # initLimit/syncLimit are in ticks: 10 s to sync, 3 s lag.
                    "initLimit": 50,
                    "syncLimit": 15,
                    "quorumListenOnAllIPs": "false",
                }
            )
            for sid, (qport, eport) in sorted(self.peers.items()):
                cfg[f"server.{sid}"] = f"127.0.0.1:{qport}:{eport}"
            (self.data_dir / "myid").write_text(f"{self.myid}\n")
        cfg.update(self.extra_config)
        self.config_path.write_text("".join(f"{k}={v}\n" for k, v in cfg.items()))

    def start(self, *, wait: bool = True, timeout: float = DEFAULT_START_TIMEOUT) -> Self:
        """(Re)start the JVM with the same port and data dir.  No-op if running."""
        if self.running:
            return self
        self._write_config()
        self._proc = _spawn(self.command(), self.log_path)
        if wait:
            self.wait_ready(timeout=timeout)
        return self

    def wait_ready(
        self, timeout: float = DEFAULT_START_TIMEOUT, modes: Sequence[str] | None = None
    ) -> str:
        """Block until ``srvr`` reports one of ``modes`` (default: any mode,
        i.e. serving).  Returns the mode.  Kills the process on failure."""
        deadline = time.monotonic() + timeout
        proc = self._proc
        if proc is None:
            raise ServerStartError(f"ZooKeeper on port {self.port} was never started")
        while True:
            if proc.poll() is not None:
                err = _start_error(
                    f"ZooKeeper (port {self.port})",
                    f"exited with code {proc.returncode} before serving",
                    self.command(),
                    self.log_path,
                )
                _unregister(proc)
                raise err
            mode = self.mode()
            if mode is not None and (modes is None or mode in modes):
                return mode
            if time.monotonic() >= deadline:
                _kill9(proc)
                raise _start_error(
                    f"ZooKeeper (port {self.port})",
                    f"did not serve within {timeout:.0f}s (last mode: {mode})",
                    self.command(),
                    self.log_path,
                )
            time.sleep(0.05)

    def stop(self, grace: float = STOP_GRACE) -> None:
        """SIGTERM the JVM by PID, SIGKILL after ``grace`` seconds."""
        if self._proc is not None:
            _terminate(self._proc, grace)

    def kill(self) -> None:
        """``kill -9`` the JVM (no clean shutdown, sessions are not closed)."""
        if self._proc is not None:
            _kill9(self._proc)

    def pause(self) -> None:
        """SIGSTOP: the server hangs with its sockets open (clients see
        timeouts, not connection refused) - e.g. to expire sessions."""
        if self._proc is not None and self.running:
            self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        if self._proc is not None and self.running:
            self._proc.send_signal(signal.SIGCONT)

    def close(self) -> None:
        """Teardown: stop if running.  Always safe to call."""
        self.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ZooKeeperServer {self.hosts} pid={self.pid} myid={self.myid}>"


ZKHandle = ZooKeeperServer
"""Alias: what :func:`start_zookeeper` returns."""


def start_zookeeper(
    tmp_dir: PathLike,
    *,
    tick_time_ms: int = 200,
    timeout: float = DEFAULT_START_TIMEOUT,
    extra_config: Mapping[str, str | int] | None = None,
) -> ZooKeeperServer:
    """Start a standalone ZooKeeper in ``tmp_dir/zookeeper`` on a free port and
    wait until it serves.  Retries twice on a fresh port if the chosen port was
    taken by someone else between picking and binding."""
    base = Path(tmp_dir) / "zookeeper"
    for attempt in range(3):
        server = ZooKeeperServer(base, tick_time_ms=tick_time_ms, extra_config=extra_config)
        try:
            return server.start(timeout=timeout)
        except ServerStartError:
            server.kill()
            if attempt == 2 or not _bind_conflict(server.log_path):
                raise
            _set_aside(server.log_path, attempt)
            shutil.rmtree(server.data_dir, ignore_errors=True)
    raise AssertionError("unreachable")


class ZooKeeperEnsemble:
    """A real n-node ZooKeeper quorum on 127.0.0.1.  Indices are 0-based
    (``servers[i]`` has ``myid == i + 1``)."""

    def __init__(
        self,
        tmp_dir: PathLike,
        n: int = 3,
        *,
        tick_time_ms: int = 200,
        extra_config: Mapping[str, str | int] | None = None,
    ) -> None:
        if n < 1:
            raise ValueError("an ensemble needs at least one server")
        ports = free_ports(3 * n)
        peers = {i + 1: (ports[n + i], ports[2 * n + i]) for i in range(n)}
        self.base_dir = Path(tmp_dir) / "zk-ensemble"
        self.servers: list[ZooKeeperServer] = [
            ZooKeeperServer(
                self.base_dir / f"node{i + 1}",
                port=ports[i],
                tick_time_ms=tick_time_ms,
                myid=i + 1,
                peers=peers,
                extra_config=extra_config,
            )
            for i in range(n)
        ]

    @property
    def hosts(self) -> str:
        """Connection string with every member, e.g. ``127.0.0.1:a,127.0.0.1:b,...``."""
        return ",".join(s.hosts for s in self.servers)

    def __len__(self) -> int:
        return len(self.servers)

    def __iter__(self) -> Iterator[ZooKeeperServer]:
        return iter(self.servers)

    def __getitem__(self, i: int) -> ZooKeeperServer:
        return self.servers[i]

    def start_all(self, timeout: float = DEFAULT_START_TIMEOUT) -> Self:
        """Start every member (all JVMs in parallel) and wait for a quorum."""
        for s in self.servers:
            s.start(wait=False)
        try:
            self.wait_for_quorum(timeout=timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_for_quorum(self, timeout: float = DEFAULT_START_TIMEOUT) -> int:
        """Wait until every running member serves (leader/follower) and exactly
        one is leader.  Returns the leader index."""
        deadline = time.monotonic() + timeout
        modes: list[str | None] = []
        while True:
            for i, s in enumerate(self.servers):
                proc = s._proc
                if proc is not None and proc.poll() is not None and proc.pid in _LIVE:
                    _unregister(proc)
                    raise _start_error(
                        f"ZooKeeper member {i} (myid {s.myid})",
                        f"exited with code {proc.returncode}",
                        s.command(),
                        s.log_path,
                    )
            modes = [s.mode() if s.running else "down" for s in self.servers]
            live = [m for m in modes if m != "down"]
            if live and None not in live and live.count("leader") == 1:
                return modes.index("leader")
            if time.monotonic() >= deadline:
                tails = "\n".join(
                    f"==== node {i} ({s.log_path}) ====\n{_log_tail(s.log_path, 15)}"
                    for i, s in enumerate(self.servers)
                )
                raise ServerStartError(
                    f"ZooKeeper ensemble formed no quorum within {timeout:.0f}s; "
                    f"modes={modes}\n{tails}"
                )
            time.sleep(0.05)

    def leader(self, timeout: float = DEFAULT_START_TIMEOUT) -> int:
        """Index of the current leader (``srvr`` says ``Mode: leader``), waiting
        up to ``timeout`` while an election is in progress."""
        deadline = time.monotonic() + timeout
        while True:
            modes = [s.mode() for s in self.servers]
            if modes.count("leader") == 1:
                return modes.index("leader")
            if time.monotonic() >= deadline:
                raise ServerStartError(f"no single ZooKeeper leader after {timeout:.0f}s: {modes}")
            time.sleep(0.05)

    def modes(self) -> list[str | None]:
        return [s.mode() for s in self.servers]

    def kill(self, i: int) -> None:
        """``kill -9`` member ``i``."""
        self.servers[i].kill()

    def start(self, i: int, timeout: float = DEFAULT_START_TIMEOUT) -> None:
        """Restart member ``i`` (same ports and data) and wait until it has
        joined the quorum as leader or follower."""
        server = self.servers[i]
        server.start(wait=False)
        server.wait_ready(timeout=timeout, modes=("leader", "follower", "observer"))

    def stop(self, i: int | None = None) -> None:
        """Stop member ``i`` (SIGTERM→SIGKILL), or every member when ``i`` is None."""
        targets = self.servers if i is None else [self.servers[i]]
        for s in targets:  # signal all first, then reap: faster than one by one
            if s._proc is not None and s._proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    s._proc.send_signal(signal.SIGTERM)
        for s in targets:
            s.stop()

    def close(self) -> None:
        self.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ZooKeeperEnsemble {self.hosts}>"


Ensemble = ZooKeeperEnsemble
"""Alias: what :func:`start_ensemble` returns."""


def start_ensemble(
    tmp_dir: PathLike,
    n: int = 3,
    *,
    tick_time_ms: int = 200,
    timeout: float = DEFAULT_START_TIMEOUT,
    extra_config: Mapping[str, str | int] | None = None,
) -> ZooKeeperEnsemble:
    """Start an ``n``-node quorum under ``tmp_dir/zk-ensemble`` and wait until a
    leader is elected and all members serve."""
    return ZooKeeperEnsemble(
        tmp_dir, n, tick_time_ms=tick_time_ms, extra_config=extra_config
    ).start_all(timeout=timeout)


# --------------------------------------------------------------------------
# MongoDB-wire server
# --------------------------------------------------------------------------

MongoKind = Literal["mongod", "testcontainers", "secantusdb"]


def _wait_mongo(uri: str, deadline: float, alive: Any = None) -> str | None:
    """Poll ``ping`` until it succeeds or ``deadline``; returns the last error
    text, or None on success.  ``alive()`` returning False aborts early."""
    from pymongo import MongoClient

    last = "never tried"
    while time.monotonic() < deadline:
        if alive is not None and not alive():
            return "process exited"
        client: MongoClient[dict[str, Any]] = MongoClient(
            uri, serverSelectionTimeoutMS=250, connectTimeoutMS=250, socketTimeoutMS=2000
        )
        try:
            client.admin.command("ping")
            return None
        except Exception as exc:
            last = f"{type(exc).__name__}: {exc}"
        finally:
            client.close()
        time.sleep(0.05)
    return last


class MongoHandle:
    """Common interface of every MongoDB-wire server the suite can use.

    ``stop()``/``start()`` keep port and data; ``kill()`` is SIGKILL;
    ``close()`` is the always-safe teardown.  ``controllable`` is False for an
    external server (``LOCSTATUS_TEST_MONGO_URI``), whose stop/start/kill raise
    :class:`ServerControlUnsupported` - tests needing restarts should check it
    and skip.
    """

    kind: MongoKind
    uri: str
    port: int
    controllable: bool = True

    @property
    def pid(self) -> int | None:
        raise NotImplementedError

    @property
    def running(self) -> bool:
        raise NotImplementedError

    def start(self, timeout: float = DEFAULT_START_TIMEOUT) -> Self:
        raise NotImplementedError

    def stop(self, grace: float = STOP_GRACE) -> None:
        raise NotImplementedError

    def kill(self) -> None:
        raise NotImplementedError

    def pause(self) -> None:
        """Freeze the server (SIGSTOP, or ``docker pause``): its sockets stay open and it
        answers nothing (clients see timeouts, not connection refused)."""
        raise NotImplementedError

    def resume(self) -> None:
        """Undo :meth:`pause` (SIGCONT, or ``docker unpause``)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def client(self, **kwargs: Any) -> MongoClient[dict[str, Any]]:
        """A new MongoClient for ``uri``; caller closes it."""
        from pymongo import MongoClient

        opts: dict[str, Any] = {"serverSelectionTimeoutMS": 5000}
        opts.update(kwargs)
        return MongoClient(self.uri, **opts)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} kind={self.kind} uri={self.uri} pid={self.pid}>"


class ExternalMongo(MongoHandle):
    """A server given by ``LOCSTATUS_TEST_MONGO_URI``: no process, no control.
    ``close()`` is a no-op; ``stop``/``start``/``kill`` raise
    :class:`ServerControlUnsupported`."""

    controllable = False

    def __init__(self, uri: str) -> None:
        self.kind = "mongod"
        self.uri = uri
        self.port = urlparse(uri).port or 27017

    @property
    def pid(self) -> int | None:
        return None

    @property
    def running(self) -> bool:
        return True

    def _unsupported(self, op: str) -> ServerControlUnsupported:
        return ServerControlUnsupported(
            f"{op}() is not possible on the external server {MONGO_URI_ENV}={self.uri}; "
            "check handle.controllable and skip tests that need restarts"
        )

    def start(self, timeout: float = DEFAULT_START_TIMEOUT) -> Self:
        raise self._unsupported("start")

    def stop(self, grace: float = STOP_GRACE) -> None:
        raise self._unsupported("stop")

    def kill(self) -> None:
        raise self._unsupported("kill")

    def pause(self) -> None:
        raise self._unsupported("pause")

    def resume(self) -> None:
        raise self._unsupported("resume")

    def close(self) -> None:
        pass


def _secantus_command() -> list[str]:
    beside = Path(sys.executable).parent / "secantusd-py"
    if beside.is_file():
        return [str(beside)]
    if found := shutil.which("secantusd-py"):
        return [found]
    return [sys.executable, "-m", "secantus"]


class SecantusMongo(MongoHandle):
    """SecantusDB (``secantusd-py``) as a local process.

    It advertises itself as the primary of a single-node replica set named
    ``secantus`` (so pymongo allows change streams and transactions; pass
    ``extra_args=["--standalone"]`` to look like a standalone mongod).  An
    empty ``--config`` file disables auto-discovery of ``./secantusd.toml``
    and friends so a developer's config cannot leak into tests.

    Behaviour worth knowing when writing tests against it (SecantusDB 0.7.0b3):

    * ``kill()`` right after an acknowledged ``w:1`` (or ``w:"majority"``)
      write can lose that write; ``j=True`` writes survive, as does anything
      written >= ~50 ms before the kill.  ``extra_args=["--sync-on-commit"]``
      makes every commit durable.
    * ``findAndModify`` (``find_one_and_update``) scans the collection: about
      0.65 ms with 1 document, 8 ms with 1000, 33 ms with 5000, while
      ``update_one`` stays ~1 ms.  It *is* atomic for CAS filters.
    * Throughput degrades after ~10k writes in one server process (p50
      ~1 ms -> ~4 ms, p99 -> ~60 ms); a restart resets it.
    * The TTL monitor runs every 60 s and the CLI ignores
      ``[storage] ttl_sweep_seconds``; call :meth:`prune_ttl` to expire now.
    * ``stop()`` (SIGTERM) takes 0.3-2.1 s: the server drains connections.
    """

    def __init__(
        self, base_dir: PathLike, *, port: int | None = None, extra_args: Sequence[str] = ()
    ) -> None:
        self.kind = "secantusdb"
        self.base_dir = Path(base_dir)
        self.storage_path = self.base_dir / "data"
        self.log_path = self.base_dir / "secantusd.log"
        self.config_path = self.base_dir / "secantusd.toml"
        self.port = port if port is not None else free_ports(1)[0]
        self.uri = f"mongodb://127.0.0.1:{self.port}/"
        self.extra_args = list(extra_args)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self.running and self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        return [
            *_secantus_command(),
            "--config",
            str(self.config_path),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--storage-path",
            str(self.storage_path),
            "--cache-size",
            "128M",
            "--log-level",
            "INFO",
            *self.extra_args,
        ]

    def start(self, timeout: float = DEFAULT_START_TIMEOUT) -> Self:
        """(Re)start on the same port and storage path; waits for ``ping``."""
        if self.running:
            return self
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if not self.config_path.exists():
            self.config_path.write_text("# empty: disables secantusd.toml auto-discovery\n")
        cmd = self.command()
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        proc = self._proc = _spawn(cmd, self.log_path, env)
        err = _wait_mongo(self.uri, time.monotonic() + timeout, lambda: proc.poll() is None)
        if err is not None:
            code = proc.poll()
            _kill9(proc)
            why = (
                f"exited with code {code}"
                if code is not None
                else f"did not answer ping within {timeout:.0f}s ({err})"
            )
            raise _start_error(f"SecantusDB (port {self.port})", why, cmd, self.log_path)
        return self

    def stop(self, grace: float = STOP_GRACE) -> None:
        if self._proc is not None:
            _terminate(self._proc, grace)

    def kill(self) -> None:
        if self._proc is not None:
            _kill9(self._proc)

    def pause(self) -> None:
        if self._proc is not None and self.running:
            self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self._proc is not None and self.running:
            self._proc.send_signal(signal.SIGCONT)

    def close(self) -> None:
        self.stop()  # SIGCONTs a paused server first (_terminate)

    def prune_ttl(self) -> int:
        """Run the TTL monitor now (``secantusAdmin.pruneTtl``); returns the
        number of expired documents deleted."""
        client = self.client()
        try:
            reply = client.admin.command("secantusAdmin.pruneTtl")
        finally:
            client.close()
        return int(reply.get("pruned", 0))


class TestcontainersMongo(MongoHandle):
    """``mongo`` in Docker via testcontainers' ``MongoDbContainer``.

    The host port is bound explicitly so ``stop()``/``start()`` (docker
    stop/start of the same container, data kept) keep ``uri`` valid.  Note: a
    plain ``MongoDbContainer`` is a *standalone* mongod (no change streams,
    no transactions).
    """

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, *, image: str | None = None, port: int | None = None) -> None:
        self.kind = "testcontainers"
        self.image = image or os.environ.get("LOCSTATUS_TEST_MONGO_IMAGE", "mongo:7.0")
        self.port = port if port is not None else free_ports(1)[0]
        self.username = "test"
        self.password = "test"
        self.uri = (
            f"mongodb://{self.username}:{self.password}@127.0.0.1:{self.port}/?authSource=admin"
        )
        self._container: Any = None

    def _wrapped(self) -> Any:
        if self._container is None:
            raise RuntimeError("container was never started")
        return self._container.get_wrapped_container()

    @property
    def pid(self) -> int | None:
        if self._container is None:
            return None
        wrapped = self._wrapped()
        wrapped.reload()
        pid = wrapped.attrs.get("State", {}).get("Pid") or None
        return int(pid) if pid else None

    @property
    def running(self) -> bool:
        if self._container is None:
            return False
        wrapped = self._wrapped()
        wrapped.reload()
        return bool(wrapped.attrs.get("State", {}).get("Running"))

    def start(self, timeout: float = DEFAULT_START_TIMEOUT) -> Self:
        if self._container is None:
            from testcontainers.community.mongodb import MongoDbContainer

            container = MongoDbContainer(
                self.image, username=self.username, password=self.password
            ).with_bind_ports(27017, self.port)
            container.start()
            self._container = container
        elif not self.running:
            self._wrapped().start()
        err = _wait_mongo(self.uri, time.monotonic() + timeout)
        if err is not None:
            raise ServerStartError(f"mongo container on port {self.port} not ready: {err}")
        return self

    def stop(self, grace: float = STOP_GRACE) -> None:
        if self._container is not None and self.running:
            self._wrapped().stop(timeout=int(grace))

    def kill(self) -> None:
        if self._container is not None and self.running:
            self._wrapped().kill()

    def pause(self) -> None:
        if self._container is not None and self.running:
            self._wrapped().pause()

    def resume(self) -> None:
        if self._container is not None:
            self._wrapped().unpause()

    def close(self) -> None:
        if self._container is not None:
            with contextlib.suppress(Exception):
                self._container.stop()
            self._container = None


def start_mongo(
    tmp_dir: PathLike,
    *,
    timeout: float = DEFAULT_START_TIMEOUT,
    prefer: MongoKind | None = None,
    extra_args: Sequence[str] = (),
) -> MongoHandle:
    """Start (or locate) a MongoDB-wire server and wait until ``ping`` works.

    Order: ``$LOCSTATUS_TEST_MONGO_URI`` (external, not controllable) >
    testcontainers if :func:`docker_available` > ``secantusd-py`` in
    ``tmp_dir/mongo``.  ``prefer="secantusdb"`` / ``"testcontainers"`` skips
    the detection.  ``extra_args`` go to ``secantusd-py``.
    """
    if prefer is None:
        if uri := os.environ.get(MONGO_URI_ENV):
            handle: MongoHandle = ExternalMongo(uri)
            err = _wait_mongo(uri, time.monotonic() + timeout)
            if err is not None:
                raise ServerStartError(f"{MONGO_URI_ENV}={uri} does not answer ping: {err}")
            return handle
        prefer = "testcontainers" if docker_available() else "secantusdb"
    if prefer == "testcontainers":
        tc = TestcontainersMongo()
        try:
            return tc.start(timeout=timeout)
        except BaseException:
            tc.close()
            raise
    if prefer != "secantusdb":
        raise ValueError(f"cannot start a {prefer!r} server (use {MONGO_URI_ENV})")
    base = Path(tmp_dir) / "mongo"
    for attempt in range(3):
        server = SecantusMongo(base, extra_args=extra_args)
        try:
            return server.start(timeout=timeout)
        except ServerStartError:
            if attempt == 2 or not _bind_conflict(server.log_path):
                raise
            _set_aside(server.log_path, attempt)
            shutil.rmtree(server.storage_path, ignore_errors=True)
    raise AssertionError("unreachable")
