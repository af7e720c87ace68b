"""Propagation to HTTP workers: a pause until every one of N workers acknowledged it, for Node.js
workers through one sidecar (docs/http.md "Workers over HTTP") against Python agents on the
same store, side by side; and the sidecar's memory per open watch stream.

Two fleets run for the whole run on one store, each on its own location:

- **agents**: N Python :class:`~locstatus.agent.Agent` instances (in processes of
  ``--per-process`` agents each) watching location ``bench-py``;
- **http**: N Node.js workers (``clients/node``, in processes of ``--per-process`` workers
  each) registered with, watching and acknowledging through one ``locstatus serve`` sidecar,
  watching location ``bench-http``.

A round is ``mgr.pause(loc, wait=60)`` (or ``resume``, alternating) by an operator process on
the store directly, the same call for both fleets: it returns once every live worker of the
fleet acknowledged the new generation and the record settled. Rounds alternate between the
fleets (http, agents, agents, http, ...) so both see the same machine load. Output: p50/p99 of
each, the p99 ratio http/agents (target <= 1.5) and the sidecar's resident memory per open
stream (RSS with the N streams open minus RSS before the first one, divided by N).

Run: ``python bench/http_workers.py [--backend sqlite|zk] [--workers 16] [--rounds 100]
[--json out.json]``; needs ``node`` (>= 18) on the PATH. ZooKeeper without ``--url`` starts a
throwaway server from ``tests/support/servers.py``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing as mp
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# bench/http.py would shadow the standard library's http package (httpx needs http.client)
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
SVC = "replication"
PY_LOC, HTTP_LOC = "bench-py", "bench-http"
CTX = mp.get_context("spawn")
NODE_FLEET = """
import { Worker } from './src/index.js';
const [url, prefix, count, loc, lease] = process.argv.slice(2);
const workers = [];
for (let i = 0; i < Number(count); i++) {
  workers.push(new Worker({ url, workerId: `${prefix}-${i}`, services: ['replication'],
    locations: [loc], leaseSeconds: Number(lease), onPause: () => {}, onResume: () => {},
    log: process.env.BENCH_LOG ? (m) => console.error(new Date().toISOString(), prefix, i, m) : undefined }));
}
await Promise.all(workers.map((w) => w.start()));
process.stdout.write('ready\\n');
process.stdin.on('data', () => {});
process.stdin.on('end', async () => { await Promise.all(workers.map((w) => w.stop())); process.exit(0); });
"""


def agent_fleet(url: str, first: int, count: int, lease: float, ready: Any, stop: Any) -> None:
    """One process running ``count`` agents on :data:`PY_LOC`."""
    from locstatus import connect

    mgr = connect(url)
    agents = [
        mgr.agent(f"py-{first + i:02d}", services=[SVC], locations=[PY_LOC], lease_seconds=lease)
        for i in range(count)
    ]
    for a in agents:
        a.on_pause(SVC)(lambda loc: None)
        a.on_resume(SVC)(lambda loc: None)
        a.start()
    ready.put(count)
    stop.wait()
    for a in agents:
        a.stop(2)
    mgr.close()


def rss_kib(pid: int) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    m = re.search(r"VmRSS:\s+(\d+) kB", text)
    return int(m.group(1)) if m else 0


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * len(s) + 0.5) - 1))]


def start_sidecar(url: str) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "LOCSTATUS_BACKEND": url}
    env.pop("LOCSTATUS_API_TOKEN", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "locstatus", "serve", "--port", "0"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if "locstatus sidecar on " in line:
            base = line.split("locstatus sidecar on ", 1)[1].split(",")[0]
            break
    else:
        raise SystemExit("the sidecar did not start")
    import httpx

    # keep reading its log (the access log fills a pipe nobody reads, and the sidecar blocks)
    threading.Thread(target=lambda: [None for _ in proc.stdout or ()], daemon=True).start()
    while time.monotonic() < deadline:
        try:
            if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            time.sleep(0.05)
    raise SystemExit("the sidecar does not answer")


def run(
    url: str, workers: int, rounds: int, per_process: int, lease: float, *, agents: bool = True
) -> dict[str, Any]:
    from locstatus import State, connect

    mgr = connect(url)
    mgr.sync_locations({PY_LOC: [SVC], HTTP_LOC: [SVC]})
    sidecar, base = start_sidecar(url)
    time.sleep(1.0)
    rss_before = rss_kib(sidecar.pid)
    ready, stop = CTX.Queue(), CTX.Event()
    procs = []
    for first in range(0, workers if agents else 0, per_process):
        n = min(per_process, workers - first)
        p = CTX.Process(target=agent_fleet, args=(url, first, n, lease, ready, stop), daemon=True)
        p.start()
        procs.append(p)
    nodes = []
    script = ROOT / "clients" / "node" / f".bench-fleet-{uuid.uuid4().hex[:8]}.mjs"
    script.write_text(NODE_FLEET)
    try:
        for first in range(0, workers, per_process):
            n = min(per_process, workers - first)
            nodes.append(subprocess.Popen(
                ["node", str(script), base, f"node{first:02d}", str(n), HTTP_LOC, str(lease)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=script.parent,
            ))
        for node in nodes:
            assert node.stdout is not None
            if node.stdout.readline().strip() != "ready":
                raise SystemExit("a Node fleet did not start")
        got = 0 if agents else workers
        while got < workers:
            got += ready.get(timeout=120)
        deadline = time.monotonic() + 60
        want = 2 * workers if agents else workers
        while len([w for w in mgr.workers() if w.worker_id.startswith(("py-", "node"))]) < want:
            if time.monotonic() > deadline:
                raise SystemExit("not every worker registered")
            time.sleep(0.1)
        time.sleep(2.0)  # every watch stream open and every worker applied the start state
        rss_open = rss_kib(sidecar.pid)
        print(f"{workers} agents and {workers} Node workers ready; sidecar RSS "
              f"{rss_before} KiB -> {rss_open} KiB", flush=True)

        lat: dict[str, list[float]] = {"agents": [], "http": []}

        def one(loc: str, key: str, record: bool) -> None:
            st = mgr.status(loc).services[SVC]
            flip = mgr.resume if st.paused else mgr.pause
            t0 = time.monotonic()
            rec = flip(loc, SVC, wait=60)
            dt = time.monotonic() - t0
            assert rec.services[SVC].state in (State.PAUSED, State.RUNNING), rec
            if record:
                lat[key].append(dt)

        for _ in range(5):
            one(HTTP_LOC, "http", False)
            if agents:
                one(PY_LOC, "agents", False)
        for r in range(rounds):
            order = [(HTTP_LOC, "http"), (PY_LOC, "agents")] if agents else [(HTTP_LOC, "http")]
            if r % 2:
                order.reverse()
            for loc, key in order:
                one(loc, key, True)
                time.sleep(0.05)
            if (r + 1) % 25 == 0:
                print(f"round {r + 1}: p50 http {statistics.median(lat['http']) * 1e3:6.1f} ms, "
                      f"max {max(lat['http']) * 1e3:6.1f} ms", flush=True)
    finally:
        for node in nodes:
            if node.stdin is not None:
                node.stdin.close()
        for node in nodes:
            try:
                node.wait(10)
            except subprocess.TimeoutExpired:
                node.kill()
        script.unlink(missing_ok=True)
        stop.set()
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.terminate()
        sidecar.terminate()
        try:
            sidecar.wait(10)
        except subprocess.TimeoutExpired:
            sidecar.kill()
        mgr.close()

    def stats(xs: list[float]) -> dict[str, float]:
        return {"p50_ms": statistics.median(xs) * 1e3, "p99_ms": pct(xs, 0.99) * 1e3}

    if not agents:
        lat["agents"] = lat["http"]
    results = {"agents": stats(lat["agents"]), "http": stats(lat["http"])}
    ratio = results["http"]["p99_ms"] / results["agents"]["p99_ms"]
    per_stream = (rss_open - rss_before) / workers
    print(f"\n{'pause -> wait= returned':30}{'p50 ms':>10}{'p99 ms':>10}")
    for name, st in results.items():
        print(f"{name:30}{st['p50_ms']:10.1f}{st['p99_ms']:10.1f}")
    print(f"p99 ratio http/agents: {ratio:.2f} (target <= 1.5: "
          f"{'OK' if ratio <= 1.5 else 'ABOVE TARGET'})")
    print(f"sidecar memory per open watch stream: {per_stream:.0f} KiB "
          f"({rss_before} -> {rss_open} KiB for {workers} streams)")
    return {"workers": workers, "rounds": rounds, **results, "p99_ratio": ratio,
            "sidecar_rss_kib": {"before": rss_before, "open": rss_open},
            "kib_per_stream": per_stream, "latencies_s": lat}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="sqlite", choices=["sqlite", "zk"])
    ap.add_argument("--url")
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--per-process", type=int, default=8)
    ap.add_argument("--lease", type=float, default=10.0)
    ap.add_argument("--json")
    ap.add_argument("--no-agents", action="store_true", help="HTTP workers only (diagnosis)")
    args = ap.parse_args()
    server: Any = None
    with tempfile.TemporaryDirectory() as tmp:
        url = args.url
        if url is None and args.backend == "zk":
            sys.path.insert(0, str(ROOT / "tests"))
            servers = importlib.import_module("support.servers")
            server = servers.start_zookeeper(tmp)
            url = f"zk://{server.hosts}/bench-{uuid.uuid4().hex[:8]}"
        elif url is None:
            url = f"sqlite:///{tmp}/bench.db"
        try:
            summary = {"backend": args.backend,
                       **run(url, args.workers, args.rounds, args.per_process, args.lease,
                              agents=not args.no_agents)}
        finally:
            if server is not None:
                server.close()
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
