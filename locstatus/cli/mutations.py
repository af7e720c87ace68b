"""``pause``, ``resume`` and ``cancel-schedule``: the operator's mutations (docs/cli.md).

One location is one Manager call (then an optional wait); ``all`` is a bulk operation that
runs per location (every location that is not removed) and reports one result per location,
the exit code the worst of them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated

import typer
import typer.core
from rich.table import Table
from rich.text import Text

from locstatus.errors import (
    InvalidInput,
)
from locstatus.manager import BulkInterrupted, BulkItem, BulkReport, Manager, Operation, Outcome
from locstatus.models import (
    LocationStatus,
    new_op_id,
)
from locstatus.names import (
    MAX_ACTOR,
    MAX_REASON,
    canonical_service,
    check_location,
)

from .app import (
    ALL,
    ActorOpt,
    JsonOpt,
    LocationArg,
    ReasonOpt,
    ServiceOpt,
    WaitOpt,
    app,
    fail,
    options_of,
)
from .parsing import (
    check_option_text,
    default_actor,
    parse_duration,
    parse_when,
    wait_seconds,
)
from .rendering import (
    escaped,
    iso,
    location_table,
    new_console,
    plain,
    print_json,
)
from .suggest import suggesting


@dataclass(frozen=True)
class _Mutation:
    """One operator event, validated and ready to apply to a location."""

    kind: str  # pause | resume | schedule | cancel
    services: tuple[str, ...] | None
    reason: str | None
    actor: str
    wait: float | None
    at: datetime | timedelta | None = None

    @property
    def command(self) -> str:
        """The command line that made this mutation, for messages."""
        return {"schedule": "resume (scheduled)", "cancel": "cancel-schedule"}.get(
            self.kind, self.kind
        )

    def apply(
        self, mgr: Manager, location: str, services: Sequence[str] | None
    ) -> tuple[LocationStatus, list[str], list[tuple[str, datetime]]]:
        """Apply to ``location``; return the stored record, the services this call changed
        (empty for an idempotent no-op) and, for a schedule, the services whose earlier
        schedule it moved with the time each had (known when the record read just before is
        the one this write replaced: one version apart)."""
        op_id = new_op_id()
        before = mgr.status(location) if self.kind == "schedule" else None
        svc: list[str] | None = list(services) if services is not None else None
        if self.kind == "pause":
            rec = mgr.pause(location, svc, reason=self.reason, actor=self.actor, op_id=op_id)
        elif self.kind == "resume":
            rec = mgr.resume(location, svc, reason=self.reason, actor=self.actor, op_id=op_id)
        elif self.kind == "schedule":
            rec = mgr.resume(
                location, svc, at=self.at, reason=self.reason, actor=self.actor, op_id=op_id
            )
        else:
            rec = mgr.cancel_scheduled_resume(
                location, svc, reason=self.reason, actor=self.actor, op_id=op_id
            )
        changed = [s for s, st in sorted(rec.services.items()) if st.op_id == op_id]
        moved: list[tuple[str, datetime]] = []
        if before is not None and before.version + 1 == rec.version:
            for s in changed:
                was = before.services[s].resume_at if s in before.services else None
                if was is not None and was != rec.services[s].resume_at:
                    moved.append((s, was))
        return rec, changed, moved

    def operation(self) -> Operation:
        """This mutation as the manager's :class:`~locstatus.manager.Operation`."""
        if self.kind == "pause":
            return Operation.pause(self.services, reason=self.reason, actor=self.actor)
        if self.kind in ("resume", "schedule"):
            return Operation.resume(
                self.services, at=self.at, reason=self.reason, actor=self.actor
            )
        return Operation.cancel_scheduled_resume(
            self.services, reason=self.reason, actor=self.actor
        )

    def describe(self, location: str, rec: LocationStatus, changed: list[str]) -> str:
        if changed:
            names = ", ".join(changed)
            if self.kind in ("pause", "resume"):
                # Say what the store says: a change waits in pausing/resuming until every live
                # worker applied it (docs/design.md §3); only then is the service paused/running.
                done = "paused" if self.kind == "pause" else "resumed"
                waiting = [s for s in changed if rec.services[s].state.transitional]
                if not waiting:
                    return f"{location}: {done} {names}"
                going = "pausing" if self.kind == "pause" else "resuming"
                settled = [s for s in changed if s not in waiting]
                return (
                    f"{location}: {going} {', '.join(waiting)} (until every live worker has "
                    "applied it; --wait SECONDS waits for that)"
                    + (f"; {done} {', '.join(settled)}" if settled else "")
                )
            if self.kind == "schedule":
                when = rec.services[changed[0]].resume_at
                return f"{location}: resume of {names} scheduled at {iso(when)}"
            return f"{location}: scheduled resume of {names} cancelled"
        targets = self.services or tuple(sorted(rec.services))
        states = ", ".join(
            f"{s} {rec.services[s].state.value}" for s in targets if s in rec.services
        )
        return f"{location}: no change ({states})"


def _mutation(
    kind: str,
    services: list[str] | None,
    reason: str | None,
    actor: str | None,
    wait: str | None,
    configured: Sequence[str],
    at: datetime | timedelta | None = None,
) -> _Mutation:
    svcs: tuple[str, ...] | None = None
    if services:
        svcs = tuple(dict.fromkeys(canonical_service(s, configured) for s in services))
    check_option_text("--reason", reason, MAX_REASON)
    check_option_text("--actor", actor, MAX_ACTOR)
    return _Mutation(kind, svcs, reason, actor or default_actor(), wait_seconds(wait), at)


def _run_mutation(ctx: typer.Context, location: str, m: _Mutation, as_json: bool) -> None:
    if location != ALL:
        check_location(location)
    mgr = options_of(ctx).manager()
    if location == ALL:
        _run_bulk(mgr, m, as_json)
        return
    with suggesting(mgr, location):
        rec, changed, moved = m.apply(mgr, location, m.services)
    if m.wait is not None:
        rec = mgr.wait_settled(location, list(m.services) if m.services else None, timeout=m.wait)
    if as_json:
        print_json(rec.model_dump_json(indent=2))
        return
    console = new_console()
    console.print(plain(m.describe(location, rec, changed) + "".join(
        f"; {svc} rescheduled (was {_short(was, rec.services[svc].resume_at)})"
        for svc, was in moved
    )))
    console.print(location_table(rec, mgr.clock(), only=m.services, width=console.width))


_RESULT = {
    Outcome.CHANGED: "changed",
    Outcome.UNCHANGED: "unchanged",
    Outcome.SKIPPED: "skipped",
    Outcome.FAILED: "error",
}
_STYLE = {
    "changed": "green", "rescheduled": "yellow", "unchanged": "", "skipped": "dim",
    "error": "bold red",
}


def _short(was: datetime, now_at: datetime | None) -> str:
    """The time a schedule had: ``12:39Z`` on the same day as the new one (``12:39:05Z`` in
    the same minute), else in full."""
    if now_at is not None and was.date() == now_at.date():
        same_minute = was.strftime("%H:%M") == now_at.strftime("%H:%M")
        return was.strftime("%H:%M:%SZ" if same_minute else "%H:%MZ")
    return iso(was)


def _moved(item: BulkItem) -> dict[str, str]:
    """``{service: the time its moved schedule had}`` (ISO, UTC) for ``--json``."""
    return {svc: iso(was) for svc, was in item.rescheduled}


def _run_bulk(mgr: Manager, m: _Mutation, as_json: bool) -> None:
    """``LOCATION`` ``all``: the manager's one bulk operation (:meth:`Manager.bulk`), rendered
    one row per location (docs/cli.md, "Bulk: `all`"). The detail of a written location says
    what the write left (pausing until the workers applied it...), as for one location; the
    exit code is the worst per-location one; a refused operation (no location stored, every
    one skipped) exits 1 after the table. Ctrl-C prints what was done, then exits 130."""
    details: dict[str, str] = {}

    def progress(item: BulkItem, _done: int, _total: int | None) -> None:
        if item.status is not None and item.outcome in (Outcome.CHANGED, Outcome.UNCHANGED):
            details[item.location] = m.describe(
                item.location, item.status, list(item.changed)
            ).split(": ", 1)[1] + "".join(
                f"; {svc} rescheduled (was {_short(was, item.status.services[svc].resume_at)})"
                for svc, was in item.rescheduled
            )

    try:
        report = mgr.bulk(m.operation(), wait=m.wait, progress=progress)
    except BulkInterrupted as stop:
        _show_bulk(m, stop.report, details, as_json)
        fail(
            f"{m.command} {ALL}: interrupted after {len(stop.report.items)} location(s); the "
            "table shows what was done",
            130,
        )
    if not report.items and report.refusal is not None:
        raise report.refusal
    _show_bulk(m, report, details, as_json)
    errors = [i.error for i in report.items if i.error is not None]
    for error in errors:
        typer.echo(f"error: {escaped(error.message)}", err=True)
    if errors:
        raise typer.Exit(max(e.exit_code for e in errors))
    if report.refusal is not None:
        fail(report.refusal.message, report.refusal.exit_code)


def _show_bulk(
    m: _Mutation, report: BulkReport, details: dict[str, str], as_json: bool
) -> None:
    rows = [
        (
            item.location,
            "rescheduled" if item.rescheduled else _RESULT[item.outcome],
            item.why or (item.error.message if item.error is not None else "")
            or details.get(item.location, ""),
            item.status,
        )
        for item in report.items
    ]
    if as_json:
        print_json(
            json.dumps(
                [
                    {
                        "location": loc,
                        "result": result,
                        "detail": detail,
                        "status": None if status is None else status.model_dump(mode="json"),
                        **({"rescheduled": moved} if moved else {}),
                    }
                    for (loc, result, detail, status), moved in zip(
                        rows, (_moved(i) for i in report.items), strict=True
                    )
                ],
                indent=2,
            )
        )
        return
    table = Table(title=f"{m.command} {ALL}", title_justify="left")
    for col in ("Location", "Result", "Detail"):
        table.add_column(col)
    for loc, result, detail, _status in rows:
        table.add_row(Text(loc), Text(result, style=_STYLE[result]), plain(detail))
    new_console().print(table)


@app.command()
def pause(
    ctx: typer.Context,
    location: LocationArg,
    service: ServiceOpt = None,
    reason: ReasonOpt = None,
    actor: ActorOpt = None,
    wait: WaitOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Pause services at a location (a pause of a paused service cancels its scheduled
    resume; otherwise it is a no-op, exit 0)."""
    m = _mutation("pause", service, reason, actor, wait, options_of(ctx).services)
    _run_mutation(ctx, location, m, as_json)


@app.command()
def resume(
    ctx: typer.Context,
    location: LocationArg,
    at: Annotated[
        str | None,
        typer.Option(
            "--at",
            metavar="ISO",
            help="Schedule the resume at this time (ISO 8601 with Z or an offset).",
        ),
    ] = None,
    in_: Annotated[
        str | None,
        typer.Option(
            "--in", metavar="DURATION", help="Schedule the resume after 90s, 15m, 2h, 1d, 1h30m."
        ),
    ] = None,
    service: ServiceOpt = None,
    reason: ReasonOpt = None,
    actor: ActorOpt = None,
    wait: WaitOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Resume services now, or schedule the resume with --at or --in (only paused services
    take a schedule)."""
    when: datetime | timedelta | None = None
    if at is not None and in_ is not None:
        raise InvalidInput(f"give --at or --in, not both (got --at {at!r} and --in {in_!r})")
    if at is not None:
        # "in the future" by the backend's time, not this host's (docs/time.md)
        when = parse_when(at, now=options_of(ctx).manager().clock())
    elif in_ is not None:
        when = timedelta(seconds=parse_duration(in_))
    if when is not None and wait is not None:
        raise InvalidInput(
            f"--wait {wait!r} cannot be combined with a scheduled resume: a schedule changes "
            "no state, so there is nothing to settle"
        )
    m = _mutation(
        "schedule" if when is not None else "resume",
        service,
        reason,
        actor,
        wait,
        options_of(ctx).services,
        at=when,
    )
    _run_mutation(ctx, location, m, as_json)


@app.command("cancel-schedule")
def cancel_schedule(
    ctx: typer.Context,
    location: LocationArg,
    service: ServiceOpt = None,
    reason: ReasonOpt = None,
    actor: ActorOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Cancel a scheduled resume (no-op, exit 0, when none is scheduled)."""
    m = _mutation("cancel", service, reason, actor, None, options_of(ctx).services)
    _run_mutation(ctx, location, m, as_json)


