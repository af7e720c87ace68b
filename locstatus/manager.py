"""The manager: the one place that combines the state machine with a backend.

Every mutation is the same short loop (docs/design.md §3.1, §3.2), in :meth:`Manager._write`:

1. read the record and its version;
2. apply the event to each targeted service with the pure state machine;
3. write with ``compare_and_set(expected_version)``, history in the same write;
4. on :class:`VersionConflict` re-read and re-apply under a bounded, jittered retry policy
   (tenacity), then raise :class:`ConflictError`;
5. on :class:`AmbiguousCommit` (connection lost after send) re-read and look for the operation's
   op_id in the history write at the version it would have produced before trying again, never
   retrying blindly (:meth:`Manager._landed`).

A write that leaves a service pausing or resuming is followed, in the same call, by the settle
of what no live worker applies, as a write of its own (:meth:`Manager._settle_unwatched`):
the worker list is read only once the transitional record is visible, so a worker that starts
meanwhile reads that record, never the one before it (model/README.md, finding 1).

Nothing here is trusted between calls: a stale process can never write back an old view. The
one thing kept is a *version hint* (:class:`_VersionHints`): the last record of a location this
manager read or wrote. An operator event may skip step 1 and plan from it, but only to make a
write: that write's compare-and-set succeeds only if the record is still at that version (so the
hint was the current record), and anything else (a conflict, a refusal, a no-op, a precondition)
is decided again from a fresh read. A process that pauses and resumes the same locations (the
sidecar, an operator script, ``wait=`` loops) so saves a read per write.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import NamedTuple, NoReturn

from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

from locstatus.backend_clock import time_source_for
from locstatus.backends.base import AckMap, Backend
from locstatus.clock import CallerClock, Clock, TimeSource
from locstatus.errors import (
    AlreadyExists,
    AmbiguousCommit,
    BackendUnavailable,
    ConflictError,
    CorruptRecord,
    InvalidInput,
    InvalidTransition,
    LocstatusError,
    NotFound,
    PreconditionFailed,
    SettleTimeout,
    VersionConflict,
)
from locstatus.fsm import Event, transition
from locstatus.models import (
    HistoryEntry,
    LocationStatus,
    ServiceStatus,
    WorkerInfo,
    new_op_id,
)
from locstatus.names import (
    DEFAULT_SERVICES,
    MAX_ACTOR,
    MAX_REASON,
    canonical_service,
    check_location,
    check_text,
)

log = logging.getLogger(__name__)

ServiceArg = str | Iterable[str] | None
Plan = tuple[LocationStatus, list[HistoryEntry]] | None


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded, jittered retry of compare-and-set conflicts (docs/design.md §3.1).

    ``max_attempts`` attempts or ``max_seconds`` seconds, whichever comes first; waits are
    random exponential between 0 and ``min(cap, base * 2**n)`` seconds.
    """

    max_attempts: int = 60
    max_seconds: float = 15.0
    base: float = 0.002
    cap: float = 0.2


class Listing(NamedTuple):
    """Every record as one read of all of them found it (:meth:`Manager.listing`): what
    front ends list, corrupt records as errors beside the readable ones (docs/http.md,
    "Corrupt records in listings"). Unpacks as ``records, corrupt``."""

    records: list[LocationStatus]
    """The readable records, sorted by location (tombstones only if asked)."""
    corrupt: list[CorruptRecord]
    """Every record that does not validate, sorted by location; each names its location."""


@dataclass
class SyncReport:
    """What :meth:`Manager.sync_locations` changed (location names, sorted)."""

    added: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    services_added: dict[str, list[str]] = field(default_factory=dict)
    unchanged: list[str] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)
    """Listed locations whose stored record is corrupt: left untouched."""

    @property
    def changed(self) -> bool:
        return bool(self.added or self.restored or self.removed or self.services_added)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector during a bulk decode: 10^5 freshly allocated,
    acyclic models would otherwise trigger repeated full-heap scans (about 45% of the time of
    ``statuses()`` at 100 000 locations, bench/scale.py)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


_ADD_ATTEMPTS = 5
"""Create/restore rounds of :meth:`Manager._add` when a purge keeps racing it."""


class _HintUnusable(Exception):
    """The version hint cannot decide this operation: read the record instead."""


class _VersionHints:
    """The last record of each location this manager read or wrote (at most ``size``, least
    recently used dropped first). Only ever the *expected version* of a first compare-and-set
    attempt: never returned to a caller, never a reason to skip a write (see the module
    docstring). Thread-safe (the sidecar calls one manager from many threads)."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._records: OrderedDict[str, LocationStatus] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, location: str) -> LocationStatus | None:
        with self._lock:
            return self._records.get(location)

    def put(self, rec: LocationStatus) -> None:
        with self._lock:
            old = self._records.get(rec.location)
            if old is not None and old.version > rec.version:
                return  # a newer one is known already
            self._records[rec.location] = rec
            self._records.move_to_end(rec.location)
            if len(self._records) > self.size:
                self._records.popitem(last=False)

    def drop(self, location: str) -> None:
        with self._lock:
            self._records.pop(location, None)


@dataclass
class _Ambiguity:
    """Writes of one operation whose outcome was unknown: version they would have produced ->
    the record they sent (docs/design.md §3.2)."""

    sent: dict[int, LocationStatus] = field(default_factory=dict)


def worker_live(worker: WorkerInfo, time_source: TimeSource) -> bool:
    """True unless the worker's lease deadline has passed by the backend's time beyond doubt
    (docs/time.md): a worker is dead (may be settled without, dropped as expired) only then;
    while the clock cannot tell, it is alive. A session-held registration (no deadline) is
    alive while it is listed."""
    expires = worker.lease_expires_at
    return expires is None or not time_source.is_past(expires)


def _check_free_text(reason: object, actor: object) -> None:
    """Refuse a bad ``reason``/``actor`` before any I/O (the FSM's :class:`Event` checks them
    again where it is built)."""
    check_text("reason", reason, MAX_REASON)
    check_text("actor", actor, MAX_ACTOR)


def lagging_workers(
    location: str,
    service: str,
    generation: int,
    workers: Sequence[WorkerInfo],
    acks: AckMap,
    time_source: TimeSource,
) -> list[str]:
    """Ids of live workers (:func:`worker_live`) that apply ``service`` at ``location`` and
    have not acknowledged ``generation`` yet (the settle rule, docs/fsm.md)."""
    return [
        w.worker_id
        for w in workers
        if w.applies(location, service)
        and acks.get(w.worker_id, {}).get(service, -1) < generation
        and worker_live(w, time_source)
    ]


def stuck_handlers(
    workers: Sequence[WorkerInfo], ids: Iterable[str], now: datetime
) -> dict[str, str]:
    """For each of ``ids`` with a handler stuck past its deadline, where: ``"stuck 12s in
    pause handler mod.fn at us-east-1/replication"`` (several joined with ``; ``)."""
    wanted = set(ids)
    out: dict[str, str] = {}
    for w in workers:
        if w.worker_id in wanted and w.stuck:
            out[w.worker_id] = "; ".join(
                f"stuck {max(0.0, (now - h.since).total_seconds()):.0f}s in {h.event} handler "
                f"{h.handler} at {key}"
                for key, h in sorted(w.stuck.items())
            )
    return out


class Manager:
    """Pause, resume and schedule services per location, on any backend.

    Usage::

        from locstatus import connect
        mgr = connect("sqlite:///./locstatus.db")
        mgr.sync_locations(["us-east-1"])
        mgr.pause("us-east-1", "replication", reason="maintenance", actor="ops")
        mgr.resume("us-east-1", "replication", at=timedelta(hours=2))
        mgr.status("us-east-1").services["replication"].state   # State.PAUSED

    ``clock``: None (default) judges every deadline on the backend's own time, measured
    (docs/time.md); a :class:`~locstatus.clock.TimeSource`, or an aware-UTC ``datetime``
    factory taken as exact (tests move a fake clock instead of sleeping).

    ``service`` arguments take a name (``crr`` means ``replication``), a list of names, or None
    for every service of the location. Mutations return the stored :class:`LocationStatus`;
    ``op_id=`` (1-64 printable characters) names the operation in the record and its history
    (default: a fresh uuid), so a caller can tell whether its call changed anything
    (``status.services[s].op_id == op_id``).
    """

    def __init__(
        self,
        backend: Backend,
        *,
        services: Iterable[str] = DEFAULT_SERVICES,
        clock: Clock | TimeSource | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.backend = backend
        self.services: tuple[str, ...] = tuple(services)
        self.time: TimeSource = (
            time_source_for(backend)
            if clock is None
            else clock if isinstance(clock, TimeSource) else CallerClock(clock)
        )
        """The backend's time (docs/time.md): every deadline is judged on it. Default: the
        store's own time, measured (:class:`~locstatus.backend_clock.BackendClock`); a callable
        ``clock`` (a fake clock in tests) is taken as exact."""
        self.clock: Clock = self.time.now
        self.retry = retry or RetryPolicy()
        self.stats = {"writes": 0, "conflicts": 0, "ambiguous": 0, "stale_hints": 0}
        self._hints = _VersionHints()

    # -- reads -----------------------------------------------------------------------------

    def status(self, location: str) -> LocationStatus:
        """The record of ``location``. Raises :class:`NotFound`, :class:`CorruptRecord`,
        :class:`InvalidInput` (bad name), :class:`BackendUnavailable`."""
        rec = self.backend.read(check_location(location))
        self._hints.put(rec)
        return rec

    def statuses(self, *, include_removed: bool = False) -> list[LocationStatus]:
        """Every readable record, sorted by location (tombstones only if asked). Corrupt
        records are skipped here (the reconciler's passes, the agent's lag view); wherever
        records are listed for a person, :meth:`listing` gives them beside the others."""
        with _gc_paused():
            records = self.backend.read_all()
        return [
            r
            for r in records
            if isinstance(r, LocationStatus) and (include_removed or not r.deleted)
        ]

    def listing(self, *, include_removed: bool = False) -> Listing:
        """:meth:`statuses` with the corrupt records beside them, for whatever lists records
        (the HTTP list and the ``all`` routes, the status page, ``locstatus status``): a record
        that cannot be read is shown as an error there, never left out. Raises
        :class:`BackendUnavailable`."""
        records: list[LocationStatus] = []
        corrupt: list[CorruptRecord] = []
        for item in self.scan():
            if isinstance(item, CorruptRecord):
                corrupt.append(item)
            elif include_removed or not item.deleted:
                records.append(item)
        return Listing(records, corrupt)

    def scan(self) -> list[LocationStatus | CorruptRecord]:
        """Every record, corrupt ones as :class:`CorruptRecord` values (for the check job)."""
        with _gc_paused():
            return self.backend.read_all()

    def history(
        self, location: str, limit: int = 50, *, before_version: int | None = None
    ) -> list[HistoryEntry]:
        """History of ``location``, newest first (``limit`` entries, 1..10000)."""
        check_location(location)
        if not 1 <= limit <= 10_000:
            raise InvalidInput(f"history limit must be 1..10000, got {limit}")
        entries = self.backend.history(location, limit=limit, before_version=before_version)
        if not entries and before_version is None:
            self.status(location)  # NotFound for an unknown location rather than []
        return entries[:limit]

    def workers(self) -> list[WorkerInfo]:
        """Registered workers (expired ones included; see :meth:`WorkerInfo.alive`)."""
        return self.backend.workers()

    def lagging(self, location: str, service: str) -> list[str]:
        """Live workers that have not acknowledged the current generation of a service."""
        rec = self.status(location)
        svc = self._targets(rec, service)[0]
        return lagging_workers(
            location,
            svc,
            rec.services[svc].generation,
            self.backend.workers(),
            self.backend.acks(location),
            self.time,
        )

    # -- operator mutations ----------------------------------------------------------------

    def pause(
        self,
        location: str,
        service: ServiceArg = None,
        *,
        reason: str | None = None,
        actor: str | None = None,
        wait: float | None = None,
        if_version: int | None = None,
        op_id: str | None = None,
    ) -> LocationStatus:
        """Pause services (docs/design.md §3 ``pause``): running/resuming -> pausing; a pause of a
        paused
        service cancels its scheduled resume, else it is a no-op. ``wait`` seconds: block until
        settled (:class:`SettleTimeout` names the lagging workers). ``if_version``: refuse with
        :class:`PreconditionFailed` unless the record is at that version (the pausing write's;
        when no live worker applies the service, its settle follows as the next write, and
        the call returns that record). ``reason`` (at most
        1024 characters) and ``actor`` (256) are free text without control characters
        (:func:`~locstatus.names.check_text`, :class:`InvalidInput` otherwise)."""
        _check_free_text(reason, actor)
        return self._operator_event(
            location, service, lambda _s: Event("pause", reason=reason, actor=actor),
            wait=wait, if_version=if_version, op_id=op_id, actor=actor, reason=reason,
        )

    def resume(
        self,
        location: str,
        service: ServiceArg = None,
        *,
        at: datetime | timedelta | None = None,
        reason: str | None = None,
        actor: str | None = None,
        wait: float | None = None,
        if_version: int | None = None,
        op_id: str | None = None,
    ) -> LocationStatus:
        """Resume now, or schedule a resume when ``at`` is given (an aware datetime, or a
        positive timedelta from now). Scheduling a running service raises
        :class:`InvalidTransition`; when ``service`` is None, services that are running are
        left alone as long as one service takes the schedule. Raises :class:`InvalidInput` for a
        time that is not aware, not in the future or out of range, and for ``reason``/``actor``
        as :meth:`pause` does."""
        _check_free_text(reason, actor)
        if at is None:
            return self._operator_event(
                location, service, lambda _s: Event("resume", reason=reason, actor=actor),
                wait=wait, if_version=if_version, op_id=op_id, actor=actor, reason=reason,
            )
        when = self._resume_time(at)
        return self._operator_event(
            location,
            service,
            lambda _s: Event("schedule_resume", at=when, reason=reason, actor=actor),
            wait=None,
            if_version=if_version,
            skip_refused=service is None,
            op_id=op_id,
            actor=actor,
            reason=reason,
        )

    def cancel_scheduled_resume(
        self,
        location: str,
        service: ServiceArg = None,
        *,
        actor: str | None = None,
        reason: str | None = None,
        if_version: int | None = None,
        op_id: str | None = None,
    ) -> LocationStatus:
        """Clear a scheduled resume (no write if none is scheduled). ``reason``/``actor`` as
        :meth:`pause`."""
        _check_free_text(reason, actor)
        return self._operator_event(
            location,
            service,
            lambda _s: Event("cancel_scheduled_resume", reason=reason, actor=actor),
            wait=None,
            if_version=if_version,
            op_id=op_id,
            actor=actor,
            reason=reason,
        )

    # -- reconcile primitives (agents, sidecar, check job) -----------------------------------

    def fire_due_resumes(
        self, location: str, services: ServiceArg = None, *, actor: str = "scheduler"
    ) -> LocationStatus:
        """Fire the scheduled resumes of ``location`` that are due (docs/time.md): those whose
        ``resume_at`` has passed by the backend's time beyond doubt (``self.time.is_past``, so
        never early, and none while the clock cannot tell; docs/time.md). ``services``: only
        these (a name or a list; None: every service), e.g. the services an agent applies.
        The guard (``resume_at`` still equals the value read) makes exactly one transition
        happen however many processes call this. A resume no live worker applies settles
        right after, as an operator's call does (:meth:`_settle_unwatched`)."""
        check_location(location)
        only = self._services_arg(services)
        _check_free_text(None, actor)
        op_id = new_op_id()

        def plan(rec: LocationStatus, now: datetime) -> Plan:
            if rec.deleted:
                return None
            due = {
                s: st.resume_at
                for s, st in rec.services.items()
                if (only is None or s in only) and st.resume_due(self.time)
            }
            return self._plan(
                rec, now, op_id, list(due),
                lambda s: Event("resume_due", at=due[s], actor=actor, reason="scheduled resume"),
            )

        fired = self._write(location, plan, op_id=op_id)
        return self._settle_unwatched(fired, op_id, actor, "scheduled resume")

    def settle(self, location: str, service: ServiceArg = None) -> LocationStatus:
        """Settle pausing -> paused / resuming -> running for services whose current generation
        every live worker has acknowledged (none live counts as all). A worker counts as live
        until its lease has passed by the backend's time beyond doubt (:func:`worker_live`)."""
        check_location(location)
        op_id = new_op_id()

        def plan(rec: LocationStatus, now: datetime) -> Plan:
            targets = [s for s in self._targets(rec, service) if rec.services[s].state.transitional]
            if not targets:
                return None  # nothing to settle: no workers or acks read
            workers = self.backend.workers()
            acks = self.backend.acks(location)
            ready = [
                s
                for s in targets
                if not lagging_workers(
                    location, s, rec.services[s].generation, workers, acks, self.time
                )
            ]
            return self._plan(
                rec, now, op_id, ready,
                lambda s: Event("settle", generation=rec.services[s].generation, acked=True),
            )

        return self._write(location, plan, op_id=op_id)

    # -- locations -------------------------------------------------------------------------

    def sync_locations(
        self,
        locations: Iterable[str] | Mapping[str, Iterable[str]],
        *,
        actor: str | None = None,
        remove_missing: bool = True,
    ) -> SyncReport:
        """Make the stored locations match ``locations``: a list of names (every configured
        service) or a mapping name -> services (docs/design.md §5.2). Adds missing locations and
        services, restores tombstoned ones, and tombstones locations not listed (docs/design.md
        §3.5) unless ``remove_missing`` is False. All names (and ``actor``) are validated before
        anything is written.
        """
        _check_free_text(None, actor)
        wanted = self._normalise_locations(locations)
        report = SyncReport()
        existing = {r.location: r for r in self.backend.read_all()}
        for loc in sorted(wanted):
            svcs = wanted[loc]
            if isinstance(existing.get(loc), CorruptRecord):
                report.corrupt.append(loc)  # never rewritten; the check job reports it
                continue
            self._add(loc, svcs, actor, report, exists=loc in existing)
        if remove_missing:
            for loc, rec in sorted(existing.items()):
                if loc not in wanted and isinstance(rec, LocationStatus) and not rec.deleted:
                    self.remove_location(loc, actor=actor)
                    report.removed.append(loc)
        return report

    def add_location(
        self, location: str, services: Iterable[str] | None = None, *, actor: str | None = None
    ) -> LocationStatus:
        """Create (or restore) one location with ``services`` (default: all configured)."""
        _check_free_text(None, actor)
        svcs = self._normalise_locations({location: services or self.services})
        self._add(location, svcs[location], actor, SyncReport(), exists=False)
        return self.status(location)

    def remove_location(self, location: str, *, actor: str | None = None) -> LocationStatus:
        """Tombstone a location (docs/design.md §3.5): ``deleted_at`` is set, workers see it and
        acknowledge it, and the check job purges it later. No-op if already removed."""
        check_location(location)
        _check_free_text(None, actor)
        op_id = new_op_id()

        def plan(rec: LocationStatus, now: datetime) -> Plan:
            if rec.deleted:
                return None
            entry = self._record_entry(rec.location, "remove", op_id, now, actor)
            return rec.model_copy(update={"deleted_at": now}), [entry]

        return self._write(location, plan, op_id=op_id)

    def purge_location(self, location: str, expected_version: int) -> None:
        """Delete a tombstoned record for good (check job). Raises :class:`VersionConflict`
        if it changed since it was read, :class:`InvalidTransition` if it is not a tombstone."""
        rec = self.status(location)
        if not rec.deleted:
            raise InvalidTransition(f"location {location!r} is not removed; refusing to purge")
        self.backend.delete(location, expected_version)

    def close(self) -> None:
        """Close the backend."""
        self.backend.close()

    def __enter__(self) -> Manager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------

    def _resume_time(self, at: datetime | timedelta) -> datetime:
        if isinstance(at, timedelta):
            if at <= timedelta(0):
                raise InvalidInput(f"resume delay must be positive, got {at}")
            try:
                return self.clock() + at
            except OverflowError:
                raise InvalidInput(f"resume delay {at} is out of range") from None
        if not isinstance(at, datetime):
            raise InvalidInput(f"resume time must be a datetime or timedelta, got {at!r}")
        if at.tzinfo is None or at.utcoffset() is None:
            raise InvalidInput(
                f"resume time {at.isoformat()} has no timezone: give an aware UTC datetime"
            )
        try:  # 9999-12-31T23:59:59-01:00 is a valid datetime whose UTC time is not
            return at.astimezone(self.clock().tzinfo)
        except OverflowError:
            raise InvalidInput(
                f"resume time {at.isoformat()} is out of range: its UTC time is past year 9999 "
                "or before year 1"
            ) from None

    def _services_arg(self, service: ServiceArg) -> list[str] | None:
        if service is None:
            return None
        if isinstance(service, str):
            names = [service]
        elif isinstance(service, list | tuple | set | frozenset):
            names = list(service)
        else:
            raise InvalidInput(
                f"service must be a name or a list of names, got {type(service).__name__}"
            )
        if not names:
            raise InvalidInput("no service given")
        return list(dict.fromkeys(canonical_service(n, self.services) for n in names))

    def _targets(self, rec: LocationStatus, service: ServiceArg) -> list[str]:
        names = self._services_arg(service)
        if names is None:
            return sorted(rec.services)
        missing = [n for n in names if n not in rec.services]
        if missing:
            raise NotFound(
                f"location {rec.location!r} has no service {', '.join(missing)} "
                f"(it has: {', '.join(sorted(rec.services)) or 'none'})"
            )
        return names

    def _operator_event(
        self,
        location: str,
        service: ServiceArg,
        make_event: Callable[[str], Event],
        *,
        wait: float | None,
        if_version: int | None,
        skip_refused: bool = False,
        op_id: str | None = None,
        actor: str | None,
        reason: str | None,
    ) -> LocationStatus:
        """One operator event on the targeted services of ``location`` (``make_event``: service
        -> its event, carrying ``actor`` and ``reason``), then the settle of what no live worker
        applies (:meth:`_settle_unwatched`), then ``wait``."""
        check_location(location)
        self._services_arg(service)  # validate before any I/O
        if wait is not None and not 0 <= wait <= 86_400:
            raise InvalidInput(f"wait must be 0..86400 seconds, got {wait}")
        if op_id is None:
            op_id = new_op_id()
        elif not (isinstance(op_id, str) and 1 <= len(op_id) <= 64 and op_id.isprintable()):
            raise InvalidInput(f"op_id must be 1-64 printable characters, got {op_id!r}")

        def plan(rec: LocationStatus, now: datetime) -> Plan:
            if rec.deleted:
                raise NotFound(
                    f"location {location!r} was removed at {rec.deleted_at:%Y-%m-%dT%H:%M:%SZ}"
                )
            return self._plan(
                rec, now, op_id, self._targets(rec, service), make_event,
                skip_refused=skip_refused,
            )

        rec = self._write(location, plan, op_id=op_id, if_version=if_version, use_hint=True)
        rec = self._settle_unwatched(rec, op_id, actor, reason)
        if wait is not None:
            rec = self.wait_settled(location, service, timeout=wait)
        return rec

    def _plan(
        self,
        rec: LocationStatus,
        now: datetime,
        op_id: str,
        targets: Sequence[str],
        make_event: Callable[[str], Event],
        *,
        skip_refused: bool = False,
    ) -> Plan:
        services = dict(rec.services)
        entries: list[HistoryEntry] = []
        refused: InvalidTransition | None = None
        for svc in targets:
            event = make_event(svc)
            try:
                change = transition(rec.location, svc, services[svc], event, now=now, op_id=op_id)
            except InvalidTransition as exc:
                if not skip_refused:
                    raise
                refused = exc
                continue
            if change is not None:
                services[svc] = change.status
                entries.append(change.entry)
        if refused is not None and len(entries) == 0 and all(
            not rec.services[s].paused for s in targets
        ):
            raise refused
        if not entries:
            return None
        return rec.model_copy(update={"services": services}), entries

    def _settle_unwatched(
        self, stored: LocationStatus, op_id: str, actor: str | None, reason: str | None
    ) -> LocationStatus:
        """After a write of this call (``op_id``) left services pausing/resuming: settle those
        no live worker (:func:`worker_live`) applies, in a write of their own, and return the
        record as it then is (docs/design.md §3: no live worker counts as all). The settle's
        history rows name this call's ``actor`` and ``reason`` (docs/cli.md, "Reading state").

        The worker list is read *after* the transitional record is visible, never in the
        planning of the write that made it (the ``one_write_settle`` finding of
        model/README.md): a worker registering after that read reads the pausing record, not
        the one before it; one registered before it is listed (the backend's
        :meth:`~locstatus.backends.base.Backend.workers` is as fresh as the write). A service
        another write touched since (its ``op_id`` is no longer ours) is left to that write or
        to a later :meth:`settle`. Returned: the record this call's settle wrote; when another
        process settled or changed it first (a sidecar's reconciler woken by the write), the
        record this call's own write stored, as after a lost reply (:meth:`_landed`): the
        caller still sees its ``op_id`` and version."""
        location = stored.location
        mine = [
            s
            for s, st in sorted(stored.services.items())
            if st.op_id == op_id and st.state.transitional
        ]
        if not mine or stored.deleted:
            return stored
        try:
            return self._settle_mine(stored, mine, op_id, actor, reason)
        except LocstatusError as exc:
            # The call's own write landed: report that, not this error. What stays
            # transitional is settled by the next settle() (reconciler, check --repair,
            # wait=), as for any write whose settle did not happen.
            log.warning(
                "location %s: op %s left %s pausing/resuming and could not settle it (%s); "
                "the next settle does (sidecar reconciler, check --repair, wait=)",
                location, op_id, ", ".join(mine), exc,
            )
            return stored

    def _settle_mine(
        self,
        stored: LocationStatus,
        mine: Sequence[str],
        op_id: str,
        actor: str | None,
        reason: str | None,
    ) -> LocationStatus:
        location = stored.location
        live = [w for w in self.backend.workers() if worker_live(w, self.time)]
        unwatched = {
            s: stored.services[s].generation
            for s in mine
            if not any(w.applies(location, s) for w in live)
        }
        if not unwatched:
            return stored

        def plan(rec: LocationStatus, now: datetime) -> Plan:
            if rec.deleted:
                return None
            ready = [
                s
                for s, generation in unwatched.items()
                if (st := rec.services.get(s)) is not None
                and st.op_id == op_id
                and st.generation == generation
                and st.state.transitional
            ]
            return self._plan(
                rec, now, op_id, ready,
                lambda s: Event(
                    "settle", generation=unwatched[s], acked=True, actor=actor, reason=reason
                ),
            )

        after = self._write(location, plan, op_id=op_id, use_hint=True)
        if any(
            (st := after.services.get(s)) is not None and st.op_id == op_id
            and not st.state.transitional
            for s in unwatched
        ):
            return after  # settled by this call
        return stored  # settled or changed by another call first: what this call wrote

    def _write(
        self,
        location: str,
        plan: Callable[[LocationStatus, datetime], Plan],
        *,
        op_id: str,
        if_version: int | None = None,
        use_hint: bool = False,
    ) -> LocationStatus:
        """Read, plan, compare-and-set; retry conflicts; resolve ambiguity by op_id.

        The first attempt runs outside the retry policy (no contention is the common case);
        after a conflict, attempts continue under the bounded, jittered policy. With
        ``use_hint``, a zeroth attempt plans from the version hint instead of a read (see the
        module docstring); whatever it cannot settle by a successful write goes on as usual."""
        ambiguity = _Ambiguity()
        hint = self._hints.get(location) if use_hint else None
        if hint is not None:
            try:
                return self._attempt(location, plan, op_id, if_version, ambiguity, known=hint)
            except _HintUnusable:
                pass
            except VersionConflict:
                if not ambiguity.sent:
                    self.stats["stale_hints"] += 1
            except BackendUnavailable as exc:
                self._raise_unresolved(exc, op_id, ambiguity)
        try:
            return self._attempt(location, plan, op_id, if_version, ambiguity)
        except VersionConflict:
            pass
        except BackendUnavailable as exc:
            self._raise_unresolved(exc, op_id, ambiguity)
        policy = self.retry
        retrying = Retrying(
            retry=retry_if_exception_type(VersionConflict),
            stop=stop_after_attempt(policy.max_attempts - 1) | stop_after_delay(policy.max_seconds),
            wait=wait_random_exponential(multiplier=policy.base, max=policy.cap),
        )
        try:
            for attempt in retrying:
                with attempt:
                    return self._attempt(location, plan, op_id, if_version, ambiguity)
        except BackendUnavailable as exc:
            self._raise_unresolved(exc, op_id, ambiguity)
        except RetryError as exc:
            raise ConflictError(
                f"location {location!r}: compare-and-set kept conflicting "
                f"({exc.last_attempt.attempt_number + 1} attempts); try again"
            ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def _raise_unresolved(exc: BackendUnavailable, op_id: str, ambiguity: _Ambiguity) -> NoReturn:
        """After an ambiguous commit, an unreachable backend leaves the outcome unknown: say
        so, with the op_id to look for (docs/design.md §3.2), rather than a plain 'unavailable'."""
        if ambiguity.sent and not isinstance(exc, AmbiguousCommit):
            raise AmbiguousCommit(
                f"{exc}; the write may or may not have been applied: look for op_id {op_id} "
                "in the history"
            ) from exc
        raise exc

    def _attempt(
        self,
        location: str,
        plan: Callable[[LocationStatus, datetime], Plan],
        op_id: str,
        if_version: int | None,
        ambiguity: _Ambiguity,
        *,
        known: LocationStatus | None = None,
    ) -> LocationStatus:
        """One read-plan-write. Raises VersionConflict to be retried (also after an ambiguous
        commit, which records what was sent so the next read first looks for ``op_id``).
        ``known``: plan from this version hint instead of reading; raises
        :class:`_HintUnusable` unless the plan is a write (which the compare-and-set checks)."""
        if known is not None:
            rec = known
            if if_version is not None and rec.version != if_version:
                raise _HintUnusable
            try:
                planned = plan(rec, self.clock())
            except (InvalidTransition, NotFound, InvalidInput):
                raise _HintUnusable from None  # judged again on a fresh read
            if planned is None:
                raise _HintUnusable  # "nothing to do" is only true of a fresh read
        else:
            try:
                rec = self.backend.read(location)
            except NotFound:
                self._hints.drop(location)
                raise
            self._hints.put(rec)
            if ambiguity.sent:
                landed = self._landed(rec, op_id, ambiguity)
                if landed is not None:
                    return landed
            if if_version is not None and rec.version != if_version:
                raise PreconditionFailed(
                    f"location {location!r} is at version {rec.version}, not {if_version}"
                )
            planned = plan(rec, self.clock())
            if planned is None:
                return rec
        new, entries = planned
        try:
            stored = self.backend.compare_and_set(new, rec.version, entries)
        except VersionConflict:
            if known is None:
                self.stats["conflicts"] += 1
            raise
        except AmbiguousCommit as exc:
            self.stats["ambiguous"] += 1
            ambiguity.sent[rec.version + 1] = new.model_copy(update={"version": rec.version + 1})
            raise VersionConflict(f"ambiguous commit, resolving: {exc}") from exc
        self.stats["writes"] += 1
        self._hints.put(stored)
        return stored

    def _landed(
        self, rec: LocationStatus, op_id: str, ambiguity: _Ambiguity
    ) -> LocationStatus | None:
        """After an ambiguous commit: the record our write stored if it landed, else None.

        Each write whose outcome was unknown would have produced one version: it landed if and
        only if the history write at exactly that version carries ``op_id`` (Backend
        invariant 9), however many writes followed it, so the answer never depends on how far
        back a search looks. Found as the current record: that record. Found in an older write:
        the record exactly as our write stored it, so the caller still sees its op_id and
        version (docs/design.md §3.2). A version above the record's was not written (yet)."""
        for version in sorted(ambiguity.sent):
            if version > rec.version:
                continue
            if version == rec.version and any(s.op_id == op_id for s in rec.services.values()):
                return rec  # our write is the current record
            try:
                entries = self.backend.history_write(rec.location, version)
            except CorruptRecord as exc:
                raise AmbiguousCommit(
                    f"location {rec.location!r}: the history write at version {version} does "
                    f"not parse ({exc.detail}): the write may or may not have been applied: "
                    f"look for op_id {op_id} in the history"
                ) from exc
            if any(e.op_id == op_id for e in entries):
                return ambiguity.sent[version]
        return None

    def _record_entry(
        self, location: str, event: str, op_id: str, now: datetime, actor: str | None,
        service: str = "*",
    ) -> HistoryEntry:
        return HistoryEntry(
            op_id=op_id, at=now, location=location, service=service, event=event, actor=actor
        )

    def _normalise_locations(
        self, locations: Iterable[str] | Mapping[str, Iterable[str]]
    ) -> dict[str, tuple[str, ...]]:
        if isinstance(locations, str):
            raise InvalidInput("locations must be a list of names or a mapping, not a string")
        items = (
            locations.items()
            if isinstance(locations, Mapping)
            else ((name, self.services) for name in locations)
        )
        out: dict[str, tuple[str, ...]] = {}
        for name, svcs in items:
            check_location(name)
            canon = sorted({canonical_service(s, self.services) for s in svcs})
            out[name] = tuple(sorted(set(out.get(name, ())) | set(canon)))
        return out

    def _add(
        self,
        location: str,
        services: Sequence[str],
        actor: str | None,
        report: SyncReport,
        *,
        exists: bool,
    ) -> None:
        """Create ``location``, or restore it / add its missing services when it exists. A
        record purged between the two (the check job removing a ready tombstone) is created
        again rather than reported as NotFound; bounded, then :class:`ConflictError`."""
        for _ in range(_ADD_ATTEMPTS):
            if not exists and self._create(location, services, actor=actor):
                report.added.append(location)
                return
            try:
                self._ensure(location, services, actor, report)
                return
            except NotFound:
                exists = False  # purged meanwhile: create it
        raise ConflictError(
            f"location {location!r} kept disappearing while it was being added; try again"
        )

    def _create(self, location: str, services: Sequence[str], *, actor: str | None) -> bool:
        now = self.clock()
        op_id = new_op_id()
        rec = LocationStatus(
            location=location,
            services={s: ServiceStatus(op_id=op_id, updated_at=now, actor=actor) for s in services},
        )
        try:
            self.backend.create(rec, [self._record_entry(location, "create", op_id, now, actor)])
        except AlreadyExists:
            return False
        return True

    def _ensure(
        self, location: str, services: Sequence[str], actor: str | None, report: SyncReport
    ) -> None:
        op_id = new_op_id()
        outcome: dict[str, object] = {}

        def plan(rec: LocationStatus, now: datetime) -> Plan:
            outcome.clear()
            entries: list[HistoryEntry] = []
            update: dict[str, object] = {}
            if rec.deleted:
                update["deleted_at"] = None
                entries.append(self._record_entry(location, "restore", op_id, now, actor))
                outcome["restored"] = True
            missing = [s for s in services if s not in rec.services]
            if missing:
                svcs = dict(rec.services)
                for s in missing:
                    svcs[s] = ServiceStatus(op_id=op_id, updated_at=now, actor=actor)
                    entries.append(
                        self._record_entry(location, "add_service", op_id, now, actor, s)
                    )
                update["services"] = svcs
                outcome["services"] = missing
            if not entries:
                return None
            return rec.model_copy(update=update), entries

        self._write(location, plan, op_id=op_id)
        if outcome.get("restored"):
            report.restored.append(location)
        if "services" in outcome:
            report.services_added[location] = list(outcome["services"])  # type: ignore[call-overload]
        if not outcome:
            report.unchanged.append(location)

    def wait_settled(
        self, location: str, service: ServiceArg = None, *, timeout: float
    ) -> LocationStatus:
        """Block until the targeted services are no longer pausing/resuming, settling them
        when every live worker has acknowledged. Raises :class:`SettleTimeout` after
        ``timeout`` seconds (this process's monotonic clock), naming the lagging workers (and
        the clock's problem when it refused to count a lapsed lease; docs/time.md)."""
        deadline = time.monotonic() + timeout
        woken = threading.Event()
        unsubscribe = self.backend.subscribe(lambda _hint: woken.set())
        try:
            while True:
                woken.clear()
                rec = self.settle(location, service)
                targets = self._targets(rec, service)
                pending = [s for s in targets if rec.services[s].state.transitional]
                if not pending:
                    return rec
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    workers = self.backend.workers()
                    acks = self.backend.acks(location)
                    lagging = sorted(
                        {
                            w
                            for s in pending
                            for w in lagging_workers(
                                location, s, rec.services[s].generation, workers, acks,
                                self.time,
                            )
                        }
                    )
                    stuck = stuck_handlers(workers, lagging, self.clock())
                    named = [w + (f" ({stuck[w]})" if w in stuck else "") for w in lagging]
                    problem = self.time.problem()
                    raise SettleTimeout(
                        f"{location}: {', '.join(pending)} still "
                        f"{'/'.join(sorted({rec.services[s].state.value for s in pending}))} "
                        f"after {timeout:g}s; lagging workers: {', '.join(named) or 'none'}"
                        + (
                            f"; not settling without them while the {problem} (docs/time.md)"
                            if problem
                            else ""
                        ),
                        lagging,
                        {
                            w.worker_id: sorted(w.stuck)
                            for w in workers
                            if w.worker_id in stuck
                        },
                    )
                woken.wait(min(remaining, 0.25))
        finally:
            unsubscribe()
