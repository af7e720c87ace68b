"""A worker process for the reliability suite: one :class:`locstatus.agent.Agent` whose handlers
"apply" the state to an in-memory table, and which publishes its local view to a file so the
suite can compare it with the backend.

Run as a script by :class:`AgentProc` (``python agent_proc.py --url URL --id w1 --state
w1.json --events w1.jsonl``). Every ``--every`` seconds (default 0.1) the process writes, to
``--state`` atomically (temporary file + rename), ``{"t": time.time(), "mono", "pid", "worker_id",
"records": {location: {"version", "deleted", "services": {service: {"state", "generation"}}}},
"observed": {location: {service: generation}}, "applied": {location: {service: "paused" |
"running"}}, "errors", "metrics"}``: the agent's local copy (public API only: ``record``,
``observed_generation``), and what the handlers last did per (location, service).

Each handler call appends ``{"ev": "start" | "end", "location", "service", "generation", "t",
"mono"}`` to ``--events`` before and after it runs (``--slow`` seconds of work in between,
randomised), so the suite can ``kill -9`` the process while a handler is running. ``t`` is
``time.time()``, ``mono`` is ``time.monotonic()``: the same on every process of the host, even
one whose wall clock is off (the skew scenario runs workers under libfaketime). Whenever the
agent's connection counters move (a heartbeat or a read failed, a lease lapsed, a session was
lost) a ``{"ev": "health", "metrics": {...}}`` line is appended too, so the checker knows when a
worker may have lost its lease. With ``--hang-worker ID --hang-location LOC --hang-release
FILE``, worker ID's pause handler for LOC hangs until FILE exists (the hung-handler scenario).
SIGTERM stops the agent cleanly (``agent.stop()``: unregister) and exits 0.

``--fail-file PATH``: while that file exists every handler raises a 1 KB error after its
``start`` event (an outage at every location: the worker's published errors grow);
``--pad-filter N``: the agent's location filter is every location at start plus N names of 110
characters that never exist (a registration near the size bound).

This file imports only the standard library and locstatus: it runs as a plain script.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HEALTH = ("heartbeat_errors", "backend_errors", "reconnects", "lease_lapses", "sessions_lost")
"""Agent counters whose change means the worker may have lost its lease for a while."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="reliability-suite worker agent")
    p.add_argument("--url", required=True)
    p.add_argument("--id", required=True)
    p.add_argument("--state", required=True)
    p.add_argument("--events", required=True)
    p.add_argument("--lease", type=float, default=3.0)
    p.add_argument("--heartbeat", type=float, default=1.0)
    p.add_argument("--resync", type=float, default=5.0)
    p.add_argument("--slow", type=float, default=0.02, help="max seconds a handler works")
    p.add_argument("--every", type=float, default=0.1, help="state file period, seconds")
    p.add_argument("--no-fire", action="store_true", help="leave scheduled resumes to others")
    p.add_argument("--handler-deadline", type=float, default=None,
                   help="seconds after which a running handler is reported stuck")
    p.add_argument("--hang-worker", default=None,
                   help="this worker's on_pause for --hang-location hangs until --hang-release")
    p.add_argument("--hang-location", default=None)
    p.add_argument("--hang-release", default=None, help="file whose existence ends the hang")
    p.add_argument("--fail-file", default=None,
                   help="while this file exists, every handler raises a 1 KB error (an outage)")
    p.add_argument("--pad-filter", type=int, default=0,
                   help="a location filter: every location at start plus N 110-character names")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    from locstatus import connect
    from locstatus.agent import HandlerRetry
    from locstatus.errors import LocstatusError

    args = parse_args(argv)
    mgr = connect(args.url)
    locations = None
    if args.pad_filter:
        known = [r.location for r in mgr.scan() if not isinstance(r, LocstatusError)]
        locations = known + [f"pad-{i:06d}-".ljust(110, "x") for i in range(args.pad_filter)]
    agent = mgr.agent(
        args.id,
        locations=locations,
        lease_seconds=args.lease,
        heartbeat_interval=args.heartbeat,
        resync_interval=args.resync,
        handler_retry=HandlerRetry(base=0.05, cap=1.0),
        fire_scheduled_resumes=not args.no_fire,
        **({} if args.handler_deadline is None else {"handler_deadline": args.handler_deadline}),
    )
    hangs = args.hang_worker == args.id and args.hang_location is not None
    applied: dict[str, dict[str, str]] = {}
    lock = threading.Lock()
    events_fd = os.open(args.events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    rng = random.Random()

    def event(**fields: Any) -> None:
        line = {**fields, "t": time.time(), "mono": time.monotonic()}
        os.write(events_fd, (json.dumps(line) + "\n").encode())

    def handler(service: str, state: str) -> Callable[[str], None]:
        def run(location: str) -> None:
            applying = agent.applying
            gen = applying.status.generation if applying and applying.status else None
            event(ev="start", location=location, service=service, generation=gen, to=state)
            if hangs and state == "paused" and location == args.hang_location:
                while not (args.hang_release and os.path.exists(args.hang_release)):
                    time.sleep(0.05)  # a consumer that never stops, until released
            if args.fail_file and os.path.exists(args.fail_file):
                raise RuntimeError(f"outage at {location}/{service}: " + "x" * 1000)
            if args.slow > 0:
                time.sleep(rng.uniform(0, args.slow))
            with lock:
                applied.setdefault(location, {})[service] = state
            event(ev="end", location=location, service=service, generation=gen, to=state)

        return run

    for svc in agent.services:
        agent.on_pause(svc)(handler(svc, "paused"))
        agent.on_resume(svc)(handler(svc, "running"))

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    state_path = Path(args.state)
    tmp_path = Path(args.state + ".tmp")

    def snapshot() -> dict[str, Any]:
        t = time.time()
        records: dict[str, Any] = {}
        observed: dict[str, dict[str, int | None]] = {}
        for loc in agent.locations_seen():
            try:
                rec = agent.record(loc)
            except LocstatusError:
                continue
            records[loc] = {
                "version": rec.version,
                "deleted": rec.deleted,
                "services": {
                    s: {"state": st.state.value, "generation": st.generation}
                    for s, st in rec.services.items()
                },
            }
            observed[loc] = {s: agent.observed_generation(loc, s) for s in agent.services}
        with lock:
            table = {k: dict(v) for k, v in applied.items()}
        return {
            "t": t, "mono": time.monotonic(), "pid": os.getpid(), "worker_id": args.id,
            "records": records,
            "observed": observed, "applied": table, "errors": agent.errors(),
            "metrics": agent.metrics(),
        }

    agent.start()
    event(ev="ready")
    health = {k: 0 for k in HEALTH}
    while not stop.wait(args.every):
        snap = snapshot()
        now = {k: int(snap["metrics"].get(k, 0)) for k in HEALTH}
        if now != health:
            health = now
            event(ev="health", metrics=now)
        tmp_path.write_text(json.dumps(snap))
        os.replace(tmp_path, state_path)
    agent.stop()
    event(ev="stopped")
    mgr.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())


# -- the handle (used by the tests, in the test process) -----------------------------------------

from faults import Proc, wait_for  # noqa: E402  (the script above needs only locstatus)

SCRIPT = Path(__file__)


class AgentProc:
    """One worker process and its files. ``start()`` spawns it (again, after a kill: same
    worker id, as a supervisor would), ``snapshot()`` reads its last published state.

    ``skew``: run it with its wall clock that far off (``+30s``, ``-3h``; libfaketime, see
    ``tests/support/skew.py``). :attr:`life` records, in this process's wall time, every start, kill,
    freeze, thaw and stop, so the checker knows when the worker was up."""

    def __init__(
        self, url: str, worker_id: str, workdir: Path, *extra: str, skew: str | None = None
    ) -> None:
        self.url = url
        self.id = worker_id
        self.dir = workdir
        self.extra = list(extra)
        self.skew = skew
        self.state = workdir / f"{worker_id}.state.json"
        self.events = workdir / f"{worker_id}.events.jsonl"
        self.proc: Proc | None = None
        self.starts = 0
        self.life: list[tuple[float, str]] = []

    @property
    def lease(self) -> float:
        """The lease (seconds) its agent registers with (``--lease``, else the default)."""
        if "--lease" in self.extra:
            return float(self.extra[self.extra.index("--lease") + 1])
        return float(parse_args(["--url", "-", "--id", "-", "--state", "-", "--events", "-"]).lease)

    def start(self, url: str | None = None) -> AgentProc:
        """Spawn the process (the state file of a previous life is removed first)."""
        from support.skew import skew_env

        self.state.unlink(missing_ok=True)
        self.starts += 1
        self.life.append((time.time(), "start"))
        self.proc = Proc.python(
            SCRIPT,
            ["--url", url or self.url, "--id", self.id, "--state", str(self.state),
             "--events", str(self.events), *self.extra],
            self.dir / f"{self.id}.log",
            env=skew_env(self.skew),
        )
        return self

    def wait_ready(self, timeout: float = 90.0) -> None:
        """Until the process published its state once (it started and read every record)."""

        def ready() -> bool:
            assert self.proc is not None
            if not self.proc.alive:
                raise AssertionError(f"worker {self.id} exited:\n{self.proc.log_tail()}")
            return self.state.exists()

        wait_for(ready, timeout, f"worker {self.id} to start")

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive

    def snapshot(self) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads(self.state.read_text())
        except (OSError, ValueError):
            return None
        return data

    def in_handler(self) -> bool:
        """True when the last handler event of this life is a ``start`` (a handler runs)."""
        try:
            with self.events.open("rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - 2000))
                tail = fh.read().decode(errors="replace").strip().splitlines()
        except OSError:
            return False
        handlers = [line for line in tail if '"ev": "health"' not in line]
        return bool(handlers) and '"ev": "start"' in handlers[-1]

    def kill9(self) -> None:
        if self.proc is not None:
            self.life.append((time.time(), "kill"))
            self.proc.kill9()

    def freeze(self) -> None:
        if self.proc is not None:
            self.life.append((time.time(), "freeze"))
            self.proc.freeze()

    def thaw(self) -> None:
        if self.proc is not None:
            self.proc.thaw()
            self.life.append((time.time(), "thaw"))

    def stop(self) -> int | None:
        if self.proc is not None:
            self.life.append((time.time(), "stop"))
        return self.proc.terminate() if self.proc is not None else None
