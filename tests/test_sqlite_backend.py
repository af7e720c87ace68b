"""SQLite-only behaviour (the shared contract is ``test_backend_contract.py``).

SQLite columns are typed only by their declaration: a hand edit with the ``sqlite3`` shell can
store text or a real number in ``version`` or bytes in ``data``. Every read path must turn that
into a :class:`CorruptRecord` naming the location, never crash, and leave the other locations
readable.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from locstatus import CorruptRecord, Manager
from locstatus.backends.sqlite import SQLiteBackend
from locstatus.check import run_check


@pytest.mark.parametrize(
    ("table", "column", "value", "detail"),
    [
        ("locations", "version", "'x'", "version 'x' is not an integer"),
        ("locations", "version", "2.5", "version 2.5 is not an integer"),
        ("locations", "data", "X'00ff'", "'utf-8' codec can't decode byte 0xff in position 1: "
                                         "invalid start byte"),
        ("history", "version", "2.5", "history: version 2.5 is not an integer"),
        ("history", "data", "X'5b5d00'", "history: record: Invalid JSON: trailing characters "
                                         "at line 1 column 3"),
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
