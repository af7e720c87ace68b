"""``pause``, ``resume`` and ``cancel-schedule``: the operator's mutations (docs/cli.md).

One location is one Manager call (then an optional wait); ``all`` is a bulk operation that
runs per location (every location that is not removed) and reports one result per location,
the exit code the worst of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated

import typer
import typer.core

from locstatus.errors import (
    InvalidInput,
)
from locstatus.manager import BulkInterrupted, BulkItem, BulkReport, Manager, Operation
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

from . import bulk_view
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
    bulk_progress,
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


def _run_mutation(
    ctx: typer.Context, location: str, m: _Mutation, as_json: bool, full: bool = False
) -> None:
    if location != ALL:
        check_location(location)
    mgr = options_of(ctx).manager()
    if location == ALL:
        _run_bulk(mgr, m, as_json, full)
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


def _run_bulk(mgr: Manager, m: _Mutation, as_json: bool, full: bool) -> None:
    """``LOCATION`` ``all``: the manager's one bulk operation (:meth:`Manager.bulk`), shown by
    :mod:`.bulk_view` (a summary above its threshold, one row per location with ``--details``
    or below it: docs/cli.md, "Bulk: `all`"). The detail of a written location says what the
    write left (pausing until the workers applied it...), as for one location; the exit code
    is the worst per-location one; a refused operation (no location stored, every one skipped)
    exits 1 after the report. Ctrl-C prints what was done, then exits 130."""
    title = f"{m.command} {ALL}"
    report: BulkReport | None = None
    try:
        try:
            with bulk_progress(title, enabled=not as_json) as bar:
                report = mgr.bulk(
                    m.operation(), wait=m.wait,
                    progress=lambda _item, done, total: bar(done, total),
                )
        except BulkInterrupted:
            raise
        except KeyboardInterrupt:  # after the operation returned (the bar closing): still shown
            if report is None:
                raise
            report.interrupted = True
            raise BulkInterrupted(report) from None
    except BulkInterrupted as stop:
        bulk_view.show(stop.report, title, _detail(m, stop.report), as_json=as_json, full=full)
        fail(_interrupted(title, stop.report), 130)
    if not report.items and report.refusal is not None:
        raise report.refusal
    bulk_view.show(report, title, _detail(m, report), as_json=as_json, full=full)
    errors = [i.error for i in report.items if i.error is not None]
    for error in errors[: bulk_view.FIRST]:
        typer.echo(f"error: {escaped(error.message)}", err=True)
    if len(errors) > bulk_view.FIRST:
        more = bulk_view.plural(len(errors) - bulk_view.FIRST, "error", more=True)
        typer.echo(f"error: ... and {more}", err=True)
    if errors:
        raise typer.Exit(max(e.exit_code for e in errors))
    if report.refusal is not None:
        fail(report.refusal.message, report.refusal.exit_code)


def _interrupted(title: str, report: BulkReport) -> str:
    """The last line of an interrupted ``all``: what was done, each kind counted on its own
    (``2000 changed, 1000 outcome unknown, 97000 not reached``: never one count of the
    locations reached read as done), and where to look for the unknown ones."""
    done = ", ".join(bulk_view.tally(report)) or "no location reached"
    unknown = any(bulk_view.kind_of(i) == bulk_view.UNKNOWN for i in report.items)
    look = f" (look for op_id {report.op_id} in their history)" if unknown else ""
    return f"{title}: interrupted: {done}{look}; shown above is what was done"


def _detail(m: _Mutation, report: BulkReport) -> bulk_view.Detail:
    """A written location's detail: what the write left, as for one location; in an
    interrupted operation, a location left pausing/resuming says the next settle finishes it
    (its settle batch may not have run)."""

    def detail(item: BulkItem) -> str:
        rec = item.status
        if rec is None:
            return ""
        text = m.describe(item.location, rec, list(item.changed)).split(": ", 1)[1] + "".join(
            f"; {svc} rescheduled (was {_short(was, rec.services[svc].resume_at)})"
            for svc, was in item.rescheduled
        )
        if report.interrupted and any(rec.services[s].state.transitional for s in item.changed):
            text += (
                "; interrupted: still "
                + ("pausing" if m.kind == "pause" else "resuming")
                + ", the next settle (sidecar, check --repair) finishes it"
            )
        return text

    return detail


def _short(was: datetime, now_at: datetime | None) -> str:
    """The time a schedule had: ``12:39Z`` on the same day as the new one (``12:39:05Z`` in
    the same minute), else in full."""
    if now_at is not None and was.date() == now_at.date():
        same_minute = was.strftime("%H:%M") == now_at.strftime("%H:%M")
        return was.strftime("%H:%M:%SZ" if same_minute else "%H:%MZ")
    return iso(was)


DetailsOpt = Annotated[
    bool,
    typer.Option(
        "--details",
        help=f"With 'all': one row per location (the default up to {bulk_view.SUMMARY_OVER} "
        "locations; above, a summary).",
    ),
]


@app.command()
def pause(
    ctx: typer.Context,
    location: LocationArg,
    service: ServiceOpt = None,
    reason: ReasonOpt = None,
    actor: ActorOpt = None,
    wait: WaitOpt = None,
    as_json: JsonOpt = False,
    details: DetailsOpt = False,
) -> None:
    """Pause services at a location (a pause of a paused service cancels its scheduled
    resume; otherwise it is a no-op, exit 0)."""
    m = _mutation("pause", service, reason, actor, wait, options_of(ctx).services)
    _run_mutation(ctx, location, m, as_json, details)


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
    details: DetailsOpt = False,
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
    _run_mutation(ctx, location, m, as_json, details)


@app.command("cancel-schedule")
def cancel_schedule(
    ctx: typer.Context,
    location: LocationArg,
    service: ServiceOpt = None,
    reason: ReasonOpt = None,
    actor: ActorOpt = None,
    as_json: JsonOpt = False,
    details: DetailsOpt = False,
) -> None:
    """Cancel a scheduled resume (no-op, exit 0, when none is scheduled)."""
    m = _mutation("cancel", service, reason, actor, None, options_of(ctx).services)
    _run_mutation(ctx, location, m, as_json, details)


