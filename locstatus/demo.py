"""``locstatus demo``: watch workers stop and start as a location is paused and resumed.

A newcomer runs one command and sees the whole system work: a sidecar (the HTTP API and its
reconciler), a few worker processes that move simulated objects per location
(:mod:`locstatus.demo_worker`), the locations of the packaged Backbeat-format samples, and a
scripted operator who drives the sidecar's HTTP API:

1. wait until every worker registered and moves objects at every location;
2. pause a location (every service): it is ``pausing`` until every worker stopped and
   acknowledged, then ``paused``;
3. pause one service at another location (replication; the location's other services go on);
4. schedule the resume of the first location a few seconds ahead and let the sidecar's
   reconciler fire it (the workers are told not to, so the firing is visibly the sidecar's);
5. resume the second one at once, and watch the workers move objects there again;
6. let everything run until ``duration`` seconds have passed, stop every process, report.

A live table shows, per location, the state of each service and, per worker, the objects moved
there and whether its consumers run; below it, every step is narrated with a timestamp. The last
line of the output is a JSON summary for scripts (``"demo": "ok"`` or ``"failed"``).

Why it is shaped so:

- **Real processes, real store.** Workers are OS processes sharing one SQLite file (or the
  store given with ``--backend``); the sidecar is the same FastAPI app and
  :class:`~locstatus.reconciler.Reconciler` as ``locstatus serve``, on a thread of this process
  (:class:`~locstatus.api.server.BackgroundServer`) so the demo knows its port even when the OS
  picked it (``--port 0``). Every operator action goes through the HTTP API, as a human's would.
- **Never touches a real store by accident.** Without a backend given on the command line, the
  demo uses a fresh SQLite file in a temporary directory (``$LOCSTATUS_BACKEND`` is ignored).
  With ``--backend`` it adds the sample locations without removing anything, refuses to start
  when one of them is already paused, and resumes what it paused if it fails midway.
- **The demo checks what it shows.** A worker writes its final count before its ``on_pause``
  handler returns, i.e. before it acknowledges, so once a service is ``paused`` the counts of
  every worker are final. The demo reads every worker's status file *after* the sidecar reported
  ``paused`` and fails if any count moves while the generation it froze is still paused; it also
  fails when a pause does not settle, a scheduled resume does not fire, or workers do not start
  again, each within a generous timeout (exit 1, with the worker logs kept for inspection).

Usage::

    locstatus demo                              # about 20 s, then everything stops
    locstatus demo --workers 5 --duration 60
    locstatus demo --keep                       # stays up after the scenario until Ctrl-C
    locstatus --backend zk://127.0.0.1:2181/locstatus-demo demo
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import IO, Any

import httpx
from pydantic import TypeAdapter
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from locstatus.api.app import create_app
from locstatus.api.problems import redact
from locstatus.api.server import BackgroundServer
from locstatus.client import connect
from locstatus.demo_worker import read_status
from locstatus.errors import CorruptRecord, InvalidInput, LocstatusError
from locstatus.locations import LocationMap, load_sample
from locstatus.manager import Manager
from locstatus.models import HistoryEntry, LocationStatus, State
from locstatus.reconciler import Reconciler
from locstatus.settings import Settings

__all__ = ["DemoFailed", "run_demo"]

ACTOR = "locstatus-demo"
"""Actor recorded in the history for the demo's operator actions."""

STARTUP_TIMEOUT = 90.0
"""Seconds for every worker process to start, register and move objects everywhere."""
SETTLE_TIMEOUT = 30.0
"""Seconds for a pause or resume to settle (every live worker acknowledged)."""
FIRE_GRACE = 30.0
"""Seconds after its due time for a scheduled resume to fire."""
POLL_SECONDS = 0.2
"""How often the demo reads the sidecar and the workers' status files."""
WORKER_LEASE = 5.0
"""Lease of the demo's workers, in seconds."""
RECONCILE_INTERVAL = 0.5
"""Full reconcile pass period of the demo's sidecar, in seconds (hints make it faster)."""
MAX_WORKER_COLUMNS = 6
"""Workers shown as their own column in the live table; the rest are summed in one column."""

_STATE_STYLE = {
    State.RUNNING: "green",
    State.PAUSING: "yellow",
    State.PAUSED: "bold red",
    State.RESUMING: "cyan",
}
_LOCATIONS = TypeAdapter(list[LocationStatus])
_HISTORY = TypeAdapter(list[HistoryEntry])


class DemoFailed(Exception):
    """The scenario did not converge (or a process died); ``message`` says what and where."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# -- worker processes ----------------------------------------------------------------------------


@dataclass
class _Worker:
    worker_id: str
    status_file: Path
    log_file: Path
    proc: subprocess.Popen[bytes] | None = None
    log_fh: IO[bytes] | None = None
    exit_code: int | None = None


class _Fleet:
    """The demo's worker processes (``python -m locstatus.demo_worker``), each in its own
    session so a Ctrl-C in the terminal reaches the demo only and the demo stops them in
    order."""

    def __init__(
        self, url: str, services: Sequence[str], workdir: Path, count: int
    ) -> None:
        self.url = url
        self.services = tuple(services)
        self.workers = [
            _Worker(
                f"demo-{i}",
                workdir / f"demo-{i}.json",
                workdir / f"demo-{i}.log",
            )
            for i in range(1, count + 1)
        ]

    @property
    def ids(self) -> list[str]:
        return [w.worker_id for w in self.workers]

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != "LOCSTATUS_BACKEND"}
        env["PYTHONUNBUFFERED"] = "1"
        for w in self.workers:
            w.log_fh = open(w.log_file, "ab")  # noqa: SIM115 - closed in stop()
            w.proc = subprocess.Popen(
                [
                    sys.executable, "-m", "locstatus.demo_worker",
                    "--backend", self.url,
                    "--id", w.worker_id,
                    "--services", ",".join(self.services),
                    "--status-file", str(w.status_file),
                    "--lease", str(WORKER_LEASE),
                    "--no-fire-resumes",
                    "--exit-with-parent",
                    "--log-every", "0",
                ],
                stdin=subprocess.DEVNULL,
                stdout=w.log_fh,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )

    def statuses(self) -> dict[str, dict[str, Any] | None]:
        return {w.worker_id: read_status(w.status_file) for w in self.workers}

    def pids(self) -> dict[str, int | None]:
        return {w.worker_id: (w.proc.pid if w.proc else None) for w in self.workers}

    def running(self) -> dict[str, bool]:
        return {w.worker_id: w.proc is not None and w.proc.poll() is None for w in self.workers}

    def check_alive(self) -> None:
        """Raise :class:`DemoFailed` naming the first worker that exited, with its log."""
        for w in self.workers:
            if w.proc is not None and w.proc.poll() is not None:
                raise DemoFailed(
                    f"worker {w.worker_id} (pid {w.proc.pid}) exited with code "
                    f"{w.proc.returncode}; last lines of {w.log_file}:\n{self.log_tail(w)}"
                )

    def stop(self, timeout: float = 15.0) -> dict[str, int | None]:
        """SIGTERM every worker, wait up to ``timeout`` seconds in all, SIGKILL what is left.
        Returns each worker's exit code (negative: killed by that signal). Idempotent."""
        for w in self.workers:
            if w.proc is not None and w.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    w.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for w in self.workers:
            if w.proc is None:
                continue
            try:
                w.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
            w.exit_code = w.proc.returncode
        for w in self.workers:
            if w.log_fh is not None:
                w.log_fh.close()
                w.log_fh = None
        return {w.worker_id: w.exit_code for w in self.workers}

    @staticmethod
    def log_tail(w: _Worker, lines: int = 15) -> str:
        try:
            text = w.log_file.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "  (no log)"
        tail = text.strip().splitlines()[-lines:]
        return "\n".join("  " + line for line in tail) or "  (empty log)"


# -- what the demo sees --------------------------------------------------------------------------


def _moved(status: Mapping[str, Any] | None, location: str, services: Sequence[str]) -> int:
    """Objects moved by one worker at ``location`` for ``services``, from its status file."""
    if status is None:
        return 0
    per_svc = status.get("locations", {}).get(location, {})
    return sum(int(per_svc.get(s, {}).get("moved", 0)) for s in services)


def _moving(
    status: Mapping[str, Any] | None, location: str, services: Sequence[str]
) -> tuple[int, int]:
    """(consumers running, consumers known) of one worker at ``location`` for ``services``."""
    if status is None:
        return 0, 0
    per_svc = status.get("locations", {}).get(location, {})
    known = [per_svc[s] for s in services if s in per_svc]
    return sum(bool(c.get("running")) for c in known), len(known)


@dataclass(frozen=True)
class _Snapshot:
    """One look at the system: the workers' status files (read first), then the sidecar."""

    elapsed: float
    workers: dict[str, dict[str, Any] | None]
    running: dict[str, bool]
    records: dict[str, LocationStatus]
    leases: dict[str, bool]
    step: str

    def counts(self, location: str, services: Sequence[str]) -> dict[str, int]:
        return {w: _moved(st, location, services) for w, st in self.workers.items()}

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


class _Dashboard:
    """The live table (a rich renderable re-rendered from the latest snapshot)."""

    def __init__(self, wanted: LocationMap, worker_ids: Sequence[str], duration: float) -> None:
        self.wanted = wanted
        self.worker_ids = list(worker_ids)
        self.duration = duration
        self.snapshot: _Snapshot | None = None

    def __rich__(self) -> RenderableType:
        snap = self.snapshot
        if snap is None:
            return Text("starting ...", style="dim")
        return Group(self.locations_table(snap), self.workers_table(snap), self.footer(snap))

    def locations_table(self, snap: _Snapshot) -> Table:
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
    def _services(snap: _Snapshot, loc: str, services: Sequence[str], now: datetime) -> Text:
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
            if st.resume_at is not None:
                left = max(0.0, (st.resume_at - now).total_seconds())
                text.append(f" (resume in {math.ceil(left)}s)", style="cyan")
        return text

    @staticmethod
    def _cell(statuses: Sequence[dict[str, Any] | None], loc: str, services: Sequence[str]) -> Text:
        moved = sum(_moved(st, loc, services) for st in statuses)
        running = known = 0
        for st in statuses:
            r, k = _moving(st, loc, services)
            running += r
            known += k
        if known == 0:
            return Text(f"{moved:,} -", style="dim")
        if running == known:
            return Text(f"{moved:,} moving", style="green")
        if running == 0:
            return Text(f"{moved:,} stopped", style="bold red")
        return Text(f"{moved:,} {running}/{known} moving", style="yellow")

    def workers_table(self, snap: _Snapshot) -> Table:
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

    def footer(self, snap: _Snapshot) -> Text:
        return Text(
            f"{snap.elapsed:5.1f}s of {self.duration:g}s  step: {snap.step}", style="bold"
        )


# -- the scenario --------------------------------------------------------------------------------


@dataclass
class _Frozen:
    """A (location, services) the demo paused and watches: counts must not move while the
    generations it froze are still paused."""

    location: str
    services: tuple[str, ...]
    generations: dict[str, int]
    counts: dict[str, int]
    last: dict[str, int] = field(default_factory=dict)


class _Scenario:
    """Drives the operator's actions through the sidecar's HTTP API and checks what follows."""

    def __init__(
        self,
        *,
        client: httpx.Client,
        fleet: _Fleet,
        dashboard: _Dashboard,
        console: Console,
        wanted: LocationMap,
        started: float,
        duration: float,
    ) -> None:
        self.client = client
        self.fleet = fleet
        self.dashboard = dashboard
        self.console = console
        self.wanted = wanted
        self.started = started
        self.duration = duration
        self.hold = min(15.0, max(1.0, duration * 0.15))
        self.delay = float(min(30, max(2, round(duration * 0.2))))
        self.step = "starting"
        self.frozen: dict[tuple[str, tuple[str, ...]], _Frozen] = {}
        self.paused_by_demo: dict[str, set[str]] = {}
        self.report: list[dict[str, Any]] = []
        self.last: _Snapshot | None = None

    # -- observation --------------------------------------------------------------------------

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def say(self, message: str, style: str | None = None) -> None:
        line = Text(f"{self.elapsed():6.1f}s  ", style="dim")
        line.append(message, style=style)
        self.console.print(line, soft_wrap=True)

    def refresh(self, *, strict: bool = True) -> _Snapshot:
        """Read every worker's status file, then the sidecar; with ``strict``, fail when a
        worker exited and check the frozen counts."""
        if strict:
            self.fleet.check_alive()
        workers = self.fleet.statuses()
        running = self.fleet.running()
        listed = _LOCATIONS.validate_json(self._get("/v1/locations"))
        records = {rec.location: rec for rec in listed}
        leases = {
            str(w.get("worker_id")): bool(w.get("is_alive"))
            for w in json.loads(self._get("/v1/workers"))
            if isinstance(w, dict)
        }
        snap = _Snapshot(self.elapsed(), workers, running, records, leases, self.step)
        self.last = snap
        self.dashboard.snapshot = snap
        if strict:
            self._check_frozen(snap)
        return snap

    def _check_frozen(self, snap: _Snapshot) -> None:
        for fr in self.frozen.values():
            if not snap.all_in(fr.location, fr.services, State.PAUSED):
                continue
            if snap.generations(fr.location, fr.services) != fr.generations:
                continue
            # Paused at this generation when the files were frozen and still now: the files,
            # read in between, must show the frozen counts.
            counts = snap.counts(fr.location, fr.services)
            for wid, n in counts.items():
                if snap.workers.get(wid) is None or wid not in fr.counts:
                    continue  # no status read this time: nothing to compare
                if n != fr.counts[wid]:
                    lease = {True: "alive", False: "expired"}.get(snap.leases.get(wid, False))
                    raise DemoFailed(
                        f"worker {wid} moved {n - fr.counts[wid]} objects at {fr.location} "
                        f"({', '.join(fr.services)}) while it was paused (generation "
                        f"{_gens(fr.generations)}; its lease is {lease}): a worker did not "
                        "stop before it acknowledged"
                    )
                fr.last[wid] = n

    def until(
        self, what: str, cond: Callable[[_Snapshot], bool], timeout: float
    ) -> _Snapshot:
        """Poll until ``cond`` holds; raise :class:`DemoFailed` naming ``what`` after
        ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            snap = self.refresh()
            if cond(snap):
                return snap
            if time.monotonic() > deadline:
                raise DemoFailed(f"{what}: not done after {timeout:g} s ({self._describe(snap)})")
            time.sleep(POLL_SECONDS)

    def watch(self, seconds: float) -> _Snapshot:
        """Keep refreshing (and checking) for ``seconds``."""
        end = time.monotonic() + seconds
        snap = self.refresh()
        while time.monotonic() < end:
            time.sleep(min(POLL_SECONDS, max(0.0, end - time.monotonic())))
            snap = self.refresh()
        return snap

    def _describe(self, snap: _Snapshot) -> str:
        parts = []
        for loc, services in sorted(self.wanted.items()):
            rec = snap.records.get(loc)
            if rec is None:
                parts.append(f"{loc} missing")
                continue
            states = ", ".join(
                f"{s} {rec.services[s].state.value}" for s in services if s in rec.services
            )
            parts.append(f"{loc}: {states}")
        dead = [w for w, alive in snap.running.items() if not alive]
        expired = [w for w, alive in snap.leases.items() if not alive]
        missing = [w for w in self.fleet.ids if w not in snap.leases]
        if dead:
            parts.append(f"exited: {', '.join(dead)}")
        if expired:
            parts.append(f"lease expired: {', '.join(expired)}")
        if missing:
            parts.append(f"not registered: {', '.join(missing)}")
        return "; ".join(parts)

    # -- HTTP -----------------------------------------------------------------------------------

    def _get(self, path: str) -> bytes:
        return self._call("GET", path, None)

    def _post(self, path: str, body: dict[str, Any]) -> bytes:
        return self._call("POST", path, body)

    def _call(self, method: str, path: str, body: dict[str, Any] | None) -> bytes:
        try:
            resp = self.client.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise DemoFailed(f"{method} {path}: the sidecar did not answer ({exc})") from None
        if resp.status_code >= 400:
            try:
                detail = str(resp.json().get("detail", resp.text))
            except ValueError:
                detail = resp.text[:300]
            raise DemoFailed(f"{method} {path} answered {resp.status_code}: {detail}")
        return resp.content

    # -- steps ----------------------------------------------------------------------------------

    def set_step(self, step: str) -> None:
        self.step = step
        if self.last is not None:
            self.dashboard.snapshot = _Snapshot(
                self.elapsed(), self.last.workers, self.last.running, self.last.records,
                self.last.leases, step,
            )

    def run(self) -> None:
        """The whole script; raises :class:`DemoFailed` at the first thing that does not
        converge."""
        first, second = self._pick()
        self.set_step("waiting for the workers to register and move objects everywhere")
        self.say(f"waiting for {len(self.fleet.ids)} worker processes to register ...")
        self.until("every worker registered and moving objects at every location",
                   self._everyone_moving, STARTUP_TIMEOUT)
        self.say(
            f"{len(self.fleet.ids)} workers registered (lease alive) and moving objects at "
            f"{len(self.wanted)} locations", style="green",
        )
        self.set_step("everything running")
        self.watch(self.hold)

        a_services = self.wanted[first]
        self.pause(first, a_services, reason="demo: maintenance window")
        if second is not None:
            self.pause(second[0], (second[1],), reason=f"demo: {second[1]} target outage")
        self.set_step("paused: counters must not move")
        snap = self.watch(self.hold)
        if not self.console.is_terminal:  # a terminal shows the live table; a log gets a copy
            self.console.print(self.dashboard.locations_table(snap))

        self.scheduled_resume(first, a_services)
        if second is not None:
            self.resume_now(second[0], (second[1],))
        remaining = self.duration - self.elapsed()
        if remaining > 0:
            self.set_step("everything running again")
            self.watch(remaining)

    def keep_running(self, store: str, url: str) -> None:
        """``--keep``: refresh the table until interrupted (KeyboardInterrupt)."""
        self.set_step("--keep: running until Ctrl-C")
        self.say(
            f"still running (--keep). Status page: {url}/  Try, in another terminal:  "
            f"locstatus --backend {store} pause eu-west-par --reason test   "
            "Press Ctrl-C to stop everything.",
            style="bold",
        )
        while True:  # the operator may now kill or pause things: show it, do not judge it
            self.refresh(strict=False)
            time.sleep(0.5)

    def _pick(self) -> tuple[str, tuple[str, str] | None]:
        """The location paused then resumed on schedule, and the (location, service) paused
        then resumed at once (another location, one service)."""
        names = sorted(self.wanted)
        first = "us-east-1" if "us-east-1" in self.wanted else names[0]
        if "replication" in self.wanted.get("eu-west-par", ()) and first != "eu-west-par":
            return first, ("eu-west-par", "replication")
        others = [n for n in names if n != first]
        if not others:
            return first, None
        return first, (others[0], self.wanted[others[0]][0])

    def _everyone_moving(self, snap: _Snapshot) -> bool:
        if set(self.fleet.ids) - {w for w, alive in snap.leases.items() if alive}:
            return False
        for st in snap.workers.values():
            for loc, services in self.wanted.items():
                running, known = _moving(st, loc, services)
                if known < len(services) or running < known or _moved(st, loc, services) == 0:
                    return False
        return True

    def _targets(self, location: str, services: Sequence[str]) -> list[str]:
        """The service path segments for one request per change: ``all`` (one compare-and-set
        for every service of the location) or each service."""
        return ["all"] if tuple(services) == tuple(self.wanted[location]) else list(services)

    def _services_text(self, location: str, services: Sequence[str]) -> str:
        whole = tuple(services) == tuple(self.wanted[location])
        return f"{location} (every service: {', '.join(services)})" if whole else (
            f"{', '.join(services)} at {location}"
        )

    def pause(self, location: str, services: tuple[str, ...], *, reason: str) -> None:
        what = self._services_text(location, services)
        before = self.refresh().counts(location, services)
        self.set_step(f"pausing {what}: waiting for every worker to stop and acknowledge")
        requested = time.monotonic()
        for target in self._targets(location, services):
            self._post(f"/v1/locations/{location}/{target}/pause",
                       {"reason": reason, "actor": ACTOR})
        self.paused_by_demo.setdefault(location, set()).update(services)
        rec = self.last.records.get(location) if self.last else None
        gen = {s: rec.services[s].generation + 1 for s in services} if rec else {}
        self.say(f"POST pause {what} -> pausing (generation {_gens(gen)})", style="yellow")
        snap = self.until(
            f"pause of {what} settling to paused",
            lambda s: s.all_in(location, services, State.PAUSED),
            SETTLE_TIMEOUT,
        )
        settled_after = time.monotonic() - requested
        generations = snap.generations(location, services)
        # Read the status files again, now that the sidecar said "paused": they are final.
        final = self.until(
            f"reading every worker's status after {what} paused",
            lambda s: all(st is not None for st in s.workers.values()),
            SETTLE_TIMEOUT,
        )
        if final.generations(location, services) != generations or not final.all_in(
            location, services, State.PAUSED
        ):
            raise DemoFailed(f"{what} changed state right after it settled to paused "
                             "(is someone else driving this store?)")
        counts = final.counts(location, services)
        self.frozen[(location, services)] = _Frozen(location, services, generations, counts)
        while_pausing = sum(counts.values()) - sum(before.values())
        self.say(
            f"{what} settled to paused in {settled_after:.2f} s: every worker stopped and "
            f"acknowledged ({while_pausing:,} objects moved while they finished their batch); "
            f"counters frozen at {_per_worker(counts)}",
            style="bold red",
        )
        self.report.append(
            {
                "location": location,
                "services": list(services),
                "pause_settled_after_s": round(settled_after, 3),
                "moved_before_pause": counts,
            }
        )

    def scheduled_resume(self, location: str, services: tuple[str, ...]) -> None:
        what = self._services_text(location, services)
        body = {"in_seconds": self.delay, "reason": "demo: end of the window", "actor": ACTOR}
        due: datetime | None = None
        for target in self._targets(location, services):
            rec = LocationStatus.model_validate_json(
                self._post(f"/v1/locations/{location}/{target}/resume", body)
            )
            due = rec.services[services[0]].resume_at
        due_text = due.strftime("%H:%M:%SZ") if due else "?"
        self.say(
            f"POST resume {what} in {self.delay:g} s -> resume_at {due_text}: stored in the "
            "record, no timer anywhere; the sidecar's reconciler will fire it",
            style="cyan",
        )
        self.set_step(f"waiting for the sidecar's reconciler to fire the resume of {location}")
        self.until(
            f"scheduled resume of {what} firing",
            lambda s: not any(st.desired_paused for st in s.states(location, services)),
            self.delay + FIRE_GRACE,
        )
        fired, fired_at = self._fired_by(location)
        late = (
            f"{(fired_at - due).total_seconds():.1f} s after its time"
            if fired_at is not None and due is not None
            else "time unknown"
        )
        self.say(f"scheduled resume of {location} fired by {fired} ({late}) -> resuming",
                 style="cyan")
        self._resumed(location, services, "scheduled", fired)

    def resume_now(self, location: str, services: tuple[str, ...]) -> None:
        what = self._services_text(location, services)
        for target in self._targets(location, services):
            self._post(f"/v1/locations/{location}/{target}/resume",
                       {"reason": "demo: target back", "actor": ACTOR})
        self.say(f"POST resume {what} -> resuming", style="cyan")
        self._resumed(location, services, "immediate", ACTOR)

    def _resumed(self, location: str, services: tuple[str, ...], kind: str, by: str) -> None:
        what = self._services_text(location, services)
        frozen = self.frozen.pop((location, services))
        self.set_step(f"resuming {what}: waiting for every worker to start and acknowledge")
        started = time.monotonic()
        self.until(f"resume of {what} settling to running",
                   lambda s: s.all_in(location, services, State.RUNNING), SETTLE_TIMEOUT)
        settled_after = time.monotonic() - started
        self.paused_by_demo.get(location, set()).difference_update(services)
        at_resume = {**frozen.counts, **frozen.last}
        snap = self.until(
            f"every worker moving objects again at {what}",
            lambda s: all(
                s.counts(location, services)[w] > at_resume.get(w, 0) for w in self.fleet.ids
            ),
            SETTLE_TIMEOUT,
        )
        self.say(
            f"{what} running again: every worker started and acknowledged, counters moving "
            f"({_per_worker(snap.counts(location, services))})",
            style="green",
        )
        for entry in self.report:
            if entry["location"] == location and entry["services"] == list(services):
                entry.update(
                    {
                        "resume": kind,
                        "resumed_by": by,
                        "resume_settled_after_s": round(settled_after, 3),
                        "moved_while_paused": {
                            w: at_resume.get(w, 0) - frozen.counts.get(w, 0)
                            for w in self.fleet.ids
                        },
                        "counts_at_resume": at_resume,
                    }
                )

    def _fired_by(self, location: str) -> tuple[str, datetime | None]:
        """Who fired the last scheduled resume of ``location`` and when (from its history)."""
        entries = _HISTORY.validate_json(self._get(f"/v1/locations/{location}/history?limit=20"))
        for entry in entries:
            if entry.event == "resume_due":
                return entry.actor or "?", entry.at
        return "?", None

    def finish(self, final: Mapping[str, dict[str, Any] | None]) -> None:
        """Complete the report with the final counts (from the status files written at exit)."""
        for entry in self.report:
            loc, services = entry["location"], entry["services"]
            end = {w: _moved(final.get(w), loc, services) for w in self.fleet.ids}
            start = entry.get("counts_at_resume", end)
            entry["moved_after_resume"] = {w: end[w] - start.get(w, 0) for w in self.fleet.ids}
            entry.pop("counts_at_resume", None)


def _gens(generations: Mapping[str, int]) -> str:
    values = sorted(set(generations.values()))
    return ", ".join(str(v) for v in values) or "?"


def _per_worker(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{w} {n:,}" for w, n in counts.items())


# -- the sidecar -------------------------------------------------------------------------------


class _Sidecar:
    """The same app and reconciler as ``locstatus serve``, on a thread of this process."""

    def __init__(self, mgr: Manager, port: int, token: str | None) -> None:
        self.reconciler = Reconciler(mgr, interval=RECONCILE_INTERVAL)
        app = create_app(mgr, token=token, reconciler=self.reconciler)
        self.reconciler.observer = app.state.locstatus.metrics.transition
        self.server = BackgroundServer(app, port=port)
        self.url = self.server.url

    def start(self) -> None:
        self.reconciler.start()
        self.server.start()

    def stop(self) -> None:
        self.server.stop()
        self.reconciler.stop()


# -- the entry point ---------------------------------------------------------------------------


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM ends the demo like Ctrl-C (processes are stopped, not orphaned)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one is enough: let the clean-up run
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_demo(
    *,
    backend_url: str | None,
    keep: bool,
    workers: int,
    duration: float,
    port: int,
    services: Sequence[str] | None = None,
    console: Console | None = None,
) -> int:
    """Run the demo scenario (see the module docstring) and return the exit code.

    - ``backend_url``: the store to use; None (the default) means a fresh SQLite file in a new
      temporary directory, removed at the end (kept with ``keep`` or after a failure).
    - ``keep``: after the scenario, keep the sidecar and the workers running (and the table
      updating) until Ctrl-C or SIGTERM.
    - ``workers``: number of worker processes (1..64).
    - ``duration``: seconds the whole demo runs (the scenario takes at least about 10 s; a
      shorter duration ends right after it).
    - ``port``: the sidecar's port on 127.0.0.1 (0: any free port).
    - ``services``: the configured service set (default ``$LOCSTATUS_SERVICES``).
    - ``console``: where to print (default stdout).

    Returns 0 when everything converged (or ``keep`` ended with Ctrl-C), 1 when the scenario
    did not converge (the message names the step, the states and the lagging workers), 130 when
    interrupted during the scenario. Raises :class:`~locstatus.errors.LocstatusError` before
    anything starts: :class:`InvalidInput` for bad arguments or a port that cannot be bound,
    :class:`BackendUnavailable` for an unreachable ``backend_url``.
    """
    if not 1 <= workers <= 64:
        raise InvalidInput(f"invalid number of workers {workers}: expected 1..64")
    if not duration > 0 or not math.isfinite(duration):
        raise InvalidInput(f"invalid duration {duration}: expected seconds > 0")
    if not 0 <= port <= 65535:
        raise InvalidInput(f"invalid port {port}: expected 0..65535")
    out = console or Console()
    err = Console(stderr=True, soft_wrap=True)
    service_set = tuple(services) if services is not None else Settings().service_list
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="locstatus-demo-"))
    temporary = backend_url is None
    store = backend_url or f"sqlite:///{workdir / 'locstatus.db'}"
    shown_store = redact(store)
    mgr: Manager | None = None
    sidecar: _Sidecar | None = None
    fleet: _Fleet | None = None
    scenario: _Scenario | None = None
    summary: dict[str, Any] = {"demo": "failed", "store": shown_store}
    code = 1
    try:
        with _sigterm_as_interrupt():
            try:
                mgr = connect(store, services=service_set)
                wanted = load_sample(service_set)
                _prepare_store(mgr, wanted, temporary=temporary, store=shown_store)
                token = os.environ.get("LOCSTATUS_API_TOKEN") or None
                sidecar = _Sidecar(mgr, port, token)
                sidecar.start()
                fleet = _Fleet(store, service_set, workdir, workers)
                _intro(out, shown_store, temporary, wanted, sidecar.url, workers)
                fleet.start()
                out.print(Text(f"started workers: {_per_worker_pids(fleet.pids())}", style="dim"),
                          soft_wrap=True)
                headers = {"Authorization": f"Bearer {token}"} if token else {}
                dashboard = _Dashboard(wanted, fleet.ids, duration)
                with httpx.Client(base_url=sidecar.url, timeout=30.0, headers=headers) as client:
                    scenario = _Scenario(
                        client=client, fleet=fleet, dashboard=dashboard, console=out,
                        wanted=wanted, started=started, duration=duration,
                    )
                    try:
                        with Live(dashboard, console=out, refresh_per_second=4,
                                  vertical_overflow="visible"):
                            try:
                                scenario.run()
                                code = 0
                                if keep:
                                    scenario.keep_running(shown_store, sidecar.url)
                            except KeyboardInterrupt:
                                if code != 0:
                                    scenario.say("interrupted", style="bold")
                                    code = 130
                    finally:
                        if not out.is_terminal:
                            out.line()  # the last table ends without a newline on a file
            except DemoFailed as exc:
                err.print(Text(f"error: demo did not converge: {exc.message}"))
                summary["error"] = exc.message
                code = 1
            except KeyboardInterrupt:
                code = 130
            finally:
                code = _cleanup(
                    out, err, code, mgr=mgr, sidecar=sidecar, fleet=fleet, scenario=scenario,
                    summary=summary, user_store=not temporary,
                )
    finally:
        if fleet is not None and (keep or code == 1):
            what = "the store, " if temporary else ""
            err.print(Text(f"demo files ({what}worker status files and logs) kept in {workdir}"))
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    summary["elapsed_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(summary, sort_keys=True), flush=True)
    return code


def _prepare_store(mgr: Manager, wanted: LocationMap, *, temporary: bool, store: str) -> None:
    """Add the sample locations; on a store given by the user, refuse to start when one of
    them is already paused (the demo would resume it)."""
    if not temporary:
        for item in mgr.scan():
            if isinstance(item, CorruptRecord):
                if item.location in wanted:
                    raise DemoFailed(f"{store}: {item.message}")
                continue
            if item.location in wanted and not item.deleted:
                busy = [
                    s for s in wanted[item.location]
                    if s in item.services and item.services[s].state is not State.RUNNING
                ]
                if busy:
                    raise DemoFailed(
                        f"{store}: {', '.join(busy)} at {item.location} is not running; the demo "
                        "pauses and resumes the sample locations, so it needs them running "
                        "(resume them, or run the demo without --backend: it then uses a "
                        "temporary store)"
                    )
    mgr.sync_locations(wanted, actor=ACTOR, remove_missing=False)


def _intro(
    out: Console, store: str, temporary: bool, wanted: LocationMap, url: str, workers: int
) -> None:
    def say(text: str, style: str | None = None) -> None:
        out.print(Text(text, style=style or ""), soft_wrap=True)

    kind = "temporary SQLite store" if temporary else "store given with --backend"
    say(f"locstatus demo: {workers} worker processes, a sidecar and a scripted operator", "bold")
    say(f"store:     {store} ({kind})")
    say(f"sidecar:   {url}  (status page {url}/, API {url}/docs)")
    locs = "; ".join(f"{loc} ({', '.join(svcs)})" for loc, svcs in sorted(wanted.items()))
    say(f"locations: {locs}  (from the packaged Backbeat samples)")


def _per_worker_pids(pids: Mapping[str, int | None]) -> str:
    return ", ".join(f"{w} (pid {p})" for w, p in pids.items())


def _cleanup(
    out: Console,
    err: Console,
    code: int,
    *,
    mgr: Manager | None,
    sidecar: _Sidecar | None,
    fleet: _Fleet | None,
    scenario: _Scenario | None,
    summary: dict[str, Any],
    user_store: bool,
) -> int:
    """Stop every process the demo started, restore what it paused in a user's store, and
    fill in the summary. Returns the final exit code."""
    exit_codes: dict[str, int | None] = {}
    if fleet is not None:
        pids = fleet.pids()
        exit_codes = fleet.stop()
        final = fleet.statuses()
        summary["workers"] = {
            w: {
                "pid": pids[w],
                "exit_code": exit_codes[w],
                "moved": sum(
                    int(c.get("moved", 0))
                    for per_svc in (final.get(w) or {}).get("locations", {}).values()
                    for c in per_svc.values()
                ),
            }
            for w in fleet.ids
        }
        if scenario is not None:
            scenario.finish(final)
        bad = {w: c for w, c in exit_codes.items() if c != 0}
        if bad and code == 0:
            err.print(Text(f"error: demo did not converge: workers exited badly: {bad}"))
            summary["error"] = f"workers exited badly: {bad}"
            code = 1
    if scenario is not None:
        summary["steps"] = scenario.report
        if user_store and mgr is not None:
            for loc, services in scenario.paused_by_demo.items():
                if services:
                    with contextlib.suppress(LocstatusError):
                        mgr.resume(loc, sorted(services), actor=ACTOR,
                                   reason="demo ended before resuming it")
                        err.print(Text(f"resumed {', '.join(sorted(services))} at {loc}, "
                                       "which the demo had paused"))
    if sidecar is not None:
        summary["sidecar"] = sidecar.url
        sidecar.stop()
    if mgr is not None:
        mgr.close()
    if code == 0:
        summary["demo"] = "ok"
        out.print(Text("demo finished: every pause settled with the workers stopped, every "
                       "resume with them moving again; all processes stopped.", style="green"),
                  soft_wrap=True)
    elif code == 130:
        summary["demo"] = "interrupted"
    return code

