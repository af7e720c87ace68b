"""How the CLI shows a bulk operation's report (``pause all``...: docs/cli.md, "Bulk: `all`").

Shaped for the fleet and for an incident: above :data:`SUMMARY_OVER` locations the default is a
summary (counts per result, the first failures and skips), because a 10 000-row table takes
seconds to draw; ``--details`` draws the table. ``--json`` is one item per location, written
as each is encoded (never the whole list as one string). A Ctrl-C while drawing (a second one,
after the operation's own) never leaves the screen empty: the drawing stops and one line per
result says what was done. The counts tell apart what no person should read as "done": a
location whose write's outcome is unknown (its write was in flight at a Ctrl-C, or a connection
lost mid-commit) and, once interrupted, the locations never reached.
"""

from __future__ import annotations

import json
import signal
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import typer
from pydantic_core import PydanticSerializationError
from rich.table import Table
from rich.text import Text

from locstatus.errors import AmbiguousCommit
from locstatus.manager import BulkItem, BulkReport, Outcome, interrupted

from .rendering import escaped, iso, new_console, plain

SUMMARY_OVER = 50
"""Above this many locations the report is a summary unless ``--details`` is given."""

FIRST = 10
"""How many failures, then skips, a summary lists by name."""

RESULT = {
    Outcome.CHANGED: "changed",
    Outcome.UNCHANGED: "unchanged",
    Outcome.SKIPPED: "skipped",
    Outcome.FAILED: "error",
}
_STYLE = {
    "changed": "green", "rescheduled": "yellow", "unchanged": "", "skipped": "dim",
    "error": "bold red",
}

UNKNOWN = "outcome unknown"
"""The summary's name of a failed location whose write may or may not have been applied
(:class:`~locstatus.errors.AmbiguousCommit`); ``--json`` and the table keep ``error``."""

_KINDS = ("changed", "rescheduled", "unchanged", "skipped", "error", UNKNOWN)
"""The summary's counts, in this order."""
_WORDS = {"error": ("error", "errors")}
"""How the counts name a kind (one location, several); a kind not here is its own name."""
_MORE = _WORDS | {UNKNOWN: ("with an unknown outcome",) * 2}
"""The same for "... and N more ..."."""

Detail = Callable[[BulkItem], str]
"""The detail of one changed/unchanged location (what its write left), for the table."""


def result_of(item: BulkItem) -> str:
    return "rescheduled" if item.rescheduled else RESULT[item.outcome]


def kind_of(item: BulkItem) -> str:
    """What the summary counts ``item`` as: its result, but :data:`UNKNOWN` for a failed
    location whose write's outcome is unknown."""
    if item.outcome is Outcome.FAILED and isinstance(item.error, AmbiguousCommit):
        return UNKNOWN
    return result_of(item)


def plural(count: int, kind: str, *, more: bool = False) -> str:
    """``count`` locations of ``kind`` as the summary says it: ``1 error``, ``990 errors``,
    ``5 skipped``; ``more``: ``990 more errors``, ``3 more with an unknown outcome``."""
    one, several = (_MORE if more else _WORDS).get(kind, (kind, kind))
    return f"{count} {'more ' if more else ''}{one if count == 1 else several}"


def tally(report: BulkReport) -> list[str]:
    """The count of each kind present (:func:`kind_of`: ``2000 changed``, ``1 error``,
    ``1000 outcome unknown``), then, for an interrupted operation, ``N not reached``: the
    locations it never looked at (docs/cli.md, "Bulk: `all`")."""
    counts = Counter(kind_of(i) for i in report.items)
    parts = [plural(counts[k], k) for k in _KINDS if counts[k]]
    if report.interrupted and report.total is not None and report.total > len(report.items):
        parts.append(f"{report.total - len(report.items)} not reached")
    return parts


def left_settling(report: BulkReport) -> list[BulkItem]:
    """The changed locations an interrupted operation left pausing/resuming (their settle
    batch, or their workers, not reached): the next settle finishes them."""
    if not report.interrupted:
        return []
    return [
        i for i in report.items
        if i.outcome is Outcome.CHANGED and i.status is not None
        and any(i.status.services[s].state.transitional for s in i.changed)
    ]


def show(report: BulkReport, title: str, detail: Detail, *, as_json: bool, full: bool) -> None:
    """Print the report: ``--json`` items, the table (``full`` or few locations) or the
    summary. Raises ``typer.Exit(130)`` after the fallback lines when Ctrl-C stopped the
    drawing."""
    try:
        if as_json:
            _json(report, detail)
            _settling_line(report, err=True)
        elif full or len(report.items) <= SUMMARY_OVER:
            _table(report, title, detail)
        else:
            _summary(report, title, detail, err=False)
    except (KeyboardInterrupt, PydanticSerializationError) as exc:
        if not interrupted(exc):
            raise
        with _no_more_interrupts():
            typer.echo("", err=as_json)
            _counts(report, title, err=as_json)
            typer.echo(f"error: {title}: interrupted while showing the report", err=True)
        raise typer.Exit(130) from None


def _text(item: BulkItem, detail: Detail) -> str:
    if item.why:
        return item.why
    if item.error is not None:
        return item.error.message
    return detail(item)


def _json(report: BulkReport, detail: Detail) -> None:
    out = sys.stdout
    out.write("[")
    for n, item in enumerate(report.items):
        entry = {
            "location": item.location,
            "result": result_of(item),
            "detail": _text(item, detail),
            "status": None if item.status is None else item.status.model_dump(mode="json"),
            **({"rescheduled": {s: iso(w) for s, w in item.rescheduled}}
               if item.rescheduled else {}),
        }
        out.write(("," if n else "") + "\n  " + json.dumps(entry))
    out.write("\n]\n" if report.items else "]\n")
    out.flush()


def _table(report: BulkReport, title: str, detail: Detail) -> None:
    table = Table(title=title, title_justify="left")
    for col in ("Location", "Result", "Detail"):
        table.add_column(col)
    for item in report.items:
        result = result_of(item)
        table.add_row(Text(item.location), Text(result, style=_STYLE[result]),
                      plain(_text(item, detail)))
    new_console().print(table)
    if report.interrupted:
        _counts(report, title, err=False)


def _summary(report: BulkReport, title: str, detail: Detail, *, err: bool) -> None:
    _counts(report, title, err=err)
    for kind in ("error", UNKNOWN, "skipped"):
        items = [i for i in report.items if kind_of(i) == kind]
        for item in items[:FIRST]:
            typer.echo(f"  {kind}: {item.location}: {escaped(_text(item, detail))}", err=err)
        if len(items) > FIRST:
            typer.echo(f"  ... and {plural(len(items) - FIRST, kind, more=True)}", err=err)
    reached = " reached" if report.interrupted else ""
    typer.echo(f"({len(report.items)} locations{reached}: --details shows one row per location)",
               err=err)


def _counts(report: BulkReport, title: str, *, err: bool) -> None:
    """One line: the count of each result (docs/cli.md, "Bulk: `all`"), then the locations
    left pausing/resuming by an interruption."""
    typer.echo(f"{title}: {', '.join(tally(report)) or 'no location reached'}", err=err)
    _settling_line(report, err=err)


def _settling_line(report: BulkReport, *, err: bool) -> None:
    left = left_settling(report)
    if left:
        going = "pausing" if report.operation.event == "pause" else "resuming"
        typer.echo(
            f"{len(left)} left {going}: the next settle — sidecar, check --repair — finishes "
            "them", err=err,
        )


@contextmanager
def _no_more_interrupts() -> Iterator[None]:
    """Ctrl-C ignored while the few fallback lines are printed (main thread only)."""
    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
