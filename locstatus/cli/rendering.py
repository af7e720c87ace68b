"""How the CLI shows things: rich tables for a person, JSON for a script, and error lines on
stderr (docs/cli.md).

Text that came from the store (reasons, actors, handler errors) is printed as plain text, never
as rich markup or terminal control codes (:func:`plain`, :func:`escaped`); tables piped into a
file are not cut at 80 columns (:func:`new_console`). Nothing here reads a backend: every
function takes what the commands read.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import typer
import typer.core
from pydantic import TypeAdapter
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from locstatus.errors import (
    CorruptRecord,
)
from locstatus.manager import WorkerStatus, stuck_handlers
from locstatus.models import (
    HistoryEntry,
    LocationStatus,
    ServiceStatus,
    State,
    WorkerInfo,
)
from locstatus.names import (
    printable,
)

from .fit import Col, fitted

_STATE_STYLE = {
    State.RUNNING: "green",
    State.PAUSING: "yellow",
    State.PAUSED: "bold red",
    State.RESUMING: "cyan",
}

STATUS_LIST = TypeAdapter(list[LocationStatus])
HISTORY_LIST = TypeAdapter(list[HistoryEntry])
WORKER_LIST = TypeAdapter(list[WorkerStatus])


def escaped(message: str) -> str:
    """A message for the terminal: control characters from stored or foreign text (a reason,
    a handler's error) escaped line by line (:func:`locstatus.names.printable`)."""
    return "\n".join(printable(line) for line in message.split("\n"))


def plain(value: str | None, style: str = "") -> Text:
    """Stored or foreign text as a cell: plain (no markup), control characters escaped."""
    return Text(printable(value or ""), style=style)


def new_console() -> Console:
    """Tables for a terminal fit its width; piped into grep or a file (no terminal, no
    ``COLUMNS``), they are not cut at 80 columns: a location name must stay greppable."""
    width = None
    if not sys.stdout.isatty() and "COLUMNS" not in os.environ:
        width = _PIPE_WIDTH
    return Console(highlight=False, soft_wrap=False, width=width)


_PIPE_WIDTH = 240
"""Table width (characters) when stdout is not a terminal."""


def print_json(text: str) -> None:
    typer.echo(text)


def iso(when: datetime | None) -> str:
    if when is None:
        return ""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


SKEW_SHOWN = 1.0
"""Seconds of clock offset above which ``workers`` shows a worker's offset in red (the check
job's default ``--max-skew``)."""


def offset_text(seconds: float) -> str:
    """``+0.012s`` / ``+3h0m (+10800s)``: a clock offset to the backend (positive: ahead)."""
    if abs(seconds) < 60:
        return f"{seconds:+.3f}s"
    return f"{'+' if seconds > 0 else '-'}{span(abs(seconds))} ({seconds:+.0f}s)"


def offset_cell(seconds: float | None) -> Text:
    if seconds is None:
        return Text("-", style="dim")
    return Text(offset_text(seconds), style="bold red" if abs(seconds) > SKEW_SHOWN else "")


def ago(when: datetime, now: datetime) -> str:
    delta = (when - now).total_seconds()
    text = span(abs(delta))
    return f"in {text}" if delta >= 0 else f"{text} ago"


def span(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    parts = [(s // 86_400, "d"), (s % 86_400 // 3_600, "h"), (s % 3_600 // 60, "m")]
    return "".join(f"{v}{u}" for v, u in parts if v) or "0m"


def state_name(state: State | None) -> str:
    return state.value if state is not None else "-"


def state_text(st: ServiceStatus) -> Text:
    return Text(st.state.value, style=_STATE_STYLE[st.state])


def resume_text(st: ServiceStatus, now: datetime) -> Text:
    if st.resume_at is None:
        return Text("")
    return Text(f"{iso(st.resume_at)} ({ago(st.resume_at, now)})", style="cyan")


def who(st: ServiceStatus) -> Text:
    parts = [p for p in (st.reason, f"by {st.actor}" if st.actor else None) if p]
    return plain(" ".join(parts))


def location_table(
    rec: LocationStatus, now: datetime, only: Sequence[str] | None = None,
    width: int | None = None,
) -> Table:
    """One location's services; ``width``: the terminal's (:func:`fitted`)."""
    title = f"{rec.location}  version {rec.version}"
    if rec.deleted:
        title += f"  REMOVED {iso(rec.deleted_at)}"
    rows = [
        [Text(svc), state_text(st), resume_text(st, now), str(st.generation),
         iso(st.updated_at), who(st)]
        for svc, st in sorted(rec.services.items())
        if only is None or svc in only
    ]
    return fitted(Text(title), _SERVICE_COLS, rows, width)


_SERVICE_COLS = (
    Col("Service", keep=True),
    Col("State", keep=True),
    Col("Scheduled resume", least=20),
    Col("Gen", wrap=False),
    Col("Updated", wrap=False),
    Col("Reason / actor"),
)

_STATUS_COLS = (
    Col("Location", keep=True),
    Col("Service", keep=True),
    Col("State", keep=True),
    Col("Scheduled resume", least=20),
    Col("Gen", wrap=False),
    Col("Version", wrap=False),
    Col("Updated", wrap=False),
    Col("Reason / actor"),
)
"""The ``status`` columns; a narrow terminal shows the kept ones, then the others by priority:
the schedule, the reason, ... (:func:`fitted`)."""

_STATUS_PRIORITY = (0, 1, 2, 3, 7, 6, 4, 5)
"""Which of :data:`_STATUS_COLS` a narrow terminal keeps first (the order they are tried in)."""


def status_table(
    records: Sequence[LocationStatus],
    corrupt: Sequence[CorruptRecord],
    now: datetime,
    width: int | None = None,
) -> Table:
    """Every location's services; ``width``: the terminal's (:func:`fitted`): Location,
    Service and State are never cut, the other columns fold or are left out."""
    rows: list[tuple[str, list[Any]]] = []
    for rec in records:
        first = True
        for svc, st in sorted(rec.services.items()):
            name = rec.location + (" (removed)" if rec.deleted else "")
            rows.append(
                (
                    rec.location,
                    [
                        Text(name if first else ""),
                        Text(svc),
                        state_text(st),
                        resume_text(st, now),
                        str(st.generation),
                        str(rec.version) if first else "",
                        iso(st.updated_at),
                        who(st),
                    ],
                )
            )
            first = False
    for bad in corrupt:
        rows.append(
            (
                bad.location,
                [
                    Text(bad.location), "", Text("CORRUPT", style="bold red"), "", "", "", "",
                    Text("see 'locstatus check'"),
                ],
            )
        )
    ordered = [row for _, row in sorted(rows, key=lambda r: r[0])]
    return fitted("locations", _STATUS_COLS, ordered, width, priority=_STATUS_PRIORITY)


def report_corrupt(corrupt: Sequence[CorruptRecord]) -> None:
    """Name every corrupt record on stderr and exit 2 after the readable ones were shown."""
    if not corrupt:
        return
    for bad in corrupt:
        typer.echo(f"error: {escaped(bad.message)}", err=True)
    typer.echo(
        f"error: {len(corrupt)} corrupt record(s); run 'locstatus check' for details", err=True
    )
    raise typer.Exit(2)



def workers_table(
    rows: Sequence[WorkerStatus],
    now: datetime,
    own: float | None,
) -> Table:
    """The ``workers`` table; ``own``: this host's clock minus the backend's (seconds)."""
    table = Table(
        title="workers",
        title_justify="left",
        caption=(
            None if own is None else f"this host's clock minus the backend's: {offset_text(own)}"
        ),
        caption_justify="left",
    )
    for col in (
        "Worker", "Host/pid", "Lease", "Clock", "Services", "Locations", "Lagging", "Stuck",
        "Errors",
    ):
        table.add_column(col)
    for w in rows:
        alive = w.live
        if w.standing and w.away:
            since = w.lease_expires_at
            lease = Text(
                "standing, away"
                + (" (no session holds it; since when is not recorded)" if since is None
                   else f" since {iso(since)} ({ago(since, now)})"),
                style="bold yellow",
            )
        elif w.lease_expires_at is None:
            lease = Text("alive (session)", style="green") if alive else Text("expired")
        elif alive:
            lease = Text(f"alive ({ago(w.lease_expires_at, now)})", style="green")
        else:
            lease = Text(f"expired ({ago(w.lease_expires_at, now)})", style="bold red")
        if w.standing and not w.away:
            lease.append(", standing")
        lagging = Text(", ".join(
            f"{x.location}/{x.service} ({x.acked}<{x.generation})" if x.acked is not None
            else f"{x.location}/{x.service} (?<{x.generation}: acknowledgement unknown, "
                 "lapsed with its holder's session)"
            for x in w.lagging
        ), style="yellow")
        for loc in w.lag_unknown:
            lagging.append(", " if len(lagging) else "")
            lagging.append(f"{loc}/? (record corrupt)", style="bold red")
        errors = "; ".join(f"{k}: {v}" for k, v in sorted(w.errors.items()))
        if w.corrupt is not None:
            errors = f"registration corrupt: {w.corrupt}"
        stuck = stuck_handlers([w], [w.worker_id], now).get(w.worker_id, "")
        table.add_row(
            Text(w.worker_id),
            plain(f"{w.host}/{w.pid}" if w.corrupt is None else "?"),
            lease,
            offset_cell(w.clock_offset_seconds),
            Text(", ".join(w.services) if w.corrupt is None else "all (unreadable)"),
            Text("all" if w.locations is None else ", ".join(w.locations)),
            lagging if len(lagging) else Text("-"),
            plain(stuck or "-", style="bold red" if stuck else ""),
            plain(errors or "-", style="red" if errors else ""),
        )
    return table


def report_corrupt_workers(corrupt: Sequence[WorkerInfo], more: bool) -> None:
    """Name every unreadable registration on stderr; exit 2 unless ``more`` errors (corrupt
    records, reported next) will."""
    if not corrupt:
        return
    for w in corrupt:
        what = f"worker {w.worker_id!r}: registration does not parse ({w.corrupt})"
        typer.echo(
            f"error: {escaped(what)}; counted as a live worker applying every service at "
            "every location",
            err=True,
        )
    typer.echo(
        f"error: {len(corrupt)} corrupt worker registration(s); run 'locstatus check' for details",
        err=True,
    )
    if not more:
        raise typer.Exit(2)



@contextmanager
def bulk_progress(
    label: str, *, enabled: bool = True, console: Console | None = None
) -> Iterator[Callable[[int, int | None], None]]:
    """A transient progress bar of a bulk operation on stderr, ``update(done, total)`` called
    as each location is decided (``total`` None: not known yet). Drawn only on a terminal
    (``console``: where to draw, a terminal console on stderr by default): piped or captured,
    ``update`` does nothing, so a script's output never holds a bar (docs/cli.md, "Bulk:
    `all`"); nor with ``enabled`` False (``--json``)."""
    console = console or Console(stderr=True)
    if not enabled or not console.is_terminal:
        yield lambda _done, _total: None
        return
    columns = (
        TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int | None) -> None:
            bar.update(task, completed=done, total=total)

        yield update
