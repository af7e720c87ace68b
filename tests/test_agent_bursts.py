"""The agent following a bulk change (docs/agent.md "Bursts"), on every backend kit, in-process.

A pause of every location reaches a worker as a burst of hints. The worker reads the records
they name in batches and acknowledges in batches, never one backend read and one write per
location, and keeps its guarantees inside the burst: every location applied and acknowledged
at the generation it applied, a corrupt record reported alone while the others of its batch
go on, and an acknowledgement refused because the record moved while the handler ran (an
operator's resume in the middle of the burst) re-read and applied again, without holding up
the rest of its batch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

import pytest

from locstatus import Client, Operation, State
from locstatus.agent import Agent, HandlerRetry
from locstatus.backends import AckItem
from locstatus.backends.base import AckResult, HintCallback, ReadResult, Unsubscribe
from locstatus.models import Hint, LocationStatus

from support.agent_worker import Partition
from support.kits import Kit

SVC = "replication"
N = 240
NAMES = [f"burst-{i:03d}" for i in range(N)]
# a lease long enough that a loaded machine does not fence the agent mid-test: a fence lifted
# re-reads every record, which would apply a record before the test corrupts it
FAST: dict[str, Any] = {
    "lease_seconds": 20.0, "resync_interval": 120.0,
    "handler_retry": HandlerRetry(base=0.05, cap=0.2),
}


def eventually(check: Callable[[], Any], timeout: float = 30.0, every: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last: {value!r})")
        time.sleep(every)


class Held(Partition):
    """The real backend, counting the agent's reads and acknowledgements, with its hints held
    back while :meth:`hold` is on and delivered all at once by :meth:`release` (a burst)."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.reads = 0
        self.batch_reads: list[int] = []
        self.acks_written = 0
        self.ack_batches: list[int] = []
        self._held: list[tuple[HintCallback, Hint]] | None = None
        self._as_of_now = False
        self._lock = threading.Lock()

    def hold(self) -> None:
        with self._lock:
            self._held = []

    def release(self, *, as_of_now: bool = False) -> None:
        """Deliver the held hints. ``as_of_now``: these and every later one without the records
        they carry (ZooKeeper's carry the record as read when the change was seen, which a
        write the test made meanwhile may have superseded; and a hint of a bulk write may
        arrive only after the release), so the agent reads what the store holds now."""
        with self._lock:
            held, self._held = self._held or [], None
            self._as_of_now = as_of_now
        for callback, hint in held:
            callback(self._fresh(hint))

    def _fresh(self, hint: Hint) -> Hint:
        if self._as_of_now and hint.record is not None:
            return hint.model_copy(update={"record": None})
        return hint

    def read(self, location: str) -> LocationStatus:
        self.reads += 1
        return super().read(location)

    def read_many(self, locations: Sequence[str]) -> list[ReadResult]:
        self.batch_reads.append(len(locations))
        return self.inner.read_many(locations)

    def ack(self, worker_id: str, location: str, service: str, generation: int, *,
            if_version: int | None = None) -> None:
        self.acks_written += 1
        super().ack(worker_id, location, service, generation, if_version=if_version)

    def ack_many(self, worker_id: str, items: Sequence[AckItem]) -> list[AckResult]:
        self.ack_batches.append(len(items))
        return self.inner.ack_many(worker_id, items)

    def subscribe(self, callback: HintCallback, *, kinds: Collection[str] | None = None
                  ) -> Unsubscribe:
        def forward(hint: Hint) -> None:
            with self._lock:
                if self._held is not None:
                    self._held.append((callback, hint))
                    return
            callback(self._fresh(hint))

        return self.inner.subscribe(forward, kinds=kinds)


@pytest.fixture
def agents() -> Iterator[list[Agent]]:
    started: list[Agent] = []
    yield started
    for a in started:
        a.stop()


def fleet(kit: Kit, agents: list[Agent], n: int = 2,
          on_pause: Callable[[str, str], None] | None = None
          ) -> tuple[Client, list[Held], dict[str, list[str]]]:
    """``n`` agents over :class:`Held` links, started on :data:`NAMES` (all running), past the
    early re-read after start (so what follows reaches them as hints only)."""
    mgr = Client(kit.open())
    mgr.sync_locations(NAMES)
    links: list[Held] = []
    calls: dict[str, list[str]] = {}
    for i in range(n):
        wid = f"w{i}"
        link = Held(kit.open())
        links.append(link)
        agent = Client(link).agent(wid, services=[SVC], **FAST)
        calls[wid] = []

        def paused(location: str, wid: str = wid) -> None:
            calls[wid].append(f"pause {location}")
            if on_pause is not None:
                on_pause(wid, location)

        agent.on_pause(SVC)(paused)
        agent.on_resume(SVC)(lambda location, wid=wid: calls[wid].append(f"resume {location}"))
        agents.append(agent)
        agent.start()
    for a in agents:
        eventually(lambda a=a: a.metrics()["resyncs"] >= 2)  # the early re-read is done
    # ... and the start's work: every location applied and acknowledged. An acknowledgement
    # still in flight when the test writes would be refused (the record moved) and the record
    # read again, outside the burst the test holds back.
    wids = [f"w{i}" for i in range(n)]

    def settled() -> bool:
        acks = mgr.backend.all_acks()
        return all(a.metrics()["pending"] == 0 and a.metrics()["running"] == 0
                   for a in agents) and all(
            acks.get(name, {}).get(wid, {}).get(SVC) == 0 for name in NAMES for wid in wids)

    eventually(settled)
    return mgr, links, calls


def test_a_pause_of_every_location_is_read_and_acknowledged_in_batches(
    kit: Kit, agents: list[Agent]
) -> None:
    mgr, links, calls = fleet(kit, agents)
    for link in links:
        link.reads = link.acks_written = 0
        link.batch_reads.clear()
        link.ack_batches.clear()
        link.hold()
    report = mgr.bulk(Operation.pause(SVC))
    assert not report.failed and len(report.items) == N
    for link in links:
        link.release()  # every hint of the bulk change at once
    for a in agents:
        eventually(lambda a=a: all(a.observed_generation(n, SVC) == 1 for n in NAMES))
        assert all(a.is_paused(n, SVC) for n in NAMES)
    for seen in calls.values():
        assert sorted(c for c in seen if c.startswith("pause")) == [f"pause {n}" for n in NAMES]
    eventually(lambda: all(st.services[SVC].state is State.PAUSED for st in mgr.statuses()))
    for link in links:
        assert link.acks_written == 0  # one acknowledgement per location was N writes
        assert sum(link.ack_batches) >= N, link.ack_batches
        if kit.name != "memory":  # a real write takes long enough for the next keys to gather
            assert len(link.ack_batches) < N / 4, link.ack_batches
            assert len(link.batch_reads) < N / 4, link.batch_reads
        if kit.name != "zk":  # ZooKeeper's hints carry the records they name: no read at all
            assert sum(link.batch_reads) >= N, link.batch_reads  # one read per location: 0
    acks = mgr.backend.all_acks()
    assert all(acks[n][f"w{i}"][SVC] == 1 for n in NAMES for i in range(len(links)))


def test_a_corrupt_record_inside_a_burst_is_reported_alone(
    kit: Kit, agents: list[Agent]
) -> None:
    """The record is corrupted after the pause and before the worker hears of the burst, so
    the worker only ever reads it corrupt. On ZooKeeper the held hint of the pause carries the
    record as it was then (valid, paused): applied, that pause is right but another case (a
    state applied, then superseded by a corrupt write), so the hints are released as of now:
    this race failed the test 1 run in 3 on [zk] before (and :func:`fleet` now waits for the
    start's acknowledgements: one still in flight, refused, read the record again)."""
    mgr, links, calls = fleet(kit, agents, n=1)
    (agent,), (link,) = agents, links
    bad = NAMES[N // 2]
    link.hold()
    assert not mgr.bulk(Operation.pause(SVC)).failed
    kit.write_raw(bad, '{"services": {"replication": {"state": "exploded"}}}')
    before = mgr.backend.acks(bad)
    link.release(as_of_now=True)
    others = [n for n in NAMES if n != bad]
    eventually(lambda: all(agent.observed_generation(n, SVC) == 1 for n in others))
    eventually(lambda: f"{bad}/*" in agent.errors())
    assert agent.errors()[f"{bad}/*"].startswith("CorruptRecord")
    assert f"pause {bad}" not in calls["w0"]  # nothing ran for it
    assert not agent.is_paused(bad, SVC)  # it keeps the last state it read: running
    assert agent.observed_generation(bad, SVC) == 0
    assert mgr.backend.acks(bad) == before
    eventually(lambda: all(mgr.status(n).services[SVC].state is State.PAUSED for n in others))


def test_a_record_moved_while_its_handler_ran_inside_a_burst_is_applied_again(
    kit: Kit, agents: list[Agent]
) -> None:
    """An operator resumes one location while the worker's ``on_pause`` runs for it: the
    acknowledgement of the pause is refused (the record is no longer at the version applied),
    the worker reads it again and runs ``on_resume``, and acknowledges only the resume; the
    rest of the burst is acknowledged as usual."""
    moved = NAMES[7]
    operator = Client(kit.open())
    done = threading.Event()

    def resume_meanwhile(wid: str, location: str) -> None:
        if location == moved and not done.is_set():
            done.set()
            operator.resume(moved, SVC)

    mgr, links, calls = fleet(kit, agents, n=1, on_pause=resume_meanwhile)
    (agent,), (link,) = agents, links
    link.hold()
    assert not mgr.bulk(Operation.pause(SVC)).failed
    link.release()
    others = [n for n in NAMES if n != moved]
    eventually(lambda: all(agent.observed_generation(n, SVC) == 1 for n in others))
    eventually(lambda: agent.observed_generation(moved, SVC) == 2)
    assert calls["w0"].count(f"pause {moved}") == 1
    assert calls["w0"][-1] == f"resume {moved}" or f"resume {moved}" in calls["w0"]
    assert not agent.is_paused(moved, SVC)
    assert agent.metrics()["handler_reruns"] >= 1
    assert mgr.backend.acks(moved)["w0"][SVC] == 2  # the pause was never acknowledged there
    eventually(lambda: mgr.status(moved).services[SVC].state is State.RUNNING)
    eventually(lambda: all(mgr.status(n).services[SVC].state is State.PAUSED for n in others))
