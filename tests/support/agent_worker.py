"""A small worker program for the agent tests: one OS process running one :class:`Agent`.

The tests spawn it with ``subprocess`` and drive it with signals, the way an operator's fleet is
driven by the OS: SIGTERM stops it cleanly (``agent.stop()``), SIGSTOP/SIGCONT freeze and thaw
it, SIGKILL crashes it, and SIGUSR1/SIGUSR2 cut and restore its link to the backend.

Every handler call is recorded as one JSON line in ``--record`` (appended and flushed before the
handler returns, so a line exists before the agent can acknowledge): ``event`` (pause, resume,
remove, or a lifecycle mark: ready, disconnected, reconnected, stopped), ``phase`` (start, end,
error), ``location``, ``service``, ``generation`` (the generation being applied, from
``agent.applying``), ``t`` (``time.monotonic()``, comparable across processes on Linux) and
``pid``.

The link cut is a fault injector in front of the real backend (a network partition seen from
this process): while cut, every backend call raises :class:`BackendUnavailable` and every hint
is dropped, so the agent really misses the notifications of what changes meanwhile and has to
find its way back on its own (docs/design.md §3.4). The store itself (the SQLite file, the ZooKeeper
ensemble) stays up for everyone else.

Usage::

    python tests/support/agent_worker.py --url sqlite:///tmp/ls.db --id w1 --record /tmp/w1.jsonl \\
        [--services replication] [--lease 2] [--heartbeat S] [--resync S] [--slow S] \\
        [--fail N --fail-event pause] [--retry-base S]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Collection, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from locstatus.agent import HandlerRetry
from locstatus.backends import Backend, HintCallback, Unsubscribe, open_backend
from locstatus.client import Client
from locstatus.errors import BackendUnavailable, CorruptRecord
from locstatus.models import Hint, HistoryEntry, LocationStatus, WorkerInfo


class Recorder:
    """Append JSON lines to a file, one ``write`` per line, flushed at once."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def write(self, **fields: Any) -> None:
        fields.setdefault("t", time.monotonic())
        fields.setdefault("pid", os.getpid())
        line = (json.dumps(fields, sort_keys=True) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)

    def close(self) -> None:
        os.close(self._fd)


class Partition(Backend):
    """The real backend behind a switch: :meth:`cut` makes every call fail with
    :class:`BackendUnavailable` and drops every hint until :meth:`heal`."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.url = inner.url
        self.local_clock = inner.local_clock
        self.clock_resolution = inner.clock_resolution
        self._cut = threading.Event()

    def cut(self) -> None:
        self._cut.set()

    def heal(self) -> None:
        self._cut.clear()

    def _check(self) -> None:
        if self._cut.is_set():
            raise BackendUnavailable(f"{self.url}: link cut (test fault injector)")

    def create(self, record: LocationStatus, history: Sequence[HistoryEntry]) -> LocationStatus:
        self._check()
        return self.inner.create(record, history)

    def read(self, location: str) -> LocationStatus:
        self._check()
        return self.inner.read(location)

    def read_all(self) -> list[LocationStatus | CorruptRecord]:
        self._check()
        return self.inner.read_all()

    def compare_and_set(
        self, record: LocationStatus, expected_version: int, history: Sequence[HistoryEntry]
    ) -> LocationStatus:
        self._check()
        return self.inner.compare_and_set(record, expected_version, history)

    def delete(self, location: str, expected_version: int) -> None:
        self._check()
        self.inner.delete(location, expected_version)

    def history(
        self, location: str, *, limit: int = 50, before_version: int | None = None
    ) -> list[HistoryEntry]:
        self._check()
        return self.inner.history(location, limit=limit, before_version=before_version)

    def put_worker(self, info: WorkerInfo) -> None:
        self._check()
        self.inner.put_worker(info)

    def remove_worker(
        self, worker_id: str, *, if_expires: datetime | None = None, retire: bool = False
    ) -> bool:
        self._check()
        return self.inner.remove_worker(worker_id, if_expires=if_expires, retire=retire)

    def workers(self) -> list[WorkerInfo]:
        self._check()
        return self.inner.workers()

    def ack(
        self,
        worker_id: str,
        location: str,
        service: str,
        generation: int,
        *,
        if_version: int | None = None,
    ) -> None:
        self._check()
        self.inner.ack(worker_id, location, service, generation, if_version=if_version)

    def acks(self, location: str) -> dict[str, dict[str, int]]:
        self._check()
        return self.inner.acks(location)

    def all_acks(self) -> dict[str, dict[str, dict[str, int]]]:
        self._check()
        return self.inner.all_acks()

    def subscribe(
        self, callback: HintCallback, *, kinds: Collection[str] | None = None
    ) -> Unsubscribe:
        def forward(hint: Hint) -> None:
            if not self._cut.is_set():
                callback(hint)

        return self.inner.subscribe(forward, kinds=kinds)

    def probe_time(self) -> datetime:
        self._check()
        return self.inner.probe_time()

    def ping(self) -> None:
        self._check()
        self.inner.ping()

    def close(self) -> None:
        self.inner.close()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--id", required=True)
    p.add_argument("--record", required=True, type=Path)
    p.add_argument("--services", default="replication")
    p.add_argument("--locations", default=None, help="comma-separated location filter")
    p.add_argument("--lease", type=float, default=2.0)
    p.add_argument("--heartbeat", type=float, default=None)
    p.add_argument("--resync", type=float, default=30.0)
    p.add_argument("--slow", type=float, default=0.0, help="seconds each handler takes")
    p.add_argument("--fail", type=int, default=0, help="first N handler calls raise")
    p.add_argument("--fail-event", default=None, help="only calls of this event fail")
    p.add_argument("--retry-base", type=float, default=0.1)
    p.add_argument("--session-leases", action="store_true",
                   help="use the backend's session leases (ZooKeeper) instead of heartbeats "
                        "with a deadline, as an agent on the bare backend does")
    p.add_argument("--die-after-ack", action="store_true",
                   help="SIGKILL this process as soon as it has acknowledged a new generation")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    rec = Recorder(args.record)
    link = Partition(open_backend(args.url))
    if args.session_leases:
        link.session_leases = link.inner.session_leases
    mgr = Client(link)
    agent = mgr.agent(
        args.id,
        services=args.services.split(","),
        locations=None if args.locations is None else args.locations.split(","),
        lease_seconds=args.lease,
        heartbeat_interval=args.heartbeat,
        resync_interval=args.resync,
        handler_retry=HandlerRetry(base=args.retry_base, cap=max(1.0, args.retry_base * 4)),
    )
    failures_left = [args.fail]

    def handler(event: str) -> Callable[[str], None]:
        def run(location: str) -> None:
            applying = agent.applying
            assert applying is not None
            gen = None if applying.status is None else applying.status.generation
            mark = {
                "event": event,
                "location": location,
                "service": applying.service,
                "generation": gen,
            }
            rec.write(phase="start", **mark)
            if args.slow:
                time.sleep(args.slow)
            if failures_left[0] > 0 and args.fail_event in (None, event):
                failures_left[0] -= 1
                rec.write(phase="error", **mark)
                raise RuntimeError(f"injected failure ({failures_left[0]} left)")
            rec.write(phase="end", **mark)

        return run

    for svc in agent.services:
        agent.on_pause(svc)(handler("pause"))
        agent.on_resume(svc)(handler("resume"))
    agent.on_remove(handler("remove"))

    stop = threading.Event()

    def on_cut(*_: object) -> None:
        link.cut()
        rec.write(event="disconnected")

    def on_heal(*_: object) -> None:
        link.heal()
        rec.write(event="reconnected")

    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGUSR1, on_cut)
    signal.signal(signal.SIGUSR2, on_heal)
    agent.start()
    rec.write(event="ready")
    if args.die_after_ack:
        seen = {loc: {s: agent.observed_generation(loc, s) for s in agent.services}
                for loc in agent.locations_seen()}

        def die_after_ack() -> None:
            while True:
                for loc, gens in seen.items():
                    for svc, gen in gens.items():
                        if agent.observed_generation(loc, svc) != gen:
                            rec.write(event="dying", location=loc, service=svc)
                            os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(0.002)

        threading.Thread(target=die_after_ack, daemon=True).start()
    while not stop.wait(0.1):
        pass
    agent.stop()
    rec.write(event="stopped", metrics=agent.metrics())
    mgr.close()
    rec.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
