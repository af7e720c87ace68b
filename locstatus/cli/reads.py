"""``status``, ``history`` and ``workers``: what the operator reads (docs/cli.md).

A record or a registration that cannot be read is shown as an error beside the readable ones,
never left out (exit 2 after the rest was shown).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
import typer.core
from rich.table import Table

from locstatus.audit import history_by_actor
from locstatus.errors import (
    CorruptRecord,
)
from locstatus.manager import worker_live
from locstatus.models import (
    WorkerInfo,
)
from locstatus.names import (
    check_location,
)

from .app import (
    ALL,
    JsonOpt,
    app,
    options_of,
)
from .parsing import (
    parse_number,
)
from .rendering import (
    HISTORY_LIST,
    STATUS_LIST,
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
        rec = mgr.status(location)
        if as_json:
            print_json(rec.model_dump_json(indent=2))
        else:
            new_console().print(location_table(rec, mgr.clock()))
        return
    mgr = options_of(ctx).manager()
    records, corrupt = mgr.listing(include_removed=include_removed)
    if as_json:
        print_json(STATUS_LIST.dump_json(records, indent=2).decode())
    elif not records and not corrupt:
        new_console().print("no locations: import them with 'locstatus locations sync FILE'")
    else:
        new_console().print(status_table(records, corrupt, mgr.clock()))
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
    table = Table(title=f"history of {location}", title_justify="left")
    for col in (
        "At",
        "Version",
        "Service",
        "Event",
        "From -> to",
        "Gen",
        "Resume at",
        "Actor",
        "Reason",
    ):
        table.add_column(col)
    for e in entries:
        move = ""
        if e.from_state is not None or e.to_state is not None:
            move = f"{state_name(e.from_state)} -> {state_name(e.to_state)}"
        table.add_row(
            iso(e.at),
            str(e.version),
            plain(e.service),
            plain(e.event),
            move,
            str(e.generation),
            iso(e.resume_at),
            plain(e.actor),
            plain(e.reason),
        )
    new_console().print(table)


@app.command()
def workers(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """List registered workers: lease, clock offset, services, location filter, lag, stuck
    handlers (past the agent's handler deadline) and handler errors. A lease counts as expired
    only once it passed by the backend's time beyond doubt; the clock offset is the one each
    worker published (its host's clock minus the backend's). A record that cannot be read is
    named where its lag is unknown, and a registration that cannot be read is listed as the
    live worker it counts as; both are errors (exit 2)."""
    mgr = options_of(ctx).manager()
    now = mgr.clock()
    infos = mgr.workers()
    records, corrupt = mgr.listing()
    acks = mgr.backend.all_acks()
    rows: list[tuple[WorkerInfo, bool, list[dict[str, Any]], list[str]]] = []
    for w in infos:
        alive = worker_live(w, mgr.time)
        lag: list[dict[str, Any]] = []
        for rec in records:
            for svc, st in sorted(rec.services.items()):
                if not w.applies(rec.location, svc):
                    continue
                acked = acks.get(rec.location, {}).get(w.worker_id, {}).get(svc, 0)
                if acked < st.generation:
                    lag.append(
                        {
                            "location": rec.location,
                            "service": svc,
                            "acked": acked,
                            "generation": st.generation,
                        }
                    )
        unknown = [  # its lag there cannot be told: the record does not read
            bad.location
            for bad in corrupt
            if w.corrupt is not None or w.locations is None or bad.location in w.locations
        ]
        rows.append((w, alive, lag, unknown))
    if as_json:
        print_json(
            json.dumps(
                [
                    {**w.model_dump(mode="json"), "alive": alive, "lagging": lag,
                     "lag_unknown": unknown}
                    for w, alive, lag, unknown in rows
                ],
                indent=2,
            )
        )
    elif not rows:
        new_console().print("no workers registered")
    else:
        new_console().print(workers_table(rows, now, mgr.time.offset_seconds()))
    report_corrupt_workers([w for w in infos if w.corrupt is not None], bool(corrupt))
    report_corrupt(corrupt)


