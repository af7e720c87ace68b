"""The worker's registration and its lease: register, renew, unregister; how long it holds.

A worker counts for settle while its registration is alive (docs/agent.md, "Leases"): on
heartbeat backends (SQLite, MongoDB, memory) while ``lease_expires_at`` is ahead, so each
renewal rewrites it; on ZooKeeper while its session holds the ephemeral node, so a renewal only
pings unless what it publishes changed. :class:`Lease` does that I/O and remembers, on the
local monotonic clock, when the last renewal succeeded and when it was sent: a renewal that
succeeds after a failure or after the lease lapsed (more than ``lease_seconds`` since the last
successful one was sent, as its lease is dated then) tells the agent to re-read everything and
acknowledge again.

It also tells how long the lease surely holds (:attr:`Lease.good_until`), by the monotonic
clock alone (docs/agent.md "Self-fencing"): a successful renewal *sent* at ``t`` wrote a
deadline of at least ``t + window`` (heartbeat backends: ``lease_seconds`` on the manager's
time source; ZooKeeper: the server keeps a session it heard from at ``t`` for its session
timeout), so the lease holds until ``t + window - margin - uncertainty``: ``margin`` seconds
before anybody may judge it lapsed, more than the time source's uncertainty earlier. Past that
without a new renewal, the agent self-fences.

Unregistration may outlive :meth:`Agent.stop` when the backend does not answer; it then goes
on in the background, and a new registration of the same worker id on the same backend waits
for it first (landing after the new registration it would remove a live worker, and a pause
would settle without it).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, NamedTuple

from locstatus.errors import LocstatusError
from locstatus.instance import process_instance
from locstatus.models import StuckHandler, WorkerInfo

if TYPE_CHECKING:
    from locstatus.manager import Manager

__all__ = ["UNREGISTER_GRACE", "Lease", "Renewal", "lease_window"]

log = logging.getLogger("locstatus.agent")

UNREGISTER_GRACE = 1.0
"""Seconds :meth:`Agent.stop` waits for the unregistration at least, when its ``timeout`` was
spent on a running handler."""

_unregistering: dict[tuple[int, str], threading.Thread] = {}
"""Unregistrations left running in the background, by (backend, worker id)."""
_unregistering_lock = threading.Lock()


def _wait_for_unregistration(backend: object, worker_id: str) -> None:
    """Let a pending unregistration of ``worker_id`` on ``backend`` land first."""
    with _unregistering_lock:
        pending = _unregistering.get((id(backend), worker_id))
    if pending is not None and pending is not threading.current_thread():
        pending.join()


OFFSET_DECIMALS = 1
"""The published clock offset is rounded to 0.1 s, so that on ZooKeeper (where a
renewal rewrites the registration only when it changed) a measured offset that wanders by a
few milliseconds does not rewrite it, and wake every watcher of the worker list, each time."""


def _rounded(offset: float | None) -> float | None:
    return None if offset is None else round(offset, OFFSET_DECIMALS)


def lease_window(backend: object, lease_seconds: float) -> float:
    """Seconds a successful renewal keeps a registration alive: the session timeout on a
    backend whose sessions are the leases (when it says), else ``lease_seconds``."""
    timeout = getattr(backend, "session_timeout", None)
    if getattr(backend, "session_leases", False) and isinstance(timeout, int | float):
        return float(timeout)
    return lease_seconds


class Renewal(NamedTuple):
    """What a renewal found (:meth:`Lease.renew`)."""

    ok: bool
    """The backend took the renewal."""
    reconnected: bool
    """It succeeded after a failure or after the lease lapsed: notifications may be lost."""
    lapsed: bool
    """More than ``lease_seconds`` passed since the previous successful renewal: this worker
    may have been dropped as expired meanwhile, and its acknowledgements with it."""
    reregistered: bool = False
    """A standing registration found gone (retired or removed while its holder ran) and
    written again: its acknowledgements went with it (docs/agent.md "Standing
    registrations")."""


class Lease:
    """The registration of one worker (``WorkerInfo``) and its renewal.

    ``monotonic``: the local clock elapsed time is measured on (seconds; a fake one in tests).
    Raises :class:`~locstatus.errors.LocstatusError` from :meth:`register` when the backend
    refuses or cannot be reached.

    Usage::

        lease = Lease(mgr, "worker-7", ("replication",), None, lease_seconds=10)
        lease.register({})
        outcome = lease.renew({})        # every lease_seconds / 3
        lease.unregister()
    """

    def __init__(
        self,
        manager: Manager,
        worker_id: str,
        services: tuple[str, ...],
        locations: tuple[str, ...] | None,
        *,
        lease_seconds: float,
        margin: float = 0.0,
        monotonic: Callable[[], float] = time.monotonic,
        standing: bool = False,
    ) -> None:
        self.manager = manager
        self.backend = manager.backend
        self.worker_id = worker_id
        self.services = services
        self.locations = locations
        self.lease_seconds = lease_seconds
        self.window = lease_window(self.backend, lease_seconds)
        """Seconds a successful renewal keeps the registration alive (see the module)."""
        self.margin = margin
        self.standing = standing
        """A standing registration (docs/agent.md "Standing registrations")."""
        self._monotonic = monotonic
        self.started_at: datetime | None = None
        self.connected = True
        self.last_ok = 0.0
        """Monotonic time of the last successful registration or renewal."""
        self.last_sent = 0.0
        """Monotonic time at which that registration or renewal was sent."""
        self.good_until: float | None = None
        """Monotonic time until which the lease surely holds; None before registering."""
        self._registered: WorkerInfo | None = None  # what the backend holds, as last written

    def info(
        self, errors: Mapping[str, str], stuck: Mapping[str, StuckHandler] | None = None
    ) -> WorkerInfo:
        """The registration as it would be written now, publishing ``errors`` and ``stuck``
        handlers."""
        return WorkerInfo(
            worker_id=self.worker_id,
            services=self.services,
            locations=self.locations,
            host=socket.gethostname(),
            pid=os.getpid(),
            instance=process_instance() if self.standing else None,
            started_at=self.started_at,
            lease_expires_at=None
            if self.backend.session_leases
            else self.manager.clock() + timedelta(seconds=self.lease_seconds),
            errors=dict(errors),
            clock_offset_seconds=_rounded(self.manager.time.offset_seconds()),
            stuck=dict(stuck or {}),
            standing=self.standing,
        )

    def register(self, errors: Mapping[str, str]) -> None:
        """Write the registration (after any pending unregistration of the same worker)."""
        _wait_for_unregistration(self.backend, self.worker_id)
        self.started_at = self.manager.clock()
        sent = self._monotonic()
        info = self.info(errors)
        slack = self._slack()  # the error of the deadline info() just dated
        self.backend.put_worker(info)
        self._registered = info
        self.last_ok = self._monotonic()
        self.last_sent = sent
        self.good_until = sent + self.window - slack
        self.connected = True

    def _slack(self) -> float:
        """The margin, plus how far the time source may be off (it dated the deadline)."""
        try:
            return self.margin + max(0.0, self.manager.time.uncertainty_seconds())
        except Exception:  # a source that cannot say: keep the margin alone
            return self.margin

    def renew(
        self, errors: Mapping[str, str], stuck: Mapping[str, StuckHandler] | None = None
    ) -> Renewal:
        """Renew the lease (ZooKeeper: ping, rewriting the node only when what it publishes
        changed).
        Any error (a backend's, or one no backend mapped) is logged and reported as
        ``ok=False``; it is never raised, so the heartbeat thread never dies of it."""
        sent = self._monotonic()
        again = False
        try:
            info = self.info(errors, stuck)
            slack = self._slack()  # the error of the deadline info() just dated
            session = self.backend.session_leases
            if session:
                self.backend.ping()  # fails at once while disconnected (the fence's clock)
            if (self.standing and self._registered is not None
                    and not self.backend.has_worker(self.worker_id)):
                # removed behind this running holder's back (by hand: a retirement never
                # removes it while it is present): what it stands for still runs, so it
                # registers again (docs/agent.md "Standing registrations")
                log.warning("agent %s: its standing registration is gone (retired or removed "
                            "while it runs): registering it again", self.worker_id)
                self.backend.put_worker(info)
                self._registered = info
                again = True
            elif session and info == self._registered:
                pass  # the session holds the lease (pinged above): nothing to rewrite
            else:
                self.backend.put_worker(info)
                self._registered = info
        except Exception as exc:
            self.connected = False
            if isinstance(exc, LocstatusError):
                log.warning("agent %s: heartbeat failed: %s", self.worker_id, exc)
            else:
                log.exception("agent %s: heartbeat failed (unexpected error)", self.worker_id)
            return Renewal(ok=False, reconnected=False, lapsed=False)
        now = self._monotonic()
        # measured from when the last successful renewal was *sent*: its lease is dated then
        # (as good_until is), so one answered late runs out earlier than its answer suggests,
        # and a removal by the check job's repair may have followed
        lapsed = now - self.last_sent > self.lease_seconds
        reconnected = not self.connected or lapsed
        self.connected = True
        self.last_ok = now
        self.last_sent = sent
        self.good_until = sent + self.window - slack
        return Renewal(ok=True, reconnected=reconnected or again, lapsed=lapsed,
                       reregistered=again)

    def unregister(self, wait: float | None = None) -> None:
        """Remove the registration (dropping the worker's acknowledgements). With ``wait``,
        give up waiting for the backend after that many seconds and let it go on in the
        background: if it never lands the registration ends with its lease or session."""
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

    def leave(self) -> None:
        """Leave a standing registration standing, its holder away from now: written once more
        with its lease ending now (the backend's time), so every reader shows since when (on
        ZooKeeper too, where the holder's session may outlive this agent). A failure is only
        logged: the registration stays standing either way, and its lease lapses alone."""
        if self._registered is None:
            return
        try:
            self.backend.put_worker(
                self._registered.model_copy(update={"lease_expires_at": self.manager.clock()})
            )
        except LocstatusError as exc:
            log.warning("agent %s: could not mark its standing registration away: %s",
                        self.worker_id, exc)

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
