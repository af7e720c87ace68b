"""A TCP relay for MongoDB's wire protocol that cuts a connection around one command: the
client's requests are split into messages (a 4-byte little-endian length first) and the
command's name read from each ``OP_MSG`` body, so a test can say "the next ``update`` on this
collection: drop it (``before``: the server never sees it) or forward it and drop its answer
(``after``: the server applies it, the client never hears)", then reset the connection. The
driver sees a lost connection exactly where the test wants one, every time.

Usage::

    relay = MongoRelay("127.0.0.1", server.port)
    relay.cut_next("update", "locations", "after", times=2)   # the attempt and its retry
    relay.cut_next("update", "locations", "after", seconds=1.5)  # every one for 1.5 s
    ...  # a client connected to relay.port with directConnection=true
    relay.close()

Inside a backend call's deadline (``timeoutMS``) the driver retries a cut retryable command
until the deadline (pymongo's client-side operation timeout): ``times=2`` is then absorbed by
a third attempt, and only a cut lasting past the deadline (``seconds=``) leaves the outcome
unknown.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Literal

import bson

CutMode = Literal["before", "after"]
_OP_MSG = 2013


@dataclass
class _Trap:
    command: str
    collection: str
    mode: CutMode
    times: int
    until: float | None = None
    """Monotonic time the trap ends (then ``times`` is not counted), if given."""


class MongoRelay:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._traps: list[_Trap] = []
        self.cut: list[CutMode] = []
        """The mode of every command cut so far."""
        self._closed = False
        threading.Thread(target=self._accept, name="mongo-relay", daemon=True).start()

    def cut_next(self, command: str, collection: str, mode: CutMode, *, times: int = 1,
                 seconds: float | None = None) -> None:
        """Cut the next ``times`` requests of ``command`` on ``collection`` (see the module
        docstring), or with ``seconds`` every one for that long from now. Traps queue: a
        second call's applies once the first one's cuts are done."""
        until = None if seconds is None else time.monotonic() + seconds
        with self._lock:
            self._traps.append(_Trap(command, collection, mode, times, until))

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() thread
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            _reset(s)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
                server.settimeout(None)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                self._socks += [client, server]
            dropping = threading.Event()  # the next answer on this connection is dropped
            threading.Thread(target=self._requests, args=(client, server, dropping),
                             daemon=True).start()
            threading.Thread(target=self._answers, args=(server, client, dropping),
                             daemon=True).start()

    def _requests(self, client: socket.socket, server: socket.socket,
                  dropping: threading.Event) -> None:
        buf = b""
        try:
            while True:
                data = client.recv(65536)
                if not data:
                    break
                buf += data
                while len(buf) >= 4:
                    (length,) = struct.unpack_from("<i", buf)
                    if len(buf) < length:
                        break
                    message, buf = buf[:length], buf[length:]
                    mode = self._trapped(message)
                    if mode == "before":
                        raise OSError("cut before the server saw it")
                    if mode == "after":
                        dropping.set()
                    server.sendall(message)
        except OSError:
            pass
        _reset(client)
        _reset(server)

    def _answers(self, server: socket.socket, client: socket.socket,
                 dropping: threading.Event) -> None:
        try:
            while True:
                data = server.recv(65536)
                if not data or dropping.is_set():
                    break
                client.sendall(data)
        except OSError:
            pass
        _reset(server)
        _reset(client)

    def _trapped(self, message: bytes) -> CutMode | None:
        with self._lock:
            while self._traps and (until := self._traps[0].until) is not None \
                    and time.monotonic() >= until:
                self._traps.pop(0)
            trap = self._traps[0] if self._traps else None
            if trap is None or struct.unpack_from("<i", message, 12)[0] != _OP_MSG:
                return None
            # header (16 bytes), flagBits (4), then section kind 0 (1 byte) + the command
            if message[20] != 0:
                return None
            (size,) = struct.unpack_from("<i", message, 21)
            body = bson.decode(message[21:21 + size])
            name = next(iter(body), None)
            if name != trap.command or body.get(name) != trap.collection:
                return None
            trap.times -= 1
            if trap.times <= 0 and trap.until is None:
                self._traps.pop(0)
            self.cut.append(trap.mode)
            return trap.mode


def _reset(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        s.close()
