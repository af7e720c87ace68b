"""Operator events: pause, resume now, schedule a resume, cancel a scheduled resume.

An :class:`Operation` says what the operator asked for, independent of any location; checked once
against the configured services and the clock (:meth:`Operation.checked`), it plans the write
for any record purely (:meth:`Operation.plan`). :func:`operate` runs it on one location: the
write (docs/design.md §3.1), then the settle of what no live worker applies
(:func:`~.reconcile.settle_unwatched`), then an optional wait. The single-location methods of
the manager and its bulk operation (:mod:`.bulk`) both go through here, so "what a pause means"
is decided once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Literal

from locstatus.errors import InvalidInput, NotFound
from locstatus.fsm import Event
from locstatus.models import LocationStatus, new_op_id
from locstatus.names import check_location

from .core import Core
from .plans import (
    Decision,
    Plan,
    Refuse,
    ServiceArg,
    check_free_text,
    check_op_id,
    check_wait,
    plan_events,
    resume_time,
    services_arg,
    targets,
)
from .reconcile import settle_unwatched, wait_settled

EventName = Literal["pause", "resume", "schedule_resume", "cancel_scheduled_resume"]


@dataclass(frozen=True, slots=True)
class Operation:
    """One operator event, for any location (docs/design.md §3).

    Build it with :meth:`pause`, :meth:`resume` (``at=`` schedules) or
    :meth:`cancel_scheduled_resume`; hand it to :meth:`Manager.bulk
    <locstatus.manager.Manager.bulk>`::

        mgr.bulk(Operation.pause("replication", reason="target outage", actor="ops"))

    ``service``: a name (``crr`` means ``replication``), a list of names, or None for every
    service of each location. ``at``: for ``schedule_resume``, an aware datetime or a positive
    timedelta from now. ``reason`` (at most 1024 characters) and ``actor`` (256): free text
    without control characters.
    """

    event: EventName
    service: ServiceArg = None
    at: datetime | timedelta | None = None
    reason: str | None = None
    actor: str | None = None

    @classmethod
    def pause(
        cls, service: ServiceArg = None, *, reason: str | None = None, actor: str | None = None
    ) -> Operation:
        """Pause: running/resuming -> pausing; a pause of a paused service cancels its
        scheduled resume, else it changes nothing."""
        return cls("pause", service, None, reason, actor)

    @classmethod
    def resume(
        cls,
        service: ServiceArg = None,
        *,
        at: datetime | timedelta | None = None,
        reason: str | None = None,
        actor: str | None = None,
    ) -> Operation:
        """Resume now, or schedule the resume when ``at`` is given (only a paused service takes
        a schedule)."""
        return cls("resume" if at is None else "schedule_resume", service, at, reason, actor)

    @classmethod
    def cancel_scheduled_resume(
        cls, service: ServiceArg = None, *, reason: str | None = None, actor: str | None = None
    ) -> Operation:
        """Clear a scheduled resume (nothing written where none is scheduled)."""
        return cls("cancel_scheduled_resume", service, None, reason, actor)

    @property
    def schedules(self) -> bool:
        """True for a scheduled resume: a location with nothing paused has nothing to take it."""
        return self.event == "schedule_resume"

    def checked(self, configured: tuple[str, ...], now: datetime) -> Operation:
        """This operation validated before any I/O: ``service`` as a tuple of canonical names
        (or None), ``at`` as an aware datetime in UTC (a delay counted from ``now``), which must
        be later than ``now``. Raises :class:`InvalidInput` naming what is wrong."""
        check_free_text(self.reason, self.actor)
        if self.event not in ("pause", "resume", "schedule_resume", "cancel_scheduled_resume"):
            raise InvalidInput(f"unknown operation {self.event!r}")
        names = services_arg(self.service, configured)
        at: datetime | None = None
        if self.event == "schedule_resume":
            if self.at is None:
                raise InvalidInput("a scheduled resume needs a time (at=)")
            at = resume_time(self.at, now)
            if at <= now:  # the state machine's rule, once for every location before any I/O
                raise InvalidInput(
                    f"scheduled resume time {at.isoformat()} is not in the future "
                    f"(now {now.isoformat()})"
                )
        elif self.at is not None:
            raise InvalidInput(f"{self.event} takes no time (at=)")
        return replace(self, service=None if names is None else tuple(names), at=at)

    def names(self) -> list[str] | None:
        """The canonical service names of a :meth:`checked` operation (None: all)."""
        if self.service is None:
            return None
        return [self.service] if isinstance(self.service, str) else list(self.service)

    def make_event(self, _service: str) -> Event:
        """The state machine's event for one service (the same for each)."""
        at = self.at if isinstance(self.at, datetime) and self.schedules else None
        return Event(self.event, at=at, reason=self.reason, actor=self.actor)

    def plan(self, op_id: str, names: list[str] | None = None) -> Plan:
        """The pure plan of this (:meth:`checked`) operation for any record: refused for a
        removed location or one without a targeted service. ``names``: target these services
        instead of the operation's own (a bulk operation's intersection with a location's)."""
        wanted = self.names() if names is None else names
        # Scheduling "every service" leaves the running ones alone while one takes it.
        skip_refused = self.schedules and self.service is None and names is None
        event = self.make_event("")  # the same for each service: built once, not per location

        def make_event(_service: str) -> Event:
            return event

        def plan(rec: LocationStatus, now: datetime) -> Decision:
            if rec.deleted:
                return Refuse(
                    NotFound(
                        f"location {rec.location!r} was removed at "
                        f"{rec.deleted_at:%Y-%m-%dT%H:%M:%SZ}"
                    )
                )
            chosen = targets(rec, wanted)
            if isinstance(chosen, NotFound):
                return Refuse(chosen)
            return plan_events(rec, now, op_id, chosen, make_event, skip_refused=skip_refused)

        return plan


def operate(
    core: Core,
    location: str,
    operation: Operation,
    *,
    wait: float | None = None,
    if_version: int | None = None,
    op_id: str | None = None,
) -> LocationStatus:
    """Run ``operation`` on one location: its write (planned from the version hint first, see
    :mod:`.writes`), then the settle of what no live worker applies, then ``wait`` seconds for
    the rest to settle. Raises :class:`InvalidInput` before any I/O, then what the write, the
    plan (:class:`NotFound`, :class:`InvalidTransition`) or the wait raise."""
    check_location(location)
    op = operation.checked(core.services, core.clock())
    check_wait(wait)
    op_id = new_op_id() if op_id is None else check_op_id(op_id)
    rec = core.writer.write(
        location, op.plan(op_id), op_id=op_id, if_version=if_version, use_hint=True
    )
    rec = settle_unwatched(core, rec, op_id, op.actor, op.reason)
    if wait is not None:
        rec = wait_settled(core, location, op.names(), timeout=wait)
    return rec
