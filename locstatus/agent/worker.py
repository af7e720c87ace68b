"""The public worker: :class:`Agent`, its settings, its local reads, its threads.

An :class:`Agent` is assembled from the parts of this package (see its ``__init__``): the
lease (:mod:`.lease`), the watch side (:mod:`.watch`), the apply side (:mod:`.apply`) and the
state they share (:mod:`.state`). This module validates the settings, registers handlers,
answers local reads (no I/O) and starts and stops the threads: heartbeat (:mod:`.heartbeat`),
watch, guard (:mod:`.guard`) and the apply threads.

:class:`Agent` is a little over 500 lines, on purpose: it is the documented worker surface
(docs/agent.md), and most of its length is the docstrings of the public methods a worker calls
(handlers, ``start``/``stop``, the local reads), each a few lines over the parts above. Moving
some of them elsewhere would split one public class across modules without moving any logic.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TypedDict, overload

from locstatus.agent.acker import Acker
from locstatus.agent.apply import Applier
from locstatus.agent.guard import Guard
from locstatus.agent.handlers import Applying, H, HandlerRetry, Handlers, applying, fencing
from locstatus.agent.heartbeat import Heartbeat
from locstatus.agent.lease import UNREGISTER_GRACE, Lease, lease_window
from locstatus.agent.state import AgentState
from locstatus.agent.watch import Watcher
from locstatus.errors import InvalidInput, NotFound
from locstatus.models import LocationStatus, ServiceStatus, State
from locstatus.names import SERVICE_ALIASES, canonical_service, check_location, check_worker_id
from locstatus.settings import Settings

if TYPE_CHECKING:
    from locstatus.manager import Manager

__all__ = ["HANDLER_CONCURRENCY", "HANDLER_DEADLINE", "Agent", "AgentSettings"]

log = logging.getLogger("locstatus.agent")

HANDLER_CONCURRENCY = 8
"""Default number of locations whose handlers may run at once (apply threads)."""
MAX_HANDLER_CONCURRENCY = 256
"""At most this many apply threads (each may publish one stuck handler in the registration,
which every backend bounds in size)."""
HANDLER_DEADLINE = 60.0
"""Default seconds after which a running handler is reported as stuck."""


def _seconds(name: str, value: object) -> float:
    """``value`` as seconds, or :class:`InvalidInput` naming the setting."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"{name} must be a number of seconds, got {value!r}")
    return float(value)


class AgentSettings(TypedDict, total=False):
    """The keyword settings of :class:`Agent` (for ``Client.agent(..., **settings)``)."""

    lease_seconds: float | None
    heartbeat_interval: float | None
    resync_interval: float
    settle_interval: float | None
    handler_retry: HandlerRetry | None
    handler_concurrency: int
    handler_deadline: float
    fence_margin: float | None
    fire_scheduled_resumes: bool
    standing: bool
    loop: asyncio.AbstractEventLoop | None


class Agent:
    """The worker side of locstatus: apply the state, acknowledge it, settle (docs/agent.md).

    Build it with ``Agent(manager, worker_id, ...)`` or ``connect(url).agent(worker_id, ...)``.
    ``services``: names this worker applies (default: every service of the manager; ``crr``
    means ``replication``). ``locations``: an optional filter (default: every location).
    Keyword settings, all in seconds:

    - ``lease_seconds``: lease length (default ``LOCSTATUS_LEASE_SECONDS``, 10). A worker whose
      lease lapsed stops counting for settle until its next heartbeat.
    - ``heartbeat_interval``: lease renewal period (default a third of the lease; on
      ZooKeeper at most a third of the session timeout).
    - ``fence_margin``: the worker self-fences this long before its lease may be judged
      lapsed by others (default a quarter of the lease window, less when the renewals leave
      less room; see docs/agent.md "Self-fencing").
    - ``resync_interval``: full re-read of every record as a safety net (default 30).
    - ``settle_interval``: at most one settle attempt per this period on worker changes
      (default ``min(1, heartbeat_interval)``).
    - ``handler_retry``: :class:`HandlerRetry` backoff of failing handlers.
    - ``handler_concurrency``: locations whose handlers may run at once (default
      :data:`HANDLER_CONCURRENCY`); the handlers of one location always run one at a time.
    - ``handler_deadline``: a handler running longer is reported as stuck (in the
      registration, ``locstatus workers``, ``locstatus check`` and the ``wait=`` error); default
      :data:`HANDLER_DEADLINE`.
    - ``fire_scheduled_resumes``: fire due scheduled resumes of watched locations (any number
      of processes may do this, exactly one transition happens). Default True.
    - ``standing``: register a standing registration (docs/agent.md "Standing
      registrations"): it keeps counting for settle while this process is away (stopped,
      killed, its lease lapsed), and :meth:`stop` leaves it standing; a process started
      again with the same ``worker_id`` takes it over and acknowledges again. It ends only
      when retired (``Manager.retire_worker``, ``locstatus workers retire``). Default False.
    - ``loop``: an event loop (running in another thread) to run coroutine handlers on; by
      default they run to completion on a private loop in the agent's apply thread.

    Handlers of different locations run concurrently, in up to ``handler_concurrency`` apply
    threads; the handlers of one location run one at a time, in the order their work became
    due. They must be idempotent: a handler may run again for the same desired state (after a
    restart, a reconnection, or when the state flipped and flipped back while it ran). On
    :meth:`start` every handler runs once for the current state of every watched (location,
    service), so the worker starts from the truth.

    A worker that cannot renew its lease self-fences before the lease may lapse: it stops what
    it runs (``on_fence``, else ``on_pause``), acknowledges nothing, and re-applies the real
    state once the lease is back (docs/agent.md "Self-fencing").

    Raises :class:`InvalidInput` for a bad worker id, service, location name or setting.

    Usage::

        agent = Agent(mgr, "worker-7", services=["replication"])

        @agent.on_pause("replication")
        def stop(location: str) -> None:
            consumers[location].stop()

        with agent:
            ...
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
        handler_concurrency: int = HANDLER_CONCURRENCY,
        handler_deadline: float = HANDLER_DEADLINE,
        fence_margin: float | None = None,
        fire_scheduled_resumes: bool = True,
        standing: bool = False,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        check_worker_id(worker_id)
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
        if isinstance(handler_concurrency, bool) or not isinstance(handler_concurrency, int):
            raise InvalidInput(
                f"handler_concurrency must be an integer, got {handler_concurrency!r}"
            )
        if not 1 <= handler_concurrency <= MAX_HANDLER_CONCURRENCY:
            raise InvalidInput(
                f"handler_concurrency must be in [1, {MAX_HANDLER_CONCURRENCY}], "
                f"got {handler_concurrency}"
            )
        self.handler_concurrency = handler_concurrency
        self.handler_deadline = _seconds("handler_deadline", handler_deadline)
        if not self.handler_deadline > 0:
            raise InvalidInput(f"handler_deadline must be > 0 seconds, got {handler_deadline}")
        self.fire_scheduled_resumes = fire_scheduled_resumes

        window = lease_window(manager.backend, lease)
        self.renew_interval = (
            min(self.heartbeat_interval, window / 3)
            if manager.backend.session_leases
            else self.heartbeat_interval
        )
        """Seconds between renewals (pings on ZooKeeper)."""
        room = window - self.renew_interval
        self.fence_margin = (
            min(window / 4, room / 2)
            if fence_margin is None
            else _seconds("fence_margin", fence_margin)
        )
        if not 0 < self.fence_margin < room:
            raise InvalidInput(
                f"fence_margin must be in (0, {room:g}) seconds (the lease window {window:g} "
                f"less the renewal interval {self.renew_interval:g}), got {fence_margin}"
            )

        self._handlers = Handlers(loop)
        self._state = AgentState(self.services, self.settle_interval)
        self._lease = Lease(
            manager,
            worker_id,
            self.services,
            self.locations,
            lease_seconds=lease,
            margin=self.fence_margin,
            standing=bool(standing),
        )
        self.standing = bool(standing)
        self._watcher = Watcher(
            self._state,
            manager,
            worker_id,
            services=self.services,
            locations=self._location_set,
            resync_interval=self.resync_interval,
            fire_scheduled_resumes=fire_scheduled_resumes,
        )
        self._acker = Acker(self._state, manager, worker_id, retry=self.handler_retry)
        self._applier = Applier(
            self._state,
            manager,
            worker_id,
            self._handlers,
            self.handler_retry,
            deadline=self.handler_deadline,
            on_interrupt=self._stop_in_background,
            acker=self._acker,
        )
        self._heartbeat = Heartbeat(
            self._state, self._lease, worker_id, interval=self.renew_interval
        )
        self._guard = Guard(
            self._state,
            worker_id,
            deadline=self.handler_deadline,
            threads=self.handler_concurrency,
            lease_until=self._heartbeat.lease_until,
            on_lapse=lambda: self._heartbeat.fence("no renewal landed before the lease's end"),
        )
        self._threads: list[threading.Thread] = []
        self._unsubscribe: Callable[[], None] | None = None
        self._started = False

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
            self._handlers.add_pause(svc, fn)
            return fn

        return register

    def on_resume(self, service: str) -> Callable[[H], H]:
        """Decorator: ``fn(location)`` runs when ``service`` must run at ``location`` (the
        desired state is resuming/running, including on start). Raises :class:`InvalidInput`
        for a service this agent does not apply."""
        svc = self._own_service(service)

        def register(fn: H) -> H:
            self._handlers.add_resume(svc, fn)
            return fn

        return register

    @overload
    def on_remove(self, fn: H) -> H: ...

    @overload
    def on_remove(self, fn: None = None) -> Callable[[H], H]: ...

    def on_remove(self, fn: H | None = None) -> H | Callable[[H], H]:
        """Decorator (``@agent.on_remove`` or ``@agent.on_remove()``): ``fn(location)`` runs
        once when a watched location is removed (tombstone, docs/agent.md "Tombstones"); the
        agent then acknowledges the tombstone. If the location is restored later, the
        pause/resume handlers run again for it."""

        def register(f: H) -> H:
            self._handlers.add_remove(f)
            return f

        return register if fn is None else register(fn)

    def on_fence(self, service: str) -> Callable[[H], H]:
        """Decorator: ``fn(location)`` runs, instead of the ``on_pause`` handlers, for every
        location where ``service`` runs when the worker self-fences (its lease may have lapsed:
        docs/agent.md "Self-fencing"). It must stop what runs, as a pause does; once the lease
        is back the real state is applied again (``on_resume`` where it runs). Without one,
        the ``on_pause`` handlers run. Raises :class:`InvalidInput` for a service this agent
        does not apply."""
        svc = self._own_service(service)

        def register(fn: H) -> H:
            self._handlers.add_fence(svc, fn)
            return fn

        return register

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
        """True when the worker must not work on ``service`` at ``location``: its desired
        state is paused (``pausing`` or ``paused``), the location was removed, or the worker
        is self-fenced (:attr:`fenced`: its lease may have lapsed, so a pause may settle
        without it; docs/agent.md "Self-fencing"). Answered from the agent's local copy, no
        I/O. Raises :class:`NotFound` for a location the agent has not seen (or does not
        watch) or a service the location does not have."""
        rec = self._state.copy.records.get(location)
        if rec is None:
            raise NotFound(self._unknown(location))
        if rec.deleted_at is not None:
            return True
        st = rec.services.get(service)
        if st is None:
            st = self._service_status(rec, service)
        return st.paused or self.fenced

    @property
    def fenced(self) -> bool:
        """True while the worker is self-fenced, until the fence lifts (docs/agent.md
        "Self-fencing"); :meth:`is_paused` is then True everywhere. No I/O."""
        return self._state.fence.fenced

    def status(self, location: str, service: str) -> ServiceStatus:
        """The locally known :class:`ServiceStatus` (latest read: what the record says, even
        while the worker is fenced; ask :meth:`is_paused` whether to work). Raises
        :class:`NotFound`."""
        return self._service_status(self.record(location), service)

    def state(self, location: str, service: str) -> State:
        """The locally known state (running, pausing, paused, resuming). Raises
        :class:`NotFound`."""
        return self.status(location, service).state

    def record(self, location: str) -> LocationStatus:
        """The locally known record of ``location``. Raises :class:`NotFound`."""
        rec = self._state.copy.records.get(location)
        if rec is None:
            raise NotFound(self._unknown(location))
        return rec

    def is_removed(self, location: str) -> bool:
        """True when ``location`` is a tombstone (docs/agent.md "Tombstones"). Raises
        :class:`NotFound`."""
        return self.record(location).deleted

    def observed_generation(self, location: str, service: str) -> int | None:
        """The generation this worker applied and acknowledged, or None (not yet applied)."""
        svc = SERVICE_ALIASES.get(service, service)
        with self._state.lock:
            return self._state.copy.applied.get((location, svc))

    def locations_seen(self) -> list[str]:
        """Watched locations in the local copy (tombstones included), sorted."""
        return sorted(self._state.copy.records)

    @property
    def applying(self) -> Applying | None:
        """Inside a handler: the (location, service, status) it applies; else None. Each
        handler sees its own (handlers of different locations run at once)."""
        return applying()

    @property
    def fencing(self) -> bool:
        """Inside a handler: True when it runs because the worker self-fenced (docs/agent.md
        "Self-fencing"): it must stop what runs, whatever the status says."""
        return fencing()

    def errors(self) -> dict[str, str]:
        """Last error of each failing handler, keyed ``location/service``."""
        with self._state.lock:
            return dict(self._state.errors)

    def metrics(self) -> dict[str, int]:
        """Counters (handler runs, errors, acks, settles, resyncs, hints, heartbeats, ...) and
        gauges (``pending`` work items, ``failing`` handlers, ``locations``, ``connected``,
        ``running`` and ``stuck`` handlers, ``fenced``)."""
        s = self._state
        with s.lock:
            out = dict(s.metrics)
            out["pending"] = len(s.queue)
            out["failing"] = len(s.errors)
            out["locations"] = len(s.copy.records)
            out["connected"] = int(self._lease.connected)
            out["running"] = len(s.running)
            out["stuck"] = sum(r.stuck for r in s.running.values())
            out["fenced"] = int(s.fence.fenced)
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
        once (a failing one is then retried in the background) or is reported stuck: a handler
        still running ``handler_deadline`` seconds after it started no longer holds up the
        start, nor do the other handlers of its location queued behind it, nor anything else
        once every apply thread runs a stuck handler (docs/agent.md "Handlers"): a handler that
        hangs holds the start up for about ``handler_deadline`` seconds, not for good.
        Idempotent while running.

        Raises :class:`BackendUnavailable` (nothing is left registered; a ``standing``
        registration is left standing, away) when the backend cannot be reached. An
        unregistration an earlier :meth:`stop` left pending (backend slow or down) lands
        first, so it can never remove this registration.
        """
        if self._started:
            return self
        s = self._state
        s.reset()
        self._acker.reset()
        self._lease.register(self.errors())
        try:
            # No "acks" hints: on ZooKeeper they would wake every worker at every other
            # worker's acknowledgement; the settler retries on its own instead (watch.py).
            self._unsubscribe = self.backend.subscribe(
                self._watcher.on_hint, kinds=("location", "workers", "resync")
            )
            self._watcher.resync()
        except BaseException:
            self._teardown_registration()
            raise
        with s.lock:
            s.first_pass = s.queue.keys()
            if not s.first_pass:
                s.first_pass_done.set()
        loops: list[tuple[str, Callable[[], None]]] = [
            ("heartbeat", self._heartbeat.run),
            ("watch", self._watcher.run),
            ("guard", self._guard.run),
            ("ack", self._acker.run),
        ]
        loops += [(f"apply{i}", self._applier.run) for i in range(self.handler_concurrency)]
        self._threads = [
            threading.Thread(
                target=self._run_thread,
                args=(fn,),
                name=f"locstatus-{name}-{self.worker_id}",
                daemon=True,
            )
            for name, fn in loops
        ]
        for t in self._threads:
            t.start()
        self._started = True
        if wait:
            s.first_pass_done.wait()
        return self

    def stop(self, timeout: float = 10.0, *, handed_over: bool = False) -> None:
        """Stop the threads (waiting up to ``timeout`` seconds for a running handler) and
        unregister the worker, which drops its acknowledgements so it stops counting for
        settle at once. Idempotent. A ``standing`` agent's registration is left standing
        instead, marked away from now on (its lease ends now), and keeps counting.
        ``handed_over``: another process holds the standing registration now (the Backbeat
        bridge stepping down, docs/backbeat.md "2. The bridge", One bridge publishes): nothing
        is written, as marking it away would overwrite the new holder's registration.

        Returns within about ``timeout`` seconds (plus at most :data:`UNREGISTER_GRACE`) even
        when the backend does not answer: an unregistration still pending then goes on in the
        background, and if it never lands the registration ends as a crashed worker's does,
        when its lease runs out (heartbeat backends) or its session ends (ZooKeeper), so a
        worker shut down during an outage never hangs its process on the backend's own
        timeouts."""
        if not self._started:
            return
        s = self._state
        self._started = False
        s.stopping.set()
        s.wake.set()
        s.beat_now.set()
        s.guard_wake.set()
        self._acker.wake()
        s.first_pass_done.set()
        with s.cond:
            s.cond.notify_all()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))
        self._threads = []
        self._teardown_registration(max(UNREGISTER_GRACE, deadline - time.monotonic()),
                                    write=not handed_over)

    def _teardown_registration(self, wait: float | None = None, *, write: bool = True) -> None:
        """Unsubscribe and unregister (see :meth:`Lease.unregister` for ``wait``); a standing
        registration is left standing (:meth:`Lease.leave`), or, without ``write`` (handed
        over to another holder), untouched."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if self.standing and not write:
            return
        if self.standing:
            self._lease.leave()
        else:
            self._lease.unregister(wait)

    def __enter__(self) -> Agent:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run_thread(self, target: Callable[[], None]) -> None:
        """Run one of the agent's loops until the agent stops. A loop catches what it expects
        itself; anything that still escapes (a bug, a ``BaseException`` out of a library) is
        logged, counted (``thread_errors``) and the loop starts again after a backoff: no
        agent thread ever dies. ``KeyboardInterrupt`` stops the agent instead."""
        s = self._state
        failures = 0
        while not s.stopping.is_set():
            try:
                target()
                return  # the loops return only when the agent stops
            except KeyboardInterrupt:
                log.warning(
                    "agent %s: KeyboardInterrupt in %s: stopping",
                    self.worker_id,
                    threading.current_thread().name,
                )
                self._stop_in_background()
                return
            except BaseException:
                failures += 1
                s.count("thread_errors")
                log.exception(
                    "agent %s: %s failed (restarting it, attempt %d)",
                    self.worker_id,
                    threading.current_thread().name,
                    failures,
                )
                if s.stopping.wait(min(5.0, 0.1 * 2**failures)):
                    return

    def _stop_in_background(self) -> None:
        """Stop the agent from one of its own threads (which stop() would wait for)."""
        threading.Thread(
            target=self.stop, name=f"locstatus-stop-{self.worker_id}", daemon=True
        ).start()
