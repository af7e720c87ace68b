"""One bulk operation for every location (``all``) or any list of them: the CLI's ``pause all``,
the sidecar's ``/v1/locations/all/...`` and the Backbeat routes all run this and only render it.

Shaped for the fleet (issue 21: 100 000 locations, batched writes per backend):

- **Streamed.** Records come from the store one batch at a time (:func:`_source`); each batch is
  planned per location purely (:meth:`~.operator.Operation.plan`, from the record just read,
  so the first compare-and-set needs no second read), then written through
  :meth:`~.writes.Writer.write_batch`, whose results stream back per location. Each location
  stays its own compare-and-set on its own version with its history in the same write;
  a conflict re-reads and re-applies that location only. Each batch is as large as the backend
  says (:attr:`~locstatus.backends.base.Backend.batch_size`) and goes to it as one
  :meth:`~locstatus.backends.base.Backend.compare_and_set_many` (many locations per SQLite
  transaction, pipelined ZooKeeper requests, one MongoDB ``bulk_write``); the settles of the
  changed locations no live worker applies follow as a second batch, the worker list read
  once per batch after its writes (:func:`~.reconcile.settle_unwatched_many`). What is held
  is one batch of plans and one compact :class:`BulkItem` per location, never the store
  twice.
- **One report, one verdict.** :class:`BulkReport` says per location ``changed``,
  ``unchanged``, ``skipped`` (with why) or ``failed`` (with the error); a corrupt record is a
  failed location, never left out. Whether the operation as a whole was refused is decided
  once, by :attr:`BulkReport.refusal` (no location stored, or every location skipped): the CLI
  exits with it (docs/cli.md, "Bulk: `all`"); the sidecar leaves skipped locations out of its
  answer and refuses only a schedule that no location takes (docs/http.md, "Bulk operations").
- **``wait=``** waits for every changed location at once until one shared deadline
  (:func:`~.reconcile.wait_all`); a location still settling then fails with its
  :class:`~locstatus.errors.SettleTimeout`, naming its lagging (and stuck) workers.
- **Progress and Ctrl-C.** ``progress(item, done, total)`` is called as each location is
  decided; a :class:`KeyboardInterrupt` stops the operation cleanly and raises
  :class:`BulkInterrupted` (a ``KeyboardInterrupt``) carrying the report of what was done, the
  locations whose write was in flight reported as failed with an outcome that is unknown
  (look for the operation's op_id in their history). A Ctrl-C that lands inside a pydantic
  serialization (a record's enum value, while a batch is encoded) reaches us wrapped in a
  ``PydanticSerializationError``: it is the same interrupt (:func:`interrupted`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from itertools import islice
from operator import attrgetter

from pydantic_core import PydanticSerializationError

from locstatus.errors import (
    AmbiguousCommit,
    CorruptRecord,
    InvalidInput,
    InvalidTransition,
    LocstatusError,
    NotFound,
)
from locstatus.models import LocationStatus, new_op_id
from locstatus.names import check_location

from .bulkplan import BulkPlan
from .collector import collection_paused
from .core import Core
from .operator import Operation
from .plans import Plan, check_op_id, check_wait
from .reconcile import settle_unwatched_many, wait_all
from .writes import WriteRequest


class Outcome(StrEnum):
    """What a bulk operation did at one location."""

    CHANGED = "changed"
    """This operation changed at least one service (its op_id is in the record)."""
    UNCHANGED = "unchanged"
    """Nothing to change (already paused, nothing scheduled...): nothing written."""
    SKIPPED = "skipped"
    """Outside the operation: the location has none of the services, or (a scheduled resume)
    nothing paused to take it. ``why`` says which."""
    FAILED = "failed"
    """The operation failed here (``error``): a corrupt record, a conflict that did not
    resolve, an unreachable backend, a wait that ran out..."""


@dataclass(frozen=True, slots=True)
class BulkItem:
    """One location's outcome (:class:`Outcome`).

    ``status``: the record after the operation (after the wait, with ``wait=``); for a skipped
    location the record as read; None when no record could be read. ``changed``: the services
    this operation changed. ``why``: for a skipped location. ``error``: for a failed one.
    ``rescheduled``: the services whose scheduled resume this operation (a schedule) moved,
    each with the time it had before: what a person is told as "rescheduled (was 12:39Z)"
    (docs/cli.md, "Bulk: `all`").
    """

    location: str
    outcome: Outcome
    status: LocationStatus | None = None
    changed: tuple[str, ...] = ()
    why: str | None = None
    error: LocstatusError | None = None
    rescheduled: tuple[tuple[str, datetime], ...] = ()


Progress = Callable[[BulkItem, int, int | None], None]
"""``progress(item, done, total)``: called once per location as it is decided (before any
wait); ``total`` is None when the source cannot tell in advance."""


@dataclass
class BulkReport:
    """Every location's outcome of one bulk operation, sorted by location.

    ``operation`` as checked (canonical services, an absolute resume time); ``op_id``: the one
    operation id every write of it carries (look for it in a location's history);
    ``interrupted``: the operation was stopped (Ctrl-C) before every location was reached;
    ``total``: how many locations it was to reach (None until the store was read), so that
    ``total - len(items)`` were never reached by an interrupted one.
    """

    operation: Operation
    op_id: str
    items: list[BulkItem] = field(default_factory=list)
    interrupted: bool = False
    total: int | None = None

    def of(self, outcome: Outcome) -> list[BulkItem]:
        """The items with this outcome."""
        return [i for i in self.items if i.outcome is outcome]

    @property
    def failed(self) -> list[BulkItem]:
        return self.of(Outcome.FAILED)

    @property
    def ok(self) -> bool:
        """No location failed and the operation was not refused or interrupted."""
        return not self.interrupted and self.refusal is None and not self.failed

    @property
    def refusal(self) -> LocstatusError | None:
        """The one rule for an operation that acted on no location (docs/cli.md, "Bulk:
        `all`"): none stored is :class:`NotFound` (CLI exit 1); every one skipped is
        :class:`InvalidTransition` (exit 1). None otherwise, and for an interrupted operation
        (it did not look at every location)."""
        if self.interrupted or any(i.outcome is not Outcome.SKIPPED for i in self.items):
            return None
        label = _LABELS[self.operation.event]
        if not self.items:
            return NotFound(
                f"{label}: no locations to act on (none is stored: import them first with "
                "'locstatus locations sync FILE')"
            )
        names = self.operation.names()
        what = " or ".join(names) if names else "service"
        if self.operation.schedules:
            return InvalidTransition(
                f"{label}: no location has a {what} paused to schedule a resume for "
                "(every location was skipped)"
            )
        return InvalidTransition(
            f"{label}: no location has a {what} to act on (every location was skipped)"
        )


class BulkInterrupted(KeyboardInterrupt):
    """A bulk operation stopped by Ctrl-C: ``report`` holds what was done (its
    ``interrupted`` is True). A :class:`KeyboardInterrupt`, so a caller that does not look
    at the report still stops."""

    def __init__(self, report: BulkReport) -> None:
        super().__init__(f"interrupted after {len(report.items)} locations")
        self.report = report


_LABELS = {
    "pause": "pause",
    "resume": "resume",
    "schedule_resume": "scheduled resume",
    "cancel_scheduled_resume": "cancel of the scheduled resume",
}

_Entry = LocationStatus | LocstatusError
"""What the source yields per location: its record, or why it could not be read."""


def run(
    core: Core,
    operation: Operation,
    locations: Iterable[str] | None = None,
    *,
    wait: float | None = None,
    progress: Progress | None = None,
    op_id: str | None = None,
) -> BulkReport:
    """See :meth:`Manager.bulk <locstatus.manager.Manager.bulk>` (run with the cyclic
    collector held off: :mod:`.collector`)."""
    report: BulkReport | None = None
    try:
        with collection_paused():
            report = _run(core, operation, locations, wait=wait, progress=progress, op_id=op_id)
    except KeyboardInterrupt as exc:
        if report is None or isinstance(exc, BulkInterrupted):
            raise
        # Every location was decided, and the Ctrl-C landed as the block ended (the collector's
        # first run after it, scanning the report's records, takes a fraction of a second):
        # still an interrupt, with the whole report, never a bare KeyboardInterrupt that loses
        # it (a CI run printed nothing and exited 130).
        report.interrupted = True
        raise BulkInterrupted(report) from None
    return report


def _run(
    core: Core,
    operation: Operation,
    locations: Iterable[str] | None = None,
    *,
    wait: float | None = None,
    progress: Progress | None = None,
    op_id: str | None = None,
) -> BulkReport:
    op = operation.checked(core.services, core.clock())
    check_wait(wait)
    op_id = new_op_id() if op_id is None else check_op_id(op_id)
    names = None if locations is None else _names(locations)
    report = BulkReport(op, op_id)
    decide = _Decider(op, op_id)
    requests: list[WriteRequest] = []  # the batch's writes in flight
    written: list[BulkItem] = []  # the batch's outcomes known, before its settles
    reported = 0  # how many of ``written`` are in the report
    try:
        total, batches = _source(core, names, max(1, core.backend.batch_size))
        report.total = total
        done = 0
        for batch in batches:
            requests, written, reported = [], [], 0
            for location, entry in batch:
                decided = decide(location, entry)
                if isinstance(decided, WriteRequest):
                    requests.append(decided)
                    continue
                report.items.append(decided)
                done += 1
                if progress is not None:
                    progress(decided, done, total)
            outcome, keep = decide.written, written.append
            for req, result in core.writer.write_batch(requests):
                keep(outcome(req, result))
            changed = [
                i.status for i in written if i.outcome is Outcome.CHANGED and i.status is not None
            ]
            settled = settle_unwatched_many(core, changed, op_id, op.actor, op.reason)
            for item in written:
                if settled and (after := settled.get(item.location)) is not None:
                    item = replace(item, status=after)
                report.items.append(item)
                reported += 1
                done += 1
                if progress is not None:
                    progress(item, done, total)
        if wait is not None and op.event in ("pause", "resume"):
            _wait(core, report, wait)
        report.items.sort(key=_by_location)
        return report
    except (KeyboardInterrupt, PydanticSerializationError) as exc:
        if not interrupted(exc):
            raise
        report.items.extend(written[reported:])
        known = {item.location for item in written}
        for req in requests:
            if req.location in known:
                continue
            report.items.append(
                BulkItem(
                    req.location,
                    Outcome.FAILED,
                    error=AmbiguousCommit(
                        f"location {req.location!r}: interrupted while writing: the write may "
                        f"or may not have been applied: look for op_id {op_id} in the history"
                    ),
                )
            )
        report.interrupted = True
        report.items.sort(key=_by_location)
        raise BulkInterrupted(report) from None


_by_location = attrgetter("location")


def interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is a Ctrl-C: a :class:`KeyboardInterrupt`, or the
    ``PydanticSerializationError`` pydantic wraps one in when the signal's handler ran inside
    its serializer (its ``__cause__`` with ``model_dump``, only its message with
    ``model_dump_json``)."""
    if isinstance(exc, KeyboardInterrupt) or isinstance(exc.__cause__, KeyboardInterrupt):
        return True
    return isinstance(exc, PydanticSerializationError) and "KeyboardInterrupt" in str(exc)


def _names(locations: Iterable[str]) -> list[str]:
    if isinstance(locations, str):
        raise InvalidInput("locations must be a list of names (or None for every location)")
    names = list(dict.fromkeys(check_location(name) for name in locations))
    if not names:
        raise InvalidInput("no location given")
    return names


def _source(
    core: Core, names: Sequence[str] | None, size: int
) -> tuple[int | None, Iterator[list[tuple[str, _Entry]]]]:
    """The operation's locations with their records, in order, in batches of ``size``: every
    stored one that is not removed (``names`` None), a corrupt one as its
    :class:`CorruptRecord`; or each of ``names``, an unknown one as :class:`NotFound`. Today
    every record of the store is one read (``read_all``), whose records are let go a batch at
    a time as they are handed out, and a named one one ``read`` each; a paged read slots in
    here."""
    if names is None:
        # our own list (a backend may keep its result), handed out from the end
        found = [
            item for item in core.backend.read_all()
            if isinstance(item, CorruptRecord) or not item.deleted
        ]
        found.reverse()

        def stored() -> Iterator[list[tuple[str, _Entry]]]:
            while found:
                batch = found[-size:]
                del found[-size:]
                batch.reverse()
                yield [(item.location, item) for item in batch]

        return len(found), stored()

    def each() -> Iterator[tuple[str, _Entry]]:
        for name in names:
            try:
                yield name, core.writer.read(name)
            except (NotFound, CorruptRecord) as exc:
                yield name, exc

    entries = each()
    return len(names), iter(lambda: list(islice(entries, size)), [])


class _Decider:
    """One operation's per-location decisions, what they share computed once (the targeted
    services, a plan per set of them, whether it schedules): a fleet pays only what differs
    per location."""

    def __init__(self, op: Operation, op_id: str) -> None:
        self.op, self.op_id = op, op_id
        self.wanted = op.names()
        self.schedules = op.schedules
        self.plans: dict[tuple[str, ...], Plan] = {}

    def __call__(self, location: str, entry: _Entry) -> WriteRequest | BulkItem:
        """Pure: the write request of one location, or its outcome when there is nothing to
        write (a record that cannot be read, a location without any targeted service). A plan
        is made once for every location with the same targeted services (a plan is pure: the
        same for any record)."""
        if isinstance(entry, LocstatusError):
            return BulkItem(location, Outcome.FAILED, error=entry)
        wanted = self.wanted
        if wanted is None:
            present: tuple[str, ...] = ()
        else:
            services = entry.services
            present = tuple([s for s in wanted if s in services])
            if not present:
                return BulkItem(
                    location, Outcome.SKIPPED, entry, why=f"has no {', '.join(wanted)}"
                )
        plan = self.plans.get(present)
        if plan is None:
            plan = self.plans[present] = self._plan(None if wanted is None else list(present))
        # the record replaced only where a report compares with it (a schedule's 'was')
        if self.schedules:
            return WriteRequest(location, plan, self.op_id, entry, False, [])
        return WriteRequest(location, plan, self.op_id, entry)

    def _plan(self, names: list[str] | None) -> Plan:
        """The plan of the locations whose targeted services are ``names`` (None: each its
        own): the operation's own, decided through :class:`~.bulkplan.BulkPlan`'s cases but
        for a schedule of every service (its refused services are left alone: the general
        plan's rule)."""
        general = self.op.plan(self.op_id, names)
        if self.schedules and names is None:
            return general
        return BulkPlan(self.op.make_event(""), self.op_id, names, general)

    def written(self, req: WriteRequest, result: LocationStatus | LocstatusError) -> BulkItem:
        """One location's outcome from its write."""
        if isinstance(result, LocstatusError):
            if self.schedules and isinstance(result, InvalidTransition):
                # a location with nothing paused simply has nothing to schedule
                return BulkItem(
                    req.location, Outcome.SKIPPED, req.known, why="nothing paused to schedule"
                )
            return BulkItem(req.location, Outcome.FAILED, error=result)
        op_id, services = self.op_id, result.services
        mine = [s for s, st in services.items() if st.op_id == op_id]
        if len(mine) > 1:
            mine.sort()
        changed = tuple(mine)
        if not changed:
            return BulkItem(req.location, Outcome.UNCHANGED, result)
        before = req.replaced[-1] if self.schedules and req.replaced else None
        if before is None:
            return BulkItem(req.location, Outcome.CHANGED, result, changed)
        moved = tuple(
            (s, was)
            for s in changed
            if s in before.services
            and (was := before.services[s].resume_at) is not None
            and was != services[s].resume_at
        )
        return BulkItem(req.location, Outcome.CHANGED, result, changed, rescheduled=moved)


def _wait(core: Core, report: BulkReport, wait: float) -> None:
    """Wait for every written location still pausing/resuming, one shared deadline."""
    names = report.operation.names()
    pending: dict[str, list[str] | None] = {}
    for item in report.items:
        rec = item.status
        if item.outcome in (Outcome.CHANGED, Outcome.UNCHANGED) and rec is not None:
            chosen = sorted(rec.services) if names is None else [
                s for s in names if s in rec.services
            ]
            if any(rec.services[s].state.transitional for s in chosen):
                pending[item.location] = chosen
    if not pending:
        return
    settled = wait_all(core, pending, timeout=wait)
    for i, item in enumerate(report.items):
        outcome = settled.get(item.location)
        if isinstance(outcome, LocationStatus):
            report.items[i] = replace(item, status=outcome)
        elif isinstance(outcome, LocstatusError):
            report.items[i] = replace(item, outcome=Outcome.FAILED, error=outcome)
