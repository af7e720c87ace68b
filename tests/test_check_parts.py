"""The pure parts of the consistency check, without a backend (docs/check.md).

The history comparison and the screen are given plain lists of history entries; tombstone
readiness a fake clock and registrations; the repair plan and the summary plain findings. What
these decide, the whole check reports on every backend (``tests/test_check.py``); here each rule
is pinned where it lives, including the laziness that keeps the check cheap (the comparison
reads no history page it does not need).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from locstatus.check.findings import Findings
from locstatus.check.history import Problem, compare_history, head_agrees
from locstatus.check.repair import ORDER, plan
from locstatus.check.report import (
    KINDS,
    Action,
    Finding,
    FindingState,
    Kind,
    Outcome,
    Repair,
    RepairPlan,
    summarize,
    verdict,
)
from locstatus.check.screen import Screen
from locstatus.check.tombstones import readiness
from locstatus.clock import CallerClock
from locstatus.errors import CorruptRecord
from locstatus.models import (
    TOMBSTONE_ACK,
    HistoryEntry,
    LocationStatus,
    ServiceStatus,
    State,
    WorkerInfo,
    tombstone_generation,
)

from support.fakeclock import FakeClock

T0 = datetime(2030, 1, 1, 9, 0, tzinfo=UTC)
LOC = "us-east-1"
CREATE = "c" * 32


def created(version: int = 1, services: tuple[str, ...] = ("replication", "lifecycle")) -> (
    tuple[LocationStatus, HistoryEntry]
):
    """A location as ``create`` left it, and that write's history entry."""
    rec = LocationStatus(
        location=LOC, version=version,
        services={s: ServiceStatus(op_id=CREATE, updated_at=T0) for s in services},
    )
    return rec, HistoryEntry(op_id=CREATE, at=T0, location=LOC, service="*", event="create",
                             version=version)


def paused(rec: LocationStatus, svc: str, version: int, *, state: State = State.PAUSING,
           op_id: str = "p" * 32, at: datetime = T0 + timedelta(minutes=5)) -> (
    tuple[LocationStatus, HistoryEntry]
):
    """``rec`` after a pause of ``svc`` at ``version``, and that write's entry."""
    gen = rec.services[svc].generation + 1
    status = ServiceStatus(state=state, generation=gen, op_id=op_id, updated_at=at)
    entry = HistoryEntry(op_id=op_id, at=at, location=LOC, service=svc, event="pause",
                         from_state=State.RUNNING, to_state=state, generation=gen,
                         version=version)
    return rec.model_copy(update={"services": {**rec.services, svc: status},
                                  "version": version}), entry


def pages_of(*pages: list[HistoryEntry], pulled: list[int] | None = None) -> (
    Iterator[list[HistoryEntry]]
):
    for i, page in enumerate(pages):
        if pulled is not None:
            pulled.append(i)
        yield page


# -- the history comparison ---------------------------------------------------------------------


def test_a_record_as_created_agrees_with_its_create_entry() -> None:
    rec, create = created()
    assert compare_history(rec, [[create]]) == ([], {})
    assert head_agrees(rec.services, [create])


def test_a_transitional_service_reports_when_it_entered_its_state() -> None:
    rec, create = created()
    rec, pause = paused(rec, "replication", 2)
    problems, entered = compare_history(rec, [[pause], [create]])
    assert problems == []
    assert entered == {"replication": T0 + timedelta(minutes=5)}


def test_each_differing_field_is_named() -> None:
    rec, create = created()
    rec, pause = paused(rec, "replication", 2)
    drifted = rec.services["replication"].model_copy(
        update={"generation": 7, "resume_at": T0 + timedelta(hours=1)})
    rec = rec.model_copy(update={"services": {**rec.services, "replication": drifted}})
    problems, _ = compare_history(rec, [[pause, create]])
    assert problems == [Problem("replication", ["generation", "resume_at"], pause)]
    assert not head_agrees(rec.services, [pause, create])


def test_a_service_changed_since_its_creation_without_history_is_named() -> None:
    rec, create = created()
    rec = rec.model_copy(update={"services": {
        **rec.services, "lifecycle": ServiceStatus(state=State.PAUSED, generation=1,
                                                   op_id=CREATE)}})
    problems, _ = compare_history(rec, [[create]])
    assert problems == [Problem("lifecycle", ["state", "generation"], create)]


def test_a_history_ahead_of_the_record_is_one_problem_alone() -> None:
    rec, create = created(version=1)
    ahead = create.model_copy(update={"version": 2})
    assert compare_history(rec, [[ahead]]) == ([Problem("*", ["version"], ahead)], {})


def test_a_record_version_without_its_entry_is_named_and_the_walk_goes_on() -> None:
    rec, create = created(version=1)
    rec = rec.model_copy(update={"version": 3})
    problems, _ = compare_history(rec, [[create]])
    assert problems == [Problem("*", ["version"], create)]


def test_no_history_at_all_is_one_problem_for_the_record() -> None:
    rec, _ = created()
    assert compare_history(rec, []) == ([Problem("*", ["version"], None)], {})
    assert compare_history(rec, [[]]) == ([Problem("*", ["version"], None)], {})


def test_services_the_history_never_names_are_reported_missing() -> None:
    rec, _ = created()
    rec, pause = paused(rec, "replication", 2)
    problems, _ = compare_history(rec, [[pause]])  # the create entry is not there
    assert problems == [Problem("lifecycle", ["op_id"], None)]


def test_the_walk_stops_reading_as_soon_as_every_service_is_decided() -> None:
    """Pages are pulled lazily: each one is a read of the backend, the cost the screen and the
    growing page sizes exist to save."""
    rec, create = created()
    rec, pause = paused(rec, "replication", 2, state=State.PAUSED)
    pulled: list[int] = []
    problems, _ = compare_history(rec, pages_of([pause], [create], [create], pulled=pulled))
    assert problems == [] and pulled == [0, 1]


def test_a_corrupt_page_propagates() -> None:
    rec, _ = created()

    def pages() -> Iterator[list[HistoryEntry]]:
        raise CorruptRecord(LOC, "history row 2 does not parse")
        yield []

    with pytest.raises(CorruptRecord):
        compare_history(rec, pages())


entries = st.builds(
    HistoryEntry,
    op_id=st.sampled_from([CREATE, "p" * 32]),
    at=st.just(T0),
    location=st.just(LOC),
    service=st.sampled_from(["*", "replication", "lifecycle"]),
    event=st.sampled_from(["create", "pause", "settle", "add_service", "remove"]),
    to_state=st.sampled_from([None, State.RUNNING, State.PAUSED]),
    generation=st.integers(0, 2),
    version=st.just(0),
)
statuses = st.builds(
    ServiceStatus,
    state=st.sampled_from([State.RUNNING, State.PAUSED]),
    generation=st.integers(0, 2),
    op_id=st.sampled_from([CREATE, "p" * 32]),
)


@settings(max_examples=500, deadline=None)
@given(
    services=st.dictionaries(st.sampled_from(["replication", "lifecycle"]), statuses,
                             min_size=1),
    head=st.lists(entries, min_size=1, max_size=4),
)
def test_the_head_agrees_only_where_the_full_comparison_finds_nothing(
    services: dict[str, ServiceStatus], head: list[HistoryEntry]
) -> None:
    """The screen's shortcut never hides a problem: whenever the newest writes alone agree, the
    full comparison over those same writes finds nothing."""
    head = [e.model_copy(update={"version": 9}) for e in head]
    rec = LocationStatus(location=LOC, services=services, version=9)
    if head_agrees(services, head):
        assert compare_history(rec, [head])[0] == []


# -- the screen ---------------------------------------------------------------------------------


def test_the_screen_passes_only_settled_agreeing_records_with_nothing_due() -> None:
    rec, create = created()
    screen = Screen(T0 + timedelta(hours=1), None, gaps_possible=False)
    assert screen.quiet(rec, [create])
    assert not screen.quiet(rec, None)  # no history brought: the full path reads it
    assert not screen.quiet(rec, CorruptRecord(LOC, "garbled"))
    assert not screen.quiet(rec, [])
    assert not Screen(screen.now, None, gaps_possible=True).quiet(rec, [create])
    assert not screen.quiet(rec.model_copy(update={"deleted_at": T0}), [create])
    assert not screen.quiet(rec.model_copy(update={"version": 2}), [create])
    pausing, pause = paused(rec, "replication", 2)
    assert not screen.quiet(pausing, [pause, create])
    settled, settle = paused(rec, "replication", 2, state=State.PAUSED)
    assert screen.quiet(settled, [settle, create])
    due = settled.services["replication"].model_copy(update={"resume_at": T0})
    assert not screen.quiet(
        settled.model_copy(update={"services": {**settled.services, "replication": due}}),
        [settle.model_copy(update={"resume_at": T0}), create],
    )


def test_the_screen_sends_location_list_drift_down_the_full_path() -> None:
    rec, create = created()
    now = T0 + timedelta(hours=1)
    assert Screen(now, {LOC: ("lifecycle",)}, False).quiet(rec, [create])
    assert not Screen(now, {LOC: ("ingestion",)}, False).quiet(rec, [create])
    assert not Screen(now, {"eu-west-1": ("lifecycle",)}, False).quiet(rec, [create])


# -- tombstone readiness ------------------------------------------------------------------------


def worker(wid: str, clock: FakeClock, *, lease: float = 60.0,
           locations: tuple[str, ...] | None = None) -> WorkerInfo:
    return WorkerInfo(worker_id=wid, services=("replication",), locations=locations,
                      lease_expires_at=clock() + timedelta(seconds=lease))


def test_a_tombstone_is_ready_once_every_live_worker_that_applies_it_acknowledged() -> None:
    clock = FakeClock(T0)
    tomb, _ = created()
    tomb = tomb.model_copy(update={"deleted_at": T0})
    ack = {TOMBSTONE_ACK: tombstone_generation(T0)}
    workers = [
        worker("w-1", clock),
        worker("w-2", clock),
        worker("w-dead", clock, lease=-1.0),  # expired: not waited for
        worker("w-elsewhere", clock, locations=("eu-west-1",)),  # does not apply it
    ]
    ttl = timedelta(hours=24)
    source = CallerClock(clock)
    assert readiness(tomb, workers, {"w-1": ack}, source, ttl) is None
    assert readiness(tomb, workers, {"w-1": ack, "w-2": ack}, source, ttl) == (
        "acknowledged", ["w-1", "w-2"], [])
    assert readiness(tomb, [], {}, source, ttl) == ("acknowledged", [], [])


def test_an_acknowledgement_of_an_earlier_removal_does_not_count_but_the_ttl_does() -> None:
    clock = FakeClock(T0)
    tomb, _ = created()
    tomb = tomb.model_copy(update={"deleted_at": T0})
    earlier = {TOMBSTONE_ACK: tombstone_generation(T0 - timedelta(minutes=1))}
    workers = [worker("w-1", clock, lease=10 * 86400.0)]
    ttl = timedelta(hours=24)
    assert readiness(tomb, workers, {"w-1": earlier}, CallerClock(clock), ttl) is None
    clock.advance(hours=24)
    assert readiness(tomb, workers, {"w-1": earlier}, CallerClock(clock), ttl) == (
        "ttl", [], ["w-1"])


# -- the repair plan ----------------------------------------------------------------------------


def finding(kind: Kind, action: Action | None, location: str | None = LOC,
            service: str | None = None, worker_id: str | None = None) -> Finding:
    ident = f"{kind.value}:{location or '-'}:{service or worker_id or '-'}"
    return Finding(id=ident, kind=kind, location=location, service=service,
                   worker_id=worker_id, since=None, age_seconds=None, message="m",
                   evidence={}, repair=RepairPlan(action=action, description="d"))


def test_repairs_run_by_phase_one_call_per_location_for_resumes_and_sync() -> None:
    found = [
        finding(Kind.TOMBSTONE_READY, Action.PURGE_LOCATION, "gone"),
        finding(Kind.OVERDUE_RESUME, Action.FIRE_DUE_RESUMES, LOC, "replication"),
        finding(Kind.STUCK_TRANSITION, Action.SETTLE, LOC, "lifecycle"),
        finding(Kind.OVERDUE_RESUME, Action.FIRE_DUE_RESUMES, LOC, "lifecycle"),
        finding(Kind.CORRUPT_RECORD, None, "bad"),
        finding(Kind.EXPIRED_WORKER, Action.REMOVE_WORKER, None, worker_id="w-1"),
        finding(Kind.MISSING_LOCATION, Action.ADD_LOCATION, "new", "replication"),
        finding(Kind.MISSING_LOCATION, Action.ADD_LOCATION, "new", "lifecycle"),
        finding(Kind.OVERDUE_RESUME, Action.FIRE_DUE_RESUMES, "eu-west-1", "replication"),
    ]
    groups = plan(found, random.Random(7))
    actions = [g[0].repair.action for g in groups]
    assert actions == sorted(actions, key=lambda a: ORDER.index(a))
    fire = [[(f.location, f.service) for f in g] for g in groups
            if g[0].repair.action is Action.FIRE_DUE_RESUMES]
    assert sorted(fire) == [[("eu-west-1", "replication")],
                            [(LOC, "replication"), (LOC, "lifecycle")]]
    add = [g for g in groups if g[0].repair.action is Action.ADD_LOCATION]
    assert [len(g) for g in add] == [2]
    assert all(f.repair.action is not None for g in groups for f in g)
    assert sum(len(g) for g in groups) == 8


def test_the_order_within_a_phase_is_random_and_across_phases_fixed() -> None:
    found = [finding(Kind.STUCK_TRANSITION, Action.SETTLE, f"loc-{i}", "replication")
             for i in range(8)]
    found.append(finding(Kind.EXPIRED_WORKER, Action.REMOVE_WORKER, None, worker_id="w"))
    orders = {tuple(g[0].location for g in plan(found, random.Random(seed))[1:])
              for seed in range(20)}
    assert len(orders) > 1
    assert all(plan(found, random.Random(seed))[0][0].worker_id == "w" for seed in range(20))


# -- counts and verdict -------------------------------------------------------------------------


def test_every_kind_and_outcome_is_counted_and_left_means_not_repaired_or_resolved() -> None:
    found = [finding(Kind.STUCK_TRANSITION, Action.SETTLE, f"l{i}", "replication")
             for i in range(4)]
    for f, state in zip(found, (FindingState.REPAIRED, FindingState.RESOLVED,
                                FindingState.BLOCKED, FindingState.OPEN), strict=True):
        f.state = state
    repairs = [Repair(finding=found[0].id, kind=Kind.STUCK_TRANSITION, action=Action.SETTLE,
                      location="l0", service="replication", worker_id=None,
                      outcome=Outcome.APPLIED, detail="settled")]
    s = summarize(found, repairs)
    assert list(s.by_kind) == list(KINDS) and s.by_kind["stuck_transition"] == 4
    assert s.left_by_kind["stuck_transition"] == 2 and s.left == 2
    assert (s.repaired, s.resolved, s.findings) == (1, 1, 4)
    assert s.repairs_by_outcome == {o.value: int(o is Outcome.APPLIED) for o in Outcome}
    assert verdict(s, backend_down=False) == ("findings", 1)
    assert verdict(s, backend_down=True) == ("error", 2)
    assert verdict(summarize(found[:2], repairs), backend_down=False) == ("repaired", 0)
    assert verdict(summarize([], []), backend_down=False) == ("clean", 0)


def test_finding_ids_are_stable_and_ages_measured_from_now() -> None:
    found = Findings(T0 + timedelta(seconds=90), max_skew=1.0)
    rec, _ = created()
    st_ = ServiceStatus(state=State.PAUSED, generation=1, resume_at=T0)
    found.overdue(rec, "replication", st_)
    found.gap(rec, [3, 4], restorable=True)
    assert [f.id for f in found.items] == ["overdue_resume:us-east-1:replication",
                                           "history_gap:us-east-1:-:restorable"]
    assert found.items[0].age_seconds == 90.0 and found.items[1].age_seconds is None
    assert found.items[0].evidence["resume_at"] == "2030-01-01T09:00:00Z"
