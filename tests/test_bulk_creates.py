"""A sync's creates at fleet scale (locstatus/manager/creates.py) are exactly the one-location
create's: the same records and history entries as :func:`new_record` validates, and stored texts
that are the codec's own, for any mix of service lists and actors; and what SQLite's batched
``create_many`` stores from them is what its single ``create`` stores (docs/benchmarks.md,
"Bulk operations")."""

from __future__ import annotations

import re
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from locstatus import Manager
from locstatus.backends import codec
from locstatus.backends.sqlite import SQLiteBackend
from locstatus.errors import AlreadyExists, CorruptRecord
from locstatus.manager.creates import FIRST_VERSION, new_op_ids, new_record, new_records
from locstatus.models import LocationStatus

SERVICES = ("replication", "lifecycle", "ingestion")
ACTORS = st.sampled_from([None, "ops", 'quote " and \\ slash', "été ☃ 𝄞", "\x00op\x00"])
NOW = datetime(2026, 3, 1, 9, 0, 0, 123456, tzinfo=UTC)


@settings(max_examples=60, deadline=None)
@given(
    lists=st.lists(
        st.lists(st.sampled_from(SERVICES), min_size=0, max_size=3, unique=True),
        min_size=1, max_size=12,
    ),
    actor=ACTORS,
)
def test_the_creates_are_the_validated_ones_and_their_texts_the_codecs(
    lists: list[list[str]], actor: str | None
) -> None:
    """Whatever the service lists and the actor (one that holds a template's sentinel
    included: its batch gets no texts, the backend encodes), each create is the record and
    entry the general path validates, with its own operation id, and each text is what the
    codec writes for it."""
    locations = [f"loc-{i:02d}" for i in range(len(lists))]
    wanted = {loc: tuple(svcs) for loc, svcs in zip(locations, lists, strict=True)}
    items, texts = new_records(locations, wanted, NOW, actor)
    assert [record.location for record, _ in items] == locations
    assert len({entries[0].op_id for _, entries in items}) == len(items)  # one id per create
    for (record, entries), svcs in zip(items, lists, strict=True):
        [entry] = entries
        assert {status.op_id for status in record.services.values()} <= {entry.op_id}
        assert (record, entries) == new_record(record.location, svcs, NOW, actor, entry.op_id)
    if actor is not None and "\x00" in actor:
        assert texts is None
        return
    assert texts is not None
    for (record, entries), text in zip(items, texts, strict=True):
        assert text == (
            codec.encode_record(record),
            codec.encode_history(codec.stamp(entries, FIRST_VERSION)),
        )


def test_operation_ids_are_fresh_32_hex_characters() -> None:
    for count in (0, 1, 2, 1000):
        ids = new_op_ids(count)
        assert len(ids) == len(set(ids)) == count
        assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


def test_a_synced_fleet_is_stored_as_locations_added_one_at_a_time(tmp_path: Path) -> None:
    """The rows a sync writes (record, history, life) are those ``add_location`` writes for
    the same locations, but for the times and operation ids (each record's services and its
    history entry carry one id, its own)."""
    wanted = {f"site-{i:04d}": SERVICES[: 1 + i % 3] for i in range(2500)}
    bulk, alone = tmp_path / "bulk.db", tmp_path / "alone.db"
    one = Manager(SQLiteBackend(f"sqlite:///{bulk}"), services=SERVICES)
    assert one.sync_locations(wanted, actor="ops").added == sorted(wanted)
    other = Manager(SQLiteBackend(f"sqlite:///{alone}"), services=SERVICES)
    for loc, svcs in list(wanted.items())[:300]:
        other.add_location(loc, svcs, actor="ops")
    rows = {path: _rows(path) for path in (bulk, alone)}
    assert sorted(rows[bulk]) == sorted(wanted)
    ids = set()
    for loc, row in rows[bulk].items():
        found = set(re.findall(r'"op_id":"([0-9a-f]{32})"', row[1] + row[2]))
        assert len(found) == 1, (loc, row)
        ids |= found
        if loc in rows[alone]:
            assert _unstamped(row) == _unstamped(rows[alone][loc])
    assert len(ids) == len(wanted)
    one.close()
    other.close()


def _rows(path: Path) -> dict[str, tuple[int, str, str, int]]:
    """location -> its record's version and text, its history row's text and its life."""
    with sqlite3.connect(path) as db:
        return {
            loc: (version, data, history, last) for loc, version, data, history, last in
            db.execute("SELECT l.location, l.version, l.data, h.data, i.last FROM locations l "
                       "JOIN history h USING (location) JOIN incarnations i USING (location)")
        }


def _unstamped(row: tuple[int, str, str, int]) -> tuple[int, str, str, int]:
    """A row with its operation ids and times blanked."""
    def blank(text: str) -> str:
        text = re.sub(r'"op_id":"[0-9a-f]{32}"', '"op_id":""', text)
        return re.sub(r'"(updated_at|at)":"[^"]+"', r'"\1":""', text)
    return row[0], blank(row[1]), blank(row[2]), row[3]


def test_a_batch_of_creates_refuses_alone_one_whose_history_a_hand_edit_put_ahead(
    tmp_path: Path,
) -> None:
    """SQLite's batched ``create_many`` reads what is stored of the whole batch first: a
    location stored already is :class:`AlreadyExists`, one whose history row is already at
    the version its create would make (a hand edit) :class:`CorruptRecord` with nothing of it
    written, one removed before gets a life above its earlier one; the others are created,
    with their history, in the same transaction."""
    path = tmp_path / "s.db"
    mgr = Manager(SQLiteBackend(f"sqlite:///{path}"), services=SERVICES)
    mgr.add_location("kept", ["replication"])
    mgr.add_location("again", ["replication"])
    old = mgr.status("again")
    mgr.backend.delete("again", old.version)
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO history (location, version, data) VALUES ('ahead', 1, '[]')")
    names = ["new-1", "kept", "ahead", "again", "new-2"]
    items, texts = new_records(names, dict.fromkeys(names, ("replication",)), NOW, "ops")
    results = mgr.backend.create_many(items, texts=texts)
    assert isinstance(results[1], AlreadyExists)
    assert isinstance(results[2], CorruptRecord)
    assert "already holds a write at version 1" in results[2].detail
    for k in (0, 3, 4):
        got = results[k]
        assert isinstance(got, LocationStatus)
        assert mgr.status(names[k]) == got
        assert [e.op_id for e in mgr.history(names[k])] == [items[k][1][0].op_id]
    assert results[3].version > old.version
    [entry] = mgr.history("again")
    assert entry.version == results[3].version
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT count(*) FROM locations WHERE location = 'ahead'").fetchone() \
            == (0,)
        assert db.execute("SELECT last FROM incarnations WHERE location = 'ahead'").fetchone() \
            is None
        assert db.execute("SELECT last FROM incarnations WHERE location = 'again'").fetchone() \
            == (2,)
    mgr.close()


@pytest.mark.parametrize("given_texts", [True, False])
def test_given_texts_and_encoded_ones_store_the_same_rows(tmp_path: Path,
                                                          given_texts: bool) -> None:
    names = [f"t-{i}" for i in range(5)]
    items, texts = new_records(names, dict.fromkeys(names, SERVICES), NOW, None)
    backend = SQLiteBackend(f"sqlite:///{tmp_path / 's.db'}")
    backend.create_many(items, texts=texts if given_texts else None)
    with sqlite3.connect(tmp_path / "s.db") as db:
        got = db.execute("SELECT l.data, h.data FROM locations l JOIN history h "
                         "USING (location) ORDER BY location").fetchall()
    assert texts is not None and got == [tuple(t) for t in texts]
    backend.close()
