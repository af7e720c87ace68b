"""What the agent's threads share, under one lock.

The hint callback (a backend thread), the watch thread and the apply thread meet here: the
local copy (:class:`LocalCopy`), the due-work queue (:class:`DueQueue`), the settle schedule
(:class:`SettleSchedule`), the published handler errors and the counters. Each of those is a
small object with its own rules and tests; this module only holds them together with the lock
and the events the threads wake each other with, and the few steps that touch several of them
at once (store a record *and* queue its work; forget a location everywhere). Nothing holds the
lock while doing I/O or running a handler.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from locstatus.agent.queue import DueQueue, Key
from locstatus.agent.replica import LocalCopy
from locstatus.agent.settle import SettleSchedule
from locstatus.models import LocationStatus

__all__ = ["COUNTERS", "AgentState"]

COUNTERS = (
    "handler_runs",
    "handler_errors",
    "handler_reruns",
    "acks",
    "settles",
    "resyncs",
    "hints",
    "backend_errors",
    "heartbeats",
    "heartbeat_errors",
    "reconnects",
    "lease_lapses",
    "sessions_lost",
    "corrupt_records",
)
"""The agent's counters (:meth:`Agent.metrics`, docs/agent.md "Reading the state locally")."""


class AgentState:
    """The shared state of one agent. Methods named ``*_locked`` expect the caller to hold
    :attr:`lock` (through :attr:`cond` or directly); the others take it themselves.

    ``monotonic``: the clock the queue and the settle schedule are kept on (seconds).
    """

    def __init__(
        self,
        services: tuple[str, ...],
        settle_interval: float,
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.monotonic = monotonic
        self.lock = threading.Lock()
        self.cond = threading.Condition(self.lock)
        self.copy = LocalCopy(services)
        self.queue = DueQueue()
        self.settle = SettleSchedule(settle_interval)
        self.errors: dict[str, str] = {}
        """Last error of each failing handler, keyed ``location/service``."""
        self.metrics: dict[str, int] = dict.fromkeys(COUNTERS, 0)
        self.dirty: set[str] = set()
        """Locations a hint said changed, to read (watch thread)."""
        self.want_resync = False
        """Re-read every record at the next watch pass."""
        self.first_pass: set[Key] = set()
        """Work due at start not yet run once (``start(wait=True)`` waits for it)."""
        self.first_pass_done = threading.Event()
        self.stopping = threading.Event()
        self.wake = threading.Event()
        """Wakes the watch thread."""
        self.beat_now = threading.Event()
        """Wakes the heartbeat thread (publish a changed error now)."""

    def reset(self) -> None:
        """Start from scratch (a restarted agent: stop() dropped its acknowledgements)."""
        self.stopping.clear()
        self.first_pass_done.clear()
        with self.lock:
            self.copy.clear()
            self.queue.clear()
            self.errors.clear()
            self.dirty.clear()
            self.settle.clear()
            self.want_resync = False

    def count(self, name: str, n: int = 1) -> None:
        with self.lock:
            self.metrics[name] += n

    def store_locked(self, rec: LocationStatus) -> None:
        """Keep ``rec`` in the local copy and queue the work it implies."""
        for key, generation in self.copy.store(rec):
            self.schedule_locked(key, generation)

    def schedule_locked(self, key: Key, generation: int, delay: float = 0.0) -> None:
        """Make ``key`` due now (or after ``delay`` seconds) and wake the apply thread."""
        if self.queue.schedule(key, generation, now=self.monotonic(), delay=delay):
            self.cond.notify()

    def forget_locked(self, location: str) -> None:
        """The record is gone (purged): forget it everywhere."""
        self.copy.forget(location)
        self.settle.settled(location)
        self.queue.discard_location(location)
        for name in [k for k in self.errors if k.startswith(location + "/")]:
            del self.errors[name]
        self.first_pass_discard_locked({k for k in self.first_pass if k[0] == location})

    def first_pass_discard_locked(self, keys: Iterable[Key]) -> None:
        self.first_pass.difference_update(keys)
        if not self.first_pass:
            self.first_pass_done.set()
