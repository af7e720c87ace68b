"""The worker side (SPEC §3.4, §3.5, §5.1): apply the pause/resume state, acknowledge it, settle.

A worker process runs one :class:`Agent`. The agent registers the worker with a lease, keeps a
local copy of the records it watches (so :meth:`Agent.is_paused` is a dictionary lookup, no
I/O), runs the worker's ``on_pause`` / ``on_resume`` / ``on_remove`` handlers whenever the
desired state differs from what the worker applied, acknowledges the generation it applied
(``observed_generation``) and settles ``pausing -> paused`` / ``resuming -> running`` when its
acknowledgement was the last one missing.

Why it is shaped so:

- **Level-triggered, not edge-triggered.** Hints from the backend only say *where* to look; the
  agent always re-reads the record and compares the stored generation with the generation it
  applied. A hint that was coalesced, dropped, or missed while disconnected costs latency, never
  correctness: the agent re-reads every record on start, on every (re)connection, after a lapsed
  lease, and every ``resync_interval`` seconds as a safety net.
- **Acknowledge only what was applied.** After a handler returns, the acknowledgement is written
  on the condition that the record is still at the version whose state was applied
  (``Backend.ack(..., if_version=)``, one write); if it moved, the record is read again, and if
  the generation moved while the handler ran, the handler runs again for the newer state: only
  a generation that is still current after its handler ran is acknowledged. A handler that
  raises is retried with jittered exponential backoff, its error is published with the worker's
  heartbeat (``WorkerInfo.errors``, ``locstatus workers``), and nothing is acknowledged for it.
- **Three small threads, one job each.** The *heartbeat* thread renews the lease (it must never
  wait behind a slow handler). The *watch* thread turns hints into reads of the backend and
  keeps the local copy fresh (so ``is_paused`` flips as soon as a pause is read, even while a
  slow handler runs). The *apply* thread runs handlers one at a time, in the order their work
  became due: simple and predictable for the worker's code. Hint callbacks only record what to
  look at and return; they never block the backend's thread.
- **Settling is everybody's job, but one worker goes first.** Trying to settle costs reads of
  the record, the workers and every acknowledgement of the location (on ZooKeeper one request
  per worker), so a fleet that all tried at once would spend more on settling than on applying
  the change. For each (location, service) one live worker is the *settler*: the highest
  rendezvous hash of location and worker id among the live workers that apply it (so the role
  spreads over the fleet and moves when a worker goes away). After acknowledging, the settler
  calls :meth:`Manager.settle` (from the watch thread, so the next handler never waits for it)
  once no other worker has acknowledged for ~10 ms (plus up to 20 ms of jitter), and again on
  each later acknowledgement until the record settles. Every other worker tries only as a
  fallback, ``_SETTLE_FALLBACK`` seconds later, and only if the record it has read meanwhile is
  still transitional. Every worker also tries to settle the transitional records it sees when
  workers come and go (a lapsed lease of a crashed worker must not leave a location
  ``pausing`` forever), at most once per ``settle_interval``.

Usage::

    from locstatus import connect

    mgr = connect("sqlite:///./locstatus.db")
    agent = mgr.agent("worker-7", services=["replication"])

    @agent.on_pause("replication")
    def stop(location: str) -> None:
        consumers[location].stop()

    @agent.on_resume("replication")
    def start(location: str) -> None:
        consumers[location].start()

    with agent:                       # start(): register, read, run handlers; stop() on exit
        ...
        if agent.is_paused("us-east-1", "replication"):
            ...
"""

from __future__ import annotations

import asyncio
import heapq
import inspect
import logging
import os
import random
import socket
import threading
import time
import zlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, overload

from locstatus.errors import (
    CorruptRecord,
    InvalidInput,
    LocstatusError,
    NotFound,
    VersionConflict,
)
from locstatus.models import (
    TOMBSTONE_ACK,
    Hint,
    LocationStatus,
    ServiceStatus,
    State,
    WorkerInfo,
    tombstone_generation,
)
from locstatus.names import SERVICE_ALIASES, canonical_service, check_location
from locstatus.settings import Settings

if TYPE_CHECKING:
    from locstatus.manager import Manager

__all__ = ["Agent", "Applying", "Handler", "HandlerRetry"]

log = logging.getLogger("locstatus.agent")

Handler = Callable[[str], "Awaitable[None] | None"]
"""A handler takes the location name. It may be a coroutine function (see :class:`Agent`)."""
H = TypeVar("H", bound=Callable[[str], Any])
_Key = tuple[str, str]
"""(location, service); service is :data:`TOMBSTONE_ACK` for a removal."""

UNREGISTER_GRACE = 1.0
"""Seconds :meth:`Agent.stop` waits for the unregistration at least, when its ``timeout`` was
spent on a running handler."""

_unregistering: dict[tuple[int, str], threading.Thread] = {}
"""Unregistrations :meth:`Agent.stop` left running in the background, by (backend, worker id)."""
_unregistering_lock = threading.Lock()


def _wait_for_unregistration(backend: object, worker_id: str) -> None:
    """Let a pending unregistration of ``worker_id`` on ``backend`` land before the worker
    registers again (a restart of the same agent, or a new one with its id): landing after the
    new registration, it would remove a live worker, and a pause would settle without it."""
    with _unregistering_lock:
        pending = _unregistering.get((id(backend), worker_id))
    if pending is not None and pending is not threading.current_thread():
        pending.join()


@dataclass(frozen=True)
class HandlerRetry:
    """Backoff of a failing handler: the n-th consecutive failure waits a random time between
    half of and ``min(cap, base * 2**(n-1))`` seconds before the next attempt."""

    base: float = 0.2
    cap: float = 30.0

    def delay(self, failures: int) -> float:
        """Seconds to wait after ``failures`` consecutive failures (>= 1)."""
        top = min(self.cap, self.base * 2 ** max(0, failures - 1))
        return random.uniform(top / 2, top)


class Applying(NamedTuple):
    """What the running handler is applying (:attr:`Agent.applying`)."""

    location: str
    service: str
    """The service, or :data:`~locstatus.models.TOMBSTONE_ACK` for ``on_remove``."""
    status: ServiceStatus | None
    """The status being applied (its ``generation`` is what will be acknowledged); None for a
    removal."""


class Agent:
    """The worker side of locstatus: apply the state, acknowledge it, settle (SPEC §3.4).

    Build it with :meth:`Manager.agent`. ``services``: names this worker applies (default: every
    service of the manager; ``crr`` means ``replication``). ``locations``: an optional filter
    (default: every location). Keyword settings, all in seconds:

    - ``lease_seconds``: lease length (default ``LOCSTATUS_LEASE_SECONDS``, 10). A worker whose
      lease lapsed stops counting for settle until its next heartbeat.
    - ``heartbeat_interval``: lease renewal period (default a third of the lease).
    - ``resync_interval``: full re-read of every record as a safety net (default 30).
    - ``settle_interval``: at most one settle attempt per this period on worker changes
      (default ``min(1, heartbeat_interval)``).
    - ``handler_retry``: :class:`HandlerRetry` backoff of failing handlers.
    - ``fire_scheduled_resumes``: fire due scheduled resumes of watched locations (SPEC §3.3;
      any number of processes may do this, exactly one transition happens). Default True.
    - ``loop``: an event loop (running in another thread) to run coroutine handlers on; by
      default they run to completion on a private loop in the agent's apply thread.

    Handlers run one at a time in the agent's apply thread and must be idempotent: a handler may
    run again for the same desired state (after a restart, a reconnection, or when the state
    flipped and flipped back while it ran). On :meth:`start` every handler runs once for the
    current state of every watched (location, service), so the worker starts from the truth.

    Raises :class:`InvalidInput` for a bad worker id, service or location name.
    """

    def __init__(
        self,
        manager: Manager,
        worker_id: str,
        services: Iterable[str] | None = None,
        locations: Iterable[str] | None = None,
        *,
        lease_seconds: float | None = None,
        heartbeat_interval: float | None = None,
        resync_interval: float = 30.0,
        settle_interval: float | None = None,
        handler_retry: HandlerRetry | None = None,
        fire_scheduled_resumes: bool = True,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        try:
            check_location(worker_id)
        except InvalidInput as exc:
            raise InvalidInput(f"invalid worker id: {exc}") from None
        names = list(manager.services if services is None else services)
        if isinstance(services, str):
            names = [services]
        if not names:
            raise InvalidInput("an agent needs at least one service")
        self.manager = manager
        self.backend = manager.backend
        self.worker_id = worker_id
        self.services: tuple[str, ...] = tuple(
            dict.fromkeys(canonical_service(s, manager.services) for s in names)
        )
        if isinstance(locations, str):
            raise InvalidInput("locations must be a list of names, not a string")
        self.locations: tuple[str, ...] | None = (
            None if locations is None else tuple(sorted({check_location(x) for x in locations}))
        )
        self._location_set = None if self.locations is None else frozenset(self.locations)
        lease = Settings().lease_seconds if lease_seconds is None else float(lease_seconds)
        if lease <= 0:
            raise InvalidInput(f"lease_seconds must be > 0, got {lease}")
        self.lease_seconds = lease
        self.heartbeat_interval = (
            lease / 3 if heartbeat_interval is None else float(heartbeat_interval)
        )
        if not 0 < self.heartbeat_interval < lease:
            raise InvalidInput(
                f"heartbeat_interval must be in (0, lease_seconds={lease}), "
                f"got {self.heartbeat_interval}"
            )
        self.resync_interval = float(resync_interval)
        if self.resync_interval <= 0:
            raise InvalidInput(f"resync_interval must be > 0, got {resync_interval}")
        self.settle_interval = (
            min(1.0, self.heartbeat_interval) if settle_interval is None else settle_interval
        )
        self.handler_retry = handler_retry or HandlerRetry()
        self.fire_scheduled_resumes = fire_scheduled_resumes
        self._loop = loop
        self._runner: asyncio.Runner | None = None

        self._pause_handlers: dict[str, list[Handler]] = {}
        self._resume_handlers: dict[str, list[Handler]] = {}
        self._remove_handlers: list[Handler] = []

        # Everything below is guarded by _lock; nothing holds it while doing I/O or running
        # user code.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._records: dict[str, LocationStatus] = {}
        self._applied: dict[_Key, int] = {}
        self._handled: dict[_Key, int] = {}  # handler succeeded, acknowledgement still due
        self._due: dict[_Key, float] = {}
        self._heap: list[tuple[float, int, _Key]] = []
        self._seq = 0
        self._failures: dict[_Key, tuple[int, int]] = {}  # key -> (generation, count)
        self._errors: dict[str, str] = {}
        self._first_pass: set[_Key] = set()
        self._dirty: set[str] = set()
        # Acknowledged here: location -> (monotonic time to try settling, latest allowed).
        self._settle_due: dict[str, tuple[float, float]] = {}
        # Locations this worker acknowledged as their settler, still transitional here, and
        # how many settle attempts each has had since.
        self._settler_of: set[str] = set()
        self._settle_tries: dict[str, int] = {}
        self._want_resync = False
        self._want_settle = False
        self._metrics: dict[str, int] = dict.fromkeys(
            (
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
            ),
            0,
        )

        self._applying: Applying | None = None
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._beat_now = threading.Event()
        self._first_pass_done = threading.Event()
        self._threads: list[threading.Thread] = []
        self._unsubscribe: Callable[[], None] | None = None
        self._started = False
        self._started_at: datetime | None = None
        self._connected = True
        self._last_beat_ok = 0.0
        self._registered: WorkerInfo | None = None  # what the last heartbeat wrote

    def __repr__(self) -> str:
        return (
            f"Agent({self.worker_id!r}, services={list(self.services)}, "
            f"locations={None if self.locations is None else list(self.locations)})"
        )

    # -- handler registration ----------------------------------------------------------------

    def on_pause(self, service: str) -> Callable[[H], H]:
        """Decorator: ``fn(location)`` runs when ``service`` must stop at ``location`` (the
        desired state is pausing/paused). Register before :meth:`start`. Raises
        :class:`InvalidInput` for a service this agent does not apply."""
        svc = self._own_service(service)

        def register(fn: H) -> H:
            with self._lock:
                self._pause_handlers.setdefault(svc, []).append(fn)
            return fn

        return register

    def on_resume(self, service: str) -> Callable[[H], H]:
        """Decorator: ``fn(location)`` runs when ``service`` must run at ``location`` (the
        desired state is resuming/running, including on start). Raises :class:`InvalidInput`
        for a service this agent does not apply."""
        svc = self._own_service(service)

        def register(fn: H) -> H:
            with self._lock:
                self._resume_handlers.setdefault(svc, []).append(fn)
            return fn

        return register

    @overload
    def on_remove(self, fn: H) -> H: ...

    @overload
    def on_remove(self, fn: None = None) -> Callable[[H], H]: ...

    def on_remove(self, fn: H | None = None) -> H | Callable[[H], H]:
        """Decorator (``@agent.on_remove`` or ``@agent.on_remove()``): ``fn(location)`` runs
        once when a watched location is removed (tombstone, SPEC §3.5); the agent then
        acknowledges the tombstone. If the location is restored later, the pause/resume
        handlers run again for it."""

        def register(f: H) -> H:
            with self._lock:
                self._remove_handlers.append(f)
            return f

        return register if fn is None else register(fn)

    def _own_service(self, service: str) -> str:
        svc = canonical_service(service, self.manager.services)
        if svc not in self.services:
            raise InvalidInput(
                f"agent {self.worker_id!r} does not apply service {service!r} "
                f"(it applies: {', '.join(self.services)})"
            )
        return svc

    # -- local state (no I/O) ---------------------------------------------------------------

    def is_paused(self, location: str, service: str) -> bool:
        """True when the desired state of ``service`` at ``location`` is paused (``pausing`` or
        ``paused``) or the location was removed. Answered from the agent's local copy, no I/O.
        Raises :class:`NotFound` for a location the agent has not seen (or does not watch) or a
        service the location does not have."""
        rec = self._records.get(location)
        if rec is None:
            raise NotFound(self._unknown(location))
        if rec.deleted_at is not None:
            return True
        st = rec.services.get(service)
        if st is None:
            st = self._service_status(rec, service)
        return st.state is State.PAUSING or st.state is State.PAUSED

    def status(self, location: str, service: str) -> ServiceStatus:
        """The locally known :class:`ServiceStatus` (latest read). Raises :class:`NotFound`."""
        rec = self._records.get(location)
        if rec is None:
            raise NotFound(self._unknown(location))
        return self._service_status(rec, service)

    def state(self, location: str, service: str) -> State:
        """The locally known state (running, pausing, paused, resuming). Raises
        :class:`NotFound`."""
        return self.status(location, service).state

    def record(self, location: str) -> LocationStatus:
        """The locally known record of ``location``. Raises :class:`NotFound`."""
        rec = self._records.get(location)
        if rec is None:
            raise NotFound(self._unknown(location))
        return rec

    def is_removed(self, location: str) -> bool:
        """True when ``location`` is a tombstone (SPEC §3.5). Raises :class:`NotFound`."""
        return self.record(location).deleted

    def observed_generation(self, location: str, service: str) -> int | None:
        """The generation this worker applied and acknowledged, or None (not yet applied)."""
        svc = SERVICE_ALIASES.get(service, service)
        with self._lock:
            return self._applied.get((location, svc))

    def locations_seen(self) -> list[str]:
        """Watched locations in the local copy (tombstones included), sorted."""
        return sorted(self._records)

    @property
    def applying(self) -> Applying | None:
        """Inside a handler: the (location, service, status) it applies; else None."""
        return self._applying

    def errors(self) -> dict[str, str]:
        """Last error of each failing handler, keyed ``location/service``."""
        with self._lock:
            return dict(self._errors)

    def metrics(self) -> dict[str, int]:
        """Counters (handler runs, errors, acks, settles, resyncs, hints, heartbeats, ...) and
        gauges (``pending`` work items, ``failing`` handlers, ``locations``, ``connected``)."""
        with self._lock:
            out = dict(self._metrics)
            out["pending"] = len(self._due)
            out["failing"] = len(self._errors)
            out["locations"] = len(self._records)
            out["connected"] = int(self._connected)
        return out

    def _unknown(self, location: str) -> str:
        if self._location_set is not None and location not in self._location_set:
            return f"agent {self.worker_id!r} does not watch location {location!r}"
        return f"unknown location {location!r} (not seen by agent {self.worker_id!r})"

    @staticmethod
    def _service_status(rec: LocationStatus, service: str) -> ServiceStatus:
        st = rec.services.get(service)
        if st is None:
            st = rec.services.get(SERVICE_ALIASES.get(service, service))
        if st is None:
            raise NotFound(
                f"location {rec.location!r} has no service {service!r} "
                f"(it has: {', '.join(sorted(rec.services)) or 'none'})"
            )
        return st

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, *, wait: bool = True) -> Agent:
        """Register the worker (lease), subscribe to hints, read every watched record and start
        the agent's threads. With ``wait`` (default) return once every handler due at start ran
        once (a failing one is then retried in the background). Idempotent while running.

        Raises :class:`BackendUnavailable` (nothing is left registered) when the backend
        cannot be reached. An unregistration an earlier :meth:`stop` left pending (backend
        slow or down) lands first, so it can never remove this registration.
        """
        if self._started:
            return self
        self._stopping.clear()
        self._first_pass_done.clear()
        with self._lock:
            # A restarted agent starts from scratch: stop() dropped its acknowledgements.
            self._records.clear()
            self._applied.clear()
            self._handled.clear()
            self._due.clear()
            self._heap.clear()
            self._failures.clear()
            self._errors.clear()
            self._dirty.clear()
            self._settle_due.clear()
            self._want_resync = self._want_settle = False
        _wait_for_unregistration(self.backend, self.worker_id)
        self._started_at = self.manager.clock()
        info = self._info()
        self.backend.put_worker(info)
        self._registered = info
        self._last_beat_ok = time.monotonic()
        self._connected = True
        try:
            # No "acks" hints: on ZooKeeper they would wake every worker at every other
            # worker's acknowledgement; the settler retries on its own instead (_try_settle).
            self._unsubscribe = self.backend.subscribe(
                self._on_hint, kinds=("location", "workers", "resync")
            )
            self._resync()
        except BaseException:
            self._teardown_registration()
            raise
        with self._lock:
            self._first_pass = set(self._due)
            if not self._first_pass:
                self._first_pass_done.set()
        self._threads = [
            threading.Thread(
                target=self._run_thread,
                args=(fn,),
                name=f"locstatus-{name}-{self.worker_id}",
                daemon=True,
            )
            for name, fn in (
                ("heartbeat", self._heartbeat_loop),
                ("watch", self._watch_loop),
                ("apply", self._apply_loop),
            )
        ]
        for t in self._threads:
            t.start()
        self._started = True
        if wait:
            self._first_pass_done.wait()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the threads (waiting up to ``timeout`` seconds for a running handler) and
        unregister the worker, which drops its acknowledgements so it stops counting for
        settle at once. Idempotent.

        Returns within about ``timeout`` seconds (plus at most :data:`UNREGISTER_GRACE`) even
        when the backend does not answer: an unregistration still pending then goes on in the
        background, and if it never lands the registration ends as a crashed worker's does,
        when its lease runs out (heartbeat backends) or its session ends (ZooKeeper), so a
        worker shut down during an outage never hangs its process on the backend's own
        timeouts."""
        if not self._started:
            return
        self._started = False
        self._stopping.set()
        self._wake.set()
        self._beat_now.set()
        self._first_pass_done.set()
        with self._cond:
            self._cond.notify_all()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))
        self._threads = []
        self._teardown_registration(max(UNREGISTER_GRACE, deadline - time.monotonic()))

    def _teardown_registration(self, wait: float | None = None) -> None:
        """Unsubscribe and unregister; with ``wait``, give up waiting for the backend after
        that many seconds (see :meth:`stop`)."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if wait is None:
            self._unregister()
            return
        t = threading.Thread(
            target=self._unregister, name=f"locstatus-unregister-{self.worker_id}", daemon=True
        )
        with _unregistering_lock:
            _unregistering[(id(self.backend), self.worker_id)] = t
        t.start()
        t.join(wait)
        if t.is_alive():
            log.warning(
                "agent %s: the backend did not confirm the unregistration within %.1fs; the "
                "registration ends with its lease or session",
                self.worker_id,
                wait,
            )

    def _unregister(self) -> None:
        try:
            self.backend.remove_worker(self.worker_id)
        except LocstatusError as exc:
            log.warning("agent %s: could not unregister: %s", self.worker_id, exc)
        finally:
            with _unregistering_lock:
                key = (id(self.backend), self.worker_id)
                if _unregistering.get(key) is threading.current_thread():
                    del _unregistering[key]

    def __enter__(self) -> Agent:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run_thread(self, target: Callable[[], None]) -> None:
        try:
            target()
        except Exception:  # pragma: no cover - a bug; keep it visible
            log.exception("agent %s: thread %s died", self.worker_id, target.__name__)
            raise

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._metrics[name] += n

    # -- hints -------------------------------------------------------------------------------

    def _on_hint(self, hint: Hint) -> None:
        """Backend thread: record what to look at, wake the watch thread, return."""
        with self._lock:
            self._metrics["hints"] += 1
            if hint.kind == "location" and hint.location is not None:
                if self._location_set is None or hint.location in self._location_set:
                    if hint.record is not None and hint.record.location == hint.location:
                        self._store(hint.record)  # read by the backend: no read of our own
                        return
                    self._dirty.add(hint.location)
            elif hint.kind == "acks" and hint.location is not None:
                # Others are still acknowledging: put off this worker's settle until they are
                # done (debounce); the settler tries again after each later acknowledgement.
                loc = hint.location
                due = self._settle_due.get(loc)
                now = time.monotonic()
                if due is not None:
                    when = min(due[1], now + _settle_delay())
                    self._settle_due[loc] = (max(due[0], when), due[1])
                elif loc in self._settler_of:
                    self._settle_due[loc] = (now + _settle_delay(), now + _SETTLE_MAX_DELAY)
            elif hint.kind == "workers":
                self._want_settle = True
            else:  # resync, or anything this agent does not know: re-read everything
                self._want_resync = True
                if hint.session_lost:
                    # Acknowledgements held by the old session are gone.
                    self._metrics["sessions_lost"] += 1
                    self._acknowledge_again()
        self._wake.set()

    def _acknowledge_again(self) -> None:
        """Acknowledge again, after the next read, everything applied so far, without running
        the handlers again (the backend may have dropped the acknowledgements). Caller holds
        the lock."""
        self._handled.update(self._applied)
        self._applied.clear()

    # -- heartbeat thread ----------------------------------------------------------------------

    def _info(self) -> WorkerInfo:
        with self._lock:
            errors = dict(self._errors)
        return WorkerInfo(
            worker_id=self.worker_id,
            services=self.services,
            locations=self.locations,
            host=socket.gethostname(),
            pid=os.getpid(),
            started_at=self._started_at,
            lease_expires_at=None
            if self.backend.session_leases
            else self.manager.clock() + timedelta(seconds=self.lease_seconds),
            errors=errors,
        )

    def _heartbeat_loop(self) -> None:
        while not self._stopping.is_set():
            self._beat_now.wait(self.heartbeat_interval)
            self._beat_now.clear()
            if self._stopping.is_set():
                return
            self._beat()

    def _beat(self) -> None:
        info = self._info()
        try:
            if self.backend.session_leases and info == self._registered:
                self.backend.ping()  # the session holds the lease: nothing to rewrite
            else:
                self.backend.put_worker(info)
                self._registered = info
        except LocstatusError as exc:
            with self._lock:
                self._metrics["heartbeat_errors"] += 1
                self._connected = False
            log.warning("agent %s: heartbeat failed: %s", self.worker_id, exc)
            return
        now = time.monotonic()
        lapsed = now - self._last_beat_ok > self.lease_seconds
        with self._lock:
            self._metrics["heartbeats"] += 1
            reconnected = not self._connected or lapsed
            self._connected = True
            if reconnected:
                # Back after a failure or a lapsed lease: notifications may have been missed.
                self._metrics["reconnects"] += 1
                self._want_resync = True
            if lapsed:
                # While the lease was lapsed this worker may have been dropped as expired (the
                # check job; a lost ZooKeeper session), and its acknowledgements with it:
                # acknowledge again what it applied, without running the handlers again.
                self._metrics["lease_lapses"] += 1
                self._acknowledge_again()
        self._last_beat_ok = now
        if reconnected:
            self._wake.set()

    # -- watch thread: hints -> reads -> local copy and due work -----------------------------

    def _watch_loop(self) -> None:
        failures = 0
        # One early re-read after start closes the window in which a backend's hint source is
        # not armed yet (a poller's first baseline, a watch being set): hints may be dropped.
        next_resync = time.monotonic() + min(1.0, self.resync_interval)
        next_settle = 0.0
        next_fire = 0.0
        while not self._stopping.is_set():
            now = time.monotonic()
            timeout = next_resync - now
            with self._lock:
                if self._want_settle:
                    timeout = min(timeout, next_settle - now)
                if self._settle_due:
                    timeout = min(timeout, min(d for d, _ in self._settle_due.values()) - now)
            resume_in = self._next_resume_due()
            if resume_in != float("inf"):
                timeout = min(timeout, max(resume_in, next_fire - now))
            self._wake.wait(max(0.0, timeout))
            self._wake.clear()
            if self._stopping.is_set():
                return
            now = time.monotonic()
            with self._lock:
                resync = self._want_resync or now >= next_resync
                dirty, self._dirty = self._dirty, set()
                settle_now = {loc for loc, (d, _) in self._settle_due.items() if d <= now}
                for loc in settle_now:
                    del self._settle_due[loc]
                settle = self._want_settle and now >= next_settle
                self._want_resync = False
                if settle:
                    self._want_settle = False
            try:
                if resync:
                    self._resync()
                    next_resync = now + self.resync_interval
                    settle = True
                else:
                    for loc in sorted(dirty):
                        self._refresh(loc)
                for loc in sorted(settle_now):
                    self._try_settle(loc)
                if settle:
                    next_settle = now + self.settle_interval
                    self._settle_transitional()
                if now >= next_fire and self._next_resume_due() <= 0:
                    next_fire = now + self.settle_interval  # at most one attempt per period
                    self._fire_due_resumes()
                failures = 0
            except LocstatusError as exc:
                failures += 1
                with self._lock:
                    self._metrics["backend_errors"] += 1
                    self._want_resync = True  # whatever was missed, re-read it all
                    self._dirty |= dirty
                    for loc in settle_now:
                        self._settle_due.setdefault(loc, (now, now))
                log.warning("agent %s: backend read failed: %s", self.worker_id, exc)
                if self._stopping.wait(min(2.0, 0.05 * 2**failures)):
                    return
                self._wake.set()

    def _resync(self) -> None:
        """Re-read every record (start, reconnect, lapsed lease, periodic safety net)."""
        records = self.backend.read_all()
        seen: set[str] = set()
        good: list[LocationStatus] = []
        for rec in records:
            loc = rec.location
            if self._location_set is not None and loc not in self._location_set:
                continue
            seen.add(loc)
            if isinstance(rec, CorruptRecord):
                self._count("corrupt_records")
                log.warning("agent %s: %s", self.worker_id, rec)
            else:
                good.append(rec)
        with self._cond:
            self._metrics["resyncs"] += 1
            for loc in [x for x in self._records if x not in seen]:
                self._forget(loc)
            for rec in good:
                self._store(rec)

    def _refresh(self, location: str) -> None:
        try:
            rec = self.backend.read(location)
        except NotFound:
            with self._cond:
                self._forget(location)
            return
        except CorruptRecord as exc:
            self._count("corrupt_records")
            log.warning("agent %s: %s", self.worker_id, exc)
            return
        with self._cond:
            self._store(rec)

    def _store(self, rec: LocationStatus) -> None:
        """Keep ``rec`` unless a newer version is already known; plan the work it implies.
        Caller holds the lock."""
        old = self._records.get(rec.location)
        if old is not None and old.version > rec.version:
            return
        self._records[rec.location] = rec
        loc = rec.location
        if rec.deleted_at is not None:
            removal = tombstone_generation(rec.deleted_at)
            if self._applied.get((loc, TOMBSTONE_ACK)) != removal:
                self._schedule((loc, TOMBSTONE_ACK), removal)
            return
        self._applied.pop((loc, TOMBSTONE_ACK), None)
        self._handled.pop((loc, TOMBSTONE_ACK), None)
        for svc in self.services:
            st = rec.services.get(svc)
            if st is not None and self._applied.get((loc, svc)) != st.generation:
                self._schedule((loc, svc), st.generation)

    def _forget(self, location: str) -> None:
        """The record is gone (purged). Caller holds the lock."""
        self._records.pop(location, None)
        self._settled(location)
        for table in (self._applied, self._handled, self._due, self._failures):
            for key in [k for k in table if k[0] == location]:
                del table[key]
        for name in [k for k in self._errors if k.startswith(location + "/")]:
            del self._errors[name]
        self._first_pass_discard({k for k in self._first_pass if k[0] == location})

    def _first_pass_discard(self, keys: Iterable[_Key]) -> None:
        """Caller holds the lock."""
        self._first_pass.difference_update(keys)
        if not self._first_pass:
            self._first_pass_done.set()

    def _schedule(self, key: _Key, generation: int, delay: float = 0.0) -> None:
        """Make ``key`` due now (or after ``delay``). A key backing off after a failure of the
        same generation keeps its backoff. Caller holds the lock."""
        failed = self._failures.get(key)
        if delay == 0.0 and key in self._due and (failed is None or failed[0] == generation):
            return
        when = time.monotonic() + delay
        self._due[key] = when
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, key))
        self._cond.notify()

    def _settle_transitional(self) -> None:
        """Safety net: try to settle every watched record that is pausing/resuming (a lapsed
        lease, or an acknowledging worker that died before settling)."""
        with self._lock:
            targets = [
                loc
                for loc, rec in self._records.items()
                if not rec.deleted and any(s.state.transitional for s in rec.services.values())
            ]
        for loc in sorted(targets):
            rec = self.manager.settle(loc)
            self._count("settles")
            with self._cond:
                self._store(rec)

    def _next_resume_due(self) -> float:
        """Seconds until the earliest scheduled resume of a watched record (inf if none)."""
        if not self.fire_scheduled_resumes:
            return float("inf")
        with self._lock:
            dues = [
                s.resume_at
                for rec in self._records.values()
                if not rec.deleted
                for s in rec.services.values()
                if s.resume_at is not None and s.state.desired_paused
            ]
        if not dues:
            return float("inf")
        return max(0.0, (min(dues) - self.manager.clock()).total_seconds())

    def _fire_due_resumes(self) -> None:
        now = self.manager.clock()
        with self._lock:
            due = [
                loc
                for loc, rec in self._records.items()
                if not rec.deleted
                and any(
                    s.resume_at is not None and s.resume_at <= now and s.state.desired_paused
                    for s in rec.services.values()
                )
            ]
        for loc in sorted(due):
            rec = self.manager.fire_due_resumes(loc, actor=f"agent:{self.worker_id}")
            with self._cond:
                self._store(rec)

    # -- apply thread: handlers, acknowledgements, settle ---------------------------------------

    def _apply_loop(self) -> None:
        try:
            while True:
                with self._cond:
                    key = self._next_due()
                    if key is None:
                        return
                try:
                    self._apply(key)
                except Exception:  # pragma: no cover - a bug in the agent; retry, keep going
                    log.exception("agent %s: applying %s failed", self.worker_id, key)
                    with self._cond:
                        self._schedule(key, -1, delay=self.handler_retry.delay(3))
                finally:
                    with self._lock:
                        self._first_pass_discard((key,))
        finally:
            if self._runner is not None:
                self._runner.close()
                self._runner = None

    def _next_due(self) -> _Key | None:
        """Wait for the earliest due key and pop it; None when stopping. Caller holds the
        lock (through the condition)."""
        while not self._stopping.is_set():
            heap = self._heap
            while heap and self._due.get(heap[0][2]) != heap[0][0]:
                heapq.heappop(heap)  # superseded entry
            if heap:
                when, _, key = heap[0]
                wait = when - time.monotonic()
                if wait <= 0:
                    heapq.heappop(heap)
                    del self._due[key]
                    return key
                self._cond.wait(wait)
            else:
                self._cond.wait()
        return None

    def _apply(self, key: _Key) -> None:
        location, service = key
        with self._lock:
            rec = self._records.get(location)
        if rec is None:
            return
        if service == TOMBSTONE_ACK:
            self._apply_removal(key, rec)
            return
        while True:
            st = rec.services.get(service)
            if rec.deleted or st is None:
                return
            generation = st.generation
            with self._lock:
                if self._applied.get(key) == generation:
                    return
                handled = self._handled.get(key) == generation
            if not handled:
                handlers = self._pause_handlers if st.paused else self._resume_handlers
                if not self._run_handlers(key, handlers.get(service, ()), st, generation):
                    return
            # Acknowledge only while the record is still the one whose state was applied: one
            # conditional write. If it moved meanwhile, read it; a newer generation runs the
            # handler again before anything is acknowledged.
            acked = self._acknowledge(key, generation, if_version=rec.version)
            if acked is None:
                fresh = self._reread(key, generation)
                if fresh is None:
                    return
                now_st = fresh.services.get(service)
                if fresh.deleted or now_st is None:
                    return
                if now_st.generation != generation:
                    # The state moved while the handler ran: apply the newer one first.
                    self._count("handler_reruns")
                rec = fresh
                continue
            if not acked:
                return
            if st.state.transitional:
                # Settling is the watch thread's: the next handler does not wait for it.
                settler = self._is_settler(location, service)
                now = time.monotonic()
                with self._lock:
                    self._settle_tries.pop(location, None)
                    if settler:
                        self._settler_of.add(location)
                        due = (now + _settle_delay(), now + _SETTLE_MAX_DELAY)
                    else:
                        late = now + _SETTLE_FALLBACK + random.uniform(0.0, _SETTLE_FALLBACK)
                        due = (late, late)
                    self._settle_due[location] = due
                self._wake.set()
            return

    def _is_settler(self, location: str, service: str) -> bool:
        """True when this worker settles ``location`` first: the highest rendezvous hash among
        the live workers that apply ``service`` there (itself included, even when its own
        registration is not visible yet). True as well when the workers cannot be read."""
        try:
            workers = self.backend.workers()
        except LocstatusError:
            return True
        now = self.manager.clock()
        ids = {
            w.worker_id for w in workers if w.alive(now) and w.applies(location, service)
        }
        ids.add(self.worker_id)
        return max(ids, key=lambda w: _rendezvous(location, w)) == self.worker_id

    def _apply_removal(self, key: _Key, rec: LocationStatus) -> None:
        location = key[0]
        if rec.deleted_at is None:
            return
        removal = tombstone_generation(rec.deleted_at)
        with self._lock:
            if self._applied.get(key) == removal:
                return
            handled = self._handled.get(key) == removal
        if not handled:
            if not self._run_handlers(key, self._remove_handlers, None, removal):
                return
            with self._lock:
                # Consumers were torn down: if the location comes back, apply it again.
                for svc in self.services:
                    self._applied.pop((location, svc), None)
                    self._handled.pop((location, svc), None)
        fresh = self._reread(key, removal)
        if fresh is None or fresh.deleted_at != rec.deleted_at:
            return  # purged, unreachable (retried), restored or removed again (due again)
        self._acknowledge(key, removal)

    def _run_handlers(
        self, key: _Key, handlers: Iterable[Handler], status: ServiceStatus | None, generation: int
    ) -> bool:
        """Run ``handlers`` for ``key``; on failure record the error, schedule a retry with
        backoff and return False."""
        location, service = key
        self._applying = Applying(location, service, status)
        try:
            for fn in list(handlers):
                self._call(fn, location)
        except Exception as exc:
            self._applying = None
            with self._cond:
                self._metrics["handler_errors"] += 1
                previous = self._failures.get(key)
                count = previous[1] + 1 if previous and previous[0] == generation else 1
                self._failures[key] = (generation, count)
                self._errors[f"{location}/{service}"] = f"{type(exc).__name__}: {exc}"[:1000]
                self._schedule(key, generation, delay=self.handler_retry.delay(count))
            log.warning(
                "agent %s: handler for %s/%s (generation %d) failed (attempt %d): %s",
                self.worker_id,
                location,
                service,
                generation,
                count,
                exc,
                exc_info=exc,
            )
            self._beat_now.set()  # publish the error now, not at the next heartbeat
            return False
        self._applying = None
        with self._lock:
            self._metrics["handler_runs"] += 1
            self._handled[key] = generation
        return True

    def _call(self, fn: Handler, location: str) -> None:
        result = fn(location)
        if not inspect.isawaitable(result):
            return
        coro = result if inspect.iscoroutine(result) else _await(result)
        if self._loop is not None:
            asyncio.run_coroutine_threadsafe(coro, self._loop).result()
            return
        if self._runner is None:
            self._runner = asyncio.Runner()
        self._runner.run(coro)

    def _reread(self, key: _Key, generation: int) -> LocationStatus | None:
        """Read the record again after a handler ran. None: gone, or unreachable (then the key
        is retried shortly; the handler is not run again for the same generation)."""
        location = key[0]
        try:
            fresh = self.backend.read(location)
        except NotFound:
            with self._cond:
                self._forget(location)
            return None
        except LocstatusError as exc:
            self._backend_retry(key, generation, exc)
            return None
        with self._cond:
            self._store(fresh)
        return fresh

    def _acknowledge(
        self, key: _Key, generation: int, *, if_version: int | None = None
    ) -> bool | None:
        """True: acknowledged. False: not now (stopping, or a backend error: retried later).
        None: the record is no longer at ``if_version`` (nothing written; read it again)."""
        location, service = key
        if self._stopping.is_set():
            return False  # stop() unregisters this worker; never ack after that
        try:
            self.backend.ack(self.worker_id, location, service, generation, if_version=if_version)
        except VersionConflict:
            return None
        except LocstatusError as exc:
            self._backend_retry(key, generation, exc)
            return False
        with self._lock:
            self._metrics["acks"] += 1
            self._applied[key] = generation
            self._handled.pop(key, None)
            self._failures.pop(key, None)
            had_error = self._errors.pop(f"{location}/{service}", None) is not None
        if had_error:
            self._beat_now.set()  # clear the published error now
        return True

    def _try_settle(self, location: str) -> None:
        """Settle ``location`` after this worker acknowledged it (watch thread), unless the
        local copy already shows it settled by someone else. Its errors are not fatal: the
        safety net and other processes settle too."""
        with self._lock:
            rec = self._records.get(location)
            if rec is None or not any(s.state.transitional for s in rec.services.values()):
                self._settled(location)
                return
        try:
            rec = self.manager.settle(location)
        except LocstatusError as exc:
            self._count("backend_errors")
            log.warning("agent %s: settle %s failed: %s", self.worker_id, location, exc)
            return
        with self._cond:
            self._metrics["settles"] += 1
            self._store(rec)
            if not any(s.state.transitional for s in rec.services.values()):
                self._settled(location)
            elif location not in self._settle_due:
                # Others still to acknowledge: try again, backing off (acks hints may not come,
                # and the settler may have died after its acknowledgement, when nothing else
                # would wake this worker until that session expires or the next resync).
                tries = self._settle_tries.get(location, 0) + 1
                if tries <= _SETTLE_RETRIES:
                    self._settle_tries[location] = tries
                    if location in self._settler_of:
                        delay = min(self.settle_interval, _SETTLE_QUIET * 2**tries)
                    else:
                        delay = min(_SETTLE_FALLBACK_CAP, _SETTLE_FALLBACK * 2**tries)
                    delay += _settle_delay()
                    now = time.monotonic()
                    self._settle_due[location] = (now + delay, now + delay)
                    self._wake.set()

    def _settled(self, location: str) -> None:
        """Nothing left to settle at ``location`` here. Caller holds the lock."""
        self._settler_of.discard(location)
        self._settle_tries.pop(location, None)

    def _backend_retry(self, key: _Key, generation: int, exc: LocstatusError) -> None:
        log.warning("agent %s: %s/%s: backend error, retrying: %s", self.worker_id, *key, exc)
        with self._cond:
            self._metrics["backend_errors"] += 1
            self._schedule(key, generation, delay=self.handler_retry.delay(1))


_SETTLE_QUIET = 0.01
"""Seconds without another worker's acknowledgement before an acknowledging worker settles."""
_SETTLE_JITTER = 0.02
"""Random extra delay (seconds, up to this) so the fleet's settles do not all start at once: the
first one to land moves the record out of its transitional state, and the others, having read
that, skip theirs."""
_SETTLE_MAX_DELAY = 0.25
"""Upper bound (seconds after the acknowledgement) of the settle debounce."""
_SETTLE_FALLBACK = 0.5
"""Seconds (plus up to as much again, random) after which a worker that is not the settler of a
location tries to settle it, if it still reads it transitional (the settler died, or is slow)."""
_SETTLE_FALLBACK_CAP = 5.0
"""Longest wait (seconds) between a non-settler's later attempts (the delay doubles)."""
_SETTLE_RETRIES = 8
"""Attempts after the first while the location stays transitional; then the safety nets (a
change of the worker list, the periodic resync, the check job, a ``wait=``) take over."""


def _rendezvous(location: str, worker_id: str) -> int:
    """Rendezvous (highest random weight) hash: the same ranking in every process."""
    return zlib.crc32(f"{location}\0{worker_id}".encode())


def _settle_delay() -> float:
    return _SETTLE_QUIET + random.uniform(0.0, _SETTLE_JITTER)


async def _await(awaitable: Awaitable[Any]) -> None:
    await awaitable
