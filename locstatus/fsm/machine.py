"""The pure state machine: ``(ServiceStatus, Event, now) -> Change | None``.

One ``transitions.Machine`` is built once from :mod:`locstatus.fsm.table` (it validates the table:
unknown states or triggers fail at import). :func:`transition` interprets that machine's events
for a given status without I/O and without a Machine object per record: it looks up the rows for
``(event, state)``, checks their conditions, and applies their effects to a copy of the status.
The result is the new status plus the :class:`HistoryEntry` that must be written with it.

The status carries one reason and actor pair: that of the last change that gave either (a
pause, a resume, or a schedule change that names its actor); a change that gives neither (an
anonymous schedule change, a settle) keeps it, so a reason is never shown beside someone who did
not give it. The history entry carries only the event's own, so a row never names someone who
did not make it (docs/cli.md, "Reading state").

Returns None when the event changes nothing (idempotent; the caller writes nothing) and raises
:class:`InvalidTransition` for the refused pairs of the table, :class:`InvalidInput` for a
scheduled resume that is not in the future.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from transitions import Machine

from locstatus.errors import InvalidInput, InvalidTransition
from locstatus.fsm import table
from locstatus.models import (
    MAX_STORED_INT,
    HistoryEntry,
    ServiceStatus,
    State,
    built_from,
    copy_with,
)
from locstatus.names import MAX_ACTOR, MAX_REASON, check_text


@dataclass(frozen=True, slots=True)
class Event:
    """An event for one service.

    - ``name``: one of :data:`locstatus.fsm.table.EVENTS`.
    - ``at``: for ``schedule_resume`` the new resume time; for ``resume_due`` the resume time the
      caller saw (the guard of docs/design.md §3.3). Aware UTC datetime.
    - ``generation``/``acked``: for ``settle``, the generation the acks are for and whether every
      live worker acknowledged it (computed by the caller, which does the I/O).
    - ``reason``/``actor``: who made the event and why: the history entry records exactly
      these (None: not given); the status takes them as described in :func:`transition`.
    """

    name: str
    at: datetime | None = None
    generation: int | None = None
    acked: bool = False
    reason: str | None = None
    actor: str | None = None

    def __post_init__(self) -> None:
        # The new status is built with copy_with (no validation), so the free-text fields are
        # checked here: an over-long reason must be refused, not stored as a corrupt record, and
        # a control character never reaches an operator's terminal (locstatus.names).
        check_text("reason", self.reason, MAX_REASON)
        check_text("actor", self.actor, MAX_ACTOR)
        if self.at is not None and (not isinstance(self.at, datetime) or self.at.tzinfo is None):
            raise InvalidInput(f"event time must be an aware UTC datetime, got {self.at!r:.80}")


@dataclass(frozen=True, slots=True)
class Change:
    """The outcome of an event that changes something."""

    status: ServiceStatus
    entry: HistoryEntry


class _Ctx:
    __slots__ = ("event", "fields", "now", "status")

    def __init__(self, status: ServiceStatus, event: Event, now: datetime) -> None:
        self.status = status
        self.event = event
        self.now = now
        self.fields: dict[str, Any] = {}


def _has_resume_at(c: _Ctx) -> bool:
    return c.status.resume_at is not None


def _schedule_changes(c: _Ctx) -> bool:
    if c.event.at is None:
        raise InvalidInput("schedule_resume needs a resume time 'at'")
    if c.event.at <= c.now:
        raise InvalidInput(
            f"scheduled resume time {c.event.at.isoformat()} is not in the future "
            f"(now {c.now.isoformat()})"
        )
    return c.status.resume_at != c.event.at


def _resume_is_due(c: _Ctx) -> bool:
    due = c.status.resume_at
    return due is not None and due <= c.now and due == c.event.at


def _generation_matches(c: _Ctx) -> bool:
    return c.event.generation == c.status.generation


def _all_acked(c: _Ctx) -> bool:
    return c.event.acked


def _bump_generation(c: _Ctx) -> None:
    if c.status.generation >= MAX_STORED_INT:  # a hand-written record at the very top
        raise InvalidTransition(
            f"generation {c.status.generation} is at the largest a backend stores "
            f"({MAX_STORED_INT}): the state cannot flip again (see 'locstatus check')"
        )
    c.fields["generation"] = c.status.generation + 1


def _clear_resume_at(c: _Ctx) -> None:
    c.fields["resume_at"] = None


def _set_resume_at(c: _Ctx) -> None:
    c.fields["resume_at"] = c.event.at


CONDITIONS: dict[str, Callable[[_Ctx], bool]] = {
    "has_resume_at": _has_resume_at,
    "schedule_changes": _schedule_changes,
    "resume_is_due": _resume_is_due,
    "generation_matches": _generation_matches,
    "all_acked": _all_acked,
}
EFFECTS: dict[str, Callable[[_Ctx], None]] = {
    "bump_generation": _bump_generation,
    "clear_resume_at": _clear_resume_at,
    "set_resume_at": _set_resume_at,
}

_DESIRED_STATE_EVENTS = frozenset({"pause", "resume"})


def build_machine(model: Any = None, cls: type[Machine] = Machine, **kwargs: Any) -> Machine:
    """Build a ``transitions`` machine of class ``cls`` from the table (used once here, and by
    the diagram with ``GraphMachine``)."""
    return cls(
        model=model,
        states=list(table.STATES),
        transitions=[dict(t) for t in table.TRANSITIONS],
        initial=table.INITIAL,
        auto_transitions=False,
        **kwargs,
    )


MACHINE: Machine = build_machine()
"""The one machine. Its events are interpreted by :func:`transition`."""


@dataclass(frozen=True, slots=True)
class _Row:
    dest: State | None
    conditions: tuple[Callable[[_Ctx], bool], ...]
    effects: tuple[Callable[[_Ctx], None], ...]


def _compile() -> dict[tuple[str, State], tuple[_Row, ...]]:
    rules: dict[tuple[str, State], list[_Row]] = {}
    for name, event in MACHINE.events.items():
        for source, transitions in event.transitions.items():
            for t in transitions:
                conds = [str(c.func) for c in t.conditions]
                effects = [str(a) for a in t.after]
                missing = [c for c in conds if c not in CONDITIONS]
                missing += [a for a in effects if a not in EFFECTS]
                if missing or any(not c.target for c in t.conditions):
                    raise RuntimeError(f"state table names unknown functions {missing}")
                rules.setdefault((name, State(source)), []).append(
                    _Row(
                        dest=State(t.dest) if t.dest else None,
                        conditions=tuple(CONDITIONS[c] for c in conds),
                        effects=tuple(EFFECTS[a] for a in effects),
                    )
                )
    return {k: tuple(v) for k, v in rules.items()}


_RULES = _compile()
_REFUSED = frozenset((name, State(st)) for name, sts in table.REFUSED.items() for st in sts)
"""The refused ``(event, state)`` pairs of the table (:data:`locstatus.fsm.table.REFUSED`)."""


def transition(
    location: str,
    service: str,
    status: ServiceStatus,
    event: Event,
    *,
    now: datetime,
    op_id: str,
    version: int = 0,
) -> Change | None:
    """Apply ``event`` to ``status`` at ``now`` (aware UTC).

    Returns the :class:`Change` (new status and its history entry) or None when nothing changes.
    ``version``: the record version the write of this change produces, recorded in the entry
    (0 when not known: the backend sets it at commit).
    The new status takes the event's reason and actor, as a pair, on ``pause``/``resume`` (a new
    desired state) and on any event that gives either; it keeps its own pair otherwise. The
    entry records the event's own reason and actor only.
    Raises :class:`InvalidTransition` for the refused pairs of docs/design.md §3 (e.g.
    ``schedule_resume``
    of a running service) and :class:`InvalidInput` for a ``schedule_resume`` time not in the
    future. Pure: no I/O, no clock other than ``now``.
    """
    if event.name not in table.EVENTS:
        raise InvalidInput(f"unknown event {event.name!r}")
    state = status.state
    if (event.name, state) in _REFUSED:
        raise InvalidTransition(
            f"cannot {event.name.replace('_', ' ')} {service} at {location}: it is {state.value}"
        )
    ctx = _Ctx(status, event, now)
    for row in _RULES.get((event.name, state), ()):
        for cond in row.conditions:
            if not cond(ctx):
                break
        else:  # every condition holds (no generator per row: one call per location in bulk)
            for effect in row.effects:
                effect(ctx)
            fields = ctx.fields
            if row.dest is not None:
                fields["state"] = row.dest
            fields["op_id"] = op_id
            fields["updated_at"] = now
            if event.name in _DESIRED_STATE_EVENTS or (
                event.reason is not None or event.actor is not None
            ):
                # a new desired state, or a change that says who or why: its reason and actor
                # replace the pair (a reason is never shown beside someone who did not give it)
                fields["reason"] = event.reason
                fields["actor"] = event.actor
            # otherwise (an anonymous schedule change, settle) the status keeps the pair
            new = copy_with(status, fields)
            # built from the validated status and event (every field given, as the model's
            # own order), not validated again: one per location of a bulk operation
            entry = built_from(HistoryEntry, {
                "op_id": op_id,
                "at": now,
                "location": location,
                "service": service,
                "event": event.name,
                "from_state": state,
                "to_state": new.state,
                "generation": new.generation,
                "actor": event.actor,  # who made this event, never who made an earlier one
                "reason": event.reason,
                "resume_at": new.resume_at,
                "version": version,
            })
            return Change(new, entry)
    return None
