"""The backend contract (``locstatus/backends/base.py``), one suite for every backend.

Each test states one invariant of the contract in an operator's terms. The suite runs once per
kit (memory, SQLite, ZooKeeper, MongoDB); a backend joins by adding a kit, never by skipping.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from locstatus.backends import Backend, codec
from locstatus.backends.base import AckItem, CasItem, CasResult, StaleVersion
from locstatus.errors import (
    AlreadyExists,
    BackendUnavailable,
    CorruptRecord,
    InvalidInput,
    NewerFormat,
    NotFound,
    StandingRegistered,
    VersionConflict,
)
from locstatus.manager.creates import new_records
from locstatus.models import (
    MAX_STORED_INT,
    TOMBSTONE_ACK,
    Hint,
    HistoryEntry,
    LocationStatus,
    ServiceStatus,
    State,
    WorkerInfo,
    tombstone_generation,
)

from support import corrupt_shapes as shapes
from support.kits import Kit

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def record(location: str, state: State = State.RUNNING, generation: int = 0) -> LocationStatus:
    return LocationStatus(
        location=location,
        services={
            "replication": ServiceStatus(state=state, generation=generation, updated_at=T0),
            "lifecycle": ServiceStatus(updated_at=T0),
        },
    )


def entry(location: str, op_id: str, event: str = "pause", service: str = "replication") -> HistoryEntry:
    return HistoryEntry(
        op_id=op_id, at=T0, location=location, service=service, event=event,
        from_state=State.RUNNING, to_state=State.PAUSING, generation=1,
    )


def worker(worker_id: str, lease: datetime | None, services: tuple[str, ...] = ("replication",)) -> WorkerInfo:
    return WorkerInfo(worker_id=worker_id, services=services, lease_expires_at=lease, host="h", pid=1)


@pytest.fixture
def b(kit: Kit) -> Backend:
    return kit.open()


# -- records ---------------------------------------------------------------------------------


def test_create_then_read_returns_the_same_record(b: Backend) -> None:
    stored = b.create(record("us-east-1"), [entry("us-east-1", "op-create", "create", "*")])
    assert stored.version >= 1
    got = b.read("us-east-1")
    assert got == stored
    assert got.services["replication"].state is State.RUNNING


def test_create_twice_is_refused_and_keeps_the_first(b: Backend) -> None:
    first = b.create(record("loc-a"), [])
    with pytest.raises(AlreadyExists):
        b.create(record("loc-a", State.PAUSED, 3), [])
    assert b.read("loc-a") == first


def test_read_of_unknown_location_is_not_found(b: Backend) -> None:
    with pytest.raises(NotFound, match="nowhere"):
        b.read("nowhere")


def test_read_all_is_sorted_and_complete(b: Backend) -> None:
    for name in ["zeta", "alpha", "mid-1"]:
        b.create(record(name), [])
    names = [r.location for r in b.read_all() if isinstance(r, LocationStatus)]
    assert names == ["alpha", "mid-1", "zeta"]


def test_compare_and_set_bumps_the_version_by_exactly_one(b: Backend) -> None:
    v1 = b.create(record("loc"), []).version
    stored = b.compare_and_set(record("loc", State.PAUSING, 1), v1, [entry("loc", "op-1")])
    assert stored.version == v1 + 1
    again = b.compare_and_set(record("loc", State.PAUSED, 1), v1 + 1, [entry("loc", "op-2", "settle")])
    assert again.version == v1 + 2
    assert b.read("loc").services["replication"].state is State.PAUSED


def test_stale_compare_and_set_conflicts_and_writes_nothing(b: Backend) -> None:
    v1 = b.create(record("loc"), []).version
    b.compare_and_set(record("loc", State.PAUSING, 1), v1, [entry("loc", "op-1")])
    before = (b.read("loc"), b.history("loc", limit=100))
    with pytest.raises(VersionConflict):
        b.compare_and_set(record("loc", State.RESUMING, 2), v1, [entry("loc", "op-stale", "resume")])
    assert (b.read("loc"), b.history("loc", limit=100)) == before


def test_a_stale_compare_and_set_carries_the_record_as_it_is_now(kit: Kit) -> None:
    """A conflict comes back with the record that refused it where the backend has it within
    the refused write's own round trip (docs/design.md §3.1): what the writer's next read would
    return, another client's write included, so its next attempt needs no read of its own.
    ZooKeeper's multi-op answers no data (a get behind every write would cost every write)."""
    a, other = kit.open(), kit.open()
    v1 = a.create(record("loc"), []).version
    now = other.compare_and_set(record("loc", State.PAUSING, 1), v1, [entry("loc", "op-1")])
    with pytest.raises(VersionConflict) as refused:
        a.compare_and_set(record("loc", State.RESUMING, 2), v1, [entry("loc", "op-stale", "resume")])
    if kit.name == "zk":
        assert not isinstance(refused.value, StaleVersion)
    else:
        assert isinstance(refused.value, StaleVersion)
        assert refused.value.current == now == a.read("loc")


def test_compare_and_set_of_a_missing_record_is_not_found(b: Backend) -> None:
    with pytest.raises(NotFound):
        b.compare_and_set(record("ghost"), 1, [entry("ghost", "op")])
    with pytest.raises(NotFound):
        b.read("ghost")


def test_only_one_of_many_racing_writers_wins(kit: Kit) -> None:
    clients = [kit.open() for _ in range(6)]
    v1 = clients[0].create(record("hot"), []).version
    wins: list[int] = []
    conflicts: list[int] = []
    barrier = threading.Barrier(len(clients))

    def race(i: int, client: Backend) -> None:
        barrier.wait()
        try:
            client.compare_and_set(record("hot", State.PAUSING, i + 1), v1, [entry("hot", f"op-{i}")])
            wins.append(i)
        except VersionConflict:
            conflicts.append(i)

    threads = [threading.Thread(target=race, args=(i, c)) for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(wins) == 1 and len(conflicts) == len(clients) - 1
    final = clients[0].read("hot")
    assert final.version == v1 + 1
    assert final.services["replication"].generation == wins[0] + 1
    ops = [e.op_id for e in clients[0].history("hot", limit=100)]
    assert ops == [f"op-{wins[0]}"]


# -- history ---------------------------------------------------------------------------------


def test_history_is_written_with_the_state_and_stamped_with_its_version(b: Backend) -> None:
    v1 = b.create(record("loc"), [entry("loc", "op-c", "create", "*")]).version
    v2 = b.compare_and_set(record("loc", State.PAUSING, 1), v1, [entry("loc", "op-p")]).version
    v3 = b.compare_and_set(
        record("loc", State.PAUSED, 1), v2,
        [entry("loc", "op-s", "settle"), entry("loc", "op-s", "settle", "lifecycle")],
    ).version
    hist = b.history("loc", limit=100)
    assert [(e.op_id, e.version) for e in hist] == [
        ("op-s", v3), ("op-s", v3), ("op-p", v2), ("op-c", v1),
    ]
    # newest first, and within one write the later entry first
    assert [e.service for e in hist[:2]] == ["lifecycle", "replication"]


def test_history_pages_never_split_a_write(b: Backend) -> None:
    v = b.create(record("loc"), []).version
    versions = []
    for i in range(12):
        v = b.compare_and_set(
            record("loc", State.PAUSING, i), v,
            [entry("loc", f"op-{i}"), entry("loc", f"op-{i}", service="lifecycle")],
        ).version
        versions.append(v)
    page1 = b.history("loc", limit=5)
    assert len(page1) >= 5 and len(page1) % 2 == 0
    assert page1[0].version == versions[-1]
    page2 = b.history("loc", limit=5, before_version=page1[-1].version)
    assert page2[0].version == page1[-1].version - 1
    seen: list[int] = []
    cursor: int | None = None
    while True:
        page = b.history("loc", limit=3, before_version=cursor)
        if not page:
            break
        seen.extend(e.version for e in page)
        cursor = page[-1].version
    writes = [x for x in dict.fromkeys(seen)]
    assert writes[:12] == list(reversed(versions))
    assert all(seen.count(ver) == 2 for ver in versions)


def test_every_write_is_found_by_its_version_however_many_writes_followed(kit: Kit) -> None:
    """Invariant 9: the write that produced a version is read by that version alone (what
    resolves an ambiguous commit), long after it left any recent window (MongoDB embeds 100)."""
    b = kit.open()
    first = v = b.create(record("loc"), [entry("loc", "op-c", "create", "*")]).version
    for i in range(130):
        v = b.compare_and_set(
            record("loc", State.PAUSING, i), v,
            [entry("loc", f"op-{i}"), entry("loc", f"op-{i}", service="lifecycle")],
        ).version
    full = b.history("loc", limit=10_000)
    assert len(full) == 261
    for version in range(first, v + 1):
        assert b.history_write("loc", version) == [e for e in full if e.version == version]
    assert [(e.op_id, e.service) for e in b.history_write("loc", first + 1)] == [
        ("op-0", "lifecycle"), ("op-0", "replication"),
    ]
    assert b.history_write("loc", v + 1) == []  # not written (yet)
    assert b.history_write("never-created", first) == []
    empty = b.compare_and_set(record("loc"), v, []).version
    assert b.history_write("loc", empty) == []  # a write without history
    kit.write_raw_history("loc", first + 1, '[{"not": "an entry"}]')
    with pytest.raises(CorruptRecord) as exc:
        b.history_write("loc", first + 1)
    assert exc.value.location == "loc" and f"version {first + 1}" in exc.value.detail
    assert b.history_write("loc", first + 2)[0].op_id == "op-1"  # its neighbours still read
    b.delete("loc", empty)
    b.create(record("loc"), [entry("loc", "op-reborn", "create", "*")])
    for version in (first, first + 2, v):  # earlier life: not this record's writes
        assert b.history_write("loc", version) == []


def test_history_of_unknown_location_is_empty(b: Backend) -> None:
    assert b.history("never-created", limit=10) == []


# -- delete, tombstone purge and recreation -----------------------------------------------------


def test_delete_needs_the_current_version_and_removes_history(b: Backend) -> None:
    v1 = b.create(record("gone"), [entry("gone", "op-c", "create", "*")]).version
    v2 = b.compare_and_set(record("gone", State.PAUSING, 1), v1, [entry("gone", "op-p")]).version
    with pytest.raises(VersionConflict):
        b.delete("gone", v1)
    b.delete("gone", v2)
    with pytest.raises(NotFound):
        b.read("gone")
    assert b.history("gone", limit=10) == []
    with pytest.raises(NotFound):
        b.delete("gone", v2)


def test_a_recreated_record_never_matches_a_version_of_its_earlier_life(b: Backend) -> None:
    v = b.create(record("phoenix"), []).version
    old_versions = [v]
    for i in range(3):
        v = b.compare_and_set(record("phoenix", State.PAUSING, i + 1), v, []).version
        old_versions.append(v)
    b.delete("phoenix", v)
    reborn = b.create(record("phoenix"), [])
    assert reborn.version > max(old_versions)
    for stale in old_versions:
        with pytest.raises(VersionConflict):
            b.compare_and_set(record("phoenix", State.PAUSED, 9), stale, [])
    assert b.read("phoenix") == reborn


def test_an_ack_conditional_on_an_earlier_life_is_refused(b: Backend) -> None:
    """A worker whose handler ran for a record that was then purged acknowledges "still at
    the version I applied". A record created again under the same name, written as many times
    (so its ZooKeeper znode is at the same version as the purged one was), is another record:
    the acknowledgement is refused with nothing written (it settled the new pause before that
    worker had run ``on_pause``)."""
    b.put_worker(worker("w-slow", None))
    v = b.create(record("phoenix"), []).version
    v = b.compare_and_set(record("phoenix", State.PAUSING, 1), v, []).version
    applied = v  # the slow handler ran for this version
    b.delete("phoenix", v)
    v = b.create(record("phoenix"), []).version
    reborn = b.compare_and_set(record("phoenix", State.PAUSING, 1), v, [])
    assert reborn.version != applied
    with pytest.raises(VersionConflict):
        b.ack("w-slow", "phoenix", "replication", 1, if_version=applied)
    assert b.acks("phoenix") == {}
    b.ack("w-slow", "phoenix", "replication", 1, if_version=reborn.version)
    assert b.acks("phoenix") == {"w-slow": {"replication": 1}}


# -- corruption --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [
        "{not json",
        '{"deleted_at": null}',
        '{"services": {"replication": {"state": "exploded"}}, "deleted_at": null}',
        '["a", "list"]',
        '{"services": {"replication": {"generation": -4}}, "deleted_at": null}',
        shapes.GOOD[:1] + '"location": "good-1", ' + shapes.GOOD[1:],
        # the same with the key spelled in JSON escapes (found by the reliability review: it
        # passed the decoder's text check and the payload's value won over the real key)
        shapes.GOOD[:1] + '"\\u006cocation": "good-1", ' + shapes.GOOD[1:],
        shapes.compact(shapes.GOOD[:1] + '"location": "good-1", ' + shapes.GOOD[1:]),
    ],
    ids=[
        "invalid-json", "missing-field", "bad-state", "not-an-object", "negative-generation",
        "another-locations-document", "escaped-location-key", "compact-location-key",
    ],
)
def test_a_corrupt_record_is_named_and_does_not_hide_the_others(kit: Kit, payload: str) -> None:
    b = kit.open()
    b.create(record("good-1"), [])
    b.create(record("good-2"), [])
    kit.write_raw("bad-loc", payload)
    with pytest.raises(CorruptRecord, match="bad-loc"):
        b.read("bad-loc")
    everything = b.read_all()
    good = [r.location for r in everything if isinstance(r, LocationStatus)]
    bad = [r.location for r in everything if isinstance(r, CorruptRecord)]
    assert good == ["good-1", "good-2"] and bad == ["bad-loc"]
    assert b.read("good-1").location == "good-1"


def test_a_payload_never_sets_the_records_version(kit: Kit) -> None:
    """The version is the backend's (column, znode stat, document field), never a key inside
    the stored payload, even one spelled in JSON escapes: such a record is corrupt, or read at
    the backend's version (MongoDB, where ``version`` is the document's own field)."""
    b = kit.open()
    kit.write_raw("v-loc", shapes.GOOD[:-1] + ', "\\u0076ersion": 999}')
    try:
        rec = b.read("v-loc")
    except CorruptRecord as exc:
        assert exc.location == "v-loc"
    else:
        assert rec.version != 999 and rec.location == "v-loc"


def test_a_stored_crr_key_reads_as_replication(kit: Kit) -> None:
    """docs/design.md §2: ``crr`` is accepted everywhere as ``replication``, also in a record edited by
    hand, whatever else its text contains."""
    b = kit.open()
    for loc, reason in (("crr-a", "maintenance"), ("crr-b", "location")):
        kit.write_raw(loc, shapes.record(f'{{"crr": {shapes.entry(reason=reason)}}}'))
        rec = b.read(loc)
        assert list(rec.services) == ["replication"], loc
        assert rec.services["replication"].state is State.PAUSED
        assert rec.services["replication"].reason == reason


def _damage(kit: Kit, location: str, text: str) -> Backend:
    """A client on a store holding ``good-1`` and ``location`` (paused through the backend),
    after ``text`` was written over ``location`` with the backend's own client. The client
    subscribed before the write, and the write's hint (or a resync) has arrived."""
    b = kit.open()
    b.create(record("good-1"), [])
    v = b.create(record(location), []).version
    b.compare_and_set(record(location, State.PAUSED, 1), v, [entry(location, "op")])
    got, _, unsubscribe = _collect(b)
    time.sleep(0.3)  # let the subscription settle (watches armed, poller started)
    kit.write_raw(location, text)
    assert _wait_for(got, lambda h: h.location == location or h.kind == "resync")
    unsubscribe()  # type: ignore[operator]
    # A hint may carry the record it read (ZooKeeper): never one that does not validate.
    assert [h.record for h in got if h.location == location and h.record is not None] == []
    return b


def _assert_corrupt_everywhere(b: Backend, location: str) -> None:
    """``location`` reads as a :class:`CorruptRecord` naming it on every read path of the
    backend (``read``, ``read_all``, ``scan_with_history``), and ``good-1`` still reads."""
    with pytest.raises(CorruptRecord) as one:
        b.read(location)
    assert one.value.location == location
    everything = b.read_all()
    assert [r.location for r in everything if isinstance(r, CorruptRecord)] == [location]
    assert [r.location for r in everything if isinstance(r, LocationStatus)] == ["good-1"]
    scan = list(b.scan_with_history())
    assert [r.location for r, _ in scan if isinstance(r, CorruptRecord)] == [location]
    assert [r.location for r, _ in scan if isinstance(r, LocationStatus)] == ["good-1"]


@pytest.mark.parametrize("shape", sorted(shapes.PARTIAL) + sorted(shapes.NESTED))
def test_a_stored_record_missing_a_field_is_corrupt_never_completed(kit: Kit, shape: str) -> None:
    """Only what was written is read (Backbeat's BB-37): a payload written over a paused record
    with the backend's own client that leaves out a field (a service's ``state``, its
    ``resume_at``, the record's ``deleted_at``) or says one twice (``crr`` beside
    ``replication``) is a corrupt record on every read path, never read with defaults (a
    service without ``state`` was read as ``running``)."""
    b = _damage(kit, "half-written", shapes.PARTIAL.get(shape) or shapes.NESTED[shape])
    _assert_corrupt_everywhere(b, "half-written")
    kit.write_raw("half-written", shapes.GOOD)  # restored by hand, it reads again
    assert b.read("half-written").services["replication"].state is State.PAUSED


@pytest.mark.parametrize("shape", sorted(shapes.LOOSE))
def test_a_stored_value_locstatus_never_writes_is_corrupt_never_coerced(
    kit: Kit, shape: str
) -> None:
    """Only what was written is read (the hostile review of issue 15): ``true``, ``"1"`` or
    ``1.0`` as generation 1, a number as a date (``deleted_at: 0`` read as a 1970 tombstone,
    which the check may purge), a scheduled resume on a running service: each is a corrupt
    record on every read path, on every backend (MongoDB's documents included)."""
    b = _damage(kit, "loose", shapes.LOOSE[shape])
    _assert_corrupt_everywhere(b, "loose")
    kit.write_raw("loose", shapes.GOOD)
    assert b.read("loose").services["replication"].state is State.PAUSED


@pytest.mark.parametrize("kit", ["memory", "sqlite", "zk"], indirect=True)
@pytest.mark.parametrize("shape", sorted(shapes.OUT_OF_RANGE))
def test_a_stored_generation_past_64_bits_is_corrupt(kit: Kit, shape: str) -> None:
    """No backend stores a generation past a signed 64-bit integer: read as one, it was
    acknowledged by the agent with a raw OverflowError (SQLite), retried for ever."""
    b = _damage(kit, "huge", shapes.OUT_OF_RANGE[shape])
    _assert_corrupt_everywhere(b, "huge")


def test_every_record_written_reads_back_the_same(kit: Kit) -> None:
    """The other side of the strict decode: what the code writes (times with and without
    microseconds, an offset converted to UTC, the largest generation, a tombstone, every
    service and state) reads back equal, on every backend."""
    b = kit.open()
    at = datetime(2030, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)
    services = {
        "replication": ServiceStatus(
            state=State.PAUSED, generation=MAX_STORED_INT, resume_at=at, reason="r", actor="a",
            op_id="op", updated_at=datetime(2030, 1, 1, tzinfo=UTC),
        ),
        "lifecycle": ServiceStatus(state=State.RESUMING, generation=2, updated_at=at),
        "ingestion": ServiceStatus(state=State.PAUSING, generation=1),
    }
    made = b.create(LocationStatus(location="round", services=services), [])
    assert b.read("round") == made
    gone = made.model_copy(update={"deleted_at": at})
    stored = b.compare_and_set(gone, made.version, [])
    assert b.read("round") == stored and stored.deleted_at == at


@pytest.mark.parametrize("kit", ["memory", "sqlite", "zk"], indirect=True)
@pytest.mark.parametrize("shape", sorted(shapes.DUPLICATE_KEYS) + sorted(shapes.DEEP))
def test_a_stored_text_with_a_key_twice_or_nested_too_deep_is_corrupt(
    kit: Kit, shape: str
) -> None:
    """Backends that store JSON text can hold what a mapping cannot: a key twice in one object
    (JSON parsers keep one of them; compact, spaced, escaped) and nesting deeper than a parser
    recurses (ZooKeeper raised ``RecursionError`` from every ``read_all``). Each is a corrupt
    record on every read path, and the others still read."""
    b = _damage(kit, "bad-text", shapes.DUPLICATE_KEYS.get(shape) or shapes.DEEP[shape])
    _assert_corrupt_everywhere(b, "bad-text")


# -- the stored format (docs/versioning.md, "Stored format") -------------------------------------


def test_every_record_is_stored_with_its_format(kit: Kit) -> None:
    b = kit.open()
    v = b.create(record("fmt-1"), []).version
    assert kit.read_raw("fmt-1")["format"] == codec.FORMAT
    b.compare_and_set(record("fmt-1", State.PAUSED, 1), v, [entry("fmt-1", "op")])
    assert kit.read_raw("fmt-1")["format"] == codec.FORMAT


def test_a_record_from_before_formats_reads_and_is_migrated_on_its_next_write(kit: Kit) -> None:
    """A record with no ``format`` (every record 0.1.0 wrote) is format 1: it reads as it was
    written, and the next write stores it with this version's format."""
    b = kit.open()
    b.create(record("old"), [])
    kit.write_raw("old", shapes.GOOD)  # as 0.1.0 wrote it
    assert "format" not in kit.read_raw("old")
    rec = b.read("old")
    assert rec.services["replication"].state is State.PAUSED
    assert rec.services["replication"].resume_at == datetime(2030, 1, 1, tzinfo=UTC)
    b.compare_and_set(record("old", State.RESUMING, 2), rec.version, [entry("old", "op")])
    assert kit.read_raw("old")["format"] == codec.FORMAT
    assert b.read("old").services["replication"].state is State.RESUMING


def test_a_record_in_a_newer_format_is_refused_never_misread(kit: Kit) -> None:
    """A record a newer locstatus wrote (``format`` above :data:`codec.FORMAT`) is a
    :class:`NewerFormat` (a :class:`CorruptRecord`) on every read path, naming the formats; the
    manager refuses to change it and leaves it as it is; the others still read."""
    from locstatus import Manager

    newer = '{"format": ' + str(codec.FORMAT + 1) + ", " + shapes.GOOD[1:]
    b = _damage(kit, "from-the-future", newer)
    _assert_corrupt_everywhere(b, "from-the-future")
    with pytest.raises(NewerFormat) as refused:
        b.read("from-the-future")
    assert refused.value.format == codec.FORMAT + 1 and refused.value.newest == codec.FORMAT
    assert f"stored format {codec.FORMAT + 1} was written by a newer locstatus" in str(
        refused.value
    )
    with pytest.raises(NewerFormat):
        Manager(b).pause("from-the-future")
    assert kit.read_raw("from-the-future")["format"] == codec.FORMAT + 1  # never rewritten


@pytest.mark.parametrize("value", ['"1"', "0", "-1", "true", "1.5", "null"])
def test_a_format_that_is_no_whole_number_is_a_corrupt_record(kit: Kit, value: str) -> None:
    b = _damage(kit, "bad-format", '{"format": ' + value + ", " + shapes.GOOD[1:])
    _assert_corrupt_everywhere(b, "bad-format")
    with pytest.raises(CorruptRecord, match="format: expected a whole number") as caught:
        b.read("bad-format")
    assert not isinstance(caught.value, NewerFormat)


def test_a_complete_record_written_by_hand_reads_compact_or_spaced(kit: Kit) -> None:
    """The other side of the rules above: a complete payload reads however it is spaced."""
    b = kit.open()
    for loc, text in (("spaced", shapes.GOOD), ("compact", shapes.compact(shapes.GOOD))):
        kit.write_raw(loc, text)
        assert b.read(loc).services["replication"].resume_at == datetime(2030, 1, 1, tzinfo=UTC)


def test_a_scan_pairs_each_record_with_its_newest_history_writes(kit: Kit) -> None:
    """``scan_with_history`` (the check job's single pass) sees what ``read_all`` and
    ``history()`` see: every record in location order, corrupt ones as their error, each with
    the entries of its newest writes, newest first (or None where the backend leaves paging to
    the caller): at least the newest write, then older ones while a service of the record has
    no entry yet, never part of a write."""
    b = kit.open()
    created = b.create(record("loc-b"), [entry("loc-b", "op-create", "create", "*")])
    b.compare_and_set(record("loc-b", State.PAUSING, 1), created.version,
                      [entry("loc-b", "op-pause"), entry("loc-b", "op-pause", "settle")])
    b.create(record("loc-a"), [entry("loc-a", "op-a", "create", "*")])
    b.create(record("loc-c"), [])  # no history at all
    v = b.create(record("loc-d"), [entry("loc-d", "op-create", "create", "*")]).version
    for i, svc in enumerate(["replication", "lifecycle", "replication"]):  # both covered
        v = b.compare_and_set(record("loc-d"), v, [entry("loc-d", f"op-{i}", service=svc)]).version
    kit.write_raw("loc-0-bad", "{not json")
    scan = b.scan_with_history()
    assert len(scan) == 5
    items = list(scan)
    assert [r.location for r, _ in items] == ["loc-0-bad", "loc-a", "loc-b", "loc-c", "loc-d"]
    assert isinstance(items[0][0], CorruptRecord)
    assert [r for r, _ in items[1:]] == [r for r in b.read_all()[1:]]
    for rec, newest in items[1:]:
        if newest is not None:  # a prefix of the history, whole writes only
            assert newest == b.history(rec.location, limit=max(1, len(newest)))
    heads = {r.location: h for r, h in items}
    if heads["loc-b"] is not None:
        assert [(e.op_id, e.event) for e in heads["loc-b"]] == [
            ("op-pause", "settle"), ("op-pause", "pause"), ("op-create", "create")]
        assert heads["loc-c"] in ([], None)  # no history entry: the caller pages (and finds none)
        assert [e.op_id for e in heads["loc-d"]] == ["op-2", "op-1"]  # lifecycle met at op-1


def test_a_history_entry_naming_another_version_is_a_corrupt_write(kit: Kit) -> None:
    """History entries carry the version their write produced; the backend's key for the
    write is the truth. An entry edited to name another version (which would send anyone paging
    by it past other writes) makes that write corrupt, named, and the others still read."""
    b = kit.open()
    v1 = b.create(record("h-loc"), [entry("h-loc", "op-create", "create", "*")]).version
    v2 = b.compare_and_set(record("h-loc", State.PAUSING, 1), v1, [entry("h-loc", "op-p")]).version
    b.compare_and_set(record("h-loc", State.PAUSED, 1), v2, [entry("h-loc", "op-s", "settle")])
    [stored] = [e for e in b.history("h-loc", limit=100) if e.op_id == "op-p"]
    kit.write_raw_history("h-loc", v2, "[" + stored.model_copy(update={"version": v1})
                          .model_dump_json() + "]")
    assert [e.op_id for e in b.history("h-loc", limit=1)] == ["op-s"]  # the newer write is fine
    with pytest.raises(CorruptRecord) as exc:
        b.history("h-loc", limit=100)
    assert exc.value.location == "h-loc"
    assert exc.value.detail == f"history write at version {v2}: holds an entry of version {v1}"


# -- workers, leases, acknowledgements ----------------------------------------------------------


def test_a_conditional_ack_is_written_only_at_the_given_version(b: Backend) -> None:
    """An agent acknowledges "still current after my handler ran" in one write: refused with
    nothing written when the record moved on (or is gone)."""
    v = b.create(record("c-loc"), []).version
    b.put_worker(worker("w-1", None))
    b.ack("w-1", "c-loc", "replication", 0, if_version=v)
    assert b.acks("c-loc") == {"w-1": {"replication": 0}}
    v2 = b.compare_and_set(record("c-loc", State.PAUSING, 1), v, []).version
    with pytest.raises(VersionConflict):
        b.ack("w-1", "c-loc", "replication", 1, if_version=v)
    assert b.acks("c-loc") == {"w-1": {"replication": 0}}
    b.ack("w-1", "c-loc", "replication", 1, if_version=v2)
    assert b.acks("c-loc") == {"w-1": {"replication": 1}}
    with pytest.raises(VersionConflict):
        b.ack("w-1", "no-such-loc", "replication", 1, if_version=v2)


def test_an_ack_ahead_of_the_record_is_refused_with_nothing_written(b: Backend) -> None:
    """Invariant 13, whoever calls ``ack()`` (an agent, the sidecar, a script): a generation
    above the service's, or with ``if_version`` another than the one at that version, a
    service or a record that does not exist, a removal not made: refused, nothing written. An
    acknowledgement ahead of the record counts for a pause not made yet, which then settles
    without the worker (docs/agent.md "Acknowledge only what was applied")."""
    b.put_worker(worker("w-1", None))
    v = b.create(record("g-loc", State.PAUSING, 2), []).version
    b.ack("w-1", "g-loc", "replication", 1)  # behind the record: harmless, written
    b.ack("w-1", "g-loc", "lifecycle", 0)
    acked = {"w-1": {"replication": 1, "lifecycle": 0}}
    assert b.acks("g-loc") == acked
    for service, gen, if_version in (
        ("replication", 3, None), ("replication", MAX_STORED_INT, None), ("lifecycle", 1, None),
        ("replication", 3, v), ("replication", 1, v),  # with if_version: exactly the one at v
        ("ingestion", 0, None), ("ingestion", 0, v),  # a service the record does not have
        (TOMBSTONE_ACK, 0, None), (TOMBSTONE_ACK, 0, v),  # a removal not made
    ):
        with pytest.raises(VersionConflict, match="not acknowledged"):
            b.ack("w-1", "g-loc", service, gen, if_version=if_version)
        assert b.acks("g-loc") == acked, (service, gen, if_version)
    with pytest.raises(VersionConflict, match="does not exist"):
        b.ack("w-1", "no-such-loc", "replication", 0)
    assert b.acks("no-such-loc") == {}
    b.ack("w-1", "g-loc", "replication", 2, if_version=v)
    assert b.acks("g-loc") == {"w-1": {"replication": 2, "lifecycle": 0}}

    at = T0 + timedelta(hours=1)
    gone = b.compare_and_set(record("g-loc", State.PAUSED, 2).model_copy(
        update={"deleted_at": at}), v, [])
    removal = tombstone_generation(at)
    for gen, if_version in ((removal + 1, None), (removal + 1, gone.version),
                            (removal - 1, gone.version), (3, None)):
        service = "replication" if gen == 3 else TOMBSTONE_ACK
        with pytest.raises(VersionConflict, match="not acknowledged"):
            b.ack("w-1", "g-loc", service, gen, if_version=if_version)
    b.ack("w-1", "g-loc", TOMBSTONE_ACK, removal, if_version=gone.version)
    assert b.acks("g-loc") == {
        "w-1": {"replication": 2, "lifecycle": 0, TOMBSTONE_ACK: removal}
    }


def test_an_ack_is_judged_against_the_record_at_its_write_not_as_read_before(
    b: Backend, kit: Kit
) -> None:
    """Invariant 13 under races: a caller read generation 3, and the location was purged and
    created again (generation 0) before its acknowledgement of 3 (no ``if_version``) was
    written: judged on the record it read, that acknowledgement would be ahead of the new one
    and count for its first three pauses. Then the same with the purge and the re-creation
    made by another client at the same moment as the acknowledgement: whichever lands first,
    the new life never holds an acknowledgement ahead of it (an acknowledgement of the old
    life is dropped by the purge or refused). (A stress test: SQLite judging on a read made
    just before its write transaction lost a round in 2 runs of 3 of 30 rounds here.)"""
    b.put_worker(worker("w-1", None))
    v = b.create(record("race", State.PAUSED, 3), []).version
    seen = b.read("race").services["replication"].generation
    b.delete("race", v)
    again = b.create(record("race"), [])
    with pytest.raises(VersionConflict, match="not acknowledged"):
        b.ack("w-1", "race", "replication", seen)
    assert b.acks("race") == {}

    other = kit.open()
    current = again.version
    for i in range(50):
        current = b.compare_and_set(record("race", State.PAUSED, 3), current, []).version
        start = threading.Barrier(2)

        def purge_and_create(v: int = current, start: threading.Barrier = start) -> None:
            start.wait()
            other.delete("race", v)
            other.create(record("race"), [])

        t = threading.Thread(target=purge_and_create)
        t.start()
        start.wait()
        with contextlib.suppress(VersionConflict):
            b.ack("w-1", "race", "replication", 3)
        t.join()
        now = b.read("race")
        assert now.services["replication"].generation == 0
        assert b.acks("race") == {}, f"round {i}: ahead of the record"
        current = now.version


def test_workers_register_renew_and_unregister(b: Backend) -> None:
    lease = datetime.now(UTC) + timedelta(seconds=30)
    b.put_worker(worker("w-2", lease))
    b.put_worker(worker("w-1", lease))
    assert [w.worker_id for w in b.workers()] == ["w-1", "w-2"]
    renewed = worker("w-1", lease + timedelta(seconds=30), ("replication", "lifecycle"))
    b.put_worker(renewed)
    w1 = next(w for w in b.workers() if w.worker_id == "w-1")
    assert w1.services == ("replication", "lifecycle")
    assert w1.alive(datetime.now(UTC))
    b.remove_worker("w-2")
    b.remove_worker("never-registered")
    assert [w.worker_id for w in b.workers()] == ["w-1"]


def test_has_worker_answers_whether_a_registration_is_listed(b: Backend) -> None:
    """``Backend.has_worker``: what a running standing agent asks at each renewal to notice a
    retirement behind its back (docs/agent.md "Standing registrations"), ordinary or standing,
    whatever the lease."""
    lease = datetime.now(UTC) + timedelta(seconds=30)
    assert not b.has_worker("w-1")
    b.put_worker(worker("w-1", lease))
    b.put_worker(worker("w-2", lease).model_copy(update={"standing": True}))
    assert b.has_worker("w-1") and b.has_worker("w-2") and not b.has_worker("w-3")
    assert b.remove_worker("w-2", retire=True)
    assert not b.has_worker("w-2") and b.has_worker("w-1")


def test_an_expired_lease_does_not_count_as_alive(b: Backend) -> None:
    past = datetime.now(UTC) - timedelta(seconds=5)
    b.put_worker(worker("w-old", past))
    now = datetime.now(UTC)
    listed = [w for w in b.workers() if w.worker_id == "w-old"]
    assert all(not w.alive(now) for w in listed) or listed == [] or listed[0].lease_expires_at is None


def test_acks_are_per_worker_location_and_service(b: Backend) -> None:
    lease = datetime.now(UTC) + timedelta(seconds=30)
    b.create(record("loc-a", State.PAUSED, 4), [])
    b.create(record("loc-b", State.PAUSED, 7), [])
    b.put_worker(worker("w-1", lease))
    b.put_worker(worker("w-2", lease))
    b.ack("w-1", "loc-a", "replication", 3)
    b.ack("w-1", "loc-a", "replication", 4)
    b.ack("w-2", "loc-a", "lifecycle", 0)
    b.ack("w-1", "loc-b", "replication", 7)
    assert b.acks("loc-a") == {"w-1": {"replication": 4}, "w-2": {"lifecycle": 0}}
    assert b.acks("loc-b") == {"w-1": {"replication": 7}}
    assert b.acks("loc-c") == {}
    all_acks = b.all_acks()
    assert all_acks["loc-a"]["w-1"] == {"replication": 4}
    assert all_acks["loc-b"] == {"w-1": {"replication": 7}}


def test_unregistering_a_worker_drops_its_acks(b: Backend) -> None:
    lease = datetime.now(UTC) + timedelta(seconds=30)
    b.create(record("loc-a", State.PAUSED, 2), [])
    b.put_worker(worker("w-1", lease))
    b.put_worker(worker("w-2", lease))
    b.ack("w-1", "loc-a", "replication", 2)
    b.ack("w-2", "loc-a", "replication", 2)
    b.remove_worker("w-1")
    assert b.acks("loc-a") == {"w-2": {"replication": 2}}


def test_removing_an_expired_worker_is_conditional_on_the_lease_seen_expired(
    b: Backend, kit: Kit
) -> None:
    """Invariant 6, ``remove_worker(if_expires=)``: the check job drops an expired worker only
    while its registration still carries the deadline it saw pass; one that renewed, or a
    restarted worker registering again (another client: another session on ZooKeeper), is
    kept with its acknowledgements (model/README.md, finding remove_race)."""
    expired = datetime.now(UTC) - timedelta(seconds=5)
    b.create(record("loc-a", State.PAUSED, 2), [])
    b.put_worker(worker("w-renew", expired))
    b.put_worker(worker("w-restart", expired))
    b.put_worker(worker("w-dead", expired))
    for w in ("w-renew", "w-restart", "w-dead"):
        b.ack(w, "loc-a", "replication", 1)
    seen = {w.worker_id: w.lease_expires_at for w in b.workers()}
    assert seen == dict.fromkeys(("w-dead", "w-renew", "w-restart"), expired)

    renewed = datetime.now(UTC) + timedelta(seconds=30)
    b.put_worker(worker("w-renew", renewed))
    restarted = kit.open()
    restarted.put_worker(worker("w-restart", renewed, ("replication", "lifecycle")))
    restarted.ack("w-restart", "loc-a", "replication", 2)
    assert b.remove_worker("w-renew", if_expires=expired) is False
    assert b.remove_worker("w-restart", if_expires=expired) is False
    assert b.remove_worker("w-dead", if_expires=renewed) is False  # not the deadline it has
    assert b.remove_worker("w-dead", if_expires=expired) is True
    assert b.remove_worker("w-dead", if_expires=expired) is False  # gone already
    assert b.remove_worker("never-registered", if_expires=expired) is False
    assert {w.worker_id: w.lease_expires_at for w in b.workers()} == {
        "w-renew": renewed, "w-restart": renewed,
    }
    assert b.acks("loc-a") == {"w-renew": {"replication": 1}, "w-restart": {"replication": 2}}
    assert b.remove_worker("w-renew", if_expires=renewed) is True
    assert b.remove_worker("w-restart") is True  # unconditional: the worker itself
    assert b.remove_worker("w-restart") is False
    assert b.workers() == [] and b.acks("loc-a") == {}


def test_a_conditional_removal_never_drops_a_worker_renewing_at_the_same_time(
    b: Backend, kit: Kit
) -> None:
    """Invariant 6 under a race: a renewal and a removal conditional on the old deadline, at
    once. Either the removal came first (the renewal then registers the worker again) or it
    finds the new deadline and keeps the worker: never both done and the worker gone. (A
    stress test: a removal that reads and then deletes unconditionally loses about one round
    in 25 here; the deterministic contract is the test above.)"""
    renewer = kit.open()
    for i in range(50):
        wid = f"w-race-{i}"
        old = datetime.now(UTC) - timedelta(seconds=5)
        b.put_worker(worker(wid, old))
        start = threading.Barrier(2)
        removed: list[bool] = []

        def renew(wid: str = wid, start: threading.Barrier = start) -> None:
            start.wait()
            renewer.put_worker(worker(wid, datetime.now(UTC) + timedelta(seconds=30)))

        t = threading.Thread(target=renew)
        t.start()
        start.wait()
        removed.append(b.remove_worker(wid, if_expires=old))
        t.join()
        listed = [w for w in b.workers() if w.worker_id == wid]
        assert listed, f"round {i}: removed ({removed}) though renewed at the same time"
        assert listed[0].lease_expires_at != old


def standing(worker_id: str, lease: datetime | None, host: str = "h") -> WorkerInfo:
    return WorkerInfo(worker_id=worker_id, services=("replication",), lease_expires_at=lease,
                      host=host, pid=1, standing=True)


def test_a_registration_keeps_its_writers_instance_and_one_without_reads_as_unknown(
    kit: Kit,
) -> None:
    """``WorkerInfo.instance`` (docs/backbeat.md, "2. The bridge", One bridge publishes): a
    standing registration's writer instance id reads back as written, from another process's
    connection; one stored without it (an older version's, an ordinary registration) reads as
    unknown (None), and its stored text has no such field, as before the field existed."""
    writer = kit.open()
    lease = datetime.now(UTC) + timedelta(seconds=600)
    writer.put_worker(standing("w-new", lease).model_copy(update={"instance": "a" * 32}))
    writer.put_worker(standing("w-old", lease))
    writer.put_worker(worker("w-plain", lease))
    reader = kit.open()
    listed = {w.worker_id: w for w in reader.workers()}
    assert {k: (w.instance, w.corrupt) for k, w in listed.items()} == {
        "w-new": ("a" * 32, None), "w-old": (None, None), "w-plain": (None, None)}
    assert "instance" not in codec.encode_worker(listed["w-old"])
    reader.close()
    writer.close()


def test_a_standing_registration_outlives_its_holder_until_it_is_retired(kit: Kit) -> None:
    """Invariant 6, standing registrations (docs/agent.md "Standing registrations"): one whose
    holder goes away without unregistering (its backend closed: on ZooKeeper its session ends)
    stays listed, standing, with the lease it had (away on ZooKeeper); the check's conditional
    removal never drops it, nor an ordinary one; a new holder takes it over; only a retirement
    ends it. An ordinary registration beside it keeps today's behaviour."""
    holder = kit.open()
    holder.create(record("loc", State.PAUSED, 4), [])
    past = datetime.now(UTC) - timedelta(seconds=5)
    holder.put_worker(standing("w-standing", past))
    holder.put_worker(worker("w-plain", past))
    holder.ack("w-standing", "loc", "replication", 3)
    holder.ack("w-plain", "loc", "replication", 3)
    session = holder.session_leases
    holder.close()  # gone without unregistering

    reader = kit.open()
    listed = {w.worker_id: w for w in reader.workers()}
    kept = listed["w-standing"]
    assert kept.standing and kept.lease_expires_at == past and kept.services == ("replication",)
    assert kept.away is session  # ZooKeeper: no session holds it any more
    if session:
        assert "w-plain" not in listed  # its ephemeral node went with the session
        assert reader.acks("loc") == {}  # acknowledgements stay the session's
    else:
        assert listed["w-plain"].lease_expires_at == past and not listed["w-plain"].standing
        assert reader.acks("loc") == {"w-standing": {"replication": 3},
                                      "w-plain": {"replication": 3}}
        assert reader.remove_worker("w-plain", if_expires=past) is True  # as before
    assert reader.remove_worker("w-standing", if_expires=past) is False  # the check's removal
    assert [w.worker_id for w in reader.workers()] == ["w-standing"]

    taker = kit.open()
    later = datetime.now(UTC) + timedelta(seconds=60)
    taker.put_worker(standing("w-standing", None if session else later, host="h2"))
    taker.ack("w-standing", "loc", "replication", 4)
    back = reader.workers()
    deadline = time.monotonic() + 10  # ZooKeeper: reader's watch-fed copy catches up
    while back and back[0].host != "h2" and time.monotonic() < deadline:
        time.sleep(0.05)
        back = reader.workers()
    assert [(w.worker_id, w.standing, w.away, w.host) for w in back] == [
        ("w-standing", True, False, "h2")]
    assert back[0].lease_expires_at == (None if session else later)
    assert reader.acks("loc") == {"w-standing": {"replication": 4}}

    assert reader.remove_worker("w-standing") is False  # an ordinary removal keeps it
    assert reader.acks("loc") == {"w-standing": {"replication": 4}}
    if session:  # ZooKeeper: not while another session holds it (its holder is present)
        assert reader.remove_worker("w-standing", retire=True) is False
        assert [w.worker_id for w in reader.workers()] == ["w-standing"]
        assert reader.acks("loc") == {"w-standing": {"replication": 4}}
        taker.close()
    assert reader.remove_worker("w-standing", retire=True) is True  # retired
    assert reader.workers() == [] and reader.acks("loc") == {}
    taker.close()
    assert kit.open().workers() == []


def test_only_a_retirement_ends_a_standing_registration(kit: Kit) -> None:
    """Invariant 6 (docs/agent.md "Standing registrations"): an ordinary registration of a
    standing id is refused (StandingRegistered naming it and ``locstatus workers retire``,
    nothing written), and an ordinary removal keeps it with its acknowledgements, from this
    backend object or another; a standing registration still replaces an ordinary one; a
    retirement ends it. (Once, an ordinary agent of the bridged id started and stopped ended
    the Backbeat processor's registration, and the next pause settled without it.)"""
    b, other = kit.open(), kit.open()
    b.create(record("loc", State.PAUSING, 3), [])
    lease = datetime.now(UTC) + timedelta(seconds=60)
    b.put_worker(worker("w-1", lease))
    b.put_worker(standing("w-1", lease))  # standing over ordinary: replaced
    b.ack("w-1", "loc", "replication", 3)
    for who in (b, other):
        with pytest.raises(StandingRegistered) as refused:
            who.put_worker(worker("w-1", lease))
        assert "w-1" in refused.value.message
        assert "locstatus workers retire w-1" in refused.value.message
        assert who.remove_worker("w-1") is False
    listed = b.workers()
    assert [(w.worker_id, w.standing, w.away) for w in listed] == [("w-1", True, False)]
    assert other.acks("loc") == {"w-1": {"replication": 3}}
    other.put_worker(standing("w-1", lease, host="h2"))  # a new holder still takes it over
    # read where it was written: another backend object's copy is only as fresh as its own
    # answers (ZooKeeper's watch-fed copy of b may not have the write yet)
    assert [(w.worker_id, w.host) for w in other.workers()] == [("w-1", "h2")]
    if b.session_leases:  # ZooKeeper: another session's holder is present, kept
        assert b.remove_worker("w-1", retire=True) is False
        other.close()
    assert b.remove_worker("w-1", retire=True) is True
    assert b.workers() == [] and b.acks("loc") == {}
    b.put_worker(worker("w-1", lease))  # retired: the id is free for an ordinary worker
    assert b.remove_worker("w-1") is True and b.workers() == []


def test_a_conditional_retirement_keeps_a_standing_registration_a_holder_took_over(
    kit: Kit,
) -> None:
    """``remove_worker(if_expires=, retire=True)``, how ``Manager.retire_worker`` removes a
    standing registration on a heartbeat backend: only while it still carries the lease
    deadline judged (its holder away), so a holder that took it over in between (another
    deadline) keeps it, with its acknowledgements; with the deadline it carries it is retired
    with them. ZooKeeper, where the lease is the holder's session, keeps a standing one then
    (the manager retires unconditionally there)."""
    b, other = kit.open(), kit.open()
    b.create(record("loc", State.PAUSING, 3), [])
    past = datetime.now(UTC) - timedelta(seconds=5)
    b.put_worker(standing("w-1", past))
    if b.session_leases:
        assert b.remove_worker("w-1", if_expires=past, retire=True) is False
        assert [w.worker_id for w in b.workers()] == ["w-1"]
        return
    later = datetime.now(UTC) + timedelta(seconds=60)
    other.put_worker(standing("w-1", later, host="h2"))  # a new holder took it over
    other.ack("w-1", "loc", "replication", 3)
    assert b.remove_worker("w-1", if_expires=past, retire=True) is False
    assert [(w.worker_id, w.host) for w in b.workers()] == [("w-1", "h2")]
    assert b.acks("loc") == {"w-1": {"replication": 3}}
    assert b.remove_worker("w-1", if_expires=later, retire=True) is True
    assert b.workers() == [] and b.acks("loc") == {}


def test_an_ordinary_registration_is_stored_without_the_standing_field(kit: Kit) -> None:
    """So a version from before standing registrations still reads an ordinary one (its
    models refuse a field they do not know)."""
    b = kit.open()
    lease = datetime.now(UTC) + timedelta(seconds=60)
    info = worker("w-1", lease)
    assert '"standing"' not in codec.encode_worker(info)
    assert '"standing":true' in codec.encode_worker(standing("w-2", lease))
    b.put_worker(info)
    assert b.workers() == [info]


def test_purging_a_location_drops_its_acks(b: Backend) -> None:
    lease = datetime.now(UTC) + timedelta(seconds=30)
    v = b.create(record("loc-a", State.PAUSED, 2), []).version
    b.put_worker(worker("w-1", lease))
    b.ack("w-1", "loc-a", "replication", 2)
    b.delete("loc-a", v)
    assert b.acks("loc-a") == {}


# -- unreadable registrations and acknowledgements (docs/agent.md "Unreadable ...") -----------


def listed_workers(b: Backend, until: object, timeout: float = 10.0) -> list[WorkerInfo]:
    """``b.workers()`` once ``until(listing)`` holds (ZooKeeper serves the list from a copy
    that its watches drop after another client's write: a moment later, not at once)."""
    deadline = time.monotonic() + timeout
    while True:
        got = b.workers()
        if until(got) or time.monotonic() > deadline:  # type: ignore[operator]
            return got
        time.sleep(0.02)


UNREADABLE_REGISTRATIONS = {
    "not-json": "{not json",
    "a-list": "[1, 2]",
    "no-services": '{"worker_id": "w-bad", "host": "h", "pid": 1}',
    "services-wrong-type": '{"worker_id": "w-bad", "services": 7}',
    "unknown-field": '{"worker_id": "w-bad", "services": ["replication"], "shiny": true}',
    "another-worker": '{"worker_id": "w-other", "services": ["replication"]}',
    "deep": '{"worker_id": "w-bad", "services": ' + "[" * 100_000 + "]" * 100_000 + "}",
}


@pytest.mark.parametrize("text", list(UNREADABLE_REGISTRATIONS.values()),
                         ids=list(UNREADABLE_REGISTRATIONS))
def test_an_unreadable_registration_is_listed_as_a_live_worker_applying_everything(
    kit: Kit, text: str
) -> None:
    """A registration that does not parse may be a live worker's: listed (never left out, never
    an error hiding the others), alive while listed, applying every service at every
    location, so no transition settles without it (ZooKeeper once skipped it)."""
    b = kit.open()
    lease = datetime.now(UTC) + timedelta(seconds=30)
    b.put_worker(worker("w-ok", lease))
    kit.write_raw_worker("w-bad", text)
    listed = listed_workers(b, lambda ws: len(ws) == 2)
    assert [w.worker_id for w in listed] == ["w-bad", "w-ok"]
    bad, ok = listed
    assert bad.corrupt, bad
    assert bad.lease_expires_at is None and bad.alive(datetime.now(UTC))
    assert bad.applies("any-loc", "replication") and bad.applies("other-loc", "lifecycle")
    assert bad.errors == {}
    assert ok == worker("w-ok", lease) and ok.corrupt is None


def test_a_live_workers_registration_damaged_in_place_still_counts(kit: Kit) -> None:
    """The hand edit hits the registration of a worker that is running: it stays listed under
    its id, and the lease that is still readable in it keeps counting (lapsing as any
    other: a dead worker's damaged registration stops blocking when its lease runs out)."""
    b = kit.open()
    lease = datetime.now(UTC) + timedelta(seconds=30)
    b.put_worker(worker("w-1", lease))
    past = datetime.now(UTC) - timedelta(seconds=5)
    b.put_worker(worker("w-2", past))
    for wid, when in (("w-1", lease), ("w-2", past)):
        kit.write_raw_worker(
            wid, f'{{"worker_id": "{wid}", "services": 5, "lease_expires_at": "{when.isoformat()}"}}'
        )
    listed = listed_workers(b, lambda ws: all(w.corrupt for w in ws))
    assert [(w.worker_id, w.lease_expires_at) for w in listed] == [("w-1", lease), ("w-2", past)]
    assert all(w.corrupt and "services" in w.corrupt for w in listed), listed
    now = datetime.now(UTC)
    assert listed[0].alive(now) and not listed[1].alive(now)


def test_a_listed_stand_in_is_never_stored_back_and_a_new_registration_replaces_it(
    kit: Kit,
) -> None:
    """Storing the stand-in would turn a worker that applies everything into one that applies
    nothing: refused, nothing written. The worker's own next registration replaces it."""
    b = kit.open()
    kit.write_raw_worker("w-bad", "{not json")
    (bad,) = listed_workers(b, lambda ws: len(ws) == 1)
    with pytest.raises(InvalidInput, match=r"'w-bad': a registration read as corrupt"):
        b.put_worker(bad)
    assert [w.corrupt is not None for w in b.workers()] == [True]
    lease = datetime.now(UTC) + timedelta(seconds=30)
    b.put_worker(worker("w-bad", lease))
    assert b.workers() == [worker("w-bad", lease)]
    b.remove_worker("w-bad")
    assert b.workers() == []


def test_an_unreadable_acknowledgement_acknowledges_nothing_and_hides_no_other(kit: Kit) -> None:
    """A hand-edited acknowledgement (a generation that is no integer, a field left out) is
    not an acknowledgement: left out of acks() and all_acks(), the others read as stored
    (MongoDB raised a KeyError, SQLite a ValueError, memory returned the bad value)."""
    b = kit.open()
    lease = datetime.now(UTC) + timedelta(seconds=30)
    b.create(record("loc-a", State.PAUSED, 5), [])
    b.create(record("loc-b", State.PAUSED, 4), [])
    b.put_worker(worker("w-1", lease))
    b.put_worker(worker("w-2", lease))
    b.ack("w-1", "loc-a", "replication", 3)
    b.ack("w-2", "loc-a", "replication", 3)
    b.ack("w-1", "loc-b", "replication", 4)
    kit.damage_ack("loc-a", "w-1", "replication")
    assert b.acks("loc-a") == {"w-2": {"replication": 3}}
    assert b.acks("loc-b") == {"w-1": {"replication": 4}}
    every = b.all_acks()
    assert every["loc-a"] == {"w-2": {"replication": 3}}
    assert every["loc-b"] == {"w-1": {"replication": 4}}
    b.ack("w-1", "loc-a", "replication", 5)  # the worker's next acknowledgement is read again
    assert b.acks("loc-a") == {"w-1": {"replication": 5}, "w-2": {"replication": 3}}


# -- registrations are bounded the same way on every backend (docs/agent.md "Registrations") ---


def long_names(n: int, width: int = 110) -> tuple[str, ...]:
    return tuple(f"site-{i:06d}-".ljust(width, "x") for i in range(n))


def test_a_worker_failing_at_thousands_of_locations_still_registers_with_its_errors_trimmed(
    b: Backend,
) -> None:
    """An outage makes a worker's handler fail at 17 000 locations: its heartbeat still
    renews the lease (17 MB of errors once raised pymongo's DocumentTooLarge and killed the
    heartbeat thread); the registration keeps the first errors, each cut, and says how many
    it left out."""
    lease = datetime.now(UTC) + timedelta(seconds=30)
    errors = {f"loc-{i:05d}/replication": f"E{i} " + "x" * 2000 for i in range(17_000)}
    b.put_worker(worker("w-noisy", lease).model_copy(update={"errors": errors}))
    (listed,) = b.workers()
    assert listed.alive(datetime.now(UTC)) and listed.lease_expires_at == lease
    kept = {k: v for k, v in listed.errors.items() if k != codec.ERRORS_CUT_KEY}
    assert list(kept) == sorted(errors)[: codec.MAX_WORKER_ERRORS]
    assert all(v == errors[k][: codec.MAX_ERROR_CHARS] for k, v in kept.items())
    left_out = 17_000 - codec.MAX_WORKER_ERRORS
    assert listed.errors[codec.ERRORS_CUT_KEY].startswith(f"{left_out} more errors not shown")
    b.put_worker(worker("w-noisy", lease).model_copy(update={"errors": {"loc-1/replication": "E"}}))
    assert b.workers()[0].errors == {"loc-1/replication": "E"}  # errors within the bound: as is


def test_handler_errors_give_way_to_a_large_location_filter(b: Backend) -> None:
    """A filter close to the bound is kept whole; the errors are cut further to fit."""
    names = long_names(8_000)  # ~900 KB of JSON
    errors = {f"{n}/replication": "E" * 900 for n in names[:100]}  # 100 errors: ~100 KB more
    info = WorkerInfo(worker_id="w-wide", services=("replication",), locations=names,
                      errors=errors)
    b.put_worker(info)
    (listed,) = b.workers()
    assert listed.locations == names
    assert 0 < len(listed.errors) - 1 < 100
    assert "more errors not shown" in listed.errors[codec.ERRORS_CUT_KEY]
    assert len(codec.encode_worker(listed)) <= codec.MAX_REGISTRATION_BYTES


def test_a_registration_too_large_without_its_errors_is_refused_and_nothing_is_written(
    b: Backend,
) -> None:
    """A location filter of 150 000 names does not fit one registration on any backend: a
    clear InvalidInput naming the filter, and the worker's earlier registration untouched."""
    lease = datetime.now(UTC) + timedelta(seconds=30)
    b.put_worker(worker("w-big", lease))
    huge = WorkerInfo(worker_id="w-big", services=("replication",), locations=long_names(150_000),
                      lease_expires_at=lease + timedelta(seconds=30))
    with pytest.raises(InvalidInput, match=r"worker 'w-big': registration of \d+ bytes \(its "
                       r"location filter holds 150000 names\) exceeds the limit of 1000000"):
        b.put_worker(huge)
    (listed,) = b.workers()
    assert listed.locations is None and listed.lease_expires_at == lease


# -- change hints ------------------------------------------------------------------------------


def _collect(b: Backend) -> tuple[list[Hint], threading.Event, object]:
    got: list[Hint] = []
    flag = threading.Event()

    def cb(h: Hint) -> None:
        got.append(h)
        flag.set()

    return got, flag, b.subscribe(cb)


def _wait_for(got: list[Hint], pred: object, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(pred(h) for h in list(got)):  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


def test_a_write_by_one_client_hints_another(kit: Kit) -> None:
    writer, watcher = kit.open(), kit.open()
    v = writer.create(record("hinted"), []).version
    got, _, unsubscribe = _collect(watcher)
    time.sleep(0.3)  # let the watcher's subscription settle (watches armed, poller started)
    writer.compare_and_set(record("hinted", State.PAUSING, 1), v, [entry("hinted", "op")])
    assert _wait_for(
        got, lambda h: (h.kind == "location" and h.location == "hinted") or h.kind == "resync"
    )
    lease = datetime.now(UTC) + timedelta(seconds=30)
    writer.put_worker(worker("w-hint", lease))
    writer.ack("w-hint", "hinted", "replication", 1)
    assert _wait_for(got, lambda h: h.kind in ("acks", "workers", "resync"))
    unsubscribe()  # type: ignore[operator]


def test_after_unsubscribe_no_more_hints_arrive(kit: Kit) -> None:
    writer, watcher = kit.open(), kit.open()
    v = writer.create(record("quiet"), []).version
    got, _, unsubscribe = _collect(watcher)
    unsubscribe()  # type: ignore[operator]
    writer.compare_and_set(record("quiet", State.PAUSING, 1), v, [])
    time.sleep(0.5)
    assert [h for h in got if h.location == "quiet" and h.kind == "location"] == []


def test_a_subscriber_that_raises_breaks_neither_the_write_nor_the_other_subscribers(
    kit: Kit,
) -> None:
    """Invariant 7: a subscriber is someone else's code. One whose callback raises on every
    hint neither fails the write that caused the hint (it has committed) nor stops the hints
    of the others, for this write and every later one."""
    writer, watcher = kit.open(), kit.open()
    v = writer.create(record("loud"), []).version
    raised: list[Hint] = []

    def broken(h: Hint) -> None:
        raised.append(h)
        raise RuntimeError("a subscriber's own bug")

    unsubscribe_broken = watcher.subscribe(broken)  # called first: before the others
    got, _, unsubscribe = _collect(watcher)
    time.sleep(0.3)  # let the watcher's subscription settle (watches armed, poller started)

    def hinted(version: int) -> bool:
        return _wait_for(
            got,
            lambda h: h.kind == "resync"
            or (h.kind == "location" and h.location == "loud"
                and (h.record is None or h.record.version >= version)),
        )

    first = writer.compare_and_set(record("loud", State.PAUSING, 1), v, [entry("loud", "op-1")])
    assert writer.read("loud") == first
    assert hinted(first.version)
    got.clear()
    second = writer.compare_and_set(
        record("loud", State.PAUSED, 1), first.version, [entry("loud", "op-2")]
    )
    assert writer.read("loud") == second
    assert hinted(second.version)  # the hint path survived the first exception
    assert raised  # the broken subscriber was called, and raised
    unsubscribe_broken()
    unsubscribe()  # type: ignore[operator]


def test_ping_answers_on_a_live_backend(b: Backend) -> None:
    b.ping()


def test_the_store_tells_its_own_time(b: Backend) -> None:
    """Invariant 11: ``probe_time`` is the store's clock (every server of the suite runs on this
    host, unfaked, so it is this host's time), aware UTC, never going back, stamped within the
    call at the store's resolution; a closed backend says it cannot tell."""
    before = datetime.now(UTC)
    first = b.probe_time()
    second = b.probe_time()
    after = datetime.now(UTC)
    slack = timedelta(seconds=b.clock_resolution + 0.005)
    assert first.tzinfo is not None and first.utcoffset() == timedelta(0)
    assert before - slack <= first <= second <= after + slack
    b.close()
    with pytest.raises(BackendUnavailable):
        b.probe_time()


# -- batches (invariant 12) --------------------------------------------------------------------


def test_a_batch_writes_each_location_at_its_own_version_and_a_conflict_fails_only_itself(
    b: Backend,
) -> None:
    names = [f"batch-{i:02d}" for i in range(7)]
    versions = {n: b.create(record(n), []).version for n in names}
    stale = names[3]  # in the middle of the batch: written by someone else first
    b.compare_and_set(record(stale, State.PAUSING, 5), versions[stale], [entry(stale, "op-other")])
    before = (b.read(stale), b.history(stale, limit=100))
    items = [
        CasItem(record(n, State.PAUSING, 1), versions[n], [entry(n, f"op-{n}")]) for n in names
    ]
    results = b.compare_and_set_many(items)
    assert len(results) == len(names)
    for n, result in zip(names, results, strict=True):
        if n == stale:
            assert isinstance(result, VersionConflict)
            continue
        assert isinstance(result, LocationStatus), result
        assert result.version == versions[n] + 1
        assert b.read(n) == result
        assert [e.op_id for e in b.history_write(n, versions[n] + 1)] == [f"op-{n}"]
    assert (b.read(stale), b.history(stale, limit=100)) == before


def test_a_batch_with_several_conflicts_in_it_writes_every_other_location_once(
    b: Backend,
) -> None:
    """More locations than one multi-op holds, conflicts at the start, at group boundaries and
    at the end, and an unknown location among them: each refused alone, every other one
    written once at its own version with its own history (docs/zookeeper.md)."""
    names = [f"many-{i:03d}" for i in range(120)]
    versions = {n: b.create(record(n), []).version for n in names}
    stale = {names[i] for i in (0, 1, 9, 10, 49, 50, 51, 77, 119)}
    for n in stale:
        b.compare_and_set(record(n, State.PAUSING, 5), versions[n], [entry(n, "op-other")])
    before = {n: (b.read(n), b.history(n, limit=100)) for n in stale}
    items = [
        CasItem(record(n, State.PAUSING, 1), versions[n], [entry(n, f"op-{n}")]) for n in names
    ]
    items.insert(60, CasItem(record("many-ghost"), 1, [entry("many-ghost", "op-g")]))
    results = b.compare_and_set_many(items)
    assert len(results) == len(items)
    assert isinstance(results[60], NotFound)
    del results[60]
    for n, result in zip(names, results, strict=True):
        if n in stale:
            assert isinstance(result, VersionConflict), (n, result)
            continue
        assert isinstance(result, LocationStatus), (n, result)
        assert result.version == versions[n] + 1
        assert b.read(n) == result
        assert [e.op_id for e in b.history(n, limit=100)].count(f"op-{n}") == 1
    assert {n: (b.read(n), b.history(n, limit=100)) for n in stale} == before


def test_a_batch_reports_a_missing_location_as_not_found_and_writes_the_rest(b: Backend) -> None:
    v = b.create(record("here"), []).version
    results = b.compare_and_set_many([
        CasItem(record("ghost"), 1, [entry("ghost", "op-g")]),
        CasItem(record("here", State.PAUSING, 1), v, [entry("here", "op-h")]),
    ])
    assert isinstance(results[0], NotFound)
    assert isinstance(results[1], LocationStatus) and results[1].version == v + 1
    with pytest.raises(NotFound):
        b.read("ghost")


def test_a_batch_naming_a_location_twice_is_refused_and_writes_nothing(b: Backend) -> None:
    v = b.create(record("twice"), []).version
    other = b.create(record("other"), []).version
    with pytest.raises(InvalidInput, match="twice"):
        b.compare_and_set_many([
            CasItem(record("other", State.PAUSING, 1), other, [entry("other", "op-o")]),
            CasItem(record("twice", State.PAUSING, 1), v, [entry("twice", "op-1")]),
            CasItem(record("twice", State.PAUSING, 2), v, [entry("twice", "op-2")]),
        ])
    assert b.read("twice").version == v and b.read("other").version == other
    with pytest.raises(InvalidInput, match="twice"):
        b.create_many([(record("new"), []), (record("new"), [])])
    with pytest.raises(NotFound):
        b.read("new")


def test_an_empty_batch_writes_nothing(b: Backend) -> None:
    assert b.compare_and_set_many([]) == []
    assert b.create_many([]) == []


def test_a_batch_of_creates_stores_each_with_its_history_and_refuses_only_an_existing_one(
    b: Backend,
) -> None:
    first = b.create(record("exists"), [])
    results = b.create_many([
        (record(n), [entry(n, f"op-{n}", "create", "*")]) for n in ("c-1", "exists", "c-2")
    ])
    assert isinstance(results[1], AlreadyExists)
    assert b.read("exists") == first
    for n, result in (("c-1", results[0]), ("c-2", results[2])):
        assert isinstance(result, LocationStatus) and b.read(n) == result
        assert [e.op_id for e in b.history(n)] == [f"op-{n}"]


def test_two_racing_batches_give_each_location_exactly_one_winner(kit: Kit) -> None:
    clients = [kit.open() for _ in range(2)]
    names = [f"race-{i:02d}" for i in range(20)]
    versions = {n: clients[0].create(record(n), []).version for n in names}
    barrier = threading.Barrier(len(clients))
    results: dict[int, list[CasResult]] = {}

    def race(i: int, client: Backend) -> None:
        items = [
            CasItem(record(n, State.PAUSING, i + 1), versions[n], [entry(n, f"op-{i}-{n}")])
            for n in (names if i == 0 else names[::-1])
        ]
        barrier.wait()
        got = client.compare_and_set_many(items)
        results[i] = got if i == 0 else got[::-1]

    threads = [threading.Thread(target=race, args=(i, c)) for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for k, n in enumerate(names):
        outcomes = [results[i][k] for i in range(len(clients))]
        winners = [i for i, r in enumerate(outcomes) if isinstance(r, LocationStatus)]
        assert len(winners) == 1, (n, outcomes)
        assert all(isinstance(r, VersionConflict) for r in outcomes if r is not outcomes[winners[0]])
        final = clients[0].read(n)
        assert final.version == versions[n] + 1
        assert final.services["replication"].generation == winners[0] + 1
        assert [e.op_id for e in clients[0].history(n, limit=100)] == [f"op-{winners[0]}-{n}"]


@settings(
    max_examples=12, deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    plan=st.lists(st.sampled_from(["fresh", "stale", "ahead", "missing"]), min_size=1,
                  max_size=12),
    data=st.data(),
)
def test_a_batch_writes_exactly_the_items_a_lone_compare_and_set_would(
    b: Backend, plan: list[str], data: st.DataObject
) -> None:
    """Whatever mix of current, stale, future and missing versions a batch carries, each item
    ends as it would alone: written at version + 1 with its history, or refused with the
    store's record and history unchanged."""
    prefix = uuid.uuid4().hex[:8]
    names = [f"p{prefix}-{i:02d}" for i in range(len(plan))]
    current: dict[str, int] = {}
    items: list[CasItem] = []
    for n, kind in zip(names, plan, strict=True):
        if kind != "missing":
            current[n] = b.create(record(n), []).version
            if data.draw(st.booleans(), label=f"{n} written before"):
                current[n] = b.compare_and_set(record(n, State.PAUSING, 9), current[n], []).version
        expected = {
            "fresh": current.get(n, 1),
            "stale": current.get(n, 2) - 1,
            "ahead": current.get(n, 0) + 1,
            "missing": 1,
        }[kind]
        items.append(CasItem(record(n, State.PAUSED, 3), expected, [entry(n, f"op-{n}")]))
    before = {n: (b.read(n), b.history(n, limit=100)) for n in current}
    results = b.compare_and_set_many(items)
    assert len(results) == len(items)
    for item, kind, result in zip(items, plan, results, strict=True):
        n = item.record.location
        if kind == "missing":
            assert isinstance(result, NotFound)
        elif kind == "fresh":
            assert isinstance(result, LocationStatus), result
            assert result.version == item.expected_version + 1 == b.read(n).version
            assert [e.op_id for e in b.history_write(n, result.version)] == [f"op-{n}"]
        else:
            assert isinstance(result, VersionConflict), result
            assert (b.read(n), b.history(n, limit=100)) == before[n]


def test_a_batch_of_creates_gives_a_location_stored_before_a_life_above_its_earlier_one(
    b: Backend,
) -> None:
    old = b.create(record("again"), [])
    b.delete("again", old.version)
    results = b.create_many([(record(n), [entry(n, f"op-{n}", "create", "*")])
                             for n in ("again", "first")])
    again, first = results
    assert isinstance(again, LocationStatus) and isinstance(first, LocationStatus)
    assert again.version > old.version and b.read("again") == again
    with pytest.raises(VersionConflict):
        b.compare_and_set(record("again", State.PAUSING, 1), old.version, [])
    assert [e.op_id for e in b.history("again")] == ["op-again"]


def test_a_batch_of_creates_given_its_texts_stores_what_it_would_encode(b: Backend) -> None:
    """``create_many(texts=)`` (a sync's creates, locstatus/manager/creates.py): the texts
    given are what the backend would write, so each location reads back as its record with
    its create entry, as without them; a location removed before too (a batch of its own:
    ZooKeeper creates a group holding one location at a time)."""
    old = b.create(record("again"), [])
    b.delete("again", old.version)
    now = datetime(2026, 3, 1, 9, tzinfo=UTC)
    for names in ([f"given-{i}" for i in range(5)], ["again"]):
        items, texts = new_records(
            names, dict.fromkeys(names, ("lifecycle", "replication")), now, "ops"
        )
        assert texts is not None
        results = b.create_many(items, texts=texts)
        for (rec, entries), got in zip(items, results, strict=True):
            assert isinstance(got, LocationStatus), got
            assert b.read(rec.location) == got == rec.model_copy(update={"version": got.version})
            assert b.history(rec.location) == [
                entries[0].model_copy(update={"version": got.version})
            ]
    assert b.read("again").version > old.version


# -- batches of reads and acknowledgements (invariant 14) -----------------------------------


def test_a_batch_read_answers_each_location_as_a_single_read(kit: Kit) -> None:
    """A burst of hints is read in batches: every location gets what ``read`` would give it,
    in the order asked, a corrupt or missing one in its own place, never hiding the others
    (the batch spans several of each backend's chunks)."""
    b = kit.open()
    names = [f"many-{i:04d}" for i in range(1100)]
    created = b.create_many([(record(n), []) for n in names])
    assert all(isinstance(r, LocationStatus) for r in created)
    kit.write_raw("many-bad", "{not json")
    asked = ["many-0007", "nowhere", "many-bad", *names, "many-0007"]
    got = b.read_many(asked)
    assert len(got) == len(asked)
    assert got[0] == b.read("many-0007") == got[-1]
    assert isinstance(got[1], NotFound) and "nowhere" in str(got[1])
    assert isinstance(got[2], CorruptRecord) and got[2].location == "many-bad"
    assert [r.location for r in got[3:-1] if isinstance(r, LocationStatus)] == names
    assert b.read_many([]) == []


def test_a_batch_of_acks_refuses_a_stale_one_alone(b: Backend) -> None:
    """``ack_many`` is many ``ack`` calls: each written, or refused alone when its record is no
    longer at its ``if_version`` (moved, or purged), nothing written for it; the others of the
    batch land. A second batch over the same acknowledgement nodes keeps those semantics."""
    b.put_worker(worker("w-1", None, ("replication", "lifecycle")))
    v = {n: b.create(record(n), []).version for n in ("a", "b", "c", "gone")}
    b.delete("gone", v["gone"])
    first = b.ack_many("w-1", [
        AckItem("a", "replication", 0, v["a"]),
        AckItem("a", "lifecycle", 0, v["a"]),
        AckItem("b", "replication", 0),
        AckItem("c", "replication", 0, v["c"] + 1),
        AckItem("gone", "replication", 0, v["gone"]),
    ])
    assert first[:3] == [None, None, None]
    assert isinstance(first[3], VersionConflict) and isinstance(first[4], VersionConflict)
    assert b.acks("a") == {"w-1": {"replication": 0, "lifecycle": 0}}
    assert b.acks("b") == {"w-1": {"replication": 0}}
    assert b.acks("c") == {} and b.acks("gone") == {}
    v["a"] = b.compare_and_set(record("a", State.PAUSING, 1), v["a"], []).version
    v["c"] = b.compare_and_set(record("c", State.PAUSING, 1), v["c"], []).version
    moved = b.compare_and_set(record("b", State.PAUSING, 1), v["b"], []).version
    second = b.ack_many("w-1", [
        AckItem("a", "replication", 1, v["a"]),
        AckItem("b", "replication", 1, v["b"]),  # the record moved since: refused
        AckItem("c", "replication", 1, v["c"]),
        AckItem("c", "lifecycle", 1),  # a generation the record does not have: refused
    ])
    assert second[0] is None and second[2] is None
    assert isinstance(second[1], VersionConflict) and isinstance(second[3], VersionConflict)
    assert b.acks("a") == {"w-1": {"replication": 1, "lifecycle": 0}}
    assert b.acks("b") == {"w-1": {"replication": 0}}
    assert b.acks("c") == {"w-1": {"replication": 1}}
    assert b.ack_many("w-1", [AckItem("b", "replication", 1, moved)]) == [None]
    assert b.acks("b") == {"w-1": {"replication": 1}}


@settings(
    max_examples=12, deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    plan=st.lists(
        st.tuples(st.integers(0, 2), st.sampled_from(["replication", "lifecycle"]),
                  st.sampled_from(["current", "stale", "none", "ahead"])),
        min_size=1, max_size=10,
    ),
)
def test_a_batch_of_acks_ends_as_the_same_acks_one_by_one(
    b: Backend, plan: list[tuple[int, str, str]]
) -> None:
    """Invariant 14, as a property: whatever mix of current, stale and unconditional
    acknowledgements, of generations the record has or not, and of repeats of one
    (location, service), ``ack_many`` refuses exactly the items a lone ``ack`` would refuse
    and leaves the acknowledgements a lone ``ack`` per item, in order, would leave (the
    last accepted one of each key)."""
    prefix = uuid.uuid4().hex[:8]
    worker_id = f"w-{prefix}"
    b.put_worker(worker(worker_id, None, ("replication", "lifecycle")))
    names = [f"a{prefix}-{i}" for i in range(3)]
    version: dict[str, int] = {}
    for n in names:
        v = b.create(record(n), []).version
        version[n] = b.compare_and_set(record(n, State.PAUSING, 1), v, []).version
    items: list[AckItem] = []
    for i, service, kind in plan:
        n = names[i]
        generation = {"replication": 1, "lifecycle": 0}[service] + (kind == "ahead")
        if_version = {"current": version[n], "stale": version[n] - 1}.get(kind)
        items.append(AckItem(n, service, generation, if_version))
    results = b.ack_many(worker_id, items)
    assert len(results) == len(items)
    expected: dict[str, dict[str, int]] = {}
    for item, (_, _, kind), result in zip(items, plan, results, strict=True):
        if kind in ("stale", "ahead"):
            assert isinstance(result, VersionConflict), (kind, result)
        else:
            assert result is None, (kind, result)
            expected.setdefault(item.location, {})[item.service] = item.generation
    for n in names:
        assert b.acks(n).get(worker_id, {}) == expected.get(n, {})
