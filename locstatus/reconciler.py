"""The reconciler: fires due scheduled resumes and settles transitions, in any number of processes.

Why it is shaped so (docs/design.md §3.3, §3 settle rule):

- A scheduled resume is *data* (``resume_at`` in the record), never an in-process timer. The
  reconciler only looks at records and calls :meth:`Manager.fire_due_resumes` for a location
  whose ``resume_at`` has passed; the manager's guard (``resume_at`` still equals the value read,
  inside one compare-and-set) makes exactly one transition happen however many sidecars race,
  and a resume that was rescheduled or re-paused in the meantime no longer matches and does not
  fire. A restart loses nothing: the next scan sees the same records.
- Settling ``pausing -> paused`` / ``resuming -> running`` is :meth:`Manager.settle`, which checks
  the acknowledgements of the live workers; the reconciler just calls it for transitional
  services (an expired lease drops a worker out of the count, so a crashed worker never blocks
  a transition for longer than its lease).
- Hints only make it *faster*: a backend hint for one location reconciles that location at once,
  a ``workers``/``resync`` hint triggers a full scan; a full scan also runs every ``interval``
  seconds and just before the nearest scheduled resume, so a dropped hint is never permanent.
- "Due" is judged on the backend's time, through the manager's time source
  (``mgr.time.is_past``, docs/time.md): a sidecar whose host clock is hours off fires nothing
  early, and while the time source cannot meet its bound nothing fires at all. Tests give the
  manager a fake clock (``Manager(clock=...)``) and move it instead of sleeping.

Usage::

    rec = Reconciler(mgr, interval=1.0)
    rec.run_once()        # one full pass (tests, cron)
    rec.start()           # or: background thread until rec.stop()
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from locstatus.errors import LocstatusError
from locstatus.manager import Manager
from locstatus.models import Hint, LocationStatus

log = logging.getLogger("locstatus.reconciler")

EventObserver = Callable[[str, str], None]
"""``observer(event, result)``: called once per transition attempt, e.g. for metrics.
``event`` is ``resume_due`` or ``settle``; ``result`` is ``applied`` or an error kind."""

_MIN_WAIT = 0.05
"""Floor of the loop's sleep (seconds): a resume due inside the clock's uncertainty (not yet
past beyond doubt) never turns the loop into a busy spin."""

_ids = itertools.count(1)


@dataclass
class ReconcileReport:
    """What one :meth:`Reconciler.run_once` pass did.

    ``fired`` and ``settled`` list ``(location, service)`` pairs this reconciler changed,
    ``errors`` maps a location to the error message that stopped it (it is retried on the next
    pass), ``next_due`` is the earliest scheduled resume still in the future (aware UTC) or None.
    """

    scanned: int = 0
    fired: list[tuple[str, str]] = field(default_factory=list)
    settled: list[tuple[str, str]] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    next_due: datetime | None = None


class Reconciler:
    """Fires due scheduled resumes and settles acknowledged transitions (docs/design.md §3.3).

    - ``mgr``: the :class:`Manager` to act through (every write is its compare-and-set path).
    - ``interval``: seconds between full scans of every record (> 0).
      What is due is decided on the manager's time source (``mgr.time``, docs/time.md).
    - ``actor``: recorded on the resumes this reconciler fires; default
      ``scheduler:<host>:<pid>:<n>`` so history shows which process fired each one.
    - ``observer``: optional ``(event, result)`` callback (metrics).

    Usage::

        rec = Reconciler(mgr, interval=1.0)
        rec.start()
        ...
        rec.stop()
    """

    def __init__(
        self,
        mgr: Manager,
        interval: float = 1.0,
        *,
        actor: str | None = None,
        observer: EventObserver | None = None,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"reconcile interval must be > 0 seconds, got {interval!r}")
        self.mgr = mgr
        self.interval = float(interval)
        self.actor = actor or f"scheduler:{socket.gethostname()}:{os.getpid()}:{next(_ids)}"
        self.observer = observer
        self.stats: dict[str, int] = {
            "runs": 0,
            "fired": 0,
            "settled": 0,
            "errors": 0,
            "hints": 0,
        }
        """Counters since start: full passes, resumes fired, transitions settled, errors, hints."""
        self.last_run: datetime | None = None
        """When the last full pass finished (backend time, ``mgr.clock()``), or None."""
        self.last_error: str | None = None
        """The last error message of a pass, or None after a clean pass."""
        self.pending_resumes = 0
        """Scheduled resumes seen (due or not) in the last full pass."""
        self._lock = threading.Lock()
        self._dirty: set[str] = set()
        self._full = True
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._next_due: datetime | None = None
        self._logged: dict[str, str] = {}

    # -- one pass ---------------------------------------------------------------------------

    def run_once(self) -> ReconcileReport:
        """Scan every record once: fire due resumes, settle transitional services.

        Errors are per location: one unreachable or corrupt record never stops the others; they
        are logged, counted and listed in the report. Raises only if the scan itself fails
        (:class:`BackendUnavailable`).
        """
        report = ReconcileReport()
        records = self.mgr.statuses()
        # A random order per pass: several sidecars spread over the due records instead of
        # all queueing on the same first one (the guard keeps it exactly-once either way).
        random.shuffle(records)
        now = self.mgr.clock()
        pending = 0
        for rec in records:
            report.scanned += 1
            pending += sum(1 for s in rec.services.values() if s.scheduled_resume is not None)
            self._reconcile_record(rec, now, report)
        with self._lock:
            self._next_due = report.next_due
        self.pending_resumes = pending
        self.stats["runs"] += 1
        self.last_run = self.mgr.clock()
        self.last_error = next(iter(report.errors.values()), None)
        return report

    def reconcile(self, location: str) -> ReconcileReport:
        """Reconcile one location now (what a hint for ``location`` triggers)."""
        report = ReconcileReport()
        try:
            rec = self.mgr.status(location)
        except LocstatusError as exc:
            if exc.http_status != 404:  # a purged location simply has nothing to do
                self._error(location, exc, report)
            return report
        report.scanned = 1
        self._reconcile_record(rec, self.mgr.clock(), report)
        if report.next_due is not None:
            with self._lock:
                if self._next_due is None or report.next_due < self._next_due:
                    self._next_due = report.next_due
        return report

    def _reconcile_record(
        self, rec: LocationStatus, now: datetime, report: ReconcileReport
    ) -> None:
        if rec.deleted:
            return
        loc = rec.location
        due = [s for s, st in rec.services.items() if st.resume_due(self.mgr.time)]
        try:
            if due:
                after = self.mgr.fire_due_resumes(loc, actor=self.actor)
                for svc in due:
                    st = after.services.get(svc)
                    before = rec.services[svc]
                    # Ours if the service moved on by one generation with our actor on it.
                    if (
                        st is not None
                        and st.actor == self.actor
                        and st.generation == before.generation + 1
                        and not st.paused
                    ):
                        report.fired.append((loc, svc))
                        self.stats["fired"] += 1
                        self._observe("resume_due", "applied")
                        log.info(
                            "fired the scheduled resume of %s/%s", loc, svc,
                            extra={"location": loc, "service": svc, "op_id": st.op_id,
                                   "actor": self.actor, "event": "resume_due"},
                        )
                rec = after
            transitional = [s for s, st in rec.services.items() if st.state.transitional]
            if transitional:
                after = self.mgr.settle(loc)
                for svc in transitional:
                    st = after.services.get(svc)
                    if (
                        st is not None
                        and not st.state.transitional
                        and st.generation == rec.services[svc].generation
                    ):
                        report.settled.append((loc, svc))
                        self.stats["settled"] += 1
                        self._observe("settle", "applied")
                        log.info(
                            "settled %s/%s: %s", loc, svc, st.state.value,
                            extra={"location": loc, "service": svc, "op_id": st.op_id,
                                   "event": "settle", "state": st.state.value},
                        )
                rec = after
        except LocstatusError as exc:
            self._error(loc, exc, report)
            self._observe("resume_due" if due else "settle", type(exc).__name__)
            return
        self._logged.pop(loc, None)
        for st in rec.services.values():
            at = st.scheduled_resume
            if at is None:
                continue
            if st.resume_overdue(now):  # due by the estimate, not past beyond doubt (or refused)
                retry = self.interval if self.mgr.time.problem() else _MIN_WAIT
                at = now + timedelta(seconds=retry)
            if report.next_due is None or at < report.next_due:
                report.next_due = at

    def _error(self, location: str, exc: LocstatusError, report: ReconcileReport) -> None:
        report.errors[location] = exc.message
        self.stats["errors"] += 1
        if self._logged.get(location) != exc.message:  # log each distinct error once
            self._logged[location] = exc.message
            log.warning(
                "reconcile %s: %s: %s", location, type(exc).__name__, exc.message,
                extra={"location": location, "error": type(exc).__name__},
            )

    def _observe(self, event: str, result: str) -> None:
        if self.observer is not None:
            try:
                self.observer(event, result)
            except Exception:  # an observer bug must not stop reconciling
                log.exception("reconciler observer failed")

    # -- background thread ------------------------------------------------------------------

    def start(self) -> None:
        """Start the background thread (idempotent). It subscribes to backend hints to wake
        early and runs a full pass every ``interval`` seconds and at the nearest due resume."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._full = True
        self._unsubscribe = self.mgr.backend.subscribe(self._on_hint)
        self._thread = threading.Thread(
            target=self._loop, name="locstatus-reconciler", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread and unsubscribe (idempotent); waits up to ``timeout`` seconds."""
        self._stop.set()
        self._wake.set()
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self._thread = None

    @property
    def alive(self) -> bool:
        """True while the background thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def wake(self, location: str | None = None) -> None:
        """Ask the thread to reconcile ``location`` (or everything, if None) now."""
        with self._lock:
            if location is None:
                self._full = True
            else:
                self._dirty.add(location)
        self._wake.set()

    def _on_hint(self, hint: Hint) -> None:
        self.stats["hints"] += 1
        if hint.kind in ("location", "acks") and hint.location:
            self.wake(hint.location)
        else:  # workers changed (a lease ended, a worker left) or resync: look at everything
            self.wake(None)

    def _loop(self) -> None:
        next_full = time.monotonic()
        while not self._stop.is_set():
            with self._lock:
                full = self._full or time.monotonic() >= next_full
                self._full = False
                dirty, self._dirty = self._dirty, set()
            try:
                if full:
                    self.run_once()
                    next_full = time.monotonic() + self.interval
                else:
                    for loc in sorted(dirty):
                        self.reconcile(loc)
            except LocstatusError as exc:  # the scan itself failed (backend down): retry later
                self.stats["errors"] += 1
                self.last_error = exc.message
                if self._logged.get("*") != exc.message:
                    self._logged["*"] = exc.message
                    log.warning("reconcile pass failed: %s", exc.message)
                next_full = time.monotonic() + self.interval
            except Exception:  # never let the thread die silently
                self.stats["errors"] += 1
                log.exception("reconcile pass crashed")
                next_full = time.monotonic() + self.interval
            self._wake.wait(self._sleep_for(next_full))
            self._wake.clear()

    def _sleep_for(self, next_full: float) -> float:
        wait = next_full - time.monotonic()
        with self._lock:
            due = self._next_due
        if due is not None:
            until_due = (due - self.mgr.clock()).total_seconds()
            if until_due < wait:
                wait = until_due
                with self._lock:  # wake for it once; the pass then recomputes it
                    self._full = True
        return max(wait, _MIN_WAIT)
