"""The watch side of the agent: hints -> reads -> the local copy; settling; due resumes.

Hints from the backend only say *where* to look (docs/agent.md, "Level-triggered"): the hint
callback runs on a backend thread, records what to look at and returns; the watch thread reads
those records (or all of them), stores them in the local copy (which queues the work they
imply; a record that may be of another life of its location is asked about first,
:mod:`.lives`), tries to settle what this worker acknowledged when the settle
schedule says so, sweeps transitional records when workers come and go, and fires the
scheduled resumes that are due.

Each pass of :meth:`Watcher.run` waits for the earliest of its named deadlines (the periodic
resync, the settle schedule, the next scheduled resume), or for a hint.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from locstatus.agent.lives import ask_lives
from locstatus.agent.replica import Life
from locstatus.agent.settle import SETTLE_GATHER
from locstatus.agent.state import AgentState
from locstatus.errors import CorruptRecord, LocstatusError, NotFound
from locstatus.models import Hint, LocationStatus, ServiceStatus

if TYPE_CHECKING:
    from locstatus.manager import Manager

__all__ = ["Watcher"]

log = logging.getLogger("locstatus.agent")

READ_BATCH = 1000
"""At most this many records per batch read of the records hints named."""

RESUME_RETRY = 1.0
"""Seconds before looking again for due resumes while the backend's time cannot be read."""


class Watcher:
    """Keeps the local copy of ``state`` fresh for one worker and settles what it applied.

    ``services``: the services the worker applies; ``locations``: its location filter (None:
    every location). ``resync_interval``: seconds between full re-reads.
    ``fire_scheduled_resumes``: fire the due resumes of the worker's services at watched
    locations, and of no other service (docs/agent.md, "Scheduled resumes").
    """

    def __init__(
        self,
        state: AgentState,
        manager: Manager,
        worker_id: str,
        *,
        services: tuple[str, ...],
        locations: frozenset[str] | None,
        resync_interval: float,
        fire_scheduled_resumes: bool,
    ) -> None:
        self.state = state
        self.manager = manager
        self.backend = manager.backend
        self.worker_id = worker_id
        self.services = services
        self.locations = locations
        self.resync_interval = resync_interval
        self.fire_scheduled_resumes = fire_scheduled_resumes

    # -- hints (a backend thread) --------------------------------------------------------------

    def on_hint(self, hint: Hint) -> None:
        """Record what to look at, wake the watch thread, return. Never raises into the
        backend's thread: whatever goes wrong turns into a full re-read."""
        try:
            if not self._on_hint(hint):
                return
        except Exception:
            log.exception("agent %s: hint %s could not be recorded", self.worker_id, hint.kind)
            with self.state.lock:
                self.state.want_resync = True
        self.state.wake.set()

    def _on_hint(self, hint: Hint) -> bool:
        """Record ``hint``; False when the watch thread has nothing to do for it."""
        s = self.state
        with s.lock:
            s.metrics["hints"] += 1
            if (hint.kind in ("location", "acks") and hint.location is not None
                    and self.locations is not None and hint.location not in self.locations):
                # Another worker's location: nothing to read or settle, and no wake-up of
                # the watch thread (16 agents in one process each woke for every hint of
                # the others' locations, bench/bridge.py).
                return False
            if hint.kind == "location" and hint.location is not None:
                # read by the backend: no read of our own, unless the record may be of
                # another life (then it is marked dirty: the watch thread asks)
                rec = hint.record
                if rec is not None and rec.location == hint.location and s.store_locked(rec):
                    # Stored without a read. The watch thread still wakes when the record holds
                    # a resume this worker fires: its sleep was planned without it (else a
                    # resume scheduled while nothing else woke it fired at the next re-read,
                    # up to resync_interval late).
                    return self.fire_scheduled_resumes and rec.location in s.copy.scheduled
                s.dirty.add(hint.location)
            elif hint.kind == "acks" and hint.location is not None:
                # Others are still acknowledging: put off this worker's settle until they are
                # done (debounce); the settler tries again after each later acknowledgement.
                s.settle.others_acknowledged(hint.location, now=s.monotonic())
            elif hint.kind == "workers":
                s.settle.request_sweep()
            else:  # resync, or anything this agent does not know: re-read everything
                s.want_resync = True
                if hint.session_lost:
                    # The session was the lease, and it expired: others may have settled
                    # without this worker already, so it stops what it runs now (self-fence)
                    # and re-applies once it holds the new session. The acknowledgements the
                    # old session held are gone: acknowledge again what is still applied.
                    s.metrics["sessions_lost"] += 1
                    s.copy.acknowledge_again()
                    if s.fence_locked("the ZooKeeper session was lost"):
                        log.warning("agent %s: session lost: self-fenced", self.worker_id)
                    s.beat_now.set()  # the next renewal ends the fence
        return True

    # -- the watch thread ------------------------------------------------------------------------

    def run(self) -> None:
        """The watch loop, until the agent stops. A failed read is retried with backoff and
        turns into a full re-read."""
        s = self.state
        failures = 0
        # One early re-read after start closes the window in which a backend's hint source is
        # not armed yet (a poller's first baseline, a watch being set): hints may be dropped.
        next_resync = s.monotonic() + min(1.0, self.resync_interval)
        next_fire = 0.0
        while not s.stopping.is_set():
            now = s.monotonic()
            wake_at = next_resync
            with s.lock:
                settle_at = s.settle.next_at()
            if settle_at is not None:
                wake_at = min(wake_at, settle_at)
            resume_in = self._next_resume_due()
            if resume_in != float("inf"):
                wake_at = min(wake_at, now + max(resume_in, next_fire - now))
            s.wake.wait(max(0.0, wake_at - now))
            s.wake.clear()
            if s.stopping.is_set():
                return
            now = s.monotonic()
            with s.lock:
                resync = s.want_resync or now >= next_resync
                dirty, s.dirty = s.dirty, set()
                settle_now = s.settle.pop_due(now=now, gather=SETTLE_GATHER)
                sweep = s.settle.take_sweep(now=now)
                s.want_resync = False
            try:
                if resync:
                    self.resync()
                    next_resync = now + self.resync_interval
                    sweep = True
                else:
                    self.refresh_many(sorted(dirty))
                if settle_now:
                    self.try_settle_many(sorted(settle_now))
                if sweep:
                    with s.lock:
                        s.settle.swept(now=now)
                    self._settle_transitional()
                if now >= next_fire and self._next_resume_due() <= 0:
                    next_fire = now + s.settle.settle_interval  # at most one attempt per period
                    self._fire_due_resumes()
                failures = 0
            except Exception as exc:  # a backend's error, or one nobody mapped: never fatal
                failures += 1
                with s.lock:
                    s.metrics["backend_errors"] += 1
                    s.want_resync = True  # whatever was missed, re-read it all
                    s.dirty |= dirty
                    s.settle.retry(settle_now, now=now)
                if isinstance(exc, LocstatusError):
                    log.warning("agent %s: backend read failed: %s", self.worker_id, exc)
                else:
                    log.exception(
                        "agent %s: backend read failed (unexpected error)", self.worker_id
                    )
                if s.stopping.wait(min(2.0, 0.05 * 2**failures)):
                    return
                s.wake.set()

    def resync(self) -> None:
        """Re-read every record (start, reconnect, lapsed lease, periodic safety net). While
        the worker comes back from a self-fence, a re-read that started after its lease came
        back is one of the conditions to lift the fence (:mod:`.fence`)."""
        s = self.state
        with s.lock:
            token = s.fence.reread_token()
        records = self.backend.read_all()
        seen: set[str] = set()
        good: list[LocationStatus] = []
        corrupt: list[CorruptRecord] = []
        for rec in records:
            loc = rec.location
            if self.locations is not None and loc not in self.locations:
                continue
            seen.add(loc)
            if isinstance(rec, CorruptRecord):
                corrupt.append(rec)
            else:
                good.append(rec)
        lives = self.lives(good)
        with s.cond:
            s.metrics["resyncs"] += 1
            for loc in [x for x in s.copy.records if x not in seen]:
                s.forget_locked(loc)
            for rec in good:
                s.store_locked(rec, lives)
            for exc in corrupt:
                s.corrupt_locked(exc)  # the last state read is kept: seen, so not forgotten
            s.fence.reread_done(token)
            lifted = s.try_unfence_locked()
        for exc in corrupt:
            log.warning("agent %s: %s", self.worker_id, exc)
        if lifted:
            log.warning("agent %s: fence lifted, re-applying", self.worker_id)

    def refresh_many(self, locations: Sequence[str]) -> None:
        """Read the records hints named, :data:`READ_BATCH` per batch read (a burst of hints,
        a bulk change of every location, costs a few reads, not one per location: docs/agent.md
        "Bursts"), and store each batch at once. A missing record is forgotten, a corrupt one
        reported alone (the others of its batch are stored)."""
        s = self.state
        for i in range(0, len(locations), READ_BATCH):
            chunk = locations[i : i + READ_BATCH]
            got = self.backend.read_many(chunk)  # failing: the run loop re-reads everything
            good = [r for r in got if isinstance(r, LocationStatus)]
            lives = self.lives(good)
            with s.cond:
                for rec in got:
                    if isinstance(rec, NotFound):
                        continue
                    if isinstance(rec, CorruptRecord):
                        s.corrupt_locked(rec)
                    else:
                        s.store_locked(rec, lives)
                for loc, rec in zip(chunk, got, strict=True):
                    if isinstance(rec, NotFound):
                        s.forget_locked(loc)
            for rec in got:
                if isinstance(rec, CorruptRecord):
                    log.warning("agent %s: %s", self.worker_id, rec)

    def lives(self, records: Iterable[LocationStatus]) -> dict[str, Life]:
        """What the backend says of the life of ``records`` that need asking
        (:func:`ask_lives`)."""
        return ask_lives(self.state, self.backend, self.worker_id, records)

    def _corrupt(self, exc: CorruptRecord) -> None:
        with self.state.lock:
            self.state.corrupt_locked(exc)
        log.warning("agent %s: %s", self.worker_id, exc)

    # -- settling --------------------------------------------------------------------------------

    def try_settle(self, location: str) -> None:
        """Settle ``location`` after this worker acknowledged it, unless the local copy already
        shows it settled by someone else. Its errors are not fatal: the sweep and other
        processes settle too."""
        s = self.state
        with s.lock:
            rec = s.copy.records.get(location)
            if rec is None or not any(x.state.transitional for x in rec.services.values()):
                s.settle.settled(location)
                return
        try:
            rec = self.manager.settle(location)
        except CorruptRecord as exc:
            self._corrupt(exc)
            return
        except LocstatusError as exc:
            s.count("backend_errors")
            log.warning("agent %s: settle %s failed: %s", self.worker_id, location, exc)
            return
        with s.cond:
            s.metrics["settles"] += 1
            s.store_locked(rec)
            if not any(x.state.transitional for x in rec.services.values()):
                s.settle.settled(location)
            elif s.settle.still_transitional(location, now=s.monotonic()):
                s.wake.set()

    def try_settle_many(self, locations: Sequence[str]) -> None:
        """:meth:`try_settle` for the locations whose windows opened together (after a burst of
        acknowledgements, thousands at once): one :meth:`Manager.settle_many
        <locstatus.manager.Manager.settle_many>` for those the local copy still shows
        transitional, its reads and writes in batches (docs/agent.md, "Bursts"). Its errors are
        not fatal, as :meth:`try_settle`'s."""
        s = self.state
        with s.lock:
            wanted: dict[str, LocationStatus] = {}
            for loc in locations:
                rec = s.copy.records.get(loc)
                if rec is None or not any(x.state.transitional for x in rec.services.values()):
                    s.settle.settled(loc)
                else:
                    wanted[loc] = rec
        if not wanted:
            return
        try:  # the copy's records: where another worker is still to acknowledge, no read
            results = self.manager.settle_many(list(wanted), known=wanted)
        except LocstatusError as exc:
            s.count("backend_errors")
            log.warning("agent %s: settle of %d locations failed: %s", self.worker_id,
                        len(wanted), exc)
            return
        failed: list[tuple[str, LocstatusError]] = []
        again = False
        with s.cond:
            for loc, got in results.items():
                if isinstance(got, CorruptRecord):
                    s.corrupt_locked(got)
                    failed.append((loc, got))
                    continue
                if isinstance(got, LocstatusError):
                    s.metrics["backend_errors"] += 1
                    failed.append((loc, got))
                    continue
                s.metrics["settles"] += 1
                if got is not wanted[loc]:  # the copy's own record back: nothing was read
                    s.store_locked(got)
                if not any(x.state.transitional for x in got.services.values()):
                    s.settle.settled(loc)
                elif s.settle.still_transitional(loc, now=s.monotonic()):
                    again = True
        if again:
            s.wake.set()
        for loc, error in failed[:3]:
            log.warning("agent %s: settle %s failed: %s", self.worker_id, loc, error)
        if len(failed) > 3:
            log.warning("agent %s: ... and %d more settles failed", self.worker_id,
                        len(failed) - 3)

    def _settle_transitional(self) -> None:
        """The sweep: try to settle every watched record that is pausing/resuming (a lapsed
        lease, or an acknowledging worker that died before settling)."""
        s = self.state
        with s.lock:
            targets = {loc: s.copy.records[loc] for loc in s.copy.transitional()}
        if not targets:
            return
        # failing: the run loop retries; the copy's records spare the reads of those another
        # worker is still to acknowledge
        results = self.manager.settle_many(sorted(targets), known=targets)
        corrupt: list[CorruptRecord] = []
        errors: list[LocstatusError] = []
        with s.cond:
            for loc, got in results.items():
                if isinstance(got, CorruptRecord):  # that location only; the others settle
                    s.corrupt_locked(got)
                    corrupt.append(got)
                elif isinstance(got, LocstatusError):
                    errors.append(got)
                else:
                    s.metrics["settles"] += 1
                    if got is not targets[loc]:  # the copy's own record back: nothing read
                        s.store_locked(got)
        for bad in corrupt:
            log.warning("agent %s: %s", self.worker_id, bad)
        if errors:
            raise errors[0]  # as a settle of it alone would: the run loop retries

    # -- scheduled resumes -----------------------------------------------------------------------

    def _scheduled(self) -> dict[str, list[ServiceStatus]]:
        """Per watched location, the statuses of the services this worker applies that have a
        resume scheduled, earliest first (a resume of another service is its own workers' or
        the sidecar's to fire). Read under the lock; judged outside it (records are frozen, and
        judging a deadline may probe the backend's time)."""
        out: dict[str, list[ServiceStatus]] = {}
        with self.state.lock:
            copy = self.state.copy
            for loc in copy.scheduled:
                rec = copy.records[loc]
                mine = [
                    st
                    for svc in self.services
                    if (st := rec.services.get(svc)) is not None
                    and st.scheduled_resume is not None
                ]
                if mine:
                    out[loc] = sorted(mine, key=_scheduled_at)
        return out

    def _resume_dues(self) -> dict[str, datetime]:
        """Earliest scheduled resume per watched location, among the services this worker
        applies (see :meth:`_scheduled`)."""
        return {loc: _scheduled_at(mine[0]) for loc, mine in self._scheduled().items()}

    def _next_resume_due(self) -> float:
        """Seconds until the earliest scheduled resume this worker fires (inf if none)."""
        if not self.fire_scheduled_resumes:
            return float("inf")
        dues = self._resume_dues()
        if not dues:
            return float("inf")
        try:
            now = self.manager.clock()
        except LocstatusError:  # the backend's time is unknown: look again in a while
            return RESUME_RETRY
        return max(0.0, (min(dues.values()) - now).total_seconds())

    def _fire_due_resumes(self) -> None:
        time_source = self.manager.time
        due = [
            loc
            for loc, mine in self._scheduled().items()
            if any(st.resume_due(time_source) for st in mine)  # earliest first: usually one ask
        ]
        for loc in sorted(due):
            try:
                rec = self.manager.fire_due_resumes(
                    loc, services=self.services, actor=f"agent:{self.worker_id}"
                )
            except CorruptRecord as exc:
                self._corrupt(exc)
                continue
            with self.state.cond:
                self.state.store_locked(rec)


def _scheduled_at(st: ServiceStatus) -> datetime:
    at = st.scheduled_resume
    assert at is not None
    return at
