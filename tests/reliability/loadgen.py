"""The load generator of the reliability suite: one OS process issuing random operator
operations, recording each one before and after it runs.

Run as a script (``python loadgen.py --url URL --out ops.jsonl ...``) by :class:`LoadFleet`,
which starts N of them, kills and restarts them, and stops them all with a stop file.

Each process picks, at a paced rate, an operation (pause, resume, schedule a resume, cancel a
scheduled resume), a location (a few *hot* ones most of the time, else one of many *cold*
ones) and a service (one, or now and then every service of the location in one write), and
calls the library (:func:`locstatus.connect`). Every operation is two JSON lines in ``--out``,
each one ``write(2)`` on an ``O_APPEND`` descriptor, so the kernel has it even if the process is
killed the next instant:

- ``{"k": "b", "op_id", "op", "location", "service", "start"}`` before the call;
- ``{"k": "e", "op_id", "end", "outcome", "version", "error"}`` after it, ``outcome`` one of
  ``wrote`` (the record carries this op_id: it changed something), ``noop`` (success, nothing
  to change), ``refused`` (InvalidTransition / NotFound / InvalidInput: nothing written),
  ``failed`` (BackendUnavailable, ConflictError, CorruptRecord: nothing written), ``unknown``
  (AmbiguousCommit: the outcome could not be resolved), ``crash`` (anything that is not a
  locstatus error: a bug), and ``ambiguous``: true when the manager met an ambiguous commit
  during the call and resolved it by op_id (docs/design.md §3.2).

A ``b`` line without its ``e`` line is an operation whose process was killed while it ran: its
outcome is unknown (at most once in the history). Times are ``time.time()`` (wall clock, the
same on every process of the host). Schedules are a few seconds ahead until ``--short-until``
(so resumes come due and are fired while the load runs), hours ahead after it (so nothing comes
due while the scenario converges).

This file imports only the standard library and locstatus: it runs as a plain script.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

OPS = ("pause", "resume", "schedule", "cancel")
OP_WEIGHTS = (0.35, 0.30, 0.20, 0.15)
SERVICES = ("replication", "lifecycle", "ingestion")


class OpLog:
    """Append-only JSON lines; one ``os.write`` per line (atomic for lines this short)."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, **fields: Any) -> None:
        os.write(self.fd, (json.dumps(fields) + "\n").encode())

    def close(self) -> None:
        os.close(self.fd)


def classify(exc: BaseException) -> str:
    """The outcome class of an exception (see the module docstring)."""
    from locstatus.errors import (
        AmbiguousCommit,
        InvalidInput,
        InvalidTransition,
        LocstatusError,
        NotFound,
    )

    if isinstance(exc, AmbiguousCommit):
        return "unknown"
    if isinstance(exc, InvalidTransition | NotFound | InvalidInput):
        return "refused"
    if isinstance(exc, LocstatusError):
        return "failed"
    return "crash"


def run(args: argparse.Namespace) -> int:
    from locstatus import connect
    from locstatus.manager import RetryPolicy
    from locstatus.models import new_op_id

    rng = random.Random(args.seed)
    hot = [x for x in args.hot.split(",") if x]
    cold = [x for x in args.cold.split(",") if x]
    stop = Path(args.stop)
    log = OpLog(args.out)
    stopping = [False]
    signal.signal(signal.SIGTERM, lambda *_: stopping.__setitem__(0, True))
    mgr = connect(args.url, retry=RetryPolicy(max_attempts=200, max_seconds=30))
    interval = 1.0 / args.rate if args.rate > 0 else 0.0
    next_at = time.monotonic()
    done = 0
    try:
        while done < args.max_ops and not stopping[0] and not stop.exists():
            if time.time() > args.deadline:
                break
            op = rng.choices(OPS, OP_WEIGHTS)[0]
            loc = rng.choice(hot) if (not cold or rng.random() < args.hot_share) else rng.choice(cold)
            svc: str | None = rng.choice(SERVICES) if rng.random() > args.all_share else None
            op_id = new_op_id()
            log.write(k="b", op_id=op_id, op=op, location=loc, service=svc, start=time.time(),
                      pid=os.getpid())
            outcome, version, error = "noop", None, None
            ambiguous_before = mgr.stats["ambiguous"]
            try:
                if op == "pause":
                    rec = mgr.pause(loc, svc, reason="load", actor=args.actor, op_id=op_id)
                elif op == "resume":
                    rec = mgr.resume(loc, svc, actor=args.actor, op_id=op_id)
                elif op == "schedule":
                    if time.time() < args.short_until:
                        delay = timedelta(seconds=rng.uniform(0.5, 3.0))
                    else:
                        delay = timedelta(hours=rng.randint(2, 48))
                    rec = mgr.resume(loc, svc, at=delay, actor=args.actor, op_id=op_id)
                else:
                    rec = mgr.cancel_scheduled_resume(loc, svc, actor=args.actor, op_id=op_id)
                if any(s.op_id == op_id for s in rec.services.values()):
                    outcome, version = "wrote", rec.version
            except Exception as exc:
                outcome = classify(exc)
                error = f"{type(exc).__name__}: {exc}"[:500]
                if outcome == "crash":
                    error += "\n" + traceback.format_exc()[-2000:]
            log.write(k="e", op_id=op_id, end=time.time(), outcome=outcome, version=version,
                      error=error, ambiguous=mgr.stats["ambiguous"] > ambiguous_before)
            done += 1
            if interval:
                next_at += interval * rng.uniform(0.5, 1.5)
                pause = next_at - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                else:
                    next_at = time.monotonic()
    finally:
        Path(args.out + ".stats").write_text(json.dumps({**mgr.stats, "ops": done}))
        mgr.close()
        log.close()
    return 0


def trap(args: argparse.Namespace) -> int:
    """One operation on SQLite that stops *inside* its write transaction: once it has sent its
    ``UPDATE locations`` and is about to send ``COMMIT``, the process writes its pid to
    ``--trap`` and sleeps until it is killed, holding the write lock. The hook is sqlite3's
    statement trace callback (called as each statement starts), installed on every
    connection the backend opens: it needs nothing of the backend but the SQL it sends. The
    operation flips the desired state of one service, so it would change something if it
    committed; one that turns out a no-op (another writer got there first) is logged as such
    and followed by another."""
    import sqlite3

    from locstatus.backends.sqlite import SQLiteBackend
    from locstatus.manager import Manager
    from locstatus.models import new_op_id

    marker = Path(args.trap)
    real_connect = sqlite3.connect

    def connect(*a: Any, **kw: Any) -> sqlite3.Connection:
        db: sqlite3.Connection = real_connect(*a, **kw)
        wrote = [False]

        def trace(sql: str) -> None:
            statement = sql.strip().upper()
            if statement.startswith("BEGIN"):
                wrote[0] = False
            elif statement.startswith("UPDATE LOCATIONS"):
                wrote[0] = True
            elif statement == "COMMIT" and wrote[0]:
                marker.write_text(str(os.getpid()))
                time.sleep(3600)

        db.set_trace_callback(trace)
        return db

    sqlite3.connect = connect  # type: ignore[assignment]
    rng = random.Random(args.seed)
    log = OpLog(args.out)
    mgr = Manager(SQLiteBackend(args.url))
    hot = [x for x in args.hot.split(",") if x]
    for _ in range(100):  # until one write reaches its COMMIT (a racing writer can make a no-op)
        loc, svc = rng.choice(hot), rng.choice(SERVICES)
        paused = mgr.status(loc).services[svc].paused
        op = "resume" if paused else "pause"
        op_id = new_op_id()
        log.write(k="b", op_id=op_id, op=op, location=loc, service=svc, start=time.time(),
                  pid=os.getpid(), trap=True)
        if paused:
            rec = mgr.resume(loc, svc, actor=args.actor, op_id=op_id)
        else:
            rec = mgr.pause(loc, svc, reason="trap", actor=args.actor, op_id=op_id)
        wrote = any(st.op_id == op_id for st in rec.services.values())
        log.write(k="e", op_id=op_id, end=time.time(), outcome="crash" if wrote else "noop",
                  version=rec.version if wrote else None,
                  error="the trapped write committed: the trap did not hold" if wrote else None)
        if wrote:
            return 1
    return 1


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="random operator load (reliability suite)")
    p.add_argument("--url", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--hot", required=True, help="comma-separated hot locations")
    p.add_argument("--cold", default="", help="comma-separated cold locations")
    p.add_argument("--hot-share", type=float, default=0.7)
    p.add_argument("--all-share", type=float, default=0.1, help="share of every-service ops")
    p.add_argument("--stop", required=True, help="stop once this file exists")
    p.add_argument("--deadline", type=float, default=float("inf"), help="epoch seconds")
    p.add_argument("--short-until", type=float, default=0.0, help="epoch seconds")
    p.add_argument("--rate", type=float, default=20.0, help="operations per second")
    p.add_argument("--max-ops", type=int, default=10**9)
    p.add_argument("--actor", default="load")
    p.add_argument("--trap", default=None, help="SQLite only: stall inside one write (marker)")
    return p.parse_args(argv)


if __name__ == "__main__":
    _args = parse_args()
    sys.exit(trap(_args) if _args.trap else run(_args))


# -- the fleet (used by the tests, in the test process) ------------------------------------------

from faults import Proc  # noqa: E402  (the script above needs only locstatus)

SCRIPT = Path(__file__)


class LoadFleet:
    """N load processes on ``url``; each writes ``<dir>/ops-<n>.jsonl`` (a restarted process
    gets a new file). ``stop()`` touches the stop file and waits for every process."""

    def __init__(
        self,
        url: str,
        workdir: Path,
        hot: Sequence[str],
        cold: Sequence[str],
        *,
        processes: int,
        rate: float,
        short_until: float,
        seed: int = 0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.url = url
        self.dir = workdir
        self.hot = list(hot)
        self.cold = list(cold)
        self.rate = rate
        self.short_until = short_until
        self.stop_file = workdir / "load.stop"
        self.env = env or {}
        self._next = seed * 1000
        self.procs: list[Proc] = []
        self.outs: list[Path] = []
        self.slots: list[Proc] = []
        for _ in range(processes):
            self.slots.append(self._spawn())
        self.stopped_at: float | None = None

    def _spawn(self, url: str | None = None) -> Proc:
        n = self._next
        self._next += 1
        out = self.dir / f"ops-{n}.jsonl"
        proc = Proc.python(
            SCRIPT,
            [
                "--url", url or self.url, "--out", str(out), "--seed", str(n),
                "--hot", ",".join(self.hot), "--cold", ",".join(self.cold),
                "--stop", str(self.stop_file), "--short-until", str(self.short_until),
                "--rate", str(self.rate), "--actor", f"load-{n}",
            ],
            self.dir / f"ops-{n}.log",
            self.env,
        )
        self.procs.append(proc)
        self.outs.append(out)
        return proc

    def lines(self) -> int:
        """Operations finished so far (``e`` lines), over every file."""
        return sum(p.read_bytes().count(b'"k": "e"') for p in self.outs if p.exists())

    def kill9(self, slot: int) -> Proc:
        """``kill -9`` the process in ``slot`` (mid-operation, most likely)."""
        proc = self.slots[slot]
        proc.kill9()
        return proc

    def restart(self, slot: int, url: str | None = None) -> Proc:
        """Start a fresh process (new seed, new file) in ``slot``."""
        self.slots[slot] = self._spawn(url)
        return self.slots[slot]

    def trap(self) -> tuple[Proc, Path, Path]:
        """Start a process whose one write stalls inside its SQLite transaction (see
        :func:`trap`). Returns the process, its marker file and its operation log."""
        n = self._next
        self._next += 1
        out = self.dir / f"trap-{n}.jsonl"
        marker = self.dir / f"trap-{n}.marker"
        proc = Proc.python(
            SCRIPT,
            ["--url", self.url, "--out", str(out), "--seed", str(n), "--hot", ",".join(self.hot),
             "--stop", str(self.stop_file), "--trap", str(marker), "--actor", f"trap-{n}"],
            self.dir / f"trap-{n}.log",
            self.env,
        )
        self.procs.append(proc)
        self.outs.append(out)
        return proc, marker, out

    def stop(self, timeout: float = 120.0) -> None:
        """Ask every process to stop after its current operation and wait for it. A process
        still running after ``timeout`` seconds is killed (and the test fails on it)."""
        self.stopped_at = time.time()
        self.stop_file.touch()
        stuck = []
        deadline = time.monotonic() + timeout
        for p in self.slots:
            if p.wait(max(0.1, deadline - time.monotonic())) is None:
                stuck.append(p)
                p.kill9()
        assert not stuck, "load processes did not stop: " + "; ".join(
            p.log_tail(1500) for p in stuck
        )
        bad = [p for p in self.slots if p.popen.returncode not in (0, None)]
        assert not bad, "load process failed: " + "; ".join(p.log_tail(3000) for p in bad)

    def stats(self) -> dict[str, int]:
        """Summed manager counters (writes, conflicts, ambiguous) of the processes that
        exited normally."""
        out: dict[str, int] = {}
        for p in self.outs:
            f = Path(str(p) + ".stats")
            if f.exists():
                for k, v in json.loads(f.read_text()).items():
                    out[k] = out.get(k, 0) + int(v)
        return out
