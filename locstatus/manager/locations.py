"""Location sync: make the stored locations match a list (docs/design.md §5.2, §3.5).

:func:`sync_locations` reads every record once, decides per location what the list asks for with
the pure :func:`sync_change` (create, restore, add services, nothing, tombstone) and, unless it is
a dry run, makes each change as a compare-and-set write of its own; the locations absent from
the store are created a batch at a time (:meth:`~locstatus.backends.base.Backend.create_many`,
as many as the backend's ``batch_size``: one SQLite transaction for a thousand), each still its
own create, one that appeared meanwhile added to as a stored one.
The dry run and the real run are one function, so what ``--dry-run`` shows is what a
sync does, corrupt records included: a listed location whose stored record is corrupt is never
rewritten (the check job reports it) and is named in the report.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from locstatus.errors import (
    AlreadyExists,
    ConflictError,
    CorruptRecord,
    InvalidInput,
    InvalidTransition,
    LocstatusError,
    NotFound,
)
from locstatus.models import HistoryEntry, LocationStatus, ServiceStatus, new_op_id
from locstatus.names import canonical_service, check_location

from .collector import collection_paused
from .core import Core
from .creates import new_record, new_records
from .plans import NOTHING, Decision, Write, check_free_text, record_entry

ADD_ATTEMPTS = 5
"""Create/restore rounds of :func:`_add` when a purge keeps racing it."""


@dataclass
class SyncReport:
    """What :meth:`Manager.sync_locations <locstatus.manager.Manager.sync_locations>` changed,
    or would change when ``dry_run`` (location names, sorted)."""

    added: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    services_added: dict[str, list[str]] = field(default_factory=dict)
    unchanged: list[str] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)
    """Listed locations whose stored record is corrupt: left untouched."""
    kept: list[str] = field(default_factory=list)
    """Stored locations the list does not name, kept because ``remove_missing`` was False."""
    dry_run: bool = False
    """True when nothing was written: the report says what a sync would do."""

    @property
    def changed(self) -> bool:
        return bool(self.added or self.restored or self.removed or self.services_added)


@dataclass(frozen=True, slots=True)
class SyncChange:
    """What a sync asks of one stored record: ``restore`` it (it is a tombstone) and/or add
    ``missing`` services (both empty: unchanged)."""

    restore: bool
    missing: tuple[str, ...]

    @property
    def unchanged(self) -> bool:
        return not self.restore and not self.missing


def sync_change(rec: LocationStatus, services: Sequence[str]) -> SyncChange:
    """The change a sync to ``services`` makes to the stored ``rec`` (pure)."""
    return SyncChange(rec.deleted, tuple(s for s in services if s not in rec.services))


def normalise_locations(
    locations: Iterable[str] | Mapping[str, Iterable[str]], configured: Sequence[str]
) -> dict[str, tuple[str, ...]]:
    """``locations`` as name -> sorted canonical services (a list of names gets every
    configured service). Raises :class:`InvalidInput` for a string, a bad name or service."""
    if isinstance(locations, str):
        raise InvalidInput("locations must be a list of names or a mapping, not a string")
    items = (
        locations.items()
        if isinstance(locations, Mapping)
        else ((name, configured) for name in locations)
    )
    out: dict[str, tuple[str, ...]] = {}
    for name, svcs in items:
        check_location(name)
        canon = sorted({canonical_service(s, configured) for s in svcs})
        out[name] = tuple(sorted(set(out.get(name, ())) | set(canon)))
    return out


def sync_locations(
    core: Core,
    locations: Iterable[str] | Mapping[str, Iterable[str]],
    *,
    actor: str | None = None,
    remove_missing: bool = True,
    dry_run: bool = False,
) -> SyncReport:
    """See :meth:`Manager.sync_locations <locstatus.manager.Manager.sync_locations>` (run
    with the cyclic collector held off: :mod:`.collector`)."""
    with collection_paused():
        return _sync(core, locations, actor=actor, remove_missing=remove_missing,
                     dry_run=dry_run)


def _sync(
    core: Core,
    locations: Iterable[str] | Mapping[str, Iterable[str]],
    *,
    actor: str | None,
    remove_missing: bool,
    dry_run: bool,
) -> SyncReport:
    check_free_text(None, actor)
    wanted = normalise_locations(locations, core.services)
    report = SyncReport(dry_run=dry_run)
    existing = {r.location: r for r in core.backend.read_all()}
    creates: list[str] = []  # new locations, created a batch at a time (create_many)
    size = max(1, core.backend.batch_size)
    for loc in sorted(wanted):
        svcs = wanted[loc]
        rec = existing.get(loc)
        if rec is None and not dry_run:
            creates.append(loc)
            if len(creates) >= size:
                _create_batch(core, creates, wanted, actor, report)
            continue
        _create_batch(core, creates, wanted, actor, report)
        if isinstance(rec, CorruptRecord):
            report.corrupt.append(loc)  # never rewritten; the check job reports it
        elif dry_run:
            _report(report, loc, None if rec is None else sync_change(rec, svcs))
        else:
            _add(core, loc, svcs, actor, report, exists=True)
    _create_batch(core, creates, wanted, actor, report)
    for loc, item in sorted(existing.items()):
        if loc in wanted or not isinstance(item, LocationStatus) or item.deleted:
            continue
        if not remove_missing:
            report.kept.append(loc)
            continue
        if not dry_run:
            remove_location(core, loc, actor=actor)
        report.removed.append(loc)
    return report


def add_location(
    core: Core, location: str, services: Iterable[str] | None = None, *, actor: str | None = None
) -> LocationStatus:
    """See :meth:`Manager.add_location <locstatus.manager.Manager.add_location>`."""
    check_free_text(None, actor)
    svcs = normalise_locations({location: services or core.services}, core.services)
    _add(core, location, svcs[location], actor, SyncReport(), exists=False)
    return core.writer.read(location)


def remove_location(core: Core, location: str, *, actor: str | None = None) -> LocationStatus:
    """See :meth:`Manager.remove_location <locstatus.manager.Manager.remove_location>`."""
    check_location(location)
    check_free_text(None, actor)
    op_id = new_op_id()

    def plan(rec: LocationStatus, now: datetime) -> Decision:
        if rec.deleted:
            return NOTHING
        entry = record_entry(rec.location, "remove", op_id, now, actor)
        return Write(rec.model_copy(update={"deleted_at": now}), [entry])

    return core.writer.write(location, plan, op_id=op_id)


def purge_location(core: Core, location: str, expected_version: int) -> None:
    """See :meth:`Manager.purge_location <locstatus.manager.Manager.purge_location>`."""
    rec = core.writer.read(location)
    if not rec.deleted:
        raise InvalidTransition(f"location {location!r} is not removed; refusing to purge")
    core.backend.delete(location, expected_version)


def _report(report: SyncReport, location: str, change: SyncChange | None) -> None:
    """Count one location's outcome (``change`` None: created)."""
    if change is None:
        report.added.append(location)
        return
    if change.restore:
        report.restored.append(location)
    if change.missing:
        report.services_added[location] = list(change.missing)
    if change.unchanged:
        report.unchanged.append(location)


def _add(
    core: Core,
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
    for _ in range(ADD_ATTEMPTS):
        if not exists and _create(core, location, services, actor=actor):
            _report(report, location, None)
            return
        try:
            _report(report, location, _ensure(core, location, services, actor))
            return
        except NotFound:
            exists = False  # purged meanwhile: create it
    raise ConflictError(
        f"location {location!r} kept disappearing while it was being added; try again"
    )


def _create(core: Core, location: str, services: Sequence[str], *, actor: str | None) -> bool:
    try:
        core.backend.create(*_new_record(core, location, services, actor))
    except AlreadyExists:
        return False
    return True


def _new_record(
    core: Core, location: str, services: Sequence[str], actor: str | None
) -> tuple[LocationStatus, list[HistoryEntry]]:
    """A new location's record and the history of its create."""
    return new_record(location, services, core.clock(), actor, new_op_id())


def _create_batch(
    core: Core,
    locations: list[str],
    wanted: Mapping[str, Sequence[str]],
    actor: str | None,
    report: SyncReport,
) -> None:
    """Create ``locations`` (not stored when the sync read the store) in one
    :meth:`~locstatus.backends.base.Backend.create_many` (records and texts from templates,
    :mod:`.creates`), then empty the list. One created
    meanwhile by another process is added to through :func:`_add` alone; any other error is
    raised after the batch's creates are counted (as :func:`_create` raises it)."""
    if not locations:
        return
    items, texts = new_records(locations, wanted, core.clock(), actor)  # names checked
    results = core.backend.create_many(items, texts=texts)
    failure: LocstatusError | None = None
    for loc, result in zip(locations, results, strict=True):
        if isinstance(result, LocationStatus):
            _report(report, loc, None)
        elif isinstance(result, AlreadyExists):
            _add(core, loc, wanted[loc], actor, report, exists=True)
        elif failure is None:
            failure = result
    locations.clear()
    if failure is not None:
        raise failure


def _ensure(
    core: Core, location: str, services: Sequence[str], actor: str | None
) -> SyncChange:
    """Restore the stored ``location`` and add its missing ``services``; the change made (that
    of the record the write was planned from)."""
    op_id = new_op_id()
    made: list[SyncChange] = []

    def plan(rec: LocationStatus, now: datetime) -> Decision:
        change = sync_change(rec, services)
        made[:] = [change]
        if change.unchanged:
            return NOTHING
        entries: list[HistoryEntry] = []
        update: dict[str, object] = {}
        if change.restore:
            update["deleted_at"] = None
            entries.append(record_entry(location, "restore", op_id, now, actor))
        if change.missing:
            svcs = dict(rec.services)
            for s in change.missing:
                svcs[s] = ServiceStatus(op_id=op_id, updated_at=now, actor=actor)
                entries.append(record_entry(location, "add_service", op_id, now, actor, s))
            update["services"] = svcs
        return Write(rec.model_copy(update=update), entries)

    core.writer.write(location, plan, op_id=op_id)
    return made[0]
