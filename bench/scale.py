"""Scale: N locations x 3 services (default 100 000) on SQLite: ``statuses()`` and agent start-up
against a bare read of the same rows.

The store is built once with bench/check.py's builder (``SQLiteBackend.create`` in a loop, 1% of
the locations paused once more through the manager, 4 workers with acknowledgements; the build
time is printed and reported apart) into its own file in the system temp directory, reused by the
next run when it holds the asked-for number of locations. It is a separate file from
bench/check.py's, because the agent measured here registers and acknowledges in it.

Each round (interleaved, same process, same file, warm page cache) times:

- ``bare``: ``SELECT location, version, data FROM locations`` with ``sqlite3`` + ``json.loads`` of
  every payload (the least any reader must do to see every record);
- ``statuses``: :meth:`Manager.statuses` (read, validate into models, drop tombstones);
- ``agent``: ``Agent.start(wait=False)`` of an agent applying all 3 services with no-op handlers,
  then ``stop()``. ``start`` registers the worker, subscribes, and reads every record into the
  agent's local copy (``_resync``) *before* it returns: the time to the full snapshot applied.
  ``wait=True`` would also wait for every handler of the first pass to run and be acknowledged
  (one write each, 3 N writes), which is a measure of the backend's write rate, not of start-up;
  ``--first-pass`` times that too, at the size given.

Memory (separate, untimed passes, tracemalloc): what stays allocated after ``start(wait=False)``
returned (the local copy of the records plus the first pass's work queue: everything the agent
keeps), divided by N x 3 location-services (target <= 2 KiB); next to it, a bare local copy:
``{location: json.loads(data)}``. The RSS growth of the process over the same call is printed too.

Run: ``python bench/scale.py [--locations 100000] [--rounds 5] [--db PATH] [--first-pass]
[--json out.json]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import sqlite3
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from check import SERVICES, build, count

from locstatus import Client
from locstatus.backends.sqlite import SQLiteBackend


def bare_read(path: Path) -> Callable[[], dict[str, Any]]:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")

    def run() -> dict[str, Any]:
        return {
            loc: (version, json.loads(data))
            for loc, version, data in db.execute("SELECT location, version, data FROM locations")
        }

    return run


def timed(fn: Callable[[], Any]) -> float:
    gc.collect()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4  # resident pages of 4 KiB


def retained(fn: Callable[[], Any]) -> tuple[float, Any]:
    """Bytes still allocated after ``fn`` returned (its result kept alive), tracemalloc."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        out = fn()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - base, out
    finally:
        tracemalloc.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--locations", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--db", type=Path, default=None)
    p.add_argument("--first-pass", action="store_true",
                   help="also time start(wait=True): every first-pass handler run and acked")
    p.add_argument("--json", help="write the summary here")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    n = args.locations
    path = args.db or Path(tempfile.gettempdir()) / f"locstatus-bench-scale-{n}.db"
    build_s: float | None = None
    if count(path) != n:
        t0 = time.perf_counter()
        build(path, n, 0.01)
        build_s = time.perf_counter() - t0
    else:
        print(f"reusing {path} ({n} locations)")

    mgr = Client(SQLiteBackend(f"sqlite:///{path}"))
    bare = bare_read(path)
    assert len(bare()) == n
    assert len(mgr.statuses()) == n

    def agent_start() -> Any:
        agent = mgr.agent("bench-scale", services=SERVICES, lease_seconds=60)
        agent.start(wait=False)
        return agent

    def agent_cycle() -> None:
        agent = agent_start()
        agent.stop()

    agent_cycle()  # warm-up
    rows: list[tuple[float, float, float]] = []
    for r in range(args.rounds):
        b = timed(bare)
        s = timed(mgr.statuses)
        t0 = time.perf_counter()
        agent = agent_start()
        a = time.perf_counter() - t0
        seen = agent.metrics()["locations"]
        agent.stop()
        del agent  # a stopped agent's local copy must not stay alive into the next round
        assert seen == n, seen
        rows.append((b, s, a))
        print(f"round {r + 1}: bare {b:6.2f}s  statuses {s:6.2f}s ({s / b:4.2f}x)  "
              f"agent start {a:6.2f}s ({a / b:4.2f}x)", flush=True)

    med = {k: statistics.median(x[i] for x in rows) for i, k in enumerate(("bare", "st", "ag"))}
    st_ratio = statistics.median(s / b for b, s, _ in rows)
    ag_ratio = statistics.median(a / b for b, _, a in rows)

    bare_bytes, keep = retained(bare)
    del keep
    rss0 = rss_kib()
    agent_bytes, agent = retained(agent_start)
    rss1 = rss_kib()
    agent.stop()
    del agent
    per_ls = agent_bytes / (n * len(SERVICES))
    per_ls_bare = bare_bytes / (n * len(SERVICES))

    first_pass_s: float | None = None
    if args.first_pass:
        t0 = time.perf_counter()
        agent = mgr.agent("bench-scale", services=SERVICES, lease_seconds=60)
        agent.start(wait=True)
        first_pass_s = time.perf_counter() - t0
        agent.stop()
    mgr.close()

    print(f"\n{n} locations x {len(SERVICES)} services, {args.rounds} interleaved rounds, medians:")
    if build_s is not None:
        print(f"  build (bench/check.py builder): {build_s:.1f}s")
    print(f"  bare read        {med['bare']:6.2f}s")
    print(f"  mgr.statuses()   {med['st']:6.2f}s   ratio {st_ratio:.2f}x (target <= 2x)")
    print(f"  agent start-up   {med['ag']:6.2f}s   ratio {ag_ratio:.2f}x "
          "(start(wait=False): register, subscribe, full snapshot into the local copy)")
    print(f"  agent memory     {per_ls:6.0f} B per location-service retained (tracemalloc; "
          f"target <= 2048), bare dict copy {per_ls_bare:.0f} B; RSS growth "
          f"{(rss1 - rss0) * 1024 / (n * len(SERVICES)):.0f} B per location-service")
    if first_pass_s is not None:
        print(f"  agent start(wait=True), first pass of {n * len(SERVICES)} handlers acked: "
              f"{first_pass_s:.1f}s")
    summary = {
        "locations": n,
        "services": len(SERVICES),
        "rounds": args.rounds,
        "build_s": build_s,
        "bare_read_s": med["bare"],
        "statuses_s": med["st"],
        "statuses_ratio": st_ratio,
        "agent_start_s": med["ag"],
        "agent_start_ratio": ag_ratio,
        "agent_bytes_per_location_service": per_ls,
        "bare_bytes_per_location_service": per_ls_bare,
        "agent_rss_growth_bytes_per_location_service": (rss1 - rss0) * 1024
        / (n * len(SERVICES)),
        "agent_first_pass_s": first_pass_s,
        "rounds_detail": [{"bare": b, "statuses": s, "agent": a} for b, s, a in rows],
    }
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
