"""Propagation latency: a pause call until every one of 16 worker processes has applied it.

Two fleets of 16 OS processes run side by side on the same store for the whole run:

- **locstatus**: 16 :class:`~locstatus.agent.Agent` processes with an ``on_pause`` and an
  ``on_resume`` handler. A round is ``mgr.pause(...)`` (or ``resume``, alternating) and ends
  when all 16 handlers have run for the new generation. Measured: call -> last handler done,
  and call -> ``wait=`` returned (every ack in, state settled, as the operator sees it); to
  show where the time goes, also call -> the pause's own write committed, and commit -> last
  handler done; plus the CPU each worker process spends per round, and for the 5 slowest
  ``wait=`` rounds when the settle was written.
- **raw**: the same notification done by hand, "publish and hope" with nothing acknowledged:
  for SQLite, 16 processes that poll one row at the backend's own hint interval
  (``poll_interval``, 50 ms by default) and run their handler when its value changes, and a
  publisher that updates that row (same file, WAL, ``synchronous=FULL``). This is the floor
  of any poll-based propagation on that store.

Rounds alternate between the fleets (raw, locstatus, locstatus, raw, ...), so both see the same
machine load. Handler end times are ``time.monotonic()`` taken inside the worker processes
(system-wide on Linux), so queue transport adds nothing. Output: p50/p99 of each, the p99 ratio
(target: locstatus p99 <= 2x raw p99) and a JSON summary.

Run: ``python bench/propagation.py [--backend sqlite] [--rounds 200] [--workers 16]
[--poll 0.05] [--json out.json]``. Run it several times and take the median of the ratios; the
2-core CI machines are shared, so single runs wander.

ZooKeeper: ``--backend zk [--url zk://host:port/chroot]`` (without ``--url`` a throwaway
ZooKeeper from ``tests/support/servers.py`` is started); the raw baseline there is one kazoo ``set``
observed by 16 ``DataWatch`` watchers, one session each. ``--poll`` only concerns SQLite.
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing as mp
import queue
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path
from typing import Any

LOC = "bench-loc"
SVC = "replication"
Report = tuple[str, int, int, float]
"""(fleet, worker index, generation, monotonic time the handler finished)."""

CTX = mp.get_context("spawn")


# -- the locstatus fleet ---------------------------------------------------------------------


def agent_worker(url: str, index: int, lease: float, out: Any, stop: MpEvent) -> None:
    """One worker process: an agent whose handlers report (generation, end time)."""
    from locstatus import connect

    mgr = connect(url)
    agent = mgr.agent(f"bench-{index:02d}", services=[SVC], lease_seconds=lease)

    def report(location: str) -> None:
        applying = agent.applying
        assert applying is not None and applying.status is not None
        out.put(("agent", index, applying.status.generation, time.monotonic()))

    agent.on_pause(SVC)(report)
    agent.on_resume(SVC)(report)
    with agent:
        out.put(("agent-ready", index, -1, time.process_time()))
        stop.wait()
    out.put(("agent-cpu", index, -1, time.process_time()))
    mgr.close()


# -- raw baselines ---------------------------------------------------------------------------


def sqlite_raw_worker(path: str, index: int, poll: float, out: Any, stop: MpEvent) -> None:
    """One raw poller: read the row every ``poll`` seconds, "handle" a changed value."""
    db = sqlite3.connect(path, isolation_level=None, timeout=30)
    db.execute("PRAGMA journal_mode=WAL").fetchall()
    last = db.execute("SELECT gen FROM bench_raw WHERE id = 1").fetchone()[0]
    out.put(("raw-ready", index, -1, time.process_time()))
    while not stop.wait(poll):
        gen = db.execute("SELECT gen FROM bench_raw WHERE id = 1").fetchone()[0]
        if gen != last:
            last = gen
            out.put(("raw", index, int(gen), time.monotonic()))
    db.close()
    out.put(("raw-cpu", index, -1, time.process_time()))


@dataclass
class RawFleet:
    """A raw baseline: start its workers, then ``publish(gen)`` a change they must see."""

    start: Callable[[str, int, float, Any, MpEvent], list[Any]]
    publish: Callable[[int], None]
    close: Callable[[], None]


def sqlite_fleet(url: str) -> RawFleet:
    from locstatus.backends.sqlite import parse_sqlite_url

    path, params = parse_sqlite_url(url)
    db = sqlite3.connect(path, isolation_level=None, timeout=30)
    db.execute("PRAGMA journal_mode=WAL").fetchall()
    db.execute(f"PRAGMA synchronous={params.get('synchronous', 'full').upper()}")
    db.execute("CREATE TABLE IF NOT EXISTS bench_raw (id INTEGER PRIMARY KEY, gen INTEGER)")
    db.execute("INSERT OR REPLACE INTO bench_raw (id, gen) VALUES (1, 0)")

    def start(url: str, n: int, poll: float, out: Any, stop: MpEvent) -> list[Any]:
        procs = [
            CTX.Process(target=sqlite_raw_worker, args=(path, i, poll, out, stop), daemon=True)
            for i in range(n)
        ]
        for p in procs:
            p.start()
        return procs

    def publish(gen: int) -> None:
        db.execute("BEGIN IMMEDIATE")
        db.execute("UPDATE bench_raw SET gen = ? WHERE id = 1", (gen,))
        db.execute("COMMIT")

    return RawFleet(start, publish, db.close)


def _zk_client(url: str) -> tuple[Any, str]:
    from kazoo.client import KazooClient

    from locstatus.backends.zookeeper import parse_zk_url

    params = parse_zk_url(url)
    auth = [("digest", ":".join(params.auth))] if params.auth else None
    client = KazooClient(hosts=params.hosts, timeout=params.session_timeout, auth_data=auth)
    client.start(timeout=params.timeout)
    return client, f"{params.chroot}/bench-propagation"


def zk_raw_worker(url: str, index: int, poll: float, out: Any, stop: MpEvent) -> None:
    """One raw watcher: a ``DataWatch`` on one znode, "handle" every new value."""
    client, path = _zk_client(url)
    client.ensure_path(path)
    last: list[int | None] = [None]

    def changed(data: bytes | None, stat: Any) -> None:
        gen = int(data or b"0")
        if last[0] is None:
            out.put(("raw-ready", index, -1, time.process_time()))
        elif gen != last[0]:
            out.put(("raw", index, gen, time.monotonic()))
        last[0] = gen

    client.DataWatch(path, changed)
    stop.wait()
    client.stop()
    client.close()
    out.put(("raw-cpu", index, -1, time.process_time()))


def zk_fleet(url: str) -> RawFleet:
    """ZooKeeper: one kazoo ``set`` observed by 16 ``DataWatch`` watchers (one session each)."""
    client, path = _zk_client(url)
    client.ensure_path(path)
    client.set(path, b"0")

    def start(url: str, n: int, poll: float, out: Any, stop: MpEvent) -> list[Any]:
        procs = [
            CTX.Process(target=zk_raw_worker, args=(url, i, poll, out, stop), daemon=True)
            for i in range(n)
        ]
        for p in procs:
            p.start()
        return procs

    def publish(gen: int) -> None:
        client.set(path, str(gen).encode())

    def close() -> None:
        client.stop()
        client.close()

    return RawFleet(start, publish, close)


RAW_FLEETS: dict[str, Callable[[str], RawFleet]] = {"sqlite": sqlite_fleet, "zk": zk_fleet}


# -- the bench -----------------------------------------------------------------------------


def pct(xs: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of xs."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * len(s) + 0.5) - 1))]


def collect(
    out: Any, fleet: str, gen: int, n: int, timeout: float, stash: list[Report]
) -> list[float]:
    """End times of the first report of each of ``n`` workers of ``fleet`` for ``gen``."""
    done: dict[int, float] = {}
    for r in stash[:]:
        if r[0] == fleet and r[2] == gen:
            done.setdefault(r[1], r[3])
            stash.remove(r)
    deadline = time.monotonic() + timeout
    while len(done) < n:
        try:
            r = out.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            raise SystemExit(
                f"{fleet}: only {len(done)}/{n} handlers for {gen} in {timeout}s"
            ) from None
        if r[0] == fleet and r[2] == gen:
            done.setdefault(r[1], r[3])
        elif r[0] == fleet and r[2] > gen:
            stash.append(r)
    return list(done.values())


def gather(out: Any, kinds: tuple[str, ...], n: int, timeout: float = 120.0) -> dict[str, float]:
    """Wait for ``n`` reports of each kind; return their sum (CPU seconds) per kind."""
    seen: dict[tuple[str, int], float] = {}
    deadline = time.monotonic() + timeout
    while len(seen) < n * len(kinds):
        try:
            r = out.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            raise SystemExit(
                f"only {len(seen)} of {n * len(kinds)} reports after {timeout}s"
            ) from None
        if r[0] in kinds:
            seen[(r[0], r[1])] = r[3]
    return {k: sum(v for (kind, _), v in seen.items() if kind == k) for k in kinds}


def run(
    backend: str, url: str, rounds: int, workers: int, poll: float, lease: float
) -> dict[str, Any]:
    from locstatus import State, connect

    mgr = connect(url)
    mgr.sync_locations({LOC: [SVC]})
    raw = RAW_FLEETS[backend](url)
    out = CTX.Queue()
    stop = CTX.Event()
    procs = [
        CTX.Process(target=agent_worker, args=(url, i, lease, out, stop), daemon=True)
        for i in range(workers)
    ]
    for p in procs:
        p.start()
    procs += raw.start(url, workers, poll, out, stop)
    cpu_ready = gather(out, ("agent-ready", "raw-ready"), workers)
    print(f"{workers} agent workers and {workers} raw pollers ready", flush=True)

    stash: list[Report] = []
    lat: dict[str, list[float]] = {
        key: [] for key in ("raw", "agent", "agent_wait", "settle", "commit", "after_commit")
    }
    raw_gen = 0

    # Where the time goes: when did the pause's own write commit (before any worker can see it)?
    commits: list[float] = []
    compare_and_set = mgr.backend.compare_and_set

    def timed_cas(*args: Any, **kwargs: Any) -> Any:
        stored = compare_and_set(*args, **kwargs)
        commits.append(time.monotonic())
        return stored

    mgr.backend.compare_and_set = timed_cas  # type: ignore[method-assign]

    def agent_round(record: bool) -> None:
        st = mgr.status(LOC).services[SVC]
        commits.clear()
        t0 = time.monotonic()
        flip = mgr.resume if st.paused else mgr.pause
        rec = flip(LOC, SVC, wait=60)
        t_wait = time.monotonic()
        assert rec.services[SVC].state in (State.PAUSED, State.RUNNING)
        ends = collect(out, "agent", rec.services[SVC].generation, workers, 60, stash)
        if record:
            lat["agent"].append(max(ends) - t0)
            lat["agent_wait"].append(t_wait - t0)
            lat["commit"].append(commits[0] - t0)
            lat["after_commit"].append(max(ends) - commits[0])
            # Diagnosis of slow wait= rounds: when did the settle land (history time)?
            change, settle = sorted((e for e in mgr.history(LOC, limit=2)), key=lambda e: e.version)
            lat["settle"].append((settle.at - change.at).total_seconds())

    def raw_round(record: bool) -> None:
        nonlocal raw_gen
        raw_gen += 1
        t0 = time.monotonic()
        raw.publish(raw_gen)
        ends = collect(out, "raw", raw_gen, workers, 60, stash)
        if record:
            lat["raw"].append(max(ends) - t0)

    for _ in range(5):  # warm up
        agent_round(False)
        raw_round(False)
    for r in range(rounds):
        order = (raw_round, agent_round) if r % 2 == 0 else (agent_round, raw_round)
        for fn in order:
            fn(True)
            time.sleep(2 * poll)  # let the trailing reads of the previous round finish
        if (r + 1) % 50 == 0:
            print(
                f"round {r + 1}: p50 raw {statistics.median(lat['raw']) * 1e3:6.1f} ms  "
                f"agent {statistics.median(lat['agent']) * 1e3:6.1f} ms",
                flush=True,
            )
    stop.set()
    cpu_end = gather(out, ("agent-cpu", "raw-cpu"), workers, timeout=30)
    n_rounds = 2 * (rounds + 5)  # every process lives through the rounds of both fleets
    cpu_ms = {
        "locstatus": (cpu_end["agent-cpu"] - cpu_ready["agent-ready"]) / workers / n_rounds * 1e3,
        "raw": (cpu_end["raw-cpu"] - cpu_ready["raw-ready"]) / workers / n_rounds * 1e3,
    }
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.terminate()
    raw.close()
    mgr.close()

    def stats(xs: list[float]) -> dict[str, float]:
        return {"p50_ms": statistics.median(xs) * 1e3, "p99_ms": pct(xs, 0.99) * 1e3}

    results = {
        "raw": stats(lat["raw"]),
        "locstatus_handlers_done": stats(lat["agent"]),
        "locstatus_wait_returned": stats(lat["agent_wait"]),
        "locstatus_write_committed": stats(lat["commit"]),
        "locstatus_commit_to_handlers": stats(lat["after_commit"]),
    }
    p99_ratio = results["locstatus_handlers_done"]["p99_ms"] / results["raw"]["p99_ms"]
    p50_ratio = results["locstatus_handlers_done"]["p50_ms"] / results["raw"]["p50_ms"]
    print(f"\n{'':30}{'p50 ms':>10}{'p99 ms':>10}")
    for name, st in results.items():
        print(f"{name:30}{st['p50_ms']:10.1f}{st['p99_ms']:10.1f}")
    slow = sorted(range(len(lat["agent_wait"])), key=lambda i: -lat["agent_wait"][i])[:5]
    print(
        "slowest wait= rounds (ms: handlers done / settle written / wait returned): "
        + ", ".join(
            f"{lat['agent'][i] * 1e3:.0f}/{lat['settle'][i] * 1e3:.0f}/"
            f"{lat['agent_wait'][i] * 1e3:.0f}"
            for i in slow
        )
    )
    verdict = "OK" if p99_ratio <= 2.0 else "ABOVE TARGET"
    print(f"p99 ratio locstatus/raw: {p99_ratio:.2f} (target <= 2.0: {verdict})")
    print(f"p50 ratio locstatus/raw: {p50_ratio:.2f}")
    print(
        f"CPU per worker process per round: locstatus {cpu_ms['locstatus']:.1f} ms, "
        f"raw {cpu_ms['raw']:.1f} ms"
    )
    return {
        "backend": backend,
        "workers": workers,
        "rounds": rounds,
        "poll_interval_s": poll,
        **results,
        "p99_ratio": p99_ratio,
        "p50_ratio": p50_ratio,
        "cpu_ms_per_process_round": cpu_ms,
        "latencies_s": lat,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="sqlite", choices=sorted(RAW_FLEETS))
    ap.add_argument("--url", help="backend URL (default: a temp SQLite file)")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--poll", type=float, default=0.05, help="SQLite hint/poll interval (s)")
    ap.add_argument("--lease", type=float, default=10.0)
    ap.add_argument("--json", help="write the summary here")
    args = ap.parse_args()
    server: Any = None
    with tempfile.TemporaryDirectory() as tmp:
        url = args.url
        if url is None and args.backend == "zk":
            sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
            servers = importlib.import_module("support.servers")  # tests/support/servers.py

            server = servers.start_zookeeper(tmp)
            url = f"zk://{server.hosts}/bench-{uuid.uuid4().hex[:8]}"
            print(f"started ZooKeeper {server.hosts} (pid {server.pid})", flush=True)
        elif url is None:
            url = f"sqlite:///{tmp}/bench.db?poll_interval={args.poll}"
        try:
            summary = run(args.backend, url, args.rounds, args.workers, args.poll, args.lease)
        finally:
            if server is not None:
                server.close()
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
