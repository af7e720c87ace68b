"""Transition cost: a locstatus pause/resume vs the raw compare-and-set it performs.

For each round (interleaved, same process, same store and durability settings) it times N
alternating pause/resume calls through the manager, and N raw operations doing the same I/O
with the backend's client alone (read the record, versioned write of the new payload plus one
history row), then prints per-round rates, the median ratio (target: SQLite >= 0.5x,
ZooKeeper and MongoDB >= 0.8x), median/p99 latency, and where locstatus spends its time
(cProfile of one extra locstatus round, top functions by own time).

A manager that wrote the record last plans its next write from that record (its *version
hint*, see locstatus/manager/writes.py) and skips the read; the raw side reads every time. So each
round also times the same calls with the hint dropped before each one ("reading every time":
a manager that has not seen the record), and both ratios are printed.

No worker is registered by default, so no live worker applies the service and each call also
settles its change, in a write of its own right after it (model/README.md, finding 1): two
writes to the raw side's one. ``--watched`` registers a live worker that applies it (the usual
case): each call is then its one write plus the read of the live workers.

Run: ``python bench/transition.py --backend sqlite [--rounds 7] [--ops 300] [--watched]``. ZooKeeper and
MongoDB baselines register themselves in ``RAW`` (see bench/raw_zk.py and bench/raw_mongo.py).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import pstats
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.modules.setdefault("transition", sys.modules[__name__])  # raw_* register into this RAW

from locstatus import connect  # noqa: E402
from locstatus.backends import codec  # noqa: E402
from locstatus.models import (  # noqa: E402
    HistoryEntry,
    LocationStatus,
    State,
    WorkerInfo,
    new_op_id,
    utcnow,
)

RawOp = Callable[[int], None]
RAW: dict[str, Callable[[str, str], tuple[RawOp, Callable[[], None]]]] = {}
"""backend name -> factory(url, location) -> (one raw transition, close)."""


def raw_payloads(location: str) -> tuple[list[str], list[str]]:
    """The two record payloads and history payloads a pause/resume pair writes."""
    from locstatus.models import ServiceStatus
    from locstatus.names import DEFAULT_SERVICES

    now = utcnow()
    recs, hists = [], []
    for i, st in enumerate((State.PAUSED, State.RUNNING)):
        rec = LocationStatus(
            location=location,
            services={  # the same three-service record locstatus writes
                **{s: ServiceStatus(updated_at=now) for s in DEFAULT_SERVICES},
                "replication": ServiceStatus(state=st, generation=i + 1, updated_at=now),
            },
        )
        entry = HistoryEntry(
            op_id=new_op_id(), at=now, location=location, service="replication", event="pause",
        )
        recs.append(codec.encode_record(rec))
        hists.append(codec.encode_history([entry, entry]))
    return recs, hists


def raw_sqlite(url: str, location: str) -> tuple[RawOp, Callable[[], None]]:
    from locstatus.backends.sqlite import parse_sqlite_url

    path, params = parse_sqlite_url(url)
    db = sqlite3.connect(path, isolation_level=None, timeout=30)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={params.get('synchronous', 'full').upper()}")
    recs, hists = raw_payloads(location)

    def op(i: int) -> None:
        db.execute("BEGIN IMMEDIATE")
        version, data = db.execute(
            "SELECT version, data FROM locations WHERE location = ?", (location,)
        ).fetchone()
        json.loads(data)
        cur = db.execute(
            "UPDATE locations SET version = ?, data = ? WHERE location = ? AND version = ?",
            (version + 1, recs[i % 2], location, version),
        )
        assert cur.rowcount == 1
        db.execute(
            "INSERT INTO history (location, version, data) VALUES (?, ?, ?)",
            (location, version + 1, hists[i % 2]),
        )
        db.execute("COMMIT")

    return op, db.close


RAW["sqlite"] = raw_sqlite


def timed(fn: Callable[[int], Any], n: int) -> list[float]:
    lat = []
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        lat.append(time.perf_counter() - t)
    return lat


def p99(xs: list[float]) -> float:
    return sorted(xs)[max(0, int(len(xs) * 0.99) - 1)]


def run(backend: str, url: str, rounds: int, ops: int, watched: bool = False) -> dict[str, Any]:
    mgr = connect(url)
    mgr.sync_locations(["bench-ls", "bench-raw"])
    raw_op, raw_close = RAW[backend](url, "bench-raw")
    worker = None
    if watched:
        # A live worker applies the service (it never acknowledges): each call is its one
        # write, then the read of the workers; pause/resume alternate pausing and resuming.
        worker = connect(url)
        worker.backend.put_worker(WorkerInfo(
            worker_id="bench-worker", services=("replication",),
            lease_expires_at=None if worker.backend.session_leases else utcnow() + timedelta(days=1),
        ))

    def ls_op(i: int) -> None:
        if i % 2 == 0:
            mgr.pause("bench-ls", "replication")
        else:
            mgr.resume("bench-ls", "replication")

    def ls_cold_op(i: int) -> None:
        # The same operation from a manager that has not seen the record (a fresh process,
        # or one whose version hint went stale): read + compare-and-set, like the raw side.
        mgr._core.writer.hints.drop("bench-ls")
        ls_op(i)

    timed(ls_op, 20), timed(raw_op, 20)  # warm up
    results = []
    lats: dict[str, list[float]] = {"raw": [], "ls": [], "cold": []}
    for r in range(rounds):
        trio = [("raw", raw_op), ("ls", ls_op), ("cold", ls_cold_op)]
        if r % 2:
            trio.reverse()
        rates = {}
        for name, fn in trio:
            lat = timed(fn, ops)
            lats[name].extend(lat)
            rates[name] = ops / sum(lat)
        results.append({"round": r, **rates, "ratio": rates["ls"] / rates["raw"],
                        "ratio_cold": rates["cold"] / rates["raw"]})
        print(
            f"round {r}: raw {rates['raw']:8.0f} op/s  locstatus {rates['ls']:8.0f} op/s  "
            f"ratio {rates['ls'] / rates['raw']:.2f}  (reading every time: "
            f"{rates['cold']:8.0f} op/s, ratio {rates['cold'] / rates['raw']:.2f})",
            flush=True,
        )
    raw_lat, ls_lat, cold_lat = lats["raw"], lats["ls"], lats["cold"]
    prof = cProfile.Profile()
    prof.enable()
    timed(ls_op, ops)
    prof.disable()
    out = StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
    raw_close()
    mgr.close()
    if worker is not None:
        worker.close()
    summary = {
        "backend": backend,
        "watched": watched,
        "rounds": rounds,
        "ops_per_round": ops,
        "median_ratio": statistics.median(r["ratio"] for r in results),
        "median_raw_ops_s": statistics.median(r["raw"] for r in results),
        "median_ls_ops_s": statistics.median(r["ls"] for r in results),
        "median_ratio_reading_every_time": statistics.median(r["ratio_cold"] for r in results),
        "median_ls_reading_every_time_ops_s": statistics.median(r["cold"] for r in results),
        "raw_latency_ms": {"p50": statistics.median(raw_lat) * 1e3, "p99": p99(raw_lat) * 1e3},
        "ls_latency_ms": {"p50": statistics.median(ls_lat) * 1e3, "p99": p99(ls_lat) * 1e3},
        "ls_reading_every_time_latency_ms": {
            "p50": statistics.median(cold_lat) * 1e3, "p99": p99(cold_lat) * 1e3},
        "rounds_detail": results,
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "rounds_detail"}, indent=2))
    print("where locstatus spends its time (own time, one extra round):")
    print("\n".join(out.getvalue().splitlines()[:30]))
    return summary


@contextlib.contextmanager
def test_server(backend: str, url: str | None, tmp: str) -> Iterator[str]:
    """``url`` if given; else a fresh store: a SQLite file, or a local ZooKeeper / MongoDB-wire
    server started from tests/support/servers.py (stopped by PID on exit)."""
    if url is not None:
        yield url
        return
    if backend == "sqlite":
        yield f"sqlite:///{tmp}/bench.db"
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from support import servers

    if backend == "zk":
        zk = servers.start_zookeeper(tmp)
        try:
            yield f"zk://{zk.hosts}/bench"
        finally:
            zk.close()
    else:
        mongo = servers.start_mongo(tmp)
        sep = "&" if "?" in mongo.uri else "?"
        try:
            yield f"{mongo.uri}{sep}database=bench&collection=locations"
        finally:
            mongo.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="sqlite", choices=["sqlite", "zk", "mongo"])
    ap.add_argument("--url", help="backend URL (default: a temp SQLite file / test server)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--ops", type=int, default=300)
    ap.add_argument("--json", help="write the summary here")
    ap.add_argument("--watched", action="store_true",
                    help="a live worker applies the service: no call settles (the usual case); "
                         "default: none does, so each call also settles its change")
    args = ap.parse_args(argv)
    if args.backend != "sqlite":
        import importlib

        importlib.import_module(f"raw_{args.backend}")  # registers RAW[...]
    with tempfile.TemporaryDirectory() as tmp, test_server(args.backend, args.url, tmp) as url:
        summary = run(args.backend, url, args.rounds, args.ops, args.watched)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
