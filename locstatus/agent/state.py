"""What the agent's threads share, under one lock.

The hint callback (a backend thread), the watch thread and the apply thread meet here: the
local copy (:class:`LocalCopy`), the due-work queue (:class:`DueQueue`), the settle schedule
(:class:`SettleSchedule`), the self-fence (:class:`Fence`), the published handler errors and
the counters. Each of those is a small object with its own rules and tests; this module only
holds them together with the lock and the events the threads wake each other with, and the few
steps that touch several of them at once (store a record *and* queue its work; forget a
location everywhere; impose or lift the fence). Nothing holds the lock while doing I/O or
running a handler.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from locstatus.agent.fence import Fence
from locstatus.agent.queue import DueQueue, Key
from locstatus.agent.replica import PURGED, Life, LocalCopy
from locstatus.agent.settle import SettleSchedule
from locstatus.errors import CorruptRecord
from locstatus.models import TOMBSTONE_ACK, LocationStatus, StuckHandler

__all__ = ["COUNTERS", "FENCE", "AgentState", "Running", "corrupt_key"]

FENCE = -3
"""The generation a key is queued with to be stopped by a self-fence."""

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
    "thread_errors",
    "stuck_handlers",
    "fences",
)
"""The agent's counters (:meth:`Agent.metrics`, docs/agent.md "Reading the state locally")."""


@dataclass
class Running:
    """A handler running now, for the stuck-handler report (docs/agent.md "Handlers")."""

    started: float
    """Monotonic time it started (seconds)."""
    since: datetime
    """When it started, on the manager's time source (published)."""
    event: str
    """``pause``, ``resume``, ``remove`` or ``fence``."""
    handler: str
    """``module.qualname`` of the function."""
    stuck: bool = False
    """Past the deadline: reported in the registration."""


def corrupt_key(location: str) -> str:
    """The key a corrupt record of ``location`` is reported under in the errors."""
    return f"{location}/*"


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
        self.guard_wake = threading.Event()
        """Wakes the guard thread (a handler started: a new deadline)."""
        self.busy: set[str] = set()
        """Locations an apply thread is working on (one thread per location at a time)."""
        self.running: dict[Key, Running] = {}
        """Handlers running now, by key."""
        self.fence = Fence()
        """The self-fence (docs/agent.md "Self-fencing"): while it is imposed nothing starts
        and nothing is acknowledged; its keys to stop are queued with :data:`FENCE`."""

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
            self.busy.clear()
            self.running.clear()
            self.fence = Fence()

    def stuck_locked(self) -> dict[str, StuckHandler]:
        """The handlers running past their deadline, as the registration publishes them."""
        return {
            f"{loc}/{svc}": StuckHandler(event=r.event, handler=r.handler, since=r.since)
            for (loc, svc), r in self.running.items()
            if r.stuck
        }

    def count(self, name: str, n: int = 1) -> None:
        with self.lock:
            self.metrics[name] += n

    def store_locked(self, rec: LocationStatus, lives: Mapping[str, Life] | None = None) -> bool:
        """Keep ``rec`` in the local copy and queue the work it implies; True when stored.

        When ``rec`` may be of another life than the record held (:meth:`LocalCopy.
        life_check`), ``lives`` must hold the backend's answer for the version held
        (:meth:`Watcher.lives`): a new life is forgotten as a purge first (``on_remove`` for
        the old one, if the worker applied it), one that cannot be told is applied again.
        Without that answer nothing is stored (False): the location is marked dirty, and the
        watch thread reads it again and asks."""
        asked = self.copy.life_check(rec)
        if asked is not None:
            life = None if lives is None else lives.get(rec.location)
            if life is None or life.version != asked:
                self.dirty.add(rec.location)
                self.wake.set()
                return False
            if life.same is False:
                self.forget_locked(rec.location)
            elif life.same is None:
                self.copy.reapply(rec.location)
        if self.errors.pop(corrupt_key(rec.location), None) is not None:
            self.beat_now.set()  # readable again: no longer reported
        for key, generation in self.copy.store(rec):
            self.schedule_locked(key, generation)
        return True

    def corrupt_locked(self, exc: CorruptRecord) -> None:
        """The stored record of ``exc.location`` is corrupt: keep the last state read and
        applied (nothing runs, nothing is acknowledged for it) and report it with the
        handler errors (``agent.errors()``, ``WorkerInfo.errors``), keyed ``location/*``."""
        self.metrics["corrupt_records"] += 1
        text = f"CorruptRecord: {exc.detail} (keeping the last state applied)"[:1000]
        if self.errors.get(corrupt_key(exc.location)) != text:
            self.errors[corrupt_key(exc.location)] = text
            self.beat_now.set()

    def schedule_locked(
        self, key: Key, generation: int, delay: float = 0.0, *, force: bool = False
    ) -> None:
        """Make ``key`` due now (or after ``delay`` seconds) and wake an apply thread."""
        if self.queue.schedule(key, generation, now=self.monotonic(), delay=delay, force=force):
            self.cond.notify()

    def forget_locked(self, location: str) -> None:
        """The record is gone (purged): forget it everywhere; queue its ``on_remove`` when the
        worker applied it and never ran that (it missed the removal), or when a handler of it
        is under way (an ``on_resume`` may be starting its consumers). While fenced, the
        fence then waits for that ``on_remove`` instead of a fence handler (:meth:`Fence.
        gone`): lifting it once ``on_remove`` was only queued let a live, unfenced worker's
        consumers of the old location run."""
        under_way = any(k[0] == location and k[1] != TOMBSTONE_ACK for k in self.running)
        on_remove_due = self.copy.forget(location, under_way=under_way)
        self.settle.settled(location)
        self.queue.discard_location(location)
        for name in [k for k in self.errors if k.startswith(location + "/")]:
            del self.errors[name]
        self.first_pass_discard_locked({k for k in self.first_pass if k[0] == location})
        if on_remove_due:
            self.schedule_locked((location, TOMBSTONE_ACK), PURGED)
        if self.fence.gone(location, on_remove=on_remove_due):
            self.try_unfence_locked()

    def fence_locked(self, reason: str) -> bool:
        """Self-fence: from now on nothing is acknowledged and nothing is started, and every
        key the worker runs (applied running, or whose ``on_resume`` is under way) is queued
        to be stopped, at once (a backoff is not waited for), as is the ``on_remove`` still
        due of a location that disappeared. Returns False when fenced already."""
        starting = {k for k, r in self.running.items() if r.event == "resume"}
        keys = self.copy.running | starting
        # A location that disappeared with its on_remove still due runs its consumers until
        # that returns: the fence waits for it too, and does not wait for its backoff.
        removals = set(self.copy.purged)
        if not self.fence.impose(reason, keys, removals):
            return False
        self.metrics["fences"] += 1
        for key in keys:
            self.schedule_locked(key, FENCE, force=True)
        for location in removals:
            self.schedule_locked((location, TOMBSTONE_ACK), PURGED, force=True)
        return True

    def lease_back_locked(self, until: float) -> bool:
        """A renewal landed while fenced and the lease holds until ``until`` (monotonic
        seconds): read every record again if this starts the return, and lift the fence if
        nothing else is due (:class:`Fence`). True when the fence was lifted."""
        if self.fence.lease_back(until, now=self.monotonic()):
            self.want_resync = True
            self.wake.set()
        return self.try_unfence_locked()

    def try_unfence_locked(self) -> bool:
        """Lift the fence if the lease is back, every fence handler returned and the records
        were read again since (:meth:`Fence.ready`); then apply the real state from the copy
        just read: what the fence stopped runs again if it should, and what was applied is
        acknowledged again (while fenced the worker may have been dropped as expired, and its
        acknowledgements with it). A record that reads as corrupt is left as it is (nothing
        runs for it until it reads again). True when lifted."""
        if not self.fence.ready(now=self.monotonic()):
            return False
        self.fence.lift()
        self.copy.acknowledge_again()
        for rec in list(self.copy.records.values()):
            if corrupt_key(rec.location) in self.errors:
                continue
            for key, generation in self.copy.store(rec):
                self.schedule_locked(key, generation)
        self.wake.set()
        self.cond.notify_all()
        return True

    def first_pass_discard_locked(self, keys: Iterable[Key]) -> None:
        self.first_pass.difference_update(keys)
        if not self.first_pass:
            self.first_pass_done.set()
