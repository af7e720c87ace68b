"""The manager on every backend: the operator's scenarios of docs/design.md §3 and §5.1."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from locstatus import (
    ConflictError,
    InvalidInput,
    InvalidTransition,
    Manager,
    NotFound,
    PreconditionFailed,
    SettleTimeout,
    State,
    WorkerInfo,
)
from locstatus.backends import Backend
from locstatus.backends.memory import MemoryBackend
from locstatus.errors import (
    AlreadyExists,
    AmbiguousCommit,
    BackendUnavailable,
    HolderPresent,
    VersionConflict,
)
from locstatus.manager import RetryPolicy
from locstatus.models import HistoryEntry, LocationStatus, ServiceStatus

from support.agent_worker import Partition
from support.fakeclock import FakeClock
from support.kits import Kit

START = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def mgr(kit: Kit, clock: FakeClock) -> Iterator[Manager]:
    m = Manager(kit.open(), clock=clock)
    m.sync_locations({"us-east-1": ["replication", "lifecycle"], "eu-west-1": ["replication"]})
    yield m


def state(m: Manager, loc: str, svc: str) -> State:
    return m.status(loc).services[svc].state


def test_pause_without_workers_settles_in_the_write_after_the_pause(mgr: Manager) -> None:
    """No live worker counts as all (docs/design.md §3): the call returns it paused, settled in
    a write of its own after the pausing one (model/README.md, finding one_write_settle)."""
    before = mgr.status("us-east-1").version
    rec = mgr.pause("us-east-1", "replication", reason="maintenance", actor="ops", op_id="op-1")
    svc = rec.services["replication"]
    assert (svc.state, svc.generation, svc.reason, svc.actor) == (State.PAUSED, 1, "maintenance", "ops")
    assert svc.op_id == "op-1" and rec.version == before + 2
    events = [(e.version, e.event, e.to_state, e.op_id) for e in mgr.history("us-east-1", limit=2)]
    assert events == [
        (before + 2, "settle", State.PAUSED, "op-1"), (before + 1, "pause", State.PAUSING, "op-1"),
    ]
    assert rec.services["lifecycle"].state is State.RUNNING


def test_crr_is_replication(mgr: Manager) -> None:
    mgr.pause("us-east-1", "crr")
    assert state(mgr, "us-east-1", "replication") is State.PAUSED


def test_pause_all_services_of_a_location_is_one_write(mgr: Manager) -> None:
    before = mgr.status("us-east-1").version
    rec = mgr.pause("us-east-1")
    assert rec.version == before + 2  # one pausing write, then one settle of both
    assert {s: st.state for s, st in rec.services.items()} == {
        "replication": State.PAUSED, "lifecycle": State.PAUSED,
    }
    writes = [(e.version, e.event, e.service) for e in mgr.history("us-east-1", limit=4)]
    assert sorted(writes) == [
        (before + 1, "pause", "lifecycle"), (before + 1, "pause", "replication"),
        (before + 2, "settle", "lifecycle"), (before + 2, "settle", "replication"),
    ]


def test_pausing_twice_writes_nothing_the_second_time(mgr: Manager) -> None:
    first = mgr.pause("us-east-1", "replication")
    again = mgr.pause("us-east-1", "replication")
    assert again == first


def test_resume_now_and_idempotent(mgr: Manager) -> None:
    mgr.pause("us-east-1", "replication")
    rec = mgr.resume("us-east-1", "replication")
    assert rec.services["replication"].state is State.RUNNING
    assert rec.services["replication"].generation == 2
    assert mgr.resume("us-east-1", "replication") == rec


def test_scheduled_resume_is_data_and_fires_once_when_due(mgr: Manager, clock: FakeClock) -> None:
    mgr.pause("us-east-1", "replication")
    rec = mgr.resume("us-east-1", "replication", at=timedelta(hours=2))
    due = rec.services["replication"].resume_at
    assert due == clock.now + timedelta(hours=2) and rec.services["replication"].state is State.PAUSED
    assert mgr.fire_due_resumes("us-east-1") == rec  # not due yet: no write
    clock.advance(hours=2)
    fired = mgr.fire_due_resumes("us-east-1")
    assert fired.services["replication"].state is State.RUNNING
    assert fired.services["replication"].resume_at is None
    assert mgr.fire_due_resumes("us-east-1") == fired
    assert [e.event for e in mgr.history("us-east-1", limit=2)] == ["settle", "resume_due"]


def test_many_schedulers_fire_a_due_resume_exactly_once(kit: Kit, clock: FakeClock) -> None:
    managers = [Manager(kit.open(), clock=clock) for _ in range(6)]
    managers[0].sync_locations({"hot": ["replication"]})
    managers[0].pause("hot", "replication")
    managers[0].resume("hot", "replication", at=timedelta(minutes=5))
    clock.advance(minutes=6)
    barrier = threading.Barrier(len(managers))

    def fire(m: Manager) -> None:
        barrier.wait()
        m.fire_due_resumes("hot")

    threads = [threading.Thread(target=fire, args=(m,)) for m in managers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    fired = [e for e in managers[0].history("hot", limit=100) if e.event == "resume_due"]
    assert len(fired) == 1


def test_a_manual_pause_or_resume_cancels_the_schedule(mgr: Manager, clock: FakeClock) -> None:
    mgr.pause("us-east-1", "replication")
    mgr.resume("us-east-1", "replication", at=timedelta(hours=1))
    rec = mgr.pause("us-east-1", "replication")
    assert rec.services["replication"].resume_at is None
    mgr.resume("us-east-1", "replication", at=timedelta(hours=1))
    rec = mgr.resume("us-east-1", "replication")
    assert rec.services["replication"].resume_at is None
    clock.advance(hours=2)
    assert mgr.fire_due_resumes("us-east-1") == rec


def test_a_rescheduled_resume_does_not_fire_at_the_old_time(mgr: Manager, clock: FakeClock) -> None:
    mgr.pause("us-east-1", "replication")
    mgr.resume("us-east-1", "replication", at=timedelta(hours=1))
    mgr.resume("us-east-1", "replication", at=timedelta(hours=3))
    clock.advance(hours=2)
    assert state(mgr, "us-east-1", "replication") is State.PAUSED
    mgr.fire_due_resumes("us-east-1")
    assert state(mgr, "us-east-1", "replication") is State.PAUSED


def test_scheduling_a_running_service_is_refused_and_writes_nothing(mgr: Manager) -> None:
    before = mgr.status("us-east-1")
    with pytest.raises(InvalidTransition, match="running"):
        mgr.resume("us-east-1", "replication", at=timedelta(hours=1))
    with pytest.raises(InvalidTransition):
        mgr.resume("us-east-1", None, at=timedelta(hours=1))
    assert mgr.status("us-east-1") == before


def test_scheduling_every_service_applies_to_the_paused_ones(mgr: Manager) -> None:
    mgr.pause("us-east-1", "replication")
    rec = mgr.resume("us-east-1", at=timedelta(hours=1))
    assert rec.services["replication"].resume_at is not None
    assert rec.services["lifecycle"].state is State.RUNNING


def test_cancel_schedule(mgr: Manager) -> None:
    mgr.pause("us-east-1", "replication")
    mgr.resume("us-east-1", "replication", at=timedelta(hours=1))
    rec = mgr.cancel_scheduled_resume("us-east-1", "replication")
    assert rec.services["replication"].resume_at is None
    assert mgr.cancel_scheduled_resume("us-east-1", "replication") == rec


@pytest.mark.parametrize(
    "at",
    [datetime(2026, 3, 1, 12, 0), timedelta(seconds=-5), timedelta(0), "tomorrow"],
    ids=["naive", "negative", "zero", "string"],
)
def test_bad_resume_times_are_refused_before_any_write(mgr: Manager, at: object) -> None:
    mgr.pause("us-east-1", "replication")
    before = mgr.status("us-east-1")
    with pytest.raises(InvalidInput):
        mgr.resume("us-east-1", "replication", at=at)  # type: ignore[arg-type]
    assert mgr.status("us-east-1") == before


def test_past_resume_time_is_refused(mgr: Manager, clock: FakeClock) -> None:
    mgr.pause("us-east-1", "replication")
    with pytest.raises(InvalidInput, match="not in the future"):
        mgr.resume("us-east-1", "replication", at=clock.now - timedelta(minutes=1))


def test_unknown_location_and_service(mgr: Manager) -> None:
    with pytest.raises(NotFound, match="nowhere"):
        mgr.pause("nowhere", "replication")
    with pytest.raises(NotFound, match="lifecycle"):
        mgr.pause("eu-west-1", "lifecycle")
    with pytest.raises(InvalidInput, match="teleport"):
        mgr.pause("eu-west-1", "teleport")
    with pytest.raises(InvalidInput, match=r"\.\./x"):
        mgr.pause("../x", "replication")


def test_if_version_refuses_a_stale_caller(mgr: Manager) -> None:
    v = mgr.status("us-east-1").version
    mgr.pause("us-east-1", "replication", if_version=v)
    with pytest.raises(PreconditionFailed):
        mgr.resume("us-east-1", "replication", if_version=v)
    assert state(mgr, "us-east-1", "replication") is State.PAUSED


def test_two_operators_at_once_both_apply_without_losing_either(kit: Kit, clock: FakeClock) -> None:
    a, b = Manager(kit.open(), clock=clock), Manager(kit.open(), clock=clock)
    a.sync_locations({"shared": ["replication", "lifecycle"]})
    barrier = threading.Barrier(2)

    def run(m: Manager, svc: str) -> None:
        barrier.wait()
        for _ in range(10):
            m.pause("shared", svc)
            m.resume("shared", svc)

    t1 = threading.Thread(target=run, args=(a, "replication"))
    t2 = threading.Thread(target=run, args=(b, "lifecycle"))
    t1.start(), t2.start()
    t1.join(60), t2.join(60)
    rec = a.status("shared")
    assert rec.services["replication"].generation == 20
    assert rec.services["lifecycle"].generation == 20


def test_sync_adds_restores_and_tombstones(mgr: Manager) -> None:
    report = mgr.sync_locations({"us-east-1": ["replication", "lifecycle", "ingestion"], "new-1": ["lifecycle"]})
    assert report.added == ["new-1"] and report.removed == ["eu-west-1"]
    assert report.services_added == {"us-east-1": ["ingestion"]}
    gone = mgr.status("eu-west-1")
    assert gone.deleted and [s.location for s in mgr.statuses()] == ["new-1", "us-east-1"]
    with pytest.raises(NotFound, match="removed"):
        mgr.pause("eu-west-1", "replication")
    report = mgr.sync_locations(["eu-west-1", "us-east-1", "new-1"], remove_missing=False)
    assert report.restored == ["eu-west-1"]
    assert not mgr.status("eu-west-1").deleted
    last = mgr.history("eu-west-1", limit=1)
    last_write = [e for e in mgr.history("eu-west-1", limit=10) if e.version == last[0].version]
    assert sorted((e.event, e.service) for e in last_write) == [
        ("add_service", "ingestion"), ("add_service", "lifecycle"), ("restore", "*"),
    ]


def test_sync_validates_every_name_before_writing(mgr: Manager) -> None:
    before = [mgr.status(x) for x in ("us-east-1", "eu-west-1")]
    with pytest.raises(InvalidInput, match="bad/name"):
        mgr.sync_locations(["fine-1", "bad/name"])
    with pytest.raises(InvalidInput, match="warp"):
        mgr.sync_locations({"fine-2": ["warp"]})
    assert [mgr.status(x) for x in ("us-east-1", "eu-west-1")] == before
    assert [s.location for s in mgr.statuses()] == ["eu-west-1", "us-east-1"]


def test_purge_needs_a_tombstone(mgr: Manager) -> None:
    with pytest.raises(InvalidTransition):
        mgr.purge_location("us-east-1", mgr.status("us-east-1").version)
    rec = mgr.remove_location("eu-west-1")
    mgr.purge_location("eu-west-1", rec.version)
    with pytest.raises(NotFound):
        mgr.status("eu-west-1")


def test_live_worker_keeps_pausing_until_it_acks(mgr: Manager, clock: FakeClock) -> None:
    mgr.backend.put_worker(
        WorkerInfo(worker_id="w-1", services=("replication",), lease_expires_at=clock.now + timedelta(seconds=30))
    )
    rec = mgr.pause("us-east-1", "replication")
    assert rec.services["replication"].state is State.PAUSING
    assert mgr.lagging("us-east-1", "replication") == ["w-1"]
    with pytest.raises(SettleTimeout, match="w-1") as info:
        mgr.pause("us-east-1", "replication", wait=0.2)
    assert info.value.lagging == ["w-1"]
    assert mgr.settle("us-east-1").services["replication"].state is State.PAUSING
    mgr.backend.ack("w-1", "us-east-1", "replication", rec.services["replication"].generation)
    assert mgr.settle("us-east-1").services["replication"].state is State.PAUSED


class JoinAfterWorkersRead(Partition):
    """The real backend; right after the manager's first read of the worker list, a worker
    starts: it registers with its own client (its session, on ZooKeeper) and reads the record
    it applies, as an agent's start does. ``seen``: the record that worker read."""

    def __init__(self, inner: Backend, joiner: Backend, info: WorkerInfo, location: str) -> None:
        super().__init__(inner)
        self.joiner, self.info, self.location = joiner, info, location
        self.seen: LocationStatus | None = None

    def workers(self) -> list[WorkerInfo]:
        listed = super().workers()
        if self.seen is None:
            self.joiner.put_worker(self.info)
            self.seen = self.joiner.read(self.location)
        return listed


def assert_settled_only_with_the_joiner(mgr: Manager, racing: JoinAfterWorkersRead) -> None:
    """docs/design.md §3: a service settles only once every live worker applied its
    generation. The joiner is live and acknowledged nothing, so the service may only be
    settled at a generation the joiner read (it then applies that state, not the one before)."""
    assert racing.seen is not None, "the manager never read the worker list"
    st = mgr.status(racing.location).services["replication"]
    if not st.state.transitional:
        seen = racing.seen.services["replication"]
        assert seen.generation >= st.generation, (
            f"settled {st.state.value} at generation {st.generation} while a live worker that "
            f"joined before the write read generation {seen.generation} ({seen.state.value})"
        )


def _joiner(kit: Kit, clock: FakeClock) -> WorkerInfo:
    return WorkerInfo(worker_id="w-join", services=("replication",),
                      lease_expires_at=clock.now + timedelta(hours=1))


def test_a_worker_joining_during_a_pause_is_never_settled_without(
    kit: Kit, clock: FakeClock
) -> None:
    """Model finding one_write_settle (model/README.md): the pause read the workers (none),
    a worker registered and read the running record (it starts consuming), and the pause
    landed settled ``paused`` in the same write: paused while that worker runs."""
    racing = JoinAfterWorkersRead(kit.open(), kit.open(), _joiner(kit, clock), "loc")
    m = Manager(racing, clock=clock)
    m.sync_locations(["loc"])
    rec = m.pause("loc", "replication", actor="ops")
    assert_settled_only_with_the_joiner(m, racing)
    assert racing.seen is not None and racing.seen.services["replication"].state is State.PAUSING
    assert rec.services["replication"].state is State.PAUSED  # joined after: settled at once
    assert m.lagging("loc", "replication") == ["w-join"]  # its on_pause still to run


def test_a_worker_joining_during_a_fired_resume_is_never_settled_without(
    kit: Kit, clock: FakeClock
) -> None:
    """fire_due_resumes settled in its write the same way (model/README.md, one_write_settle):
    a worker joining between its worker read and its write read the paused record, and the
    resume landed settled ``running`` before that worker applied it."""
    m = Manager(kit.open(), clock=clock)
    m.sync_locations(["loc"])
    m.pause("loc", "replication")
    m.resume("loc", "replication", at=timedelta(minutes=5))
    clock.advance(minutes=6)
    racing = JoinAfterWorkersRead(kit.open(), kit.open(), _joiner(kit, clock), "loc")
    firer = Manager(racing, clock=clock)
    fired = firer.fire_due_resumes("loc", actor="scheduler")
    assert_settled_only_with_the_joiner(firer, racing)
    assert fired.services["replication"].state is State.RUNNING
    assert [(e.event, e.actor, e.reason) for e in firer.history("loc", limit=2)] == [
        ("settle", "scheduler", "scheduled resume"), ("resume_due", "scheduler", "scheduled resume"),
    ]


class SettleFirst(Partition):
    """The real backend; right after the manager's first read of the worker list (after its
    pausing write), ``other`` settles the location: a sidecar's reconciler woken by the
    write's hint, say."""

    def __init__(self, inner: Backend, other: Manager, location: str) -> None:
        super().__init__(inner)
        self.other, self.location, self.done = other, location, False

    def workers(self) -> list[WorkerInfo]:
        listed = super().workers()
        if not self.done:
            self.done = True
            self.other.settle(self.location)
        return listed


def test_a_pause_another_process_settled_first_returns_what_it_wrote(
    kit: Kit, clock: FakeClock
) -> None:
    """The settle happens once; the call returns its own write (its op_id and version: how a
    caller tells that its call changed something), as after a lost reply."""
    other = Manager(kit.open(), clock=clock)
    m = Manager(SettleFirst(kit.open(), other, "loc"), clock=clock)
    m.sync_locations(["loc"])
    before = m.status("loc").version
    rec = m.pause("loc", "replication", actor="ops", op_id="op-ops")
    st = rec.services["replication"]
    assert (st.state, st.op_id, rec.version) == (State.PAUSING, "op-ops", before + 1)
    assert m.status("loc").services["replication"].state is State.PAUSED
    events = [(e.version, e.event, e.op_id) for e in m.history("loc", limit=2)]
    assert events[1] == (before + 1, "pause", "op-ops")
    assert events[0][:2] == (before + 2, "settle") and events[0][2] != "op-ops"


class SettleWriteFails(Partition):
    """The real backend, whose second compare-and-set (the settle after a pausing write)
    fails: the backend went away between the two writes."""

    def __init__(self, inner: Backend) -> None:
        super().__init__(inner)
        self.writes = 0

    def compare_and_set(
        self, record: LocationStatus, expected_version: int, history: Sequence[HistoryEntry]
    ) -> LocationStatus:
        self.writes += 1
        if self.writes == 2:
            raise BackendUnavailable("the backend went away (test fault injector)")
        return super().compare_and_set(record, expected_version, history)


def test_a_pause_whose_settle_fails_returns_what_landed_and_settles_later(
    kit: Kit, clock: FakeClock
) -> None:
    """The pause landed: the call reports it (pausing), not the settle's error; the next
    settle (a reconciler, check --repair, wait=) completes it."""
    m = Manager(SettleWriteFails(kit.open()), clock=clock)
    m.sync_locations(["loc"])
    rec = m.pause("loc", "replication", op_id="op-1")
    assert (rec.services["replication"].state, rec.services["replication"].op_id) == (
        State.PAUSING, "op-1"
    )
    assert m.settle("loc").services["replication"].state is State.PAUSED


def test_a_worker_whose_lease_expired_stops_blocking(mgr: Manager, clock: FakeClock) -> None:
    mgr.backend.put_worker(
        WorkerInfo(worker_id="w-1", services=("replication",), lease_expires_at=clock.now + timedelta(seconds=10))
    )
    assert mgr.pause("us-east-1", "replication").services["replication"].state is State.PAUSING
    clock.advance(seconds=11)
    assert mgr.settle("us-east-1").services["replication"].state is State.PAUSED


def test_a_standing_registration_whose_holder_is_away_keeps_a_pause_pausing_until_retired(
    mgr: Manager, kit: Kit, clock: FakeClock
) -> None:
    """docs/agent.md "Standing registrations": its holder gone (backend closed, lease run
    out), it still counts; the wait names it as away, since when; retiring it settles."""
    holder = kit.open()
    lease = clock.now + timedelta(seconds=10)
    holder.put_worker(WorkerInfo(worker_id="bb.zenko", services=("replication",),
                                 lease_expires_at=None if holder.session_leases else lease,
                                 host="bridge-host", pid=42, standing=True))
    holder.close()
    clock.advance(seconds=11)
    _until(lambda: [w.worker_id for w in mgr.workers()] == ["bb.zenko"])
    assert mgr.pause("us-east-1", "replication").services["replication"].state is State.PAUSING
    assert mgr.lagging("us-east-1", "replication") == ["bb.zenko"]
    with pytest.raises(SettleTimeout) as info:
        mgr.pause("us-east-1", "replication", wait=0.2)
    since = "(no session holds it)" if mgr.backend.session_leases else "since 2026-03-01T09:00:10Z"
    assert f"bb.zenko (standing registration, holder away {since}: its holder (host " \
           "bridge-host, pid 42) is not running; start it again; retire it only once what it stands for is gone for good " \
           "(the pauses it holds back then settle without it): locstatus workers retire bb.zenko)" in str(info.value), str(info.value)
    assert info.value.lagging == ["bb.zenko"]
    assert mgr.settle("us-east-1").services["replication"].state is State.PAUSING
    [view] = mgr.worker_statuses().workers
    assert view.standing and view.away and view.live
    retired = mgr.retire_worker("bb.zenko", actor="ops")
    assert retired.worker_id == "bb.zenko" and retired.standing
    assert mgr.workers() == []
    assert mgr.settle("us-east-1").services["replication"].state is State.PAUSED
    with pytest.raises(NotFound, match=r"no worker 'bb\.zenko' is registered"):
        mgr.retire_worker("bb.zenko")
    with pytest.raises(InvalidInput, match="invalid worker id"):
        mgr.retire_worker("a/b")


def test_a_worker_for_other_locations_does_not_block(mgr: Manager, clock: FakeClock) -> None:
    mgr.backend.put_worker(
        WorkerInfo(
            worker_id="w-eu", services=("replication",), locations=("eu-west-1",),
            lease_expires_at=clock.now + timedelta(seconds=30),
        )
    )
    assert state(mgr, "us-east-1", "replication") is State.RUNNING
    assert mgr.pause("us-east-1", "replication").services["replication"].state is State.PAUSED
    assert mgr.pause("eu-west-1", "replication").services["replication"].state is State.PAUSING


def _until(probe: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait for another client's write to show (ZooKeeper lists workers from a copy that its
    watches drop a moment after the write)."""
    deadline = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < deadline, "the store never showed the write"
        time.sleep(0.02)


def test_a_worker_whose_registration_cannot_be_read_keeps_a_pause_pausing(
    mgr: Manager, kit: Kit
) -> None:
    """A hand edit leaves a registration that does not parse: it may be a running worker, so
    no pause settles without its acknowledgement (docs/agent.md "Unreadable registrations and
    acknowledgements"); the wait names it; once it acknowledges, the pause settles."""
    kit.write_raw_worker("w-bad", '{"worker_id": "w-bad", "services": 7}')
    _until(lambda: [w.worker_id for w in mgr.workers()] == ["w-bad"])
    rec = mgr.pause("us-east-1", "replication")
    assert rec.services["replication"].state is State.PAUSING
    assert mgr.lagging("us-east-1", "replication") == ["w-bad"]
    with pytest.raises(SettleTimeout, match="w-bad"):
        mgr.pause("us-east-1", "replication", wait=0.2)
    assert mgr.settle("us-east-1").services["replication"].state is State.PAUSING
    mgr.backend.ack("w-bad", "us-east-1", "replication", rec.services["replication"].generation)
    assert mgr.settle("us-east-1").services["replication"].state is State.PAUSED


def test_an_acknowledgement_that_cannot_be_read_settles_nothing(
    mgr: Manager, kit: Kit, clock: FakeClock
) -> None:
    mgr.backend.put_worker(
        WorkerInfo(worker_id="w-1", services=("replication",),
                   lease_expires_at=clock.now + timedelta(seconds=30))
    )
    rec = mgr.pause("us-east-1", "replication")
    mgr.backend.ack("w-1", "us-east-1", "replication", rec.services["replication"].generation)
    kit.damage_ack("us-east-1", "w-1", "replication")
    assert mgr.lagging("us-east-1", "replication") == ["w-1"]
    assert mgr.settle("us-east-1").services["replication"].state is State.PAUSING


# -- retries and ambiguous commits, with a backend that misbehaves on purpose ---------------------


class Flaky:
    """Wraps a backend: the first ``conflicts`` writes lose a race (another writer bumps the
    record first); ``ambiguous_after_commit`` writes commit and then report an ambiguous outcome,
    as a connection lost after send would (``between`` runs first: other writers' writes before
    the caller can look); ``ambiguous_before_commit`` writes report it without committing."""

    def __init__(self, inner: Backend, conflicts: int = 0, ambiguous_after_commit: int = 0,
                 ambiguous_before_commit: int = 0,
                 between: Callable[[], None] | None = None) -> None:
        self.inner = inner
        self.conflicts = conflicts
        self.after = ambiguous_after_commit
        self.before = ambiguous_before_commit
        self.between = between

    def compare_and_set(
        self, record: LocationStatus, expected_version: int, history: list[HistoryEntry]
    ) -> LocationStatus:
        if self.conflicts:
            self.conflicts -= 1
            cur = self.inner.read(record.location)
            self.inner.compare_and_set(cur, cur.version, [])  # a competing writer
            raise VersionConflict("lost a race")
        if self.before:
            self.before -= 1
            raise AmbiguousCommit("connection lost before the write reached the server")
        stored = self.inner.compare_and_set(record, expected_version, history)
        if self.after:
            self.after -= 1
            if self.between is not None:
                self.between()  # others write before the retry reads
            raise AmbiguousCommit("connection lost after send")
        return stored

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def flaky_manager(kit: Kit, **kw: int) -> Manager:
    retry = RetryPolicy(max_attempts=4, base=0.0001, cap=0.001) if kw.get("conflicts", 0) > 100 else None
    m = Manager(cast(Backend, Flaky(kit.open(), **kw)), retry=retry)
    m.sync_locations(["loc"])
    return m


def _ops(hist: list[HistoryEntry], op_id: str) -> list[str]:
    return [e.event for e in hist if e.op_id == op_id]


def test_conflicts_are_retried_and_the_event_reapplied(kit: Kit) -> None:
    m = flaky_manager(kit, conflicts=5)
    rec = m.pause("loc", "replication", op_id="op-retry")
    assert rec.services["replication"].state is State.PAUSED
    assert _ops(m.history("loc", limit=50), "op-retry") == ["settle", "pause"]


def test_conflicts_beyond_the_budget_are_a_clear_conflict_error(kit: Kit) -> None:
    m = flaky_manager(kit, conflicts=1000)
    with pytest.raises(ConflictError, match="4 attempts"):
        m.pause("loc", "replication", op_id="op-give-up")
    assert _ops(m.history("loc", limit=50), "op-give-up") == []


def test_an_ambiguous_commit_that_landed_is_not_applied_twice(kit: Kit) -> None:
    m = flaky_manager(kit, ambiguous_after_commit=1)
    rec = m.pause("loc", "replication", op_id="op-amb")
    assert rec.services["replication"].op_id == "op-amb"
    assert _ops(m.history("loc", limit=50), "op-amb") == ["settle", "pause"]


def test_an_ambiguous_commit_that_landed_is_not_applied_again_however_many_writes_followed(
    kit: Kit, clock: FakeClock
) -> None:
    """Issue 15: the landed write was looked for in the newest 200 history entries only, so
    after bob's 120 bulk writes (6 entries each; more than MongoDB's 100 embedded writes too)
    the retry paused replication again and reverted bob's later resume."""
    bob = Manager(kit.open(), clock=clock)

    def bob_writes() -> None:
        for _ in range(60):
            bob.pause("loc", actor="bob", reason="drill")
            bob.resume("loc", actor="bob")

    alice = Manager(cast(Backend, Flaky(kit.open(), ambiguous_after_commit=1, between=bob_writes)),
                    clock=clock)
    alice.sync_locations({"loc": ["replication", "lifecycle", "ingestion"]})
    before = alice.status("loc").version
    rec = alice.pause("loc", "replication", actor="alice", reason="INC-1", op_id="op-alice")
    assert alice.stats["ambiguous"] == 1
    assert rec.version == before + 1 and rec.services["replication"].op_id == "op-alice"
    now = bob.status("loc")
    assert now.version == before + 241  # bob's 120 calls each pause or resume, then settle
    assert {s: st.state for s, st in now.services.items()} == dict.fromkeys(
        ("replication", "lifecycle", "ingestion"), State.RUNNING
    )  # bob's last resume stands
    # alice's pause once; bob's writes took replication over before alice's settle could
    assert _ops(bob.history("loc", limit=10_000), "op-alice") == ["pause"]


def test_an_ambiguous_commit_that_did_not_land_is_applied_once(kit: Kit) -> None:
    m = flaky_manager(kit, ambiguous_before_commit=1)
    m.pause("loc", "replication", op_id="op-lost")
    assert _ops(m.history("loc", limit=50), "op-lost") == ["settle", "pause"]


def test_scheduling_keeps_the_reason_of_the_pause(mgr: Manager) -> None:
    mgr.pause("us-east-1", "replication", reason="fiber cut", actor="ops")
    rec = mgr.resume("us-east-1", "replication", at=timedelta(hours=1))
    assert (rec.services["replication"].reason, rec.services["replication"].actor) == ("fiber cut", "ops")


def test_history_rows_name_only_the_actor_and_reason_of_their_own_call(mgr: Manager) -> None:
    """Issue 15: an anonymous schedule and bob's cancel were rows 'schedule_resume alice INC-1'
    and 'cancel_scheduled_resume bob INC-1'; the status may keep the pause's reason."""
    mgr.pause("us-east-1", "replication", actor="alice", reason="INC-1")
    mgr.resume("us-east-1", "replication", at=timedelta(hours=1))
    rec = mgr.cancel_scheduled_resume("us-east-1", "replication", actor="bob")
    rows = [(e.event, e.actor, e.reason) for e in mgr.history("us-east-1", limit=4)]
    assert rows == [
        ("cancel_scheduled_resume", "bob", None),
        ("schedule_resume", None, None),
        ("settle", "alice", "INC-1"),  # in alice's write: no worker applies it
        ("pause", "alice", "INC-1"),
    ]
    assert rec.services["replication"].reason is None  # bob gave none


def test_the_status_never_shows_a_reason_beside_someone_who_did_not_give_it(mgr: Manager) -> None:
    """A new-user review: alice paused for INC-1, bob cancelled the schedule, and the status
    read 'INC-1 by bob', as if bob had paused for INC-1. Reason and actor are one pair, that of
    the last change that gave either (docs/cli.md, "Reading state")."""
    mgr.pause("us-east-1", "replication", actor="alice", reason="INC-1")
    rec = mgr.resume("us-east-1", "replication", at=timedelta(hours=1))  # anonymous: kept
    assert (rec.services["replication"].reason, rec.services["replication"].actor) == (
        "INC-1", "alice")
    rec = mgr.cancel_scheduled_resume("us-east-1", "replication", actor="bob")
    assert (rec.services["replication"].reason, rec.services["replication"].actor) == (
        None, "bob")
    rec = mgr.resume("us-east-1", "replication", at=timedelta(hours=1), reason="window")
    assert (rec.services["replication"].reason, rec.services["replication"].actor) == (
        "window", None)


_CALLS = st.tuples(
    st.sampled_from(["pause", "resume", "schedule", "cancel", "ack_and_settle", "fire_due"]),
    st.sampled_from([None, "replication", "lifecycle"]),
    st.sampled_from([None, "alice", "bob"]),
    st.sampled_from([None, "INC-1", "INC-2"]),
    st.integers(1, 120),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_CALLS, min_size=1, max_size=25))
def test_every_history_row_carries_exactly_what_its_own_call_passed(
    calls: list[tuple[str, str | None, str | None, str | None, int]],
) -> None:
    """Property over operator sequences: each call's rows (the versions it wrote) name the
    actor and reason that call passed, none other; a worker applies lifecycle, so its
    transitions settle in a later call of their own (which passes none)."""
    clock = FakeClock(START)
    m = Manager(MemoryBackend(f"memory://{uuid.uuid4().hex}"), clock=clock)
    m.sync_locations({"loc": ["replication", "lifecycle"]})
    m.backend.put_worker(WorkerInfo(worker_id="w", services=("lifecycle",),
                                    lease_expires_at=START + timedelta(days=30)))
    for op, svc, actor, reason, minutes in calls:
        before = m.status("loc").version
        passed: tuple[str | None, str | None] = (actor, reason)
        try:
            if op == "pause":
                m.pause("loc", svc, actor=actor, reason=reason)
            elif op == "resume":
                m.resume("loc", svc, actor=actor, reason=reason)
            elif op == "schedule":
                m.resume("loc", svc, at=timedelta(minutes=minutes), actor=actor, reason=reason)
            elif op == "cancel":
                m.cancel_scheduled_resume("loc", svc, actor=actor, reason=reason)
            elif op == "ack_and_settle":
                generation = m.status("loc").services["lifecycle"].generation
                m.backend.ack("w", "loc", "lifecycle", generation)
                m.settle("loc", svc)
                passed = (None, None)
            else:
                clock.advance(minutes=minutes)
                m.fire_due_resumes("loc", actor="scheduler")
                passed = ("scheduler", "scheduled resume")
        except InvalidTransition:
            pass  # scheduling a running service: refused, nothing written
        rows = [e for e in m.history("loc", limit=1000) if e.version > before]
        assert [(e.event, e.actor, e.reason) for e in rows] == [
            (e.event, *passed) for e in rows
        ]


def test_over_long_notes_are_refused_before_any_write(mgr: Manager) -> None:
    before = mgr.status("us-east-1")
    with pytest.raises(InvalidInput, match="1024"):
        mgr.pause("us-east-1", "replication", reason="r" * 1025)
    with pytest.raises(InvalidInput, match="actor"):
        mgr.pause("us-east-1", "replication", actor=42)  # type: ignore[arg-type]
    assert mgr.status("us-east-1") == before


def test_all_is_reserved_for_bulk_operations(mgr: Manager) -> None:
    with pytest.raises(InvalidInput, match="reserved"):
        mgr.sync_locations(["all"])


def test_history_of_an_unknown_location_is_not_found(mgr: Manager) -> None:
    with pytest.raises(NotFound, match="atlantis"):
        mgr.history("atlantis")


def test_sync_leaves_a_corrupt_record_alone_and_carries_on(kit: Kit, clock: FakeClock) -> None:
    m = Manager(kit.open(), clock=clock)
    kit.write_raw("broken-1", "{not json")
    report = m.sync_locations(["broken-1", "fine-1"])
    assert report.corrupt == ["broken-1"] and report.added == ["fine-1"]
    assert [s.location for s in m.statuses()] == ["fine-1"]


class DownAfterAmbiguity(Flaky):
    """The write lands, the connection drops, and the backend stays unreachable."""

    def read(self, location: str) -> LocationStatus:
        if self.after == 0 and self.tripped:
            raise BackendUnavailable("backend did not answer")
        return self.inner.read(location)

    tripped = False

    def compare_and_set(
        self, record: LocationStatus, expected_version: int, history: list[HistoryEntry]
    ) -> LocationStatus:
        self.tripped = True
        return super().compare_and_set(record, expected_version, history)


def test_an_unresolvable_ambiguous_commit_says_the_outcome_is_unknown(kit: Kit) -> None:
    m = Manager(cast(Backend, DownAfterAmbiguity(kit.open(), ambiguous_after_commit=1)))
    m.backend.inner.create(  # type: ignore[attr-defined]
        LocationStatus(location="loc", services={"replication": ServiceStatus()}), []
    )
    with pytest.raises(AmbiguousCommit, match="op-unknown"):
        m.pause("loc", "replication", op_id="op-unknown")


# -- the version hint: a first attempt planned from the last record seen ----------------------


@pytest.fixture
def two(kit: Kit, clock: FakeClock, mgr: Manager) -> tuple[Manager, Manager]:
    """Two operators (two managers, two clients of the same store): ``a`` has seen
    ``us-east-1``; ``b`` changes it behind ``a``'s back."""
    b = Manager(kit.open(), clock=clock)
    mgr.status("us-east-1")
    return mgr, b


def test_a_stale_hint_never_turns_a_pause_into_a_no_op(two: tuple[Manager, Manager]) -> None:
    a, b = two
    a.pause("us-east-1", "replication")  # a's hint: paused
    b.resume("us-east-1", "replication")  # now running; a has not read it
    rec = a.pause("us-east-1", "replication")
    assert rec.services["replication"].state is State.PAUSED
    assert [e.event for e in a.history("us-east-1", limit=4)] == [
        "settle", "pause", "settle", "resume"]


def test_a_stale_hint_never_refuses_a_valid_event(two: tuple[Manager, Manager]) -> None:
    a, b = two  # a's hint: running, where scheduling a resume is refused
    b.pause("us-east-1", "replication")
    rec = a.resume("us-east-1", "replication", at=timedelta(hours=1))
    assert rec.services["replication"].resume_at == START + timedelta(hours=1)


def test_a_stale_hint_costs_a_conflict_not_a_lost_update(two: tuple[Manager, Manager]) -> None:
    a, b = two
    b.pause("us-east-1", "lifecycle")  # a's hint is one version behind
    rec = a.pause("us-east-1", "replication")
    assert {s: st.state for s, st in rec.services.items()} == {
        "replication": State.PAUSED, "lifecycle": State.PAUSED}
    assert a.stats["stale_hints"] == 1 and a.stats["conflicts"] == 0
    a.resume("us-east-1", "replication")  # the hint is current now: no read, no conflict
    assert a.stats["stale_hints"] == 1


class _Reads(Partition):
    """The real backend, counting the records read one at a time."""

    def __init__(self, inner: Backend) -> None:
        super().__init__(inner)
        self.reads = 0

    def read(self, location: str) -> LocationStatus:
        self.reads += 1
        return super().read(location)


def test_a_conflict_is_planned_again_from_the_record_it_came_back_with(
    kit: Kit, clock: FakeClock, mgr: Manager,
) -> None:
    """The record a refused compare-and-set comes back with is as fresh as a read, so the
    next attempt plans from it: a pause planned from a stale hint is a refused write and a
    write, no read between (docs/design.md §3.1; found by bench/bridge.py --store zk, where
    every pause paid a read for it). ZooKeeper's refusal carries no record: it reads."""
    counted = _Reads(kit.open())
    a = Manager(counted, clock=clock)
    a.status("us-east-1")
    mgr.pause("us-east-1", "lifecycle")  # a's hint is two versions behind
    counted.reads = 0
    rec = a.pause("us-east-1", "replication")
    assert {s: st.state for s, st in rec.services.items()} == {
        "replication": State.PAUSED, "lifecycle": State.PAUSED}
    brought_back = kit.name != "zk"
    assert counted.reads == (0 if brought_back else 1)
    assert (a.stats["stale_hints"], a.stats["replanned"]) == (1, int(brought_back))
    ops = [e.event for e in a.history("us-east-1", limit=4)]
    assert ops == ["settle", "pause", "settle", "pause"]


def test_a_location_another_process_keeps_writing_is_read_first(
    kit: Kit, clock: FakeClock, mgr: Manager,
) -> None:
    """Once a location's hint proved stale, the next write reads first (one round trip)
    rather than planning from the hint again and being refused; once a read finds the
    location where this manager left it, the hint is used again (docs/design.md §3.1)."""
    counted = _Reads(kit.open())
    a = Manager(counted, clock=clock)
    a.status("us-east-1")
    mgr.pause("us-east-1", "lifecycle")
    a.pause("us-east-1", "replication")  # refused once: the hint was stale
    mgr.resume("us-east-1", "lifecycle")
    counted.reads = 0
    a.resume("us-east-1", "replication")  # read first: no refused write
    assert (counted.reads, a.stats["stale_hints"]) == (1, 1)
    a.pause("us-east-1", "replication")  # read first again, found as a left it
    a.resume("us-east-1", "replication")  # the hint again
    assert (counted.reads, a.stats["stale_hints"]) == (2, 1)
    assert state(a, "us-east-1", "replication") is State.RUNNING


_OWN_OPS = st.lists(
    st.sampled_from(["pause", "resume", "schedule", "cancel"]), min_size=1, max_size=6
)


def _run_own(m: Manager, loc: str, svc: str, ops: list[str], base: int) -> list[str]:
    """``ops`` on ``svc`` of ``loc``, each from the manager's own (possibly stale) hint: what
    each call ended as (its resulting state, or ``refused``)."""
    out: list[str] = []
    for k, op in enumerate(ops):
        try:
            if op == "pause":
                rec = m.pause(loc, svc)
            elif op == "resume":
                rec = m.resume(loc, svc)
            elif op == "schedule":
                rec = m.resume(loc, svc, at=START + timedelta(hours=base + k + 1))
            else:
                rec = m.cancel_scheduled_resume(loc, svc)
        except InvalidTransition:
            out.append("refused")
            continue
        out.append(rec.services[svc].state.value)
    return out


def _own_history(m: Manager, loc: str, svc: str) -> list[tuple[object, ...]]:
    return [
        (e.event, e.from_state, e.to_state, e.generation, e.resume_at)
        for e in reversed(m.history(loc, limit=500)) if e.service == svc
    ]


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plans=st.tuples(_OWN_OPS, _OWN_OPS, _OWN_OPS))
def test_concurrent_writers_planning_from_each_others_conflicts_lose_and_revert_nothing(
    kit: Kit, plans: tuple[list[str], list[str], list[str]],
) -> None:
    """Three managers (three clients of one store) each change their own service of one
    record at once, every write planned from a record another writer made stale, so they keep
    conflicting and planning again from the record each refused write came back with
    (docs/design.md §3.1). Each service ends exactly as its writer's calls made it alone (run
    one after the other on a store of its own): same answers, same state, generation and
    schedule, same history, and one write per version; no write of one service undid
    another's."""
    clock = FakeClock(START)
    services = ("replication", "lifecycle", "ingestion")
    loc = f"hot-{uuid.uuid4().hex[:8]}"
    managers = [Manager(kit.open(), clock=clock) for _ in services]
    managers[0].sync_locations({loc: list(services)})
    for m in managers:
        m.status(loc)  # every hint current now, stale after the first write
    answers: dict[str, list[str]] = {}
    barrier = threading.Barrier(len(services))

    def run(i: int) -> None:
        barrier.wait()
        answers[services[i]] = _run_own(managers[i], loc, services[i], plans[i], 10 * i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(services))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    alone = Manager(MemoryBackend(f"memory://{uuid.uuid4().hex}"), clock=FakeClock(START))
    alone.sync_locations({loc: list(services)})
    final = managers[0].status(loc)
    for i, svc in enumerate(services):
        assert answers[svc] == _run_own(alone, loc, svc, plans[i], 10 * i), svc
        want = alone.status(loc).services[svc]
        got = final.services[svc]
        assert (got.state, got.generation, got.resume_at) == (
            want.state, want.generation, want.resume_at), svc
        assert _own_history(managers[0], loc, svc) == _own_history(alone, loc, svc), svc
    versions = [e.version for e in managers[0].history(loc, limit=500)]
    writes = sorted(set(versions))
    assert writes == list(range(writes[0], final.version + 1))


def test_if_match_is_judged_on_the_stored_version_not_the_hint(
    two: tuple[Manager, Manager],
) -> None:
    a, b = two
    seen = a.status("us-east-1").version
    now = b.pause("us-east-1", "lifecycle").version
    with pytest.raises(PreconditionFailed):
        a.pause("us-east-1", "replication", if_version=seen)
    assert a.pause("us-east-1", "replication", if_version=now).version == now + 2  # and settled


def test_a_hint_of_a_removed_location_is_not_used(two: tuple[Manager, Manager]) -> None:
    a, b = two
    b.remove_location("us-east-1")
    with pytest.raises(NotFound, match="removed"):
        a.pause("us-east-1", "replication")


class _PurgedAfterCreateRefused(Partition):
    """The real backend; the first create is refused as if the location existed, and it is
    gone by the time it is read: a tombstone purged by the check job in between."""

    def __init__(self, inner: Backend) -> None:
        super().__init__(inner)
        self.refused = False

    def create(self, record: LocationStatus, history: Sequence[HistoryEntry]) -> LocationStatus:
        if not self.refused:
            self.refused = True
            raise AlreadyExists(f"location {record.location!r} already exists")
        return super().create(record, history)


def test_adding_a_location_purged_meanwhile_creates_it(kit: Kit, clock: FakeClock) -> None:
    """Found by the reliability review: add_location raised NotFound when the location was
    purged between its create (refused: it existed) and the read of the restore."""
    racing = Manager(_PurgedAfterCreateRefused(kit.open()), clock=clock)
    rec = racing.add_location("purged-meanwhile", ["replication"])
    assert rec.location == "purged-meanwhile" and not rec.deleted
    assert list(rec.services) == ["replication"]
    report = Manager(_PurgedAfterCreateRefused(kit.open()), clock=clock).sync_locations(
        ["synced-meanwhile"], remove_missing=False)
    assert report.added == ["synced-meanwhile"]


@settings(max_examples=300, deadline=None)
@given(
    standing=st.booleans(),
    away=st.booleans(),
    lease=st.one_of(st.none(), st.integers(min_value=-100, max_value=100)),
    acked=st.integers(min_value=-1, max_value=3),
)
def test_a_standing_registration_is_always_live_and_an_ordinary_one_judged_by_its_lease(
    standing: bool, away: bool, lease: int | None, acked: int
) -> None:
    """The settle rule with standing registrations (docs/agent.md "Standing registrations"):
    standing counts whatever its lease or session; an ordinary registration exactly as before
    (alive while its deadline has not passed); away is only ever a standing one's."""
    from locstatus.clock import CallerClock
    from locstatus.manager import away_note, holder_away, lagging_workers, worker_live

    now = START
    ts = CallerClock(lambda: now)
    w = WorkerInfo.model_construct(
        worker_id="w", services=("replication",), locations=None, host="h", pid=1,
        lease_expires_at=None if lease is None else now + timedelta(seconds=lease),
        errors={}, stuck={}, standing=standing, away=away and standing, corrupt=None,
        started_at=None, clock_offset_seconds=None)
    lease_holds = lease is None or lease > 0  # a deadline reached is past
    assert worker_live(w, ts) is (standing or lease_holds)
    assert holder_away(w, ts) is (standing and (away or not lease_holds))
    assert (away_note(w, ts) is not None) is holder_away(w, ts)
    lagging = lagging_workers("loc", "replication", 2, [w], {"w": {"replication": acked}}, ts)
    assert lagging == (["w"] if acked < 2 and (standing or lease_holds) else [])


def test_worker_statuses_list_lag_only_where_a_transition_waits(
    mgr: Manager, kit: Kit, clock: FakeClock
) -> None:
    """docs/fsm.md (the settle rule): only a pausing/resuming service waits for
    acknowledgements, so a worker lags only there; a settled service it never acknowledged
    (registered after it settled, or its ZooKeeper acknowledgements gone with a session) is no
    lag, as /metrics and the check judge it."""
    assert mgr.pause("us-east-1", "replication").services["replication"].state is State.PAUSED
    holder = kit.open()
    try:
        holder.put_worker(WorkerInfo(
            worker_id="bb.late", services=("replication",), host="bridge-host", pid=42,
            standing=True,
            lease_expires_at=None if holder.session_leases else clock.now + timedelta(hours=1)))
        _until(lambda: [w.worker_id for w in mgr.workers()] == ["bb.late"])
        [view] = mgr.worker_statuses().workers
        assert view.lagging == []
        assert mgr.pause("eu-west-1", "replication").services["replication"].state \
            is State.PAUSING
        [view] = mgr.worker_statuses().workers
        assert [(lag.location, lag.service, lag.acked, lag.generation)
                for lag in view.lagging] == [("eu-west-1", "replication", 0, 1)]
    finally:
        holder.close()


def test_a_retirement_racing_a_holder_taking_the_registration_over_leaves_it_counting(
    kit: Kit, mgr: Manager, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/agent.md "Standing registrations", Judged in the removal: a retirement judges the
    holder away, and a holder in another process (a bridge starting) takes the registration
    over before the removal lands. The removal is judged in its own atomic step (heartbeat
    backends: the lease deadline judged; ZooKeeper: no other session holds it), so the
    taken-over registration is kept (HolderPresent, naming the new holder) and a pause
    waits for it."""
    b, taker = mgr.backend, kit.open()
    b.put_worker(WorkerInfo(worker_id="bb.1", services=("replication",), host="h1", pid=1,
                            lease_expires_at=START - timedelta(seconds=5), standing=True))
    remove = b.remove_worker

    def taken_over_first(worker_id: str, **kw: object) -> bool:
        taker.put_worker(WorkerInfo(worker_id="bb.1", services=("replication",), host="h2",
                                    pid=2, lease_expires_at=clock() + timedelta(seconds=60),
                                    standing=True))
        return remove(worker_id, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(b, "remove_worker", taken_over_first)
    try:
        with pytest.raises(HolderPresent, match=r"host h2, pid 2\), registered again just now"):
            mgr.retire_worker("bb.1", actor="ops")
        assert [(w.worker_id, w.host) for w in mgr.workers()] == [("bb.1", "h2")]
        mgr.pause("eu-west-1", "replication")
        assert state(mgr, "eu-west-1", "replication") is State.PAUSING
    finally:
        taker.close()
