"""``locstatus demo``: watch workers stop and start as a location is paused and resumed.

:func:`run_demo` is the entry point of the command: it prepares the store, starts the sidecar
(on a thread of this process), the workers (:mod:`locstatus.demo.fleet`) and the live table
(:mod:`locstatus.demo.view`), runs the scripted operator (:mod:`locstatus.demo.scenario`) and
cleans up, whatever happened.

A newcomer runs one command and sees the whole system work: a sidecar (the HTTP API and its
reconciler), a few worker processes that move simulated objects per location
(:mod:`locstatus.demo.worker`), the locations of the packaged Backbeat-format samples, and a
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
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
from rich.console import Console
from rich.live import Live
from rich.text import Text

from locstatus.api import create_app
from locstatus.api.problems import redact
from locstatus.api.server import BackgroundServer
from locstatus.client import connect
from locstatus.demo.errors import DemoFailed
from locstatus.demo.fleet import Fleet
from locstatus.demo.scenario import ACTOR, Scenario
from locstatus.demo.view import Dashboard
from locstatus.errors import CorruptRecord, InvalidInput, LocstatusError
from locstatus.locations import LocationMap, load_sample
from locstatus.manager import Manager
from locstatus.models import State
from locstatus.reconciler import Reconciler
from locstatus.settings import Settings

__all__ = ["RECONCILE_INTERVAL", "DemoFailed", "run_demo"]

RECONCILE_INTERVAL = 0.5
"""Full reconcile pass period of the demo's sidecar, in seconds (hints make it faster)."""


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
    fleet: Fleet | None = None
    scenario: Scenario | None = None
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
                fleet = Fleet(store, service_set, workdir, workers)
                _intro(out, shown_store, temporary, wanted, sidecar.url, workers)
                fleet.start()
                out.print(Text(f"started workers: {_per_worker_pids(fleet.pids())}", style="dim"),
                          soft_wrap=True)
                headers = {"Authorization": f"Bearer {token}"} if token else {}
                dashboard = Dashboard(wanted, fleet.ids, duration)
                with httpx.Client(base_url=sidecar.url, timeout=30.0, headers=headers) as client:
                    scenario = Scenario(
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
    fleet: Fleet | None,
    scenario: Scenario | None,
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


