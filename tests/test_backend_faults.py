"""Every backend error inside a write is a LocstatusError (docs/design.md §4), on real faults:
a disk that fills up under SQLite (a real tmpfs), documents MongoDB cannot hold, a MongoDB
server frozen with SIGSTOP, and worker registrations too large for any backend.

Each scenario is the operator's: the call fails with an error naming what went wrong, nothing
is written, and once the fault is gone the same process carries on (no wedged transaction, no
dead heartbeat: the worker is live again).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from locstatus import (
    BackendFull,
    BackendUnavailable,
    InvalidInput,
    Manager,
    NotFound,
    State,
    VersionConflict,
    connect,
)
from locstatus.api import create_app
from locstatus.api.server import BackgroundServer
from locstatus.backends.base import CasItem
from locstatus.backends.mongo import MongoBackend
from locstatus.client import Client
from locstatus.models import HistoryEntry, LocationStatus, ServiceStatus, WorkerInfo

from support.fulldisk import SmallDisk
from support.kits import Kit
from support.kits_mongo import drop_database, fresh_database, kit_url
from support.servers import MongoHandle

SVC = "replication"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def eventually(check: Callable[[], Any], timeout: float = 15.0, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last: {value!r})")
        time.sleep(every)


def long_names(n: int, width: int = 110) -> list[str]:
    return [f"site-{i:06d}-".ljust(width, "x") for i in range(n)]


def lease_of(mgr: Manager, worker_id: str) -> datetime | None:
    return next(w.lease_expires_at for w in mgr.workers() if w.worker_id == worker_id)


# -- SQLite on a full disk -------------------------------------------------------------------


@pytest.fixture
def full_store(small_disk: SmallDisk) -> Iterator[tuple[Client, SmallDisk]]:
    db = small_disk.path / "locstatus.db"
    mgr = connect(f"sqlite:///{db}")
    try:
        mgr.sync_locations(["loc-a", "loc-b"])
        yield mgr, small_disk
    finally:
        small_disk.free()
        mgr.close()


def test_on_a_full_disk_writes_fail_naming_it_and_work_again_once_space_is_freed(
    full_store: tuple[Client, SmallDisk],
) -> None:
    """SQLite rolls a transaction back by itself on SQLITE_FULL; a second ROLLBACK used to
    raise a raw "cannot rollback - no transaction is active" that hid the real error."""
    mgr, disk = full_store
    mgr.pause("loc-b", SVC)
    before = {loc: (mgr.status(loc), mgr.history(loc)) for loc in ("loc-a", "loc-b")}
    disk.fill(sqlite_db=disk.path / "locstatus.db")
    calls: list[Callable[[], object]] = [
        lambda: mgr.pause("loc-a", SVC, reason="maintenance"),
        lambda: mgr.resume("loc-b", SVC),
        lambda: mgr.sync_locations(["loc-a", "loc-b", "loc-c"]),
    ]
    for call in calls:
        with pytest.raises(BackendFull, match="filesystem holding the database is full"):
            call()
    assert {loc: (mgr.status(loc), mgr.history(loc)) for loc in before} == before
    with pytest.raises(NotFound):
        mgr.status("loc-c")
    disk.free()  # the same manager, the same connections: nothing is left mid-transaction
    assert mgr.pause("loc-a", SVC).services[SVC].state is State.PAUSED
    assert mgr.resume("loc-b", SVC).services[SVC].state is State.RUNNING
    assert mgr.sync_locations(["loc-a", "loc-b", "loc-c"]).added == ["loc-c"]


def test_a_worker_renews_its_lease_again_once_a_full_disk_has_space(
    full_store: tuple[Client, SmallDisk],
) -> None:
    """The heartbeat meets BackendFull while the disk is full (the raw sqlite3 error once
    killed its thread, and the worker stayed dead after space was freed)."""
    mgr, disk = full_store
    agent = mgr.agent("w-1", services=[SVC], lease_seconds=3.0, heartbeat_interval=0.1).start()
    try:
        disk.fill(sqlite_db=disk.path / "locstatus.db")
        full_lease = lease_of(mgr, "w-1")
        time.sleep(0.5)  # five heartbeats fail
        assert lease_of(mgr, "w-1") == full_lease
        disk.free()
        freed = datetime.now(UTC)
        # renewed after the space came back (the lease before the fill ran out < freed + 2.5 s)
        eventually(lambda: (lease_of(mgr, "w-1") or freed) > freed + timedelta(seconds=2.9))
        status = mgr.pause("loc-a", SVC, wait=10)  # the worker applies and acknowledges it
        assert status.services[SVC].state is State.PAUSED
    finally:
        disk.free()
        agent.stop()


def test_the_sidecar_stays_ready_on_a_full_disk_and_says_its_writes_fail(
    full_store: tuple[Client, SmallDisk],
) -> None:
    """Reads work on a full disk, so ``/readyz`` kept saying ``ok`` while every write failed.
    It stays ready (200: a load balancer taking every sidecar of the store away would fail
    the reads too) but says ``degraded`` and why, and ``/metrics`` says it, until a write
    goes through again (docs/http.md "Operations")."""
    mgr, disk = full_store
    with BackgroundServer(create_app(mgr)) as srv, httpx.Client(
        base_url=srv.url, headers={"Content-Type": "application/json"}, timeout=30
    ) as http:
        assert http.get("/readyz").json() == {"status": "ok"}
        disk.fill(sqlite_db=disk.path / "locstatus.db")
        r = http.post(f"/v1/locations/loc-a/{SVC}/pause")
        assert r.status_code == 503 and r.json()["title"] == "backend full"
        ready = http.get("/readyz")
        assert ready.status_code == 200
        assert ready.json()["status"] == "degraded"
        assert ready.json()["writes"].startswith("failing: cannot write sqlite:///")
        assert "full" in ready.json()["writes"]
        assert _gauge(http, "locstatus_backend_full") == 1
        assert http.get("/v1/locations/loc-a").status_code == 200  # reads still served
        disk.free()
        assert http.post(f"/v1/locations/loc-a/{SVC}/pause").status_code == 200
        assert http.get("/readyz").json() == {"status": "ok"}
        assert _gauge(http, "locstatus_backend_full") == 0


def _gauge(http: httpx.Client, name: str) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


# -- MongoDB: documents the driver refuses to send -------------------------------------------


@pytest.fixture
def mongo(mongo_server: MongoHandle) -> Iterator[MongoBackend]:
    database = fresh_database()
    backend = MongoBackend(kit_url(mongo_server, database))
    try:
        yield backend
    finally:
        backend.close()
        drop_database(mongo_server, database)


def record(location: str, generation: int = 0) -> LocationStatus:
    return LocationStatus(location=location, services={SVC: ServiceStatus(generation=generation)})


def test_a_document_mongodb_cannot_hold_is_invalid_input_and_nothing_is_written(
    mongo: MongoBackend,
) -> None:
    """pymongo refuses such documents before sending them (``DocumentTooLarge``,
    ``InvalidDocument``, ``OverflowError``): not a driver error escaping raw."""
    big = HistoryEntry(op_id="op-big", at=T0, location="big", service=SVC, event="pause",
                       reason="r" * 17_000_000)
    with pytest.raises(InvalidInput, match=r"create of 'big': the document is too large for "
                       r"MongoDB .*16 MB\); nothing was written"):
        mongo.create(record("big"), [big])
    with pytest.raises(NotFound):
        mongo.read("big")
    nul = WorkerInfo(worker_id="w-nul", services=(SVC,), errors={"a\x00b/replication": "E"})
    with pytest.raises(InvalidInput, match=r"registration of worker 'w-nul': MongoDB cannot "
                       r"store the document \(InvalidDocument"):
        mongo.put_worker(nul)
    assert mongo.workers() == []
    v = mongo.create(record("gen"), []).version
    # The models refuse an integer no backend stores (models.MAX_STORED_INT); one built past
    # them (model_construct) is still mapped here, never a raw OverflowError.
    with pytest.raises(ValidationError):
        record("gen", generation=2**64)
    huge = record("gen").model_copy(
        update={"services": {SVC: ServiceStatus.model_construct(generation=2**64)}}
    )
    with pytest.raises(InvalidInput, match=r"compare-and-set of 'gen'.*OverflowError"):
        mongo.compare_and_set(huge, v, [])
    assert mongo.read("gen").version == v
    assert mongo.compare_and_set(record("gen", generation=1), v, []).version == v + 1


# -- MongoDB: the server frozen (SIGSTOP) ----------------------------------------------------


CALL_DEADLINE = 1.0
"""Seconds: the frozen-server tests' ``timeoutMS``, the deadline of one MongoDB backend call."""
SCHEDULING = 0.5
"""Seconds past a deadline for the raise to reach the caller (the thread woken, the error
mapped): the same allowance the 0.5 s steps of the driver's own waits make (docs/mongodb.md,
"Timeouts")."""


def test_with_the_mongodb_server_frozen_calls_fail_cleanly_and_the_worker_is_live_after(
    mongo_server: MongoHandle,
) -> None:
    """SIGSTOP keeps the server's sockets open while it answers nothing: a pause ends with a
    LocstatusError within the deadlines of its backend calls (``timeoutMS``, one per call,
    docs/mongodb.md "Timeouts"; six sequential attempts of 0.5 s each used to add up past 5 s
    on a loaded machine), and after SIGCONT the worker renews its lease and applies the next
    pause."""
    if not mongo_server.controllable:
        pytest.skip("LOCSTATUS_TEST_MONGO_URI names an external server: it cannot be frozen")
    database = fresh_database()
    url = kit_url(mongo_server, database, serverSelectionTimeoutMS="500",
                  socketTimeoutMS="500", connectTimeoutMS="500",
                  timeoutMS=str(int(CALL_DEADLINE * 1000)))
    mgr = connect(url)
    agent = None
    try:
        mgr.sync_locations(["loc-a"])
        agent = mgr.agent("w-1", services=[SVC], lease_seconds=6.0,
                          heartbeat_interval=0.2).start()
        mongo_server.pause()
        try:
            t0 = time.monotonic()
            with pytest.raises(BackendUnavailable):  # AmbiguousCommit is one too
                mgr.pause("loc-a", SVC, op_id="op-frozen")
            took = time.monotonic() - t0
            # Two backend calls at most, one deadline each: the clock's re-probe when one is
            # due (docs/time.md), then the read, which fails with nothing sent.
            assert took < 2 * CALL_DEADLINE + SCHEDULING, (
                f"{took:.2f}s: past two calls' deadlines of {CALL_DEADLINE} s (timeoutMS)")
        finally:
            mongo_server.resume()
        thawed = datetime.now(UTC)
        eventually(lambda: (lease_of(mgr, "w-1") or thawed) > thawed + timedelta(seconds=5))
        assert [e.op_id for e in mgr.history("loc-a")].count("op-frozen") <= 1  # never twice
        status = mgr.pause("loc-a", SVC, wait=10)
        assert status.services[SVC].state is State.PAUSED
        assert agent.is_paused("loc-a", SVC)
    finally:
        mongo_server.resume()
        if agent is not None:
            agent.stop()
        mgr.close()
        drop_database(mongo_server, database)


def test_every_write_call_to_a_frozen_mongodb_server_fails_within_its_one_deadline(
    mongo_server: MongoHandle,
) -> None:
    """One deadline per call (``timeoutMS``, docs/mongodb.md "Timeouts"): a write call against
    a server frozen by SIGSTOP ends with BackendUnavailable (AmbiguousCommit is one) within
    it, however many operations and driver retries it makes: before, each operation had its
    own timeout and a batch read back a lost answer three more times (4x the timeout and
    more). After SIGCONT nothing is half-written: every version of every record has its
    history write, every op_id at most once, no history lost, and each location takes the
    next write."""
    if not mongo_server.controllable:
        pytest.skip("LOCSTATUS_TEST_MONGO_URI names an external server: it cannot be frozen")
    database = fresh_database()
    url = kit_url(mongo_server, database, timeoutMS=str(int(CALL_DEADLINE * 1000)))
    backend = MongoBackend(url)
    try:
        stored = {loc: backend.create(record(loc), [entry(loc, f"op-born-{loc}")])
                  for loc in ("cas", "many-1", "many-2", "gone")}
        backend.put_worker(WorkerInfo(worker_id="w-1", services=(SVC,)))
        calls: dict[str, Callable[[], object]] = {
            "compare_and_set": lambda: backend.compare_and_set(
                record("cas", 1), stored["cas"].version, [entry("cas", "op-f-cas")]),
            "compare_and_set_many": lambda: backend.compare_and_set_many([
                CasItem(record(loc, 1), stored[loc].version, [entry(loc, f"op-f-{loc}")])
                for loc in ("many-1", "many-2")]),
            "create": lambda: backend.create(record("new"), [entry("new", "op-f-new")]),
            "create_many": lambda: backend.create_many([
                (record(loc), [entry(loc, f"op-f-{loc}")]) for loc in ("new-1", "new-2")]),
            "delete": lambda: backend.delete("gone", stored["gone"].version),
            "put_worker": lambda: backend.put_worker(
                WorkerInfo(worker_id="w-2", services=(SVC,))),
            "ack": lambda: backend.ack("w-1", "cas", SVC, 1),
        }
        took: dict[str, float] = {}
        mongo_server.pause()
        try:
            for name, call in calls.items():
                t0 = time.monotonic()
                try:
                    result = call()
                except BackendUnavailable:
                    pass
                else:  # a batch answers per item
                    assert isinstance(result, list), f"{name} answered a frozen server"
                    assert all(isinstance(r, BackendUnavailable) for r in result), (name, result)
                took[name] = time.monotonic() - t0
        finally:
            mongo_server.resume()
        late = {n: round(t, 2) for n, t in took.items() if t >= CALL_DEADLINE + SCHEDULING}
        assert not late, f"calls past their deadline of {CALL_DEADLINE} s: {late}"
        for loc in ("cas", "many-1", "many-2", "new", "new-1", "new-2", "gone"):
            for _ in range(10):  # a frozen call's request the thawed server applies late
                try:
                    rec = backend.read(loc)
                    backend.compare_and_set(record(loc, 7), rec.version,
                                            [entry(loc, f"op-n-{loc}")])
                    break
                except NotFound:
                    break  # a create or delete that landed, or not, whole
                except VersionConflict:
                    time.sleep(0.2)
            else:
                raise AssertionError(f"{loc}: no next write landed")
            try:
                rec = backend.read(loc)
            except NotFound:
                continue
            ops = [e.op_id for v in range(1, rec.version + 1)
                   for e in backend.history_write(loc, v)]
            assert all(backend.history_write(loc, v) for v in range(1, rec.version + 1)), loc
            assert len(ops) == len(set(ops)), f"{loc}: an op_id twice: {ops}"
            assert not backend.history_gaps(loc).lost, loc
    finally:
        mongo_server.resume()
        backend.close()
        drop_database(mongo_server, database)


def entry(location: str, op_id: str) -> HistoryEntry:
    return HistoryEntry(op_id=op_id, at=T0, location=location, service=SVC, event="pause")


# -- every backend: a registration too large for any of them ---------------------------------


def test_an_agent_whose_location_filter_cannot_be_registered_refuses_to_start(kit: Kit) -> None:
    """150 000 names do not fit one registration on any backend (ZooKeeper refused them,
    MongoDB raised pymongo's DocumentTooLarge, SQLite and memory stored 17 MB): a clear
    InvalidInput from ``start()``, nothing registered, the store and other workers fine."""
    mgr = Client(kit.open())
    mgr.sync_locations(["loc-a"])
    wide = mgr.agent("w-wide", services=[SVC], locations=long_names(150_000))
    with pytest.raises(InvalidInput, match=r"worker 'w-wide': registration of \d+ bytes \(its "
                       r"location filter holds 150000 names\) exceeds the limit"):
        wide.start()
    assert mgr.workers() == []
    ok = mgr.agent("w-ok", services=[SVC], locations=["loc-a"], lease_seconds=3.0).start()
    try:
        assert mgr.pause("loc-a", SVC, wait=10).services[SVC].state is State.PAUSED
        assert ok.is_paused("loc-a", SVC)
    finally:
        ok.stop()
