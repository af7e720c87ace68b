"""The manager's one bulk operation (``Manager.bulk``) on every backend: every location or a
list of them, the per-location report (changed, unchanged, skipped with why, failed with the
error), ``wait=`` naming the lagging workers per location, progress, and a Ctrl-C that still
returns the report of what was done (locstatus/manager/bulk.py, docs/cli.md and docs/http.md
"Bulk")."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from locstatus import (
    CorruptRecord,
    InvalidInput,
    InvalidTransition,
    Manager,
    NotFound,
    SettleTimeout,
    State,
    WorkerInfo,
)
from locstatus.backends import Backend
from locstatus.backends.memory import MemoryBackend
from locstatus.errors import AmbiguousCommit
from locstatus.manager import BulkInterrupted, BulkItem, BulkReport, Operation, Outcome
from locstatus.models import HistoryEntry, LocationStatus

from support.agent_worker import Partition
from support.fakeclock import FakeClock
from support.kits import Kit

START = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
LOCATIONS = {
    "ap-1": ["replication", "lifecycle"],
    "eu-1": ["replication"],
    "us-1": ["replication", "lifecycle", "ingestion"],
}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def mgr(kit: Kit, clock: FakeClock) -> Iterator[Manager]:
    m = Manager(kit.open(), clock=clock)
    m.sync_locations(LOCATIONS)
    yield m


def outcomes(report: BulkReport) -> dict[str, Outcome]:
    return {i.location: i.outcome for i in report.items}


def _until(probe: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait for another client's write to show (ZooKeeper lists workers from a watched copy)."""
    deadline = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < deadline, "the store never showed the write"
        time.sleep(0.02)


def test_pause_every_location_reports_each_and_a_second_run_changes_nothing(
    mgr: Manager,
) -> None:
    report = mgr.bulk(Operation.pause("replication", reason="outage", actor="ops"), op_id="bulk-1")
    assert outcomes(report) == dict.fromkeys(LOCATIONS, Outcome.CHANGED)
    assert report.ok and report.refusal is None and report.op_id == "bulk-1"
    for item in report.items:
        assert item.changed == ("replication",)
        assert item.status is not None
        svc = item.status.services["replication"]
        # no live worker: settled right after the write, by the same operation
        assert (svc.state, svc.op_id, svc.reason, svc.actor) == (
            State.PAUSED, "bulk-1", "outage", "ops",
        )
        assert mgr.status(item.location) == item.status
    again = mgr.bulk(Operation.pause("replication"))
    assert outcomes(again) == dict.fromkeys(LOCATIONS, Outcome.UNCHANGED)
    assert all(i.changed == () for i in again.items)
    assert {r.location: r.version for r in mgr.statuses()} == {
        i.location: i.status.version for i in report.items if i.status is not None
    }


def test_a_list_of_locations_acts_on_those_only_and_an_unknown_one_fails(mgr: Manager) -> None:
    report = mgr.bulk(Operation.pause(), ["us-1", "atlantis", "us-1", "eu-1"])
    assert [i.location for i in report.items] == ["atlantis", "eu-1", "us-1"]
    assert outcomes(report) == {
        "atlantis": Outcome.FAILED, "eu-1": Outcome.CHANGED, "us-1": Outcome.CHANGED,
    }
    assert isinstance(report.failed[0].error, NotFound) and not report.ok
    assert mgr.status("ap-1").services["replication"].state is State.RUNNING
    assert set(report.of(Outcome.CHANGED)[1].changed) == set(LOCATIONS["us-1"])


def test_locations_without_the_service_are_skipped_with_why(mgr: Manager) -> None:
    report = mgr.bulk(Operation.pause("ingestion"))
    assert outcomes(report) == {
        "ap-1": Outcome.SKIPPED, "eu-1": Outcome.SKIPPED, "us-1": Outcome.CHANGED,
    }
    assert {i.why for i in report.of(Outcome.SKIPPED)} == {"has no ingestion"}
    assert mgr.status("us-1").services["lifecycle"].state is State.RUNNING
    refused = mgr.bulk(Operation.pause("ingestion"), ["ap-1", "eu-1"])
    assert isinstance(refused.refusal, InvalidTransition) and not refused.ok
    assert "ingestion" in refused.refusal.message


def test_a_schedule_skips_locations_with_nothing_paused(mgr: Manager, clock: FakeClock) -> None:
    mgr.pause("eu-1")
    report = mgr.bulk(Operation.resume(at=timedelta(hours=2)))
    assert outcomes(report) == {
        "ap-1": Outcome.SKIPPED, "eu-1": Outcome.CHANGED, "us-1": Outcome.SKIPPED,
    }
    assert {i.why for i in report.of(Outcome.SKIPPED)} == {"nothing paused to schedule"}
    assert mgr.status("eu-1").services["replication"].resume_at == clock.now + timedelta(hours=2)
    cancelled = mgr.bulk(Operation.cancel_scheduled_resume())
    assert outcomes(cancelled)["eu-1"] is Outcome.CHANGED
    assert mgr.status("eu-1").services["replication"].resume_at is None
    mgr.resume("eu-1")
    refused = mgr.bulk(Operation.resume(at=timedelta(hours=2)))
    assert isinstance(refused.refusal, InvalidTransition)
    assert "paused" in refused.refusal.message


def test_an_empty_store_is_refused_as_not_found(kit: Kit, clock: FakeClock) -> None:
    report = Manager(kit.open(), clock=clock).bulk(Operation.pause())
    assert report.items == [] and isinstance(report.refusal, NotFound)
    assert "locations sync" in report.refusal.message


def test_removed_locations_are_outside_and_a_corrupt_record_fails(
    mgr: Manager, kit: Kit
) -> None:
    mgr.remove_location("ap-1")
    kit.write_raw("broken-1", "{not json")
    report = mgr.bulk(Operation.pause("replication"))
    assert outcomes(report) == {
        "broken-1": Outcome.FAILED, "eu-1": Outcome.CHANGED, "us-1": Outcome.CHANGED,
    }
    failed = report.failed[0]
    assert isinstance(failed.error, CorruptRecord) and failed.status is None
    assert mgr.status("ap-1").services["replication"].state is State.RUNNING


def test_wait_names_the_lagging_worker_of_each_location(mgr: Manager, clock: FakeClock) -> None:
    """One shared deadline; the location a live worker applies fails with its SettleTimeout
    naming that worker, the other settles (nobody applies it)."""
    mgr.backend.put_worker(
        WorkerInfo(
            worker_id="w-eu", services=("replication",), locations=("eu-1",),
            lease_expires_at=clock.now + timedelta(seconds=60),
        )
    )
    _until(lambda: [w.worker_id for w in mgr.workers()] == ["w-eu"])
    started = time.monotonic()
    report = mgr.bulk(Operation.pause("replication"), ["eu-1", "us-1"], wait=0.5)
    assert time.monotonic() - started < 5
    assert outcomes(report) == {"eu-1": Outcome.FAILED, "us-1": Outcome.CHANGED}
    lagging = report.failed[0]
    assert isinstance(lagging.error, SettleTimeout) and "w-eu" in lagging.error.message
    assert mgr.status("eu-1").services["replication"].state is State.PAUSING
    assert mgr.status("us-1").services["replication"].state is State.PAUSED
    # the worker applies it: the next wait settles it
    mgr.backend.ack("w-eu", "eu-1", "replication", 1)
    settled = mgr.bulk(Operation.pause("replication"), ["eu-1"], wait=5)
    assert outcomes(settled) == {"eu-1": Outcome.UNCHANGED}
    assert settled.items[0].status is not None
    assert settled.items[0].status.services["replication"].state is State.PAUSED


def test_progress_is_called_once_per_location_as_it_is_decided(mgr: Manager) -> None:
    calls: list[tuple[str, Outcome, int, int | None]] = []

    def progress(item: BulkItem, done: int, total: int | None) -> None:
        calls.append((item.location, item.outcome, done, total))

    report = mgr.bulk(Operation.pause("lifecycle"), progress=progress)
    assert [c[2] for c in calls] == [1, 2, 3] and {c[3] for c in calls} == {3}
    assert {c[0]: c[1] for c in calls} == outcomes(report)


def test_ctrl_c_stops_cleanly_and_raises_the_report_of_what_was_done(mgr: Manager) -> None:
    seen: list[str] = []

    def progress(item: BulkItem, done: int, total: int | None) -> None:
        seen.append(item.location)
        if done == 2:
            raise KeyboardInterrupt

    with pytest.raises(BulkInterrupted) as info:
        mgr.bulk(Operation.pause("replication"), progress=progress)
    report = info.value.report
    assert isinstance(info.value, KeyboardInterrupt) and report.interrupted and not report.ok
    assert report.refusal is None
    # every location decided is reported, also one written in the same batch as the
    # interrupted one and not yet handed to progress (a backend batching writes)
    reported = [i.location for i in report.items]
    assert reported == sorted(reported) and set(seen) <= set(reported)
    assert all(i.outcome is Outcome.CHANGED for i in report.items)
    untouched = set(LOCATIONS) - set(reported)
    assert len(untouched) == (1 if mgr.backend.batch_size == 1 else 0)
    for loc in LOCATIONS:
        expected = State.RUNNING if loc in untouched else State.PAUSED
        assert mgr.status(loc).services["replication"].state is expected


class _InterruptedWrite(Partition):
    """The real backend, but the compare-and-set of ``location`` is interrupted (Ctrl-C)."""

    def __init__(self, inner: Backend, location: str) -> None:
        super().__init__(inner)
        self.location = location

    def compare_and_set(
        self, record: LocationStatus, expected_version: int, history: list[HistoryEntry]
    ) -> LocationStatus:
        if record.location == self.location:
            raise KeyboardInterrupt
        return self.inner.compare_and_set(record, expected_version, history)


def test_ctrl_c_during_a_write_reports_that_location_as_unknown(
    kit: Kit, clock: FakeClock
) -> None:
    Manager(kit.open(), clock=clock).sync_locations(LOCATIONS)
    mgr = Manager(_InterruptedWrite(kit.open(), "eu-1"), clock=clock)
    with pytest.raises(BulkInterrupted) as info:
        mgr.bulk(Operation.pause("replication"), op_id="bulk-ctrl-c")
    report = info.value.report
    assert report.interrupted and outcomes(report)["eu-1"] is Outcome.FAILED
    assert {o for loc, o in outcomes(report).items() if loc != "eu-1"} <= {Outcome.CHANGED}
    for loc in set(LOCATIONS) - set(outcomes(report)):  # not reached: untouched
        assert mgr.status(loc).services["replication"].state is State.RUNNING
    error = report.failed[0].error
    assert isinstance(error, AmbiguousCommit) and "bulk-ctrl-c" in error.message


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda m: m.bulk(Operation.pause(), "us-1"), "list of names"),
        (lambda m: m.bulk(Operation.pause(), []), "no location"),
        (lambda m: m.bulk(Operation.pause(), ["us-1", "Bad Name"]), "Bad Name"),
        (lambda m: m.bulk(Operation.pause(), wait=-1), "wait"),
        (lambda m: m.bulk(Operation.pause("teleport")), "teleport"),
        (lambda m: m.bulk(Operation.pause(reason="a\x00b")), "reason"),
        (lambda m: m.bulk(Operation.resume(at=datetime(2020, 1, 1, tzinfo=UTC))), "future"),
        (lambda m: m.bulk(Operation.pause(), op_id=""), "op_id"),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(
    mgr: Manager, call: Callable[[Manager], object], needle: str
) -> None:
    before = {r.location: r.version for r in mgr.statuses()}
    with pytest.raises(InvalidInput, match=needle):
        call(mgr)
    assert {r.location: r.version for r in mgr.statuses()} == before


def _single(m: Manager, op: str, loc: str, service: str | None, at: datetime) -> LocationStatus:
    """The single-location call of ``op``, under the bulk operation's op_id."""
    if op == "pause":
        return m.pause(loc, service, op_id="bulk")
    if op == "resume":
        return m.resume(loc, service, op_id="bulk")
    if op == "schedule":
        return m.resume(loc, service, at=at, op_id="bulk")
    return m.cancel_scheduled_resume(loc, service, op_id="bulk")


_STATES = st.sampled_from(["running", "paused", "scheduled"])
_OPS = st.sampled_from(["pause", "resume", "schedule", "cancel"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    start=st.dictionaries(
        st.sampled_from(["a-1", "b-1", "c-1", "d-1"]),
        st.tuples(_STATES, st.booleans()),  # replication's state, has lifecycle
        min_size=1,
    ),
    op=_OPS,
    service=st.sampled_from([None, "replication", "lifecycle"]),
    workers=st.lists(
        st.tuples(  # the services a live worker applies, at every location (None) or these
            st.sets(st.sampled_from(["replication", "lifecycle"]), min_size=1),
            st.none() | st.sets(st.sampled_from(["a-1", "b-1", "c-1", "d-1"]), min_size=1),
        ),
        max_size=2,
    ),
)
@example(  # a worker applying the service at one location only: the other is settled
    start={"a-1": ("running", False), "b-1": ("running", True)}, op="pause",
    service="replication", workers=[({"replication"}, {"a-1"}), ({"lifecycle"}, None)],
)
def test_the_report_tells_each_location_what_the_single_call_would_have_done(
    start: dict[str, tuple[str, bool]], op: str, service: str | None,
    workers: list[tuple[set[str], set[str] | None]],
) -> None:
    """Property: per location, the bulk outcome and record are what the single-location call
    makes of the same record (changed iff it wrote, skipped iff it has none of the services or
    nothing to schedule; settled iff no live worker applies it), every location reported
    once."""
    clock = FakeClock(START)
    twins = [Manager(MemoryBackend(), clock=clock) for _ in range(2)]
    for m in twins:
        for n, (services, where) in enumerate(workers):
            m.backend.put_worker(WorkerInfo(
                worker_id=f"w-{n}", services=tuple(sorted(services)),
                locations=None if where is None else tuple(sorted(where)),
                lease_expires_at=START + timedelta(days=1),
            ))
        m.sync_locations({loc: ["replication"] + (["lifecycle"] if lc else []) for loc, (_, lc)
                          in start.items()})
        for loc, (state, _) in start.items():
            if state != "running":
                m.pause(loc, "replication")
            if state == "scheduled":
                m.resume(loc, "replication", at=timedelta(hours=1))
    bulk_mgr, single_mgr = twins
    at = START + timedelta(hours=3)
    operation = {
        "pause": Operation.pause(service),
        "resume": Operation.resume(service),
        "schedule": Operation.resume(service, at=at),
        "cancel": Operation.cancel_scheduled_resume(service),
    }[op]
    report = bulk_mgr.bulk(operation, op_id="bulk")
    assert [i.location for i in report.items] == sorted(start)
    for item in report.items:
        loc = item.location
        before = single_mgr.status(loc)
        if service is not None and service not in before.services:
            assert item.outcome is Outcome.SKIPPED and item.why == f"has no {service}"
            continue
        try:
            after = _single(single_mgr, op, loc, service, at)
        except InvalidTransition:
            assert op == "schedule" and item.outcome is Outcome.SKIPPED
            assert item.why == "nothing paused to schedule"
            continue
        assert item.status is not None
        wrote = after.version != before.version
        assert item.outcome is (Outcome.CHANGED if wrote else Outcome.UNCHANGED)
        # the same services, written by the same op_id where changed (the records' earlier
        # op_ids come from each twin's own sync)
        assert {k: v.model_dump(exclude={"op_id"}) for k, v in item.status.services.items()} == {
            k: v.model_dump(exclude={"op_id"}) for k, v in after.services.items()
        }
        assert set(item.changed) == {k for k, v in after.services.items() if v.op_id == "bulk"}
        assert item.status.version == after.version
