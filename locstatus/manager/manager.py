"""The :class:`Manager`: the public face of the manager package, thin methods over its parts.

Each method validates what it can before any I/O and makes one call into a part: reads
(:mod:`.reads`), operator events (:mod:`.operator`), reconcile primitives (:mod:`.reconcile`),
location sync (:mod:`.locations`) and the bulk operation (:mod:`.bulk`), all of them writing
through the one compare-and-set loop (:mod:`.writes`). The class holds no state beyond the
:class:`~.core.Core` those parts share (the backend, its time, the configured services and the
write loop with its version hints).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta

from locstatus.backend_clock import time_source_for
from locstatus.backends.base import Backend
from locstatus.clock import CallerClock, Clock, TimeSource
from locstatus.errors import CorruptRecord, LocstatusError
from locstatus.models import HistoryEntry, LocationStatus, WorkerInfo
from locstatus.names import DEFAULT_SERVICES, check_location, check_worker_id

from . import bulk, operator, reads, reconcile
from . import locations as sync
from .bulk import BulkReport, Progress
from .core import Core
from .locations import SyncReport
from .operator import Operation
from .plans import ServiceArg, check_free_text
from .reads import Listing
from .workers import WorkerReport, retire_worker, worker_statuses
from .writes import RetryPolicy, Writer


class Manager:
    """Pause, resume and schedule services per location, on any backend.

    Usage::

        from locstatus import connect
        mgr = connect("sqlite:///./locstatus.db")
        mgr.sync_locations(["us-east-1"])
        mgr.pause("us-east-1", "replication", reason="maintenance", actor="ops")
        mgr.resume("us-east-1", "replication", at=timedelta(hours=2))
        mgr.status("us-east-1").services["replication"].state   # State.PAUSED
        mgr.bulk(Operation.pause("replication", reason="outage"), wait=30)  # every location

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
        writer = Writer(backend, self.clock, self.retry)
        self._core = Core(backend, self.time, self.services, writer)
        self.stats = self._core.writer.stats
        """Counts of this manager's writes: ``writes``, ``conflicts``, ``ambiguous`` (commits
        whose outcome was unknown), ``stale_hints`` (version hints a write found stale)."""

    # -- reads -----------------------------------------------------------------------------

    def status(self, location: str) -> LocationStatus:
        """The record of ``location``. Raises :class:`NotFound`, :class:`CorruptRecord`,
        :class:`InvalidInput` (bad name), :class:`BackendUnavailable`."""
        return self._core.writer.read(check_location(location))

    def statuses(self, *, include_removed: bool = False) -> list[LocationStatus]:
        """Every readable record, sorted by location (tombstones only if asked). Corrupt
        records are skipped here (the reconciler's passes, the agent's lag view); wherever
        records are listed for a person, :meth:`listing` gives them beside the others."""
        return reads.statuses(self._core, include_removed=include_removed)

    def listing(self, *, include_removed: bool = False) -> Listing:
        """:meth:`statuses` with the corrupt records beside them, for whatever lists records
        (the HTTP list and the ``all`` routes, the status page, ``locstatus status``): a record
        that cannot be read is shown as an error there, never left out. Raises
        :class:`BackendUnavailable`."""
        return reads.listing(self._core, include_removed=include_removed)

    def scan(self) -> list[LocationStatus | CorruptRecord]:
        """Every record, corrupt ones as :class:`CorruptRecord` values (for the check job)."""
        return reads.scan(self._core)

    def history(
        self, location: str, limit: int = 50, *, before_version: int | None = None
    ) -> list[HistoryEntry]:
        """History of ``location``, newest first (``limit`` entries, 1..10000)."""
        return reads.history(self._core, location, limit, before_version=before_version)

    def workers(self) -> list[WorkerInfo]:
        """Registered workers (expired ones included; see :meth:`WorkerInfo.alive`)."""
        return self.backend.workers()

    def worker_statuses(self) -> WorkerReport:
        """Every registered worker with its liveness (``alive``) and where it lags behind a
        change (``lagging``, ``lag_unknown``): the one shape ``GET /v1/workers`` and
        ``locstatus workers --json`` serve (:mod:`.workers`), with the corrupt records beside.
        Raises :class:`BackendUnavailable`."""
        return worker_statuses(self._core)

    def retire_worker(
        self, worker_id: str, *, actor: str | None = None, force: bool = False,
        on_wait: Callable[[WorkerInfo, float], None] | None = None,
    ) -> WorkerInfo:
        """End ``worker_id``'s registration (a standing one outlives its holder, docs/agent.md
        "Standing registrations"): removed with its acknowledgements, so it stops counting for
        settle at once; logged on ``locstatus.audit`` naming ``actor`` (free text, 256
        characters). A standing registration is never removed while its holder is present (its
        lease holds; on ZooKeeper its holder node exists): a pause would settle without what it
        stands for. Without ``force`` that is refused at once with :class:`HolderPresent`,
        naming the holder's host and pid; with ``force`` it waits for the holder to be away (at
        most until its lease runs out, on ZooKeeper one session timeout) and retires then, for
        a holder known gone whose lease has not run out yet, or raises :class:`HolderPresent`
        when the holder turns out to run (it wrote its registration meanwhile, or is still
        present); ``on_wait(registration, seconds)`` is called once before that wait, with
        the most it can last. Returns the registration as listed just before. Raises
        :class:`InvalidInput` (bad id or actor, before any I/O), :class:`NotFound` (not
        registered), :class:`HolderPresent`, :class:`BackendUnavailable`."""
        check_worker_id(worker_id)
        check_free_text(None, actor)
        return retire_worker(self._core, worker_id, actor, force=force, on_wait=on_wait)

    def lagging(self, location: str, service: str) -> list[str]:
        """Live workers that have not acknowledged the current generation of a service."""
        return reads.lagging(self._core, location, service)

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
        """Pause services (docs/design.md §3 ``pause``): running/resuming -> pausing; a pause
        of a paused service cancels its scheduled resume, else it is a no-op. ``wait``
        seconds: block until settled (:class:`SettleTimeout` names the lagging workers).
        ``if_version``: refuse with :class:`PreconditionFailed` unless the record is at that
        version (the pausing write's; when no live worker applies the service, its settle
        follows as the next write, and the call returns that record). ``reason`` (at most
        1024 characters) and ``actor`` (256) are free text without control characters
        (:func:`~locstatus.names.check_text`, :class:`InvalidInput` otherwise)."""
        check_free_text(reason, actor)
        return operator.operate(
            self._core, location, operator.Operation.pause(service, reason=reason, actor=actor),
            wait=wait, if_version=if_version, op_id=op_id,
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
        as :meth:`pause` does. ``wait`` is ignored for a scheduled resume (nothing to
        settle)."""
        check_free_text(reason, actor)
        op = operator.Operation.resume(service, at=at, reason=reason, actor=actor)
        return operator.operate(
            self._core, location, op, wait=wait if at is None else None,
            if_version=if_version, op_id=op_id,
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
        check_free_text(reason, actor)
        op = operator.Operation.cancel_scheduled_resume(service, reason=reason, actor=actor)
        return operator.operate(self._core, location, op, if_version=if_version, op_id=op_id)

    def apply(
        self,
        location: str,
        operation: Operation,
        *,
        wait: float | None = None,
        if_version: int | None = None,
        op_id: str | None = None,
    ) -> LocationStatus:
        """Run ``operation`` (:class:`~.operator.Operation`) on one location: what
        :meth:`pause`, :meth:`resume` and :meth:`cancel_scheduled_resume` do, for a front end
        that holds the operation as a value (the sidecar's routes build one per request and
        run it on one location here or on ``all`` with :meth:`bulk`). ``wait``,
        ``if_version`` and ``op_id`` as :meth:`pause`; errors as the matching method."""
        return operator.operate(
            self._core, location, operation, wait=wait, if_version=if_version, op_id=op_id
        )

    def bulk(
        self,
        operation: Operation,
        locations: Iterable[str] | None = None,
        *,
        wait: float | None = None,
        progress: Progress | None = None,
        op_id: str | None = None,
    ) -> BulkReport:
        """Run ``operation`` (:class:`~.operator.Operation`: a pause, a resume now or
        scheduled, a cancel) on every location that is not removed (``locations`` None: the
        ``all`` of the CLI and the HTTP routes) or on each of ``locations``; return the
        :class:`~.bulk.BulkReport` of every location (changed, unchanged, skipped with why,
        failed with the error), and decide once whether the operation as a whole was refused
        (:attr:`~.bulk.BulkReport.refusal`: no location stored, or every one skipped).

        Each location is its own compare-and-set on its own version (a conflict re-reads and
        re-applies that location only); a location without any of the targeted services is
        skipped, so is one with nothing paused for a scheduled resume; a corrupt or unknown
        one fails. ``wait`` seconds (pause and resume): one shared deadline for every
        location, a location still settling then fails with a :class:`SettleTimeout` naming
        its lagging workers. ``progress(item, done, total)`` is called per location as it is
        decided. ``op_id``: the id every write of the operation carries (default: a fresh
        one). Ctrl-C raises :class:`~.bulk.BulkInterrupted` (a ``KeyboardInterrupt``) with
        the report of what was done. Raises :class:`InvalidInput` (bad operation, location
        names, wait, op_id) before any I/O, :class:`BackendUnavailable` when the store
        cannot be listed. Design: :mod:`locstatus.manager.bulk`."""
        return bulk.run(
            self._core, operation, locations, wait=wait, progress=progress, op_id=op_id
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
        right after, as an operator's call does (:func:`~.reconcile.settle_unwatched`)."""
        check_free_text(None, actor)
        return reconcile.fire_due_resumes(self._core, location, services, actor=actor)

    def settle(self, location: str, service: ServiceArg = None) -> LocationStatus:
        """Settle pausing -> paused / resuming -> running for services whose current generation
        every live worker has acknowledged (none live counts as all). A worker counts as live
        until its lease has passed by the backend's time beyond doubt (:func:`worker_live
        <locstatus.manager.liveness.worker_live>`)."""
        return reconcile.settle(self._core, location, service)

    def settle_many(
        self,
        locations: Sequence[str],
        service: ServiceArg = None,
        *,
        known: Mapping[str, LocationStatus] | None = None,
    ) -> dict[str, LocationStatus | LocstatusError]:
        """:meth:`settle` for many locations at once (a bulk change's acknowledgements, an
        agent's due settles): read, checked and written in batches, each location still its own
        compare-and-set on its own version with its history (docs/design.md §4, "Batches"),
        settled only when every live worker acknowledged its current generation. Returns
        location -> its record after the settle, or the :class:`LocstatusError` it ended with
        (a conflict or error at one location fails no other). Raises :class:`InvalidInput` for
        a bad location name or ``service``, nothing read. ``known``: records this process
        holds (an agent's local copy); a location where some live worker has not acknowledged
        the known record's generation yet is not read, its known record returned
        (:func:`~.reconcile.settle_many`)."""
        return reconcile.settle_many(self._core, locations, service, known=known)

    def wait_settled(
        self, location: str, service: ServiceArg = None, *, timeout: float
    ) -> LocationStatus:
        """Block until the targeted services are no longer pausing/resuming, settling them
        when every live worker has acknowledged. Raises :class:`SettleTimeout` after
        ``timeout`` seconds (this process's monotonic clock), naming the lagging workers (and
        the clock's problem when it refused to count a lapsed lease; docs/time.md)."""
        return reconcile.wait_settled(self._core, location, service, timeout=timeout)

    # -- locations -------------------------------------------------------------------------

    def sync_locations(
        self,
        locations: Iterable[str] | Mapping[str, Iterable[str]],
        *,
        actor: str | None = None,
        remove_missing: bool = True,
        dry_run: bool = False,
    ) -> SyncReport:
        """Make the stored locations match ``locations``: a list of names (every configured
        service) or a mapping name -> services (docs/design.md §5.2). Adds missing locations and
        services, restores tombstoned ones, and tombstones locations not listed (docs/design.md
        §3.5) unless ``remove_missing`` is False (then they are ``kept`` in the report). A
        listed location whose stored record is corrupt is left untouched and named in
        ``corrupt``. All names (and ``actor``) are validated before anything is written.
        ``dry_run``: write nothing and report what the sync would do, by the same rules."""
        return sync.sync_locations(
            self._core, locations, actor=actor, remove_missing=remove_missing, dry_run=dry_run
        )

    def add_location(
        self, location: str, services: Iterable[str] | None = None, *, actor: str | None = None
    ) -> LocationStatus:
        """Create (or restore) one location with ``services`` (default: all configured)."""
        return sync.add_location(self._core, location, services, actor=actor)

    def remove_location(self, location: str, *, actor: str | None = None) -> LocationStatus:
        """Tombstone a location (docs/design.md §3.5): ``deleted_at`` is set, workers see it and
        acknowledge it, and the check job purges it later. No-op if already removed."""
        return sync.remove_location(self._core, location, actor=actor)

    def purge_location(self, location: str, expected_version: int) -> None:
        """Delete a tombstoned record for good (check job). Raises :class:`VersionConflict`
        if it changed since it was read, :class:`InvalidTransition` if it is not a tombstone."""
        sync.purge_location(self._core, location, expected_version)

    def close(self) -> None:
        """Close the backend."""
        self.backend.close()

    def __enter__(self) -> Manager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
