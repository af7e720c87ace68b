"""A write whose version hint another process made stale: what it costs over one planned from a
current hint.

The manager plans a first attempt from the last record of the location it read or wrote (its
version hint, locstatus/manager/writes.py). When another writer changed the record since (the
bridge's settle between two pauses of bench/bridge.py, an operator's second client), that
attempt is refused, and the next operations on that location read first instead of being
refused again (docs/design.md §3.1); before that shape each one paid the refused write, a
read and the write. This bench times both cases side by side, interleaved in the same
process, on the same record:

- ``current``: alternating pause/resume of ``replication`` by manager A, A's hint current;
- ``stale``: the same, each call preceded (untimed) by another client's flip of ``lifecycle``
  on the same record, so A's hint is always one write behind.

No worker is registered, so each call also settles its change in a write of its own (two
writes a call, as in bench/transition.py). Per case: median and p99 latency, and (ZooKeeper)
the round trips each call waited for, counted on kazoo's request log
(tests/support/zk_round_trips.py; counted on calls of their own, untimed, the log costs time).
The extra cost of ``stale`` is its read: one round trip, where the refused write and the read
made it two.

Run: ``python bench/stale_hint.py --backend zk [--rounds 5] [--ops 100] [--json out.json]``
(``--backend sqlite|zk|mongo``, ``--url URL``; without it a temp SQLite file or a throwaway
ZooKeeper / MongoDB-wire server, as bench/transition.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from transition import p99, test_server

from locstatus import Manager, connect

LOC = "hot"
COUNTED = 10
"""Calls per case and round whose round trips are counted (ZooKeeper)."""


def flip(m: Manager, service: str, i: int) -> None:
    if i % 2 == 0:
        m.pause(LOC, service)
    else:
        m.resume(LOC, service)


def one_case(a: Manager, other: Manager, stale: bool, ops: int, start: int) -> list[float]:
    out: list[float] = []
    for i in range(start, start + ops):
        if stale:
            flip(other, "lifecycle", i)
        t0 = time.perf_counter()
        flip(a, "replication", i)
        out.append(time.perf_counter() - t0)
    return out


def trips(a: Manager, other: Manager, stale: bool, start: int) -> list[int]:
    from support.zk_round_trips import RoundTrips

    out: list[int] = []
    for i in range(start, start + COUNTED):
        if stale:
            flip(other, "lifecycle", i)
        with RoundTrips() as counter:
            flip(a, "replication", i)
        out.append(counter.round_trips)
    return out


def run(backend: str, url: str, rounds: int, ops: int) -> dict[str, Any]:
    a, other = connect(url), connect(url)
    try:
        a.sync_locations({LOC: ["replication", "lifecycle"]})
        other.status(LOC)
        one_case(a, other, True, 20, 0)  # warm both clients
        times: dict[str, list[float]] = {"current": [], "stale": []}
        counted: dict[str, list[int]] = {"current": [], "stale": []}
        n = 20  # even: every case starts from replication running
        for r in range(rounds):
            order = ("current", "stale") if r % 2 == 0 else ("stale", "current")
            for case in order:
                times[case] += one_case(a, other, case == "stale", ops, n)
                n += ops + ops % 2
                if backend == "zk":
                    counted[case] += trips(a, other, case == "stale", n)
                    n += COUNTED
        summary: dict[str, Any] = {"backend": backend, "rounds": rounds, "ops": ops}
        for case, xs in times.items():
            summary[case] = {
                "p50_ms": round(statistics.median(xs) * 1e3, 2),
                "p99_ms": round(p99(xs) * 1e3, 2),
            }
            if counted[case]:
                summary[case]["round_trips_median"] = statistics.median(counted[case])
                summary[case]["round_trips"] = sorted(set(counted[case]))
        summary["p50_ratio"] = round(summary["stale"]["p50_ms"] / summary["current"]["p50_ms"], 2)
        summary["stats"] = dict(a.stats)
        return summary
    finally:
        a.close()
        other.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="zk", choices=["sqlite", "zk", "mongo"])
    ap.add_argument("--url", help="backend URL (default: a temp SQLite file / test server)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ops", type=int, default=100)
    ap.add_argument("--json", help="write the summary here")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp, test_server(args.backend, args.url, tmp) as url:
        summary = run(args.backend, url, args.rounds, args.ops)
    print(json.dumps(summary, indent=2))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
