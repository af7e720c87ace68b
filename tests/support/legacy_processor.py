"""The stand-in Backbeat queue processor of the bridge tests (``tests/node/legacy_processor.js``,
Node.js with Backbeat's own npm clients), run as a real OS process: started, killed
(``kill -9``), frozen (SIGSTOP) and restarted; its JSON-line events are collected from stdout.

Usage::

    with LegacyProcessor(zk_hosts, redis_hostport, sites=["zenko"]) as proc:
        proc.wait_for("ready", site="zenko")
        proc.kill(); proc.start()
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

NODE_DIR = Path(__file__).resolve().parents[1] / "node"
SCRIPT = NODE_DIR / "legacy_processor.js"


def node_available() -> bool:
    return shutil.which("node") is not None and (NODE_DIR / "node_modules" / "ioredis").is_dir()


class LegacyProcessor:
    """One Node process running a Backbeat-like processor per site."""

    def __init__(self, zookeeper: str, redis: str, sites: list[str], *,
                 topic: str = "backbeat-replication",
                 namespace: str = "/backbeat/replication", drop: int = 0,
                 password: str | None = None) -> None:
        self.zookeeper = zookeeper
        self.password = password
        self.redis = redis
        self.sites = sites
        self.topic = topic
        self.namespace = namespace
        self.drop = drop
        self.events: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *, wait: bool = True) -> Self:
        if not node_available():
            raise RuntimeError("node or tests/node/node_modules missing: run scripts/setup.sh")
        cmd = ["node", str(SCRIPT), "--zookeeper", self.zookeeper, "--redis", self.redis,
               "--topic", self.topic, "--namespace", self.namespace,
               "--sites", ",".join(self.sites), "--drop", str(self.drop),
               *(["--password", self.password] if self.password else [])]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        mark = len(self.events)
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()
        if wait:
            self.wait_for("started", since=mark, timeout=30)
            for site in self.sites:
                self.wait_for("subscribed", site=site, since=mark, timeout=30)
        return self

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                event = {"event": "output", "text": line.decode(errors="replace").rstrip()}
            with self._cond:
                self.events.append(event)
                self._cond.notify_all()

    def find(self, event: str, since: int = 0, **fields: Any) -> list[dict[str, Any]]:
        with self._cond:
            return [e for e in self.events[since:] if e.get("event") == event
                    and all(e.get(k) == v for k, v in fields.items())]

    def wait_for(self, event: str, *, since: int = 0, timeout: float = 20.0,
                 **fields: Any) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = [e for e in self.events[since:] if e.get("event") == event
                         and all(e.get(k) == v for k, v in fields.items())]
                if found:
                    return found[0]
                left = deadline - time.monotonic()
                if left <= 0:
                    tail = self.events[-15:]
                    raise AssertionError(f"no {event} {fields} within {timeout} s; last: {tail}")
                self._cond.wait(left)

    def mark(self) -> int:
        with self._cond:
            return len(self.events)

    def wait_until(self, pred: Callable[[], bool], timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            if time.monotonic() > deadline:
                raise AssertionError(f"condition not met within {timeout} s")
            time.sleep(0.02)

    def kill(self) -> None:
        """kill -9 (by PID) and reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def freeze(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
        self.kill()

    def __enter__(self) -> Self:
        return self.start() if self.proc is None else self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
