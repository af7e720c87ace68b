"""The scripted operator of ``locstatus demo``: every action through the sidecar's HTTP API,
every outcome checked.

:class:`Scenario` runs the steps listed in :mod:`locstatus.demo.run` (wait for every worker,
pause a location, pause one service elsewhere, schedule a resume and let the sidecar's
reconciler fire it, resume the other at once) and fails with
:class:`~locstatus.demo.errors.DemoFailed` at the first one that does not converge within its
timeout, naming the step, the states and the lagging workers.

Why it is shaped so: the demo checks what it shows. After the sidecar reports ``paused``, the
scenario reads every worker's status file again; those counts are final (a worker writes them
before it acknowledges), so the scenario freezes them (:class:`Frozen`) and fails if any moves
while the generation it froze is still paused. It talks HTTP (httpx) as a human's tools would,
never to the store, and keeps a report of each step for the demo's JSON summary.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx
from pydantic import TypeAdapter
from rich.console import Console
from rich.text import Text

from locstatus.demo.errors import DemoFailed
from locstatus.demo.fleet import Fleet
from locstatus.demo.view import Dashboard, Snapshot, moved_by, running_consumers
from locstatus.locations import LocationMap
from locstatus.models import HistoryEntry, LocationStatus, State

__all__ = [
    "ACTOR",
    "FIRE_GRACE",
    "POLL_SECONDS",
    "SETTLE_TIMEOUT",
    "STARTUP_TIMEOUT",
    "Frozen",
    "Scenario",
]

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

_LOCATIONS = TypeAdapter(list[LocationStatus])
_HISTORY = TypeAdapter(list[HistoryEntry])


@dataclass
class Frozen:
    """A (location, services) the demo paused and watches: counts must not move while the
    generations it froze are still paused."""

    location: str
    services: tuple[str, ...]
    generations: dict[str, int]
    counts: dict[str, int]
    last: dict[str, int] = field(default_factory=dict)


class Scenario:
    """Drives the operator's actions through the sidecar's HTTP API and checks what follows."""

    def __init__(
        self,
        *,
        client: httpx.Client,
        fleet: Fleet,
        dashboard: Dashboard,
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
        self.frozen: dict[tuple[str, tuple[str, ...]], Frozen] = {}
        self.paused_by_demo: dict[str, set[str]] = {}
        self.report: list[dict[str, Any]] = []
        self.last: Snapshot | None = None

    # -- observation --------------------------------------------------------------------------

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def say(self, message: str, style: str | None = None) -> None:
        line = Text(f"{self.elapsed():6.1f}s  ", style="dim")
        line.append(message, style=style)
        self.console.print(line, soft_wrap=True)

    def refresh(self, *, strict: bool = True) -> Snapshot:
        """Read every worker's status file, then the sidecar; with ``strict``, fail when a
        worker exited and check the frozen counts."""
        if strict:
            self.fleet.check_alive()
        workers = self.fleet.statuses()
        running = self.fleet.running()
        listed = _LOCATIONS.validate_json(self._get("/v1/locations"))
        records = {rec.location: rec for rec in listed}
        leases = {
            str(w.get("worker_id")): bool(w.get("alive"))
            for w in json.loads(self._get("/v1/workers"))
            if isinstance(w, dict)
        }
        snap = Snapshot(self.elapsed(), workers, running, records, leases, self.step)
        self.last = snap
        self.dashboard.snapshot = snap
        if strict:
            self._check_frozen(snap)
        return snap

    def _check_frozen(self, snap: Snapshot) -> None:
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
        self, what: str, cond: Callable[[Snapshot], bool], timeout: float
    ) -> Snapshot:
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

    def watch(self, seconds: float) -> Snapshot:
        """Keep refreshing (and checking) for ``seconds``."""
        end = time.monotonic() + seconds
        snap = self.refresh()
        while time.monotonic() < end:
            time.sleep(min(POLL_SECONDS, max(0.0, end - time.monotonic())))
            snap = self.refresh()
        return snap

    def _describe(self, snap: Snapshot) -> str:
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
            self.dashboard.snapshot = Snapshot(
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

    def _everyone_moving(self, snap: Snapshot) -> bool:
        if set(self.fleet.ids) - {w for w, alive in snap.leases.items() if alive}:
            return False
        for st in snap.workers.values():
            for loc, services in self.wanted.items():
                running, known = running_consumers(st, loc, services)
                if known < len(services) or running < known or moved_by(st, loc, services) == 0:
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
        self.frozen[(location, services)] = Frozen(location, services, generations, counts)
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
            end = {w: moved_by(final.get(w), loc, services) for w in self.fleet.ids}
            start = entry.get("counts_at_resume", end)
            entry["moved_after_resume"] = {w: end[w] - start.get(w, 0) for w in self.fleet.ids}
            entry.pop("counts_at_resume", None)


def _gens(generations: Mapping[str, int]) -> str:
    values = sorted(set(generations.values()))
    return ", ".join(str(v) for v in values) or "?"


def _per_worker(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{w} {n:,}" for w, n in counts.items())
