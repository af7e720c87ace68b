"""What the demo sees and shows: one :class:`Snapshot` of the system, and the live table
(:class:`Dashboard`) rendered from the latest one.

A snapshot reads the workers' status files first, then the sidecar's records: a count read
after the sidecar said ``paused`` is final (a worker writes it before it acknowledges), which is
what lets the scenario check that no count moves while paused. The functions here only read and
render (rich); deciding whether what they show is right is :mod:`locstatus.demo.scenario`'s job.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from locstatus.locations import LocationMap
from locstatus.models import LocationStatus, State

__all__ = ["MAX_WORKER_COLUMNS", "Dashboard", "Snapshot", "moved_by", "running_consumers"]

MAX_WORKER_COLUMNS = 6
"""Workers shown as their own column in the live table; the rest are summed in one column."""

_STATE_STYLE = {
    State.RUNNING: "green",
    State.PAUSING: "yellow",
    State.PAUSED: "bold red",
    State.RESUMING: "cyan",
}


def moved_by(status: Mapping[str, Any] | None, location: str, services: Sequence[str]) -> int:
    """Objects moved by one worker at ``location`` for ``services``, from its status file."""
    if status is None:
        return 0
    per_svc = status.get("locations", {}).get(location, {})
    return sum(int(per_svc.get(s, {}).get("moved", 0)) for s in services)


def running_consumers(
    status: Mapping[str, Any] | None, location: str, services: Sequence[str]
) -> tuple[int, int]:
    """(consumers running, consumers known) of one worker at ``location`` for ``services``."""
    if status is None:
        return 0, 0
    per_svc = status.get("locations", {}).get(location, {})
    known = [per_svc[s] for s in services if s in per_svc]
    return sum(bool(c.get("running")) for c in known), len(known)


@dataclass(frozen=True)
class Snapshot:
    """One look at the system: the workers' status files (read first), then the sidecar."""

    elapsed: float
    workers: dict[str, dict[str, Any] | None]
    running: dict[str, bool]
    records: dict[str, LocationStatus]
    leases: dict[str, bool]
    step: str

    def counts(self, location: str, services: Sequence[str]) -> dict[str, int]:
        return {w: moved_by(st, location, services) for w, st in self.workers.items()}

    def states(self, location: str, services: Sequence[str]) -> list[State]:
        rec = self.records.get(location)
        if rec is None:
            return []
        return [rec.services[s].state for s in services if s in rec.services]

    def all_in(self, location: str, services: Sequence[str], state: State) -> bool:
        states = self.states(location, services)
        return bool(states) and all(s is state for s in states)

    def generations(self, location: str, services: Sequence[str]) -> dict[str, int]:
        rec = self.records.get(location)
        if rec is None:
            return {}
        return {s: rec.services[s].generation for s in services if s in rec.services}


class Dashboard:
    """The live table (a rich renderable re-rendered from the latest snapshot)."""

    def __init__(self, wanted: LocationMap, worker_ids: Sequence[str], duration: float) -> None:
        self.wanted = wanted
        self.worker_ids = list(worker_ids)
        self.duration = duration
        self.snapshot: Snapshot | None = None

    def __rich__(self) -> RenderableType:
        snap = self.snapshot
        if snap is None:
            return Text("starting ...", style="dim")
        return Group(self.locations_table(snap), self.workers_table(snap), self.footer(snap))

    def locations_table(self, snap: Snapshot) -> Table:
        shown = self.worker_ids[:MAX_WORKER_COLUMNS]
        rest = self.worker_ids[MAX_WORKER_COLUMNS:]
        table = Table(
            title="objects moved per location and worker", title_justify="left", expand=False
        )
        table.add_column("Location")
        table.add_column("Services")
        for wid in shown:
            table.add_column(wid, justify="right")
        if rest:
            table.add_column(f"+{len(rest)} more", justify="right")
        now = datetime.now(UTC)
        for loc, services in sorted(self.wanted.items()):
            row: list[RenderableType] = [Text(loc), self._services(snap, loc, services, now)]
            for wid in shown:
                row.append(self._cell([snap.workers.get(wid)], loc, services))
            if rest:
                row.append(self._cell([snap.workers.get(w) for w in rest], loc, services))
            table.add_row(*row)
        return table

    @staticmethod
    def _services(snap: Snapshot, loc: str, services: Sequence[str], now: datetime) -> Text:
        text = Text()
        rec = snap.records.get(loc)
        for i, svc in enumerate(services):
            if i:
                text.append("\n")
            st = rec.services.get(svc) if rec is not None else None
            if st is None:
                text.append(f"{svc} ?", style="dim")
                continue
            text.append(f"{svc} ")
            text.append(st.state.value, style=_STATE_STYLE[st.state])
            if (at := st.scheduled_resume) is not None:
                left = max(0.0, (at - now).total_seconds())
                text.append(f" (resume in {math.ceil(left)}s)", style="cyan")
        return text

    @staticmethod
    def _cell(statuses: Sequence[dict[str, Any] | None], loc: str, services: Sequence[str]) -> Text:
        moved = sum(moved_by(st, loc, services) for st in statuses)
        running = known = 0
        for st in statuses:
            r, k = running_consumers(st, loc, services)
            running += r
            known += k
        if known == 0:
            return Text(f"{moved:,} -", style="dim")
        if running == known:
            return Text(f"{moved:,} moving", style="green")
        if running == 0:
            return Text(f"{moved:,} stopped", style="bold red")
        return Text(f"{moved:,} {running}/{known} moving", style="yellow")

    def workers_table(self, snap: Snapshot) -> Table:
        table = Table(title="workers", title_justify="left")
        for col in ("Worker", "PID", "Process", "Lease", "Consumers moving", "Objects moved"):
            table.add_column(col)
        for wid in self.worker_ids:
            st = snap.workers.get(wid)
            consumers = [
                c for per_svc in (st or {}).get("locations", {}).values() for c in per_svc.values()
            ]
            moving = sum(bool(c.get("running")) for c in consumers)
            moved = sum(int(c.get("moved", 0)) for c in consumers)
            lease = snap.leases.get(wid)
            table.add_row(
                Text(wid),
                str(st.get("pid", "")) if st else "",
                Text("running", style="green")
                if snap.running.get(wid)
                else Text("exited", style="bold red"),
                Text("-", style="dim")
                if lease is None
                else Text("alive", style="green")
                if lease
                else Text("expired", style="bold red"),
                f"{moving}/{len(consumers)}",
                f"{moved:,}",
            )
        return table

    def footer(self, snap: Snapshot) -> Text:
        return Text(
            f"{snap.elapsed:5.1f}s of {self.duration:g}s  step: {snap.step}", style="bold"
        )
