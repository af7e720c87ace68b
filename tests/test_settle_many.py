"""The batched settle (``Manager.settle_many``) on every backend: after a bulk change, it
settles exactly the locations whose every live worker acknowledged the current generation,
never one early, each its own compare-and-set with its settle in the history; a conflict at
one location re-reads and re-applies that one alone and fails no other (docs/design.md §3
``settle(g)``, §4 "Batches")."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from locstatus import Client, InvalidInput, Manager, NotFound, State, WorkerInfo
from locstatus.backends.base import CasItem, CasResult
from locstatus.manager import Operation
from locstatus.models import LocationStatus

from support.fakeclock import FakeClock
from support.kits import Kit

START = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
SVC = "replication"
WORKERS = ("w-a", "w-b")
LOCS = ("loc-0", "loc-1", "loc-2", "loc-3", "loc-4")
_rounds = itertools.count()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def mgr(kit: Kit, clock: FakeClock) -> Iterator[Manager]:
    yield Manager(kit.open(), clock=clock, services=(SVC, "lifecycle"))


def _until(probe: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait for a write to show (ZooKeeper lists workers from a watched copy)."""
    deadline = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < deadline, "the store never showed the write"
        time.sleep(0.02)


def _fleet(mgr: Manager, clock: FakeClock, prefix: str) -> tuple[list[str], list[str]]:
    """Fresh locations ``prefix``-loc-N, pausing at generation 1, and two live workers that
    apply ``replication`` there only (so the rounds of a property test share one store)."""
    locations = [f"{prefix}-{loc}" for loc in LOCS]
    mgr.sync_locations({loc: [SVC, "lifecycle"] for loc in locations})
    workers = [f"{prefix}-{w}" for w in WORKERS]
    for w in workers:
        mgr.backend.put_worker(WorkerInfo(
            worker_id=w, services=(SVC,), locations=tuple(locations),
            lease_expires_at=clock.now + timedelta(minutes=10),
        ))
    _until(lambda: set(workers) <= {w.worker_id for w in mgr.workers()})
    report = mgr.bulk(Operation.pause(SVC), locations)
    assert not report.failed
    assert {mgr.status(loc).services[SVC].state for loc in locations} == {State.PAUSING}
    return locations, workers


def _running(rec: LocationStatus) -> LocationStatus:
    """``rec`` as it read before the pause: replication running at generation 0."""
    svc = rec.services[SVC].model_copy(update={"state": State.RUNNING, "generation": 0})
    return rec.model_copy(update={"services": {**rec.services, SVC: svc}})


ACK = st.sampled_from([None, 0, 1])
"""A worker's acknowledgement of a location: none, the generation before the pause, the
pause's own."""


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    acks=st.lists(st.tuples(ACK, ACK), min_size=len(LOCS), max_size=len(LOCS)),
    held=st.sampled_from(["none", "current", "older"]),
)
def test_settles_exactly_the_locations_every_live_worker_acknowledged(
    mgr: Manager, clock: FakeClock, acks: list[tuple[int | None, int | None]], held: str
) -> None:
    """``held``: what the caller passes as ``known`` (an agent's local copy): nothing, the
    pausing records, or the records from before the pause (generation 0, running: a copy
    that missed the pause). Whatever it holds, the same locations settle."""
    prefix = f"p{next(_rounds)}"
    locations, workers = _fleet(mgr, clock, prefix)
    older = {loc: _running(mgr.status(loc)) for loc in locations}
    for loc, per in zip(locations, acks, strict=True):
        for w, gen in zip(workers, per, strict=True):
            if gen is not None:
                mgr.backend.ack(w, loc, SVC, gen)
    before = {loc: mgr.status(loc) for loc in locations}
    known = {"none": None, "current": before, "older": older}[held]
    got = mgr.settle_many([*locations, "atlantis"], known=known)
    assert isinstance(got["atlantis"], NotFound)
    complete = {loc for loc, per in zip(locations, acks, strict=True) if per == (1, 1)}
    for loc in locations:
        rec = got[loc]
        assert isinstance(rec, LocationStatus)
        assert rec == mgr.status(loc)
        svc = rec.services[SVC]
        if loc in complete:
            assert svc.state is State.PAUSED and svc.generation == 1
            assert rec.version == before[loc].version + 1
            assert mgr.history(loc, limit=1)[0].event == "settle"
        else:  # never one early: nothing written
            assert svc.state is State.PAUSING
            assert rec.version == before[loc].version
        assert rec.services["lifecycle"].state is State.RUNNING
    # a second call settles nothing more and writes nothing
    again = mgr.settle_many(locations)
    assert {loc: r.version for loc, r in again.items() if isinstance(r, LocationStatus)} == {
        loc: mgr.status(loc).version for loc in locations
    }


def test_a_conflict_at_one_location_re_reads_that_one_only_and_fails_no_other(
    mgr: Manager, kit: Kit, clock: FakeClock
) -> None:
    """Between the batch's read and its compare-and-sets another client resumes loc-1
    (generation 2, not acknowledged), pauses lifecycle at loc-3 (its re-read still settles
    replication) and at loc-2, where a worker that registered meanwhile has not acknowledged
    yet: each is read again alone, its workers and acks read again after it (model/README.md,
    finding 1), so loc-1 stays resuming and loc-2 pausing; the others settle in the batch."""
    locations, workers = _fleet(mgr, clock, "c")
    for loc in locations:
        for w in workers:
            mgr.backend.ack(w, loc, SVC, 1)
    other = Manager(kit.open(), clock=clock, services=(SVC, "lifecycle"))
    real = mgr.backend.compare_and_set_many
    sent: list[list[str]] = []

    def racing(items: Sequence[CasItem]) -> list[CasResult]:
        sent.append([i.record.location for i in items])
        if len(sent) == 1:
            other.resume(locations[1], SVC)  # generation 2: nobody acknowledged it
            other.pause(locations[3], "lifecycle")  # another service: loc-3 still settles
            other.backend.put_worker(WorkerInfo(
                worker_id="c-late", services=(SVC,), locations=(locations[2],),
                lease_expires_at=clock.now + timedelta(minutes=10),
            ))
            _until(lambda: "c-late" in {w.worker_id for w in mgr.workers()})
            other.pause(locations[2], "lifecycle")
        return real(items)

    mgr.backend.compare_and_set_many = racing  # type: ignore[method-assign]
    read_before = mgr.stats["stale_hints"]
    got = mgr.settle_many(locations)
    assert sent[0] == locations  # every location in the one batch
    assert mgr.stats["stale_hints"] - read_before == 3  # loc-1, -2 and -3 re-read alone
    for loc in locations:
        rec = got[loc]
        assert isinstance(rec, LocationStatus), rec
        assert rec == mgr.status(loc)
    states = {loc: mgr.status(loc).services[SVC].state for loc in locations}
    assert states == {
        **dict.fromkeys(locations, State.PAUSED),
        locations[1]: State.RESUMING, locations[2]: State.PAUSING,
    }
    assert mgr.status(locations[1]).services[SVC].generation == 2
    assert mgr.status(locations[3]).services["lifecycle"].state is State.PAUSED


def test_bad_input_is_refused_before_anything_is_read(mgr: Manager, clock: FakeClock) -> None:
    locations, _workers = _fleet(mgr, clock, "b")
    with pytest.raises(InvalidInput, match="location"):
        mgr.settle_many([locations[0], "no/slash"])
    with pytest.raises(InvalidInput, match="nosuch"):
        mgr.settle_many(locations, "nosuch")
    assert {mgr.status(loc).services[SVC].state for loc in locations} == {State.PAUSING}


def test_a_location_nobody_applies_settles_and_one_missing_a_service_is_named(
    mgr: Manager, clock: FakeClock
) -> None:
    """No live worker counts as all of them (docs/design.md §3): the worker that applied
    lifecycle retired, so the pausing record settles; asking a service a location lacks ends
    that location with NotFound naming it, and the other still settles."""
    mgr.sync_locations({"n-1": [SVC], "n-2": [SVC, "lifecycle"]})
    mgr.backend.put_worker(WorkerInfo(
        worker_id="w-l", services=("lifecycle",), locations=("n-2",),
        lease_expires_at=clock.now + timedelta(minutes=10),
    ))
    _until(lambda: "w-l" in {w.worker_id for w in mgr.workers()})
    assert not mgr.bulk(Operation.pause("lifecycle"), ["n-2"]).failed
    assert mgr.settle_many(["n-2"])["n-2"] == mgr.status("n-2")
    assert mgr.status("n-2").services["lifecycle"].state is State.PAUSING
    mgr.backend.remove_worker("w-l")
    _until(lambda: "w-l" not in {w.worker_id for w in mgr.workers()})
    got = mgr.settle_many(["n-1", "n-2"], "lifecycle")
    assert isinstance(got["n-1"], NotFound) and "lifecycle" in got["n-1"].message
    n2 = got["n-2"]
    assert isinstance(n2, LocationStatus) and n2.services["lifecycle"].state is State.PAUSED
    assert n2 == mgr.status("n-2")


def test_an_agent_settling_past_a_corrupt_record_keeps_reporting_it(kit: Kit) -> None:
    """An agent keeps trying to settle a location another worker has not acknowledged yet; once
    the record reads corrupt, those attempts (answered from its copy, nothing read) must not
    clear the report: it stays in ``errors()`` until the record reads again (docs/agent.md,
    "Corrupt records")."""
    mgr = Manager(kit.open(), services=(SVC,))
    mgr.sync_locations({"x": [SVC]})
    mgr.backend.put_worker(WorkerInfo(  # applies x, never acknowledges
        worker_id="w-silent", services=(SVC,), locations=("x",),
        lease_expires_at=datetime.now(UTC) + timedelta(minutes=10),
    ))
    client = Client(kit.open())
    agent = client.agent("w-a", services=[SVC], lease_seconds=60)
    agent.on_pause(SVC)(lambda _location: None)
    agent.start(wait=True)
    try:
        _until(lambda: "w-silent" in {w.worker_id for w in client.workers()})
        mgr.pause("x", SVC)
        _until(lambda: agent.observed_generation("x", SVC) == 1)
        kit.write_raw("x", '{"services": {"replication": {"state": "exploded"}}}')
        _until(lambda: "x/*" in agent.errors())
        deadline = time.monotonic() + 3.0  # the settle retries of both roles come in this
        while time.monotonic() < deadline:
            assert "x/*" in agent.errors()
            time.sleep(0.01)
        assert agent.metrics()["settles"] > 0
    finally:
        agent.stop()
