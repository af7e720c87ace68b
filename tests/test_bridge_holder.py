"""Two Backbeat bridges on one configuration: one publishes (docs/backbeat.md, "2. The
bridge", One bridge publishes). Real parts: ``locstatus bridge backbeat`` subprocesses on
SQLite, ZooKeeper and MongoDB-wire stores, Redis (Debian's redis-server), ZooKeeper, and the Node.js stand-in for Backbeat's queue
processor (tests/node/legacy_processor.js). Each bridge talks to Redis on its own database
number (Pub/Sub ignores it), so Redis's ``MONITOR`` tells whose ``PUBLISH`` each one is.

Before the fix both bridges published, and the processor, applying their orders at once, could
leave its state node disagreeing with its consumer (its read-then-write chains interleave).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from locstatus import State, connect
from locstatus.client import Client

from support.kits_mongo import fresh_database, kit_url
from support.kits_zk import raw_client, zk_url
from support.legacy_processor import LegacyProcessor
from support.redis_server import RedisServer, redis_server  # noqa: F401  (a fixture)

SITES = ["zenko", "aws-location"]
LEASE = 3.0
"""The bridges' lease (``LOCSTATUS_LEASE_SECONDS``); ZooKeeper's session timeout is
:data:`SESSION` (its lease there)."""
SESSION = 4.0


PUBLISH_LINE = re.compile(r'^[\d.]+ \[(\d+) [^\]]*\] "publish" "([^"]+)" "(.*)"$', re.I)
"""A ``MONITOR`` line of a ``PUBLISH``: database, channel, message (escaped)."""


class Monitor:
    """Redis ``MONITOR`` in a thread: every ``PUBLISH`` seen, with the database number of the
    connection that sent it."""

    def __init__(self, url: str) -> None:
        self._redis = redis.Redis.from_url(url, socket_timeout=3600)  # a quiet spell is no end
        self.publishes: list[tuple[int, str, str]] = []  # (db, channel, message)
        self._lock = threading.Lock()
        self._monitor = self._redis.monitor().__enter__()
        self._closing = False
        self.failure: str | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        conn = self._monitor.connection
        while not self._closing:
            try:
                line = conn.read_response()
            except Exception as exc:  # reported by by_db, unless closing
                self.failure = None if self._closing else repr(exc)
                return
            text = line.decode(errors="replace") if isinstance(line, bytes) else str(line)
            m = PUBLISH_LINE.match(text)
            if m is not None:
                with self._lock:
                    self.publishes.append((int(m[1]), m[2], m[3]))

    def mark(self) -> int:
        with self._lock:
            return len(self.publishes)

    def by_db(self, since: int = 0) -> dict[int, int]:
        assert self.failure is None, f"MONITOR stopped: {self.failure}"
        with self._lock:
            out: dict[int, int] = {}
            for db, _ch, _msg in self.publishes[since:]:
                out[db] = out.get(db, 0) + 1
            return out

    def close(self) -> None:
        self._closing = True
        self._monitor.__exit__()
        self._redis.close()


@dataclass
class Deployment:
    url: str
    zk_hosts: str
    redis: RedisServer
    mgr: Client
    logs: Path
    procs: list[subprocess.Popen[bytes]]

    def bridge(self, db: int, ack_wait: float = 1,
               wrap: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
        """``locstatus bridge backbeat`` on the store, talking to Redis on database ``db``,
        run under the command ``wrap`` (none: directly)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOCSTATUS_")}
        env["LOCSTATUS_LEASE_SECONDS"] = str(LEASE)
        err = open(self.logs / f"bridge-{db}.log", "ab")  # noqa: SIM115 - the child's stderr
        proc = subprocess.Popen(
            [*wrap, sys.executable, "-m", "locstatus", "--backend", self.url, "bridge", "backbeat",
             "--zookeeper", self.zk_hosts, "--redis", f"{self.redis.url}/{db}",
             "--service", "replication", "--ack-wait", str(ack_wait),
             "--republish-interval", "0.3"],
            stdout=subprocess.DEVNULL, stderr=err, env=env)
        err.close()
        self.procs.append(proc)
        return proc

    def log(self, db: int) -> str:
        return (self.logs / f"bridge-{db}.log").read_text(errors="replace")

    def holders(self) -> set[int]:
        """The pids holding the processors' registrations (present holders only)."""
        return {w.pid for w in self.mgr.worker_statuses().workers
                if w.worker_id.startswith("backbeat.replication.") and not w.away}

    def holder_and_second(self) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
        """Bridge 1 started and holding every registration, then bridge 2 started (it said
        whether it bridges or stands by)."""
        first = self.bridge(1)
        self.wait_held_by(first)
        second = self.bridge(2)
        self.wait_started(2, second)
        return first, second

    def wait_started(self, n: int, proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
        """Wait until bridge ``n`` said whether it bridges or stands by (alive meanwhile)."""
        deadline = time.monotonic() + timeout
        while not ("standing by" in self.log(n) or "bridging" in self.log(n)):
            assert proc.poll() is None and time.monotonic() < deadline, self.log(n)
            time.sleep(0.1)

    def wait_held_by(self, proc: subprocess.Popen[bytes], timeout: float = 30) -> float:
        """Wait until every processor's registration is held by ``proc``; the seconds it took."""
        start = time.monotonic()
        while True:
            views = [w for w in self.mgr.worker_statuses().workers
                     if w.worker_id.startswith("backbeat.replication.")]
            if len(views) == len(SITES) and all(w.pid == proc.pid and not w.away
                                                for w in views):
                return time.monotonic() - start
            for p in self.procs:
                assert p.poll() is None or p.returncode == -signal.SIGKILL, p.args
            assert time.monotonic() - start < timeout, [(w.worker_id, w.pid, w.away)
                                                        for w in views]
            time.sleep(0.1)

    def state(self, loc: str) -> State:
        return self.mgr.status(loc).services["replication"].state

    def wait_state(self, loc: str, state: State, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while self.state(loc) is not state:
            assert time.monotonic() < deadline, (loc, self.state(loc))
            time.sleep(0.02)


@pytest.fixture(params=["sqlite", "zookeeper", "mongodb"])
def deployment(request: pytest.FixtureRequest, tmp_path: Path, zk_server: Any,
               redis_server: RedisServer) -> Iterator[Deployment]:  # noqa: F811
    chroot = f"/bb-{uuid.uuid4().hex[:10]}"
    with raw_client(zk_server.hosts) as root:
        root.create(chroot)
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/ls.db"
    elif request.param == "zookeeper":
        url = zk_url(zk_server.hosts, session_timeout=SESSION)
    else:
        url = kit_url(request.getfixturevalue("mongo_server"), fresh_database())
    mgr = connect(url)
    mgr.sync_locations({s: ["replication"] for s in SITES})
    dep = Deployment(url, f"{zk_server.hosts}{chroot}", redis_server, mgr, tmp_path, [])
    try:
        yield dep
    finally:
        for p in dep.procs:
            if p.poll() is None:
                p.kill()
                p.wait(30)
        mgr.close()


def node_paused(dep: Deployment, site: str) -> bool:
    with raw_client(dep.zk_hosts) as zk:
        data, _ = zk.get(f"/backbeat/replication/state/{site}")
    paused: bool = json.loads(data)["paused"]
    return paused


def consumer_paused(proc: LegacyProcessor, site: str) -> bool:
    """What the processor's consumer does: its last ``paused``/``resumed`` (or ``ready``)."""
    last = [e for e in proc.events if e.get("site") == site
            and e.get("event") in ("paused", "resumed", "ready")][-1]
    return last["event"] == "paused" or (last["event"] == "ready" and bool(last["paused"]))


def cycles(dep: Deployment, n: int) -> None:
    for _ in range(n):
        for loc in SITES:
            dep.mgr.pause(loc, "replication")
        for loc in SITES:
            dep.wait_state(loc, State.PAUSED)
            assert node_paused(dep, loc)
        for loc in SITES:
            dep.mgr.resume(loc, "replication")
        for loc in SITES:
            dep.wait_state(loc, State.RUNNING)


def agree(dep: Deployment, proc: LegacyProcessor) -> None:
    """Node, consumer and locstatus say the same at every site (once the processor is idle)."""
    deadline = time.monotonic() + 10
    while True:
        seen = {loc: (dep.state(loc), node_paused(dep, loc), consumer_paused(proc, loc))
                for loc in SITES}
        if all((s is State.PAUSED) == n == c for s, n, c in seen.values()):
            return
        assert time.monotonic() < deadline, seen
        time.sleep(0.1)


def test_a_second_bridge_stands_by_and_takes_over_once_the_first_is_killed(
    deployment: Deployment,
) -> None:
    """The first bridge publishes, the second one (same configuration) stands by: it says
    which process holds the registrations and publishes nothing; the node and the consumer
    end agreeing. The first one killed (``kill -9``), the second takes the registrations over
    within the lease and a pause made then settles through it."""
    dep = deployment
    monitor = Monitor(dep.redis.url)
    try:
        with LegacyProcessor(dep.zk_hosts, f"127.0.0.1:{dep.redis.port}", SITES) as proc:
            first, second = dep.holder_and_second()
            time.sleep(LEASE)  # its renewals, if it held anything, would show by now
            cycles(dep, 4)
            agree(dep, proc)
            published = monitor.by_db()
            assert published.get(1, 0) >= 4 * len(SITES) and published.get(2, 0) == 0, published
            assert dep.holders() == {first.pid}
            assert f"held by another bridge (host {socket.gethostname()}, pid {first.pid}, " \
                "instance " in dep.log(2), dep.log(2)
            assert "standing by" in dep.log(2)

            first.kill()
            first.wait(30)
            mark = monitor.mark()
            dep.mgr.pause("zenko", "replication")
            took = dep.wait_held_by(second, timeout=LEASE + SESSION + 10)
            assert took <= max(LEASE, SESSION) + 3, took  # within the lease (and a tick)
            dep.wait_state("zenko", State.PAUSED)
            dep.mgr.resume("zenko", "replication")
            dep.wait_state("zenko", State.RUNNING)
            agree(dep, proc)
            after = monitor.by_db(mark)
            assert after.get(2, 0) > 0 and after.get(1, 0) == 0, after
            assert "taking its registrations over" in dep.log(2), dep.log(2)
    finally:
        monitor.close()


STOOD_BY = ("stops publishing and stands by", "standing by, publishing nothing")
"""What a bridge's log says once it stood by (the one that keeps the registrations logs "ranks
first and keeps them")."""


def test_two_bridges_started_at_once_end_with_one_publishing(deployment: Deployment) -> None:
    """Two bridges started in the same instant may both register: they settle on one (the
    same order on both sides), the other stops publishing and says so; from then on only one
    publishes, and the node and the consumer agree."""
    dep = deployment
    monitor = Monitor(dep.redis.url)
    try:
        with LegacyProcessor(dep.zk_hosts, f"127.0.0.1:{dep.redis.port}", SITES) as proc:
            bridges = {1: dep.bridge(1), 2: dep.bridge(2)}
            deadline = time.monotonic() + 30
            while len(dep.holders()) != 1 or not all(
                "bridging" in dep.log(db) or "standing by" in dep.log(db) for db in bridges
            ):
                assert time.monotonic() < deadline, (dep.holders(), dep.log(1), dep.log(2))
                time.sleep(0.1)
            time.sleep(LEASE)  # a renewal of the loser, if it still ran, would show now
            # the loser is the one that says so (the registrations alone can still name it for
            # a moment: it may have written them last before it looked, 1 run in a full suite)
            def stood_by(db: int) -> bool:
                return any(says in dep.log(db) for says in STOOD_BY)

            while not any(stood_by(db) for db in bridges):
                assert time.monotonic() < deadline, (dep.holders(), dep.log(1), dep.log(2))
                time.sleep(0.1)
            loser = next(db for db in bridges if stood_by(db))
            winner = 3 - loser
            holder = bridges[winner].pid
            dep.wait_held_by(bridges[winner])
            mark = monitor.mark()
            cycles(dep, 4)
            agree(dep, proc)
            published = monitor.by_db(mark)
            assert published.get(winner, 0) >= 4 * len(SITES), published
            assert published.get(loser, 0) == 0, published
            assert dep.holders() == {holder}
            assert "held by another bridge" in dep.log(loser), dep.log(loser)
    finally:
        monitor.close()


PID_NAMESPACE = ("unshare", "--pid", "--fork", "--mount-proc", "--kill-child")
"""Run a command as pid 1 of a new pid namespace (util-linux ``unshare``, as root), on this
host name: what two containers with a fixed host name (or the host's network) do."""


def pid_namespaces() -> bool:
    try:
        return subprocess.run([*PID_NAMESPACE, "true"], capture_output=True,
                              timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_two_bridges_of_one_host_name_and_pid_end_with_one_publishing(
    deployment: Deployment,
) -> None:
    """Each bridge pid 1 in its own pid namespace on one host name: the second stands by,
    naming the first, and only the first publishes. Before the instance id each read the
    other's registrations as its own: both bridged, and one pause reached the processor as
    ``pauseService``, ``resumeService``, ``pauseService`` x3. Skipped only where ``unshare``
    cannot make a pid namespace (not root, or no util-linux)."""
    if not pid_namespaces():
        pytest.skip("unshare --pid --fork --mount-proc is unavailable here (needs root)")
    dep = deployment
    monitor = Monitor(dep.redis.url)
    try:
        with LegacyProcessor(dep.zk_hosts, f"127.0.0.1:{dep.redis.port}", SITES) as proc:
            first = dep.bridge(1, wrap=PID_NAMESPACE)
            dep.wait_started(1, first)
            deadline = time.monotonic() + 30
            while dep.holders() != {1} or len(dep.mgr.worker_statuses().workers) < len(SITES):
                assert time.monotonic() < deadline, dep.log(1)
                time.sleep(0.1)
            second = dep.bridge(2, wrap=PID_NAMESPACE)
            dep.wait_started(2, second)
            time.sleep(LEASE)  # a renewal of the second, if it bridged, would show now
            mark = monitor.mark()
            cycles(dep, 4)
            agree(dep, proc)
            published = monitor.by_db(mark)
            assert published.get(1, 0) >= 4 * len(SITES) and published.get(2, 0) == 0, \
                published
            assert "standing by" in dep.log(2) and "bridging" not in dep.log(2), dep.log(2)
            assert "held by another bridge (host " in dep.log(2), dep.log(2)
            instances = {w.instance for w in dep.mgr.worker_statuses().workers}
            assert len(instances) == 1 and None not in instances, instances
    finally:
        monitor.close()


def test_a_bridge_frozen_past_its_lease_and_back_leaves_one_publishing(
    deployment: Deployment,
) -> None:
    """The publishing bridge frozen (SIGSTOP) past its lease: the standby takes over. Thawed,
    the first one runs again believing it holds its registrations (on ZooKeeper its new
    session even writes them back): both run at once, and they settle on one, the other
    saying so; from then on only one publishes and the node and the consumer agree."""
    dep = deployment
    monitor = Monitor(dep.redis.url)
    try:
        with LegacyProcessor(dep.zk_hosts, f"127.0.0.1:{dep.redis.port}", SITES) as proc:
            first, second = dep.holder_and_second()
            first.send_signal(signal.SIGSTOP)
            try:
                dep.wait_held_by(second, timeout=LEASE + SESSION + 10)
            finally:
                first.send_signal(signal.SIGCONT)
            time.sleep(2 * LEASE)  # both ran at once meanwhile; they had time to settle
            mark = monitor.mark()
            cycles(dep, 3)
            agree(dep, proc)
            published = monitor.by_db(mark)
            assert len(published) == 1, published  # one bridge published, whichever it was
            (winner,) = published
            assert published[winner] >= 3 * len(SITES), published
            loser = 3 - winner
            assert dep.holders() == {(first if winner == 1 else second).pid}
            assert "stops publishing and stands by" in dep.log(loser), dep.log(loser)
    finally:
        monitor.close()


@pytest.mark.parametrize("deployment", ["zookeeper"], indirect=True)
def test_a_bridge_that_steps_down_ends_its_handlers_still_running(
    deployment: Deployment,
) -> None:
    """Two bridges running at once (the holder frozen past its lease while the standby took
    over, then thawed), with pause handlers publishing again and again (the processor is
    down: nobody receives the order): the one that steps down publishes nothing from then
    on. Before the fix (eedc903) its handlers kept publishing until their ack-wait ended
    (here 20 s), over the other bridge's orders: a hostile review saw a stepped-down bridge's
    resume restart a consumer under the other bridge's settled pause."""
    dep = deployment
    monitor = Monitor(dep.redis.url)
    proc = LegacyProcessor(dep.zk_hosts, f"127.0.0.1:{dep.redis.port}", SITES).start()
    try:
        first = dep.bridge(1, ack_wait=20)
        dep.wait_held_by(first)
        second = dep.bridge(2, ack_wait=20)
        dep.wait_started(2, second)
        bridges = {1: first, 2: second}
        proc.kill()  # nobody receives an order: every pause handler keeps publishing
        first.send_signal(signal.SIGSTOP)  # past its lease: the standby takes over
        try:
            dep.wait_held_by(second, timeout=LEASE + SESSION + 10)
            dep.mgr.pause("zenko", "replication")  # the new holder's handler publishes
            time.sleep(1.0)
        finally:
            first.send_signal(signal.SIGCONT)  # both run at once: one steps down
        stepped = "this bridge stops publishing and stands by"
        deadline = time.monotonic() + 30
        while not any(stepped in dep.log(db) for db in bridges):
            assert all(p.poll() is None for p in bridges.values()), (dep.log(1), dep.log(2))
            assert time.monotonic() < deadline, [
                line for db in bridges for line in dep.log(db).splitlines()
                if "handler" not in line]
            time.sleep(0.05)
        loser = next(db for db in bridges if stepped in dep.log(db))
        time.sleep(0.2)  # a publish already under way when it stepped down lands
        mark = monitor.mark()
        time.sleep(3.0)  # within the handlers' ack-wait
        after = monitor.by_db(mark)
        assert after.get(loser, 0) == 0, (after, loser)
        assert after.get(3 - loser, 0) > 0, after  # the holder still publishes
        proc.start()
        dep.wait_state("zenko", State.PAUSED)
        agree(dep, proc)
    finally:
        proc.close()
        monitor.close()


def test_a_forced_retire_of_a_running_bridges_registration_lets_no_pause_settle_without_its_processor(
    deployment: Deployment,
) -> None:
    """docs/backbeat.md "2. The bridge", Its registrations while it runs: the processor
    frozen (SIGSTOP, it cannot apply a pause), ``locstatus workers retire --force`` of its
    registration while the bridge runs, and a pause made at once: it stays ``pausing`` (the
    registration is never removed while its holder is present: the forced retirement waits
    for the holder to be away, sees it renew, and is refused with exit 1 naming it); the
    processor thawed, the pause settles through it. (Once, the forced retirement removed it,
    and the pause settled at once, the processor running on: a hostile review, 5/5.)"""
    dep = deployment
    wid = "backbeat.replication.zenko"
    with LegacyProcessor(dep.zk_hosts, f"127.0.0.1:{dep.redis.port}", SITES) as proc:
        bridge = dep.bridge(1)
        dep.wait_held_by(bridge)
        proc.freeze()
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOCSTATUS_")}
        retire = subprocess.Popen(
            [sys.executable, "-m", "locstatus", "--backend", dep.url, "workers", "retire", wid,
             "--force", "--actor", "test"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        with contextlib.suppress(subprocess.TimeoutExpired):
            retire.wait(2)  # before the fix it returned at once, the registration gone
        dep.mgr.pause("zenko", "replication")
        # past the bridge's next renewal (LEASE / 3; ZooKeeper: SESSION / 3), and short of the
        # processor's own ZooKeeper session (10 s: frozen longer, it would expire)
        watch_until = time.monotonic() + 2.5
        while time.monotonic() < watch_until:
            assert dep.state("zenko") is State.PAUSING, "settled without the processor"
            time.sleep(0.05)
        assert not node_paused(dep, "zenko")
        proc.thaw()
        out, err = retire.communicate(timeout=30)
        assert retire.returncode == 1, (retire.returncode, out, err)
        assert f"holder is present (host {socket.gethostname()}, pid {bridge.pid})" in \
            err.decode(), err
        assert dep.holders() == {bridge.pid}
        dep.wait_state("zenko", State.PAUSED)
        assert node_paused(dep, "zenko")
        agree(dep, proc)
