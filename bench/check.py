"""Consistency-check cost: ``run_check`` over N locations x 3 services vs a bare read of the same
records with the backend's own client.

The store is one SQLite file per size and ``--changed`` fraction (reused between runs when it
already holds the asked-for number of locations). Records are created through
``SQLiteBackend.create`` in a loop (one transaction each; the creation time is printed), then
``--changed`` of them get more writes through the manager (a pause of one service, and for half
of those a resume scheduled 30 days ahead), so that their services' newest history entries are
in different writes, as in a fleet where operators act on single services; and a few workers
register with live leases and acknowledgements. ``--changed 0.5`` shows the cost of such a
fleet.

Each round (interleaved, same process, same file, warm page cache) times:

- ``bare``: ``SELECT location, version, data FROM locations`` with ``sqlite3`` + ``json.loads`` of
  every payload: the least any check must do to look at every record;
- ``bare+history``: the same read joined with each location's newest history row (one index
  seek per location) + ``json.loads`` of both: the data the check reads (it also reads up to
  three older rows of a record changed since its creation, when its services need them), with
  nothing validated or compared;
- ``validated``: the same rows as ``bare+history``, each record and history write validated into
  the pydantic models and nothing else: the least a check that validates what it compares can
  do (no glue, no comparison);
- ``scan``: :meth:`Manager.scan` alone (the validated read through the backend interface), to
  show how much of the check is spent validating records into models;
- ``check``: :func:`locstatus.check.run_check` (streamed scan of records with their newest history
  writes, per-record history comparison, workers, acknowledgements; report only).

It prints per-round times, the median ratios check/bare+history (like for like: the target,
within 2x), check/bare (records only: issue 7's first target, which the validated read alone
already exceeds; see docs/check.md), check/validated and validated/bare, the
peak traced memory (tracemalloc, in separate untimed passes) of each, the process's max RSS, and
with ``--profile`` where the check spends its time (cProfile, top functions by own time).

Run: ``python bench/check.py [--locations 100000] [--rounds 5] [--changed 0.01] [--db PATH]
[--profile]``. The default store lives in the system temp directory and is kept for the next run.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import pstats
import resource
import sqlite3
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from locstatus import Manager
from locstatus.backends.sqlite import SQLiteBackend
from locstatus.check import run_check
from locstatus.models import (
    HistoryEntry,
    LocationStatus,
    ServiceStatus,
    WorkerInfo,
    new_op_id,
    utcnow,
)

SERVICES = ("ingestion", "lifecycle", "replication")


def build(path: Path, n: int, changed: float) -> None:
    """Create ``n`` locations (3 services each) in a fresh file at ``path``."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    url = f"sqlite:///{path}?synchronous=normal"  # building only; rounds use the default
    backend = SQLiteBackend(url)
    t0 = time.perf_counter()
    for i in range(n):
        loc = f"loc-{i:06d}"
        now = utcnow()
        op = new_op_id()
        rec = LocationStatus(
            location=loc,
            services={s: ServiceStatus(op_id=op, updated_at=now, actor="bench") for s in SERVICES},
        )
        backend.create(rec, [HistoryEntry(op_id=op, at=now, location=loc, service="*",
                                          event="create", actor="bench")])
    created = time.perf_counter() - t0
    mgr = Manager(backend)
    t0 = time.perf_counter()
    step = max(1, round(1 / changed)) if changed > 0 else 0
    touched = 0
    if step:
        for i in range(0, n, step):
            mgr.pause(f"loc-{i:06d}", "replication", reason="bench")
            if i % (step * 2) == 0:
                mgr.resume(f"loc-{i:06d}", "replication", at=timedelta(days=30))
            touched += 1
    for w in range(4):  # live workers that acknowledged everything they apply
        wid = f"worker-{w}"
        backend.put_worker(WorkerInfo(worker_id=wid, services=("lifecycle",),
                                      lease_expires_at=utcnow() + timedelta(days=365)))
        for i in range(0, min(n, 2000)):
            backend.ack(wid, f"loc-{i:06d}", "lifecycle", 0)
    backend.close()
    print(f"built {n} locations x {len(SERVICES)} services in {created:.1f}s "
          f"({n / created:.0f} creates/s via SQLiteBackend.create), "
          f"{touched} paused through the manager in {time.perf_counter() - t0:.1f}s")


def count(path: Path) -> int:
    if not path.exists():
        return -1
    with sqlite3.connect(path) as db:
        try:
            return int(db.execute("SELECT COUNT(*) FROM locations").fetchone()[0])
        except sqlite3.Error:
            return -1


def _open(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    return db


def bare_read(path: Path) -> Callable[[], int]:
    db = _open(path)

    def run() -> int:
        n = 0
        for _loc, _version, data in db.execute("SELECT location, version, data FROM locations"):
            json.loads(data)
            n += 1
        return n

    return run


WITH_NEWEST_HISTORY = (
    "SELECT l.location, l.version, l.data, (SELECT h.data FROM history h "
    "WHERE h.location = l.location ORDER BY h.version DESC LIMIT 1) "
    "FROM locations l ORDER BY l.location"
)
"""Every record with its newest history row: what the baselines below read."""


def bare_read_with_history(path: Path) -> Callable[[], int]:
    db = _open(path)

    def run() -> int:
        n = 0
        for _loc, _version, data, newest in db.execute(WITH_NEWEST_HISTORY):
            json.loads(data)
            json.loads(newest)
            n += 1
        return n

    return run


def validated_read(path: Path) -> Callable[[], int]:
    """The same rows as :func:`bare_read_with_history`, each record and history write validated
    into the pydantic models (one ``validate_json`` call each, straight to pydantic-core) and
    nothing else: the least a check that validates what it compares can do."""
    db = _open(path)
    record = LocationStatus.__pydantic_validator__.validate_json
    history = TypeAdapter(list[HistoryEntry]).validator.validate_json

    def run() -> int:
        n = 0
        for loc, version, data, newest in db.execute(WITH_NEWEST_HISTORY):
            record(f'{{"location":"{loc}","version":{version},{data[1:]}')
            history(newest)
            n += 1
        return n

    return run


def timed(fn: Callable[[], Any]) -> float:
    gc.collect()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def peak(fn: Callable[[], Any]) -> float:
    """Peak traced memory of one call, MiB."""
    gc.collect()
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--locations", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--changed", type=float, default=0.01,
                   help="fraction of locations with a second write (default 0.01)")
    p.add_argument("--db", type=Path, default=None)
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    path = args.db or Path(tempfile.gettempdir()) / (
        f"locstatus-bench-check-{args.locations}"
        + ("" if args.changed == 0.01 else f"-changed{args.changed:g}")
        + ".db"
    )
    if count(path) != args.locations:
        build(path, args.locations, args.changed)
    else:
        print(f"reusing {path} ({args.locations} locations)")

    url = f"sqlite:///{path}"
    mgr = Manager(SQLiteBackend(url))
    bare = bare_read(path)
    bare_h = bare_read_with_history(path)
    floor = validated_read(path)
    assert bare() == args.locations == bare_h() == floor()

    def check() -> None:
        report = run_check(mgr)
        assert report.scanned.records == args.locations, report.scanned
        assert report.findings == [], [f.id for f in report.findings[:5]]

    rows: list[tuple[float, float, float, float, float]] = []
    check()  # warm-up: page cache, imports, pydantic validators
    for r in range(args.rounds):
        b = timed(bare)
        bh = timed(bare_h)
        f = timed(floor)
        s = timed(mgr.scan)
        c = timed(check)
        rows.append((b, bh, f, s, c))
        print(f"round {r + 1}: bare {b:6.2f}s  bare+history {bh:6.2f}s  validated {f:6.2f}s  "
              f"scan {s:6.2f}s  check {c:6.2f}s  check/bare {c / b:5.2f}x  "
              f"check/bare+history {c / bh:5.2f}x")

    def med(i: int) -> float:
        return statistics.median(row[i] for row in rows)

    def ratio_of(i: int, j: int) -> float:
        return statistics.median(row[i] / row[j] for row in rows)

    ratio, ratio_h, ratio_f = ratio_of(4, 0), ratio_of(4, 1), ratio_of(4, 2)
    floor_ratio, scan_ratio = ratio_of(2, 0), ratio_of(3, 0)
    mem_bare, mem_scan, mem_check = peak(bare), peak(mgr.scan), peak(check)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    n = args.locations
    print()
    print(f"{n} locations x {len(SERVICES)} services, {args.rounds} interleaved rounds, medians:")
    print(f"  bare read   {med(0):6.2f}s  {med(0) / n * 1e6:6.1f} us/record  "
          f"peak {mem_bare:7.1f} MiB")
    print(f"  bare+hist   {med(1):6.2f}s  {med(1) / n * 1e6:6.1f} us/record")
    print(f"  validated   {med(2):6.2f}s  {med(2) / n * 1e6:6.1f} us/record  "
          f"({floor_ratio:.2f}x bare)")
    print(f"  mgr.scan()  {med(3):6.2f}s  {med(3) / n * 1e6:6.1f} us/record  "
          f"peak {mem_scan:7.1f} MiB  ({scan_ratio:.2f}x bare)")
    print(f"  run_check   {med(4):6.2f}s  {med(4) / n * 1e6:6.1f} us/record  "
          f"peak {mem_check:7.1f} MiB")
    print(f"  ratio check/bare (median of rounds): {ratio:.2f}x  (records only; the validated "
          f"read alone is {floor_ratio:.2f}x)")
    print(f"  ratio check/bare+history (same data read, median of rounds): {ratio_h:.2f}x  "
          f"(target <= 2x: {'met' if ratio_h <= 2 else 'NOT met'})")
    print(f"  ratio check/validated (median of rounds): {ratio_f:.2f}x")
    print(f"  ratio validated/bare (median of rounds): {floor_ratio:.2f}x")
    print(f"  max RSS of this process: {rss:.0f} MiB")
    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(check)
        out = StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(15)
        print(out.getvalue())
    mgr.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
