"""The consistency check (docs/design.md §5.4, §3.5, issue 7) on every backend kit.

Each finding kind gets one scenario that creates the drift for real (a worker that vanished
mid-transition, a scheduled resume that passed while nothing ran, a location list that changed,
a record damaged with the backend's own client, a write that skipped its history, a lapsed
lease, a removed location), then checks the report, the repair (through the manager's
compare-and-set path) and a second run that reports clean. Time is a controllable clock given to
the manager, so "ten minutes later" is a call, not a sleep.

Workers are registrations made with their own backend client (``kit.open()``): on heartbeat
backends their lease is ``lease_expires_at``; on session backends (ZooKeeper) the open client
*is* the lease, so "the worker died" is closing its client, which works on every backend.

The real-process scenarios (kill -9 mid-handler, two concurrent ``check --repair``, the CLI and
the sidecar) are in ``test_check_processes.py``.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from locstatus import (
    BackendUnavailable,
    CorruptRecord,
    InvalidInput,
    Manager,
    NotFound,
    SettleTimeout,
    State,
    WorkerInfo,
)
from locstatus.backends import Backend, open_backend
from locstatus.check import (
    KINDS,
    PROGRESS_THRESHOLD,
    CheckReport,
    render_report,
    run_check,
    write_metrics,
)
from locstatus.locations import load_locations
from locstatus.models import TOMBSTONE_ACK, LocationStatus, tombstone_generation

from support import corrupt_shapes as shapes
from support.agent_worker import Partition
from support.fakeclock import FakeClock
from support.kits import Kit

START = datetime(2030, 1, 1, 9, 0, tzinfo=UTC)
DOC = Path(__file__).resolve().parent.parent / "docs" / "check.md"



@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def mgr(kit: Kit, clock: FakeClock) -> Iterator[Manager]:
    m = Manager(kit.open(), clock=clock)
    m.sync_locations({"us-east-1": ["replication", "lifecycle"], "eu-west-1": ["replication"]})
    yield m


def register(kit: Kit, clock: FakeClock, worker_id: str, *, lease: float = 3600.0,
             locations: tuple[str, ...] | None = None) -> Backend:
    """Register a worker with its own client (its session, on session backends)."""
    client = kit.open()
    client.put_worker(
        WorkerInfo(
            worker_id=worker_id,
            services=("replication", "lifecycle"),
            locations=locations,
            host="worker-host",
            pid=4242,
            started_at=clock(),
            lease_expires_at=clock() + timedelta(seconds=lease),
        )
    )
    return client


def kinds(report: CheckReport) -> list[tuple[str, str | None, str | None]]:
    return [(f.kind.value, f.location, f.service or f.worker_id) for f in report.findings]


def only(report: CheckReport, kind: str) -> Any:
    found = [f for f in report.findings if f.kind == kind]
    assert len(found) == 1, kinds(report)
    return found[0]


def events(mgr: Manager, location: str, event: str, service: str | None = None) -> list[Any]:
    return [
        e
        for e in mgr.backend.history(location, limit=10_000)
        if e.event == event and service in (None, e.service)
    ]


def assert_clean(mgr: Manager, **kwargs: Any) -> CheckReport:
    report = run_check(mgr, **kwargs)
    assert report.findings == [], kinds(report)
    assert (report.status, report.exit_code) == ("clean", 0)
    return report


# -- a healthy store --------------------------------------------------------------------------


def test_a_healthy_store_is_clean(mgr: Manager, kit: Kit, clock: FakeClock) -> None:
    register(kit, clock, "w1")
    mgr.pause("us-east-1", "replication")
    mgr.backend.ack("w1", "us-east-1", "replication", 1)
    mgr.settle("us-east-1")
    mgr.pause("eu-west-1")  # a pausing transition younger than --stuck-after is not stuck
    mgr.resume("us-east-1", "replication", at=timedelta(hours=2))
    clock.advance(minutes=1)
    report = assert_clean(mgr, expected={"us-east-1": ["replication", "lifecycle"],
                                         "eu-west-1": ["replication"]})
    assert report.scanned.records == 2 and report.scanned.services == 3
    assert (report.scanned.workers, report.scanned.live_workers) == (1, 1)
    assert report.summary.by_kind == dict.fromkeys(KINDS, 0)


# -- stuck_transition -------------------------------------------------------------------------


def test_stuck_transition_of_a_vanished_worker_is_settled_once(
    mgr: Manager, kit: Kit, clock: FakeClock
) -> None:
    worker = register(kit, clock, "w1", lease=30)
    mgr.pause("us-east-1", "replication")
    assert mgr.status("us-east-1").services["replication"].state is State.PAUSING
    worker.close()  # the worker process is gone: no more heartbeats (session backends: no node)
    clock.advance(minutes=10)

    report = run_check(mgr)
    stuck = only(report, "stuck_transition")
    assert (stuck.location, stuck.service) == ("us-east-1", "replication")
    assert stuck.age_seconds == pytest.approx(600)
    assert stuck.evidence["generation"] == 1
    assert all(not w["lease_alive"] for w in stuck.evidence["lagging_workers"])
    assert stuck.repair.action == "settle"
    assert report.exit_code == 1

    repaired = run_check(mgr, repair=True)
    assert only(repaired, "stuck_transition").state == "repaired"
    assert mgr.status("us-east-1").services["replication"].state is State.PAUSED
    assert len(events(mgr, "us-east-1", "settle", "replication")) == 1
    assert repaired.exit_code == 0 and repaired.status == "repaired"
    assert_clean(mgr, repair=True)


def test_stuck_transition_with_a_live_lagging_worker_is_reported_not_settled(
    mgr: Manager, kit: Kit, clock: FakeClock
) -> None:
    worker = register(kit, clock, "slowpoke", lease=7 * 86400)
    mgr.pause("us-east-1", "replication")
    clock.advance(minutes=6)

    report = run_check(mgr, repair=True)
    stuck = only(report, "stuck_transition")
    assert stuck.state == "blocked" and stuck.repair.action is None
    assert [(w["worker_id"], w["lease_alive"]) for w in stuck.evidence["lagging_workers"]] == [
        ("slowpoke", True)
    ]
    assert "slowpoke" in stuck.message
    assert report.exit_code == 1 and report.repairs == []
    assert mgr.status("us-east-1").services["replication"].state is State.PAUSING
    assert run_check(mgr, stuck_after=3600).findings == []  # not stuck by a longer standard

    worker.ack("slowpoke", "us-east-1", "replication", 1)  # it catches up, nobody settled
    report = run_check(mgr, repair=True)
    assert only(report, "stuck_transition").state == "repaired"
    assert mgr.status("us-east-1").services["replication"].state is State.PAUSED
    assert_clean(mgr)


def test_stuck_age_counts_from_entering_the_state(mgr: Manager, kit: Kit, clock: FakeClock) -> None:
    register(kit, clock, "slowpoke", lease=7 * 86400)
    mgr.pause("us-east-1", "replication")
    clock.advance(minutes=10)
    mgr.resume("us-east-1", "replication", at=timedelta(hours=1))  # touches updated_at only
    report = run_check(mgr)
    assert only(report, "stuck_transition").age_seconds == pytest.approx(600)


# -- overdue_resume ---------------------------------------------------------------------------


def test_overdue_resume_is_fired_once(mgr: Manager, clock: FakeClock) -> None:
    mgr.pause("us-east-1", reason="maintenance")
    mgr.resume("us-east-1", "replication", at=timedelta(minutes=5))
    clock.advance(hours=1)  # the deadline passes while no reconciler runs

    report = run_check(mgr)
    overdue = only(report, "overdue_resume")
    assert (overdue.location, overdue.service) == ("us-east-1", "replication")
    assert overdue.age_seconds == pytest.approx(55 * 60)
    assert overdue.evidence["resume_at"] == "2030-01-01T09:05:00Z"
    assert report.exit_code == 1

    repaired = run_check(mgr, repair=True)
    assert only(repaired, "overdue_resume").state == "repaired"
    (repair,) = repaired.repairs
    assert (repair.action, repair.outcome) == ("fire_due_resumes", "applied")
    st = mgr.status("us-east-1").services
    assert st["replication"].state is State.RUNNING and st["replication"].actor == repaired.actor
    assert st["lifecycle"].state is State.PAUSED  # not scheduled: left paused
    assert len(events(mgr, "us-east-1", "resume_due")) == 1
    assert_clean(mgr, repair=True)
    assert len(events(mgr, "us-east-1", "resume_due")) == 1


# -- missing_location / unknown_location ------------------------------------------------------


def test_location_list_drift_is_synced(
    mgr: Manager, kit: Kit, clock: FakeClock, tmp_path: Path
) -> None:
    mgr.add_location("ap-south-1", ["replication"])
    mgr.remove_location("ap-south-1")
    # The config now drops eu-west-1, adds sa-east-1, brings ap-south-1 back, and gives
    # us-east-1 every service.
    listing = tmp_path / "locations.txt"
    listing.write_text("# sites\nus-east-1\nsa-east-1\nap-south-1\n")
    expected = load_locations(listing)
    # a live worker that has not acknowledged tombstones keeps new ones from being purged
    register(kit, clock, "w1", locations=("eu-west-1",))

    report = run_check(mgr, expected=expected)
    assert sorted(kinds(report)) == [
        ("missing_location", "ap-south-1", None),
        ("missing_location", "sa-east-1", None),
        ("missing_location", "us-east-1", "ingestion"),
        ("unknown_location", "eu-west-1", None),
    ]
    assert report.options.expected_locations == 3
    restored = next(f for f in report.findings if f.location == "ap-south-1")
    assert restored.evidence["removed_at"] is not None

    repaired = run_check(mgr, repair=True, expected=expected)
    assert {f.state for f in repaired.findings} == {"repaired"}
    assert mgr.status("sa-east-1").services.keys() == {"replication", "lifecycle", "ingestion"}
    assert "ingestion" in mgr.status("us-east-1").services
    assert not mgr.status("ap-south-1").deleted
    assert mgr.status("eu-west-1").deleted
    assert len(events(mgr, "eu-west-1", "remove")) == 1
    assert len(events(mgr, "sa-east-1", "create")) == 1
    assert_clean(mgr, repair=True, expected=expected)


def test_an_empty_or_invalid_location_list_is_refused(mgr: Manager) -> None:
    with pytest.raises(InvalidInput, match="empty"):
        run_check(mgr, expected={}, repair=True)
    with pytest.raises(InvalidInput):
        run_check(mgr, expected={"../etc": ["replication"]})
    with pytest.raises(InvalidInput):
        run_check(mgr, expected={"us-east-1": ["no-such-service"]})
    assert not mgr.status("us-east-1").deleted


# -- corrupt_record ---------------------------------------------------------------------------


def test_corrupt_record_is_reported_and_never_touched(mgr: Manager, kit: Kit) -> None:
    good = mgr.status("us-east-1").model_dump_json(include={"services", "deleted_at"})
    kit.write_raw("us-east-1", '{"services": {"replication": {"state": "exploded"}}}')
    expected = {"us-east-1": ["replication", "lifecycle"], "eu-west-1": ["replication"]}
    report = run_check(mgr, repair=True, expected=expected)
    corrupt = only(report, "corrupt_record")
    assert corrupt.location == "us-east-1" and "state" in corrupt.evidence["detail"]
    assert corrupt.evidence["part"] == "record"
    assert corrupt.repair.action is None and corrupt.state == "open"
    assert report.repairs == []  # a corrupt record is not "missing": nothing is created over it
    assert report.scanned.corrupt == 1 and report.exit_code == 1
    with pytest.raises(CorruptRecord) as still:
        mgr.status("us-east-1")
    assert still.value.detail == corrupt.evidence["detail"]
    assert [f.id for f in run_check(mgr, repair=True).findings] == [corrupt.id]

    # The operator restores the payload by hand with the backend's client: the record parses
    # again, and the check notices that this version has no history (the hand edit) ...
    kit.write_raw("us-east-1", good)
    report = run_check(mgr, repair=True, expected=expected)
    assert kinds(report) == [("history_mismatch", "us-east-1", None)]
    # ... until the next change through locstatus records the state again (of every service:
    # a hand edit may also have dropped history kept in the record, as on MongoDB).
    mgr.pause("us-east-1", reason="after the repair")
    assert_clean(mgr, expected=expected)


def _reported_as_corrupt(mgr: Manager, kit: Kit, text: str) -> None:
    """``text`` written over a paused ``us-east-1`` is one ``corrupt_record`` finding naming
    the same error the library raises, left open by ``--repair``; ``eu-west-1`` is clean."""
    mgr.pause("us-east-1", "replication", reason="maint")
    kit.write_raw("us-east-1", text)
    with pytest.raises(CorruptRecord) as read:
        mgr.status("us-east-1")
    for repair in (False, True):
        report = run_check(mgr, repair=repair)
        assert kinds(report) == [("corrupt_record", "us-east-1", None)]
        f = report.findings[0]
        assert (f.evidence["part"], f.evidence["detail"]) == ("record", read.value.detail)
        assert f.state == "open" and report.exit_code == 1


@pytest.mark.parametrize("shape", sorted(shapes.PARTIAL))
def test_a_record_missing_a_field_is_a_corrupt_record_finding(
    mgr: Manager, kit: Kit, shape: str
) -> None:
    _reported_as_corrupt(mgr, kit, shapes.PARTIAL[shape])


@pytest.mark.parametrize("kit", ["memory", "sqlite", "zk"], indirect=True)
@pytest.mark.parametrize("shape", sorted(shapes.DUPLICATE_KEYS) + sorted(shapes.DEEP))
def test_a_stored_text_with_a_key_twice_or_too_deep_is_a_corrupt_record_finding(
    mgr: Manager, kit: Kit, shape: str
) -> None:
    _reported_as_corrupt(mgr, kit, {**shapes.DUPLICATE_KEYS, **shapes.DEEP}[shape])


# -- history_mismatch -------------------------------------------------------------------------


def test_a_write_without_history_is_a_history_mismatch(mgr: Manager) -> None:
    mgr.pause("us-east-1", "replication")
    rec = mgr.status("us-east-1")
    drifted = rec.services["replication"].model_copy(
        update={"state": State.RUNNING, "generation": 2}
    )
    mgr.backend.compare_and_set(
        rec.model_copy(update={"services": {**rec.services, "replication": drifted}}),
        rec.version,
        [],
    )
    history_before = mgr.backend.history("us-east-1", limit=1000)

    report = run_check(mgr, repair=True)
    found = {f.service: f for f in report.findings}
    assert {f.kind.value for f in report.findings} == {"history_mismatch"}
    assert set(found) == {None, "replication"}
    assert found["replication"].evidence["fields"] == ["state", "generation"]
    assert found["replication"].evidence["history"]["event"] == "settle"
    assert found["replication"].evidence["record"]["generation"] == 2
    assert found[None].evidence["history"]["version"] == rec.version
    assert all(f.repair.action is None and f.state == "open" for f in report.findings)
    assert report.repairs == [] and report.exit_code == 1
    assert mgr.backend.history("us-east-1", limit=1000) == history_before  # never rewritten
    assert mgr.status("us-east-1").version == rec.version + 1

    mgr.pause("us-east-1", "replication")  # the next change records the state again
    assert_clean(mgr)


def test_a_record_with_no_history_at_all_is_one_finding(mgr: Manager, kit: Kit) -> None:
    kit.write_raw("hand-made", shapes.GOOD)
    report = run_check(mgr)
    f = only(report, "history_mismatch")
    assert (f.location, f.service, f.evidence["history"]) == ("hand-made", None, None)


def test_mongo_history_gap_is_restored_from_the_recent_copy_and_a_lost_one_reported(
    mongo_server: Any, clock: FakeClock
) -> None:
    """MongoDB keeps recent history in the record and all of it in a collection. A writer that
    stopped between the two writes leaves a gap the record still covers (restored by
    ``--repair``); a write gone from both (a hand edit) is lost, and said so. Issue 15: the
    check stayed clean while such a write slid out of the record."""
    from support.kits_mongo import COLLECTION, kit_url, mongo_kit

    kit = mongo_kit(mongo_server)
    client = mongo_server.client()
    m = Manager(open_backend(kit_url(mongo_server, kit.database,  # type: ignore[attr-defined]
                                     recent_history="4")), clock=clock)
    try:
        m.sync_locations(["us-east-1"])
        versions = [m.pause("us-east-1", "replication").version]
        for _ in range(3):
            versions.append(m.resume("us-east-1", "replication").version)
            versions.append(m.pause("us-east-1", "replication").version)
        coll = client[kit.database][f"{COLLECTION}_history"]  # type: ignore[attr-defined]
        assert coll.delete_one({"location": "us-east-1", "version": versions[-2]}).deleted_count
        assert kinds(run_check(m)) == []  # as yet, a writer in flight (in test_mongo_backend)

        clock.advance(300)  # the writer stopped: the write is as old as the default stuck_after
        report = run_check(m)
        gap = only(report, "history_gap")
        assert gap.id == "history_gap:us-east-1:-:restorable"
        assert gap.evidence == {"missing_versions": [versions[-2]], "in_recent_history": True,
                                "version": versions[-1]}
        assert (gap.repair.action, gap.state, report.exit_code) == ("restore_history", "open", 1)
        assert "history_gap" in " ".join(render(report).split())
        assert run_check(m, dry_run=True).repairs[0].outcome == "planned"
        assert coll.count_documents({"location": "us-east-1", "version": versions[-2]}) == 0

        repaired = run_check(m, repair=True)
        assert only(repaired, "history_gap").state == "repaired"
        assert [(r.action, r.outcome) for r in repaired.repairs] == [
            ("restore_history", "applied")
        ]
        assert repaired.exit_code == 0
        assert coll.count_documents({"location": "us-east-1", "version": versions[-2]}) == 1
        assert_clean(m)

        assert coll.delete_one({"location": "us-east-1", "version": versions[0]}).deleted_count
        lost = run_check(m, repair=True)  # versions[0] left the record's 4 recent writes
        gap = only(lost, "history_gap")
        assert gap.id == "history_gap:us-east-1:-:lost"
        assert gap.evidence["missing_versions"] == [versions[0]]
        assert gap.evidence["in_recent_history"] is False
        assert (gap.repair.action, gap.state, lost.repairs, lost.exit_code) == (None, "open", [], 1)
        data = lost.as_dict()["findings"][0]
        assert data["kind"] == "history_gap" and data["evidence"]["missing_versions"] == [
            versions[0]
        ]
    finally:
        m.close()
        client.close()
        kit.close()


class WriteDuringScan(Partition):
    """The real backend; the first history read of ``location`` is preceded by an operator's
    write, as if it landed between the scan's read of the record and of its history."""

    def __init__(self, inner: Backend, mgr: Manager, location: str) -> None:
        super().__init__(inner)
        self.mgr = mgr
        self.location = location
        self.fired = False

    def history(self, location: str, *, limit: int = 50,
                before_version: int | None = None) -> list[Any]:
        if location == self.location and not self.fired:
            self.fired = True
            self.mgr.pause(location, "replication", reason="concurrent operator")
        return super().history(location, limit=limit, before_version=before_version)


def test_a_write_during_the_scan_is_not_reported_as_drift(mgr: Manager, kit: Kit) -> None:
    racing = WriteDuringScan(kit.open(), mgr, "us-east-1")
    report = run_check(Manager(racing, clock=mgr.clock))
    assert racing.fired
    assert report.findings == [], kinds(report)


# -- expired_worker ---------------------------------------------------------------------------


class RenewOnReread(Partition):
    """The real backend; ``renew`` renews a worker's lease just before the repair re-reads the
    worker list (the worker came back between the scan and the repair)."""

    def __init__(self, inner: Backend, renew: WorkerInfo) -> None:
        super().__init__(inner)
        self.renew = renew
        self.reads = 0

    def workers(self) -> list[WorkerInfo]:
        self.reads += 1
        if self.reads == 2:
            self.inner.put_worker(self.renew)
        return super().workers()


def test_expired_worker_is_removed_only_if_still_expired(
    mgr: Manager, kit: Kit, clock: FakeClock
) -> None:
    register(kit, clock, "gone", lease=10)
    back = register(kit, clock, "back", lease=10)
    mgr.backend.ack("gone", "us-east-1", "replication", 0)
    clock.advance(minutes=1)
    listed = {w.worker_id: w for w in mgr.workers()}
    if all(w.lease_expires_at is None for w in listed.values()):
        # Session backends: the lease is the session, a listed worker is alive; there is never
        # an expired registration to report.
        assert all(w.alive(clock()) for w in listed.values())
        assert run_check(mgr, repair=True).findings == []
        return

    report = run_check(mgr)
    assert sorted(str(f.worker_id) for f in report.findings) == ["back", "gone"]
    gone = next(f for f in report.findings if f.worker_id == "gone")
    assert gone.kind == "expired_worker" and gone.location is None
    assert gone.age_seconds == pytest.approx(50)
    assert gone.evidence["host"] == "worker-host" and gone.evidence["locations_acknowledged"] == 1

    renewed = listed["back"].model_copy(update={"lease_expires_at": clock() + timedelta(hours=1)})
    racing = RenewOnReread(kit.open(), renewed)
    report = run_check(Manager(racing, clock=clock), repair=True)
    outcome = {r.worker_id: (r.outcome.value, r.detail) for r in report.repairs}
    assert outcome["back"][0] == "already_done" and "renewed" in outcome["back"][1]
    assert outcome["gone"][0] == "applied"
    assert [w.worker_id for w in mgr.workers()] == ["back"]
    assert "gone" not in mgr.backend.acks("us-east-1")
    assert report.exit_code == 0
    assert_clean(mgr)
    back.close()


def test_a_standing_registration_away_is_never_expired_and_names_itself_in_a_stuck_pause(
    mgr: Manager, kit: Kit, clock: FakeClock
) -> None:
    """docs/agent.md "Standing registrations": its holder gone (its client closed, its lease
    run out), the check reports no ``expired_worker`` and ``--repair`` keeps it; the pause it
    holds up is a ``stuck_transition`` naming it as away, with no repair but retiring it."""
    holder = kit.open()
    holder.put_worker(WorkerInfo(
        worker_id="bb.zenko", services=("replication",), host="bridge-host", pid=7,
        lease_expires_at=None if holder.session_leases else clock() + timedelta(seconds=10),
        standing=True))
    holder.close()
    mgr.pause("us-east-1", "replication")
    clock.advance(minutes=10)
    report = run_check(mgr, repair=True)
    assert kinds(report) == [("stuck_transition", "us-east-1", "replication")]
    stuck = only(report, "stuck_transition")
    assert "bb.zenko (standing registration, holder away " in stuck.message, stuck.message
    assert stuck.repair.action is None and "locstatus workers retire" in stuck.repair.description
    assert [w.worker_id for w in mgr.workers()] == ["bb.zenko"]
    assert mgr.status("us-east-1").services["replication"].state is State.PAUSING
    mgr.retire_worker("bb.zenko", actor="ops")
    report = run_check(mgr, repair=True)
    assert mgr.status("us-east-1").services["replication"].state is State.PAUSED


def test_a_standing_registration_present_but_lagging_gets_its_advice_and_handler_error(
    mgr: Manager, kit: Kit, clock: FakeClock
) -> None:
    """docs/check.md "Evidence per kind", docs/agent.md "Standing registrations": a standing
    registration whose holder runs but does not acknowledge (the bridge's processor down)
    never lapses, so "a stopped worker's lease expires" is no advice for it: the plan says to
    start its holder or retire it, and the message, the evidence and a ``wait=`` timeout name
    the last error its handler published."""
    error = "its state node says paused: false; 0 subscriber(s) on backbeat-replication-us-east-1"
    holder = kit.open()
    try:
        holder.put_worker(WorkerInfo(
            worker_id="bb.zenko", services=("replication",), host="bridge-host", pid=7,
            lease_expires_at=None if holder.session_leases else clock() + timedelta(hours=1),
            errors={"us-east-1/replication": error}, standing=True))
        with pytest.raises(SettleTimeout) as timeout:
            mgr.pause("us-east-1", "replication", wait=0.2)
        assert f"bb.zenko (last handler error: {error})" in str(timeout.value), timeout.value
        clock.advance(minutes=10)
        report = run_check(mgr, repair=True)
        stuck = only(report, "stuck_transition")
        assert f"bb.zenko (last handler error: {error})" in stuck.message, stuck.message
        assert stuck.evidence["lagging_workers"][0]["handler_error"] == error
        assert stuck.repair.action is None
        assert "start its holder again (e.g. the Backbeat bridge); retire it only once what it stands for is gone for good " \
               "(the pauses it holds back then settle without it): locstatus workers retire bb.zenko" in stuck.repair.description, stuck.repair.description
        assert "fix or stop" not in stuck.repair.description
        assert mgr.status("us-east-1").services["replication"].state is State.PAUSING
    finally:
        holder.close()


class RenewAfterReread(Partition):
    """The real backend; right after the repair re-read the worker list (and found the worker
    still expired), the worker renews its lease with its own client: between the re-read and
    the removal."""

    def __init__(self, inner: Backend, worker: Backend, renew: WorkerInfo) -> None:
        super().__init__(inner)
        self.worker, self.renew = worker, renew
        self.reads = 0

    def workers(self) -> list[WorkerInfo]:
        self.reads += 1
        listed = super().workers()
        if self.reads == 2:
            self.worker.put_worker(self.renew)
        return listed


def test_a_worker_renewing_between_the_repairs_read_and_its_removal_is_kept(
    mgr: Manager, kit: Kit, clock: FakeClock
) -> None:
    """Model finding remove_race (model/README.md): the repair re-read the worker, saw it
    expired and removed it unconditionally; a worker that renewed in between was dropped while
    live, with its acknowledgements, and the next pause settled without it."""
    back = register(kit, clock, "back", lease=10)
    back.ack("back", "us-east-1", "replication", 0)
    clock.advance(minutes=1)
    expired = next(w for w in mgr.workers() if w.worker_id == "back")
    if expired.lease_expires_at is None:
        return  # a session-held registration is never expired (see the test above)
    renewed = expired.model_copy(update={"lease_expires_at": clock() + timedelta(hours=1)})
    racing = RenewAfterReread(kit.open(), back, renewed)
    report = run_check(Manager(racing, clock=clock), repair=True)
    assert racing.reads >= 2, "the repair did not re-read the workers"
    outcome = {r.worker_id: (r.outcome.value, r.detail) for r in report.repairs}
    assert outcome["back"][0] == "already_done" and "renewed" in outcome["back"][1]
    assert [(w.worker_id, w.lease_expires_at) for w in mgr.workers()] == [
        ("back", renewed.lease_expires_at)
    ]
    assert mgr.backend.acks("us-east-1") == {"back": {"replication": 0}}
    rec = mgr.pause("us-east-1", "replication")
    assert rec.services["replication"].state is State.PAUSING  # waits for the live worker
    assert mgr.lagging("us-east-1", "replication") == ["back"]
    back.close()


# -- corrupt_worker ---------------------------------------------------------------------------


def _wait_listed(mgr: Manager, ids: list[str]) -> None:
    """ZooKeeper lists workers from a copy its watches drop a moment after another client's
    write: wait until the raw writes show."""
    deadline = time.monotonic() + 10
    while sorted(w.worker_id for w in mgr.workers()) != ids:
        assert time.monotonic() < deadline, [w.worker_id for w in mgr.workers()]
        time.sleep(0.02)


def test_a_corrupt_worker_registration_is_reported_and_blocks_what_it_may_apply(
    mgr: Manager, kit: Kit, clock: FakeClock
) -> None:
    """A registration that does not parse may be a running worker's: reported as
    ``corrupt_worker``, counted live (a stuck transition it lags stays blocked), and removed
    by ``--repair`` only once the lease it still carries has run out."""
    kit.write_raw_worker("w-bad", '{"worker_id": "w-bad", "services": 7}')
    late = (clock() + timedelta(seconds=30)).isoformat()
    kit.write_raw_worker("w-dead", f'{{"services": 7, "lease_expires_at": "{late}"}}')
    _wait_listed(mgr, ["w-bad", "w-dead"])
    mgr.pause("us-east-1", "replication")
    mgr.backend.ack("w-dead", "eu-west-1", "replication", 0)
    clock.advance(minutes=10)

    report = run_check(mgr, repair=True)
    bad = next(f for f in report.findings if f.worker_id == "w-bad")
    dead = next(f for f in report.findings if f.worker_id == "w-dead")
    assert (bad.kind, bad.location, bad.state.value) == ("corrupt_worker", None, "open")
    assert bad.repair.action is None and "services" in bad.evidence["detail"]
    assert bad.evidence["lease_alive"] is True and bad.evidence["lease_expires_at"] is None
    assert (dead.kind, dead.state.value) == ("corrupt_worker", "repaired")
    assert dead.repair.action == "remove_worker" and dead.age_seconds == pytest.approx(570)
    assert dead.evidence["locations_acknowledged"] == 1
    stuck = only(report, "stuck_transition")
    assert stuck.state.value == "blocked" and "w-bad" in stuck.message
    assert [w["worker_id"] for w in stuck.evidence["lagging_workers"]] == ["w-bad", "w-dead"]
    assert [w.worker_id for w in mgr.workers()] == ["w-bad"]
    assert "w-dead" not in mgr.backend.acks("eu-west-1")
    assert report.exit_code == 1

    lease = clock() + timedelta(hours=1)
    mgr.backend.put_worker(WorkerInfo(worker_id="w-bad", services=("lifecycle",),
                                      lease_expires_at=lease))  # its worker registers again
    assert run_check(mgr, repair=True).exit_code == 0  # then settles the pause it no longer lags
    assert_clean(mgr)


# -- tombstone_ready --------------------------------------------------------------------------


def test_tombstone_is_purged_once_every_live_worker_acknowledged(
    mgr: Manager, kit: Kit, clock: FakeClock
) -> None:
    w1 = register(kit, clock, "w1")
    register(kit, clock, "w2", locations=("us-east-1",))  # does not apply eu-west-1
    removed = mgr.remove_location("eu-west-1")
    assert removed.deleted_at is not None
    clock.advance(minutes=1)
    assert_clean(mgr, repair=True)  # w1 has not acknowledged the removal yet

    w1.ack("w1", "eu-west-1", TOMBSTONE_ACK, tombstone_generation(removed.deleted_at))
    report = run_check(mgr)
    ready = only(report, "tombstone_ready")
    assert ready.evidence["reason"] == "acknowledged"
    assert ready.evidence["acknowledged_by"] == ["w1"]

    repaired = run_check(mgr, repair=True)
    assert [(r.action.value, r.outcome.value) for r in repaired.repairs] == [
        ("purge_location", "applied")
    ]
    with pytest.raises(NotFound):
        mgr.status("eu-west-1")
    assert_clean(mgr, repair=True)


def test_tombstone_is_purged_after_the_ttl_even_if_unacknowledged(
    mgr: Manager, kit: Kit, clock: FakeClock
) -> None:
    register(kit, clock, "never-acks", lease=7 * 86400)
    mgr.remove_location("eu-west-1")
    clock.advance(hours=23)
    assert_clean(mgr, repair=True)
    clock.advance(hours=2)
    report = run_check(mgr, repair=True)
    ready = only(report, "tombstone_ready")
    assert ready.evidence["reason"] == "ttl" and ready.evidence["not_acknowledged_by"] == [
        "never-acks"
    ]
    assert ready.state == "repaired" and ready.age_seconds == pytest.approx(25 * 3600)
    assert [r.location for r in mgr.statuses(include_removed=True)] == ["us-east-1"]
    assert run_check(mgr, tombstone_ttl=60).findings == []


class RestoreAfterScan(Partition):
    """The real backend; an operator restores ``location`` right after the scan read it."""

    def __init__(self, inner: Backend, mgr: Manager, location: str) -> None:
        super().__init__(inner)
        self.mgr = mgr
        self.location = location

    def read_all(self) -> list[LocationStatus | CorruptRecord]:
        records = super().read_all()
        self.mgr.add_location(self.location, ["replication"])
        return records


def test_a_tombstone_restored_after_the_scan_is_kept(
    mgr: Manager, kit: Kit, clock: FakeClock
) -> None:
    mgr.remove_location("eu-west-1")
    clock.advance(hours=30)
    racing = RestoreAfterScan(kit.open(), mgr, "eu-west-1")
    report = run_check(Manager(racing, clock=clock), repair=True)
    ready = only(report, "tombstone_ready")  # judged on the snapshot
    assert ready.state == "resolved"
    assert [(r.outcome.value, r.detail) for r in report.repairs] == [
        ("already_done", "restored meanwhile; kept")
    ]
    assert not mgr.status("eu-west-1").deleted
    assert report.exit_code == 0


# -- dry run, output, metrics, errors ---------------------------------------------------------


def drift(mgr: Manager, kit: Kit, clock: FakeClock) -> None:
    """One finding of every repairable kind."""
    gone = register(kit, clock, "gone", lease=10)
    mgr.pause("us-east-1", "replication")  # stuck once "gone" is gone
    gone.close()
    mgr.pause("eu-west-1")
    mgr.resume("eu-west-1", at=timedelta(minutes=1))  # overdue
    mgr.add_location("old-site", ["replication"])
    mgr.remove_location("old-site")  # tombstone ready
    clock.advance(hours=25)


def test_dry_run_plans_every_repair_and_writes_nothing(
    mgr: Manager, kit: Kit, clock: FakeClock
) -> None:
    drift(mgr, kit, clock)
    expected = {"us-east-1": ["replication", "lifecycle"], "new-site": ["replication"]}
    before = (mgr.statuses(include_removed=True), mgr.workers())
    report = run_check(mgr, repair=True, dry_run=True, expected=expected)
    assert (mgr.statuses(include_removed=True), mgr.workers()) == before
    planned = {f.kind.value for f in report.findings if f.state == "planned"}
    assert {"stuck_transition", "overdue_resume", "missing_location", "unknown_location",
            "tombstone_ready"} <= planned
    assert {r.outcome.value for r in report.repairs} == {"planned"}
    assert report.exit_code == 1 and report.options.dry_run
    assert "dry run: nothing written" in " ".join(render(report).split())

    done = run_check(mgr, repair=True, expected=expected)
    assert done.exit_code == 0, [(f.id, f.state) for f in done.findings if f.state.left]


def test_json_report_has_stable_documented_keys(mgr: Manager, kit: Kit, clock: FakeClock) -> None:
    drift(mgr, kit, clock)
    data = run_check(mgr, repair=True).as_dict()
    text = json.dumps(data)  # JSON-able as is
    assert json.loads(text) == data
    assert data["format"] == "locstatus.check/1"
    top = ["format", "backend", "actor", "started_at", "finished_at", "duration_seconds", "now",
           "clock", "options", "scanned", "findings", "repairs", "summary", "status", "exit_code"]
    assert list(data) == top
    assert set(data["summary"]["by_kind"]) == set(KINDS)
    finding_keys = {"id", "kind", "location", "service", "worker_id", "since", "age_seconds",
                    "message", "evidence", "repair", "state"}
    assert all(set(f) == finding_keys for f in data["findings"])
    assert all(set(r) == {"finding", "kind", "action", "location", "service", "worker_id",
                          "outcome", "detail", "version"} for r in data["repairs"])
    doc = DOC.read_text()
    documented = set(re.findall(r"^\| `([a-z_]+)`", doc, flags=re.M))
    nested = [data["options"], data["clock"], data["scanned"], data["summary"],
              data["findings"][0], data["repairs"][0]]
    for key in [*data, *(k for d in nested for k in d)]:
        assert key in documented, f"{key} is not documented in docs/check.md"
    for f in data["findings"]:
        for key in f["evidence"]:
            assert f"`{key}`" in doc, f"evidence key {key} of {f['kind']} is not documented"


def test_backend_credentials_never_appear_in_the_report(mgr: Manager) -> None:
    secret = Partition(mgr.backend)
    secret.url = "mongodb://admin:hunter2@db1:27017,db2:27017/?replicaSet=rs"
    report = run_check(Manager(secret, clock=mgr.clock))
    assert "hunter2" not in json.dumps(report.as_dict())
    assert report.backend == "mongodb://***@db1:27017,db2:27017/?replicaSet=rs"


def render(report: CheckReport) -> str:
    console = Console(record=True, width=220, color_system=None)
    render_report(report, console)
    return console.export_text()


def test_table_shows_findings_and_a_summary_line(mgr: Manager, kit: Kit, clock: FakeClock) -> None:
    client = kit.open()
    client.put_worker(WorkerInfo(worker_id="w-markup", services=("replication",),
                                 host="[red]not-markup[/red]", lease_expires_at=clock()))
    clock.advance(minutes=2)
    out = render(run_check(mgr))
    if any(w.lease_expires_at is not None for w in mgr.workers()):
        assert "expired_worker" in out and "[red]not-markup[/red]" in out
        assert "-> exit 1" in out
    assert "2 records" in out
    mgr.backend.remove_worker("w-markup")
    assert "clean" in render(run_check(mgr))


def test_metrics_file_is_prometheus_text_written_atomically(
    mgr: Manager, kit: Kit, clock: FakeClock, tmp_path: Path
) -> None:
    drift(mgr, kit, clock)
    report = run_check(mgr)
    textfile_dir = tmp_path / "textfile"
    textfile_dir.mkdir()
    path = textfile_dir / "locstatus_check.prom"
    path.write_text("stale\n")
    write_metrics(report, str(path))
    text = path.read_text()
    assert list(textfile_dir.iterdir()) == [path]  # no temporary file left behind
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    samples = dict(
        line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#")
    )
    for kind in KINDS:
        assert samples[f'locstatus_check_findings{{kind="{kind}"}}'] == str(
            report.summary.by_kind[kind]
        )
    assert samples["locstatus_check_exit_code"] == "1"
    assert float(samples["locstatus_check_last_run_timestamp_seconds"]) == pytest.approx(
        report.finished_at.timestamp()
    )
    assert "# TYPE locstatus_check_findings gauge" in text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert "locstatus_check_findings_left" in families
    with pytest.raises(InvalidInput, match="cannot write metrics"):
        write_metrics(report, str(tmp_path / "no-such-dir" / "x.prom"))


def test_invalid_options_are_refused(mgr: Manager) -> None:
    for kwargs in ({"stuck_after": -1}, {"tombstone_ttl": float("nan")},
                   {"stuck_after": float("inf")}):
        with pytest.raises(InvalidInput):
            run_check(mgr, **kwargs)


def test_a_backend_that_is_down_cannot_be_checked(mgr: Manager) -> None:
    link = Partition(mgr.backend)
    link.cut()
    with pytest.raises(BackendUnavailable):
        run_check(Manager(link, clock=mgr.clock))


class DownAfterScan(Partition):
    """The real backend, cut when the first repair re-reads a record (after the scan)."""

    def read(self, location: str) -> LocationStatus:
        self.cut()  # the repair's re-read is the first call after the scan
        return super().read(location)


def test_backend_lost_during_repairs_exits_2_and_stops_repairing(
    mgr: Manager, kit: Kit, clock: FakeClock
) -> None:
    mgr.pause("us-east-1")
    mgr.resume("us-east-1", at=timedelta(minutes=1))
    mgr.pause("eu-west-1")
    mgr.resume("eu-west-1", at=timedelta(minutes=1))
    clock.advance(hours=1)
    report = run_check(Manager(DownAfterScan(kit.open()), clock=clock), repair=True)
    assert [f.kind.value for f in report.findings] == ["overdue_resume"] * 3
    # the first location repaired fails, the other is not attempted (two services of it)
    outcomes = sorted(r.outcome.value for r in report.repairs)
    assert outcomes in (["failed", "not_attempted", "not_attempted"],
                        ["failed", "failed", "not_attempted"])
    assert report.repairs[0].outcome == "failed"
    assert (report.status, report.exit_code) == ("error", 2)
    assert report.summary.left == 3


def test_progress_bar_on_large_scans_does_not_change_the_result(
    clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    m = Manager(open_backend(f"memory://{uuid.uuid4().hex}"), clock=clock)  # fast to fill
    m.sync_locations([f"site-{i:05d}" for i in range(PROGRESS_THRESHOLD + 50)])
    m.pause("site-00007")
    m.resume("site-00007", at=timedelta(minutes=1))
    clock.advance(hours=1)
    quiet = run_check(m, progress=False)
    capsys.readouterr()
    loud = run_check(m, progress=True)
    assert kinds(loud) == kinds(quiet) == [("overdue_resume", "site-00007", s)
                                           for s in ("ingestion", "lifecycle", "replication")]
    assert loud.scanned.records == PROGRESS_THRESHOLD + 50
    assert capsys.readouterr().out == ""  # the bar goes to stderr, never into --json output


def test_an_acknowledgement_of_an_earlier_removal_does_not_count(
    mgr: Manager, kit: Kit, clock: FakeClock
) -> None:
    """remove, restore, remove again: the worker's ack of the first removal must not let the
    check purge the second one before the worker ran on_remove for it."""
    w1 = register(kit, clock, "w1")
    first = mgr.remove_location("eu-west-1")
    assert first.deleted_at is not None
    w1.ack("w1", "eu-west-1", TOMBSTONE_ACK, tombstone_generation(first.deleted_at))
    clock.advance(minutes=1)
    mgr.sync_locations(["eu-west-1"], remove_missing=False)  # restored
    clock.advance(minutes=1)
    mgr.remove_location("eu-west-1")
    clock.advance(minutes=1)
    report = run_check(mgr, repair=True)
    assert [f for f in report.findings if f.kind.value == "tombstone_ready"] == []
    assert mgr.status("eu-west-1").deleted


def test_a_scan_larger_than_one_batch_sees_every_record_once(
    tmp_path: Path, clock: FakeClock
) -> None:
    """SQLite streams the scan in batches of 2000 (bench/check.py): a store larger than that,
    with a damaged record and a damaged history row on either side of the first batch's end,
    is checked record by record, each exactly once."""
    import sqlite3

    url = f"sqlite:///{tmp_path}/big.db?synchronous=normal"
    m = Manager(open_backend(url), clock=clock)
    names = [f"site-{i:05d}" for i in range(2105)]
    m.sync_locations(names)
    m.pause("site-01999", "replication")
    with sqlite3.connect(tmp_path / "big.db") as db:
        db.execute("UPDATE locations SET data = '{broken' WHERE location = 'site-02000'")
        db.execute(
            "UPDATE history SET data = '[{\"op_id\": 1}]' WHERE location = 'site-01999' "
            "AND version = (SELECT MAX(version) FROM history WHERE location = 'site-01999')"
        )
    report = run_check(m)
    assert report.scanned.records == 2105
    assert report.scanned.corrupt == 1
    assert kinds(report) == [
        ("corrupt_record", "site-01999", None),
        ("corrupt_record", "site-02000", None),
    ]
    parts = {f.location: f.evidence.get("part") for f in report.findings}
    assert parts == {"site-01999": "history", "site-02000": "record"}
    assert report.scanned.services == 3 * 2104
