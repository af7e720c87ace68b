"""Bridge latency: from a locstatus pause to the Backbeat processor's acknowledgement (its own
ZooKeeper write of ``paused: true``), 16 sites, against the raw path the bridge rides on (a
Redis publish of ``pauseService`` straight to the processor, to the same write), measured side
by side (docs/benchmarks.md; target p99 <= 2x; docs/backbeat.md "2. The bridge").

One Node.js stand-in for Backbeat's queue processor (``tests/node/legacy_processor.js``,
Backbeat's own npm clients) serves 32 sites: 16 bridged (locations in a locstatus SQLite store,
followed by ``locstatus.bridge.Bridge``) and 16 raw (unknown to locstatus, driven by hand).
Each round pauses all 16 of each kind (in alternating order between rounds), waits until every
state node says paused, then resumes them all. A site's latency runs from just before its
``mgr.pause`` call (or its ``PUBLISH``) to the moment this process's kazoo watch sees its node
say ``paused: true``: the same observer for both.

    python bench/bridge.py [--rounds 20] [--store zk|sqlite] [--json]

ZooKeeper (Debian's package, ``tests/support/servers.py``) and Redis (``redis-server``) are
started locally in a temporary directory and stopped at the end; ``scripts/setup.sh`` installs
the npm packages of the processor.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

import redis  # noqa: E402
from kazoo.client import KazooClient  # noqa: E402

from locstatus import connect  # noqa: E402
from locstatus.backbeat_state import BackbeatConfig  # noqa: E402
from locstatus.bridge import Bridge, BridgeSettings  # noqa: E402

from support.legacy_processor import LegacyProcessor  # noqa: E402
from support.redis_server import RedisServer  # noqa: E402
from support.servers import start_zookeeper  # noqa: E402

SITES = 16
NS = "/backbeat/replication"


class Watcher:
    """Records when each state node is first seen paused (or running) after a mark."""

    def __init__(self, zk: KazooClient, sites: list[str]) -> None:
        self.cond = threading.Condition()
        self.paused: dict[str, bool] = {}
        self.seen: dict[str, float] = {}
        for site in sites:
            zk.DataWatch(f"{NS}/state/{site}", self._make(site))

    def _make(self, site: str) -> Any:
        def changed(data: bytes | None, _stat: Any, _event: Any) -> None:
            now = time.perf_counter()
            paused = bool(data) and json.loads(data).get("paused") is True
            with self.cond:
                if self.paused.get(site) != paused:
                    self.paused[site] = paused
                    self.seen[site] = now
                self.cond.notify_all()
        return changed

    def wait(self, sites: list[str], paused: bool, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not all(self.paused.get(s) is paused for s in sites):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"sites not {'paused' if paused else 'running'} in time")
                self.cond.wait(left)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.add_argument("--store", choices=["sqlite", "zk"], default="sqlite",
                    help="locstatus's own store: a SQLite file (the default store; hints "
                    "polled every 50 ms), or the same ZooKeeper under /locstatus (watches)")
    args = ap.parse_args()
    bridged = [f"site-{i:02d}" for i in range(SITES)]
    raw = [f"raw-{i:02d}" for i in range(SITES)]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        zk_server = start_zookeeper(tmp / "zk")
        redis_server = RedisServer(tmp / "redis").start()
        store = (f"zk://{zk_server.hosts}/locstatus" if args.store == "zk"
                 else f"sqlite:///{tmp}/ls.db")
        mgr = connect(store)
        zk = KazooClient(hosts=zk_server.hosts)
        zk.start(timeout=15)
        proc = LegacyProcessor(zk_server.hosts, f"127.0.0.1:{redis_server.port}",
                               bridged + raw, namespace=NS)
        try:
            mgr.sync_locations({s: ["replication"] for s in bridged})
            proc.start()
            watcher = Watcher(zk, bridged + raw)
            publisher = redis.Redis.from_url(redis_server.url)
            cfg = BackbeatConfig(zookeeper=zk_server.hosts, redis=redis_server.url)
            settings = BridgeSettings(ack_wait=2.0, republish_interval=1.0, tick=0.5)
            with Bridge(mgr, cfg, services=["replication"], settings=settings):
                samples: dict[str, list[float]] = {"locstatus": [], "raw": []}

                def via_locstatus() -> None:
                    start = {}
                    for s in bridged:
                        start[s] = time.perf_counter()
                        mgr.pause(s, "replication")
                    watcher.wait(bridged, True)
                    samples["locstatus"] += [watcher.seen[s] - start[s] for s in bridged]
                    for s in bridged:
                        mgr.resume(s, "replication")
                    watcher.wait(bridged, False)

                def via_redis() -> None:
                    start = {}
                    for s in raw:
                        start[s] = time.perf_counter()
                        publisher.publish(f"backbeat-replication-{s}",
                                          json.dumps({"action": "pauseService"}))
                    watcher.wait(raw, True)
                    samples["raw"] += [watcher.seen[s] - start[s] for s in raw]
                    for s in raw:
                        publisher.publish(f"backbeat-replication-{s}",
                                          json.dumps({"action": "resumeService"}))
                    watcher.wait(raw, False)

                via_locstatus()  # warm-up round of each, not counted
                via_redis()
                samples = {"locstatus": [], "raw": []}
                for r in range(args.rounds):
                    for run in ((via_locstatus, via_redis) if r % 2 == 0
                                else (via_redis, via_locstatus)):
                        run()
                publisher.close()
        finally:
            proc.close()
            zk.stop()
            zk.close()
            mgr.close()
            redis_server.close()
            zk_server.close()
    result: dict[str, Any] = {"sites": SITES, "rounds": args.rounds, "store": args.store}
    for name, values in samples.items():
        result[name] = {"n": len(values), "p50_ms": round(statistics.median(values) * 1000, 2),
                        "p99_ms": round(pct(values, 0.99) * 1000, 2),
                        "max_ms": round(max(values) * 1000, 2)}
    result["p99_ratio"] = round(result["locstatus"]["p99_ms"] / result["raw"]["p99_ms"], 2)
    result["p50_ratio"] = round(result["locstatus"]["p50_ms"] / result["raw"]["p50_ms"], 2)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for name in ("locstatus", "raw"):
            st = result[name]
            print(f"{name:9s} n={st['n']} p50 {st['p50_ms']} ms  p99 {st['p99_ms']} ms  "
                  f"max {st['max_ms']} ms")
        print(f"p99 ratio {result['p99_ratio']}x (target <= 2x), p50 ratio "
              f"{result['p50_ratio']}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
