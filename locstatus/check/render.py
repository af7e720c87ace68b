"""The check for a person at a terminal: the findings table, the summary line, the progress bar.

The only part of the check that knows rich. Text that comes from the store (locations, messages
quoting a record, worker ids) is printed as plain :class:`~rich.text.Text`, never as markup, so
a record cannot style or break the operator's terminal. The progress bar goes to stderr, so
``--json`` output on stdout stays the report alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from locstatus.check.report import CheckReport, FindingState, ProgressBar, no_progress
from locstatus.check.text import human_age

PROGRESS_THRESHOLD = 2000
"""A progress bar is shown (when asked) only for scans of more records than this."""

_STATE_STYLE = {
    FindingState.OPEN: "red",
    FindingState.PLANNED: "yellow",
    FindingState.REPAIRED: "green",
    FindingState.RESOLVED: "green",
    FindingState.BLOCKED: "red",
    FindingState.FAILED: "bold red",
}


def render_report(report: CheckReport, console: Console) -> None:
    """Print ``report`` for a human: one table row per finding (kind, what, age, evidence,
    repair, state) and a summary line. Text from the store is printed as plain text, never
    as rich markup."""
    if report.findings:
        table = Table(title="consistency check", title_justify="left", expand=False)
        for col in ("Kind", "Location", "Service/worker", "Age", "Finding", "Repair", "State"):
            table.add_column(col, overflow="fold")
        repairs = {r.finding: r for r in report.repairs}
        for f in report.findings:
            done = repairs.get(f.id)
            repair_text = f.repair.description if done is None else f"{done.action}: {done.detail}"
            table.add_row(
                Text(f.kind.value),
                Text(f.location or ""),
                Text(f.service or f.worker_id or ""),
                Text(human_age(f.age_seconds)),
                Text(f.message),
                Text(repair_text),
                Text(f.state.value, style=_STATE_STYLE[f.state]),
            )
        console.print(table)
    console.print(summary_line(report))


def summary_line(report: CheckReport) -> Text:
    """The last line of :func:`render_report`: what was read, what was found and done, and the
    exit code, styled by status."""
    s, sc = report.summary, report.scanned
    head = (
        f"{sc.records} records ({sc.tombstones} removed, {sc.corrupt} corrupt), "
        f"{sc.workers} workers ({sc.workers - sc.live_workers} expired) checked in "
        f"{report.duration_seconds:.2f}s: "
    )
    if report.status == "clean":
        return Text(head + "clean", style="green")
    kinds = ", ".join(f"{n} {k}" for k, n in s.by_kind.items() if n)
    noun = "finding" if s.findings == 1 else "findings"
    tail = f"{s.findings} {noun} ({kinds}); {s.repaired} repaired, {s.resolved} resolved"
    tail += f", {s.left} left" if s.left else ""
    if report.options.dry_run:
        tail += " (dry run: nothing written)"
    if report.status == "error":
        tail += "; backend unavailable during repairs"
    style = {"repaired": "green", "findings": "yellow", "error": "bold red"}[report.status]
    return Text(f"{head}{tail} -> exit {report.exit_code}", style=style)


def progress_bar(enabled: bool) -> ProgressBar:
    """A :data:`~locstatus.check.report.ProgressBar` drawing a transient bar on stderr when
    ``enabled`` and the total is more than :data:`PROGRESS_THRESHOLD`, else nothing."""
    return _bar if enabled else no_progress


@contextlib.contextmanager
def _bar(total: int, label: str) -> Iterator[Callable[[], None]]:
    if total <= PROGRESS_THRESHOLD:
        yield lambda: None
        return
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=total)
        step = max(1, total // 200)
        count = [0]

        def advance() -> None:
            count[0] += 1
            if count[0] % step == 0 or count[0] == total:
                bar.update(task, completed=count[0])

        yield advance
