"""Contention: 1, 2, 4, 8 OS processes writing one hot location, and spread over 100 cold ones.

What it measures, per (processes, mode) cell, medians over interleaved rounds:

- aggregate throughput: operations of all processes / (last finish - common start), op/s;
- retries per operation: compare-and-set conflicts (plus ambiguous commits) per operation, from
  each process's :attr:`Manager.stats`;
- worst wait: the longest single operation (its retries and backoff included), ms; also p99;
- starvation: every process must complete its quota; an operation that exhausted the retry
  budget (:class:`ConflictError`) is counted and reported ("over budget"), never hidden.

Every operation is a real write through the manager's read-plan-compare-and-set loop: the
``replication`` service of the location is paused once, then each operation schedules its resume
at a time no other operation uses (``mgr.resume(loc, "replication", at=...)``), so no operation
can collapse into a no-op because another process already did the same thing. (Alternating
pause/resume would turn most contended calls into cheap read-only no-ops and flatter the rate.)

Processes are started once with ``multiprocessing`` "spawn" and reused for every round; a round
starts at a common ``time.monotonic()`` instant (system-wide on Linux) handed to each process,
so spawn and import costs are not measured. Headline ratio: 8-process aggregate rate on the hot
location / 1-process rate (target >= 0.5x), median of per-round ratios.

Run: ``python bench/contention.py [--backend sqlite|zk|mongo] [--url URL] [--rounds 5]
[--ops 100] [--procs 1,2,4,8] [--json out.json]``. Without ``--url`` a temp SQLite file (or a
throwaway ZooKeeper / MongoDB-wire server, as bench/transition.py does) is used.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

HOT = "hot-000"
COLD = [f"cold-{i:03d}" for i in range(100)]
SVC = "replication"
CTX = mp.get_context("spawn")
BASE_AT = datetime(2100, 1, 1, tzinfo=UTC)


def worker(url: str, index: int, commands: Any, results: Any) -> None:
    """One process: run the rounds it is sent until it receives ``None``."""
    from locstatus import connect
    from locstatus.errors import ConflictError

    mgr = connect(url)
    mgr.status(HOT)  # open the connection, warm imports and validators
    serial = 0
    while True:
        cmd = commands.get()
        if cmd is None:
            break
        mode, procs, quota, start = cmd
        before = dict(mgr.stats)
        lat: list[float] = []
        over_budget = 0
        while time.monotonic() < start:
            time.sleep(min(0.005, max(0.0, start - time.monotonic())))
        t_begin = time.monotonic()
        for i in range(quota):
            loc = HOT if mode == "hot" else COLD[(i * procs + index) % len(COLD)]
            serial += 1
            # A resume time no other operation uses: every call is a real write.
            at = BASE_AT + timedelta(seconds=index, microseconds=serial)
            t = time.perf_counter()
            try:
                mgr.resume(loc, SVC, at=at, actor=f"bench-{index}")
            except ConflictError:
                over_budget += 1
            lat.append(time.perf_counter() - t)
        t_end = time.monotonic()
        delta = {k: mgr.stats[k] - before[k] for k in before}
        results.put((index, t_begin, t_end, quota, over_budget, delta, lat))
    mgr.close()


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * len(s)) - 1))]


def one_round(
    commands: list[Any], results: Any, mode: str, procs: int, quota: int
) -> dict[str, Any]:
    start = time.monotonic() + 0.3
    for q in commands[:procs]:
        q.put((mode, procs, quota, start))
    rows = [results.get(timeout=600) for _ in range(procs)]
    begin = min(r[1] for r in rows)
    end = max(r[2] for r in rows)
    ops = sum(r[3] for r in rows)
    lat = [x for r in rows for x in r[6]]
    conflicts = sum(r[5]["conflicts"] + r[5]["ambiguous"] for r in rows)
    writes = sum(r[5]["writes"] for r in rows)
    return {
        "rate": ops / (end - begin),
        "retries_per_op": conflicts / ops,
        "writes": writes,
        "ops": ops,
        "worst_ms": max(lat) * 1e3,
        "p99_ms": pct(lat, 0.99) * 1e3,
        "p50_ms": statistics.median(lat) * 1e3,
        "over_budget": sum(r[4] for r in rows),
        "completed_quota": all(len(r[6]) == quota for r in rows) and len(rows) == procs,
        "per_process_s": sorted(r[2] - r[1] for r in rows),
    }


def run(url: str, rounds: int, quota: int, procs_list: list[int]) -> dict[str, Any]:
    from locstatus import connect

    mgr = connect(url)
    mgr.sync_locations({loc: [SVC] for loc in [HOT, *COLD]})
    for loc in [HOT, *COLD]:
        mgr.pause(loc, SVC, actor="bench")
    mgr.close()
    nmax = max(procs_list)
    commands = [CTX.Queue() for _ in range(nmax)]
    results = CTX.Queue()
    workers = [
        CTX.Process(target=worker, args=(url, i, commands[i], results), daemon=True)
        for i in range(nmax)
    ]
    for w in workers:
        w.start()
    cells = [(mode, p) for mode in ("hot", "cold") for p in procs_list]
    detail: dict[str, list[dict[str, Any]]] = {f"{m}-{p}": [] for m, p in cells}
    try:
        for m, p in cells:  # warm-up round of every cell, not recorded
            one_round(commands, results, m, p, max(5, quota // 10))
        for r in range(rounds):
            for m, p in cells if r % 2 == 0 else list(reversed(cells)):
                row = one_round(commands, results, m, p, quota)
                detail[f"{m}-{p}"].append(row)
            print(
                f"round {r + 1}: "
                + "  ".join(f"{k} {v[-1]['rate']:6.0f}/s" for k, v in detail.items()),
                flush=True,
            )
    finally:
        for q in commands:
            q.put(None)
        for w in workers:
            w.join(30)
            if w.is_alive():
                w.terminate()

    cells_out: dict[str, dict[str, Any]] = {}
    for key, rows in detail.items():
        cells_out[key] = {
            "rate_ops_s": statistics.median(x["rate"] for x in rows),
            "retries_per_op": statistics.median(x["retries_per_op"] for x in rows),
            "worst_wait_ms": max(x["worst_ms"] for x in rows),
            "p99_ms": statistics.median(x["p99_ms"] for x in rows),
            "p50_ms": statistics.median(x["p50_ms"] for x in rows),
            "over_budget": sum(x["over_budget"] for x in rows),
            "all_completed_quota": all(x["completed_quota"] for x in rows),
        }
    nmin = min(procs_list)
    hot_ratio = statistics.median(
        a["rate"] / b["rate"]
        for a, b in zip(detail[f"hot-{nmax}"], detail[f"hot-{nmin}"], strict=True)
    )
    cold_ratio = statistics.median(
        a["rate"] / b["rate"]
        for a, b in zip(detail[f"cold-{nmax}"], detail[f"cold-{nmin}"], strict=True)
    )
    print(f"\n{'cell':10}{'op/s':>9}{'retries/op':>12}{'p50 ms':>9}{'p99 ms':>9}"
          f"{'worst ms':>10}{'over budget':>13}{'quota done':>12}")
    for key, c in cells_out.items():
        print(f"{key:10}{c['rate_ops_s']:9.0f}{c['retries_per_op']:12.2f}{c['p50_ms']:9.1f}"
              f"{c['p99_ms']:9.1f}{c['worst_wait_ms']:10.1f}{c['over_budget']:13d}"
              f"{'yes' if c['all_completed_quota'] else 'NO':>12}")
    print(f"hot {nmax}-process / {nmin}-process rate: {hot_ratio:.2f}x (target >= 0.5x)")
    print(f"cold {nmax}-process / {nmin}-process rate: {cold_ratio:.2f}x")
    return {
        "rounds": rounds,
        "ops_per_process": quota,
        "procs": procs_list,
        "cells": cells_out,
        "hot_ratio": hot_ratio,
        "cold_ratio": cold_ratio,
        "over_budget": sum(c["over_budget"] for c in cells_out.values()),
        "all_completed_quota": all(c["all_completed_quota"] for c in cells_out.values()),
        "rounds_detail": detail,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="sqlite", choices=["sqlite", "zk", "mongo"])
    ap.add_argument("--url", help="backend URL (default: a temp SQLite file / test server)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ops", type=int, default=100, help="operations per process per round")
    ap.add_argument("--procs", default="1,2,4,8")
    ap.add_argument("--json", help="write the summary here")
    args = ap.parse_args()
    from transition import test_server  # the same throwaway servers as bench/transition.py

    procs_list = sorted({int(x) for x in args.procs.split(",")})
    with tempfile.TemporaryDirectory() as tmp, test_server(args.backend, args.url, tmp) as url:
        summary = {"backend": args.backend, **run(url, args.rounds, args.ops, procs_list)}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
