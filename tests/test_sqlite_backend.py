"""SQLite-only behaviour (the shared contract is ``test_backend_contract.py``).

SQLite columns are typed only by their declaration: a hand edit with the ``sqlite3`` shell can
store text or a real number in ``version`` or bytes in ``data``. Every read path must turn that
into a :class:`CorruptRecord` naming the location, never crash, and leave the other locations
readable.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from locstatus import CorruptRecord, Manager
from locstatus.backends import AckItem
from locstatus.backends.sqlite import SQLiteBackend
from locstatus.check import run_check
from locstatus.models import Hint


@pytest.mark.parametrize(
    ("table", "column", "value", "detail"),
    [
        ("locations", "version", "'x'", "version 'x' is not an integer"),
        ("locations", "version", "2.5", "version 2.5 is not an integer"),
        ("locations", "data", "X'00ff'", "'utf-8' codec can't decode byte 0xff in position 1: "
                                         "invalid start byte"),
        ("history", "version", "2.5", "history: version 2.5 is not an integer"),
        ("history", "data", "X'5b5d00'", "history write at version 3: entries: Invalid JSON: "
                                         "trailing characters at line 1 column 3"),
    ],
)
def test_a_column_holding_another_type_is_a_corrupt_record_not_a_crash(
    tmp_path: Path, table: str, column: str, value: str, detail: str
) -> None:
    path = tmp_path / "s.db"
    mgr = Manager(SQLiteBackend(f"sqlite:///{path}"))
    mgr.sync_locations({"bad": ["replication"], "good": ["replication"]})
    mgr.pause("bad", "replication")
    with sqlite3.connect(path) as db:
        db.execute(
            f"UPDATE {table} SET {column} = {value} WHERE location = 'bad' AND version = "
            f"(SELECT max(version) FROM {table} WHERE location = 'bad')"
        )
    if table == "locations":
        with pytest.raises(CorruptRecord) as exc:
            mgr.status("bad")
        assert (exc.value.location, exc.value.detail) == ("bad", detail)
        assert [getattr(r, "detail", None) for r in mgr.scan()] == [detail, None]
        # a batch read (an agent following a burst) carries the rows as JSON, which holds no
        # bytes: the same answer for each, the good one beside it
        batch = mgr.backend.read_many(["bad", "good"])
        assert [getattr(r, "detail", None) for r in batch] == [detail, None]
    else:
        with pytest.raises(CorruptRecord) as exc:
            mgr.history("bad")
        assert (exc.value.location, exc.value.detail) == ("bad", detail)
    report = run_check(mgr)
    [finding] = report.findings
    assert (finding.kind, finding.location, finding.evidence["detail"]) == (
        "corrupt_record", "bad", detail
    )
    assert finding.evidence["part"] == ("record" if table == "locations" else "history")
    assert mgr.status("good").services["replication"].state.value == "running"
    mgr.close()


def test_a_payload_stored_as_a_blob_reads_as_its_text(tmp_path: Path) -> None:
    """A record or history row stored as a BLOB of the same JSON (a hand edit with a tool
    that writes bytes) reads as that JSON on every path: the check does not call it corrupt."""
    path = tmp_path / "s.db"
    mgr = Manager(SQLiteBackend(f"sqlite:///{path}"))
    mgr.sync_locations({"loc": ["replication"]})
    mgr.pause("loc", "replication")
    before = mgr.status("loc")
    with sqlite3.connect(path) as db:
        db.execute("UPDATE locations SET data = CAST(data AS BLOB)")
        db.execute("UPDATE history SET data = CAST(data AS BLOB)")
    assert mgr.status("loc") == before
    assert [e.event for e in mgr.history("loc")] == ["settle", "pause", "create"]
    assert run_check(mgr).findings == []
    mgr.close()


def _store(tmp_path: Path) -> tuple[Manager, Path]:
    """loc-a: created (v1), lifecycle paused (v2) and settled (v3), replication paused (v4)
    and settled (v5)."""
    path = tmp_path / "s.db"
    mgr = Manager(SQLiteBackend(f"sqlite:///{path}"))
    mgr.sync_locations({"loc-a": ["replication", "lifecycle"]})
    mgr.pause("loc-a", "lifecycle")
    mgr.pause("loc-a", "replication")
    return mgr, path


@pytest.mark.parametrize("tail", ["\x1ejunk", "\x1e1\x1f[]", "\x1f"])
def test_separator_characters_in_an_older_history_row_do_not_hide_its_damage(
    tmp_path: Path, tail: str
) -> None:
    """The check's scan joins older history rows with ASCII separators; a row that holds one
    is not valid JSON, and must be reported as such (found by the reliability review: the row
    was cut at the separator and its valid prefix passed)."""
    mgr, path = _store(tmp_path)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE history SET data = data || ? WHERE version = 3", (tail,))
    with pytest.raises(CorruptRecord):
        mgr.history("loc-a", limit=10)
    [finding] = run_check(mgr).findings
    assert (finding.kind, finding.location, finding.evidence["part"]) == (
        "corrupt_record", "loc-a", "history"
    )
    mgr.close()


def test_a_history_version_made_text_is_reported_not_skipped(tmp_path: Path) -> None:
    """Text sorts above every number in SQLite, so ``version < ?`` used to skip such a row:
    the write vanished from history() and the check blamed the record instead."""
    mgr, path = _store(tmp_path)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE history SET version = 'v5' WHERE version = 5")
    with pytest.raises(CorruptRecord) as exc:
        mgr.history("loc-a", limit=1)
    assert exc.value.detail == "history: version 'v5' is not an integer"
    [finding] = run_check(mgr).findings
    assert (finding.kind, finding.evidence["detail"]) == ("corrupt_record", exc.value.detail)
    mgr.close()


def test_an_empty_history_write_does_not_hide_the_older_ones(tmp_path: Path) -> None:
    """history(limit=n) returns at least n entries when there are that many: a write with no
    entries (what SQLite stores for a record created without history, or a hand edit) does not
    count as the page."""
    mgr, path = _store(tmp_path)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE history SET data = '[]' WHERE version = 5")
    assert [e.event for e in mgr.backend.history("loc-a", limit=1)] == ["pause"]
    assert [e.version for e in mgr.backend.history("loc-a", limit=1, before_version=4)] == [3]
    kinds = {(f.kind.value, f.service) for f in run_check(mgr).findings}
    assert kinds == {("history_mismatch", None), ("history_mismatch", "replication")}
    mgr.close()


def test_a_history_write_ahead_of_the_record_is_reported_and_refuses_the_next_write(
    tmp_path: Path,
) -> None:
    """A history row at a version the record has not reached (a hand edit, a restore of one
    table but not the other) used to pass the check as "changed while read", and the next
    write failed with an unexpected IntegrityError. Now the check names it, and the write is
    refused as corrupt with nothing written."""
    mgr, path = _store(tmp_path)
    [entry] = [e for e in mgr.backend.history("loc-a", limit=1) if e.event == "settle"]
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO history (location, version, data) VALUES ('loc-a', 6, ?)",
                   ("[" + entry.model_copy(update={"version": 6}).model_dump_json() + "]",))
    report = run_check(mgr)
    [finding] = report.findings
    assert (finding.kind, finding.location, finding.service) == (
        "history_mismatch", "loc-a", None
    )
    assert "version 6, newer than the record (version 5)" in finding.message
    assert report.exit_code == 1
    with pytest.raises(CorruptRecord) as exc:
        mgr.resume("loc-a", "lifecycle")
    assert "already holds a write at version 6" in exc.value.detail
    assert mgr.status("loc-a").version == 5
    assert mgr.status("loc-a").services["lifecycle"].state.value == "paused"
    mgr.close()


def _hints_of(backend: SQLiteBackend) -> tuple[list[tuple[float, Hint]], threading.Condition]:
    got: list[tuple[float, Hint]] = []
    cond = threading.Condition()

    def on_hint(hint: Hint) -> None:
        with cond:
            got.append((time.monotonic(), hint))
            cond.notify_all()

    backend.subscribe(on_hint)
    return got, cond


def _wait_location_hint(got: list[tuple[float, Hint]], cond: threading.Condition,
                        location: str, timeout: float) -> float | None:
    deadline = time.monotonic() + timeout
    with cond:
        while True:
            for at, hint in got:
                if hint.kind == "location" and hint.location == location:
                    return at
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            cond.wait(left)


def test_a_write_from_another_process_is_hinted_without_waiting_for_the_poll(
    tmp_path: Path,
) -> None:
    """The poller reads the change log as soon as the WAL file is written (inotify), not only
    every ``poll_interval`` (locstatus/backends/walwatch.py): with a 60 s interval, another
    process's pause is hinted within a second of that process's exit."""
    url = f"sqlite:///{tmp_path}/s.db"
    Manager(SQLiteBackend(url)).sync_locations({"a": ["replication"]})
    backend = SQLiteBackend(f"{url}?poll_interval=60")
    try:
        got, cond = _hints_of(backend)
        time.sleep(0.2)  # the poller is started and watching
        subprocess.run(
            [sys.executable, "-c",
             "import sys; from locstatus import connect; "
             "connect(sys.argv[1]).pause('a', 'replication')", url],
            check=True, timeout=60,
        )
        exited = time.monotonic()
        at = _wait_location_hint(got, cond, "a", timeout=5.0)
        assert at is not None, [h for _, h in got]
        assert at - exited < 1.0
    finally:
        backend.close()


def test_without_inotify_the_change_log_is_still_polled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "inotify_simple", None)  # import fails: poll only
    url = f"sqlite:///{tmp_path}/s.db"
    writer = Manager(SQLiteBackend(url))
    writer.sync_locations({"a": ["replication"]})
    backend = SQLiteBackend(f"{url}?poll_interval=0.05")
    try:
        got, cond = _hints_of(backend)
        time.sleep(0.2)
        writer.pause("a", "replication")
        assert _wait_location_hint(got, cond, "a", timeout=5.0) is not None
    finally:
        backend.close()
        writer.close()


def test_a_subscriber_gets_only_the_kinds_it_asked_for(tmp_path: Path) -> None:
    """An agent asks for no ``acks`` hints (docs/agent.md "Bursts"): 16 workers acknowledging
    a pause of every location are 16 rows of the change log per location, which each agent's
    poller read and hinted. A subscriber of ``location`` hints gets the pause and none of the
    acknowledgements; one of every kind beside it gets both."""
    url = f"sqlite:///{tmp_path}/s.db"
    mgr = Manager(SQLiteBackend(url))
    mgr.sync_locations({f"loc-{i}": ["replication"] for i in range(20)})
    backend = SQLiteBackend(url)
    try:
        picky: list[Hint] = []
        everything, cond = _hints_of(backend)
        backend.subscribe(picky.append, kinds=("location",))
        time.sleep(0.2)  # the poller is started
        for i in range(20):
            mgr.backend.ack("w-1", f"loc-{i}", "replication", 0)
        mgr.pause("loc-7", "replication")
        assert _wait_location_hint(everything, cond, "loc-7", timeout=5.0) is not None
        time.sleep(0.2)  # the picky one is called right after the other, same batch
        assert {h.kind for _, h in everything} >= {"acks", "location"}
        # The pause and its settle are two changes of loc-7; the poller may read them in one
        # batch (one hint) or two.
        seen = [h for h in picky if h.kind != "resync"]
        assert seen and {h.kind for h in seen} == {"location"}
        assert {h.location for h in seen} == {"loc-7"}
    finally:
        backend.close()
        mgr.close()


def test_a_burst_of_more_than_ten_thousand_changes_is_hinted_not_a_resync(
    tmp_path: Path,
) -> None:
    """A pause of 10 000 locations and its workers' acknowledgements are more than the 10 000
    changes the log used to keep: every poller that had not read the log in between lost
    rows and hinted a ``resync`` (each agent re-read every record and swept every one:
    docs/agent.md "Bursts"). One transaction of 12 000 acknowledgements, then a pause: the
    pause is hinted as itself, with no resync."""
    url = f"sqlite:///{tmp_path}/s.db"
    mgr = Manager(SQLiteBackend(url))
    names = [f"loc-{i:05d}" for i in range(12_000)]
    mgr.sync_locations({n: ["replication"] for n in names})
    backend = SQLiteBackend(url)
    try:
        got, cond = _hints_of(backend)
        time.sleep(0.2)  # the poller is started
        results = mgr.backend.ack_many("w-1", [AckItem(n, "replication", 0) for n in names])
        assert results == [None] * len(names)
        mgr.pause("loc-00007", "replication")
        assert _wait_location_hint(got, cond, "loc-00007", timeout=10.0) is not None
        assert [h for _, h in got if h.kind == "resync"] == []
        assert len({h.location for _, h in got if h.kind == "acks"}) == len(names)
    finally:
        backend.close()
        mgr.close()


_CLOSED_UNDER_WRITERS = """
import sys, threading, time
from datetime import UTC, datetime, timedelta
from locstatus.backends.sqlite import SQLiteBackend
from locstatus.errors import BackendUnavailable
from locstatus.models import WorkerInfo

base = sys.argv[1]
for rnd in range(int(sys.argv[2])):
    backend = SQLiteBackend(f"sqlite:///{base}/s{rnd}.db")
    stop = threading.Event()
    failures = []

    def renew(i: int) -> None:
        while not stop.is_set():
            try:
                backend.put_worker(WorkerInfo(
                    worker_id=f"w-{i}", services=["replication"],
                    lease_expires_at=datetime.now(UTC) + timedelta(seconds=10)))
                backend.workers()
            except BackendUnavailable:
                pass
            except Exception as exc:  # anything else is a failure of the test
                failures.append(repr(exc))

    threads = [threading.Thread(target=renew, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    backend.close()
    time.sleep(0.02)
    stop.set()
    for t in threads:
        t.join()
    assert not failures, failures[:3]
print("closed", sys.argv[2], "times")
"""


def test_closing_a_backend_under_its_writers_never_crashes_the_process(tmp_path: Path) -> None:
    """Found in a CI run: an agent's heartbeat thread renewing its lease while the backend was
    closed under it crashed the whole process (a segmentation fault in the sqlite3 module:
    close() closed every thread's connection, one of them in the middle of a statement).
    Connections in use are closed by their own thread as it leaves; the writers get
    BackendUnavailable. Before the fix, this crashed within its first rounds in every run."""
    import subprocess
    import sys

    got = subprocess.run(
        [sys.executable, "-c", _CLOSED_UNDER_WRITERS, str(tmp_path), "80"],
        capture_output=True, text=True, timeout=300,
    )
    assert got.returncode == 0, (got.returncode, got.stderr[-2000:])
    assert "closed 80 times" in got.stdout
