"""The check's fast screen never hides a finding (issue 7, the check's cost).

``run_check`` passes a record that is settled, has nothing due and agrees with the newest history
write read with it through a few comparisons, and sends every other record through the full
comparison (which pages through older history and builds the findings). The screen is only
worth having if it can never say "nothing to report" where the full comparison reports
something. So these properties drive random operator actions and random damage, made with
``sqlite3`` directly as a hand edit would be (records and history rows rewritten in place at the
same version, history rows deleted or garbled, writes without history), and check that the
report is exactly the one the full comparison gives for every record.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from locstatus import LocstatusError, Manager, ServiceStatus, WorkerInfo
from locstatus.backends.sqlite import SQLiteBackend
from locstatus.check import run_check
from locstatus.check.scan import Scan

from support.fakeclock import FakeClock
from support.suite import sized

START = datetime(2030, 1, 1, 9, 0, tzinfo=UTC)
SERVICES = ("replication", "lifecycle", "ingestion")

# Skewed towards one location and service, so that actions and damage meet often.
loc = st.sampled_from(["loc-a", "loc-a", "loc-a", "loc-b"])
svc = st.sampled_from(["replication", "replication", "replication", "lifecycle", "ingestion"])
times = st.sampled_from(
    [None, "2030-01-01T08:00:00Z", "2030-01-01T10:00:00Z", "2030-01-01T10:00:00+00:00",
     "2030-01-01T12:00:00.000001Z", "not a time"]
)
field_values = st.one_of(
    st.tuples(st.just("state"), st.sampled_from(["running", "pausing", "paused", "resuming",
                                                 "exploded"])),
    st.tuples(st.just("generation"), st.sampled_from([0, 1, 2, 3, -1, "one"])),
    st.tuples(st.just("resume_at"), times),
    st.tuples(st.just("op_id"), st.sampled_from([None, "0" * 32, "f" * 32])),
)
history_values = st.one_of(
    field_values,
    st.tuples(st.just("to_state"), st.sampled_from([None, "running", "paused", "pausing"])),
    st.tuples(st.just("service"), st.sampled_from(["*", *SERVICES])),
    st.tuples(st.just("event"), st.sampled_from(["create", "pause", "add_service", "settle"])),
    st.tuples(st.just("version"), st.sampled_from([0, 1, 2**20 + 1])),
    st.tuples(st.just("at"), times),
)
operations = st.one_of(
    st.tuples(st.just("pause"), loc, svc),
    st.tuples(st.just("resume"), loc, svc),
    st.tuples(st.just("schedule"), loc, svc, st.integers(1, 180)),
    st.tuples(st.just("cancel"), loc, svc),
    st.tuples(st.just("settle"), loc),
    st.tuples(st.just("fire"), loc),
    st.tuples(st.just("minutes"), st.integers(1, 240)),
    st.tuples(st.just("worker"), st.integers(1, 120)),
    st.tuples(st.just("remove"), loc),
    st.tuples(st.just("add"), loc, st.lists(svc, min_size=1, max_size=3, unique=True)),
)
rows = st.sampled_from([0, 0, 1, 2])  # which history write, newest first
RETYPED = ["'7'", "'x'", "-1", "2.5", "CAST(data AS BLOB)", "X'00'", "version + 0.0", "NULL"]
"""SQL expressions a column is set to by ``retype`` (``data`` and ``version`` are the row's)."""
damage = st.one_of(
    st.tuples(st.just("edit_record"), loc, svc, field_values),
    st.tuples(st.just("skip_history"), loc, svc, field_values),
    st.tuples(st.just("edit_history"), loc, rows, st.integers(-3, 2), history_values),
    st.tuples(st.just("drop_history"), loc, rows),
    st.tuples(st.just("garble_history"), loc, rows,
              st.sampled_from(["", "[]", "[{}]", "{", "null", "[]\x1e[]"])),
    # SQLite columns are typed only by declaration: a hand edit may store any type anywhere.
    st.tuples(st.just("append_history"), loc, rows,
              st.sampled_from(["\x1ejunk", "\x1e1\x1f[]", "\x1f", " ", "]"])),
    st.tuples(st.just("retype"), loc, st.sampled_from(["locations", "history"]), rows,
              st.sampled_from(["version", "data"]), st.sampled_from(RETYPED)),
)
expectations = st.one_of(
    st.none(),
    st.dictionaries(loc, st.lists(svc, min_size=1, max_size=3, unique=True), min_size=1),
)


@pytest.fixture
def store() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


def apply(mgr: Manager, clock: FakeClock, db: sqlite3.Connection, action: tuple[Any, ...]) -> None:
    kind, *args = action
    try:
        if kind == "pause":
            mgr.pause(args[0], args[1])
        elif kind == "resume":
            mgr.resume(args[0], args[1])
        elif kind == "schedule":
            mgr.resume(args[0], args[1], at=timedelta(minutes=args[2]))
        elif kind == "cancel":
            mgr.cancel_scheduled_resume(args[0], args[1])
        elif kind == "settle":
            mgr.settle(args[0])
        elif kind == "fire":
            mgr.fire_due_resumes(args[0])
        elif kind == "minutes":
            clock.advance(args[0] * 60.0)
        elif kind == "worker":  # a live worker: transitions now wait for its acknowledgement
            mgr.backend.put_worker(WorkerInfo(
                worker_id=f"w{args[0]}", services=SERVICES,
                lease_expires_at=clock() + timedelta(minutes=args[0])))
        elif kind == "remove":
            mgr.remove_location(args[0])
        elif kind == "add":
            mgr.add_location(args[0], args[1])
        elif kind == "skip_history":  # a write through the backend that left no history
            rec = mgr.backend.read(args[0])
            if args[1] in rec.services:
                field, value = args[2]
                drifted = ServiceStatus.model_validate(
                    rec.services[args[1]].model_dump(mode="json") | {field: value}
                )
                new = rec.model_copy(update={"services": {**rec.services, args[1]: drifted}})
                mgr.backend.compare_and_set(new, rec.version, [])
        else:
            hand_edit(db, action)
    except (LocstatusError, ValueError):
        pass  # refused by the product: nothing written, the next action goes on


def hand_edit(db: sqlite3.Connection, action: tuple[Any, ...]) -> None:
    """Damage made with the backend's own client, at the same version (no trace in locstatus)."""
    kind, location, *args = action
    if kind == "edit_record":
        row = db.execute("SELECT data FROM locations WHERE location = ?", (location,)).fetchone()
        if row is None:
            return
        data = json.loads(row[0])
        services = data.get("services") if isinstance(data, dict) else None
        if isinstance(services, dict) and isinstance(services.get(args[0]), dict):
            field, value = args[1]
            data["services"][args[0]][field] = value
            db.execute("UPDATE locations SET data = ? WHERE location = ?",
                       (json.dumps(data), location))
        return
    if kind == "retype":
        table, row, column, value = args
        with contextlib.suppress(sqlite3.IntegrityError):  # NOT NULL; (location, version) key
            if table == "locations":
                db.execute(f"UPDATE locations SET {column} = {value} WHERE location = ?",
                           (location,))
                return
            found = db.execute(
                "SELECT version FROM history WHERE location = ? ORDER BY version DESC "
                "LIMIT 1 OFFSET ?", (location, row)
            ).fetchone()
            if found is not None:
                db.execute(f"UPDATE history SET {column} = {value} "
                           "WHERE location = ? AND version = ?", (location, found[0]))
        return
    row, *args = args
    found = db.execute(
        "SELECT version, data FROM history WHERE location = ? ORDER BY version DESC "
        "LIMIT 1 OFFSET ?",
        (location, row),
    ).fetchone()
    if found is None:
        return
    version, text = found
    if kind == "drop_history":
        db.execute("DELETE FROM history WHERE location = ? AND version = ?", (location, version))
    elif kind == "garble_history":
        db.execute("UPDATE history SET data = ? WHERE location = ? AND version = ?",
                   (args[0], location, version))
    elif kind == "append_history":
        db.execute("UPDATE history SET data = data || ? WHERE location = ? AND version = ?",
                   (args[0], location, version))
    elif kind == "edit_history":
        entries = json.loads(text)
        index, (field, value) = args
        if isinstance(entries, list) and entries and isinstance(entries[index % len(entries)],
                                                                 dict):
            entries[index % len(entries)][field] = value
            db.execute("UPDATE history SET data = ? WHERE location = ? AND version = ?",
                       (json.dumps(entries), location, version))


def report_of(mgr: Manager, expected: dict[str, list[str]] | None) -> dict[str, Any]:
    report = run_check(mgr, expected=expected).as_dict()
    for key in ("actor", "duration_seconds"):  # differ between any two runs
        report.pop(key)
    return report


@settings(max_examples=int(os.environ.get("SCREEN_EXAMPLES", sized(ci=125, long=500))), deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(
    steps=st.lists(operations, min_size=2, max_size=20),
    damages=st.lists(damage, max_size=3),
    expected=expectations,
)
# Each way a settled-looking record must still reach the full path, once for certain:
@example(steps=[("pause", "loc-a", "replication"), ("schedule", "loc-a", "replication", 10),
                ("minutes", 20)], damages=[], expected=None)  # a resume overdue
@example(steps=[("worker", 60), ("pause", "loc-a", "lifecycle"), ("minutes", 30)], damages=[],
         expected=None)  # stuck pausing
@example(steps=[("remove", "loc-b"), ("minutes", 24 * 60 + 1)], damages=[],
         expected=None)  # a tombstone past its TTL
@example(steps=[("pause", "loc-b", "replication")], damages=[],
         expected={"loc-a": ["replication"]})  # location list drift
@example(steps=[("add", "loc-b", ["ingestion"])],
         damages=[("edit_record", "loc-b", "ingestion", ("generation", 1))], expected=None)
@example(steps=[("pause", "loc-a", "replication"), ("pause", "loc-a", "lifecycle")],
         damages=[("edit_history", "loc-a", 1, -1, ("generation", 3))], expected=None)
@example(steps=[("pause", "loc-a", "lifecycle"), ("pause", "loc-a", "replication")],
         damages=[("append_history", "loc-a", 1, "\x1ejunk")], expected=None)
@example(steps=[("pause", "loc-a", "replication")],
         damages=[("retype", "loc-a", "history", 0, "data", "2.5"),
                  ("retype", "loc-b", "locations", 0, "version", "'x'")], expected=None)
def test_the_screen_reports_exactly_what_the_full_comparison_reports(
    store: Path, monkeypatch: pytest.MonkeyPatch, steps: list[tuple[Any, ...]],
    damages: list[tuple[Any, ...]], expected: dict[str, list[str]] | None,
) -> None:
    # The full path pages through history in growing pages (fewer queries), so it may read,
    # and find damage in, writes older than the comparison needs. Here both runs page one write
    # at a time, so that they read exactly the writes each service needs: what differs between
    # them is only the screen and the history the scan brings.
    monkeypatch.setattr("locstatus.check.scan.HISTORY_PAGES", (1,))
    path = store / f"{len(list(store.iterdir()))}.db"
    clock = FakeClock(START)
    mgr = Manager(SQLiteBackend(f"sqlite:///{path}"), clock=clock)
    db = sqlite3.connect(path, isolation_level=None)
    try:
        mgr.sync_locations({"loc-a": list(SERVICES), "loc-b": ["replication", "lifecycle"]})
        for action in [*steps, *damages]:
            apply(mgr, clock, db, action)
        screened = report_of(mgr, expected)
        with monkeypatch.context() as m:
            # The oracle: every record takes the full path, and the scan brings no history (the
            # base Backend's scan), so the full path pages through Backend.history itself.
            m.setattr("locstatus.check.screen.Screen.quiet", lambda self, rec, head: False)
            m.setattr(SQLiteBackend, "scan_with_history",
                      lambda self: [(rec, None) for rec in self.read_all()])
            full = report_of(mgr, expected)
        assert screened == full, (steps, damages, expected)
    finally:
        db.close()
        mgr.close()


def test_settled_records_that_agree_with_their_history_take_the_fast_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The screen is what makes a 100 000-location check cheap (bench/check.py): a fleet of
    settled locations, some paused, some with a resume scheduled days ahead, some with a service
    added later, never reaches the full comparison; the one stuck location does."""
    clock = FakeClock(START)
    mgr = Manager(SQLiteBackend(f"sqlite:///{tmp_path}/s.db"), clock=clock)
    names = [f"loc-{i:03d}" for i in range(60)]
    mgr.sync_locations({n: ["replication", "lifecycle"] for n in names})
    for n in names[::3]:
        mgr.pause(n, "replication")
    for n in names[::6]:
        mgr.resume(n, "replication", at=timedelta(days=2))
    mgr.add_location("loc-000", ["replication", "lifecycle", "ingestion"])
    mgr.backend.put_worker(WorkerInfo(worker_id="w", services=("lifecycle",),
                                      lease_expires_at=clock() + timedelta(days=1)))
    mgr.pause("loc-059", "lifecycle")  # stays pausing: w never acknowledges
    clock.advance(3600.0)

    full_path: list[str] = []
    real = Scan._record

    def counted(self: Any, rec: Any, newest: Any) -> None:
        full_path.append(rec.location)
        real(self, rec, newest)

    monkeypatch.setattr(Scan, "_record", counted)
    report = run_check(mgr)
    assert [(f.kind.value, f.location) for f in report.findings] == [
        ("stuck_transition", "loc-059")
    ]
    # Paused-only services need one older write per service at most; loc-000 (paused and
    # settled, scheduled, a service added: four writes past its create) is covered by the scan's
    # newest writes too.
    assert sorted(full_path) == ["loc-059"], full_path
    mgr.close()
