"""A plain TCP relay for protocols other than ZooKeeper's (``kits_zk.TcpProxy`` parses
ZooKeeper frames): forward ``127.0.0.1:<port>`` to a target, and on demand reset every
connection and refuse new ones (:meth:`block`) until :meth:`unblock`. The bridge tests put it
between a Backbeat processor and Redis to cut the processor's Redis connection.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class TcpRelay:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._blocked = False
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._blocked:
                self._reset(client)
                continue
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                self._reset(client)
                continue
            with self._lock:
                self._socks += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            self._reset(s)

    @staticmethod
    def _reset(s: socket.socket) -> None:
        with contextlib.suppress(OSError):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)  # wakes the pump blocked in recv on it
        with contextlib.suppress(OSError):
            s.close()

    def block(self) -> None:
        """Reset every open connection and refuse new ones."""
        self._blocked = True
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            self._reset(s)

    def unblock(self) -> None:
        self._blocked = False

    def close(self) -> None:
        self._closed = True
        self.block()
        with contextlib.suppress(OSError):
            self._listener.close()
