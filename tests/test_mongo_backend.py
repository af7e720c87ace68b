"""What only the MongoDB backend has to prove (issue 4), over the wire (pymongo -> TCP -> server).

The shared suites (contract, manager, no lost updates) already run on the ``mongo`` kit; this
file covers the Mongo-specific design: the document shape, never an upsert with a version
filter, embedded vs collection history (nothing leaves the embedded copy uncopied), worker leases with a TTL index and
an explicit expiry test in reads, idempotent indexes, validated names, URL options and
timeouts, a server stopped and restarted mid-run, lost connections and write-concern errors
injected with ``configureFailPoint`` (ambiguous commits resolved once), two processes creating
the same location, change streams vs polling, and the places where the server under test
departs from MongoDB's documentation (``deviation`` tests: strict xfail on that server, plain
tests on a real mongod).
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient, ReturnDocument, monitoring
from pymongo.errors import OperationFailure

from locstatus import BackendUnavailable, connect
from locstatus.backends import open_backend
from locstatus.backends.base import HistoryGaps
from locstatus.backends.mongo import MongoBackend, parse_mongo_url
from locstatus.check import CheckReport, run_check
from locstatus.errors import (
    AlreadyExists,
    AmbiguousCommit,
    CorruptRecord,
    InvalidInput,
    NotFound,
    VersionConflict,
)
from locstatus.manager import Manager
from locstatus.models import Hint, HistoryEntry, LocationStatus, ServiceStatus, State, WorkerInfo

from support.fakeclock import FakeClock
from support.kits_mongo import COLLECTION, fresh_database, kit_url
from support.opened import backends_opened, open_mongo
from support.servers import MongoHandle, SecantusMongo, start_mongo

T0 = datetime(2026, 1, 1, tzinfo=UTC)


# -- helpers -------------------------------------------------------------------------------------


def record(location: str, state: State = State.RUNNING, generation: int = 0) -> LocationStatus:
    return LocationStatus(
        location=location,
        services={"replication": ServiceStatus(state=state, generation=generation, updated_at=T0)},
    )


def entry(location: str, op_id: str, event: str = "pause") -> HistoryEntry:
    return HistoryEntry(op_id=op_id, at=T0, location=location, service="replication", event=event)


class Commands(monitoring.CommandListener):
    """Every command sent by clients created after registration, while ``active``."""

    def __init__(self) -> None:
        self.active = False
        self.seen: list[tuple[str, str, dict[str, Any]]] = []
        self._lock = threading.Lock()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if self.active:
            with self._lock:
                self.seen.append((event.database_name, event.command_name, dict(event.command)))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass

    def on(self, database: str) -> list[tuple[str, dict[str, Any]]]:
        with self._lock:
            return [(name, cmd) for db, name, cmd in self.seen if db == database]


_COMMANDS = Commands()
monitoring.register(_COMMANDS)  # no unregister API: it stays registered, inactive outside tests


class BeforeCommand(monitoring.CommandListener):
    """Runs an action once, in the thread about to send a given command (pymongo publishes a
    command's start synchronously, before it sends it): "the other client acts exactly here",
    a race reproduced in one thread, every time. Armed by :meth:`arm`; inert otherwise."""

    def __init__(self) -> None:
        self._trap: tuple[int, str, str, Callable[[], None]] | None = None
        self.fired = False

    def arm(self, command: str, collection: str, action: Callable[[], None]) -> None:
        self.fired = False
        self._trap = (threading.get_ident(), command, collection, action)

    def disarm(self) -> None:
        self._trap = None

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        trap = self._trap
        if trap is None or trap[0] != threading.get_ident():
            return
        if event.command_name == trap[1] and event.command.get(trap[1]) == trap[2]:
            self._trap = None
            self.fired = True
            trap[3]()

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


_BEFORE = BeforeCommand()
monitoring.register(_BEFORE)


@pytest.fixture
def before_command() -> Iterator[BeforeCommand]:
    yield _BEFORE
    _BEFORE.disarm()


@pytest.fixture
def commands() -> Iterator[Commands]:
    _COMMANDS.seen.clear()
    _COMMANDS.active = True
    yield _COMMANDS
    _COMMANDS.active = False
    _COMMANDS.seen.clear()


@pytest.fixture
def db_name(mongo_server: MongoHandle) -> Iterator[str]:
    name = fresh_database()
    yield name
    client = mongo_server.client()
    try:
        client.drop_database(name)
    finally:
        client.close()


@pytest.fixture
def raw(mongo_server: MongoHandle) -> Iterator[MongoClient[dict[str, Any]]]:
    client = mongo_server.client()
    yield client
    client.close()


@pytest.fixture
def opened() -> Iterator[Callable[[str], MongoBackend]]:
    with backends_opened(open_mongo) as open_:
        yield open_


def own_server(tmp_path: Path) -> MongoHandle:
    """A server of our own, to stop and restart; skipped only on an external server."""
    server = start_mongo(tmp_path)
    if not server.controllable:
        pytest.skip("LOCSTATUS_TEST_MONGO_URI names a server this suite cannot stop")
    return server


def wait_for(pred: Callable[[], bool], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


# -- document shape ------------------------------------------------------------------------------


def test_one_document_per_location_holds_state_version_and_recent_history(
    mongo_server: MongoHandle, db_name: str, raw: MongoClient[dict[str, Any]],
    opened: Callable[[str], MongoBackend],
) -> None:
    b = opened(kit_url(mongo_server, db_name))
    v1 = b.create(record("us-east-1"), [entry("us-east-1", "op-c", "create")]).version
    v2 = b.compare_and_set(record("us-east-1", State.PAUSING, 1), v1, [entry("us-east-1", "op-p")]).version
    doc = raw[db_name][COLLECTION].find_one({"_id": "us-east-1"})
    assert doc is not None
    assert set(doc) == {"_id", "version", "born", "format", "services", "deleted_at",
                        "recent_history", "history_copied"}
    assert doc["format"] == 1  # the stored format (docs/versioning.md)
    assert (doc["version"], doc["born"]) == (v2, v1)
    assert doc["history_copied"] == v1 - 1  # no catch-up yet: nothing can leave the window
    assert doc["services"]["replication"]["state"] == "pausing"
    assert [(w["version"], [e["op_id"] for e in w["entries"]]) for w in doc["recent_history"]] == [
        (v1, ["op-c"]), (v2, ["op-p"]),
    ]
    assert doc["recent_history"][1]["entries"][0]["version"] == v2  # stamped by the backend
    copies = list(raw[db_name][f"{COLLECTION}_history"].find({"location": "us-east-1"}, {"_id": 0}))
    assert sorted((c["version"], c["entries"]) for c in copies) == [
        (w["version"], w["entries"]) for w in doc["recent_history"]
    ]


def test_a_corrupt_embedded_history_is_named_and_the_state_still_reads(
    mongo_server: MongoHandle, db_name: str, raw: MongoClient[dict[str, Any]],
    opened: Callable[[str], MongoBackend],
) -> None:
    b = opened(kit_url(mongo_server, db_name))
    b.create(record("loc"), [entry("loc", "op-c", "create")])
    raw[db_name][COLLECTION].update_one({"_id": "loc"}, {"$set": {"recent_history": "oops"}})
    assert b.read("loc").location == "loc"
    with pytest.raises(CorruptRecord, match=r"'loc'.*recent_history"):
        b.history("loc")
    raw[db_name][COLLECTION].update_one({"_id": "loc"}, {"$set": {"version": "seven"}})
    with pytest.raises(CorruptRecord, match=r"'loc'.*version"):
        b.read("loc")


# -- never upsert with a version filter -----------------------------------------------------------


def test_writes_are_versioned_find_and_modify_and_never_upsert_with_a_version(
    mongo_server: MongoHandle, db_name: str, commands: Commands,
    raw: MongoClient[dict[str, Any]], opened: Callable[[str], MongoBackend],
) -> None:
    b = opened(kit_url(mongo_server, db_name))
    mgr = Manager(b)
    mgr.sync_locations(["loc-a", "loc-b"])
    mgr.pause("loc-a", "replication")
    mgr.resume("loc-a", "replication", at=timedelta(hours=1))
    mgr.remove_location("loc-b")
    mgr.purge_location("loc-b", mgr.status("loc-b").version)
    mgr.add_location("loc-b")
    b.put_worker(WorkerInfo(worker_id="w-1", services=("replication",)))
    b.ack("w-1", "loc-a", "replication", 1)
    with pytest.raises(VersionConflict):
        b.compare_and_set(record("loc-a"), 1, [entry("loc-a", "op-stale")])
    with pytest.raises(NotFound):
        b.compare_and_set(record("ghost"), 1, [entry("ghost", "op-ghost")])

    sent = commands.on(db_name)
    cas = [c for name, c in sent if name == "findAndModify" and c["findAndModify"] == COLLECTION]
    assert len(cas) >= 5
    for c in cas:
        assert "version" in c["query"] and not c.get("upsert"), c
        assert set(c["update"]) <= {"$set", "$inc", "$push"} and c["update"]["$inc"] == {"version": 1}
    inserts = [c for name, c in sent if name == "insert" and c["insert"] == COLLECTION]
    # loc-a and loc-b in one unordered insert (a batch of creates), loc-b again alone
    assert [len(c["documents"]) for c in inserts] == [2, 1]
    for name, c in sent:
        for stmt in c.get("updates", []) + ([c] if name == "findAndModify" else []):
            if stmt.get("upsert"):
                assert "version" not in stmt.get("q", stmt.get("query", {})), (name, stmt)
    assert raw[db_name][COLLECTION].count_documents({}) == 2  # "ghost" was not created


def test_a_retried_compare_and_set_whose_first_attempt_landed_is_applied_once(
    mongo_server: MongoHandle, db_name: str, opened: Callable[[str], MongoBackend],
) -> None:
    b = opened(kit_url(mongo_server, db_name))
    v = b.create(record("loc"), []).version
    new = record("loc", State.PAUSING, 1)
    first = b.compare_and_set(new, v, [entry("loc", "op-once")])
    again = b.compare_and_set(new, v, [entry("loc", "op-once")])  # a driver-level retry
    assert again.version == first.version == v + 1
    assert [e.op_id for e in b.history("loc")] == ["op-once"]
    with pytest.raises(VersionConflict):
        b.compare_and_set(new, v, [entry("loc", "op-other")])


# -- embedded history vs the history collection ------------------------------------------------


def test_history_pages_merge_the_embedded_window_and_the_collection(
    mongo_server: MongoHandle, db_name: str, raw: MongoClient[dict[str, Any]],
    opened: Callable[[str], MongoBackend],
) -> None:
    b = opened(kit_url(mongo_server, db_name, recent_history="5"))
    v = b.create(record("loc"), [entry("loc", "op-c", "create")]).version
    versions = [v]
    for i in range(11):
        v = b.compare_and_set(record("loc", State.PAUSING, i), v, [entry("loc", f"op-{i}")]).version
        versions.append(v)
    doc = raw[db_name][COLLECTION].find_one({"_id": "loc"})
    assert doc is not None
    assert [w["version"] for w in doc["recent_history"]] == versions[-5:]
    everything = [e.version for e in b.history("loc", limit=1000)]
    assert everything == list(reversed(versions))
    page = b.history("loc", limit=3, before_version=versions[-6])  # entirely from the collection
    assert [e.version for e in page] == [versions[-7], versions[-8], versions[-9]]
    assert not b.history_gaps("loc")

    # A crash between the findAndModify and the history insert: the write is embedded only.
    hist = raw[db_name][f"{COLLECTION}_history"]
    hist.delete_one({"location": "loc", "version": versions[-2]})
    assert [e.op_id for e in b.history("loc", limit=2)] == ["op-10", "op-9"]  # merged
    assert b.history_gaps("loc") == HistoryGaps(restorable=(versions[-2],))  # reads are reads
    assert b.restore_history("loc") == [versions[-2]]
    assert b.restore_history("loc") == []
    assert not b.history_gaps("loc")
    assert hist.count_documents({"location": "loc"}) == len(versions)
    for _ in range(5):  # the write leaves the embedded window: the collection still has it
        v = b.compare_and_set(record("loc"), v, [entry("loc", "op-more")]).version
    assert "op-9" in [e.op_id for e in b.history("loc", limit=1000)]

    # A write gone from both copies (a hand edit) is lost, and said so.
    hist.delete_one({"location": "loc", "version": versions[3]})
    assert b.history_gaps("loc") == HistoryGaps(lost=(versions[3],))
    assert b.restore_history("loc") == []


@pytest.mark.parametrize(("writer_window", "reader_window"), [(4, 100), (100, 2), (3, 7)])
def test_history_pages_are_whole_whatever_each_clients_recent_history(
    mongo_server: MongoHandle, db_name: str, opened: Callable[[str], MongoBackend],
    writer_window: int, reader_window: int,
) -> None:
    """Clients of one database configured with different ``recent_history`` values: a reader
    whose window was larger than the writer's took the record's few embedded writes for the
    whole history and never read the older pages from the collection."""
    writer = opened(kit_url(mongo_server, db_name, recent_history=str(writer_window)))
    reader = opened(kit_url(mongo_server, db_name, recent_history=str(reader_window)))
    v = writer.create(record("loc"), [entry("loc", "op-c", "create")]).version
    versions = [v]
    for i in range(12):
        v = writer.compare_and_set(
            record("loc", State.PAUSING, i), v, [entry("loc", f"op-{i}")]
        ).version
        versions.append(v)
    newest_first = list(reversed(versions))
    assert [e.version for e in reader.history("loc", limit=1000)] == newest_first
    paged: list[int] = []
    before = None
    while True:  # pages of 3, each from where the last one stopped
        page = reader.history("loc", limit=3, before_version=before)
        if not page:
            break
        paged.extend(e.version for e in page)
        before = page[-1].version
    assert paged == newest_first
    assert [e.version for e in writer.history("loc", limit=1000)] == newest_first


def test_a_write_whose_copy_failed_survives_any_number_of_later_writes(
    failpoint_server: MongoHandle, failpoint: Callable[..., None],
    opened: Callable[[str], MongoBackend],
) -> None:
    """Issue 15: a writer that stopped between its findAndModify and its history insert, then
    100+ ordinary writes: the embedded copy slid out and that write was gone for good."""
    database = fresh_database()
    mgr = Manager(opened(kit_url(failpoint_server, database)))
    mgr.sync_locations(["loc"])
    dying = Manager(opened(kit_url(failpoint_server, database, appname="ls-dies")))
    failpoint("failCommand", {"times": 1}, failCommands=["insert"], appName="ls-dies",
              errorCode=2)  # its history insert fails, as if it died right before it
    # the pausing write is the one whose copy fails; its settle is a write of its own after it
    lost = dying.pause("loc", "replication", actor="dying", op_id="op-dying").version - 1
    assert [(e.op_id, e.event) for e in mgr.backend.history_write("loc", lost)] == [
        ("op-dying", "pause")
    ]
    for _ in range(60):  # 240 writes: more than the 100 embedded
        mgr.pause("loc", "lifecycle", actor="ops")
        mgr.resume("loc", "lifecycle", actor="ops")
    assert [(e.op_id, e.event) for e in mgr.backend.history_write("loc", lost)] == [
        ("op-dying", "pause")
    ]
    everything = mgr.history("loc", limit=10_000)
    assert [e.version for e in everything].count(lost) == 1
    versions = sorted({e.version for e in everything})
    assert versions == list(range(versions[0], versions[0] + len(versions)))  # gap-free chain
    assert not mgr.backend.history_gaps("loc")
    assert run_check(mgr).findings == []


def test_no_write_leaves_the_embedded_history_before_the_collection_holds_it(
    failpoint_server: MongoHandle, failpoint: Callable[..., None],
    opened: Callable[[str], MongoBackend],
) -> None:
    """Every history insert of this client fails: its writes fill the embedded window, and the
    write that would push out an uncopied one is refused (nothing written) until the copies
    succeed again; then nothing is missing."""
    url = kit_url(failpoint_server, fresh_database(), recent_history="4", appname="ls-nocopy")
    b = opened(url)
    v = b.create(record("loc"), [entry("loc", "op-c", "create")]).version  # copied
    failpoint("failCommand", "alwaysOn", failCommands=["insert"], appName="ls-nocopy",
              errorCode=2)
    for i in range(4):  # the window holds 4 writes: these 4 fit (the create leaves, copied)
        v = b.compare_and_set(record("loc", State.PAUSING, i), v, [entry("loc", f"op-{i}")]).version
    with pytest.raises(BackendUnavailable, match="refused history copy of 'loc'") as err:
        b.compare_and_set(record("loc"), v, [entry("loc", "op-refused")])
    assert not isinstance(err.value, AmbiguousCommit)  # nothing was written
    assert b.read("loc").version == v
    assert b.history_gaps("loc") == HistoryGaps(restorable=tuple(range(v - 3, v + 1)))
    failpoint("failCommand", "off")
    v = b.compare_and_set(record("loc"), v, [entry("loc", "op-after")]).version
    ops = [e.op_id for e in b.history("loc", limit=100)]
    assert ops == ["op-after", "op-3", "op-2", "op-1", "op-0", "op-c"]
    assert not b.history_gaps("loc")


def test_a_record_written_before_the_copy_watermark_catches_up_on_its_next_write(
    mongo_server: MongoHandle, db_name: str, raw: MongoClient[dict[str, Any]],
    opened: Callable[[str], MongoBackend],
) -> None:
    b = opened(kit_url(mongo_server, db_name, recent_history="3"))
    v = b.create(record("loc"), [entry("loc", "op-c", "create")]).version
    v = b.compare_and_set(record("loc", State.PAUSING, 1), v, [entry("loc", "op-1")]).version
    coll = raw[db_name][COLLECTION]
    coll.update_one({"_id": "loc"}, {"$unset": {"history_copied": ""}})  # an older backend's
    raw[db_name][f"{COLLECTION}_history"].delete_one({"location": "loc", "version": v})
    for i in range(2, 6):
        v = b.compare_and_set(record("loc", State.PAUSING, i), v, [entry("loc", f"op-{i}")]).version
    assert [e.op_id for e in b.history("loc", limit=100)] == [
        "op-5", "op-4", "op-3", "op-2", "op-1", "op-c",
    ]
    assert not b.history_gaps("loc")
    doc = coll.find_one({"_id": "loc"})
    assert doc is not None and isinstance(doc["history_copied"], int)


def test_a_write_between_its_two_writes_is_in_flight_until_stuck_after_then_restored_once(
    mongo_server: MongoHandle, db_name: str, raw: MongoClient[dict[str, Any]],
    opened: Callable[[str], MongoBackend], before_command: BeforeCommand,
) -> None:
    """A writer between its ``findAndModify`` and its history insert is in flight: its write
    is in the record's recent history and not yet in the collection. The check runs right
    then (inside the writer's insert, so every time). Under load its two looks at the gaps,
    milliseconds apart, both fell in that window, and it reported the write as a gap. Now it
    reports it only once the write is ``stuck_after`` old (a writer stopped, like a stuck
    transition); its repair then copies it, and the writer's own insert, when it comes, is a
    duplicate the unique index skips: the write is in the collection once, as written."""
    clock = FakeClock()
    url = kit_url(mongo_server, db_name)
    writer = Manager(opened(url), clock=clock)
    checker = Manager(opened(url), clock=clock)
    writer.sync_locations(["loc"])
    reports: list[CheckReport] = []

    def checks_meanwhile() -> None:
        reports.append(run_check(checker, repair=True))
        clock.advance(300)  # the check's default stuck_after: the writer looks stopped
        reports.append(run_check(checker, repair=True))

    before_command.arm("insert", f"{COLLECTION}_history", checks_meanwhile)
    paused = writer.pause("loc", "replication")
    assert before_command.fired and len(reports) == 2, "the check did not run in between"
    in_flight, stopped = ([f for f in r.findings if f.kind == "history_gap"] for r in reports)
    assert in_flight == [] and reports[0].repairs == [], reports[0].findings
    (gap,) = stopped
    assert gap.id == "history_gap:loc:-:restorable"
    assert gap.evidence["missing_versions"] == [paused.version] and gap.state == "repaired"
    hist = raw[db_name][f"{COLLECTION}_history"]
    copies = list(hist.find({"location": "loc", "version": paused.version}))
    assert len(copies) == 1
    assert {e["op_id"] for e in copies[0]["entries"]} == {
        e.op_id for e in writer.backend.history_write("loc", paused.version)
    }
    assert not checker.backend.history_gaps("loc")


def test_leftovers_of_an_interrupted_purge_never_leak_into_the_new_life(
    mongo_server: MongoHandle, db_name: str, raw: MongoClient[dict[str, Any]],
    opened: Callable[[str], MongoBackend],
) -> None:
    b = opened(kit_url(mongo_server, db_name))
    v = b.create(record("loc"), [entry("loc", "op-old", "create")]).version
    v = b.compare_and_set(record("loc", State.PAUSING, 1), v, [entry("loc", "op-old-2")]).version
    b.put_worker(WorkerInfo(worker_id="w-1", services=("replication",)))
    b.ack("w-1", "loc", "replication", 1)
    raw[db_name][COLLECTION].delete_one({"_id": "loc"})  # the purge stopped after this step
    reborn = b.create(record("loc"), [entry("loc", "op-new", "create")])
    assert reborn.version > v
    assert [e.op_id for e in b.history("loc", limit=100)] == ["op-new"]
    assert b.acks("loc") == {}


# -- workers: heartbeat documents, TTL index, explicit expiry in reads ------------------------------


def test_an_expired_lease_is_not_alive_before_the_ttl_sweep_removes_it(
    mongo_server: MongoHandle, db_name: str, raw: MongoClient[dict[str, Any]],
    opened: Callable[[str], MongoBackend],
) -> None:
    b = opened(kit_url(mongo_server, db_name, worker_ttl="0"))
    mgr = Manager(b)
    mgr.sync_locations(["loc"])
    past = datetime.now(UTC) - timedelta(seconds=30)
    b.put_worker(WorkerInfo(worker_id="w-dead", services=("replication",), lease_expires_at=past))
    doc = raw[db_name][f"{COLLECTION}_workers"].find_one({"_id": "w-dead"})
    assert doc is not None and doc["expires_at"].replace(tzinfo=UTC) == past.replace(microsecond=past.microsecond // 1000 * 1000)
    # TTL deletion is lazy: the document is still there, so reads test the lease explicitly.
    listed = [w for w in b.workers() if w.worker_id == "w-dead"]
    assert listed and not listed[0].alive(datetime.now(UTC))
    assert mgr.pause("loc", "replication").services["replication"].state is State.PAUSED
    index = raw[db_name][f"{COLLECTION}_workers"].index_information()["expires_at_ttl"]
    assert index["expireAfterSeconds"] == 0 and index["key"] == [("expires_at", 1)]


def _lower_ttl_monitor_interval(client: MongoClient[dict[str, Any]], seconds: int) -> bool:
    """``setParameter ttlMonitorSleepSecs`` (a runtime server parameter of mongod)."""
    try:
        client.admin.command("setParameter", 1, ttlMonitorSleepSecs=seconds)
    except OperationFailure:
        return False
    return True


@pytest.mark.slow
def test_the_ttl_index_removes_a_dead_worker_document_after_its_grace(
    mongo_server: MongoHandle, db_name: str, raw: MongoClient[dict[str, Any]],
    opened: Callable[[str], MongoBackend],
) -> None:
    # MongoDB's TTL monitor runs every 60 s; lowered to 1 s where the server allows it.
    lowered = _lower_ttl_monitor_interval(raw, 1)
    try:
        b = opened(kit_url(mongo_server, db_name, worker_ttl="1"))
        now = datetime.now(UTC)
        b.put_worker(WorkerInfo(worker_id="w-dead", services=("replication",),
                                lease_expires_at=now - timedelta(seconds=5)))
        b.put_worker(WorkerInfo(worker_id="w-live", services=("replication",),
                                lease_expires_at=now + timedelta(minutes=10)))
        b.put_worker(WorkerInfo(worker_id="w-session", services=("replication",)))
        # standing (docs/agent.md "Standing registrations"): outlives its lease, never swept
        b.put_worker(WorkerInfo(worker_id="w-standing", services=("replication",),
                                lease_expires_at=now - timedelta(seconds=5), standing=True))
        b.create(record("loc", State.PAUSED, 1), [])
        b.ack("w-dead", "loc", "replication", 1)
        assert "w-dead" in [w.worker_id for w in b.workers()]

        def swept() -> bool:
            time.sleep(0.5)
            return [w.worker_id for w in b.workers()] == ["w-live", "w-session", "w-standing"]

        assert wait_for(swept, 30 if lowered else 150)
        kept = raw[db_name][f"{COLLECTION}_workers"].find_one({"_id": "w-standing"})
        assert kept is not None and "expires_at" not in kept  # the TTL field: none
        assert [w.lease_expires_at for w in b.workers() if w.standing] == [
            now - timedelta(seconds=5)]  # kept in the registration itself
    finally:
        if lowered:
            _lower_ttl_monitor_interval(raw, 60)


def test_changing_worker_ttl_updates_the_index_in_place(
    mongo_server: MongoHandle, db_name: str, raw: MongoClient[dict[str, Any]],
    opened: Callable[[str], MongoBackend],
) -> None:
    opened(kit_url(mongo_server, db_name, worker_ttl="60"))
    opened(kit_url(mongo_server, db_name, worker_ttl="120"))
    info = raw[db_name][f"{COLLECTION}_workers"].index_information()
    assert [k for k in info if k != "_id_"] == ["expires_at_ttl"]
    assert info["expires_at_ttl"]["expireAfterSeconds"] == 120


# -- indexes, names, URL options --------------------------------------------------------------------


def test_indexes_are_created_at_start_and_opening_again_changes_nothing(
    mongo_server: MongoHandle, db_name: str, raw: MongoClient[dict[str, Any]],
    opened: Callable[[str], MongoBackend],
) -> None:
    url = kit_url(mongo_server, db_name)
    opened(url)
    db = raw[db_name]

    def indexes() -> dict[str, Any]:
        return {c: db[c].index_information() for c in sorted(db.list_collection_names())}

    first = indexes()
    assert first[f"{COLLECTION}_history"]["location_version"]["unique"] is True
    assert set(first[f"{COLLECTION}_acks"]) == {"_id_", "location", "worker_id"}
    for _ in range(3):
        opened(url)
    assert indexes() == first


@pytest.mark.parametrize(
    "query, message",
    [
        ("database=bad.name", "database name 'bad.name'"),
        ("database=has%20space", "database name 'has space'"),
        ("database=" + "d" * 64, "database name"),
        ("database=x$y", "database name"),
        ("collection=system_things", "collection name 'system_things'"),
        ("collection=a.b", "collection name 'a.b'"),
        ("collection=1st", "collection name '1st'"),
        ("collection=" + "c" * 49, "collection name"),
        ("recent_history=0", "recent_history=0"),
        ("poll_interval=fast", "invalid MongoDB URL parameter poll_interval=fast"),
        ("hints=sometimes", "hints='sometimes'"),
        ("maxTimeMS=-5", "maxTimeMS=-5"),
    ],
)
def test_bad_names_and_options_are_refused_before_connecting(query: str, message: str) -> None:
    started = time.monotonic()
    with pytest.raises(InvalidInput, match=message.replace("$", r"\$")):
        open_backend(f"mongodb://127.0.0.1:9/?serverSelectionTimeoutMS=30000&{query}")
    assert time.monotonic() - started < 5  # refused up front, not after a connection attempt


def test_url_options_reach_the_driver_and_locstatus_options_do_not() -> None:
    s = parse_mongo_url(
        "mongodb://u:secret@h1:1,h2:2/admin?replicaSet=rs0&database=prod&collection=loc"
        "&recent_history=20&maxTimeMS=1500&poll_interval=0.5&hints=poll&worker_ttl=7"
    )
    assert (s.database, s.collection, s.recent_history, s.max_time_ms) == ("prod", "loc", 20, 1500)
    assert (s.poll_interval, s.hints, s.worker_ttl, s.where) == (0.5, "poll", 7, "h1:1,h2:2")
    assert s.client_url == "mongodb://u:secret@h1:1,h2:2/admin?replicaSet=rs0"
    assert s.client_options["w"] == "majority" and s.client_options["journal"] is True
    assert s.client_options["readConcernLevel"] == "majority"
    assert s.client_options["serverSelectionTimeoutMS"] == 5000
    mine = parse_mongo_url("mongodb://h/?w=1&readConcernLevel=local&serverSelectionTimeoutMS=700")
    assert "w" not in mine.client_options and "readConcernLevel" not in mine.client_options
    assert mine.server_selection_timeout == 0.7 and mine.database == "locstatus"
    assert parse_mongo_url("mongodb://h/fromPath").database == "fromPath"


def test_every_command_carries_its_timeout_and_concerns(
    mongo_server: MongoHandle, db_name: str, commands: Commands,
    opened: Callable[[str], MongoBackend],
) -> None:
    b = opened(kit_url(mongo_server, db_name))
    mgr = Manager(b)
    mgr.sync_locations(["loc"])
    mgr.pause("loc", "replication")
    mgr.history("loc")
    mgr.statuses()
    b.workers()
    b.acks("loc")
    sent = commands.on(db_name)
    reads = [c for name, c in sent if name in ("find", "findAndModify", "aggregate", "createIndexes")]
    assert reads and all("maxTimeMS" in c for c in reads), [c for c in reads if "maxTimeMS" not in c]
    writes = [c for name, c in sent if name in ("insert", "update", "delete", "findAndModify")]
    assert writes and all(c["writeConcern"].get("w") == "majority" and c["writeConcern"].get("j")
                          for c in writes)
    finds = [c for name, c in sent if name == "find"]
    assert all(c.get("readConcern", {}).get("level") == "majority" for c in finds)


def test_w1_and_local_reads_from_the_url_are_used(
    mongo_server: MongoHandle, db_name: str, commands: Commands,
    opened: Callable[[str], MongoBackend],
) -> None:
    b = opened(kit_url(mongo_server, db_name, w="1", readConcernLevel="local"))
    b.create(record("loc"), [])
    b.read("loc")
    sent = commands.on(db_name)
    insert = next(c for name, c in sent if name == "insert")
    assert insert.get("writeConcern", {}).get("w", 1) == 1
    find = next(c for name, c in sent if name == "find")
    assert find.get("readConcern", {}).get("level") == "local"


@pytest.fixture(scope="module")
def failpoint_server(
    mongo_server: MongoHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MongoHandle]:
    """A server that accepts ``configureFailPoint`` (mongod's fault injection): SecantusDB
    started with ``--enable-test-commands``, or the session's mongod if it allows it."""
    if mongo_server.kind == "secantusdb":
        server = SecantusMongo(tmp_path_factory.mktemp("failpoints"),
                               extra_args=["--enable-test-commands"]).start()
        try:
            yield server
        finally:
            server.close()
        return
    client = mongo_server.client()
    try:
        client.admin.command("configureFailPoint", "failCommand", mode="off")
    except OperationFailure:
        pytest.skip("the server under test does not enable test commands (configureFailPoint)")
    finally:
        client.close()
    yield mongo_server


@pytest.fixture
def failpoint(failpoint_server: MongoHandle) -> Iterator[Callable[..., None]]:
    client = failpoint_server.client()
    armed: list[str] = []

    def arm(name: str, mode: Any, **data: Any) -> None:
        client.admin.command("configureFailPoint", name, mode=mode, data=data)
        armed.append(name)

    yield arm
    for name in armed:
        client.admin.command("configureFailPoint", name, mode="off")
    client.close()


def test_a_query_over_its_time_budget_is_a_clear_error(
    failpoint_server: MongoHandle, failpoint: Callable[..., None],
    opened: Callable[[str], MongoBackend],
) -> None:
    b = opened(kit_url(failpoint_server, fresh_database(), maxTimeMS="250"))
    b.put_worker(WorkerInfo(worker_id="w-1", services=("replication",)))
    failpoint("maxTimeAlwaysTimeOut", "alwaysOn")
    with pytest.raises(BackendUnavailable, match="read of workers exceeded maxTimeMS=250") as err:
        b.workers()
    assert not isinstance(err.value, AmbiguousCommit)


def test_a_connection_lost_during_compare_and_set_is_resolved_and_applied_once(
    failpoint_server: MongoHandle, failpoint: Callable[..., None],
    opened: Callable[[str], MongoBackend],
) -> None:
    database = fresh_database()
    # One lost connection: pymongo's retry of the retryable write (same transaction number:
    # applied once) absorbs it, given the time to find the server again (the default deadline).
    patient = opened(kit_url(failpoint_server, database, appname="ls-flaky"))
    mgr = Manager(patient)
    mgr.sync_locations(["loc"])
    v = patient.read("loc").version
    failpoint("failCommand", {"times": 1}, failCommands=["findAndModify"],
              closeConnection=True, appName="ls-flaky")
    v = patient.compare_and_set(record("loc"), v, [entry("loc", "op-retried", "restore")]).version
    assert [e.op_id for e in patient.history("loc", limit=1)] == ["op-retried"]
    assert patient.read("loc").version == v
    b = opened(kit_url(failpoint_server, database, appname="ls-flaky", timeoutMS="1000"))
    mgr = Manager(b)
    # No answer before the call's deadline (the server holds the command past it, then fails
    # it): the outcome is unknown.
    unanswered = {"failCommands": ["findAndModify"], "blockConnection": True,
                  "blockTimeMS": 1500, "errorCode": 2, "appName": "ls-flaky"}
    failpoint("failCommand", {"times": 1}, **unanswered)
    with pytest.raises(AmbiguousCommit, match="outcome of compare-and-set of 'loc'"):
        b.compare_and_set(record("loc", State.PAUSED, 1), v, [entry("loc", "op-lost")])
    failpoint("failCommand", {"times": 1}, **unanswered)
    rec = mgr.pause("loc", "replication", op_id="op-resolved")
    assert rec.services["replication"].op_id == "op-resolved" and mgr.stats["ambiguous"] == 1
    ops = [e.op_id for e in mgr.history("loc")]
    assert ops.count("op-resolved") == 2 and "op-lost" not in ops  # pause + settle, once


def test_a_write_concern_error_after_the_write_landed_is_not_applied_twice(
    failpoint_server: MongoHandle, failpoint: Callable[..., None],
    opened: Callable[[str], MongoBackend],
) -> None:
    url = kit_url(failpoint_server, fresh_database(), appname="ls-wce")
    mgr = Manager(opened(url))
    mgr.sync_locations(["loc"])
    before = mgr.status("loc").version
    failpoint("failCommand", {"times": 1}, failCommands=["findAndModify"], appName="ls-wce",
              writeConcernError={"code": 64, "codeName": "WriteConcernFailed",
                                 "errmsg": "waiting for replication timed out"})
    rec = mgr.pause("loc", "replication", op_id="op-wce")
    assert mgr.stats["ambiguous"] == 1  # the backend said "outcome unknown"; the manager looked
    assert rec.version == before + 2 and rec.services["replication"].state is State.PAUSED
    assert [e.op_id for e in mgr.history("loc")].count("op-wce") == 2  # pause + settle, once


# -- server down, server back -----------------------------------------------------------------------


def test_server_stopped_mid_run_fails_fast_and_recovers_after_restart(tmp_path: Path) -> None:
    server = own_server(tmp_path)
    try:
        url = kit_url(server, "restart", serverSelectionTimeoutMS="1000")
        mgr = connect(url)
        mgr.sync_locations(["loc"])
        hints: list[Hint] = []
        unsubscribe = mgr.backend.subscribe(hints.append)
        done: list[tuple[str, int]] = []
        errors: list[tuple[BaseException, float]] = []
        unexpected: list[BaseException] = []
        stop = threading.Event()

        def load() -> None:
            i = 0
            while not stop.is_set():
                started = time.monotonic()
                op_id = f"op-{i}"
                try:
                    fn = mgr.pause if i % 2 == 0 else mgr.resume
                    rec = fn("loc", "replication", op_id=op_id)
                    if rec.services["replication"].op_id == op_id:
                        done.append((op_id, rec.version))
                except BackendUnavailable as exc:
                    errors.append((exc, time.monotonic() - started))
                    time.sleep(0.05)
                except Exception as exc:  # anything else fails the test below
                    unexpected.append(exc)
                i += 1

        worker = threading.Thread(target=load)
        worker.start()
        assert wait_for(lambda: len(done) >= 10)
        server.stop()
        assert wait_for(lambda: len(errors) >= 3, 60)
        for _exc, elapsed in errors:
            assert elapsed < 15, f"took {elapsed:.1f}s to fail"
        assert any("unreachable" in str(e) and f"127.0.0.1:{server.port}" in str(e)
                   for e, _ in errors), [str(e) for e, _ in errors[:3]]
        started = time.monotonic()
        with pytest.raises(BackendUnavailable, match="unreachable"):
            mgr.status("loc")
        assert time.monotonic() - started < 10
        with pytest.raises(BackendUnavailable):
            mgr.backend.ping()
        before = len(done)
        hints.clear()
        server.start()
        assert wait_for(lambda: len(done) >= before + 10, 60), "no progress after the restart"
        stop.set()
        worker.join(60)
        assert unexpected == []
        mgr.backend.ping()
        if getattr(mgr.backend, "hint_mode", None) == "changestream":
            assert wait_for(lambda: any(h.kind == "resync" for h in hints), 30)
        unsubscribe()
        # every operation reported done is in the history exactly once, and its settle (no
        # worker: in the write right after it) at most once; the call returned the newest
        hist = mgr.backend.history("loc", limit=100_000)
        by_op: dict[str, list[tuple[int, str]]] = {}
        for e in hist:
            by_op.setdefault(e.op_id, []).append((e.version, e.event))
        for op_id, version in done:
            mine = sorted(by_op.get(op_id, []))
            event = "pause" if int(op_id.removeprefix("op-")) % 2 == 0 else "resume"
            assert mine in ([(version, event)], [(version - 1, event), (version, "settle")]), (
                op_id, version, mine
            )
        versions = sorted({e.version for e in hist})
        assert versions == list(range(versions[0], versions[0] + len(versions)))
        mgr.close()
    finally:
        server.close()


@pytest.mark.parametrize("fault", ["killed", "frozen"])
def test_close_returns_at_once_while_the_server_is_down(tmp_path: Path, fault: str) -> None:
    """A process shutting down during an outage must not wait on the server it cannot reach.
    Before: close() took 0.5 to 1.5 s: the driver's endSessions waited in server selection
    (bounded at 0.5 s, in the driver's steps of 0.5 s) or for a reply, then close() joined the
    hint thread (up to 1 s), itself waiting in server selection or on a frozen socket."""
    server = own_server(tmp_path)
    try:
        backend = open_backend(kit_url(server, fresh_database()))
        hints: list[Hint] = []
        backend.subscribe(hints.append)  # the hint thread
        backend.create(record("loc"), [entry("loc", "op-c", "create")])  # a server session
        if fault == "killed":
            server.kill()
        else:
            server.pause()
        started = time.monotonic()
        backend.close()
        elapsed = time.monotonic() - started
        assert elapsed < 0.5, f"close() took {elapsed:.2f}s"
        with pytest.raises(BackendUnavailable, match="closed"):
            backend.read("loc")
    finally:
        if fault == "frozen":
            server.resume()
            server.kill()  # its clients' half-done requests would hold a clean stop
        server.close()


def test_opening_a_backend_on_a_stopped_server_names_it() -> None:
    port = 9  # discard: nothing listens on it
    started = time.monotonic()
    with pytest.raises(BackendUnavailable, match=f"MongoDB at 127.0.0.1:{port} is unreachable"):
        open_backend(f"mongodb://127.0.0.1:{port}/?serverSelectionTimeoutMS=500&database=x")
    assert time.monotonic() - started < 10


# -- two processes creating the same location ---------------------------------------------------------


def _create_at_once(url: str, names: list[str], barrier: Any, out: Any) -> None:
    mgr = connect(url)
    barrier.wait(60)
    try:
        report = mgr.sync_locations(names, remove_missing=False)
        out.put(("ok", report.added))
    except BaseException as exc:  # reported to the test, which fails on it
        out.put(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        mgr.close()


def test_two_processes_creating_the_same_location_make_one_record_and_no_error(
    mongo_server: MongoHandle, db_name: str, raw: MongoClient[dict[str, Any]],
) -> None:
    url = kit_url(mongo_server, db_name)
    names = [f"twin-{i}" for i in range(8)]
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    out = ctx.Queue()
    procs = [ctx.Process(target=_create_at_once, args=(url, names, barrier, out)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert all(kind == "ok" for kind, _ in results), results
    added = sorted(n for _, names_added in results for n in names_added)
    assert added == names  # each location created by exactly one of the two
    coll = raw[db_name][COLLECTION]
    for name in names:
        assert coll.count_documents({"_id": name}) == 1
    mgr = connect(url)
    try:
        for name in names:
            assert [e.event for e in mgr.history(name)] == ["create"]
    finally:
        mgr.close()


def test_many_racing_creators_make_one_record_each_and_the_rest_already_exists(
    mongo_server: MongoHandle, db_name: str, opened: Callable[[str], MongoBackend],
) -> None:
    url = kit_url(mongo_server, db_name)
    clients = [opened(url) for _ in range(4)]
    outcomes: dict[str, list[str]] = {}
    lock = threading.Lock()

    def create(client: MongoBackend, name: str, barrier: threading.Barrier) -> None:
        barrier.wait()
        try:
            stored = client.create(record(name), [entry(name, f"op-{id(client)}", "create")])
            result = f"created:{stored.version}"
        except AlreadyExists:
            result = "exists"
        except Exception as exc:  # any other outcome fails the test
            result = f"error:{type(exc).__name__}: {exc}"
        with lock:
            outcomes.setdefault(name, []).append(result)

    for i in range(10):
        name = f"race-{i}"
        barrier = threading.Barrier(len(clients))
        threads = [threading.Thread(target=create, args=(c, name, barrier)) for c in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    for name, results in outcomes.items():
        created = [r for r in results if r.startswith("created:")]
        assert len(created) == 1 and results.count("exists") == len(clients) - 1, (name, results)
        assert clients[0].read(name).version == int(created[0].split(":")[1])
        assert len(clients[0].history(name)) == 1
        # a loser's clean-up of "earlier lives" never deletes the winner's history copy
        assert not clients[0].history_gaps(name), (name, clients[0].history_gaps(name))


def test_a_losing_creator_never_deletes_the_acknowledgements_of_the_winners_record(
    mongo_server: MongoHandle, db_name: str, opened: Callable[[str], MongoBackend],
    before_command: BeforeCommand,
) -> None:
    """Two creators of a location that had an earlier life. The loser found no record; right
    then (before its creation counter is bumped) the winner creates the record and a worker
    acknowledges it. The loser's clean-up of the earlier life's acknowledgements then deleted
    the winner's, and the worker's pause would wait for an acknowledgement it had made. The
    interleaving is forced, not hoped for: the winner runs inside the loser's command."""
    url = kit_url(mongo_server, db_name)
    loser, winner = opened(url), opened(url)
    first = winner.create(record("loc"), [entry("loc", "op-1", "create")]).version
    winner.delete("loc", first)  # an earlier life: the next create cleans up after it
    won: list[int] = []

    def winner_creates_and_a_worker_acknowledges() -> None:
        rec = winner.create(record("loc"), [entry("loc", "op-win", "create")])
        winner.put_worker(WorkerInfo(worker_id="w-1", services=("replication",)))
        winner.ack("w-1", "loc", "replication", 0, if_version=rec.version)
        won.append(rec.version)

    before_command.arm("findAndModify", f"{COLLECTION}_incarnations",
                       winner_creates_and_a_worker_acknowledges)
    with pytest.raises(AlreadyExists):
        loser.create(record("loc"), [entry("loc", "op-lose", "create")])
    assert before_command.fired and won, "the race was not reproduced"
    assert loser.read("loc").version == won[0]
    assert loser.acks("loc") == {"w-1": {"replication": 0}}
    assert loser.all_acks()["loc"] == {"w-1": {"replication": 0}}


def test_acknowledgements_of_an_earlier_life_never_count_for_the_next(
    mongo_server: MongoHandle, db_name: str, raw: MongoClient[dict[str, Any]],
    opened: Callable[[str], MongoBackend],
) -> None:
    """An earlier life's acknowledgements are left behind by a purge interrupted after the
    record's delete, or by a record deleted by hand; one acknowledges generation 5 where the
    new life is at generation 1. They never count for the new life, even before its creator
    cleans them up, and however the creator raced (what ``create`` once ensured by deleting
    them before its insert, racing other creators)."""
    b = opened(kit_url(mongo_server, db_name))
    v = b.create(record("loc", State.PAUSING, 5), []).version
    b.put_worker(WorkerInfo(worker_id="w-1", services=("replication",)))
    b.ack("w-1", "loc", "replication", 5, if_version=v)
    raw[db_name][COLLECTION].delete_one({"_id": "loc"})  # by hand: no purge, no floor raised
    acks = raw[db_name][f"{COLLECTION}_acks"]
    acks.insert_one({"_id": "loc/w-old/replication", "location": "loc", "worker_id": "w-old",
                     "service": "replication", "generation": 9})  # written before lives
    stale = acks.find_one({"_id": "loc/w-1/replication"})
    b.create(record("loc", State.PAUSING, 1), [])
    assert b.acks("loc") == {} and "loc" not in b.all_acks()
    acks.replace_one({"_id": "loc/w-1/replication"}, stale or {}, upsert=True)  # put back
    assert b.acks("loc") == {}, "an earlier life's acknowledgement counted"
    assert "loc" not in b.all_acks()


# -- change hints: change streams or polling ---------------------------------------------------------


def _expect_hints(writer: MongoBackend, watcher: MongoBackend) -> None:
    got: list[Hint] = []
    unsubscribe = watcher.subscribe(got.append)
    v = writer.create(record("hinted"), []).version
    writer.compare_and_set(record("hinted", State.PAUSING, 1), v, [entry("hinted", "op")])
    assert wait_for(lambda: any(h.kind == "location" and h.location == "hinted" for h in got))
    writer.put_worker(WorkerInfo(worker_id="w-h", services=("replication",)))
    assert wait_for(lambda: any(h.kind == "workers" for h in got))
    writer.ack("w-h", "hinted", "replication", 1)
    assert wait_for(lambda: any(h.kind == "acks" and h.location == "hinted" for h in got))
    unsubscribe()


def test_hints_follow_the_servers_topology(
    mongo_server: MongoHandle, db_name: str, raw: MongoClient[dict[str, Any]],
    opened: Callable[[str], MongoBackend],
) -> None:
    url = kit_url(mongo_server, db_name)
    writer, watcher = opened(url), opened(url)
    _expect_hints(writer, watcher)
    hello = raw.admin.command("hello")
    replicated = "setName" in hello or hello.get("msg") == "isdbgrid"
    assert watcher.hint_mode == ("changestream" if replicated else "poll")


def test_polling_hints_when_asked_or_on_a_standalone_server(
    mongo_server: MongoHandle, db_name: str, opened: Callable[[str], MongoBackend],
) -> None:
    url = kit_url(mongo_server, db_name, hints="poll", poll_interval="0.1")
    writer, watcher = opened(url), opened(url)
    _expect_hints(writer, watcher)
    assert watcher.hint_mode == "poll"


def test_a_standalone_secantus_server_is_polled(
    mongo_server: MongoHandle, tmp_path: Path, opened: Callable[[str], MongoBackend],
) -> None:
    if mongo_server.kind != "secantusdb":
        pytest.skip("only SecantusDB can be started as a standalone here")
    server = SecantusMongo(tmp_path / "standalone", extra_args=["--standalone"]).start()
    try:
        url = kit_url(server, "standalone", poll_interval="0.1")
        writer, watcher = opened(url), opened(url)
        _expect_hints(writer, watcher)
        assert watcher.hint_mode == "poll"
        watcher.close()
        writer.close()
    finally:
        server.close()


def test_a_change_stream_resumes_after_a_dropped_database_with_a_resync(
    mongo_server: MongoHandle, db_name: str, raw: MongoClient[dict[str, Any]],
    opened: Callable[[str], MongoBackend],
) -> None:
    url = kit_url(mongo_server, db_name)
    watcher = opened(url)
    got: list[Hint] = []
    watcher.subscribe(got.append)
    if watcher.hint_mode != "changestream":
        pytest.skip("the server under test is not a replica set: no change streams")
    raw.drop_database(db_name)
    assert wait_for(lambda: any(h.kind == "resync" for h in got))
    writer = opened(url)  # recreates the indexes
    writer.create(record("after-drop"), [])
    assert wait_for(lambda: any(h.location == "after-drop" for h in got))


# -- the server under test vs MongoDB's documentation -------------------------------------------------


def test_read_all_sorts_like_python_binary_string_order(
    mongo_server: MongoHandle, db_name: str, opened: Callable[[str], MongoBackend],
) -> None:
    b = opened(kit_url(mongo_server, db_name))
    names = ["b", "B", "a.1", "a-1", "a_1", "A", "0day", "Zed"]
    for n in names:
        b.create(record(n), [])
    assert [r.location for r in b.read_all() if isinstance(r, LocationStatus)] == sorted(names)



def test_deviation_ttl_monitor_interval_is_a_runtime_server_parameter(
    mongo_server: MongoHandle, raw: MongoClient[dict[str, Any]], request: pytest.FixtureRequest,
) -> None:
    """MongoDB documents ``ttlMonitorSleepSecs`` as settable at runtime (``setParameter``);
    SecantusDB refuses it (code 72), and ignores ``[storage] ttl_sweep_seconds`` from its
    config file too, so TTL deletion there always waits for the 60 s sweep."""
    if mongo_server.kind == "secantusdb":
        request.applymarker(pytest.mark.xfail(strict=True, reason="SecantusDB: no ttlMonitorSleepSecs"))
    assert _lower_ttl_monitor_interval(raw, 60)  # 60 s is the default: changes nothing


def test_deviation_racing_upserts_by_find_and_modify_return_the_document(
    mongo_server: MongoHandle, db_name: str, request: pytest.FixtureRequest,
) -> None:
    """MongoDB: ``findAndModify`` with ``upsert: true, new: true`` returns the document it
    inserted or updated. SecantusDB returns null to some losers of a race of upserts on a
    new ``_id``, although their ``$inc`` was applied (the backend bumps again, see
    ``test_many_racing_creators_...``)."""
    if mongo_server.kind == "secantusdb":
        request.applymarker(pytest.mark.xfail(strict=True, reason="SecantusDB: null upsert result"))
    clients = [mongo_server.client(w="majority") for _ in range(4)]
    nulls = 0
    try:
        for key in range(100):
            barrier = threading.Barrier(len(clients))
            got: list[Any] = []

            def bump(c: MongoClient[dict[str, Any]], key: int = key,
                     barrier: threading.Barrier = barrier, got: list[Any] = got) -> None:
                barrier.wait()
                got.append(c[db_name]["counters"].find_one_and_update(
                    {"_id": key}, {"$inc": {"n": 1}}, upsert=True, return_document=ReturnDocument.AFTER,
                ))

            threads = [threading.Thread(target=bump, args=(c,)) for c in clients]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            nulls += sum(1 for g in got if g is None)
            if nulls:
                break
        final = clients[0][db_name]["counters"].find_one({"_id": key})
        assert final is not None and final["n"] == len(clients)  # every $inc applied
        assert nulls == 0, f"{nulls} upserting findAndModify calls returned null"
    finally:
        for c in clients:
            c.close()
