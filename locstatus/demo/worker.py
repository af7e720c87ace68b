"""A demo worker process: one :class:`~locstatus.agent.Agent` that "moves objects" per location.

``locstatus demo`` starts a few of these as real OS processes, and the compose stack runs two of
them against ZooKeeper. Each one stands for a background mover of a storage platform
(replication, lifecycle, ingestion): for every (location, service) it has a simulated consumer
that moves objects (increments a counter) while it runs, and the agent starts and stops those
consumers as operators pause and resume.

Why it is shaped so:

- **The handlers do the stopping, the agent does the acknowledging.** ``on_pause`` stops the
  consumer and returns only once no batch of it is in flight and the final count is written to
  the status file; only then does the agent acknowledge the generation. So once a location is
  ``paused`` (every live worker acknowledged), its counters are final: the demo checks that they
  do not move while paused. This is the pattern a real worker follows (docs/agent.md).
- **A status file, not a socket.** With ``--status-file`` the worker writes its counters as JSON
  (atomically: temporary file and rename, under the same lock as the counters, so a file never
  shows an older count than one already written). The demo reads the files of all its workers;
  ``--healthcheck`` reads it back for a container healthcheck (fresh, connected, not stopped).
- **Plain signals.** SIGTERM or SIGINT stop the agent (it unregisters, which drops its
  acknowledgements at once), mark every consumer stopped in a last status write, and exit 0.
  With ``--exit-with-parent`` (the demo uses it) the worker also stops when the process that
  started it is gone, so a demo killed with SIGKILL leaves no worker behind.

Usage::

    python -m locstatus.demo.worker --backend zk://zk1:2181/locstatus --id worker-1
    python -m locstatus.demo.worker --id w1 --status-file /tmp/w1.json --log-every 5
    python -m locstatus.demo.worker --healthcheck --status-file /tmp/w1.json   # exit 0 or 1

The backend defaults to ``$LOCSTATUS_BACKEND`` (else ``sqlite:///./locstatus.db``), the services
to ``$LOCSTATUS_SERVICES``. Exit codes: 0 stopped cleanly (or healthy), 1 unhealthy, 2 usage or
backend error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from locstatus.agent import Agent
from locstatus.client import connect
from locstatus.errors import LocstatusError
from locstatus.logs import LOG_FORMATS, check_log_format, configure_logging
from locstatus.manager import Manager
from locstatus.names import check_location
from locstatus.settings import Settings

log = logging.getLogger("locstatus.demo.worker")

STATUS_FORMAT = 1
"""Version of the status file's JSON layout (``format`` member)."""

TICK_SECONDS = 0.1
"""How often a running consumer moves a batch of objects."""

STATUS_EVERY_SECONDS = 0.25
"""How often the status file is rewritten (also on every start and stop of a consumer)."""


# -- the simulated movers ------------------------------------------------------------------------


@dataclass
class _Consumer:
    moved: int = 0
    running: bool = False


class Mover:
    """Simulated consumers, one per (location, service), and the status file that shows them.

    - ``worker_id``: shown in the status file and the log.
    - ``rate``: average objects moved per second by one running consumer (> 0).
    - ``status_file``: where to write the JSON status, or None.

    :meth:`start` and :meth:`stop` are what the agent's handlers call; :meth:`tick` moves one
    batch for every running consumer. All three hold one lock, so :meth:`stop` returns only
    after a batch in flight has finished, and never while a later one runs.

    Usage::

        mover = Mover("w1", rate=50, status_file=Path("/tmp/w1.json"))
        mover.start("us-east-1", "replication")
        mover.tick()
        mover.stop("us-east-1", "replication")   # counters of that consumer are final now
    """

    def __init__(
        self,
        worker_id: str,
        *,
        rate: float,
        status_file: Path | None,
        services: Sequence[str] = (),
        rng: random.Random | None = None,
    ) -> None:
        if not rate > 0:
            raise ValueError(f"rate must be > 0 objects per second, got {rate}")
        self.worker_id = worker_id
        self.rate = rate
        self.status_file = status_file
        self.services = tuple(services)
        self.connected = True
        self.stopped = False
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._consumers: dict[tuple[str, str], _Consumer] = {}
        self._started_at = time.time()

    def start(self, location: str, service: str) -> None:
        """Start moving objects for ``service`` at ``location`` (idempotent)."""
        with self._lock:
            self._consumers.setdefault((location, service), _Consumer()).running = True
            self._write_locked()

    def stop(self, location: str, service: str) -> None:
        """Stop ``service`` at ``location`` (idempotent). Returns once no batch of it is in
        flight and the status file shows its final count."""
        with self._lock:
            self._consumers.setdefault((location, service), _Consumer()).running = False
            self._write_locked()

    def remove(self, location: str) -> None:
        """The location was removed: stop every consumer of it."""
        with self._lock:
            for (loc, _svc), consumer in self._consumers.items():
                if loc == location:
                    consumer.running = False
            self._write_locked()

    def shutdown(self) -> None:
        """Stop every consumer and write the last status (``stopped: true``)."""
        with self._lock:
            for consumer in self._consumers.values():
                consumer.running = False
            self.stopped = True
            self._write_locked()

    def tick(self, seconds: float = TICK_SECONDS) -> int:
        """Move one batch (about ``rate * seconds`` objects) for every running consumer;
        return how many objects moved in total."""
        top = max(1, round(2 * self.rate * seconds))
        total = 0
        with self._lock:
            for consumer in self._consumers.values():
                if consumer.running:
                    n = self._rng.randint(1, top)
                    consumer.moved += n
                    total += n
        return total

    def write_status(self) -> None:
        """Rewrite the status file now (no-op without one)."""
        with self._lock:
            self._write_locked()

    def snapshot(self) -> dict[str, Any]:
        """The status as a JSON-able dict (the status file's content)."""
        with self._lock:
            return self._snapshot_locked()

    def summary(self) -> str:
        """One log line: consumers moving, objects moved, what is stopped."""
        with self._lock:
            running = sum(c.running for c in self._consumers.values())
            moved = sum(c.moved for c in self._consumers.values())
            stopped = sorted(f"{loc}/{svc}" for (loc, svc), c in self._consumers.items()
                             if not c.running)
        text = (f"{self.worker_id}: {running}/{len(self._consumers)} consumers moving, "
                f"{moved} objects moved")
        return text + (f"; stopped: {', '.join(stopped)}" if stopped else "")

    def _snapshot_locked(self) -> dict[str, Any]:
        locations: dict[str, dict[str, dict[str, Any]]] = {}
        for (loc, svc), consumer in sorted(self._consumers.items()):
            locations.setdefault(loc, {})[svc] = {
                "moved": consumer.moved,
                "running": consumer.running,
            }
        return {
            "format": STATUS_FORMAT,
            "worker_id": self.worker_id,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "services": list(self.services),
            "started": self._started_at,
            "updated": time.time(),
            "connected": self.connected,
            "stopped": self.stopped,
            "locations": locations,
        }

    def _write_locked(self) -> None:
        if self.status_file is None:
            return
        write_json_atomic(self.status_file, self._snapshot_locked())


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file and a rename, so a reader
    sees the old or the new content, never a partial one. Raises ``OSError``."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_status(path: Path) -> dict[str, Any] | None:
    """The status a worker wrote to ``path``, or None if there is none (yet) or it does not
    parse."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == STATUS_FORMAT else None


# -- the program ---------------------------------------------------------------------------------


def _positive(kind: str, *, allow_zero: bool = False) -> Callable[[str], float]:
    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a number of {kind}, got {value!r}"
            ) from None
        ok = number >= 0 if allow_zero else number > 0
        if not ok or number != number or number > 1e6:
            bound = ">= 0" if allow_zero else "> 0"
            raise argparse.ArgumentTypeError(f"expected {kind} {bound} and <= 1e6, got {value!r}")
        return number

    return parse


def _names(kind: str) -> Callable[[str], list[str]]:
    def parse(value: str) -> list[str]:
        names = [n.strip() for n in value.split(",") if n.strip()]
        if not names:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind}, got {value!r}")
        return names

    return parse


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m locstatus.demo.worker``."""
    p = argparse.ArgumentParser(
        prog="python -m locstatus.demo.worker",
        description="A demo worker: an agent that moves simulated objects per location while "
        "its services are not paused.",
    )
    p.add_argument("--backend", metavar="URL", default=None,
                   help="backend URL (default $LOCSTATUS_BACKEND, else sqlite:///./locstatus.db)")
    p.add_argument("--id", dest="worker_id", metavar="NAME",
                   help="worker id (required unless --healthcheck)")
    p.add_argument("--services", metavar="A,B", type=_names("service names"), default=None,
                   help="services this worker applies (default $LOCSTATUS_SERVICES)")
    p.add_argument("--locations", metavar="A,B", type=_names("location names"), default=None,
                   help="only these locations (default: every location)")
    p.add_argument("--status-file", metavar="PATH", type=Path, default=None,
                   help="write the counters here as JSON")
    p.add_argument("--rate", metavar="N", type=_positive("objects per second"), default=50.0,
                   help="objects per second moved by one running consumer (default 50)")
    p.add_argument("--lease", metavar="SECONDS", type=_positive("seconds"), default=None,
                   help="lease length (default $LOCSTATUS_LEASE_SECONDS, 10)")
    p.add_argument("--no-fire-resumes", action="store_true",
                   help="leave due scheduled resumes to the sidecar's reconciler")
    p.add_argument("--log-every", metavar="SECONDS", type=_positive("seconds", allow_zero=True),
                   default=10.0, help="log a progress line this often (0: never; default 10)")
    p.add_argument("--log-format", choices=LOG_FORMATS, default=None,
                   help="text, or json: one object per line with worker, location, service, "
                   "op_id and actor where they apply (default $LOCSTATUS_LOG_FORMAT, text)")
    p.add_argument("--exit-with-parent", action="store_true",
                   help="stop when the parent process exits (the demo starts its workers so)")
    p.add_argument("--healthcheck", action="store_true",
                   help="do not run: exit 0 if --status-file is fresh, connected and not "
                   "stopped, else 1")
    p.add_argument("--max-age", metavar="SECONDS", type=_positive("seconds"), default=30.0,
                   help="with --healthcheck: oldest acceptable status (default 30)")
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and check the command line (exits 2 with a message on a bad one)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.healthcheck:
        if args.status_file is None:
            parser.error("--healthcheck needs --status-file")
        return args
    try:
        args.log_format = check_log_format(
            args.log_format or os.environ.get("LOCSTATUS_LOG_FORMAT", "text"),
            "--log-format (LOCSTATUS_LOG_FORMAT)",
        )
    except LocstatusError as exc:
        parser.error(exc.message)
    if not args.worker_id:
        parser.error("--id is required")
    try:
        check_location(args.worker_id)
    except LocstatusError as exc:
        parser.error(f"invalid --id (worker ids follow the location name rules): {exc.message}")
    try:
        for loc in args.locations or ():
            check_location(loc)
    except LocstatusError as exc:
        parser.error(f"invalid --locations: {exc.message}")
    return args


def healthcheck(path: Path, max_age: float, now: float | None = None) -> tuple[bool, str]:
    """Whether the worker that writes ``path`` looks healthy: the file parses, was updated
    within ``max_age`` seconds (relative to ``now``, default the current time), the worker is
    connected and has not stopped. Returns ``(healthy, reason)``."""
    data = read_status(path)
    if data is None:
        return False, f"no readable status in {path}"
    age = (time.time() if now is None else now) - float(data.get("updated", 0))
    if age > max_age:
        return False, f"status is {age:.0f} s old (more than {max_age:g} s)"
    if data.get("stopped"):
        return False, "worker stopped"
    if not data.get("connected", False):
        return False, "worker is not connected to its backend"
    return True, f"ok: {data.get('worker_id')} updated {age:.1f} s ago"


def run(args: argparse.Namespace) -> int:
    """Run the worker until SIGTERM/SIGINT. Returns the exit code."""
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    url = args.backend or os.environ.get("LOCSTATUS_BACKEND") or Settings().backend
    try:
        mgr = connect(url, services=args.services)
    except LocstatusError as exc:
        log.error("cannot open the backend: %s", exc.message)
        return 2
    try:
        agent_kwargs: dict[str, Any] = {"fire_scheduled_resumes": not args.no_fire_resumes}
        if args.lease is not None:
            agent_kwargs["lease_seconds"] = args.lease
        agent = mgr.agent(args.worker_id, services=args.services,
                          locations=args.locations, **agent_kwargs)
        mover = Mover(args.worker_id, rate=args.rate, status_file=args.status_file,
                      services=agent.services)
        _register(agent, mover)
        return _serve(agent, mover, mgr, stop, log_every=args.log_every,
                      parent=os.getppid() if args.exit_with_parent else None)
    except LocstatusError as exc:
        log.error("%s", exc.message)
        return 2
    finally:
        mgr.close()


def _register(agent: Agent, mover: Mover) -> None:
    for service in agent.services:

        def paused(location: str, service: str = service) -> None:
            mover.stop(location, service)
            log.info("%s: stopped %s at %s", mover.worker_id, service, location)

        def resumed(location: str, service: str = service) -> None:
            mover.start(location, service)
            log.info("%s: moving %s at %s", mover.worker_id, service, location)

        agent.on_pause(service)(paused)
        agent.on_resume(service)(resumed)

    @agent.on_remove
    def removed(location: str) -> None:
        mover.remove(location)
        log.info("%s: location %s removed, its consumers stopped", mover.worker_id, location)


def _serve(agent: Agent, mover: Mover, mgr: Manager, stop: threading.Event, *,
           log_every: float, parent: int | None) -> int:
    agent.start()
    log.info("%s: started (pid %d, services %s, backend %s)", agent.worker_id, os.getpid(),
             ",".join(agent.services), type(mgr.backend).__name__)
    next_status = next_log = time.monotonic()
    try:
        while not stop.wait(TICK_SECONDS):
            mover.tick()
            now = time.monotonic()
            if now >= next_status:
                mover.connected = bool(agent.metrics().get("connected", 1))
                mover.write_status()
                next_status = now + STATUS_EVERY_SECONDS
            if log_every and now >= next_log:
                log.info("%s", mover.summary())
                next_log = now + log_every
            if parent is not None and os.getppid() != parent:
                log.warning("%s: parent process %d exited; stopping", agent.worker_id, parent)
                break
    finally:
        agent.stop()
        mover.shutdown()
        log.info("%s: stopped; %s", agent.worker_id, mover.summary())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m locstatus.demo.worker``."""
    args = parse_args(argv)
    if args.healthcheck:
        healthy, reason = healthcheck(args.status_file, args.max_age)
        print(reason, file=sys.stdout if healthy else sys.stderr)
        return 0 if healthy else 1
    configure_logging(args.log_format, stream=sys.stdout)
    logging.getLogger("kazoo").setLevel(logging.WARNING)  # its INFO lines are per connection try
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
