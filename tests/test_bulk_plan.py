"""A bulk operation's plan (locstatus/manager/bulkplan.py) decides and stores exactly what the
general plan and the one-location path do: the same decision, the same record and history
entries, the same stored bytes, on random records and operations; and the state machine's
outcome does not depend on a status's ``op_id`` and ``updated_at``, the premise of its cases
(docs/benchmarks.md, "Bulk operations")."""

from __future__ import annotations

import contextlib
import sqlite3
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from locstatus import Manager
from locstatus.backends import codec
from locstatus.backends.sqlite import SQLiteBackend
from locstatus.errors import InvalidInput, InvalidTransition, LocstatusError
from locstatus.fsm import Event, transition
from locstatus.manager import Operation
from locstatus.manager.bulkplan import BulkPlan
from locstatus.manager.plans import NOTHING, Refuse, Write
from locstatus.models import (
    MAX_STORED_INT,
    LocationStatus,
    ServiceStatus,
    State,
    WorkerInfo,
    copy_with,
)

from support.fakeclock import FakeClock

START = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
SERVICES = ("replication", "lifecycle", "ingestion")
TEXTS = st.sampled_from([None, "ops", "maintenance at the target", 'quote " and \\ slash',
                         "été ☃ 𝄞"])
TIMES = st.sampled_from([None, START - timedelta(days=2), START - timedelta(microseconds=1),
                         START + timedelta(hours=1, microseconds=500), START + timedelta(days=9)])


@st.composite
def statuses(draw: st.DrawFn) -> ServiceStatus:
    """Service statuses from small pools, so that many records share a case."""
    state = draw(st.sampled_from(list(State)))
    return ServiceStatus(
        state=state,
        generation=draw(st.sampled_from([0, 1, 2, 7, MAX_STORED_INT - 1, MAX_STORED_INT])),
        resume_at=draw(TIMES) if state.desired_paused else None,
        reason=draw(TEXTS),
        actor=draw(TEXTS),
        op_id=draw(st.sampled_from([None, "sync", "a" * 32, "other-op"])),
        updated_at=draw(st.sampled_from([None, START - timedelta(hours=1), START])),
    )


@st.composite
def records(draw: st.DrawFn) -> LocationStatus:
    names = draw(st.lists(st.sampled_from(SERVICES), min_size=1, max_size=3, unique=True))
    return LocationStatus(
        location=draw(st.sampled_from(["a-1", "b.2", "C_3", "d-4", "e-5", "f-6"])),
        services={n: draw(statuses()) for n in names},
        version=draw(st.integers(1, 40)),
        deleted_at=draw(st.sampled_from([None, None, None, START - timedelta(hours=3)])),
    )


@st.composite
def fleets(draw: st.DrawFn, max_size: int = 12) -> list[LocationStatus]:
    """Records drawn from a few, each a copy at its own location and version, most of its
    statuses with another ``op_id``/``updated_at``: records that share the plan's cases (those
    the plan computes once and then reuses)."""
    bases = draw(st.lists(records(), min_size=1, max_size=3))
    out = []
    for i in range(draw(st.integers(1, max_size))):
        base = draw(st.sampled_from(bases))
        services = {
            name: copy_with(status, {
                "op_id": draw(st.sampled_from([status.op_id, "sync", f"op-{i}"])),
                "updated_at": draw(st.sampled_from([status.updated_at, START])),
            })
            for name, status in base.services.items()
        }
        out.append(copy_with(base, {
            "location": f"{base.location}-{i}", "version": draw(st.integers(1, 40)),
            "services": services,
        }))
    return out


SERVICE_ARGS = st.sampled_from([None, "replication", "crr", ["lifecycle", "replication"],
                                ["ingestion"]])


@st.composite
def operations(draw: st.DrawFn) -> Operation:
    service = draw(SERVICE_ARGS)
    reason, actor = draw(TEXTS), draw(TEXTS)
    kind = draw(st.sampled_from(["pause", "resume", "schedule", "cancel"]))
    if kind == "pause":
        return Operation.pause(service, reason=reason, actor=actor)
    if kind == "resume":
        return Operation.resume(service, reason=reason, actor=actor)
    if kind == "cancel":
        return Operation.cancel_scheduled_resume(service, reason=reason, actor=actor)
    at = draw(st.sampled_from([START + timedelta(hours=1, microseconds=500),
                               START + timedelta(hours=3)]))
    return Operation.resume(service, at=at, reason=reason, actor=actor)


def _plans(operation: Operation, op_id: str, rec: LocationStatus, now: datetime
           ) -> tuple[BulkPlan, object] | None:
    """The bulk plan of ``operation`` for ``rec`` as Manager.bulk makes it (the targeted
    services it has), with the general one; None where the bulk skips the record."""
    op = operation.checked(SERVICES, now)
    wanted = op.names()
    names = None if wanted is None else [s for s in wanted if s in rec.services]
    if names == []:
        return None
    general = op.plan(op_id, names)
    return BulkPlan(op.make_event(""), op_id, names, general), general


@settings(max_examples=400, deadline=None)
@given(recs=fleets(), operation=operations(), later=st.booleans())
def test_the_bulk_plan_decides_what_the_general_plan_decides(
    recs: list[LocationStatus], operation: Operation, later: bool
) -> None:
    """Property: for every record, one plan used for all of them (its cases shared), the
    decision is the general plan's: the same kind, the same record and entries, the same
    refusal; a write carries its stored texts, exactly the codec's."""
    now = START + timedelta(minutes=5)
    shared: dict[tuple[str, ...] | None, tuple[BulkPlan, object]] = {}
    for i, rec in enumerate(recs):
        made = _plans(operation, "op-1", rec, now)
        if made is None:
            continue
        key = None if operation.service is None else tuple(made[0].names or ())
        plan, general = shared.setdefault(key, made)
        at = now + timedelta(seconds=i) if later and i % 3 == 0 else now  # cases of a new time
        got, want = plan(rec, at), general(rec, at)  # type: ignore[operator]
        assert type(got) is type(want)
        if isinstance(want, Refuse):
            assert isinstance(got, Refuse)
            assert (type(got.error), str(got.error)) == (type(want.error), str(want.error))
        elif isinstance(want, Write):
            assert isinstance(got, Write)
            assert got.record == want.record and got.entries == want.entries
            assert [e.location for e in got.entries] == [rec.location] * len(got.entries)
            if got.texts is not None:
                assert got.texts == (
                    codec.encode_record(want.record),
                    codec.encode_history(codec.stamp(want.entries, rec.version + 1)),
                )
        else:
            assert got is NOTHING and want is NOTHING


def test_a_plain_pause_of_a_fleet_writes_from_its_templates() -> None:
    """The cases are used: a pause of many running locations gives every write its texts
    (what the property above compares only where they are given)."""
    now = START
    base = LocationStatus(location="x-0", services={"replication": ServiceStatus()}, version=3)
    made = _plans(Operation.pause("replication", reason="outage"), "op-1", base, now)
    assert made is not None
    plan = made[0]
    for i in range(50):
        rec = copy_with(base, {"location": f"x-{i}", "version": 3 + i})
        got = plan(rec, now)
        assert isinstance(got, Write) and got.texts is not None
        assert got.texts[1].count(f'"location":"x-{i}"') == 1


@settings(max_examples=300, deadline=None)
@given(status=statuses(), other=statuses(), operation=operations())
def test_the_state_machine_ignores_op_id_and_updated_at(
    status: ServiceStatus, other: ServiceStatus, operation: Operation
) -> None:
    """Property: the premise of the bulk plan's cases. Two statuses that differ only in
    ``op_id`` and ``updated_at`` get the same outcome: both nothing, the same refusal, or the
    same new status and entry."""
    twin = copy_with(status, {"op_id": other.op_id, "updated_at": other.updated_at})
    op = operation.checked(SERVICES, START)
    event: Event = op.make_event("")
    outcomes = []
    for s in (status, twin):
        try:
            outcomes.append(transition("a-1", "replication", s, event, now=START, op_id="o",
                                       version=5))
        except (InvalidTransition, InvalidInput) as exc:
            outcomes.append((type(exc), str(exc)))  # type: ignore[arg-type]
    assert outcomes[0] == outcomes[1]


# -- the stored bytes, on the real SQLite backend -----------------------------------------------


def _rows(path: Path) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return (
            db.execute("SELECT location, version, data FROM locations ORDER BY 1").fetchall(),
            db.execute("SELECT location, version, data FROM history ORDER BY 1, 2").fetchall(),
        )


def _stores(tmp: Path, recs: dict[str, LocationStatus], clock: FakeClock, watched: bool
            ) -> tuple[Manager, Manager]:
    """Two SQLite files holding the same rows (one built, the other its copy): the drawn
    records as stored, one live worker applying every service when ``watched``."""
    built = Manager(SQLiteBackend(f"sqlite:///{tmp}/bulk.db"), clock=clock)
    if watched:
        built.backend.put_worker(WorkerInfo(
            worker_id="w-1", services=SERVICES, lease_expires_at=START + timedelta(days=1),
        ))
    built.sync_locations({loc: sorted(rec.services) for loc, rec in recs.items()})
    backend = built.backend
    assert isinstance(backend, SQLiteBackend)
    for loc, rec in recs.items():
        backend.write_raw(loc, codec.encode_record(rec))  # the drawn record, as stored
    backend.close()
    with contextlib.closing(sqlite3.connect(tmp / "bulk.db")) as src, \
            contextlib.closing(sqlite3.connect(tmp / "single.db")) as dst:
        src.backup(dst)
    return tuple(  # type: ignore[return-value]
        Manager(SQLiteBackend(f"sqlite:///{tmp}/{name}.db"), clock=clock)
        for name in ("bulk", "single")
    )


def _one_by_one(mgr: Manager, operation: Operation, op_id: str) -> None:
    """What ``Manager.bulk`` does, location by location through the one-location calls: each
    with the targeted services it has (none: skipped), refusals left as they are."""
    names = operation.checked(SERVICES, START).names()
    for rec in mgr.backend.read_all():
        if isinstance(rec, LocstatusError) or rec.deleted:
            continue
        service = None if names is None else [s for s in names if s in rec.services]
        if service == []:
            continue
        kw = {"reason": operation.reason, "actor": operation.actor, "op_id": op_id}
        with contextlib.suppress(LocstatusError):
            if operation.event == "pause":
                mgr.pause(rec.location, service, **kw)  # type: ignore[arg-type]
            elif operation.event == "resume":
                mgr.resume(rec.location, service, **kw)  # type: ignore[arg-type]
            elif operation.event == "schedule_resume":
                assert isinstance(operation.at, datetime)
                mgr.resume(rec.location, service, at=operation.at, **kw)  # type: ignore[arg-type]
            else:
                mgr.cancel_scheduled_resume(rec.location, service, **kw)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recs=fleets(max_size=6), operation=operations(), watched=st.booleans())
@example(  # the bench's case: one service everywhere, running, a live worker
    recs=[LocationStatus(location=f"l-{i}", services={"replication": ServiceStatus()},
                         version=1) for i in range(3)],
    operation=Operation.pause("replication"), watched=True,
)
@example(  # one case but for the generation: each location's own
    recs=[LocationStatus(location=f"l-{i}", services={
        "lifecycle": ServiceStatus(state=State.PAUSED, generation=i, op_id="x"),
        "replication": ServiceStatus(state=State.PAUSED, generation=2 * i, reason="r"),
    }, version=1) for i in range(4)],
    operation=Operation.resume(["replication", "lifecycle"], actor="me"), watched=False,
)
def test_a_bulk_operation_stores_the_bytes_of_the_one_location_calls(
    recs: list[LocationStatus], operation: Operation, watched: bool
) -> None:
    """Property, on SQLite files: ``Manager.bulk`` and the one-location calls, on two stores
    holding the same drawn records at the same time, leave the same rows, byte for byte:
    every record and every history write (settles included where no worker is live)."""
    live = {r.location: r for r in recs if r.deleted_at is None}
    with tempfile.TemporaryDirectory(prefix="bulk-plan-") as tmp:
        clock = FakeClock(START)
        bulk_mgr, single_mgr = _stores(Path(tmp), live, clock, watched)
        try:
            assert _rows(Path(tmp) / "bulk.db") == _rows(Path(tmp) / "single.db")
            if live:
                bulk_mgr.bulk(operation, op_id="op-bulk")
            _one_by_one(single_mgr, operation, "op-bulk")
            assert _rows(Path(tmp) / "bulk.db") == _rows(Path(tmp) / "single.db")
        finally:
            bulk_mgr.backend.close()
            single_mgr.backend.close()
