"""``pause``, ``resume`` and ``cancel-schedule``: the operator's mutations (docs/cli.md).

One location is one Manager call (then an optional wait); ``all`` is a bulk operation that
runs per location (every location that is not removed) and reports one result per location,
the exit code the worst of them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated

import typer
import typer.core
from rich.table import Table
from rich.text import Text

from locstatus.errors import (
    CorruptRecord,
    InvalidInput,
    InvalidTransition,
    LocstatusError,
    NotFound,
    SettleTimeout,
)
from locstatus.manager import Manager
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
    ) -> tuple[LocationStatus, list[str]]:
        """Apply to ``location``; return the stored record and the services this call changed
        (empty for an idempotent no-op)."""
        op_id = new_op_id()
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
        return rec, changed

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
    rec, changed = m.apply(mgr, location, m.services)
    if m.wait is not None:
        rec = mgr.wait_settled(location, list(m.services) if m.services else None, timeout=m.wait)
    if as_json:
        print_json(rec.model_dump_json(indent=2))
        return
    console = new_console()
    console.print(plain(m.describe(location, rec, changed)))
    console.print(location_table(rec, mgr.clock(), only=m.services))


@dataclass
class _BulkResult:
    location: str
    result: str  # changed | unchanged | skipped | error
    detail: str
    exit_code: int = 0
    status: LocationStatus | None = None


def _run_bulk(mgr: Manager, m: _Mutation, as_json: bool) -> None:
    results: list[_BulkResult] = []
    pending: list[tuple[_BulkResult, list[str] | None]] = []
    for item in mgr.scan():
        if isinstance(item, CorruptRecord):
            results.append(_BulkResult(item.location, "error", item.message, item.exit_code))
            continue
        if item.deleted:
            continue
        loc = item.location
        targets: list[str] | None = None
        if m.services is not None:
            targets = [s for s in m.services if s in item.services]
            if not targets:
                results.append(
                    _BulkResult(loc, "skipped", f"has no {', '.join(m.services)}", 0, item)
                )
                continue
        try:
            rec, changed = m.apply(mgr, loc, targets)
        except InvalidTransition as exc:
            if m.kind == "schedule":  # running locations simply have nothing to schedule
                results.append(_BulkResult(loc, "skipped", "nothing paused to schedule", 0, item))
                continue
            results.append(_BulkResult(loc, "error", exc.message, exc.exit_code))
            continue
        except LocstatusError as exc:
            results.append(_BulkResult(loc, "error", exc.message, exc.exit_code))
            continue
        res = _BulkResult(
            loc,
            "changed" if changed else "unchanged",
            m.describe(loc, rec, changed).split(": ", 1)[1],
            0,
            rec,
        )
        results.append(res)
        pending.append((res, targets))
    if m.wait is not None:
        deadline = time.monotonic() + m.wait
        for res, targets in pending:
            try:
                res.status = mgr.wait_settled(
                    res.location, targets, timeout=max(0.0, deadline - time.monotonic())
                )
            except SettleTimeout as exc:
                res.result, res.detail, res.exit_code = "error", exc.message, exc.exit_code
    results.sort(key=lambda r: r.location)
    if not results:
        raise NotFound("no locations: import them first with 'locstatus locations sync FILE'")
    if as_json:
        print_json(
            json.dumps(
                [
                    {
                        "location": r.location,
                        "result": r.result,
                        "detail": r.detail,
                        "status": None if r.status is None else r.status.model_dump(mode="json"),
                    }
                    for r in results
                ],
                indent=2,
            )
        )
    else:
        table = Table(title=f"{m.command} {ALL}", title_justify="left")
        for col in ("Location", "Result", "Detail"):
            table.add_column(col)
        style = {"changed": "green", "unchanged": "", "skipped": "dim", "error": "bold red"}
        for r in results:
            table.add_row(Text(r.location), Text(r.result, style=style[r.result]), plain(r.detail))
        new_console().print(table)
    errors = [r for r in results if r.result == "error"]
    for r in errors:
        typer.echo(f"error: {escaped(r.detail)}", err=True)
    if errors:
        raise typer.Exit(max(r.exit_code for r in errors))
    if all(r.result == "skipped" for r in results):
        what = ", ".join(m.services) if m.services else "service"
        fail(
            f"{m.command} {ALL}: no location had a {what} to act on (every location was skipped)",
            1,
        )


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


