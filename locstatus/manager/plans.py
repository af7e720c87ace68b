"""Pure planning: what one write to one location would be, decided from a record without I/O.

Every mutation of the manager is "read, plan, write" (docs/design.md §3.1). This module is the
middle step and nothing else: given a record and the time, a plan answers with a
:data:`Decision`, a value, never by raising:

- :class:`Write`: the new record and the history entries of the same atomic write;
- :data:`NOTHING`: the event changes nothing (an idempotent no-op: nothing is written);
- :class:`Refuse`: the operation is refused on this record (a removed location, a service it
  does not have, a transition the state machine refuses), carrying the error to raise.

Because a decision is a value, the write loop (:mod:`.writes`) can plan from a version hint and
simply read the record when the hint decided anything but a write, and a bulk operation can plan
each location from the record its scan already holds (:mod:`.bulk`): no control flow by
exception, no I/O inside a plan.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from locstatus.errors import InvalidInput, InvalidTransition, LocstatusError, NotFound
from locstatus.fsm import Event, transition
from locstatus.models import HistoryEntry, LocationStatus, copy_with
from locstatus.names import MAX_ACTOR, MAX_REASON, canonical_service, check_text

ServiceArg = str | Iterable[str] | None
"""A service argument: a name (``crr`` means ``replication``), a list of names, or None for
every service of the location."""


@dataclass(frozen=True, slots=True)
class Write:
    """Write ``record`` with ``entries`` as its history, compare-and-set on the version read.
    ``texts``: their stored texts when the plan made them already (a bulk operation's,
    :mod:`.bulkplan`): see :attr:`~locstatus.backends.base.CasItem.texts`."""

    record: LocationStatus
    entries: list[HistoryEntry]
    texts: tuple[str, str] | None = None


class _Nothing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NOTHING"


NOTHING: Final = _Nothing()
"""The decision "nothing to write": the record stays as read."""


@dataclass(frozen=True, slots=True)
class Refuse:
    """The operation is refused on this record: raise ``error`` (when decided on a fresh read)."""

    error: LocstatusError


Decision = Write | _Nothing | Refuse
Plan = Callable[[LocationStatus, datetime], Decision]
"""``plan(record, now) -> Decision``: pure, called once per attempt of the write loop."""


def check_free_text(reason: object, actor: object) -> None:
    """Refuse a bad ``reason``/``actor`` before any I/O (the FSM's :class:`Event` checks them
    again where it is built). Raises :class:`InvalidInput`."""
    check_text("reason", reason, MAX_REASON)
    check_text("actor", actor, MAX_ACTOR)


def check_op_id(op_id: object) -> str:
    """``op_id`` if it is 1-64 printable characters, else :class:`InvalidInput`."""
    if not (isinstance(op_id, str) and 1 <= len(op_id) <= 64 and op_id.isprintable()):
        raise InvalidInput(f"op_id must be 1-64 printable characters, got {op_id!r}")
    return op_id


def check_wait(wait: float | None) -> None:
    """A ``wait=`` is 0..86400 seconds (or None). Raises :class:`InvalidInput`."""
    if wait is not None and not 0 <= wait <= 86_400:
        raise InvalidInput(f"wait must be 0..86400 seconds, got {wait}")


def services_arg(service: ServiceArg, configured: Sequence[str]) -> list[str] | None:
    """The canonical names of a service argument (None: every service). Raises
    :class:`InvalidInput` for a bad shape, an empty list or an unknown name."""
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
    return list(dict.fromkeys(canonical_service(n, configured) for n in names))


def targets(rec: LocationStatus, names: Sequence[str] | None) -> list[str] | NotFound:
    """The services of ``rec`` that ``names`` (canonical, or None: all) target, sorted when
    all; a :class:`NotFound` naming what the location lacks when it lacks any of them."""
    if names is None:
        return sorted(rec.services)
    missing = [n for n in names if n not in rec.services]
    if missing:
        return NotFound(
            f"location {rec.location!r} has no service {', '.join(missing)} "
            f"(it has: {', '.join(sorted(rec.services)) or 'none'})"
        )
    return list(names)


def resume_time(at: datetime | timedelta, now: datetime) -> datetime:
    """The absolute time of a scheduled resume: ``at`` itself (aware, in UTC) or ``now + at``
    for a positive timedelta. Raises :class:`InvalidInput` for a naive or out-of-range time or
    a delay that is not positive (the state machine refuses a time not in the future)."""
    if isinstance(at, timedelta):
        if at <= timedelta(0):
            raise InvalidInput(f"resume delay must be positive, got {at}")
        try:
            return now + at
        except OverflowError:
            raise InvalidInput(f"resume delay {at} is out of range") from None
    if not isinstance(at, datetime):
        raise InvalidInput(f"resume time must be a datetime or timedelta, got {at!r}")
    if at.tzinfo is None or at.utcoffset() is None:
        raise InvalidInput(
            f"resume time {at.isoformat()} has no timezone: give an aware UTC datetime"
        )
    try:  # 9999-12-31T23:59:59-01:00 is a valid datetime whose UTC time is not
        return at.astimezone(now.tzinfo)
    except OverflowError:
        raise InvalidInput(
            f"resume time {at.isoformat()} is out of range: its UTC time is past year 9999 "
            "or before year 1"
        ) from None


def plan_events(
    rec: LocationStatus,
    now: datetime,
    op_id: str,
    services: Sequence[str],
    make_event: Callable[[str], Event],
    *,
    skip_refused: bool = False,
) -> Decision:
    """Apply ``make_event(service)`` to each of ``services`` with the state machine, all in one
    write. A refused transition refuses the whole write, unless ``skip_refused``: then refused
    services are left alone as long as another service changes or is paused (a scheduled resume
    of "every service" of a location where only some are paused)."""
    new_services = dict(rec.services)
    version = rec.version + 1  # what the compare-and-set at rec.version produces
    entries: list[HistoryEntry] = []
    refused: InvalidTransition | None = None
    for svc in services:
        event = make_event(svc)
        try:
            change = transition(
                rec.location, svc, new_services[svc], event, now=now, op_id=op_id, version=version
            )
        except (InvalidTransition, InvalidInput) as exc:  # the state machine's refusals
            if skip_refused and isinstance(exc, InvalidTransition):
                refused = exc
                continue
            return Refuse(exc)
        if change is not None:
            new_services[svc] = change.status
            entries.append(change.entry)
    if refused is not None and not entries and all(not rec.services[s].paused for s in services):
        return Refuse(refused)
    if not entries:
        return NOTHING
    # the record as the compare-and-set at rec.version stores it (its version the one it
    # produces: a backend returns it as it is, no copy per location of a bulk operation)
    return Write(copy_with(rec, {"services": new_services, "version": version}), entries)


def record_entry(
    location: str, event: str, op_id: str, now: datetime, actor: str | None, service: str = "*"
) -> HistoryEntry:
    """A history entry of a location-level event (create, restore, remove, add_service)."""
    return HistoryEntry(
        op_id=op_id, at=now, location=location, service=service, event=event, actor=actor
    )
