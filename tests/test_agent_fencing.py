"""Self-fencing (docs/agent.md "Self-fencing"): a worker that cannot renew its lease stops
what it runs before anybody may settle without it, acknowledges nothing while fenced, and
re-applies the real state once its lease is back.

- every backend kit, in-process: the renewals are refused (the rest of the backend answers),
  so the test can see the fence come before the lease deadline the backend holds, the pause
  settle without the fenced worker only after that deadline, and nothing acknowledged;
- real faults: the MongoDB server frozen with SIGSTOP, the SQLite database locked by another
  connection (unwritable) or its disk full (a small tmpfs), and the ZooKeeper connection cut through the suite's TCP proxy long
  enough for the server to expire the session (the fence must come before the ephemeral
  registration disappears; after the lost session, on_remove runs for a location removed and
  purged meanwhile).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from locstatus import BackendUnavailable, Client, State, connect
from locstatus.agent import Agent, HandlerRetry
from locstatus.models import WorkerInfo

from support.agent_worker import Partition
from support.fulldisk import SmallDisk
from support.kits import Kit
from support.kits_mongo import fresh_database, kit_url
from support.kits_zk import TcpProxy, zk_url
from support.servers import start_mongo

LOC = "us-east-1"
OTHER = "eu-west-1"
SVC = "replication"


def eventually(check: Callable[[], Any], timeout: float = 30.0, every: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last: {value!r})")
        time.sleep(every)


@dataclass(frozen=True)
class Call:
    event: str
    location: str
    fenced: bool
    t: float  # time.monotonic()


class Recorder:
    """Registers on_pause/on_resume/on_remove handlers on an agent and records each call."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.calls: list[Call] = []
        self._lock = threading.Lock()
        agent.on_pause(SVC)(self._handler("pause"))
        agent.on_resume(SVC)(self._handler("resume"))
        agent.on_remove(self._handler("remove"))

    def _handler(self, event: str) -> Callable[[str], None]:
        def run(location: str) -> None:
            with self._lock:
                self.calls.append(Call(event, location, self.agent.fencing, time.monotonic()))

        return run

    def fences(self) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.fenced]

    def after(self, t: float) -> list[tuple[str, str, bool]]:
        with self._lock:
            return [(c.event, c.location, c.fenced) for c in self.calls if c.t > t]


@pytest.fixture
def agents() -> Iterator[list[Agent]]:
    started: list[Agent] = []
    yield started
    for a in started:
        a.stop(timeout=2)


def acked(mgr: Client, worker: str, location: str = LOC) -> int | None:
    return mgr.backend.acks(location).get(worker, {}).get(SVC)


class RenewalsRefused(Partition):
    """The real backend; while :meth:`cut`, only the lease renewals (put_worker, ping) fail:
    reads, acknowledgements and hints go on (a registration the store refuses, the
    heartbeat's own connection stuck)."""

    def _check(self) -> None:
        pass

    def put_worker(self, info: WorkerInfo) -> None:
        if self._cut.is_set():
            raise BackendUnavailable("registration refused (test fault injector)")
        self.inner.put_worker(info)

    def ping(self) -> None:
        if self._cut.is_set():
            raise BackendUnavailable("ping refused (test fault injector)")
        self.inner.ping()


class RenewalsHeld(Partition):
    """The real backend; while :meth:`cut`, lease renewals (put_worker, ping) hang, and go
    through once healed, each taking ``slow`` seconds more until ``slow_until`` (monotonic): a
    server frozen (SIGSTOP) and thawed, which answers the renewal the worker sent before the
    freeze, then answers slowly while it catches up."""

    slow = 0.0
    slow_until = 0.0

    def _check(self) -> None:
        pass

    def _hold(self) -> None:
        if not self._cut.is_set():
            if time.monotonic() < self.slow_until:
                time.sleep(self.slow)
            return
        while self._cut.is_set():  # sent before the thaw: answered at the thaw
            time.sleep(0.005)

    def put_worker(self, info: WorkerInfo) -> None:
        self._hold()
        self.inner.put_worker(info)

    def ping(self) -> None:
        self._hold()
        self.inner.ping()


# -- every kit ------------------------------------------------------------------------------


def test_a_worker_that_cannot_renew_fences_itself_before_its_lease_lapses(
    kit: Kit, agents: list[Agent]
) -> None:
    """Before: it kept running (never paused, never knew), and once its lease lapsed a pause
    settled while its consumers still ran."""
    mgr = Client(kit.open())
    mgr.sync_locations([LOC, OTHER])
    mgr.pause(OTHER, SVC)  # no worker yet: paused at once; nothing to stop there
    link = RenewalsRefused(kit.open())
    agent = Client(link).agent(
        "w1", services=[SVC], lease_seconds=3, heartbeat_interval=0.5, resync_interval=60
    )
    agents.append(agent)
    rec = Recorder(agent)
    agent.start()
    assert sorted((c.event, c.location) for c in rec.calls) == [("pause", OTHER), ("resume", LOC)]
    link.cut()
    t_cut = time.monotonic()
    (fence,) = eventually(rec.fences, timeout=10)
    assert (fence.event, fence.location) == ("pause", LOC)  # what it ran, and only that
    assert fence.t - t_cut < 3 - 0.5  # before any lease it wrote can lapse
    (info,) = mgr.workers()
    deadline = info.lease_expires_at
    assert agent.metrics()["fenced"] == 1
    if deadline is not None:  # heartbeat backends: fenced while still alive to the others
        assert info.alive(mgr.clock())
    # Fenced: the pause is neither run again nor acknowledged; it settles without the worker
    # once the lease it last wrote has lapsed.
    mgr.pause(LOC, SVC)
    assert mgr.wait_settled(LOC, SVC, timeout=15).services[SVC].state is State.PAUSED
    settle = next(e for e in mgr.history(LOC, limit=5) if e.event == "settle")
    if deadline is not None:
        assert settle.at >= deadline
    assert acked(mgr, "w1") == 0
    assert rec.fences() == [fence]
    t_heal = time.monotonic()
    link.heal()
    eventually(lambda: agent.metrics()["fenced"] == 0, timeout=10)
    eventually(lambda: acked(mgr, "w1") == 1, timeout=10)  # the real state, re-applied
    assert rec.after(t_heal) == [("pause", LOC, False)]
    assert mgr.resume(LOC, SVC, wait=10).services[SVC].state is State.RUNNING
    assert rec.after(t_heal)[-1] == ("resume", LOC, False)


def test_a_renewal_that_lands_late_does_not_bring_the_worker_back_for_a_moment(
    kit: Kit, agents: list[Agent]
) -> None:
    """A new-user review: after a MongoDB server's SIGSTOP/SIGCONT the worker came back
    (on_resume), fenced again within a second (on_fence, on_resume again). The renewal sent
    before the freeze landed after the thaw: the lease it wrote was dated when it was sent, so
    it had a fraction of a second left, and the worker came back on it, then fenced when it
    ran out before the next renewal. A renewal that leaves less than a heartbeat is renewed
    again at once, and the worker comes back on a lease that holds (docs/agent.md)."""
    mgr = Client(kit.open())
    mgr.sync_locations([LOC])
    link = RenewalsHeld(kit.open())
    agent = Client(link).agent(
        "w1", services=[SVC], lease_seconds=3, heartbeat_interval=0.5, resync_interval=60
    )
    agents.append(agent)
    rec = Recorder(agent)
    agent.start()
    assert [(c.event, c.location) for c in rec.calls] == [("resume", LOC)]
    link.cut()  # the renewal sent next hangs
    eventually(rec.fences, timeout=10)
    link.slow, link.slow_until = 0.7, time.monotonic() + 2.0  # the thawed server catching up
    link.heal()  # ... and the held renewal lands now, its lease nearly over
    t_heal = time.monotonic()
    eventually(lambda: agent.metrics()["fenced"] == 0, timeout=10)
    time.sleep(3.0)  # a lease and more: a second fence would have come by now
    assert agent.metrics()["fences"] == 1, [(c.event, c.fenced, c.t - t_heal) for c in rec.calls]
    assert rec.after(t_heal) == [("resume", LOC, False)]
    assert mgr.pause(LOC, SVC, wait=10).services[SVC].state is State.PAUSED


def test_on_fence_runs_instead_of_on_pause_when_registered(
    kit: Kit, agents: list[Agent]
) -> None:
    mgr = Client(kit.open())
    mgr.sync_locations([LOC])
    link = RenewalsRefused(kit.open())
    agent = Client(link).agent(
        "w1", services=[SVC], lease_seconds=3, heartbeat_interval=0.5, fence_margin=1.0
    )
    agents.append(agent)
    calls: list[tuple[str, str, bool]] = []

    def record(event: str) -> Callable[[str], None]:
        def run(location: str) -> None:
            what = agent.applying
            assert what is not None and what.status is not None
            calls.append((event, location, agent.fencing))

        return run

    agent.on_pause(SVC)(record("pause"))
    agent.on_resume(SVC)(record("resume"))
    agent.on_fence(SVC)(record("fence"))
    agent.start()
    link.cut()
    eventually(lambda: ("fence", LOC, True) in calls, timeout=10)
    assert calls == [("resume", LOC, False), ("fence", LOC, True)]
    link.heal()
    eventually(lambda: calls[-1] == ("resume", LOC, False) and len(calls) == 3, timeout=10)
    assert agent.metrics()["fenced"] == 0


class ReadsGated(Partition):
    """:class:`Partition` whose full re-reads (``read_all``) wait while :attr:`reads` is
    clear: a worker whose lease is back but whose re-read of the records has not come back."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.reads = threading.Event()
        self.reads.set()

    def read_all(self) -> Any:
        self._check()
        assert self.reads.wait(30), "the test never opened the gate"
        return self.inner.read_all()


def test_the_fence_lifts_only_once_the_on_resume_under_way_and_its_fence_handler_returned(
    kit: Kit, agents: list[Agent]
) -> None:
    """The protocol model's early_unfence variant (model/README.md), on the real agent: the
    worker fences while an on_resume runs, a pause settles without it once its lease lapsed,
    then a renewal lands while that on_resume still runs. Before: the fence lifted at that
    renewal, so a live, unfenced worker was starting its consumers while the record read
    paused. It comes back only once the on_resume, and then the fence's on_pause, returned."""
    mgr = Client(kit.open())
    mgr.sync_locations([LOC])
    mgr.pause(LOC, SVC)  # no worker yet: paused at once (generation 1)
    link = RenewalsRefused(kit.open())
    agent = Client(link).agent(
        "w1", services=[SVC], lease_seconds=3, heartbeat_interval=0.5, resync_interval=60
    )
    agents.append(agent)
    release = threading.Event()
    calls: list[tuple[str, bool]] = []

    @agent.on_pause(SVC)
    def stop(location: str) -> None:
        calls.append(("pause", agent.fencing))

    @agent.on_resume(SVC)
    def start(location: str) -> None:
        calls.append(("resume", agent.fencing))
        assert release.wait(30), "the test never released on_resume"
        calls.append(("resumed", agent.fencing))

    agent.start()
    assert calls == [("pause", False)]
    try:
        mgr.resume(LOC, SVC)  # generation 2: w1's on_resume starts, and waits
        eventually(lambda: ("resume", False) in calls)
        link.cut()
        eventually(lambda: agent.metrics()["fenced"] == 1, timeout=10)
        mgr.pause(LOC, SVC)  # generation 3: settles without w1 once its lease lapsed
        assert mgr.wait_settled(LOC, SVC, timeout=15).services[SVC].state is State.PAUSED
        beats = agent.metrics()["heartbeats"]
        link.heal()
        eventually(lambda: agent.metrics()["heartbeats"] >= beats + 2, timeout=10)
        # the lease is back, the records were read again, but on_resume still runs
        assert agent.metrics()["fenced"] == 1
        assert calls == [("pause", False), ("resume", False)]
    finally:
        release.set()
    eventually(lambda: agent.metrics()["fenced"] == 0, timeout=10)
    eventually(lambda: acked(mgr, "w1") == 3, timeout=10)
    assert calls == [
        ("pause", False),
        ("resume", False),
        ("resumed", False),
        ("pause", True),  # the fence stops what the on_resume started ...
        ("pause", False),  # ... then the real state, paused, is applied and acknowledged
    ]
    assert mgr.status(LOC).services[SVC].state is State.PAUSED


def test_the_fence_lifts_only_once_the_records_were_read_again_after_the_lease_came_back(
    kit: Kit, agents: list[Agent]
) -> None:
    """Cut off (its hints lost too), the worker fences; its fence handler is still running
    when the link and the lease come back, and returns before the agent has read the records
    again. Before: the fence had lifted at the renewal, so the agent applied the state it had
    read before the cut (running) and started on_resume while the pause that settled without
    it read paused. It comes back only once a re-read after the lease came back completed."""
    mgr = Client(kit.open())
    mgr.sync_locations([LOC])
    link = ReadsGated(kit.open())
    agent = Client(link).agent(
        "w1", services=[SVC], lease_seconds=3, heartbeat_interval=0.5, resync_interval=60
    )
    agents.append(agent)
    fence_release = threading.Event()
    calls: list[str] = []
    agent.on_pause(SVC)(lambda location: calls.append("pause"))
    agent.on_resume(SVC)(lambda location: calls.append("resume"))

    @agent.on_fence(SVC)
    def fence(location: str) -> None:
        calls.append("fence")
        assert fence_release.wait(30), "the test never released the fence handler"

    agent.start()
    assert calls == ["resume"]
    eventually(lambda: agent.metrics()["resyncs"] >= 2)  # the early re-read after start
    try:
        link.cut()
        eventually(lambda: calls == ["resume", "fence"], timeout=10)
        mgr.pause(LOC, SVC)  # settles without w1 once its lease lapsed
        assert mgr.wait_settled(LOC, SVC, timeout=15).services[SVC].state is State.PAUSED
        link.reads.clear()  # the re-read after the cut will wait
        beats = agent.metrics()["heartbeats"]
        link.heal()
        eventually(lambda: agent.metrics()["heartbeats"] >= beats + 2, timeout=10)
        fence_release.set()  # the fence handler returns; the records are not read yet
        eventually(lambda: agent.metrics()["running"] == 0)
        time.sleep(0.3)
        assert calls == ["resume", "fence"]  # nothing started from what it read before
        assert agent.metrics()["fenced"] == 1
    finally:
        fence_release.set()
        link.reads.set()
    eventually(lambda: agent.metrics()["fenced"] == 0, timeout=10)
    eventually(lambda: acked(mgr, "w1") == 1, timeout=10)
    assert calls == ["resume", "fence", "pause"]


def test_the_fence_lifts_only_once_a_location_removed_meanwhile_ran_its_on_remove(
    kit: Kit, agents: list[Agent]
) -> None:
    """The hostile review's freeze across a removal: the worker fenced while running a
    location; before its fence handler stopped it, the location was removed, purged, created
    again and paused (settled without the worker once its lease lapsed). Before: finding the
    location gone dropped its keys from the fence as soon as its on_remove was queued, so the
    fence lifted at the next renewal while the old location's consumers still ran (its fence
    handler and on_remove came after): a live, unfenced worker running where the record read
    paused. It comes back only once its on_remove returned, then applies the new pause."""
    mgr = Client(kit.open())
    mgr.sync_locations([LOC])
    link = RenewalsRefused(kit.open())
    agent = Client(link).agent(
        "w1", services=[SVC], lease_seconds=3, heartbeat_interval=0.5, resync_interval=60
    )
    agents.append(agent)
    release = threading.Event()
    calls: list[tuple[str, int]] = []  # (event, the fenced gauge when it ran)

    def fenced() -> int:
        return agent.metrics()["fenced"]

    agent.on_pause(SVC)(lambda location: calls.append(("pause", fenced())))
    agent.on_resume(SVC)(lambda location: calls.append(("resume", fenced())))
    agent.on_remove(lambda location: calls.append(("remove", fenced())))

    @agent.on_fence(SVC)
    def fence(location: str) -> None:
        calls.append(("fence", fenced()))
        assert release.wait(30), "the test never released the fence handler"

    agent.start()
    assert calls == [("resume", 0)]
    try:
        link.cut()
        eventually(lambda: calls == [("resume", 0), ("fence", 1)], timeout=10)
        mgr.remove_location(LOC)
        mgr.purge_location(LOC, mgr.backend.read(LOC).version)
        mgr.add_location(LOC)  # a new life of the location ...
        mgr.pause(LOC, SVC)  # ... paused: settles without w1 once its lease lapsed
        assert mgr.wait_settled(LOC, SVC, timeout=15).services[SVC].state is State.PAUSED
        resyncs = agent.metrics()["resyncs"]
        link.heal()  # the lease comes back, the records are read again
        eventually(lambda: agent.metrics()["resyncs"] > resyncs, timeout=10)
        time.sleep(0.3)
        # the old location's consumers still run (its fence handler did not return)
        assert agent.metrics()["fenced"] == 1
        assert mgr.status(LOC).services[SVC].state is State.PAUSED
    finally:
        release.set()
    eventually(lambda: agent.metrics()["fenced"] == 0, timeout=10)
    eventually(lambda: acked(mgr, "w1") == 1, timeout=10)  # the new life's pause
    assert calls == [("resume", 0), ("fence", 1), ("remove", 1), ("pause", 0)]


def test_a_fence_waits_for_the_on_remove_still_due_of_a_location_purged_before_it(
    kit: Kit, agents: list[Agent]
) -> None:
    """A location removed and purged while its on_remove fails (retried): its consumers run
    until on_remove returns. Before: a fence imposed meanwhile did not count it (only the keys
    the worker ran), and lifted with those consumers still running."""
    mgr = Client(kit.open())
    mgr.sync_locations([LOC, OTHER])
    link = RenewalsRefused(kit.open())
    agent = Client(link).agent(
        "w1",
        services=[SVC],
        lease_seconds=3,
        heartbeat_interval=0.5,
        resync_interval=60,
        handler_retry=HandlerRetry(base=0.1, cap=0.2),
    )
    agents.append(agent)
    failing = threading.Event()
    failing.set()
    removes: list[tuple[str, int]] = []

    @agent.on_remove
    def remove(location: str) -> None:
        removes.append((location, agent.metrics()["fenced"]))
        if failing.is_set():
            raise RuntimeError("consumers will not close (test)")

    agent.on_resume(SVC)(lambda location: None)
    agent.on_pause(SVC)(lambda location: None)
    agent.start()
    mgr.remove_location(LOC)
    eventually(lambda: len(removes) >= 1)  # its on_remove fails, and is retried
    mgr.purge_location(LOC, mgr.backend.read(LOC).version)
    eventually(lambda: LOC not in agent.locations_seen())
    link.cut()
    eventually(lambda: agent.metrics()["fenced"] == 1, timeout=10)
    resyncs = agent.metrics()["resyncs"]
    link.heal()
    eventually(lambda: agent.metrics()["resyncs"] > resyncs, timeout=10)
    time.sleep(0.5)
    assert agent.metrics()["fenced"] == 1  # LOC's consumers still run
    failing.clear()
    eventually(lambda: agent.metrics()["fenced"] == 0, timeout=10)
    assert removes[-1] == (LOC, 1)  # it returned while fenced; then the fence lifted
    assert not agent.errors()


# -- real faults ------------------------------------------------------------------------------


def _running_worker(url: str, agents: list[Agent], **kw: Any) -> tuple[Client, Agent, Recorder]:
    mgr = connect(url)
    mgr.sync_locations([LOC])
    agent = connect(url).agent("w1", services=[SVC], **kw)
    agents.append(agent)
    rec = Recorder(agent)
    agent.start()
    assert [(c.event, c.location) for c in rec.calls] == [("resume", LOC)]
    return mgr, agent, rec


def test_mongodb_server_stopped_the_worker_fences_then_re_applies(
    tmp_path: Path, agents: list[Agent]
) -> None:
    server = start_mongo(tmp_path / "mongo")
    try:
        assert server.pid is not None, "this test freezes its own server by PID"
        url = kit_url(server, fresh_database())
        mgr, agent, rec = _running_worker(url, agents, lease_seconds=3, heartbeat_interval=0.5)
        os.kill(server.pid, signal.SIGSTOP)
        t_stop = time.monotonic()
        try:
            (fence,) = eventually(rec.fences, timeout=10)
            assert (fence.event, fence.location) == ("pause", LOC)
            # its last renewal was sent at most a heartbeat before the freeze
            assert fence.t - t_stop < 3 - 0.5
        finally:
            os.kill(server.pid, signal.SIGCONT)
        t_cont = time.monotonic()
        eventually(lambda: agent.metrics()["fenced"] == 0)
        eventually(lambda: rec.after(t_cont) == [("resume", LOC, False)])
        assert mgr.pause(LOC, SVC, wait=15).services[SVC].state is State.PAUSED
        assert acked(mgr, "w1") == 1
    finally:
        for a in agents:
            a.stop(timeout=2)
        agents.clear()
        server.close()


def test_sqlite_database_locked_the_worker_fences_then_re_applies(
    tmp_path: Path, agents: list[Agent]
) -> None:
    """Another connection holds the write lock: the worker's renewal waits (busy timeout)
    and cannot land."""
    path = tmp_path / "locstatus.db"
    url = f"sqlite:///{path}"
    mgr, agent, rec = _running_worker(url, agents, lease_seconds=3, heartbeat_interval=0.5)
    lock = sqlite3.connect(path, isolation_level=None, timeout=30)
    lock.execute("BEGIN IMMEDIATE")
    t_lock = time.monotonic()
    try:
        (fence,) = eventually(rec.fences, timeout=10)
        assert (fence.event, fence.location) == ("pause", LOC)
        assert fence.t - t_lock < 3 - 0.5
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    t_free = time.monotonic()
    eventually(lambda: agent.metrics()["fenced"] == 0)
    eventually(lambda: rec.after(t_free) == [("resume", LOC, False)])
    assert mgr.pause(LOC, SVC, wait=15).services[SVC].state is State.PAUSED
    assert acked(mgr, "w1") == 1


def test_sqlite_disk_full_the_worker_fences_then_re_applies_once_space_is_back(
    small_disk: SmallDisk, agents: list[Agent]
) -> None:
    """The store's disk fills up for real (a tmpfs): every renewal fails with BackendFull."""
    db = small_disk.path / "locstatus.db"
    mgr, agent, rec = _running_worker(
        f"sqlite:///{db}", agents, lease_seconds=3, heartbeat_interval=0.5
    )
    small_disk.fill(sqlite_db=db)
    t_full = time.monotonic()
    try:
        (fence,) = eventually(rec.fences, timeout=10)
        assert (fence.event, fence.location) == ("pause", LOC)
        assert fence.t - t_full < 3 - 0.5
        assert agent.metrics()["heartbeat_errors"] >= 1
    finally:
        small_disk.free()
    t_free = time.monotonic()
    eventually(lambda: agent.metrics()["fenced"] == 0)
    eventually(lambda: rec.after(t_free) == [("resume", LOC, False)])
    assert mgr.pause(LOC, SVC, wait=15).services[SVC].state is State.PAUSED
    assert acked(mgr, "w1") == 1


def test_zookeeper_connection_cut_fences_before_the_session_expires(
    zk_server: Any, agents: list[Agent]
) -> None:
    """The worker's connection goes through a TCP proxy that is frozen: to the server the
    client falls silent and its session (4 s) expires, removing the registration. The worker
    must have stopped what it runs before that. When the connection comes back (a new
    session: LOST), it re-applies the state it finds, and runs on_remove for a location it
    applied that was removed and purged meanwhile."""
    proxy = TcpProxy(zk_server.hosts)
    try:
        chroot = f"/fence-{os.getpid()}-{time.monotonic_ns()}"
        mgr = connect(zk_url(zk_server.hosts, chroot))
        mgr.sync_locations([LOC, OTHER])
        agent = connect(zk_url(proxy.hosts, chroot, session_timeout=4, timeout=20)).agent(
            "w1", services=[SVC]
        )
        agents.append(agent)
        rec = Recorder(agent)
        agent.start()
        assert [w.worker_id for w in mgr.workers()] == ["w1"]
        proxy.freeze()
        t_cut = time.monotonic()
        gone = eventually(
            lambda: time.monotonic() if not mgr.workers() else None, timeout=30, every=0.05
        )
        fences = rec.fences()
        assert sorted((c.event, c.location) for c in fences) == [("pause", OTHER), ("pause", LOC)]
        assert all(c.t < gone for c in fences), (t_cut, gone, fences)  # fenced, then expired
        mgr.pause(LOC, SVC)
        assert mgr.wait_settled(LOC, SVC, timeout=10).services[SVC].state is State.PAUSED
        mgr.sync_locations([LOC])  # OTHER removed ...
        mgr.purge_location(OTHER, mgr.backend.read(OTHER).version)  # ... and purged
        t_thaw = time.monotonic()
        proxy.thaw()
        eventually(lambda: [w.worker_id for w in mgr.workers()] == ["w1"])
        eventually(lambda: agent.metrics()["fenced"] == 0)
        eventually(lambda: acked(mgr, "w1") == 1)
        assert agent.metrics()["sessions_lost"] >= 1
        eventually(lambda: ("remove", OTHER, False) in rec.after(t_thaw))
        assert ("pause", LOC, False) in rec.after(t_thaw)
        assert mgr.resume(LOC, SVC, wait=15).services[SVC].state is State.RUNNING
    finally:
        for a in agents:
            a.stop(timeout=2)
        agents.clear()
        proxy.close()


def _is_paused_while_cut(proxy: TcpProxy, mgr: Client, agent: Agent) -> None:
    """With ``agent`` running LOC through ``proxy``: freeze the proxy; the worker fences, and
    from then on is_paused answers True (a worker loop following docs/agent.md stops), while a
    pause settles without it; once the link is back, the real state decides."""
    assert agent.is_paused(LOC, SVC) is False
    proxy.freeze()
    try:
        eventually(lambda: agent.metrics()["fenced"] == 1, timeout=20)
        assert agent.state(LOC, SVC) is State.RUNNING  # the record as last read ...
        assert agent.is_paused(LOC, SVC) is True  # ... but the worker must not work
        assert agent.fenced is True
        mgr.pause(LOC, SVC)
        assert mgr.wait_settled(LOC, SVC, timeout=20).services[SVC].state is State.PAUSED
        assert agent.is_paused(LOC, SVC) is True  # it never heard of the pause
    finally:
        proxy.thaw()
    eventually(lambda: agent.metrics()["fenced"] == 0, timeout=30)
    assert agent.fenced is False
    assert agent.is_paused(LOC, SVC) is True  # paused for real now
    assert mgr.resume(LOC, SVC, wait=20).services[SVC].state is State.RUNNING
    assert agent.is_paused(LOC, SVC) is False


def test_is_paused_is_true_while_fenced_on_a_mongodb_connection_cut(
    mongo_server: Any, agents: list[Agent]
) -> None:
    """Before: is_paused answered from the local copy alone, so a worker cut off from the
    store went on working while fenced, and while the store said paused."""
    proxy = TcpProxy(f"127.0.0.1:{mongo_server.port}", frames=False)
    try:
        db = fresh_database()
        mgr = connect(kit_url(mongo_server, db))
        mgr.sync_locations([LOC])
        via = kit_url(
            mongo_server,
            db,
            directConnection="true",
            serverSelectionTimeoutMS="2000",
            socketTimeoutMS="1000",
        )
        via = via.replace(f":{mongo_server.port}/", f":{proxy.port}/", 1)
        agent = connect(via).agent("w1", services=[SVC], lease_seconds=3, heartbeat_interval=0.5)
        agents.append(agent)
        Recorder(agent)
        agent.start()
        _is_paused_while_cut(proxy, mgr, agent)
    finally:
        for a in agents:
            a.stop(timeout=2)
        agents.clear()
        proxy.close()


def test_is_paused_is_true_while_fenced_on_a_zookeeper_connection_cut(
    zk_server: Any, agents: list[Agent]
) -> None:
    proxy = TcpProxy(zk_server.hosts)
    try:
        chroot = f"/ispaused-{os.getpid()}-{time.monotonic_ns()}"
        mgr = connect(zk_url(zk_server.hosts, chroot))
        mgr.sync_locations([LOC])
        agent = connect(zk_url(proxy.hosts, chroot, session_timeout=4, timeout=20)).agent(
            "w1", services=[SVC]
        )
        agents.append(agent)
        Recorder(agent)
        agent.start()
        _is_paused_while_cut(proxy, mgr, agent)
    finally:
        for a in agents:
            a.stop(timeout=2)
        agents.clear()
        proxy.close()
