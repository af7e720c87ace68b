"""A whole scan's rows decoded in one loop (``codec.decode_rows``, SQLite's ``read_all``) give
what one decode per row gives: the same records, the same corrupt records with the same
details, for stored texts as written and damaged in the ways a hand edit damages them."""

from __future__ import annotations

import contextlib
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from locstatus.backends import codec
from locstatus.backends.sqlite import SQLiteBackend
from locstatus.errors import CorruptRecord
from locstatus.models import LocationStatus, ServiceStatus, State

START = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


def _row_alone(location: str, version: object, text: object) -> LocationStatus | CorruptRecord:
    if type(version) is not int:
        return CorruptRecord(location, f"version {version!r} is not an integer")
    if not isinstance(text, str | bytes):
        return CorruptRecord(location, f"expected JSON text, got {type(text).__name__}")
    return codec.decode_record_or_error(location, version, text)


DAMAGES = [
    lambda t: t,
    lambda t: t.replace('"state":', '"state" :', 1),
    lambda t: t.replace(',"actor":null', "", 1),
    lambda t: t.replace('"op_id":', '"op_id":"x","op_id":', 1),
    lambda t: t.replace('"replication"', '"crr"', 1),
    lambda t: t.replace('{"format":1,', '{"format":2,', 1),
    lambda t: t.replace('{"format":1,', "{", 1),
    lambda t: t.replace('"generation":0', '"generation":-1', 1),
    lambda t: t.replace('"running"', '"runing"', 1),
    lambda t: t.replace('"reason":null', '"reason":"a\\u00e9"', 1),
    lambda t: t.replace(',', ',\n', 1),
    lambda t: t[:-3],
    lambda t: t.replace('"deleted_at":null', '"deleted_at":"2026-01-01T00:00:00Z"', 1),
    lambda t: t.replace('"resume_at":null', '"resume_at":"2026-01-01T00:00:00Z"', 1),
]


@st.composite
def texts(draw: st.DrawFn) -> str:
    names = draw(st.lists(st.sampled_from(["replication", "lifecycle"]), min_size=1,
                          unique=True))
    state = draw(st.sampled_from(list(State)))
    rec = LocationStatus(location="x", services={n: ServiceStatus(
        state=state, generation=draw(st.integers(0, 3)),
        resume_at=START if state.desired_paused and draw(st.booleans()) else None,
        reason=draw(st.sampled_from([None, "é ☃", 'q"uote'])), op_id="o", updated_at=START,
    ) for n in names}, version=1)
    return str(draw(st.sampled_from(DAMAGES))(codec.encode_record(rec)))


LOCATIONS = st.sampled_from(["a-1", "b.2", "C_3", 'q"x', "back\\slash", "-dash", "", "..",
                             "a" * 129, "all"])
VERSIONS = st.sampled_from([1, 7, 0, 2**63 - 1, 2**63, -1, True, "3", 1.5])


@st.composite
def scans(draw: st.DrawFn) -> list[tuple[object, object, object]]:
    """Rows of one scan, their texts from a small pool (a fleet's records share a few)."""
    pool = draw(st.lists(texts(), min_size=1, max_size=3))
    out: list[tuple[object, object, object]] = []
    for _ in range(draw(st.integers(0, 10))):
        text = draw(st.sampled_from(pool))
        payload: object = draw(st.sampled_from([text, text, text, text.encode(), None, 12]))
        out.append((draw(LOCATIONS), draw(VERSIONS), payload))
    return out


def _same(a: LocationStatus | CorruptRecord, b: LocationStatus | CorruptRecord) -> bool:
    if isinstance(a, CorruptRecord) or isinstance(b, CorruptRecord):
        return type(a) is type(b) and str(a) == str(b)
    return a == b


@settings(max_examples=500, deadline=None)
@given(batch=scans())
def test_decode_rows_is_one_decode_per_row(batch: list[tuple[object, object, object]]) -> None:
    got = codec.decode_rows(batch, _row_alone)
    want = [_row_alone(str(loc), v, t) for loc, v, t in batch]
    assert len(got) == len(want)
    assert all(_same(a, b) for a, b in zip(got, want, strict=True)), (got, want)


def test_read_all_reports_each_damaged_record_and_reads_the_others(tmp_path: Path) -> None:
    """On a SQLite file: every record read, a damaged one as its corrupt record, in order."""
    b = SQLiteBackend(f"sqlite:///{tmp_path}/s.db")
    try:
        good = LocationStatus(location="a-1", services={"replication": ServiceStatus(
            state=State.PAUSED, resume_at=START + timedelta(hours=1), updated_at=START)})
        for n, damage in enumerate(DAMAGES):
            b.write_raw(f"l-{n:02d}", damage(codec.encode_record(good)))
        with contextlib.closing(sqlite3.connect(tmp_path / "s.db")) as db, db:
            db.execute("UPDATE locations SET version = 'two' WHERE location = 'l-00'")
        got = b.read_all()
        with contextlib.closing(sqlite3.connect(tmp_path / "s.db")) as db:
            stored = db.execute("SELECT location, version, data FROM locations").fetchall()
        assert [r.location for r in got] == [f"l-{n:02d}" for n in range(len(DAMAGES))]
        assert all(_same(a, _row_alone(*row)) for a, row in zip(got, stored, strict=True))
        assert isinstance(got[0], CorruptRecord) and "'two' is not an integer" in str(got[0])
        assert got[1] == LocationStatus(location="l-01", services=good.services, version=1)
        assert sum(isinstance(r, CorruptRecord) for r in got) == 6
    finally:
        b.close()
