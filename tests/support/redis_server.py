"""A real Redis server (Debian's ``redis-server``) for the Backbeat bridge tests: started on
127.0.0.1 with a free port and a temporary directory, stopped by PID, restartable on the same
port (a Redis restart is one of the bridge's scenarios). Nothing is persisted (``--save ""``):
Backbeat uses this Redis for pub/sub, which keeps nothing.

Usage::

    with RedisServer(tmp_path).start() as server:
        redis.Redis.from_url(server.url).ping()
        server.restart()
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Self

import pytest

from support.servers import ServerStartError, _spawn, _terminate, free_ports

START_TIMEOUT = 20.0


def redis_available() -> bool:
    return shutil.which("redis-server") is not None


class RedisServer:
    """One ``redis-server`` process on ``127.0.0.1:<port>`` (``url``)."""

    def __init__(self, workdir: Path, port: int | None = None,
                 password: str | None = None) -> None:
        self.workdir = workdir
        self.password = password
        """``--requirepass``: every client must AUTH with it (Backbeat's ``redis.password``);
        ``url`` does not carry it."""
        self.port = port if port is not None else free_ports(1)[0]
        self.log = workdir / "redis.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def command(self) -> list[str]:
        return ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.workdir), "--save", "", "--appendonly", "no",
                "--daemonize", "no", "--protected-mode", "no",
                *(["--requirepass", self.password] if self.password else [])]

    def start(self, timeout: float = START_TIMEOUT) -> Self:
        """Start and wait until it answers PING. Raises :class:`ServerStartError`."""
        if not redis_available():
            raise ServerStartError("redis-server is not installed (scripts/setup.sh installs it)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = _spawn(self.command(), self.log)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerStartError(f"redis-server exited: see {self.log}")
            if self._ping():
                return self
            time.sleep(0.05)
        self.stop()
        raise ServerStartError(f"redis-server did not answer within {timeout:g} s ({self.log})")

    def _ping(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection(
            ("127.0.0.1", self.port), timeout=0.5
        ) as s:
            auth = f"AUTH {self.password}\r\n".encode() if self.password else b""
            s.sendall(auth + b"PING\r\n")
            want = (b"+OK\r\n" if self.password else b"") + b"+PONG\r\n"
            got = b""
            while len(got) < len(want) and (chunk := s.recv(64)):
                got += chunk
            return got.startswith(want)
        return False

    def stop(self) -> None:
        if self.proc is not None:
            _terminate(self.proc)
            self.proc = None

    def restart(self) -> None:
        """Stop, then start again on the same port (every connection is dropped)."""
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


@pytest.fixture
def redis_auth_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh Redis started with ``--requirepass`` (its ``password``)."""
    server = RedisServer(tmp_path / "redis-auth", password="s3cret-bb").start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh Redis for one test (restartable without disturbing other tests)."""
    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.close()
