"""``status``, ``history`` and ``workers``: what the operator reads (docs/cli.md).

A record or a registration that cannot be read is shown as an error beside the readable ones,
never left out (exit 2 after the rest was shown).
"""

from __future__ import annotations

import math
from typing import Annotated

import typer
import typer.core

from locstatus.audit import history_by_actor
from locstatus.errors import (
    CorruptRecord,
)
from locstatus.manager.liveness import RETIRE_ADVICE
from locstatus.models import WorkerInfo
from locstatus.names import (
    MAX_ACTOR,
    check_location,
    check_worker_id,
)

from .app import (
    ALL,
    ActorOpt,
    JsonOpt,
    app,
    options_of,
)
from .fit import Col, fitted
from .parsing import (
    check_option_text,
    default_actor,
    parse_number,
)
from .rendering import (
    HISTORY_LIST,
    STATUS_LIST,
    WORKER_LIST,
    escaped,
    iso,
    location_table,
    new_console,
    plain,
    print_json,
    report_corrupt,
    report_corrupt_workers,
    state_name,
    status_table,
    workers_table,
)
from .suggest import suggesting


@app.command()
def status(
    ctx: typer.Context,
    location: Annotated[
        str | None,
        typer.Argument(
            metavar="[LOCATION]", help="One location (default: all).", show_default=False
        ),
    ] = None,
    as_json: JsonOpt = False,
    include_removed: Annotated[
        bool, typer.Option("--include-removed", help="Also list removed locations.")
    ] = False,
) -> None:
    """Show the status of one location or of every location."""
    if location is not None and location != ALL:
        check_location(location)
        mgr = options_of(ctx).manager()
        with suggesting(mgr, location):
            rec = mgr.status(location)
        if as_json:
            print_json(rec.model_dump_json(indent=2))
        else:
            console = new_console()
            console.print(location_table(rec, mgr.clock(), width=console.width))
        return
    mgr = options_of(ctx).manager()
    records, corrupt = mgr.listing(include_removed=include_removed)
    if as_json:
        print_json(STATUS_LIST.dump_json(records, indent=2).decode())
    elif not records and not corrupt:
        new_console().print("no locations: import them with 'locstatus locations sync FILE'")
    else:
        console = new_console()
        console.print(status_table(records, corrupt, mgr.clock(), width=console.width))
    report_corrupt(corrupt)


@app.command()
def history(
    ctx: typer.Context,
    location: Annotated[str, typer.Argument(metavar="LOCATION", show_default=False)],
    limit: Annotated[
        str, typer.Option("--limit", metavar="N", help="Newest entries to show (1..10000).")
    ] = "50",
    as_json: JsonOpt = False,
    actor: Annotated[
        str | None,
        typer.Option("--actor", metavar="NAME", help="Only the changes of this actor (audit)."),
    ] = None,
) -> None:
    """Show the history of a location, newest first."""
    check_location(location)
    count = int(parse_number("--limit", limit, low=1, high=10_000, integer=True))
    mgr = options_of(ctx).manager()
    try:
        with suggesting(mgr, location):
            mgr.status(location)  # unknown location: refused (exit 1)
    except CorruptRecord as exc:  # the history of a corrupt record is what one wants to see
        typer.echo(f"warning: {escaped(exc.message)}", err=True)
    entries = (
        mgr.history(location, limit=count)
        if actor is None
        else history_by_actor(mgr, location, actor, limit=count)
    )
    if as_json:
        print_json(HISTORY_LIST.dump_json(entries, indent=2).decode())
        return
    rows = []
    for e in entries:
        move = ""
        if e.from_state is not None or e.to_state is not None:
            move = f"{state_name(e.from_state)} -> {state_name(e.to_state)}"
        rows.append([
            iso(e.at), str(e.version), plain(e.service), plain(e.event), move,
            str(e.generation), iso(e.resume_at), plain(e.actor), plain(e.reason),
        ])
    console = new_console()
    console.print(fitted(
        f"history of {location}", _HISTORY_COLS, rows, console.width,
        priority=_HISTORY_PRIORITY,
    ))


_HISTORY_COLS = (
    Col("At", keep=True),
    Col("Version", wrap=False),
    Col("Service", keep=True),
    Col("Event", keep=True),
    Col("From -> to", wrap=False),
    Col("Gen", wrap=False),
    Col("Resume at", wrap=False),
    Col("Actor"),
    Col("Reason"),
)
"""The ``history`` columns: when, which service and what happened are never cut
(docs/cli.md, "Reading state"); the others by priority (:data:`_HISTORY_PRIORITY`)."""

_HISTORY_PRIORITY = (0, 2, 3, 4, 6, 1, 8, 7, 5)


workers_app = typer.Typer(
    help="List registered workers; 'workers retire' ends a registration.",
    invoke_without_command=True,
    rich_markup_mode=None,
)
app.add_typer(workers_app, name="workers")


@workers_app.callback()
def workers(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """List registered workers: lease, clock offset, services, location filter, lag, stuck
    handlers (past the agent's handler deadline) and handler errors. A lease counts as expired
    only once it passed by the backend's time beyond doubt; the clock offset is the one each
    worker published (its host's clock minus the backend's). A standing registration is shown
    away while its holder is (docs/agent.md "Standing registrations"). A record that cannot be
    read is named where its lag is unknown, and a registration that cannot be read is listed as
    the live worker it counts as; both are errors (exit 2)."""
    if ctx.invoked_subcommand is not None:
        return
    mgr = options_of(ctx).manager()
    now = mgr.clock()
    infos, corrupt = mgr.worker_statuses()
    if as_json:
        print_json(WORKER_LIST.dump_json(infos, indent=2, by_alias=True).decode())
    elif not infos:
        new_console().print("no workers registered")
    else:
        console = new_console()
        console.print(workers_table(infos, now, mgr.time.offset_seconds()))
        for w in infos:  # what to do about each holder that is away (docs/agent.md)
            if w.standing and w.away:
                console.print(plain(
                    f"{w.worker_id}: its holder (host {w.host or '?'}, pid {w.pid}) is not "
                    f"running; start it again; {RETIRE_ADVICE}: "
                    f"locstatus workers retire "
                    f"{w.worker_id}"), soft_wrap=True)
    report_corrupt_workers([w for w in infos if w.corrupt is not None], bool(corrupt))
    report_corrupt(corrupt)




@workers_app.command("retire")
def retire(
    ctx: typer.Context,
    worker_id: Annotated[
        str, typer.Argument(metavar="WORKER_ID", help="The registration to end.")
    ],
    actor: ActorOpt = None,
    force: Annotated[
        bool, typer.Option("--force", help="For a standing registration whose holder is "
                           "present: wait for it to be away (at most until its lease runs "
                           "out), then retire it; for a holder known gone whose lease has not "
                           "run out yet. A holder that runs keeps it (exit 1).")
    ] = False,
) -> None:
    """End a worker's registration and drop its acknowledgements, so it no longer counts for
    settle: how a standing registration (the Backbeat bridge's processors) ends when what it
    stands for is gone for good (docs/agent.md "Standing registrations"). A standing
    registration whose holder is present is never retired: refused (naming its host and pid),
    or with --force once that holder is away (its lease or session ran out). Exit 0 done, 1 no
    such worker or its holder present, 2 bad input or backend unavailable."""
    check_worker_id(worker_id)  # named as a worker id, before the backend is opened
    check_option_text("--actor", actor, MAX_ACTOR)
    mgr = options_of(ctx).manager()

    def waiting(held: WorkerInfo, seconds: float) -> None:  # the wait is silent otherwise
        typer.echo(escaped(
            f"waiting up to {math.ceil(seconds)} s for {worker_id}'s holder (host "
            f"{held.host or '?'}, pid {held.pid}) to be away (its lease or session to run "
            "out) ..."), err=True)

    info = mgr.retire_worker(worker_id, actor=actor or default_actor(), force=force,
                             on_wait=waiting)
    kind = "standing registration" if info.standing else "registration"
    new_console().print(plain(f"retired the {kind} of {worker_id}"))
