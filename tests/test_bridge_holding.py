"""Two bridges judging who holds their registrations (locstatus/bridge/holding.py;
docs/backbeat.md, "2. The bridge", One bridge publishes), on a real memory store: whatever
the two did in whatever order (started, looked, renewed, one frozen past its lease), once both keep running exactly one
publishes and holds every registration, and a standby never writes. The subprocess scenarios
are tests/test_bridge_holder.py's."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from locstatus import connect
from locstatus.bridge.holding import Holder, Holding, judge
from locstatus.client import Client
from locstatus.models import WorkerInfo

IDS = ["backbeat.replication.zenko", "backbeat.replication.aws", "backbeat.lifecycle"]
SERVICES = ("replication", "lifecycle")


class Sim:
    """One bridge: ``standby`` and what it writes (a registration with its host and pid)."""

    def __init__(self, client: Client, me: Holder) -> None:
        self.client, self.me = client, me
        self.holding = Holding(client, SERVICES, me=me)
        self.standby = True
        self.writes_in_standby = 0

    def write(self, ids: list[str]) -> None:
        if self.standby:
            self.writes_in_standby += 1
        for wid in ids:
            self.client.backend.put_worker(WorkerInfo(
                worker_id=wid, services=("lifecycle",) if wid.endswith("lifecycle")
                else ("replication",), host=self.me.host, pid=self.me.pid,
                instance=self.me.instance, standing=True,
                lease_expires_at=self.client.clock() + timedelta(seconds=600)))

    def tick(self) -> None:
        def take() -> None:  # its agents register later (the next renew): the other may look
            self.standby = False  # in between and find nothing either (both started at once)

        self.standby = judge(self.holding, self.standby, take=take,
                             step_down=lambda: None, retake=self.write)

    def renew(self, index: int | None = None) -> None:
        """A heartbeat of its agents (of one, ``index``: each agent renews on its own), only
        while it runs."""
        if not self.standby:
            self.write(IDS if index is None else [IDS[index]])

    def lapse(self) -> None:
        """Frozen past its lease: what it wrote reads as away; it still believes it runs."""
        for w in self.client.workers():
            if (w.host, w.pid, w.instance) == (self.me.host, self.me.pid, self.me.instance):
                self.client.backend.put_worker(w.model_copy(update={
                    "lease_expires_at": self.client.clock() - timedelta(seconds=60)}))


@pytest.fixture
def client() -> Iterator[Client]:
    mgr = connect("memory://")
    yield mgr
    mgr.close()


steps = st.lists(st.tuples(st.sampled_from([0, 1]),
                           st.sampled_from(["tick", "lapse", *range(len(IDS))])),
                 max_size=40)


@settings(max_examples=200, deadline=None)
@given(steps=steps, pids=st.lists(st.integers(1, 10**6), min_size=2, max_size=2, unique=True))
def test_two_bridges_end_with_exactly_one_holding_everything(
    steps: list[tuple[int, str | int]], pids: list[int]
) -> None:
    client = connect("memory://")
    try:
        bridges = [Sim(client, Holder("h", pids[0])), Sim(client, Holder("h", pids[1]))]
        for who, op in steps:
            if isinstance(op, int):
                bridges[who].renew(op)
            else:
                getattr(bridges[who], op)()
        for _ in range(3):  # both running on: each looks and renews in turn
            for b in bridges:
                b.tick()
                b.renew()
        running = [b for b in bridges if not b.standby]
        assert len(running) == 1, [(b.me, b.standby) for b in bridges]
        holders = {(w.host, w.pid) for w in client.workers()}
        assert holders == {(running[0].me.host, running[0].me.pid)}
        assert all(b.writes_in_standby == 0 for b in bridges)
    finally:
        client.close()


def test_a_bridge_started_second_stands_by_and_names_the_holder(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    first, second = Sim(client, Holder("h1", 42)), Sim(client, Holder("h2", 7))
    first.tick()
    first.renew()  # its agents registered
    assert not first.standby
    for _ in range(3):
        second.tick()
    assert second.standby  # though it ranks first (h1 < h2 by host, 7 < 42 by pid): it waits
    logged = [r.getMessage() for r in caplog.records if "held by another bridge" in r.getMessage()]
    assert len(logged) == 1 and "(host h1, pid 42)" in logged[0] and "standing by" in logged[0]
    client.backend.remove_worker(IDS[0], retire=True)
    for wid in IDS[1:]:  # its holder left: its leases end now
        client.backend.put_worker(next(w for w in client.workers() if w.worker_id == wid)
                                  .model_copy(update={"lease_expires_at": client.clock()
                                              - timedelta(seconds=60)}))
    second.tick()
    second.renew()  # its agents registered
    assert not second.standby
    assert {w.pid for w in client.workers()} == {7}


@settings(max_examples=200, deadline=None)
@given(steps=steps)
def test_two_bridges_of_one_host_and_pid_end_with_exactly_one_holding_everything(
    steps: list[tuple[int, str | int]],
) -> None:
    """Two containers with a fixed host name each run their bridge as pid 1 in its own pid
    namespace: only their instance ids differ. Before the instance id each read the other's
    registrations as its own, neither stood by, and both published."""
    client = connect("memory://")
    try:
        bridges = [Sim(client, Holder("h", 1, "a" * 32)), Sim(client, Holder("h", 1, "b" * 32))]
        for who, op in steps:
            if isinstance(op, int):
                bridges[who].renew(op)
            else:
                getattr(bridges[who], op)()
        for _ in range(3):
            for b in bridges:
                b.tick()
                b.renew()
        running = [b for b in bridges if not b.standby]
        assert len(running) == 1, [(b.me, b.standby) for b in bridges]
        assert {w.instance for w in client.workers()} == {running[0].me.instance}
        assert all(b.writes_in_standby == 0 for b in bridges)
    finally:
        client.close()


def test_a_registration_without_an_instance_is_judged_by_host_and_pid(client: Client) -> None:
    """A registration of an older version (no instance stored) of this host and pid is this
    process's own; one of another pid is another bridge's."""
    old = Sim(client, Holder("h", 1))
    old.standby = False
    old.renew()
    assert {w.instance for w in client.workers()} == {None}  # stored without the field
    assert Holding(client, SERVICES, me=Holder("h", 1, "c" * 32)).others() == []
    assert len(Holding(client, SERVICES, me=Holder("h", 2, "c" * 32)).others()) == len(IDS)
