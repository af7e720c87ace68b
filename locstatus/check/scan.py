"""The scan: one pass over workers, acknowledgements and records, producing the findings.

It reads everything once (workers, every location's acknowledgements, then every record with its
newest history writes, streamed where the backend can), passes the quiet records through the
:class:`~locstatus.check.screen.Screen`, and sends the others down the full path: their history
compared (:func:`~locstatus.check.history.compare_history`, fed page by page from the backend),
the history gaps of a backend with two copies, and each finding kind judged. What a finding says
is :mod:`locstatus.check.findings`'; the decisions on deadlines are the models' and the time
source's (``ServiceStatus.resume_overdue``, :func:`worker_live`, docs/time.md).

Why a mismatch is confirmed before it is reported: the newest history is read after the record,
so a write landing in between looks like drift; the record is re-read, and compared again while
it keeps moving (:data:`CONFIRM_ATTEMPTS`), before a mismatch is reported. A history gap is
likewise confirmed by a second look, and a restorable one is reported only once its write is
``stuck_after`` old: a younger one may be a write in flight, whose writer has done its
``findAndModify`` and not yet its history insert, however long a loaded host keeps it from the
second write (docs/check.md, "Finding kinds").
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from datetime import datetime, timedelta

from locstatus.backends.base import AckMap, Backend, HistoryGaps
from locstatus.check.findings import Findings
from locstatus.check.history import compare_history
from locstatus.check.report import Finding, ProgressBar, Scanned, no_progress
from locstatus.check.screen import Newest, Screen
from locstatus.check.tombstones import readiness
from locstatus.clock import TimeSource
from locstatus.errors import CorruptRecord, NotFound
from locstatus.manager import Manager, acks_lapsed, away_notes, stuck_handlers, worker_live
from locstatus.models import HistoryEntry, LocationStatus, ServiceStatus, WorkerInfo

HISTORY_PAGES = (1, 8, 64, 512)
"""Entries asked per history page while looking for each service's newest entry (the last size
repeats). Most records are settled by the writes the scan brings with them."""

CONFIRM_ATTEMPTS = 3
"""Re-reads of a record whose history looked inconsistent because it changed while read."""


def history_pages(
    backend: Backend, location: str, head: list[HistoryEntry] | None
) -> Iterator[list[HistoryEntry]]:
    """``location``'s history newest first, one page per step, read only when the consumer
    asks for the next: ``head`` first when given (the newest writes' entries, read with the
    record), then pages of :data:`HISTORY_PAGES` entries each (the first size spent by
    ``head``). Ends at an empty or short page. Raises what ``Backend.history`` raises."""
    sizes = itertools.chain(HISTORY_PAGES, itertools.repeat(HISTORY_PAGES[-1]))
    before: int | None = None
    if head is not None:
        next(sizes)
        if not head:
            return
        yield head  # one write: more may follow
        before = head[-1].version
    for size in sizes:
        page = backend.history(location, limit=size, before_version=before)
        if not page:
            return
        yield page
        if len(page) < size:
            return
        before = page[-1].version


class Scan:
    """One pass over a store, producing :attr:`findings` and the :attr:`scanned` counts.

    - ``mgr``: the manager read through (``mgr.backend``) and whose time source (``mgr.time``)
      judges leases and tombstone TTLs;
    - ``now``: the instant ages are measured from (``mgr.clock()`` when the run began);
    - ``stuck_after``, ``tombstone_ttl``: seconds; ``max_skew``: seconds of clock offset;
    - ``wanted``: expected location -> services, or None (no location-list findings).

    Usage::

        scan = Scan(mgr, mgr.clock(), 300.0, 86400.0, wanted=None)
        scan.run()
        scan.own_clock(refusals_before)     # once any repairs ran
        scan.findings, scan.scanned
    """

    def __init__(
        self,
        mgr: Manager,
        now: datetime,
        stuck_after: float,
        tombstone_ttl: float,
        wanted: dict[str, tuple[str, ...]] | None,
        max_skew: float = 0.0,
    ) -> None:
        self.mgr = mgr
        self.backend = mgr.backend
        self.time: TimeSource = mgr.time
        self.now = now
        self.stuck_after = timedelta(seconds=stuck_after)
        self.ttl = timedelta(seconds=tombstone_ttl)
        self.wanted = wanted
        self.found = Findings(now, max_skew)
        self.findings: list[Finding] = self.found.items
        self.scanned = Scanned()
        self._services = 0
        self._tombstones = 0
        self.workers: list[WorkerInfo] = []
        self.live: list[WorkerInfo] = []
        self.acks: dict[str, AckMap] = {}
        self._gaps_possible = self.backend.two_history_copies
        self.screen = Screen(now, wanted, self._gaps_possible)

    def run(self, progress: ProgressBar = no_progress) -> None:
        """Read and judge everything once. Raises what the backend's reads raise
        (``BackendUnavailable``)."""
        self.workers = self.backend.workers()
        self.live = [w for w in self.workers if worker_live(w, self.time)]
        live_ids = {w.worker_id for w in self.live}
        self.acks = self.backend.all_acks()
        records = self.backend.scan_with_history()  # streamed where the backend can
        sc = self.scanned
        sc.workers = len(self.workers)
        sc.live_workers = len(self.live)
        seen: set[str] = set()
        quiet = self.screen.quiet
        with progress(len(records), "checking records") as advance:
            for item, newest in records:
                seen.add(item.location)
                if isinstance(item, CorruptRecord):
                    self.found.corrupt(item.location, item.detail, part="record")
                    sc.corrupt += 1
                elif quiet(item, newest):
                    self._services += len(item.services)
                else:
                    self._record(item, newest)
                advance()
        sc.records = len(seen)
        sc.services = self._services
        sc.tombstones = self._tombstones
        if self.wanted is not None:
            for loc in sorted(set(self.wanted) - seen):
                self.found.missing(loc, None, self.wanted[loc])
        max_skew = self.found.max_skew
        for w in self.workers:
            if w.corrupt is not None:
                self.found.corrupt_worker(w, w.worker_id in live_ids, self._acknowledged(w))
            elif w.lease_expires_at is not None and w.worker_id not in live_ids:
                self.found.expired(w, self._acknowledged(w))
            elif w.clock_offset_seconds is not None and abs(w.clock_offset_seconds) > max_skew:
                self.found.worker_skew(w)

    def own_clock(self, refusals_before: int, *, host: str, pid: int) -> None:
        """The ``clock_skew`` finding of this check's own process (``host``, ``pid``): its host
        clock is off by more than the bound, or it could not tell the backend's time within its
        own bound since the time source had refused ``refusals_before`` decisions (then every
        deadline repair of this run was refused). Called once the repairs ran."""
        ts = self.time
        unc = ts.uncertainty_seconds()
        self.found.own_clock(
            offset=ts.offset_seconds(),
            uncertainty=unc if math.isfinite(unc) else None,
            problem=ts.problem(),
            refused=ts.refusals - refusals_before,
            host=host,
            pid=pid,
        )

    # -- per record ----------------------------------------------------------------------

    def _record(self, rec: LocationStatus, newest: Newest) -> None:
        self._services += len(rec.services)  # plain ints: Scanned's __setattr__ is slow
        entered = self._history(rec, newest)
        if entered is None:  # gone since the scan read it
            return
        loc = rec.location
        if rec.deleted:
            self._tombstones += 1
            if self.wanted is not None and loc in self.wanted:
                self.found.missing(loc, rec, self.wanted[loc])  # restored, so never purged
            else:
                self._tombstone(rec)
            return
        for svc, st in rec.services.items():  # findings are sorted once, at the end
            if st.state.transitional:
                self._stuck(rec, svc, st, entered.get(svc) or st.updated_at)
            if st.resume_overdue(self.now):
                self.found.overdue(rec, svc, st)
        if self.wanted is not None:
            if loc not in self.wanted:
                self.found.unknown(rec)
            elif any(s not in rec.services for s in self.wanted[loc]):
                self.found.missing(loc, rec, self.wanted[loc])

    def _stuck(
        self, rec: LocationStatus, svc: str, st: ServiceStatus, since: datetime | None
    ) -> None:
        if since is not None and self.now - since < self.stuck_after:
            return
        loc = rec.location
        acks = self.acks.get(loc, {})
        lagging = [
            w
            for w in self.workers
            if w.applies(loc, svc) and acks.get(w.worker_id, {}).get(svc, -1) < st.generation
        ]
        alive = {w.worker_id: worker_live(w, self.time) for w in lagging}
        live = [w.worker_id for w in lagging if alive[w.worker_id]]
        stuck = {  # where a handler is stuck, or a standing registration's holder is away
            **away_notes(lagging, live, self.time),
            **stuck_handlers(lagging, live, self.now),
        }
        lapsed = frozenset(w.worker_id for w in lagging
                           if acks_lapsed(w, self.backend.session_leases))
        self.found.stuck(rec, svc, st, since, lagging, alive, acks, stuck, lapsed)

    def _tombstone(self, rec: LocationStatus) -> None:
        ready = readiness(rec, self.workers, self.acks.get(rec.location, {}), self.time, self.ttl)
        if ready is not None:
            self.found.tombstone(rec, *ready)

    def _acknowledged(self, w: WorkerInfo) -> int:
        """Locations at which ``w`` holds acknowledgements."""
        return sum(1 for per in self.acks.values() if w.worker_id in per)

    # -- history -------------------------------------------------------------------------

    def _history(self, rec: LocationStatus, newest: Newest) -> dict[str, datetime] | None:
        """Compare each service with its newest history entry. Returns when each transitional
        service entered its state (for stuck_transition), or None when the record is gone.
        ``newest``: the newest history writes read with the record, when the backend did."""
        gaps = self._gaps(rec.location)
        entered = self._compare(rec, newest)
        if entered is not None and gaps:
            # Confirmed by a second look, after the comparison, and only for writes old enough
            # that their writer has stopped: a write between its writer's two writes is in
            # flight, however long a loaded host keeps the writer from its history insert.
            again = self._gaps(rec.location)
            restorable = self._stopped(
                rec.location, sorted(set(gaps.restorable) & set(again.restorable))
            )
            lost = sorted(set(gaps.lost) & set(again.lost))
            if restorable:
                self.found.gap(rec, restorable, restorable=True)
            if lost:
                self.found.gap(rec, lost, restorable=False)
        return entered

    def _stopped(self, location: str, versions: list[int]) -> list[int]:
        """Of the restorable ``versions`` (ascending), those written ``stuck_after`` or longer
        ago by the backend's time (the write's entries' ``at``), as a stuck transition is
        judged: a younger one may be a write in flight, whose writer has done its
        ``findAndModify`` and not yet its history insert, and is no gap (docs/check.md,
        "Finding kinds"). Read newest first, one write each: the versions below an old write were
        written before it. A write with no entries to date it is taken as stopped."""
        for i in range(len(versions) - 1, -1, -1):
            try:
                entries = self.backend.history_write(location, versions[i])
            except NotFound:
                return []
            except CorruptRecord:
                entries = []  # reported as corrupt when read; the gap stays visible
            if not entries or self.now - max(e.at for e in entries) >= self.stuck_after:
                return versions[: i + 1]
        return []

    def _gaps(self, location: str) -> HistoryGaps:
        """Versions missing from the full history, for backends that keep two copies (MongoDB:
        embedded recent history and the history collection); see
        :meth:`Backend.history_gaps`."""
        if not self._gaps_possible:
            return HistoryGaps()
        try:
            return self.backend.history_gaps(location)
        except NotFound:
            return HistoryGaps()

    def _compare(self, rec: LocationStatus, newest: Newest) -> dict[str, datetime] | None:
        for _ in range(CONFIRM_ATTEMPTS):
            try:
                if isinstance(newest, CorruptRecord):
                    raise newest
                pages = history_pages(self.backend, rec.location, newest)
                problems, entered = compare_history(rec, pages)
            except CorruptRecord as exc:
                self.found.corrupt(rec.location, exc.detail, part="history")
                return {}
            newest = None  # a confirming pass reads the history afresh
            if not problems:
                return entered
            try:  # changed while read, or drift: confirm with a fresh read
                fresh = self.backend.read(rec.location)
            except NotFound:
                return None
            except CorruptRecord:
                return entered  # reported by the next run's scan
            if fresh.version == rec.version:
                break  # the record did not move: the drift is real (history ahead included)
            rec = fresh
        else:
            return entered  # kept changing: nothing can be concluded now
        self.found.mismatch(rec, problems)
        return entered
