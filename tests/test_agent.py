"""The worker agent (docs/design.md §3.4, §3.5, §5.1): a pause is ``pausing`` until every live worker has
applied it, and every worker converges to the latest state whatever it missed.

Two layers:

- in-process agents on every backend kit (``kit``: memory and SQLite), for the agent's own
  rules: handlers, acknowledgements, retries, tombstones, local reads;
- real worker processes (``tests/support/agent_worker.py``) on every backend reachable from other
  processes (``backend_url``, from ``durable_kit``: SQLite now, the server backends when their
  kits join), frozen with SIGSTOP, killed with SIGKILL, and cut from the backend.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from locstatus import (
    Client,
    HolderPresent,
    InvalidInput,
    Manager,
    NotFound,
    SettleTimeout,
    State,
    connect,
)
from locstatus.agent import UNREGISTER_GRACE, Agent, HandlerRetry
from locstatus.agent.settle import rendezvous
from locstatus.backends import Backend, open_backend
from locstatus.errors import StandingRegistered
from locstatus.instance import process_instance
from locstatus.models import TOMBSTONE_ACK, WorkerInfo, tombstone_generation

from support.agent_worker import Partition
from support.kits import Kit
from support.kits_mongo import fresh_database, kit_url
from support.kits_zk import start_zk, zk_url
from support.servers import start_mongo

LOC = "us-east-1"
SVC = "replication"
WORKER = Path(__file__).parent / "support" / "agent_worker.py"
FAST = {"lease_seconds": 2.0, "handler_retry": HandlerRetry(base=0.05, cap=0.2)}
SCHEDULING = 0.5
"""Seconds for a woken thread to run and its write to land on a loaded 2-core machine."""


def eventually(check: Callable[[], Any], timeout: float = 20.0, every: float = 0.02) -> Any:
    """Poll ``check`` until it returns a truthy value; fail with its last value after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last: {value!r})")
        time.sleep(every)


def svc_state(mgr: Manager, location: str = LOC, service: str = SVC) -> State:
    return mgr.status(location).services[service].state


# -- in-process agents, every backend ---------------------------------------------------------


class Recording(Partition):
    """The real backend, recording every acknowledgement the agent stores (nothing cut)."""

    def __init__(self, inner: Backend) -> None:
        super().__init__(inner)
        self.acked: list[tuple[str, str, str, int]] = []

    def ack(
        self,
        worker_id: str,
        location: str,
        service: str,
        generation: int,
        *,
        if_version: int | None = None,
    ) -> None:
        super().ack(worker_id, location, service, generation, if_version=if_version)
        self.acked.append((worker_id, location, service, generation))


@pytest.fixture
def mgr(kit: Kit) -> Iterator[Manager]:
    m = Client(kit.open())
    m.sync_locations({LOC: ["replication", "lifecycle"], "eu-west-1": ["replication"]})
    yield m


@pytest.fixture
def agents() -> Iterator[list[Agent]]:
    started: list[Agent] = []
    yield started
    for a in started:
        a.stop()


def make_agent(
    mgr: Manager,
    agents: list[Agent],
    worker_id: str,
    calls: list[tuple[str, str, int]] | None = None,
    **kw: Any,
) -> Agent:
    """An agent recording (event, location, generation) of every handler call into ``calls``."""
    opts = {**FAST, **kw}
    agent = mgr.agent(worker_id, **opts)
    if calls is not None:
        for svc in agent.services:
            for event, register in (("pause", agent.on_pause), ("resume", agent.on_resume)):

                @register(svc)
                def record(location: str, event: str = event) -> None:
                    applying = agent.applying
                    assert applying is not None and applying.status is not None
                    calls.append(
                        (event, f"{location}/{applying.service}", applying.status.generation)
                    )

    agents.append(agent)
    return agent


def test_start_applies_the_current_state_and_acknowledges_it(
    mgr: Manager, agents: list[Agent]
) -> None:
    mgr.pause("eu-west-1", SVC)  # no worker yet: settles at once
    calls: list[tuple[str, str, int]] = []
    agent = make_agent(mgr, agents, "w1", calls, services=[SVC]).start()
    # start() returns after the first pass: every watched (location, service) was applied.
    assert sorted(calls) == [
        ("pause", "eu-west-1/replication", 1),
        ("resume", f"{LOC}/replication", 0),
    ]
    assert agent.is_paused("eu-west-1", SVC) and not agent.is_paused(LOC, SVC)
    assert agent.is_paused("eu-west-1", "crr")
    assert agent.observed_generation("eu-west-1", SVC) == 1
    assert mgr.backend.acks("eu-west-1") == {"w1": {SVC: 1}}
    assert mgr.backend.acks(LOC) == {"w1": {SVC: 0}}  # lifecycle is not this worker's
    (info,) = mgr.workers()
    assert (info.worker_id, info.services, info.errors) == ("w1", (SVC,), {})
    # ZooKeeper: the session is the lease (an ephemeral node, no deadline to renew); elsewhere
    # a deadline the heartbeat pushes forward.
    assert (info.lease_expires_at is None) == mgr.backend.session_leases
    assert info.alive(mgr.clock())


def test_a_standing_agent_stopped_keeps_counting_and_a_restarted_one_takes_over(
    mgr: Manager, agents: list[Agent]
) -> None:
    """docs/agent.md "Standing registrations": stop() leaves the registration standing, away
    from then on; a pause made while it is away stays pausing; the same worker id started
    again takes the registration over, applies the pause, acknowledges, and it settles. An
    ordinary agent stopped beside it unregisters as before."""
    calls: list[tuple[str, str, int]] = []
    first = make_agent(mgr, agents, "bb.1", calls, services=[SVC], standing=True).start()
    plain = make_agent(mgr, agents, "plain", services=[SVC]).start()
    assert [(w.worker_id, w.standing) for w in mgr.workers()] == [("bb.1", True), ("plain", False)]
    first.stop()
    plain.stop()
    (left,) = mgr.workers()
    assert left.worker_id == "bb.1" and left.standing
    eventually(lambda: [w.away for w in mgr.worker_statuses().workers] == [True])
    rec = mgr.pause(LOC, SVC)
    time.sleep(0.3)
    assert svc_state(mgr) is State.PAUSING and mgr.lagging(LOC, SVC) == ["bb.1"]
    with pytest.raises(SettleTimeout, match=r"bb\.1 \(standing registration, holder away since"):
        mgr.wait_settled(LOC, SVC, timeout=0.2)
    calls.clear()
    again = make_agent(mgr, agents, "bb.1", calls, services=[SVC], standing=True).start()
    assert mgr.wait_settled(LOC, SVC, timeout=10).services[SVC].state is State.PAUSED
    assert ("pause", f"{LOC}/{SVC}", rec.services[SVC].generation) in calls
    assert [(w.worker_id, w.away) for w in mgr.worker_statuses().workers] == [("bb.1", False)]
    again.stop()
    mgr.retire_worker("bb.1", actor="test")
    assert mgr.workers() == []


def test_a_standing_registration_with_its_holder_running_is_never_retired_and_comes_back_if_removed(
    mgr: Manager, agents: list[Agent]
) -> None:
    """docs/agent.md "Standing registrations": retiring it while its holder runs is refused
    (``HolderPresent``, naming host and pid); forced, the retirement waits for the holder to
    be away and, the holder running on, is refused too, nothing removed (once, it removed it
    and a pause made before the holder's next renewal settled without it). Removed behind its
    back (a hand edit with the backend's own client), the running holder notices at its next
    renewal, registers again and acknowledges again what it applied, so the next pause waits
    for it again."""
    calls: list[tuple[str, str, int]] = []
    make_agent(mgr, agents, "bb.1", calls, services=[SVC], standing=True).start()
    settled = mgr.pause(LOC, SVC, wait=10)
    generation = settled.services[SVC].generation
    before = list(calls)
    with pytest.raises(HolderPresent, match=rf"bb\.1 is a standing registration whose holder "
                       rf"is present \(host {socket.gethostname()}, pid {os.getpid()}\)"):
        mgr.retire_worker("bb.1", actor="ops")
    assert [(w.worker_id, w.instance) for w in mgr.workers()] == [("bb.1", process_instance())]
    with pytest.raises(HolderPresent, match=r"it runs"):
        mgr.retire_worker("bb.1", actor="ops", force=True)
    assert [(w.worker_id, w.away) for w in mgr.worker_statuses().workers] == [("bb.1", False)]
    assert mgr.backend.acks(LOC).get("bb.1", {}).get(SVC) == generation
    assert mgr.backend.remove_worker("bb.1", retire=True)
    eventually(lambda: [(w.worker_id, w.standing, w.away) for w in
                        mgr.worker_statuses().workers] == [("bb.1", True, False)])
    eventually(lambda: mgr.backend.acks(LOC).get("bb.1", {}).get(SVC) == generation)
    assert calls == before  # acknowledged again, not applied again
    calls.clear()
    assert mgr.resume(LOC, SVC, wait=10).services[SVC].state is State.RUNNING
    assert [c[0] for c in calls] == ["resume"]


def test_an_ordinary_agent_of_a_standing_id_is_refused_and_its_stop_leaves_it_standing(
    mgr: Manager, agents: list[Agent]
) -> None:
    """docs/agent.md "Standing registrations": only a retirement ends one. An ordinary agent
    started with the id of a standing registration whose holder is away raises
    StandingRegistered naming ``locstatus workers retire`` and registers nothing; its stop()
    removes nothing; the pause made then waits for the standing registration's holder.
    (Once, it replaced the Backbeat processor's registration, and its stop() unregistered it:
    the next pause settled while the processor still ran.)"""
    held = make_agent(mgr, agents, "bb.1", services=[SVC], standing=True).start()
    held.stop()
    impostor = make_agent(mgr, agents, "bb.1", services=[SVC])
    with pytest.raises(StandingRegistered, match=r"locstatus workers retire bb\.1"):
        impostor.start()
    impostor.stop()
    assert [(w.worker_id, w.standing) for w in mgr.workers()] == [("bb.1", True)]
    mgr.pause(LOC, SVC)
    time.sleep(0.3)
    assert svc_state(mgr) is State.PAUSING and mgr.lagging(LOC, SVC) == ["bb.1"]
    mgr.retire_worker("bb.1", actor="test")
    assert mgr.wait_settled(LOC, SVC, timeout=10).services[SVC].state is State.PAUSED


def test_pause_is_pausing_until_the_worker_applied_it_then_settles(
    mgr: Manager, agents: list[Agent]
) -> None:
    gate = threading.Event()
    agent = make_agent(mgr, agents, "w1", services=[SVC])

    @agent.on_pause(SVC)
    def stop(location: str) -> None:
        gate.wait(10)

    agent.start()
    rec = mgr.pause(LOC, SVC)
    assert rec.services[SVC].state is State.PAUSING
    eventually(lambda: agent.is_paused(LOC, SVC))  # the local copy flips before the handler ends
    time.sleep(0.2)
    assert svc_state(mgr) is State.PAUSING
    assert mgr.lagging(LOC, SVC) == ["w1"]
    gate.set()
    assert mgr.wait_settled(LOC, SVC, timeout=10).services[SVC].state is State.PAUSED
    rec = mgr.resume(LOC, SVC, wait=10)
    assert rec.services[SVC].state is State.RUNNING
    assert agent.observed_generation(LOC, SVC) == 2
    assert not agent.is_paused(LOC, SVC)


def test_is_paused_is_a_local_read(mgr: Manager, agents: list[Agent]) -> None:
    agent = make_agent(mgr, agents, "w1").start()
    mgr.pause(LOC, "lifecycle", wait=10)
    eventually(lambda: agent.state(LOC, "lifecycle") is State.PAUSED)
    n = 20_000
    t0 = time.perf_counter()
    for _ in range(n):
        agent.is_paused(LOC, "lifecycle")
    per_call = (time.perf_counter() - t0) / n
    assert per_call < 50e-6, f"is_paused took {per_call * 1e6:.1f} us"
    with pytest.raises(NotFound):
        agent.is_paused("nowhere", SVC)
    with pytest.raises(NotFound):
        agent.is_paused("eu-west-1", "lifecycle")  # eu-west-1 has no lifecycle
    mgr.backend.close()  # no backend at all: still answered
    assert agent.is_paused(LOC, "lifecycle") and not agent.is_paused(LOC, SVC)


def test_failing_handler_is_retried_visible_and_never_acknowledged(
    mgr: Manager, agents: list[Agent]
) -> None:
    failing = threading.Event()
    failing.set()
    attempts: list[int] = []
    agent = make_agent(
        mgr, agents, "w1", services=[SVC], handler_retry=HandlerRetry(base=0.05, cap=0.1)
    )

    @agent.on_pause(SVC)
    def stop(location: str) -> None:
        attempts.append(1)
        if failing.is_set():
            raise RuntimeError("consumer did not stop")

    agent.start()
    mgr.pause(LOC, SVC)
    eventually(lambda: len(attempts) >= 3)  # retried with backoff
    info = eventually(lambda: [w for w in mgr.workers() if w.errors])[0]
    assert info.errors == {f"{LOC}/{SVC}": "RuntimeError: consumer did not stop"}
    assert agent.errors() == info.errors
    assert agent.metrics()["handler_errors"] >= 3 and agent.metrics()["failing"] == 1
    assert mgr.backend.acks(LOC)["w1"][SVC] == 0  # the pause (generation 1) is not acknowledged
    assert svc_state(mgr) is State.PAUSING
    with pytest.raises(SettleTimeout) as err:
        mgr.wait_settled(LOC, SVC, timeout=0.3)
    assert err.value.lagging == ["w1"]
    failing.clear()
    assert mgr.wait_settled(LOC, SVC, timeout=10).services[SVC].state is State.PAUSED
    eventually(lambda: mgr.workers()[0].errors == {})
    assert agent.errors() == {} and agent.metrics()["failing"] == 0


def test_a_newer_generation_does_not_wait_for_the_backoff_of_a_failing_one(
    mgr: Manager, agents: list[Agent]
) -> None:
    calls: list[tuple[str, str, int]] = []
    agent = make_agent(
        mgr, agents, "w1", calls, services=[SVC], handler_retry=HandlerRetry(base=60, cap=60)
    )

    @agent.on_pause(SVC)
    def broken(location: str) -> None:
        raise RuntimeError("cannot stop")

    agent.start()
    mgr.pause(LOC, SVC)
    eventually(lambda: agent.errors())
    rec = mgr.resume(LOC, SVC, wait=10)  # the pause is 60 s from its next try: not in the way
    assert rec.services[SVC].state is State.RUNNING
    assert calls[-1] == ("resume", f"{LOC}/{SVC}", 2)
    eventually(lambda: agent.errors() == {})


def test_state_that_moves_while_the_handler_runs_is_applied_before_acknowledging(
    kit: Kit, agents: list[Agent]
) -> None:
    backend = Recording(kit.open())
    mgr = Client(backend)
    mgr.sync_locations([LOC])
    entered, release = threading.Event(), threading.Event()
    calls: list[tuple[str, str, int]] = []
    agent = make_agent(mgr, agents, "w1", calls, services=[SVC])

    @agent.on_pause(SVC)
    def slow(location: str) -> None:
        entered.set()
        release.wait(10)

    agent.start()
    mgr.pause(LOC, SVC)  # generation 1
    assert entered.wait(10)
    mgr.resume(LOC, SVC)  # 2, while the pause handler runs
    mgr.pause(LOC, SVC)  # 3
    release.set()
    rec = mgr.wait_settled(LOC, SVC, timeout=10)
    assert (rec.services[SVC].state, rec.services[SVC].generation) == (State.PAUSED, 3)
    assert calls == [
        ("resume", f"{LOC}/{SVC}", 0),
        ("pause", f"{LOC}/{SVC}", 1),
        ("pause", f"{LOC}/{SVC}", 3),
    ]
    assert [a[3] for a in backend.acked if a[2] == SVC] == [0, 3]
    assert agent.metrics()["handler_reruns"] == 1
    assert agent.is_paused(LOC, SVC) and agent.observed_generation(LOC, SVC) == 3


def test_removed_location_gets_on_remove_and_is_acknowledged_as_tombstone(
    mgr: Manager, agents: list[Agent]
) -> None:
    removed: list[str] = []
    calls: list[tuple[str, str, int]] = []
    agent = make_agent(mgr, agents, "w1", calls, services=[SVC])
    agent.on_remove(removed.append)
    agent.start()
    removed_at = mgr.remove_location("eu-west-1").deleted_at
    assert removed_at is not None
    eventually(
        lambda: mgr.backend.acks("eu-west-1").get("w1", {}).get(TOMBSTONE_ACK)
        == tombstone_generation(removed_at)
    )
    assert removed == ["eu-west-1"]
    assert agent.is_removed("eu-west-1") and agent.is_paused("eu-west-1", SVC)
    assert "eu-west-1" in agent.locations_seen()  # stays visible as a tombstone
    calls.clear()
    mgr.sync_locations({LOC: ["replication", "lifecycle"], "eu-west-1": [SVC]})  # restored
    eventually(lambda: calls == [("resume", "eu-west-1/replication", 0)])
    assert not agent.is_removed("eu-west-1") and not agent.is_paused("eu-west-1", SVC)


def test_location_filter_and_services_bound_what_a_worker_blocks(
    mgr: Manager, agents: list[Agent]
) -> None:
    calls: list[tuple[str, str, int]] = []
    agent = make_agent(mgr, agents, "w1", calls, services=["crr"], locations=[LOC]).start()
    assert agent.services == (SVC,)
    assert calls == [("resume", f"{LOC}/{SVC}", 0)]
    with pytest.raises(NotFound, match="does not watch"):
        agent.is_paused("eu-west-1", SVC)
    # Nobody applies eu-west-1 or lifecycle: those settle in the pause's own write.
    assert mgr.pause("eu-west-1", SVC).services[SVC].state is State.PAUSED
    assert mgr.pause(LOC, "lifecycle").services["lifecycle"].state is State.PAUSED
    assert mgr.pause(LOC, SVC).services[SVC].state is State.PAUSING
    with pytest.raises(InvalidInput, match="does not apply"):
        agent.on_pause("lifecycle")


def test_stop_unregisters_so_the_worker_stops_blocking_at_once(
    mgr: Manager, agents: list[Agent]
) -> None:
    gate = threading.Event()
    stuck = make_agent(mgr, agents, "stuck", services=[SVC], lease_seconds=600)

    @stuck.on_pause(SVC)
    def never(location: str) -> None:
        gate.wait(10)

    stuck.start()
    mgr.pause(LOC, SVC)
    time.sleep(0.2)
    assert svc_state(mgr) is State.PAUSING
    gate.set()
    stuck.stop()
    assert mgr.workers() == [] and "stuck" not in mgr.backend.acks(LOC)
    assert mgr.wait_settled(LOC, SVC, timeout=10).services[SVC].state is State.PAUSED


def test_two_agents_both_must_apply(mgr: Manager, agents: list[Agent]) -> None:
    a = make_agent(mgr, agents, "a", services=[SVC]).start()
    b = make_agent(mgr, agents, "b", services=[SVC]).start()
    rec = mgr.pause(LOC, SVC, wait=10)
    assert rec.services[SVC].state is State.PAUSED
    assert mgr.backend.acks(LOC) == {"a": {SVC: 1}, "b": {SVC: 1}}
    assert a.is_paused(LOC, SVC)
    eventually(lambda: b.state(LOC, SVC) is State.PAUSED)


def test_coroutine_handlers_and_context_manager(mgr: Manager, agents: list[Agent]) -> None:
    seen: list[str] = []
    agent = make_agent(mgr, agents, "w1", services=[SVC])

    @agent.on_pause(SVC)
    async def stop(location: str) -> None:
        import asyncio

        await asyncio.sleep(0.01)
        seen.append(location)

    with agent:
        assert [w.worker_id for w in mgr.workers()] == ["w1"]
        mgr.pause(LOC, SVC, wait=10)
        assert seen == [LOC]
    assert mgr.workers() == []


def test_agent_fires_a_due_scheduled_resume(mgr: Manager, agents: list[Agent]) -> None:
    calls: list[tuple[str, str, int]] = []
    make_agent(mgr, agents, "w1", calls, services=[SVC]).start()
    mgr.pause(LOC, SVC, wait=10)
    mgr.resume(LOC, SVC, at=timedelta(seconds=0.5))
    eventually(lambda: svc_state(mgr) is State.RUNNING, timeout=10)
    assert calls[-1] == ("resume", f"{LOC}/{SVC}", 2)
    assert [e.event for e in mgr.history(LOC, limit=2)] == ["settle", "resume_due"]


@pytest.mark.parametrize("kit", ["zk"], indirect=True)  # the backend whose hints carry records
def test_a_resume_scheduled_while_the_agent_idles_fires_when_due_not_at_its_next_reread(
    mgr: Manager, agents: list[Agent]
) -> None:
    """ZooKeeper's hint of a changed record carries the record; the agent stores it without a
    read and used not to wake its watch thread, which slept on until its next re-read
    (``resync_interval``, 30 s by default): a resume scheduled while nothing else woke it
    fired 25 s late (tests/test_skew.py, [zk]). Late by at most the time source's error bound
    plus the agent's period (``settle_interval``; docs/time.md, "What it guarantees")."""
    make_agent(mgr, agents, "w1", services=[SVC], resync_interval=60.0,
               settle_interval=1.0).start()
    mgr.pause(LOC, SVC, wait=10)
    time.sleep(1.0)  # idle: whatever the pause woke the agent for is over
    at = mgr.resume(LOC, SVC, at=timedelta(seconds=1)).services[SVC].resume_at
    assert at is not None
    eventually(lambda: svc_state(mgr) is State.RUNNING, timeout=10)
    (fired,) = [e for e in mgr.history(LOC, limit=3) if e.event == "resume_due"]
    bound = timedelta(seconds=mgr.time.max_uncertainty_seconds + 1.0 + SCHEDULING)
    assert at <= fired.at <= at + bound, f"due at {at}, fired at {fired.at}"


def test_bad_arguments_are_refused(mgr: Manager) -> None:
    with pytest.raises(InvalidInput):
        mgr.agent("../w")
    with pytest.raises(InvalidInput):
        mgr.agent("w1", services=["nope"])
    with pytest.raises(InvalidInput):
        mgr.agent("w1", locations=["a/b"])
    with pytest.raises(InvalidInput):
        mgr.agent("w1", lease_seconds=1, heartbeat_interval=2)


# -- real worker processes, every backend reachable from another process ------------------------




class Worker:
    """One ``agent_worker.py`` process and the file its handlers record to."""

    def __init__(self, url: str, worker_id: str, tmp: Path, args: Sequence[str]) -> None:
        self.id = worker_id
        self.record = tmp / f"{worker_id}.jsonl"
        self.log = tmp / f"{worker_id}.log"
        cmd = [
            sys.executable,
            str(WORKER),
            "--url",
            url,
            "--id",
            worker_id,
            "--record",
            str(self.record),
            *args,
        ]
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)

    def events(self) -> list[dict[str, Any]]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text().splitlines() if line]

    def applied(self, event: str | None = None) -> list[tuple[str, int]]:
        """(event, generation) of every handler call that completed, in order."""
        return [
            (e["event"], e["generation"])
            for e in self.events()
            if e.get("phase") == "end" and event in (None, e["event"])
        ]

    def marked(self, event: str) -> bool:
        return any(e["event"] == event and "phase" not in e for e in self.events())

    def wait_ready(self, timeout: float = 60.0) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"worker {self.id} exited: {self.log.read_text()[-2000:]}")
            return self.marked("ready")

        eventually(ready, timeout=timeout, every=0.05)

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def ask_to_stop(self) -> None:
        """SIGCONT (a frozen one) and SIGTERM, without waiting: :meth:`stop` waits."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.ask_to_stop()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture
def spawn(backend_url: str, tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    started: list[Worker] = []

    def start(worker_id: str, *args: str) -> Worker:
        w = Worker(backend_url, worker_id, tmp_path, args)
        started.append(w)
        return w

    yield start
    for w in started:  # all at once: 16 agents unregistering one after the other took 16 s
        w.ask_to_stop()
    for w in started:
        w.stop()


@pytest.fixture
def pmgr(backend_url: str) -> Iterator[Manager]:
    m = connect(backend_url)
    m.sync_locations({LOC: [SVC]})
    yield m
    m.close()


def acked(mgr: Manager, worker_id: str, location: str = LOC) -> int | None:
    return mgr.backend.acks(location).get(worker_id, {}).get(SVC)


@pytest.mark.slow
def test_sixteen_worker_processes_pause_and_resume_with_wait(
    pmgr: Manager, spawn: Callable[..., Worker]
) -> None:
    workers = [spawn(f"w{i:02d}", "--lease", "5") for i in range(16)]
    for w in workers:
        w.wait_ready()
    assert len([i for i in pmgr.workers() if i.alive(pmgr.clock())]) == 16
    rec = pmgr.pause(LOC, SVC, reason="maintenance", wait=45)
    # wait= returned: the state reads paused and every handler has already run.
    assert rec.services[SVC].state is State.PAUSED
    assert svc_state(pmgr) is State.PAUSED
    for w in workers:
        assert ("pause", 1) in w.applied(), w.id
    assert {w: s[SVC] for w, s in pmgr.backend.acks(LOC).items()} == {w.id: 1 for w in workers}
    rec = pmgr.resume(LOC, SVC, wait=45)
    assert rec.services[SVC].state is State.RUNNING
    for w in workers:
        assert w.applied()[-1] == ("resume", 2), w.id
    assert svc_state(pmgr) is State.RUNNING


def test_frozen_worker_keeps_pausing_until_it_thaws_and_applies(
    pmgr: Manager, spawn: Callable[..., Worker]
) -> None:
    frozen = spawn("frozen", "--lease", "60")  # its lease outlives the freeze
    healthy = spawn("healthy", "--lease", "3")
    frozen.wait_ready()
    healthy.wait_ready()
    frozen.signal(signal.SIGSTOP)
    with pytest.raises(SettleTimeout) as err:
        pmgr.pause(LOC, SVC, wait=2)
    assert err.value.lagging == ["frozen"]
    assert "frozen" in str(err.value)
    assert acked(pmgr, "healthy") == 1 and acked(pmgr, "frozen") == 0
    time.sleep(1)
    assert svc_state(pmgr) is State.PAUSING and pmgr.lagging(LOC, SVC) == ["frozen"]
    frozen.signal(signal.SIGCONT)
    rec = pmgr.wait_settled(LOC, SVC, timeout=30)
    assert rec.services[SVC].state is State.PAUSED
    assert ("pause", 1) in frozen.applied() and acked(pmgr, "frozen") == 1


def test_killed_worker_stops_blocking_when_its_lease_expires(
    pmgr: Manager, spawn: Callable[..., Worker]
) -> None:
    doomed = spawn("doomed", "--lease", "4")
    healthy = spawn("healthy", "--lease", "4")
    doomed.wait_ready()
    healthy.wait_ready()
    doomed.signal(signal.SIGKILL)
    doomed.proc.wait(10)
    rec = pmgr.pause(LOC, SVC)
    assert rec.services[SVC].state is State.PAUSING  # its lease still holds
    (lease,) = [w.lease_expires_at for w in pmgr.workers() if w.worker_id == "doomed"]
    assert lease is not None
    rec = pmgr.wait_settled(LOC, SVC, timeout=30)
    assert rec.services[SVC].state is State.PAUSED
    settle = next(e for e in pmgr.history(LOC, limit=5) if e.event == "settle")
    assert settle.at >= lease  # settled only once the dead worker's lease had run out
    assert acked(pmgr, "doomed") == 0 and acked(pmgr, "healthy") == 1


def test_pause_resume_pause_during_a_slow_handler_ends_paused_with_no_foreign_ack(
    pmgr: Manager, spawn: Callable[..., Worker], backend_url: str
) -> None:
    slow = spawn("slow", "--slow", "1.5", "--lease", "5")
    slow.wait_ready()
    seen: set[int] = set()
    done = threading.Event()
    watcher = open_backend(backend_url)

    def watch_acks() -> None:  # every acknowledgement visible while the scenario runs
        while not done.is_set():
            gen = watcher.acks(LOC).get("slow", {}).get(SVC)
            if gen is not None:
                seen.add(gen)
            time.sleep(0.005)

    t = threading.Thread(target=watch_acks)
    t.start()
    try:
        pmgr.pause(LOC, SVC)  # 1
        eventually(
            lambda: any(e.get("phase") == "start" and e["generation"] == 1 for e in slow.events())
        )
        pmgr.resume(LOC, SVC)  # 2, while the pause handler runs
        pmgr.pause(LOC, SVC)  # 3
        rec = pmgr.wait_settled(LOC, SVC, timeout=30)
    finally:
        done.set()
        t.join()
        watcher.close()
    assert (rec.services[SVC].state, rec.services[SVC].generation) == (State.PAUSED, 3)
    assert slow.applied() == [("resume", 0), ("pause", 1), ("pause", 3)]
    assert seen <= {0, 3} and acked(pmgr, "slow") == 3  # never an ack of 1 or 2


def test_disconnected_worker_converges_on_reconnect(
    pmgr: Manager, spawn: Callable[..., Worker]
) -> None:
    # Long lease and no periodic resync: only the reconnection can bring it back in line.
    w = spawn("cut", "--lease", "60", "--heartbeat", "0.3", "--resync", "3600")
    w.wait_ready()
    time.sleep(1.5)  # past the agent's early re-read after start
    w.signal(signal.SIGUSR1)
    eventually(lambda: w.marked("disconnected"))
    pmgr.pause(LOC, SVC)
    pmgr.resume(LOC, SVC)
    pmgr.pause(LOC, SVC)  # three changes it gets no notification of
    time.sleep(1.5)
    assert svc_state(pmgr) is State.PAUSING and pmgr.lagging(LOC, SVC) == ["cut"]
    assert w.applied() == [("resume", 0)] and acked(pmgr, "cut") == 0
    w.signal(signal.SIGUSR2)
    rec = pmgr.wait_settled(LOC, SVC, timeout=30)
    assert (rec.services[SVC].state, rec.services[SVC].generation) == (State.PAUSED, 3)
    assert w.applied() == [("resume", 0), ("pause", 3)] and acked(pmgr, "cut") == 3
    w.stop()
    (stopped,) = [e for e in w.events() if e["event"] == "stopped"]
    assert stopped["metrics"]["heartbeat_errors"] >= 1  # it really was cut off


def test_in_process_partition_misses_hints_and_resyncs_on_reconnect(
    kit: Kit, agents: list[Agent]
) -> None:
    link = Partition(kit.open())
    mgr = Manager(kit.open())
    mgr.sync_locations([LOC])
    calls: list[tuple[str, str, int]] = []
    agent = make_agent(
        Client(link),
        agents,
        "w1",
        calls,
        services=[SVC],
        lease_seconds=60,
        heartbeat_interval=0.1,
        resync_interval=3600,
    ).start()
    eventually(lambda: agent.metrics()["resyncs"] >= 2)  # past the early re-read after start
    link.cut()
    mgr.pause(LOC, SVC)
    mgr.resume(LOC, SVC)
    mgr.pause(LOC, SVC)
    eventually(lambda: agent.metrics()["heartbeat_errors"] >= 1)
    assert agent.metrics()["connected"] == 0 and agent.state(LOC, SVC) is State.RUNNING
    link.heal()
    assert mgr.wait_settled(LOC, SVC, timeout=10).services[SVC].state is State.PAUSED
    assert calls == [("resume", f"{LOC}/{SVC}", 0), ("pause", f"{LOC}/{SVC}", 3)]
    eventually(lambda: agent.metrics()["connected"] == 1)
    assert agent.metrics()["reconnects"] == 1


def test_a_settler_that_dies_right_after_acknowledging_does_not_leave_the_location_pausing(
    pmgr: Manager, spawn: Callable[..., Worker]
) -> None:
    """Found by the reliability review: on ZooKeeper the last worker to acknowledge was the
    location's settler and died before settling; the other worker had tried once (too early)
    and nothing woke it again until the dead session expired (~12 s). Every worker that
    acknowledged now retries with backoff while the location stays transitional."""
    ids = ["w-a", "w-b"]
    settler = max(ids, key=lambda w: rendezvous(LOC, w))
    other = next(w for w in ids if w != settler)
    doomed = spawn(settler, "--slow", "1.5", "--die-after-ack", "--session-leases",
                   "--lease", "30")
    fine = spawn(other, "--session-leases", "--lease", "30")
    doomed.wait_ready()
    fine.wait_ready()
    pmgr.pause(LOC, SVC)
    start = time.monotonic()
    eventually(lambda: doomed.proc.poll() is not None, timeout=30)
    assert doomed.marked("dying")
    eventually(lambda: svc_state(pmgr) is State.PAUSED, timeout=30)
    took = time.monotonic() - start
    # Well before a dead ZooKeeper session (10 s) or a heartbeat lease (30 s) runs out.
    assert took < 7, f"settled {took:.1f}s after the settler died"
    assert acked(pmgr, settler) in (1, None) and acked(pmgr, other) == 1


def test_worker_frozen_past_its_lease_stops_counting_and_catches_up(
    pmgr: Manager, spawn: Callable[..., Worker]
) -> None:
    w = spawn("napper", "--lease", "1.5", "--resync", "3600")
    w.wait_ready()
    w.signal(signal.SIGSTOP)
    # Its lease lapses: the three changes settle without it.
    assert pmgr.pause(LOC, SVC, wait=20).services[SVC].state is State.PAUSED
    assert pmgr.resume(LOC, SVC, wait=20).services[SVC].state is State.RUNNING
    assert pmgr.pause(LOC, SVC, wait=20).services[SVC].state is State.PAUSED
    assert acked(pmgr, "napper") == 0
    w.signal(signal.SIGCONT)
    eventually(lambda: acked(pmgr, "napper") == 3, timeout=30)
    assert w.applied()[-1] == ("pause", 3)
    eventually(
        lambda: any(i.worker_id == "napper" and i.alive(pmgr.clock()) for i in pmgr.workers())
    )


def test_worker_frozen_while_a_location_is_removed_and_purged_runs_on_remove_after(
    pmgr: Manager, spawn: Callable[..., Worker]
) -> None:
    """Frozen past its lease across the removal and the purge, the worker never sees the
    tombstone; when it thaws and finds the location gone, it still runs on_remove for it
    (before: it forgot the location silently, its consumers left running)."""
    pmgr.sync_locations({LOC: [SVC], "eu-west-1": [SVC]})
    w = spawn("napper", "--lease", "1.5", "--resync", "3600")
    w.wait_ready()
    w.signal(signal.SIGSTOP)
    pmgr.sync_locations({LOC: [SVC]})  # eu-west-1 becomes a tombstone ...
    pmgr.purge_location("eu-west-1", pmgr.backend.read("eu-west-1").version)  # ... then goes
    w.signal(signal.SIGCONT)
    eventually(lambda: ("remove", None) in w.applied(), timeout=30)
    removed = [e for e in w.events() if e.get("event") == "remove" and e.get("phase") == "end"]
    assert [e["location"] for e in removed] == ["eu-west-1"]


def test_handler_error_is_visible_in_workers_until_it_succeeds(
    pmgr: Manager, spawn: Callable[..., Worker]
) -> None:
    w = spawn("flaky", "--fail", "4", "--fail-event", "pause", "--retry-base", "0.4")
    w.wait_ready()
    pmgr.pause(LOC, SVC)
    info = eventually(lambda: [i for i in pmgr.workers() if i.errors])[0]
    assert info.worker_id == "flaky"
    assert info.errors[f"{LOC}/{SVC}"].startswith("RuntimeError: injected failure")
    assert svc_state(pmgr) is State.PAUSING and acked(pmgr, "flaky") == 0
    rec = pmgr.wait_settled(LOC, SVC, timeout=30)
    assert rec.services[SVC].state is State.PAUSED and acked(pmgr, "flaky") == 1
    assert [e["phase"] for e in w.events() if e.get("event") == "pause"].count("error") == 4
    eventually(lambda: all(not i.errors for i in pmgr.workers()))


def test_worker_dropped_as_expired_acknowledges_again_when_it_comes_back(
    kit: Kit, agents: list[Agent]
) -> None:
    mgr = Client(kit.open())
    mgr.sync_locations([LOC])
    link = Partition(kit.open())
    calls: list[tuple[str, str, int]] = []
    napper = make_agent(
        Client(link),
        agents,
        "napper",
        calls,
        services=[SVC],
        lease_seconds=1.0,
        heartbeat_interval=0.1,
    ).start()
    gate = threading.Event()
    slow = make_agent(mgr, agents, "slow", services=[SVC], lease_seconds=60)
    slow.on_pause(SVC)(lambda location: gate.wait(20) and None)
    slow.start()
    mgr.pause(LOC, SVC)
    eventually(lambda: mgr.backend.acks(LOC).get("napper", {}).get(SVC) == 1)
    # under load a renewal may come late before the cut too (a lapse of its own): this cut's
    # lapse is the one counted from here
    lapses = napper.metrics()["lease_lapses"]
    link.cut()  # napper falls silent; its lease lapses
    eventually(
        lambda: not any(w.worker_id == "napper" and w.alive(mgr.clock()) for w in mgr.workers())
    )
    mgr.backend.remove_worker("napper")  # what the check job's repair does to expired workers
    assert "napper" not in mgr.backend.acks(LOC)
    link.heal()
    # acked again; the lapses counted when it is (a later renewal may come late too)
    assert acked_again(mgr, napper) == lapses + 1
    gate.set()
    assert mgr.wait_settled(LOC, SVC, timeout=10).services[SVC].state is State.PAUSED
    assert calls.count(("pause", f"{LOC}/{SVC}", 1)) == 1  # without running the handler again


def acked_again(mgr: Manager, agent: Agent) -> int:
    """Once ``agent`` acknowledged generation 1 of LOC/SVC again: its count of lease lapses
    then (the renewal that noticed the lapse counts it before acknowledging again)."""
    seen: list[int] = eventually(
        lambda: mgr.backend.acks(LOC).get(agent.worker_id, {}).get(SVC) == 1
        and [agent.metrics()["lease_lapses"]]
    )
    return seen[0]


class LateRenewal(Partition):
    """The real backend behind a switch, whose next ``put_worker`` (a renewal) can be held
    before it reaches the backend: sent at one time, landing :attr:`delay` seconds later."""

    def __init__(self, inner: Backend, delay: float) -> None:
        super().__init__(inner)
        self.delay = delay
        self.hold = threading.Event()
        self.landed = threading.Event()

    def put_worker(self, info: WorkerInfo) -> None:
        self._check()
        late = self.hold.is_set()
        if late:
            self.hold.clear()
            time.sleep(self.delay)  # the renewal in flight (a slow network, a loaded machine)
        self.inner.put_worker(info)
        if late:
            self.landed.set()


def test_a_lease_that_ran_out_after_a_late_renewal_landed_counts_as_a_lapse(
    tmp_path: Path, agents: list[Agent]
) -> None:
    """The last renewal before a cut landed late (0.5 s after it was sent, before its lease
    of 1 s ran out); the lease then ran out, the check job's repair removed the worker, and
    the link came back within a second of that landing. The lease is dated when the renewal
    was sent, so it lapsed: the worker counts a lapse and acknowledges again (before: the
    lapse was measured from when the renewal's answer came, it counted none; seen as
    test_worker_dropped_as_expired_acknowledges_again_when_it_comes_back[zk] failing under
    load with lease_lapses 0)."""
    url = f"sqlite:///{tmp_path}/ls.db"
    mgr = Client(open_backend(url))
    mgr.sync_locations([LOC])
    link = LateRenewal(open_backend(url), delay=0.5)
    napper = make_agent(Client(link), agents, "napper", services=[SVC], lease_seconds=1.0,
                        heartbeat_interval=0.1).start()
    mgr.pause(LOC, SVC)
    assert mgr.wait_settled(LOC, SVC, timeout=10).services[SVC].state is State.PAUSED
    lapses = napper.metrics()["lease_lapses"]
    link.hold.set()
    assert link.landed.wait(10)
    link.cut()  # right after the late renewal landed: nothing renews from here
    eventually(
        lambda: not any(w.worker_id == "napper" and w.alive(mgr.clock()) for w in mgr.workers())
    )
    mgr.backend.remove_worker("napper")  # what the check job's repair does to expired workers
    link.heal()
    assert acked_again(mgr, napper) == lapses + 1


@pytest.mark.parametrize("kind", ["zk", "mongo"])
def test_stop_returns_in_time_while_the_backend_is_down(kind: str, tmp_path: Path) -> None:
    """A worker shut down during an outage (SIGTERM while its ZooKeeper or MongoDB server is
    gone) must not hang on the backend's own timeouts (10 s a ZooKeeper call, 5 s a MongoDB
    server selection): ``stop(timeout)`` returns within ``timeout + UNREGISTER_GRACE`` and the
    manager closes at once; the registration ends with the session or the lease."""
    server = start_zk(tmp_path) if kind == "zk" else start_mongo(tmp_path)
    try:
        url = zk_url(server.hosts) if kind == "zk" else kit_url(server, fresh_database())
        mgr = connect(url)
        mgr.sync_locations([LOC])
        agent = mgr.agent("w-outage", services=[SVC]).start()
        assert [w.worker_id for w in mgr.workers()] == ["w-outage"]
        server.kill()
        t0 = time.monotonic()
        agent.stop(timeout=1.0)
        assert time.monotonic() - t0 < 1.0 + UNREGISTER_GRACE + 0.5
        t0 = time.monotonic()
        mgr.close()
        assert time.monotonic() - t0 < 1.5
    finally:
        server.close()


class SlowUnregister(Partition):
    """The real backend, whose remove_worker waits for ``gate`` (a backend slow to answer)."""

    def __init__(self, inner: Backend) -> None:
        super().__init__(inner)
        self.gate = threading.Event()

    def remove_worker(
        self, worker_id: str, *, if_expires: datetime | None = None, retire: bool = False
    ) -> bool:
        self.gate.wait(30)
        return super().remove_worker(worker_id, if_expires=if_expires, retire=retire)


def test_a_restart_waits_for_the_unregistration_stop_left_pending(kit: Kit) -> None:
    """stop() may return before the backend confirmed the unregistration. If that
    unregistration landed after the restarted agent registered again, it would remove a live
    worker, and a pause would settle to paused before the worker applied it (docs/design.md §3).
    start() lets it land first."""
    slow = SlowUnregister(kit.open())
    mgr = Client(slow)
    mgr.sync_locations([LOC])
    agent = mgr.agent("w-restart", services=[SVC])
    agent.on_pause(SVC)(lambda location: None)
    agent.start()
    t0 = time.monotonic()
    agent.stop(timeout=0.2)  # the unregistration is still waiting on the backend
    assert time.monotonic() - t0 < 0.2 + UNREGISTER_GRACE + 0.5
    restart = threading.Thread(target=agent.start)
    restart.start()
    time.sleep(0.3)
    slow.gate.set()  # the backend answers: the old unregistration lands
    restart.join(10)
    assert not restart.is_alive()
    assert [w.worker_id for w in mgr.workers()] == ["w-restart"]
    mgr.pause(LOC, SVC)
    assert mgr.wait_settled(LOC, SVC, timeout=10).services[SVC].state is State.PAUSED
    assert mgr.backend.acks(LOC)["w-restart"][SVC] == mgr.status(LOC).services[SVC].generation
    agent.stop()
