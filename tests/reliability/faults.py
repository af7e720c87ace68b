"""Fault injectors of the reliability suite: processes killed and frozen by PID, TCP connections
cut by a local proxy, and a log of every fault injected (when it started, when it was healed).

Why it is shaped so:

- **Every process is ours, addressed by PID.** :class:`Proc` wraps one ``subprocess.Popen`` the
  suite started; ``kill9`` / ``stop`` / ``cont`` signal that PID only, and :func:`reap_all`
  (called at teardown) kills whatever a failed scenario left running. Nothing is ever killed by
  name.
- **Connections are cut by a proxy, not by the kernel.** ``ss -K`` needs a kernel built with
  ``INET_DIAG_DESTROY`` and root; a local TCP proxy (:class:`kits_zk.TcpProxy`, one per ensemble
  member in :class:`ProxySet`) works everywhere and can also cut *around* a compare-and-set:
  drop the request before the server sees it, or let the server apply it and drop the answer
  (an ambiguous commit, docs/design.md §3.2). Freezing the proxies is a partition long enough to expire a
  ZooKeeper session for real.
- **Faults are data.** :class:`FaultLog` records ``(kind, started, healed, detail)`` per fault;
  the scenario measures convergence from the last heal and the report counts faults by kind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from support.kits_zk import CutMode, TcpProxy

_LIVE: dict[int, Proc] = {}
_LIVE_LOCK = threading.Lock()


class Proc:
    """One OS process started by the suite (``python <script> <args>``), output to ``log``.

    ``env`` is added to the current environment. The process gets its own session so a
    terminal's Ctrl-C reaches only the test runner, which then stops it by PID.
    """

    def __init__(
        self, args: Sequence[str], log: Path, env: dict[str, str] | None = None
    ) -> None:
        self.args = list(args)
        self.log = log
        full_env = dict(os.environ)
        full_env.update(env or {})
        with log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.args,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=full_env,
                start_new_session=True,
            )
        self.pid = self.popen.pid
        with _LIVE_LOCK:
            _LIVE[self.pid] = self

    @classmethod
    def python(
        cls, script: Path, args: Sequence[str], log: Path, env: dict[str, str] | None = None
    ) -> Proc:
        """``sys.executable script args...`` (unbuffered output)."""
        return cls([sys.executable, "-u", str(script), *args], log, {"PYTHONUNBUFFERED": "1", **(env or {})})

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill9(self) -> None:
        """SIGKILL and reap: the process gets no chance to clean up (``kill -9``)."""
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)
        self._forget()

    def freeze(self) -> None:
        """SIGSTOP: the process keeps its sockets and locks but runs no code."""
        self.signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT after :meth:`freeze`."""
        self.signal(signal.SIGCONT)

    def terminate(self, grace: float = 15.0) -> int | None:
        """SIGCONT + SIGTERM, wait up to ``grace`` seconds, then SIGKILL. Returns the exit code."""
        if self.alive:
            self.thaw()
            self.signal(signal.SIGTERM)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                self.kill9()
        self._forget()
        return self.popen.returncode

    def wait(self, timeout: float) -> int | None:
        """Wait for a normal exit; None if it is still running after ``timeout`` seconds."""
        try:
            code = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self._forget()
        return code

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError as exc:
            return f"<no log: {exc}>"

    def _forget(self) -> None:
        with _LIVE_LOCK:
            _LIVE.pop(self.pid, None)


def reap_all() -> None:
    """Kill (by PID) every process the suite started that is still running."""
    with _LIVE_LOCK:
        procs = list(_LIVE.values())
    for p in procs:
        p.kill9()


@dataclass
class Fault:
    """One injected fault: ``kind`` (e.g. ``kill_leader``), wall-clock ``started``/``healed``
    (``time.time()`` seconds; ``healed`` None while it lasts), free-text ``detail``."""

    kind: str
    started: float
    healed: float | None = None
    detail: str = ""


@dataclass
class FaultLog:
    """Every fault a scenario injected, in order."""

    faults: list[Fault] = field(default_factory=list)

    def start(self, kind: str, detail: str = "") -> Fault:
        f = Fault(kind, time.time(), None, detail)
        self.faults.append(f)
        return f

    @staticmethod
    def heal(f: Fault) -> None:
        f.healed = time.time()

    def instant(self, kind: str, detail: str = "") -> Fault:
        """A fault that is over as soon as it is injected (a connection reset)."""
        f = self.start(kind, detail)
        f.healed = f.started
        return f

    @property
    def count(self) -> int:
        return len(self.faults)

    def by_kind(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for f in self.faults:
            out[f.kind] = out.get(f.kind, 0) + 1
        return out

    def last_heal(self) -> float | None:
        healed = [f.healed for f in self.faults if f.healed is not None]
        return max(healed) if healed else None

    def unhealed(self) -> list[Fault]:
        return [f for f in self.faults if f.healed is None]


class ProxySet:
    """One :class:`TcpProxy` per server of ``hosts`` (``h:p,h:p,...``): clients given
    :attr:`hosts` reach every member through a proxy the test controls."""

    def __init__(self, hosts: str) -> None:
        self.proxies = [TcpProxy(h.strip()) for h in hosts.split(",") if h.strip()]

    @property
    def hosts(self) -> str:
        return ",".join(p.hosts for p in self.proxies)

    def cut(self) -> None:
        """Reset every open connection (clients reconnect at once)."""
        for p in self.proxies:
            p.cut()

    def freeze(self) -> None:
        """Partition: reset connections and answer nothing until :meth:`thaw`."""
        for p in self.proxies:
            p.freeze()

    def thaw(self) -> None:
        for p in self.proxies:
            p.thaw()

    def cut_next_multi(self, mode: CutMode) -> None:
        """On every proxy, cut the connection around the next compare-and-set it forwards:
        ``before`` the server sees it, or ``after`` the server applied it (answer lost)."""
        for p in self.proxies:
            p.cut_next_multi(mode)

    @property
    def multis_cut(self) -> int:
        return sum(p.multis_cut for p in self.proxies)

    @property
    def multis_seen(self) -> int:
        return sum(p.multis_seen for p in self.proxies)

    def close(self) -> None:
        for p in self.proxies:
            p.close()


def wait_for(
    pred: Callable[[], object], timeout: float, what: str, interval: float = 0.05
) -> None:
    """Poll ``pred()`` until truthy; AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)
