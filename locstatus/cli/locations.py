"""``locations sync`` and ``locations list``: importing a location list into the store
(docs/cli.md, docs/design.md §5.2).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Annotated

import typer
import typer.core
from rich.table import Table
from rich.text import Text

from locstatus.errors import (
    CorruptRecord,
    InvalidInput,
)
from locstatus.locations import load_locations, load_sample
from locstatus.manager import SyncReport
from locstatus.names import (
    MAX_ACTOR,
)

from .app import (
    ActorOpt,
    JsonOpt,
    locations_app,
    options_of,
)
from .parsing import (
    check_option_text,
    default_actor,
)
from .rendering import (
    STATUS_LIST,
    escaped,
    iso,
    new_console,
    print_json,
    report_corrupt,
)

CORRUPT_ADVICE = (
    "'locstatus check' reports it and never rewrites it: restore it by hand with the "
    "backend's own client, with every field, then sync again (docs/check.md, \"Repairs are "
    "exactly once\")"
)
"""What a refused sync tells the operator to do about a corrupt record: the check reports
such a record but never repairs it (docs/check.md), so the advice is the hand restore."""


@locations_app.command("sync")
def locations_sync(
    ctx: typer.Context,
    file: Annotated[
        str | None,
        typer.Argument(
            metavar="FILE",
            help="Plain list (one name per line), Backbeat config.json or locationConfig.json.",
            show_default=False,
        ),
    ] = None,
    location_config: Annotated[
        str | None,
        typer.Option(
            "--location-config",
            metavar="FILE",
            help="Backbeat locationConfig.json (its keys get lifecycle).",
        ),
    ] = None,
    keep_missing: Annotated[
        bool, typer.Option("--keep-missing", help="Do not remove locations absent from FILE.")
    ] = False,
    sample: Annotated[
        bool,
        typer.Option(
            "--sample",
            help="Use the packaged sample config.json and locationConfig.json instead of FILE.",
        ),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show what would change; write nothing.")
    ] = False,
    actor: ActorOpt = None,
    as_json: JsonOpt = False,
    details: Annotated[
        bool,
        typer.Option(
            "--details",
            help=f"One row per location (the default above {SUMMARY_OVER} is a summary).",
        ),
    ] = False,
) -> None:
    """Make the stored locations match a location list: add missing locations and services,
    restore removed ones, and remove (tombstone) locations the list no longer has."""
    configured = options_of(ctx).services
    check_option_text("--actor", actor, MAX_ACTOR)
    if sample:
        if file is not None or location_config is not None:
            raise InvalidInput(f"--sample takes no FILE or --location-config (got {file!r})")
        wanted = load_sample(configured)
    elif file is None:
        raise InvalidInput("missing FILE (or --sample)")
    else:
        wanted = load_locations(file, location_config, services=configured)
    mgr = options_of(ctx).manager(create=True)
    who = actor or default_actor()
    # One implementation: the dry run is the manager's (docs/cli.md, "Importing locations");
    # a list that names a corrupt record is refused before anything is written.
    report = mgr.sync_locations(wanted, actor=who, remove_missing=not keep_missing, dry_run=True)
    for loc in report.corrupt:
        try:
            mgr.status(loc)
        except CorruptRecord as exc:
            raise CorruptRecord(loc, f"{exc.detail} ({CORRUPT_ADVICE})") from None
    if not dry_run:
        report = mgr.sync_locations(wanted, actor=who, remove_missing=not keep_missing)
    if as_json:
        print_json(
            json.dumps(
                {
                    "dry_run": dry_run,
                    "added": report.added,
                    "restored": report.restored,
                    "removed": report.removed,
                    "services_added": report.services_added,
                    "unchanged": report.unchanged,
                    "locations": {k: list(v) for k, v in wanted.items()},
                },
                indent=2,
            )
        )
        return
    title = "locations sync" + (" (dry run: nothing written)" if dry_run else "")
    if details or len(wanted) + len(report.removed) <= SUMMARY_OVER:
        _sync_table(title, wanted, report)
    else:
        _sync_summary(title, wanted, report)
    if report.kept:
        new_console().print(Text(f"kept (not in the list): {', '.join(report.kept)}"))


SUMMARY_OVER = 50
"""Above this many locations a sync shows a summary unless ``--details`` is given, as a bulk
operation does (docs/cli.md, "Importing locations"): a table of 100 000 rows takes rich
minutes to draw."""

FIRST = 10
"""How many locations of each change a summary names."""


def _sync_table(title: str, wanted: Mapping[str, Sequence[str]], report: SyncReport) -> None:
    table = Table(title=title, title_justify="left")
    for col in ("Location", "Services", "Change"):
        table.add_column(col)
    added, restored = set(report.added), set(report.restored)  # a lookup per row
    for loc, svcs in wanted.items():
        if loc in added:
            change = Text("added", style="green")
        elif loc in restored:
            change = Text("restored", style="green")
        elif loc in report.services_added:
            change = Text("services added: " + ", ".join(report.services_added[loc]), style="green")
        else:
            change = Text("unchanged", style="dim")
        table.add_row(Text(loc), Text(", ".join(svcs)), change)
    for loc in report.removed:
        table.add_row(Text(loc), "", Text("removed", style="yellow"))
    new_console().print(table)


def _sync_summary(title: str, wanted: Mapping[str, Sequence[str]], report: SyncReport) -> None:
    """One line of counts, then the first :data:`FIRST` locations of each change."""
    changes = {
        "added": report.added,
        "restored": report.restored,
        "services added": list(report.services_added),
        "removed": report.removed,
        "unchanged": report.unchanged,
    }
    counts = [f"{len(locs)} {change}" for change, locs in changes.items() if locs]
    typer.echo(f"{title}: {', '.join(counts) or 'nothing to do'}")
    for change, locs in changes.items():
        if not locs or change == "unchanged":
            continue
        shown = ", ".join(escaped(loc) for loc in locs[:FIRST])
        more = f" and {len(locs) - FIRST} more" if len(locs) > FIRST else ""
        typer.echo(f"  {change}: {shown}{more}")
    typer.echo(
        f"({len(wanted) + len(report.removed)} locations: --details shows one row per location)"
    )


@locations_app.command("list")
def locations_list(
    ctx: typer.Context,
    as_json: JsonOpt = False,
) -> None:
    """List every stored location (removed ones included) with its services."""
    mgr = options_of(ctx).manager()
    records, corrupt = mgr.listing(include_removed=True)
    if as_json:
        print_json(STATUS_LIST.dump_json(records, indent=2).decode())
    else:
        table = Table(title="locations", title_justify="left")
        for col in ("Location", "Services", "Version", "Removed"):
            table.add_column(col)
        for rec in records:
            table.add_row(
                Text(rec.location),
                Text(", ".join(sorted(rec.services))),
                str(rec.version),
                Text(iso(rec.deleted_at), style="yellow") if rec.deleted else "",
            )
        for bad in corrupt:
            table.add_row(Text(bad.location), Text("CORRUPT", style="bold red"), "", "")
        new_console().print(table)
    report_corrupt(corrupt)


