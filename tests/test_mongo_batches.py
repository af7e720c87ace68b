"""Batches on MongoDB (docs/mongodb.md, "Batches"): ``compare_and_set_many`` as one unordered
``bulk_write`` of version-guarded updates plus one history insert, ``create_many`` as unordered
inserts, on the suite's MongoDB-wire server over TCP. Faults are real: a connection cut around
the bulk command by a relay that reads the wire protocol (``support.mongo_relay``), a
write-concern error and per-item write errors from the server itself.

The contract suite (``tests/test_backend_contract.py``, "batches") already holds every backend,
MongoDB included, to invariant 12; here: that MongoDB really sends one bulk (and not one
``findAndModify`` per location), and that what a lost answer leaves unknown is read back, each
write landing exactly once with its history.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from pymongo import MongoClient, monitoring
from pymongo.errors import OperationFailure

from locstatus.backends.base import CasItem, CasResult
from locstatus.backends.mongo import MongoBackend
from locstatus.errors import AlreadyExists, BackendUnavailable, InvalidInput, VersionConflict
from locstatus.manager import Manager, Operation
from locstatus.models import HistoryEntry, LocationStatus, ServiceStatus, State

from support.kits_mongo import COLLECTION, fresh_database, kit_url
from support.mongo_relay import CutMode, MongoRelay
from support.opened import backends_opened, open_mongo
from support.servers import MongoHandle, SecantusMongo

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def record(location: str, state: State = State.RUNNING, generation: int = 0) -> LocationStatus:
    return LocationStatus(
        location=location,
        services={"replication": ServiceStatus(state=state, generation=generation, updated_at=T0)},
    )


def entry(location: str, op_id: str, event: str = "pause") -> HistoryEntry:
    return HistoryEntry(op_id=op_id, at=T0, location=location, service="replication", event=event)


class Commands(monitoring.CommandListener):
    """The commands sent to one database while ``database`` is set."""

    def __init__(self) -> None:
        self.database: str | None = None
        self.seen: list[tuple[str, Any]] = []
        self._lock = threading.Lock()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if self.database is not None and event.database_name == self.database:
            with self._lock:
                self.seen.append((event.command_name, event.command.get(event.command_name)))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass

    def names(self) -> list[tuple[str, Any]]:
        with self._lock:
            return list(self.seen)


_COMMANDS = Commands()
monitoring.register(_COMMANDS)


@pytest.fixture
def commands() -> Iterator[Commands]:
    yield _COMMANDS
    _COMMANDS.database = None
    _COMMANDS.seen.clear()


@pytest.fixture
def opened() -> Iterator[Callable[[str], MongoBackend]]:
    with backends_opened(open_mongo) as open_:
        yield open_


@pytest.fixture
def raw(mongo_server: MongoHandle) -> Iterator[MongoClient[dict[str, Any]]]:
    client = mongo_server.client()
    yield client
    client.close()


def created(b: MongoBackend, names: list[str]) -> dict[str, int]:
    results = b.create_many([(record(n), [entry(n, "op-create", "create")]) for n in names])
    assert all(isinstance(r, LocationStatus) for r in results), results
    return {r.location: r.version for r in results if isinstance(r, LocationStatus)}


def pause_items(versions: dict[str, int], op_id: str) -> list[CasItem]:
    return [CasItem(record(n, State.PAUSING, 1), v, [entry(n, op_id)]) for n, v in versions.items()]


def assert_history_once(
    raw: MongoClient[dict[str, Any]], database: str, b: MongoBackend, versions: dict[str, int],
    op_id: str,
) -> None:
    """Every location at its version + 1, that write in the history collection exactly once,
    the chain whole, and ``op_id`` in its history exactly once."""
    coll = raw[database][f"{COLLECTION}_history"]
    for n, v in versions.items():
        assert b.read(n).version == v + 1
        assert coll.count_documents({"location": n, "version": v + 1}) == 1, n
        assert not b.history_gaps(n), n
        assert [e.op_id for e in b.history(n, limit=100)].count(op_id) == 1, n


# -- the shape of a batch ----------------------------------------------------------------------


def test_a_batch_is_one_bulk_write_and_one_history_insert_and_a_stale_item_conflicts_alone(
    mongo_server: MongoHandle, opened: Callable[[str], MongoBackend], commands: Commands,
    raw: MongoClient[dict[str, Any]],
) -> None:
    database = fresh_database()
    b = opened(kit_url(mongo_server, database))
    names = [f"fleet-{i:03d}" for i in range(120)]
    versions = created(b, names)
    stale = names[57]
    b.compare_and_set(record(stale, State.PAUSING, 7), versions[stale], [entry(stale, "op-other")])
    before = (b.read(stale), b.history(stale, limit=100))
    commands.database = database
    results = b.compare_and_set_many(pause_items(versions, "op-bulk"))
    sent = commands.names()
    assert ("update", COLLECTION) in sent and ("findAndModify", COLLECTION) not in sent
    assert sent.count(("update", COLLECTION)) == 1  # one round: the stale item is not resent
    assert sent.count(("insert", f"{COLLECTION}_history")) == 1
    for n, result in zip(names, results, strict=True):
        if n == stale:
            assert isinstance(result, VersionConflict), result
        else:
            assert isinstance(result, LocationStatus) and result.version == versions[n] + 1
    assert (b.read(stale), b.history(stale, limit=100)) == before
    del versions[stale]
    assert_history_once(raw, database, b, versions, "op-bulk")


def test_a_batch_of_creates_is_unordered_inserts_and_a_duplicate_is_that_locations_alone(
    mongo_server: MongoHandle, opened: Callable[[str], MongoBackend], commands: Commands,
    raw: MongoClient[dict[str, Any]],
) -> None:
    database = fresh_database()
    b = opened(kit_url(mongo_server, database))
    earlier = b.create(record("earlier"), [])
    # a record stored by hand, with no creation counter: only the insert's duplicate key tells
    raw[database][COLLECTION].insert_one({"_id": "by-hand", "version": 5, "services": {}})
    names = ["new-1", "earlier", "new-2", "by-hand", "new-3"]
    commands.database = database
    results = b.create_many([(record(n), [entry(n, f"op-{n}", "create")]) for n in names])
    sent = commands.names()
    assert sent.count(("insert", COLLECTION)) == 1 and ("findAndModify", COLLECTION) not in sent
    outcome = dict(zip(names, results, strict=True))
    assert isinstance(outcome["by-hand"], AlreadyExists)
    assert isinstance(outcome["earlier"], AlreadyExists)  # it had a counter: went alone
    assert b.read("earlier") == earlier
    for n in ("new-1", "new-2", "new-3"):
        got = outcome[n]
        assert isinstance(got, LocationStatus) and b.read(n) == got
        assert [e.op_id for e in b.history(n)] == [f"op-{n}"]
        assert not b.history_gaps(n)


def test_a_write_error_of_one_item_fails_only_that_item(
    mongo_server: MongoHandle, opened: Callable[[str], MongoBackend],
    raw: MongoClient[dict[str, Any]],
) -> None:
    database = fresh_database()
    b = opened(kit_url(mongo_server, database))
    versions = created(b, [f"w-{i}" for i in range(6)])
    # the filter matches, the $push cannot apply: a write error naming that one index
    raw[database][COLLECTION].update_one({"_id": "w-2"}, {"$set": {"recent_history": "x"}})
    results = dict(zip(versions, b.compare_and_set_many(pause_items(versions, "op-w")),
                       strict=True))
    assert isinstance(results["w-2"], BackendUnavailable), results["w-2"]
    assert "compare-and-set of 'w-2'" in str(results["w-2"])
    assert raw[database][COLLECTION].find_one({"_id": "w-2"})["version"] == versions["w-2"]
    del versions["w-2"]
    assert all(isinstance(results[n], LocationStatus) for n in versions)
    assert_history_once(raw, database, b, versions, "op-w")


def test_a_document_too_large_for_mongodb_fails_only_its_own_item(
    mongo_server: MongoHandle, opened: Callable[[str], MongoBackend],
    raw: MongoClient[dict[str, Any]],
) -> None:
    """The driver refuses a batch holding a document over 16 MB before sending that part:
    the other items are read back and written, the large one is InvalidInput, not stored."""
    database = fresh_database()
    b = opened(kit_url(mongo_server, database))
    big = HistoryEntry(op_id="op-big", at=T0, location="big", service="replication",
                       event="pause", reason="r" * 17_000_000)
    names = ["c-1", "big", "c-2"]
    results = b.create_many([(record(n), [big if n == "big" else entry(n, "op-c", "create")])
                             for n in names])
    assert isinstance(results[1], InvalidInput) and "16 MB" in str(results[1])
    assert raw[database][COLLECTION].find_one({"_id": "big"}) is None
    versions = {n: r.version for n, r in zip(names, results, strict=True)
                if isinstance(r, LocationStatus)}
    assert sorted(versions) == ["c-1", "c-2"]
    b.create(record("big"), [])
    versions_all = {**versions, "big": b.read("big").version}
    items = [CasItem(record(n, State.PAUSING, 1), v, [big if n == "big" else entry(n, "op-p")])
             for n, v in versions_all.items()]
    got = dict(zip(versions_all, b.compare_and_set_many(items), strict=True))
    assert isinstance(got["big"], InvalidInput) and b.read("big").version == versions_all["big"]
    assert_history_once(raw, database, b, versions, "op-p")


def test_a_document_bson_cannot_encode_fails_only_its_own_item(
    mongo_server: MongoHandle, opened: Callable[[str], MongoBackend],
    raw: MongoClient[dict[str, Any]],
) -> None:
    """An integer beyond BSON's 8 bytes (a record built past the models' bounds) makes the
    driver refuse the whole batch while encoding it: what may have been sent is read back,
    the rest goes alone, and only that item is InvalidInput."""
    database = fresh_database()
    b = opened(kit_url(mongo_server, database))
    huge = record("huge").model_copy(update={
        "services": {"replication": ServiceStatus.model_construct(generation=2**64)}
    })
    names = ["h-1", "huge", "h-2"]
    results = b.create_many([(huge if n == "huge" else record(n), [entry(n, "op-h", "create")])
                             for n in names])
    assert isinstance(results[1], InvalidInput), results[1]
    assert raw[database][COLLECTION].find_one({"_id": "huge"}) is None
    versions = {n: r.version for n, r in zip(names, results, strict=True)
                if isinstance(r, LocationStatus)}
    assert sorted(versions) == ["h-1", "h-2"]
    versions["huge"] = b.create(record("huge"), []).version
    items = [CasItem(huge if n == "huge" else record(n, State.PAUSING, 1), v, [entry(n, "op-q")])
             for n, v in versions.items()]
    got = dict(zip(versions, b.compare_and_set_many(items), strict=True))
    assert isinstance(got["huge"], InvalidInput) and b.read("huge").version == versions["huge"]
    del versions["huge"]
    assert_history_once(raw, database, b, versions, "op-q")


def test_an_item_whose_history_copy_lags_is_caught_up_and_sent_again(
    mongo_server: MongoHandle, opened: Callable[[str], MongoBackend],
    raw: MongoClient[dict[str, Any]],
) -> None:
    database = fresh_database()
    b = opened(kit_url(mongo_server, database, recent_history="10"))
    versions = created(b, ["lag", "fine"])
    v = versions["lag"]
    for k in range(4):  # four writes the history collection never got (a writer that died)
        raw[database][COLLECTION].update_one({"_id": "lag"}, {
            "$inc": {"version": 1},
            "$push": {"recent_history": {"version": v + k + 1, "entries": [
                entry("lag", f"op-lost-{k}").model_dump(mode="json") | {"version": v + k + 1}
            ]}},
        })
    versions["lag"] = v + 4
    assert b.history_gaps("lag").restorable == (v + 1, v + 2, v + 3, v + 4)
    results = b.compare_and_set_many(pause_items(versions, "op-lag"))
    assert all(isinstance(r, LocationStatus) for r in results), results
    assert_history_once(raw, database, b, versions, "op-lag")
    assert raw[database][COLLECTION].find_one({"_id": "lag"})["history_copied"] >= v + 4


def test_a_fleet_whose_copies_lag_half_a_window_is_caught_up_together_and_written(
    mongo_server: MongoHandle, opened: Callable[[str], MongoBackend], commands: Commands,
    raw: MongoClient[dict[str, Any]],
) -> None:
    """With ``recent_history=10`` a batch admits a write while the copy is at most 5 versions
    behind after it (a new record's copy is 1 behind: its watermark is the version before its
    first): the fifth batch is refused everywhere, the copies (whole) are caught up
    by one count and one bulk of the watermark, not a catch-up per location, and written."""
    database = fresh_database()
    b = opened(kit_url(mongo_server, database, recent_history="10"))
    versions = created(b, [f"lag-{i:02d}" for i in range(30)])
    first = dict(versions)
    for k in range(4):
        results = b.compare_and_set_many(pause_items(versions, f"op-{k}"))
        versions = {r.location: r.version for r in results if isinstance(r, LocationStatus)}
        assert len(versions) == 30
    commands.database = database
    results = b.compare_and_set_many(pause_items(versions, "op-5"))
    sent = commands.names()
    assert all(isinstance(r, LocationStatus) for r in results), results
    assert sent.count(("update", COLLECTION)) == 3  # refused, the watermark, written
    assert sent.count(("aggregate", f"{COLLECTION}_history")) == 1
    assert sent.count(("find", f"{COLLECTION}_history")) == 0  # no catch-up one by one
    assert_history_once(raw, database, b, versions, "op-5")
    for n, v in first.items():
        doc = raw[database][COLLECTION].find_one({"_id": n})
        assert doc["history_copied"] == v + 4 and doc["version"] == v + 5
        assert not b.history_gaps(n)


# -- lost answers --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["before", "after"])
def test_a_connection_cut_mid_bulk_is_read_back_and_every_write_lands_once(
    mongo_server: MongoHandle, opened: Callable[[str], MongoBackend],
    raw: MongoClient[dict[str, Any]], mode: CutMode,
) -> None:
    """The bulk command and the driver's first retry of it are both cut: dropped before the
    server sees them, or applied by the server and their answers dropped; the driver tries
    again within the chunk's deadline (docs/mongodb.md, "Timeouts"), and the batch reads back
    what its answer does not confirm. Either way each write ends landed exactly once, its
    history row once."""
    relay = MongoRelay("127.0.0.1", mongo_server.port)
    try:
        database = fresh_database()
        direct = opened(kit_url(mongo_server, database))
        versions = created(direct, [f"cut-{i:02d}" for i in range(40)])
        via = kit_url(mongo_server, database, directConnection="true")
        via = via.replace(f":{mongo_server.port}/", f":{relay.port}/", 1)
        b = opened(via)
        relay.cut_next("update", COLLECTION, mode, times=2)
        results = b.compare_and_set_many(pause_items(versions, "op-cut"))
        assert relay.cut == [mode, mode]
        assert all(isinstance(r, LocationStatus) for r in results), results
        assert_history_once(raw, database, direct, versions, "op-cut")
    finally:
        relay.close()


def test_a_bulk_pause_through_a_cut_connection_reports_every_location_changed_once(
    mongo_server: MongoHandle, opened: Callable[[str], MongoBackend],
    raw: MongoClient[dict[str, Any]],
) -> None:
    relay = MongoRelay("127.0.0.1", mongo_server.port)
    try:
        database = fresh_database()
        via = kit_url(mongo_server, database, directConnection="true")
        mgr = Manager(opened(via.replace(f":{mongo_server.port}/", f":{relay.port}/", 1)))
        names = [f"site-{i:02d}" for i in range(30)]
        mgr.sync_locations(names)
        relay.cut_next("update", COLLECTION, "after", times=2)
        report = mgr.bulk(Operation.pause("replication"), op_id="op-pause-all")
        assert relay.cut == ["after", "after"]
        assert report.ok and [i.location for i in report.of(report.items[0].outcome)] == names
        assert all(i.changed == ("replication",) for i in report.items)
        history = raw[database][f"{COLLECTION}_history"]
        for n in names:
            ops = [e.op_id for e in mgr.history(n, limit=100)]
            assert ops.count("op-pause-all") == 2, (n, ops)  # the pause and its settle, once
            assert not mgr.backend.history_gaps(n)
            assert history.count_documents({"location": n, "entries.op_id": "op-pause-all"}) == 2
    finally:
        relay.close()


def test_a_batch_whose_answers_are_lost_until_its_deadline_leaves_each_write_to_its_op_id(
    mongo_server: MongoHandle, opened: Callable[[str], MongoBackend],
    raw: MongoClient[dict[str, Any]],
) -> None:
    """The bulk's answers are lost until the chunk's deadline (``timeoutMS``, docs/mongodb.md
    "Timeouts": the driver retries the cut command as long as time is left, and no time is
    left to read the records back): each item is AmbiguousCommit, and the manager resolves
    each by the op_id at the version it would have written (docs/design.md §3.2), applying
    none twice. The landed writes' copies to the history collection are then restorable
    (embedded, as after a writer that died between its two writes) and restored once."""
    relay = MongoRelay("127.0.0.1", mongo_server.port)
    try:
        database = fresh_database()
        via = kit_url(mongo_server, database, directConnection="true", timeoutMS="1000")
        mgr = Manager(opened(via.replace(f":{mongo_server.port}/", f":{relay.port}/", 1)))
        names = [f"dark-{i:02d}" for i in range(20)]
        mgr.sync_locations(names)
        relay.cut_next("update", COLLECTION, "after", seconds=1.5)  # past the 1 s deadline
        report = mgr.bulk(Operation.pause("replication"), op_id="op-dark")
        assert len(relay.cut) >= 2 and set(relay.cut) == {"after"}
        assert mgr.stats["ambiguous"] == len(names)
        assert report.ok and all(i.changed == ("replication",) for i in report.items)
        history = raw[database][f"{COLLECTION}_history"]
        for n in names:
            assert [e.op_id for e in mgr.history(n, limit=100)].count("op-dark") == 2, n
            gaps = mgr.backend.history_gaps(n)
            assert gaps.lost == () and len(gaps.restorable) == 1, gaps  # the pause
            mgr.backend.restore_history(n)
            assert not mgr.backend.history_gaps(n)
        assert history.count_documents({"entries.op_id": "op-dark"}) == 2 * len(names)
    finally:
        relay.close()


def test_a_batch_whose_first_read_back_is_cut_resolves_it_in_the_backend(
    mongo_server: MongoHandle, opened: Callable[[str], MongoBackend],
    raw: MongoClient[dict[str, Any]],
) -> None:
    relay = MongoRelay("127.0.0.1", mongo_server.port)
    try:
        database = fresh_database()
        direct = opened(kit_url(mongo_server, database))
        versions = created(direct, [f"dim-{i:02d}" for i in range(20)])
        via = kit_url(mongo_server, database, directConnection="true")
        b = opened(via.replace(f":{mongo_server.port}/", f":{relay.port}/", 1))
        relay.cut_next("update", COLLECTION, "after", times=2)
        relay.cut_next("find", COLLECTION, "before", times=2)
        results = b.compare_and_set_many(pause_items(versions, "op-dim"))
        assert relay.cut == ["after", "after", "before", "before"]
        assert all(isinstance(r, LocationStatus) for r in results), results
        assert_history_once(raw, database, direct, versions, "op-dim")
    finally:
        relay.close()


@pytest.fixture(scope="module")
def failpoint_server(
    mongo_server: MongoHandle, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MongoHandle]:
    """A server that accepts ``configureFailPoint`` (as in tests/test_mongo_backend.py)."""
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


def test_a_write_concern_error_on_a_bulk_is_read_back_and_not_applied_twice(
    failpoint_server: MongoHandle, opened: Callable[[str], MongoBackend],
) -> None:
    database = fresh_database()
    b = opened(kit_url(failpoint_server, database, appname="ls-bulk-wce"))
    versions = created(b, [f"wce-{i:02d}" for i in range(25)])
    client = failpoint_server.client()
    try:
        client.admin.command(
            "configureFailPoint", "failCommand", mode={"times": 1},
            data={"failCommands": ["update"], "appName": "ls-bulk-wce",
                  "writeConcernError": {"code": 64, "codeName": "WriteConcernFailed",
                                        "errmsg": "waiting for replication timed out"}},
        )
        results: list[CasResult] = b.compare_and_set_many(pause_items(versions, "op-wce"))
        assert all(isinstance(r, LocationStatus) for r in results), results
        assert_history_once(client, database, b, versions, "op-wce")
    finally:
        client.admin.command("configureFailPoint", "failCommand", mode="off")
        client.close()
