"""The ZooKeeper kit: a real ZooKeeper for the shared suites, plus the tools of the ZK fault tests.

- ``zk_server`` (session-scoped fixture): one real standalone ZooKeeper for the whole run. By
  default the JVM of Debian's ``zookeeper`` package started by ``servers.start_zookeeper`` (free
  port, temp data dir, ``admin.enableServer=false``, stopped by PID); when a Docker engine answers
  (``servers.docker_available()``, under a second) the official ``zookeeper`` image through
  testcontainers instead. ``LOCSTATUS_TEST_NO_DOCKER=1`` forces the local JVM.
- ``zk_kit(server)``: a :class:`Kit` on a fresh chroot of that server; ``write_raw`` stores text
  verbatim as a location's znode with a raw kazoo client (corruption tests).
- :class:`TcpProxy`: a small TCP proxy between a client and ZooKeeper that can cut every
  connection (RST), freeze traffic (a partition: the server expires the session while the client
  hears nothing), and cut the connection around the next multi-op request it forwards, before or
  after the server sees it (the two halves of an ambiguous compare-and-set).
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError

from locstatus.backends.zookeeper import Layout, split_version

from support.kits import Kit
from support.servers import (
    DEFAULT_START_TIMEOUT,
    ServerStartError,
    docker_available,
    four_letter_word,
    free_ports,
    start_zookeeper,
)

ZK_IMAGE = "zookeeper:3.8"
MULTI_OPCODE = 14


class ZkServer(Protocol):
    """What the kit needs from a server handle."""

    @property
    def hosts(self) -> str: ...

    def close(self) -> None: ...


class ZkContainer:
    """ZooKeeper in Docker (testcontainers), same small timings as the local JVM."""

    def __init__(self) -> None:
        from testcontainers.core.container import DockerContainer

        self.port = free_ports(1)[0]
        self._container: Any = (
            DockerContainer(ZK_IMAGE)
            .with_bind_ports(2181, self.port)
            .with_env("ZOO_TICK_TIME", "200")
            .with_env("ZOO_4LW_COMMANDS_WHITELIST", "*")
            .with_env("ZOO_ADMINSERVER_ENABLED", "false")
            .with_env("ZOO_CFG_EXTRA", "minSessionTimeout=400 maxSessionTimeout=60000")
        )
        self._container.start()
        deadline = time.monotonic() + DEFAULT_START_TIMEOUT
        while "Mode:" not in four_letter_word(self.port, "srvr"):
            if time.monotonic() > deadline:
                self.close()
                raise ServerStartError(f"ZooKeeper container on port {self.port} did not serve")
            time.sleep(0.1)

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._container.stop()


def start_zk(tmp_dir: Path) -> ZkServer:
    """A standalone ZooKeeper: Docker when reachable, else the local JVM."""
    if docker_available():
        return ZkContainer()
    return start_zookeeper(tmp_dir)


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZkServer]:
    server = start_zk(tmp_path_factory.mktemp("zk"))
    try:
        yield server
    finally:
        server.close()


@contextlib.contextmanager
def raw_client(hosts: str, **kwargs: Any) -> Iterator[KazooClient]:
    """A plain kazoo client (no locstatus), stopped on exit."""
    client = KazooClient(hosts=hosts, **kwargs)
    client.start(timeout=15)
    try:
        yield client
    finally:
        client.stop()
        client.close()


def zk_url(hosts: str, chroot: str | None = None, **params: object) -> str:
    """``zk://hosts/chroot?params`` on a fresh chroot unless one is given."""
    chroot = chroot or f"/t-{uuid.uuid4().hex[:12]}"
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return f"zk://{hosts}{chroot}" + (f"?{query}" if query else "")


def zk_kit(server: ZkServer) -> Kit:
    chroot = f"/t-{uuid.uuid4().hex[:12]}"
    url = zk_url(server.hosts, chroot)

    def write_raw(location: str, text: str) -> None:
        path = f"{chroot}/locations/{location}"
        with raw_client(server.hosts) as client:
            try:
                client.create(path, text.encode(), makepath=True)
            except NodeExistsError:
                client.set(path, text.encode())

    def write_raw_history(location: str, version: int, text: str) -> None:
        inc, seq = split_version(version)
        with raw_client(server.hosts) as client:
            client.set(Layout(chroot).entry(location, inc, seq), text.encode())

    def write_raw_worker(worker_id: str, text: str) -> None:
        path = f"{chroot}/workers/{worker_id}"  # a live worker's ephemeral node, or a new one
        with raw_client(server.hosts) as client:
            try:
                client.create(path, text.encode(), makepath=True)
            except NodeExistsError:
                client.set(path, text.encode())

    def damage_ack(location: str, worker_id: str, service: str) -> None:
        # one node per worker and location holds every service's generation: all unreadable
        with raw_client(server.hosts) as client:
            client.set(f"{chroot}/acks/{location}/{worker_id}", json.dumps({service: "seven"}).encode())

    def read_raw(location: str) -> dict[str, Any]:
        with raw_client(server.hosts) as client:
            data, _ = client.get(f"{chroot}/locations/{location}")
        return dict(json.loads(data))

    return Kit("zk", url, write_raw, write_raw_history, write_raw_worker, damage_ack, read_raw)


# -- a TCP proxy for cutting and freezing connections --------------------------------------------


CutMode = Literal["before", "after"]


@dataclass
class _Pair:
    client: socket.socket
    server: socket.socket | None
    buf: bytearray = field(default_factory=bytearray)
    handshake_done: bool = False
    closed: bool = False


class TcpProxy:
    """Forward ``127.0.0.1:<port>`` to ``target`` (``host:port``), with faults on demand.

    - :meth:`cut`: reset every open connection now (the client reconnects through the proxy).
    - :meth:`freeze` / :meth:`thaw`: while frozen, open connections are reset and new ones are
      accepted but never answered - to the server the client is silent, to the client the
      server is: a partition. Long enough, and the server expires the session.
    - :meth:`cut_next_multi`: the next multi-op request (a locstatus compare-and-set) is either
      dropped (``before``: the server never sees it) or forwarded and its answer dropped
      (``after``: the server applies it, the client never hears); then the connection is reset.
      :attr:`multis_cut` counts how many were cut.

    One thread, ``select`` over every socket; the client-to-server direction is parsed into
    ZooKeeper frames (4-byte length prefix; after the connect handshake each request starts
    with ``xid, opcode``).
    """

    def __init__(self, target: str, *, frames: bool = True) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.frames = frames
        """Parse ZooKeeper frames (for :meth:`cut_next_multi`); False forwards bytes as they
        come (any protocol: MongoDB's wire protocol for one)."""
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self._pairs: list[_Pair] = []
        self._lock = threading.Lock()
        self._frozen = False
        self._trap: CutMode | None = None
        self._dropping: dict[int, float] = {}
        self.multis_cut = 0
        self.multis_seen = 0
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="tcp-proxy", daemon=True)
        self._thread.start()

    @property
    def hosts(self) -> str:
        return f"127.0.0.1:{self.port}"

    # -- controls --------------------------------------------------------------------------

    def cut(self) -> None:
        with self._lock:
            for pair in self._pairs:
                self._reset(pair)

    def freeze(self) -> None:
        with self._lock:
            self._frozen = True
            for pair in self._pairs:
                self._reset(pair)

    def thaw(self) -> None:
        with self._lock:
            self._frozen = False
            for pair in self._pairs:  # held connections: reset, the client reconnects at once
                if pair.server is None:
                    self._reset(pair)

    def cut_next_multi(self, mode: CutMode) -> None:
        with self._lock:
            self._trap = mode

    def close(self) -> None:
        self._stop = True
        self._thread.join(timeout=5)
        with self._lock:
            for pair in self._pairs:
                self._reset(pair)
        self._listener.close()

    # -- internals -------------------------------------------------------------------------

    @staticmethod
    def _hard_close(sock: socket.socket | None) -> None:
        if sock is None:
            return
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with contextlib.suppress(OSError):
            sock.close()

    def _reset(self, pair: _Pair) -> None:
        if not pair.closed:
            pair.closed = True
            self._hard_close(pair.client)
            self._hard_close(pair.server)

    def _loop(self) -> None:
        while not self._stop:
            with self._lock:
                self._pairs = [p for p in self._pairs if not p.closed]
                socks: list[socket.socket] = [self._listener]
                for p in self._pairs:
                    socks.append(p.client)
                    if p.server is not None:
                        socks.append(p.server)
                now = time.monotonic()
                for fd, deadline in list(self._dropping.items()):
                    if now >= deadline:
                        del self._dropping[fd]
                        for p in self._pairs:
                            if p.server is not None and p.server.fileno() == fd:
                                self._reset(p)
            try:
                readable, _, _ = select.select(socks, [], [], 0.05)
            except (OSError, ValueError):
                continue
            with self._lock:
                for sock in readable:
                    if sock is self._listener:
                        self._accept()
                        continue
                    pair = next(
                        (p for p in self._pairs if sock in (p.client, p.server) and not p.closed),
                        None,
                    )
                    if pair is not None:
                        self._pump(pair, sock)

    def _accept(self) -> None:
        try:
            conn, _ = self._listener.accept()
        except OSError:
            return
        if self._frozen:
            self._pairs.append(_Pair(conn, None))  # held, never answered
            return
        try:
            upstream = socket.create_connection(self.target, timeout=2)
        except OSError:
            self._hard_close(conn)
            return
        self._pairs.append(_Pair(conn, upstream))

    def _pump(self, pair: _Pair, sock: socket.socket) -> None:
        try:
            data = sock.recv(65536)
        except OSError:
            data = b""
        if not data:
            self._reset(pair)
            return
        if pair.server is None:
            return  # a held connection while frozen: swallow
        if sock is pair.server:
            if pair.server.fileno() in self._dropping:
                return  # the answer to a cut multi-op: never delivered
            try:
                pair.client.sendall(data)
            except OSError:
                self._reset(pair)
            return
        if not self.frames:
            try:
                pair.server.sendall(data)
            except OSError:
                self._reset(pair)
            return
        pair.buf.extend(data)
        while len(pair.buf) >= 4:
            (length,) = struct.unpack(">i", pair.buf[:4])
            if len(pair.buf) < 4 + length:
                break
            frame = bytes(pair.buf[: 4 + length])
            del pair.buf[: 4 + length]
            if not pair.handshake_done:
                pair.handshake_done = True
            elif length >= 8 and struct.unpack(">i", frame[8:12])[0] == MULTI_OPCODE:
                self.multis_seen += 1
                if self._trap is not None:
                    mode, self._trap = self._trap, None
                    self.multis_cut += 1
                    if mode == "before":
                        self._reset(pair)
                        return
                    # after: let the server apply it, swallow its answer, then reset
                    self._dropping[pair.server.fileno()] = time.monotonic() + 0.5
                    with contextlib.suppress(OSError):
                        pair.server.sendall(frame)
                    return
            try:
                pair.server.sendall(frame)
            except OSError:
                self._reset(pair)
                return


def wait_until(pred: Any, timeout: float = 30.0, interval: float = 0.05, what: str = "") -> None:
    """Poll ``pred()`` until true; AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what or pred}")
        time.sleep(interval)
