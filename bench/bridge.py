"""Bridge latency: from a locstatus pause to the Backbeat processor's acknowledgement (its own
ZooKeeper write of ``paused: true``), 16 sites, against the raw path the bridge rides on (a
Redis publish of ``pauseService`` straight to the processor, to the same write), measured side
by side (docs/benchmarks.md; target p99 <= 2x; docs/backbeat.md "2. The bridge").

One Node.js stand-in for Backbeat's queue processor (``tests/node/legacy_processor.js``,
Backbeat's own npm clients) serves 32 sites: 16 bridged (locations in locstatus's store,
followed by the bridge) and 16 raw (unknown to locstatus, driven by hand). The bridge runs as
it is deployed (docs/backbeat.md): ``locstatus bridge backbeat --config config.json`` in its
own process, with a ``config.json`` in Backbeat's format written to the temporary directory
and locstatus's store (the SQLite file, or the ZooKeeper chroot) shared with this process,
which plays the operator (``mgr.pause``, as the CLI or the sidecar would) and the observer.
The first round starts once the bridge registered its 16 processors under its PID; the
bridge is stopped by PID (SIGTERM, then SIGKILL) at the end of each run.

Each round pauses all 16 of each kind (in alternating order between rounds), waits until every
state node says paused, then resumes them all (and, for the bridged ones, waits until locstatus
says they settled ``running``: the bridge's last writes do not overlap the next round). A
site's latency runs from just before its ``mgr.pause`` call (or its ``PUBLISH``) to the moment
this process's kazoo watch sees its node say ``paused: true``: the same observer for both.

    python bench/bridge.py [--rounds 20] [--runs 5] [--store zk|sqlite] [--json [PATH]]
                           [--in-process] [--trace]

Why the bridge is its own process by default: in the same process as the bench (``--in-process``,
``locstatus.bridge.Bridge`` with its 16 agents) the bench's own process spent 4-5 ms of CPU per
bridged site (the pause calls, the agents' hints, reads, acknowledgements and settles, the
bridge's watches) under one GIL with the observer, against 0.5 ms per raw site: the bridged
path's observer was slowed by the bridge's work, which no deployment has (there the bridge is
its own process and the operator's pause comes from elsewhere).

``--runs N`` repeats the whole run N times (fresh servers each; the machine's load moves the
ratio, so a single run says little on a shared machine) and reports the medians of the runs'
p50, p99 and ratios, each run's figures kept in the JSON.

``--trace`` also times, for both paths, the processor's write (the node's ``mtime``) and the
observer, and the CPU per site of this process and of the bridge's (the bridge's own process:
from ``/proc``), and each stage of the bridged path (:data:`STAGES`), to find where the
difference goes (p50 and p99 of each stage from the start, and of each step from the stage
before): with the bridge in its own process that process is started through
:func:`traced_bridge` (the same command, the functions of the path wrapped, its stage times
matched to the pauses by wall clock).

ZooKeeper (Debian's package, ``tests/support/servers.py``) and Redis (``redis-server``) are
started locally in a temporary directory and stopped at the end; ``scripts/setup.sh`` installs
the npm packages of the processor.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
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

from locstatus import State, connect  # noqa: E402
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
        self.written: dict[str, float] = {}  # the node's mtime (ZooKeeper's clock), perf_counter
        self._offset = time.time() - time.perf_counter()
        for site in sites:
            zk.DataWatch(f"{NS}/state/{site}", self._make(site))

    def _make(self, site: str) -> Any:
        def changed(data: bytes | None, stat: Any, _event: Any) -> None:
            now = time.perf_counter()
            paused = bool(data) and json.loads(data).get("paused") is True
            with self.cond:
                if self.paused.get(site) != paused:
                    self.paused[site] = paused
                    self.seen[site] = now
                    if stat is not None:
                        self.written[site] = stat.mtime / 1000 - self._offset
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


STAGES = ("committed", "watch", "hinted", "queued", "handler", "published", "on_redis",
          "written", "seen")
"""``--trace``: the path of one bridged site, in order: its compare-and-set returned
(``--in-process`` only), the location's watch fired in the bridge's process (ZooKeeper
store), the hint reached the site's agent, the agent queued the work (after its read), the
bridge's handler started, its ``PUBLISH`` returned (with the bridge in its own process, these
five are recorded there by :func:`traced_bridge` and matched to the pauses by wall-clock
time), this process's own Redis subscriber received the ``pauseService`` (the bridge in its
own process only; for the raw path too), the processor's write of the node committed (its
``mtime``: ZooKeeper's clock, the same host's, to the millisecond), the bench's observer saw
the node say paused."""


def install_stage_wraps(hit: Any) -> None:
    """Wrap the functions of the bridged path so that ``hit(site, stage)`` is called as each
    stage of :data:`STAGES` from ``watch`` to ``published`` is reached (in whichever process
    runs the bridge)."""
    from locstatus.agent.queue import DueQueue
    from locstatus.agent.watch import Watcher as AgentWatcher
    from locstatus.backends.zookeeper.watcher import Watcher as ZkWatcher
    from locstatus.bridge import bridge as bridge_mod
    from locstatus.bridge.legacy import Publisher

    def wrap(owner: Any, name: str, site_of: Any, stage: str, after: bool = False) -> None:
        orig = getattr(owner, name)

        def wrapped(*a: Any, **kw: Any) -> Any:
            if not after:
                hit(site_of(*a, **kw), stage)
            out = orig(*a, **kw)
            if after:
                hit(site_of(*a, **kw), stage)
            return out

        setattr(owner, name, wrapped)

    def watched(_self: Any, event: Any) -> str | None:
        parent, _, name = (event.path or "").rpartition("/")
        return name if parent.endswith("/locations") else None

    def hinted(self: Any, hint: Any) -> str | None:
        locs = self.locations
        if hint.location is not None and (locs is None or hint.location in locs):
            return str(hint.location)
        return None

    wrap(ZkWatcher, "on_watch", watched, "watch")
    wrap(AgentWatcher, "on_hint", hinted, "hinted")
    wrap(DueQueue, "schedule", lambda _self, key, *a, **kw: key[0], "queued")
    wrap(bridge_mod.Bridge, "_converge", lambda _self, proc, paused: proc.location,
         "handler")
    wrap(Publisher, "publish",
         lambda _self, channel, action: None if action == "resumeService"
         else channel.removeprefix("backbeat-replication-"),
         "published", after=True)


def traced_bridge(out: str, argv: list[str]) -> int:
    """``--trace`` with the bridge in its own process: run ``locstatus <argv>`` (the bridge
    command) with :func:`install_stage_wraps` recording ``time.time()`` of every stage hit,
    written to ``out`` as ``<time> <site> <stage>`` lines when the command ends (SIGTERM: the
    command's own handler stops the bridge and returns)."""
    import atexit

    hits: list[tuple[float, str, str]] = []

    def hit(site: str | None, stage: str) -> None:
        if site is not None:
            hits.append((time.time(), site, stage))

    def dump() -> None:
        Path(out).write_text("".join(f"{t:.6f} {site} {stage}\n" for t, site, stage in hits))

    atexit.register(dump)
    install_stage_wraps(hit)
    from locstatus.cli import main as cli

    sys.argv = ["locstatus", *argv]
    cli()
    return 0


class RedisTap:
    """``--trace`` with the bridge in its own process: when this process's own subscriber to
    every processor's channel (Redis ``url``) first receives a ``pauseService`` after
    :meth:`mark`, per site (one more subscriber for Redis to serve, on both paths)."""

    def __init__(self, url: str) -> None:
        self.at: dict[str, float] = {}
        self.client = redis.Redis.from_url(url)
        self.pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        self.pubsub.psubscribe(**{"backbeat-replication-*": self._on})
        self.thread = self.pubsub.run_in_thread(sleep_time=0.01, daemon=True)

    def _on(self, message: dict[str, Any]) -> None:
        now = time.perf_counter()
        if json.loads(message["data"]).get("action") == "pauseService":
            site = message["channel"].decode().removeprefix("backbeat-replication-")
            self.at.setdefault(site, now)

    def mark(self) -> None:
        self.at = {}

    def close(self) -> None:
        self.thread.stop()
        self.thread.join(timeout=5)
        self.pubsub.close()
        self.client.close()


class Trace:
    """``--trace``: the first time each stage is reached per site after :meth:`mark`, by
    wrapping the functions of the path (the bench's own timing is unchanged: the same start
    point and observer; the wrappers add one dictionary write per call)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.armed = False
        self.at: dict[str, dict[str, float]] = {}
        self.rows: list[dict[str, float]] = []
        self.raw_rows: list[dict[str, float]] = []
        self.counts: dict[str, int] = {}
        self.cpu = {"locstatus": 0.0, "raw": 0.0}  # this process's CPU seconds, pause phases
        self.bridge_cpu = {"locstatus": 0.0, "raw": 0.0}  # the bridge process's (not in-process)
        self.bridge_pid: int | None = None
        self.bridge_stages: Path | None = None  # traced_bridge's file (the bridge's process)
        self.tap: RedisTap | None = None
        self.wall: dict[str, float] = {}  # time.time() at each site's start, this round
        self._cpu_at = 0.0
        self._bridge_cpu_at = 0.0

    def _bridge_cpu(self) -> float:
        if self.bridge_pid is None:
            return 0.0
        return process_cpu(self.bridge_pid)

    def mark(self) -> None:
        self._cpu_at = time.process_time()
        self._bridge_cpu_at = self._bridge_cpu()
        if self.tap is not None:
            self.tap.mark()
        with self.lock:
            self.at = {}
            self.armed = True

    def mark_raw(self) -> None:
        self._cpu_at = time.process_time()
        self._bridge_cpu_at = self._bridge_cpu()
        if self.tap is not None:
            self.tap.mark()

    def _on_redis(self, row: dict[str, float], site: str, t0: float) -> None:
        if self.tap is not None and site in self.tap.at:
            row["on_redis"] = self.tap.at[site] - t0

    def hit(self, site: str | None, stage: str) -> None:
        now = time.perf_counter()
        if site is None or not self.armed:
            return
        with self.lock:
            self.counts[stage] = self.counts.get(stage, 0) + 1
            self.at.setdefault(site, {}).setdefault(stage, now)

    def collect(self, start: dict[str, float], seen: dict[str, float],
                written: dict[str, float]) -> None:
        self.cpu["locstatus"] += time.process_time() - self._cpu_at
        self.bridge_cpu["locstatus"] += self._bridge_cpu() - self._bridge_cpu_at
        with self.lock:
            self.armed = False
            for site, t0 in start.items():
                got = self.at.get(site, {})
                row = {st: got[st] - t0 for st in STAGES[:-2] if st in got}
                self._on_redis(row, site, t0)
                if site in written:
                    row["written"] = written[site] - t0
                row["seen"] = seen[site] - t0
                if site in self.wall:
                    row["_site"], row["_wall"] = site, self.wall[site]  # type: ignore[assignment]
                self.rows.append(row)

    def merge_bridge_stages(self) -> None:
        """With the bridge in its own process: add to each bridged row the first time each
        stage was hit for its site after its start (wall clock, the same host's)."""
        if self.bridge_stages is None or not self.bridge_stages.exists():
            return
        import bisect

        times: dict[tuple[str, str], list[float]] = {}
        for line in self.bridge_stages.read_text().splitlines():
            t, site, stage = line.split()
            times.setdefault((site, stage), []).append(float(t))
        for row in self.rows:
            site, t0 = row.pop("_site", None), row.pop("_wall", None)
            if site is None or t0 is None:
                continue
            for stage in STAGES[1:6]:
                ts = sorted(times.get((str(site), stage), []))
                i = bisect.bisect_left(ts, t0)
                if i < len(ts) and ts[i] - t0 < row["seen"] + 1.0:
                    row[stage] = ts[i] - t0

    def install(self, backend: Any) -> None:
        trace = self
        orig = type(backend).compare_and_set

        def compare_and_set(self: Any, rec: Any, *a: Any, **kw: Any) -> Any:
            out = orig(self, rec, *a, **kw)
            trace.hit(rec.location, "committed")
            return out

        type(backend).compare_and_set = compare_and_set  # type: ignore[method-assign]
        install_stage_wraps(self.hit)

    def collect_raw(self, start: dict[str, float], seen: dict[str, float],
                    written: dict[str, float]) -> None:
        self.cpu["raw"] += time.process_time() - self._cpu_at
        self.bridge_cpu["raw"] += self._bridge_cpu() - self._bridge_cpu_at
        for site, t0 in start.items():
            row = {"seen": seen[site] - t0}
            self._on_redis(row, site, t0)
            if site in written:
                row["written"] = written[site] - t0
            self.raw_rows.append(row)

    def report(self, raw: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {}
        prev = None
        rows = self.raw_rows if raw else self.rows
        # The raw path, and the bridge in its own process: only written and seen are known.
        for stage in [st for st in STAGES if any(st in r for r in rows)]:
            vals = [r[stage] for r in rows if stage in r]
            step = [r[stage] - r[prev] for r in rows if stage in r and prev in r] \
                if prev else vals
            out[stage] = {"n": len(vals),
                          "p50_ms": round(statistics.median(vals) * 1000, 2) if vals else None,
                          "p99_ms": round(pct(vals, 0.99) * 1000, 2) if vals else None,
                          "step_p50_ms": round(statistics.median(step) * 1000, 2)
                          if step else None,
                          "step_p99_ms": round(pct(step, 0.99) * 1000, 2) if step else None}
            prev = stage
        return out


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/<pid>/stat``, Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class BridgeProcess:
    """``locstatus bridge backbeat --config config.json`` in its own process, as deployed
    (docs/backbeat.md, "2. The bridge"): ``config.json`` in Backbeat's format in ``tmp``, the
    store ``store`` shared with the bench. Entered, it returns once the bridge registered a
    live worker for every site under its own PID (RuntimeError if it exits or takes longer
    than ``timeout`` seconds); left, it is stopped by PID (SIGTERM, SIGKILL after 30 s)."""

    def __init__(self, mgr: Any, store: str, tmp: Path, zk_hosts: str, redis_port: int,
                 sites: list[str], settings: BridgeSettings, timeout: float = 60.0,
                 stages: Path | None = None) -> None:
        self.mgr, self.store, self.tmp, self.sites = mgr, store, tmp, sites
        self.stages = stages  # --trace: run it through traced_bridge, its stages to this file
        self.zk_hosts, self.redis_port = zk_hosts, redis_port
        self.settings, self.timeout = settings, timeout
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> BridgeProcess:
        config = self.tmp / "config.json"
        config.write_text(json.dumps({
            "zookeeper": {"connectionString": self.zk_hosts},
            "redis": {"host": "127.0.0.1", "port": self.redis_port},
            "extensions": {"replication": {"topic": "backbeat-replication"}},
        }))
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOCSTATUS_")}
        args = ["--backend", self.store, "bridge", "backbeat",
                "--config", str(config), "--service", "replication",
                "--ack-wait", str(self.settings.ack_wait),
                "--republish-interval", str(self.settings.republish_interval)]
        cmd = ([sys.executable, __file__, "--as-bridge", str(self.stages), "--", *args]
               if self.stages is not None else [sys.executable, "-m", "locstatus", *args])
        self.log = (self.tmp / "bridge.log").open("wb")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self.log, env=env)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self) -> None:
        assert self.proc is not None
        wanted = {f"backbeat.replication.{s}" for s in self.sites}
        deadline = time.monotonic() + self.timeout
        while True:
            live = {w.worker_id for w in self.mgr.worker_statuses().workers
                    if w.pid == self.proc.pid and not w.away}
            if wanted <= live:
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"the bridge exited ({self.proc.returncode}): "
                                   f"{self.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the bridge registered {len(wanted & live)} of "
                                   f"{len(wanted)} processors in {self.timeout} s: {self.tail()}")
            time.sleep(0.1)

    def tail(self) -> str:
        self.log.flush()
        return (self.tmp / "bridge.log").read_text(errors="replace")[-2000:]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()

    def __exit__(self, *_exc: object) -> None:
        self.stop()
        assert self.proc is not None
        if self.proc.returncode != 0:
            print(f"the bridge exited {self.proc.returncode}", file=sys.stderr)


def settled(mgr: Any, sites: list[str], timeout: float = 30.0) -> None:
    """Wait until every site's replication reads ``running`` (resumed and settled)."""
    deadline = time.monotonic() + timeout
    while any(mgr.status(s).services["replication"].state is not State.RUNNING for s in sites):
        if time.monotonic() > deadline:
            raise RuntimeError("bridged sites not settled running in time")
        time.sleep(0.005)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(store_kind: str, rounds: int, trace: Trace | None,
            in_process: bool = False) -> dict[str, Any]:
    """One run: fresh servers, the bridge (its own process, or ``in_process``), a warm-up
    round of each path, then ``rounds`` interleaved rounds; the figures of this run."""
    load_start = list(os.getloadavg())
    bridged = [f"site-{i:02d}" for i in range(SITES)]
    raw = [f"raw-{i:02d}" for i in range(SITES)]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        zk_server = start_zookeeper(tmp / "zk")
        redis_server = RedisServer(tmp / "redis").start()
        store = (f"zk://{zk_server.hosts}/locstatus" if store_kind == "zk"
                 else f"sqlite:///{tmp}/ls.db")
        mgr = connect(store)
        if trace is not None and in_process:
            trace.install(mgr.backend)
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
            bridge: Any = (Bridge(mgr, cfg, services=["replication"], settings=settings)
                           if in_process else
                           BridgeProcess(mgr, store, tmp, zk_server.hosts, redis_server.port,
                                         bridged, settings,
                                         stages=tmp / "stages.txt" if trace else None))
            with bridge:
                if trace is not None and not in_process:
                    trace.bridge_pid = bridge.proc.pid
                    trace.bridge_stages = bridge.stages
                    trace.tap = RedisTap(redis_server.url)
                samples: dict[str, list[float]] = {"locstatus": [], "raw": []}

                def applied(sites: list[str], event: str, since: int) -> None:
                    # The processor writes its node, then (in the write's callback) flips its
                    # consumer: an order that arrives in between is ignored ("not paused").
                    # Outside the timed window: the next order waits for the flip.
                    for s in sites:
                        proc.wait_for(event, site=s, since=since, timeout=30)

                def via_locstatus() -> None:
                    start = {}
                    mark = proc.mark()
                    if trace is not None:
                        trace.mark()
                    for s in bridged:
                        if trace is not None:
                            trace.wall[s] = time.time()
                        start[s] = time.perf_counter()
                        mgr.pause(s, "replication")
                    watcher.wait(bridged, True)
                    samples["locstatus"] += [watcher.seen[s] - start[s] for s in bridged]
                    if trace is not None:
                        trace.collect(start, watcher.seen, watcher.written)
                    applied(bridged, "paused", mark)
                    mark = proc.mark()
                    for s in bridged:
                        mgr.resume(s, "replication")
                    watcher.wait(bridged, False)
                    settled(mgr, bridged)  # the agents' acks and settles end before the raw
                    # round starts: they would load the machine under the raw path's timing
                    applied(bridged, "resumed", mark)

                def via_redis() -> None:
                    start = {}
                    mark = proc.mark()
                    if trace is not None:
                        trace.mark_raw()
                    for s in raw:
                        start[s] = time.perf_counter()
                        publisher.publish(f"backbeat-replication-{s}",
                                          json.dumps({"action": "pauseService"}))
                    watcher.wait(raw, True)
                    samples["raw"] += [watcher.seen[s] - start[s] for s in raw]
                    if trace is not None:
                        trace.collect_raw(start, watcher.seen, watcher.written)
                    applied(raw, "paused", mark)
                    mark = proc.mark()
                    for s in raw:
                        publisher.publish(f"backbeat-replication-{s}",
                                          json.dumps({"action": "resumeService"}))
                    watcher.wait(raw, False)
                    applied(raw, "resumed", mark)

                via_locstatus()  # warm-up round of each, not counted
                via_redis()
                samples = {"locstatus": [], "raw": []}
                if trace is not None:
                    trace.rows, trace.raw_rows, trace.counts = [], [], {}
                    trace.cpu = {"locstatus": 0.0, "raw": 0.0}
                for r in range(rounds):
                    for run in ((via_locstatus, via_redis) if r % 2 == 0
                                else (via_redis, via_locstatus)):
                        run()
                publisher.close()
                if trace is not None and trace.tap is not None:
                    trace.tap.close()
            if trace is not None:
                trace.merge_bridge_stages()  # written by the bridge's process as it ended
        finally:
            proc.close()
            zk.stop()
            zk.close()
            mgr.close()
            redis_server.close()
            zk_server.close()
    result: dict[str, Any] = {"sites": SITES, "rounds": rounds, "store": store_kind,
                              "bridge": "in-process" if in_process else "own process",
                              "loadavg_start": load_start, "loadavg_end": list(os.getloadavg())}
    for name, values in samples.items():
        result[name] = {"n": len(values), "p50_ms": round(statistics.median(values) * 1000, 2),
                        "p99_ms": round(pct(values, 0.99) * 1000, 2),
                        "max_ms": round(max(values) * 1000, 2)}
    result["p99_ratio"] = round(result["locstatus"]["p99_ms"] / result["raw"]["p99_ms"], 2)
    result["p50_ratio"] = round(result["locstatus"]["p50_ms"] / result["raw"]["p50_ms"], 2)
    if trace is not None:
        result["trace"] = trace.report()
        result["trace_raw"] = trace.report(raw=True)
        result["trace_calls_per_site"] = {k: round(v / max(1, len(trace.rows)), 2)
                                          for k, v in trace.counts.items()}
        result["trace_cpu_ms_per_site"] = {
            k: round(v * 1000 / max(1, len(trace.rows)), 2) for k, v in trace.cpu.items()}
        if not in_process:
            result["trace_bridge_cpu_ms_per_site"] = {
                k: round(v * 1000 / max(1, len(trace.rows)), 2)
                for k, v in trace.bridge_cpu.items()}
    return result


def main() -> int:
    if sys.argv[1:2] == ["--as-bridge"]:  # BridgeProcess with --trace: the bridge, traced
        return traced_bridge(sys.argv[2], sys.argv[4:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--runs", type=int, default=1,
                    help="separate runs (fresh servers each); the summary gives their medians")
    ap.add_argument("--json", nargs="?", const="-", metavar="PATH",
                    help="write the result as JSON to PATH (default: print it)")
    ap.add_argument("--store", choices=["sqlite", "zk"], default="sqlite",
                    help="locstatus's own store: a SQLite file (the default store), or the "
                    "same ZooKeeper under /locstatus")
    ap.add_argument("--in-process", action="store_true",
                    help="run the bridge in this process (locstatus.bridge.Bridge) instead of "
                    "as `locstatus bridge backbeat` in its own; --trace then times each stage")
    ap.add_argument("--trace", action="store_true",
                    help="also time the processor's write and the CPU per site; with "
                    "--in-process each stage of the bridged path (see STAGES)")
    args = ap.parse_args()
    runs = []
    for _ in range(args.runs):
        runs.append(measure(args.store, args.rounds, Trace() if args.trace else None,
                            in_process=args.in_process))
        if args.json != "-":
            show(runs[-1])
    result = runs[0] if len(runs) == 1 else summary(runs)
    if args.json == "-":
        print(json.dumps(result, indent=2))
    elif args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    if len(runs) > 1 and args.json != "-":
        print(f"median of {len(runs)} runs: p99 ratio {result['p99_ratio']}x (runs "
              f"{result['p99_ratios']}; target <= 2x), p50 ratio {result['p50_ratio']}x; "
              f"locstatus p99 {result['locstatus']['p99_ms']} ms, raw p99 "
              f"{result['raw']['p99_ms']} ms")
    return 0


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The medians of several runs (each run's figures under ``runs``)."""
    med = lambda xs: round(statistics.median(xs), 2)  # noqa: E731
    out: dict[str, Any] = {"sites": SITES, "rounds": runs[0]["rounds"],
                           "store": runs[0]["store"], "bridge": runs[0]["bridge"], "runs": runs,
                           "p99_ratios": [r["p99_ratio"] for r in runs],
                           "p99_ratio": med([r["p99_ratio"] for r in runs]),
                           "p50_ratio": med([r["p50_ratio"] for r in runs])}
    for name in ("locstatus", "raw"):
        out[name] = {k: med([r[name][k] for r in runs]) for k in ("p50_ms", "p99_ms", "max_ms")}
        out[name]["n"] = sum(r[name]["n"] for r in runs)
    return out


def show(result: dict[str, Any]) -> None:
    for name in ("locstatus", "raw"):
        st = result[name]
        print(f"{name:9s} n={st['n']} p50 {st['p50_ms']} ms  p99 {st['p99_ms']} ms  "
              f"max {st['max_ms']} ms")
    print(f"bridge {result['bridge']}: p99 ratio {result['p99_ratio']}x (target <= 2x), p50 ratio "
          f"{result['p50_ratio']}x; load average {result['loadavg_start'][0]:.2f} at start, "
          f"{result['loadavg_end'][0]:.2f} at end")
    for name in ("trace", "trace_raw"):
        for stage, st in result.get(name, {}).items():
            print(f"{name[6:] or 'ls':3s}  {stage:9s} at p50 {st['p50_ms']} p99 {st['p99_ms']} "
                  f"ms;  step p50 {st['step_p50_ms']} p99 {st['step_p99_ms']} ms  (n={st['n']})")
    if "trace_calls_per_site" in result:
        print(f"calls per site (pause phase): {result['trace_calls_per_site']}; this "
              f"process's CPU ms per site: {result['trace_cpu_ms_per_site']}")
    if "trace_bridge_cpu_ms_per_site" in result:
        print("the bridge process's CPU ms per site (pause phases): "
              f"{result['trace_bridge_cpu_ms_per_site']}")


if __name__ == "__main__":
    sys.exit(main())
