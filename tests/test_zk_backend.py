"""ZooKeeper-specific behaviour of the ``zk://`` backend, on a real ZooKeeper (``kits_zk.py``).

The shared suites prove the contract; this file proves what only ZooKeeper has: the znode layout,
versions across delete-and-recreate, digest ACLs, the 1 MB node limit, names that would leave the
chroot, connection states (SUSPENDED writes, a real session expiry, a TCP connection cut in the
middle of a compare-and-set) and the URL. Faults come from a TCP proxy between the client and the
server (``kits_zk.TcpProxy``), so the server really sees a silent client and expires its session.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.protocol.states import Callback

from locstatus import Manager, connect
from locstatus.backends import open_backend
from locstatus.backends.base import CasItem
from locstatus.backends.zookeeper import (
    ZooKeeperBackend,
    join_version,
    parse_zk_url,
    split_version,
)
from locstatus.backends.zookeeper.freshness import EVENTS_WAIT
from locstatus.errors import (
    AmbiguousCommit,
    BackendUnavailable,
    CorruptRecord,
    InvalidInput,
    NotFound,
    VersionConflict,
)
from locstatus.models import Hint, HistoryEntry, LocationStatus, ServiceStatus, State, WorkerInfo

from support import corrupt_shapes as shapes
from support.fakeclock import FakeClock
from support.kits_zk import TcpProxy, ZkServer, raw_client, wait_until, zk_url
from support.opened import backends_opened
from support.servers import free_ports
from support.zk_round_trips import RoundTrips

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def record(location: str, state: State = State.RUNNING, generation: int = 0) -> LocationStatus:
    return LocationStatus(
        location=location,
        services={"replication": ServiceStatus(state=state, generation=generation, updated_at=T0)},
    )


def entry(location: str, op_id: str, event: str = "pause") -> HistoryEntry:
    return HistoryEntry(op_id=op_id, at=T0, location=location, service="replication", event=event)


def worker(worker_id: str, **kw: object) -> WorkerInfo:
    fields: dict[str, object] = {"services": ("replication",), "host": "h", "pid": 1, **kw}
    return WorkerInfo(worker_id=worker_id, **fields)


@pytest.fixture
def chroot() -> str:
    return zk_url("x").removeprefix("zk://x")


@pytest.fixture
def raw(zk_server: ZkServer) -> Iterator[KazooClient]:
    with raw_client(zk_server.hosts) as client:
        yield client


@pytest.fixture
def opened() -> Iterator[Callable[[str], ZooKeeperBackend]]:
    with backends_opened(ZooKeeperBackend) as open_:
        yield open_


@pytest.fixture
def backend(zk_server: ZkServer, chroot: str, opened: Callable[[str], ZooKeeperBackend]) -> ZooKeeperBackend:
    return opened(zk_url(zk_server.hosts, chroot))


@pytest.fixture
def proxy(zk_server: ZkServer) -> Iterator[TcpProxy]:
    p = TcpProxy(zk_server.hosts)
    yield p
    p.close()


def history_ops(b: ZooKeeperBackend, location: str) -> list[str]:
    return [e.op_id for e in b.history(location, limit=10_000)]


# -- URL ---------------------------------------------------------------------------------------


def test_url_names_hosts_chroot_credentials_and_timeouts() -> None:
    p = parse_zk_url("zk://ops:p%40ss@zk1:2181,zk2,[::1]:2182/team/locstatus?timeout=5&session_timeout=4")
    assert p.hosts == "zk1:2181,zk2:2181,[::1]:2182"
    assert p.chroot == "/team/locstatus"
    assert p.auth == ("ops", "p@ss")
    assert (p.timeout, p.session_timeout, p.world_read) == (5.0, 4.0, True)
    assert parse_zk_url("zk://127.0.0.1:2181").chroot == "/locstatus"
    assert parse_zk_url("zk://h/c?world_read=false&max_bytes=4096").world_read is False


@pytest.mark.parametrize(
    "url, message",
    [
        ("zk://h:2181/a/../b", "segment '..'"),
        ("zk://h:2181/zookeeper/x", "reserved"),
        ("zk://h:2181/a//b", "segment ''"),
        ("zk://h:2181/c?timeoutt=5", "unknown ZooKeeper URL parameter timeoutt"),
        ("zk://h:2181/c?timeout=soon", "invalid ZooKeeper URL parameter"),
        ("zk://h:2181/c?session_timeout=0.1", "session_timeout"),
        ("zk://h:99999/c", "bad host"),
        ("zk://h:21x81/c", "bad host"),
        ("zk://user@h/c", "user:password@"),
        ("mongodb://h/c", "expected zk://"),
    ],
)
def test_a_malformed_url_is_refused_naming_the_bad_part(url: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=message.replace("(", r"\(")):
        parse_zk_url(url)


def test_credentials_never_appear_in_url_errors() -> None:
    with pytest.raises(InvalidInput) as info:
        parse_zk_url("zk://ops:hunter2@h:1/c?nope=1")
    assert "hunter2" not in str(info.value)


def test_an_unreachable_ensemble_fails_fast_naming_the_hosts() -> None:
    port = free_ports(1)[0]
    start = time.monotonic()
    with pytest.raises(BackendUnavailable, match=f"127.0.0.1:{port}"):
        open_backend(f"zk://127.0.0.1:{port}/nowhere?timeout=1")
    assert time.monotonic() - start < 5


# -- layout and versions -----------------------------------------------------------------------


def test_layout_one_znode_per_location_history_per_write_ephemeral_workers_and_acks(
    backend: ZooKeeperBackend, raw: KazooClient, chroot: str
) -> None:
    v1 = backend.create(record("us-east-1"), [entry("us-east-1", "op-c", "create")]).version
    v2 = backend.compare_and_set(record("us-east-1", State.PAUSING, 1), v1, [entry("us-east-1", "op-p")]).version
    assert (v1, v2) == (1, 2)
    data, stat = raw.get(f"{chroot}/locations/us-east-1")
    payload = json.loads(data)
    assert payload["incarnation"] == 0 and payload["services"]["replication"]["state"] == "pausing"
    assert stat.version == 1  # znode version 1 is exposed version 2
    assert raw.exists(f"{chroot}/history/us-east-1").version == 1  # one create so far
    bucket = f"{chroot}/history/us-east-1/0000000000/b0000000"
    assert sorted(raw.get_children(bucket)) == ["0000000001", "0000000002"]
    written = json.loads(raw.get(f"{bucket}/0000000002")[0])
    assert [(e["op_id"], e["version"]) for e in written] == [("op-p", 2)]

    backend.put_worker(worker("w-1"))
    backend.ack("w-1", "us-east-1", "replication", 1)
    session = raw.exists(f"{chroot}/workers/w-1").ephemeralOwner
    assert session != 0
    assert raw.exists(f"{chroot}/acks/us-east-1/w-1").ephemeralOwner == session
    assert json.loads(raw.get(f"{chroot}/acks/us-east-1/w-1")[0]) == {"replication": 1}


def test_a_stale_version_of_a_recreated_location_fails_even_when_the_znode_version_matches(
    backend: ZooKeeperBackend, raw: KazooClient, chroot: str
) -> None:
    v = backend.create(record("phoenix"), [entry("phoenix", "op-1", "create")]).version
    for i in range(2):
        v = backend.compare_and_set(record("phoenix", State.PAUSING, i + 1), v, []).version
    stale = v  # znode version 2 of the first life
    old_czxid = raw.exists(f"{chroot}/locations/phoenix").czxid
    backend.delete("phoenix", v)
    reborn = backend.create(record("phoenix"), [entry("phoenix", "op-2", "create")])
    assert split_version(reborn.version) == (1, 1) and reborn.version > stale
    for _ in range(2):
        reborn = backend.compare_and_set(record("phoenix", State.PAUSED, 7), reborn.version, [])
    stat = raw.exists(f"{chroot}/locations/phoenix")
    assert stat.version == split_version(stale)[1] - 1  # the same znode version as the stale one
    assert stat.czxid > old_czxid  # a new znode: ZooKeeper's own view of the recreation
    with pytest.raises(VersionConflict, match="deleted and created again"):
        backend.compare_and_set(record("phoenix", State.RESUMING, 9), stale, [entry("phoenix", "op-stale")])
    assert backend.read("phoenix") == reborn
    assert history_ops(backend, "phoenix") == ["op-2"]
    # the first life's history is gone; the counter survives the purge
    assert raw.get_children(f"{chroot}/history/phoenix") == ["0000000001"]


def test_history_is_paged_in_buckets_and_pages_cross_them_without_gaps(
    backend: ZooKeeperBackend, raw: KazooClient, chroot: str
) -> None:
    v = backend.create(record("busy"), [entry("busy", "op-0", "create")]).version
    for i in range(1, 1006):
        v = backend.compare_and_set(record("busy", State.PAUSING, i), v, [entry("busy", f"op-{i}")]).version
    assert v == join_version(0, 1006)
    assert sorted(raw.get_children(f"{chroot}/history/busy/0000000000")) == ["b0000000", "b0000001"]
    assert len(raw.get_children(f"{chroot}/history/busy/0000000000/b0000000")) == 999
    page = backend.history("busy", limit=5, before_version=1002)
    assert [e.version for e in page] == [1001, 1000, 999, 998, 997]
    everything = backend.history("busy", limit=10_000)
    assert [e.version for e in everything] == list(range(1006, 0, -1))


# -- corrupt data and names that would leave the chroot ------------------------------------------


def test_corrupt_znode_data_is_named_never_rewritten_and_never_hides_the_others(
    backend: ZooKeeperBackend, raw: KazooClient, chroot: str
) -> None:
    backend.create(record("good"), [])
    bad = {
        "binary": b"\xff\xfe\x00 not text",
        "bad-incarnation": b'{"services": {}, "deleted_at": null, "incarnation": "two"}',
        "bad-service": b'{"services": {"replication": {"state": "melted"}}, "deleted_at": null}',
    }
    for name, data in bad.items():
        raw.create(f"{chroot}/locations/{name}", data)
        with pytest.raises(CorruptRecord, match=name):
            backend.read(name)
    everything = backend.read_all()
    assert [r.location for r in everything if isinstance(r, LocationStatus)] == ["good"]
    assert sorted(r.location for r in everything if isinstance(r, CorruptRecord)) == sorted(bad)
    for name, data in bad.items():
        assert raw.get(f"{chroot}/locations/{name}")[0] == data  # reported, never rewritten


def test_a_record_written_by_hand_is_readable_but_not_writable_without_its_incarnation_node(
    backend: ZooKeeperBackend, raw: KazooClient, chroot: str
) -> None:
    raw.create(f"{chroot}/locations/by-hand", shapes.GOOD.encode())
    rec = backend.read("by-hand")
    assert rec.version == 1
    with pytest.raises(CorruptRecord, match=r"incarnation node .* is missing"):
        backend.compare_and_set(record("by-hand", State.PAUSING, 1), rec.version, [])


def test_a_corrupt_history_node_is_named(backend: ZooKeeperBackend, raw: KazooClient, chroot: str) -> None:
    backend.create(record("h"), [entry("h", "op-c", "create")])
    raw.set(f"{chroot}/history/h/0000000000/b0000000/0000000001", b"[{]")
    with pytest.raises(CorruptRecord, match=r"'h'.*history"):
        backend.history("h")


def test_an_unreadable_ack_counts_as_no_ack(backend: ZooKeeperBackend, raw: KazooClient, chroot: str) -> None:
    backend.create(record("loc", State.PAUSED, 3), [])
    backend.ack("w-1", "loc", "replication", 3)
    backend.ack("w-2", "loc", "replication", 3)
    raw.set(f"{chroot}/acks/loc/w-2", b"three")
    assert backend.acks("loc") == {"w-1": {"replication": 3}}


@pytest.mark.parametrize("name", ["..", ".", "../outside", "a/b", "/abs", "", "x" * 200, "é", "a\x00b"])
def test_a_name_that_would_leave_the_chroot_is_refused_before_any_request(
    backend: ZooKeeperBackend, raw: KazooClient, name: str
) -> None:
    before = sorted(raw.get_children("/"))
    calls: list[Callable[[], object]] = [
        lambda: backend.read(name),
        lambda: backend.history(name),
        lambda: backend.delete(name, 1),
        lambda: backend.acks(name),
        lambda: backend.ack("w-1", name, "replication", 1),
        lambda: backend.ack(name, "loc", "replication", 1),
        lambda: backend.remove_worker(name),
    ]
    for call in calls:
        with pytest.raises(InvalidInput, match=r"invalid (location name|worker id)"):
            call()
    assert sorted(raw.get_children("/")) == before


# -- node size limit ---------------------------------------------------------------------------


def test_a_record_over_the_node_size_limit_is_refused_and_nothing_is_written(
    backend: ZooKeeperBackend,
) -> None:
    v = backend.create(record("big"), []).version
    huge = LocationStatus(
        location="big",
        services={f"s{i:04d}": ServiceStatus(reason="x" * 1000) for i in range(1100)},
    )
    with pytest.raises(InvalidInput, match=r"of \d+ bytes exceeds the ZooKeeper node limit of 1000000"):
        backend.compare_and_set(huge, v, [entry("big", "op-huge")])
    assert backend.read("big").version == v
    assert "op-huge" not in history_ops(backend, "big")
    backend.compare_and_set(record("big", State.PAUSING, 1), v, [])  # the session is fine


def test_the_size_limit_can_be_lowered_and_also_guards_create(
    zk_server: ZkServer, chroot: str, opened: Callable[[str], ZooKeeperBackend]
) -> None:
    small = opened(zk_url(zk_server.hosts, chroot, max_bytes=2048))
    wide = LocationStatus(
        location="wide", services={f"s{i}": ServiceStatus(reason="r" * 200) for i in range(20)}
    )
    with pytest.raises(InvalidInput, match="exceeds the ZooKeeper node limit of 2048"):
        small.create(wide, [])
    with pytest.raises(NotFound):
        small.read("wide")


def test_a_worker_with_too_many_handler_errors_still_registers_with_the_errors_cut(
    backend: ZooKeeperBackend,
) -> None:
    errors = {f"loc-{i}/replication": "E" * 900 for i in range(2000)}  # ~1.9 MB
    backend.put_worker(worker("w-noisy", errors=errors))
    (listed,) = backend.workers()
    assert 0 < len(listed.errors) < len(errors)
    assert "more errors not shown" in listed.errors["..."]


# -- ACLs --------------------------------------------------------------------------------------


def test_a_digest_acl_keeps_other_tenants_from_writing(
    zk_server: ZkServer, chroot: str, raw: KazooClient, opened: Callable[[str], ZooKeeperBackend]
) -> None:
    host = zk_server.hosts
    owner = opened(f"zk://ops:s3cret@{host}{chroot}")
    v = owner.create(record("guarded"), []).version
    path = f"{chroot}/locations/guarded"
    raw.get(path)  # world-readable by default
    with pytest.raises(NoAuthError):
        raw.set(path, b"{}")
    with pytest.raises(NoAuthError):
        raw.create(f"{chroot}/locations/intruder", b"{}")
    with pytest.raises(NoAuthError):
        raw.delete(path)
    for url in (f"zk://{host}{chroot}", f"zk://ops:wrong@{host}{chroot}"):
        other = opened(url)
        assert other.read("guarded").version == v
        with pytest.raises(BackendUnavailable, match=r"digest ACL.*credentials"):
            other.compare_and_set(record("guarded", State.PAUSING, 1), v, [entry("guarded", "op-x")])
    assert owner.read("guarded").version == v
    assert history_ops(owner, "guarded") == []


def test_credentials_from_the_environment_and_no_world_read(
    zk_server: ZkServer, chroot: str, raw: KazooClient, opened: Callable[[str], ZooKeeperBackend],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOCSTATUS_ZK_AUTH", "ops:s3cret")
    owner = opened(zk_url(zk_server.hosts, chroot, world_read="false"))
    owner.create(record("private"), [])
    with pytest.raises(NoAuthError):
        raw.get(f"{chroot}/locations/private")
    assert owner.read("private").location == "private"


# -- workers and acks --------------------------------------------------------------------------


def test_a_restarted_worker_takes_over_its_registration_from_the_old_session(
    zk_server: ZkServer, chroot: str, raw: KazooClient, opened: Callable[[str], ZooKeeperBackend]
) -> None:
    url = zk_url(zk_server.hosts, chroot)
    old, new = opened(url), opened(url)
    old.put_worker(worker("w-1", host="old"))
    first = raw.exists(f"{chroot}/workers/w-1").ephemeralOwner
    new.put_worker(worker("w-1", host="new"))
    assert raw.exists(f"{chroot}/workers/w-1").ephemeralOwner not in (0, first)
    old.close()  # the old session ends: the new registration stays
    assert [(w.worker_id, w.host) for w in new.workers()] == [("w-1", "new")]


def test_an_ack_written_again_by_a_restarted_worker_outlives_the_old_session(
    zk_server: ZkServer, chroot: str, raw: KazooClient, opened: Callable[[str], ZooKeeperBackend]
) -> None:
    url = zk_url(zk_server.hosts, chroot)
    old, new = opened(url), opened(url)
    both = record("loc", State.PAUSED, 4)
    old.create(both.model_copy(update={"services": {
        **both.services, "lifecycle": ServiceStatus(state=State.PAUSED, generation=3, updated_at=T0),
    }}), [])
    old.ack("w-1", "loc", "replication", 3)
    old.ack("w-1", "loc", "lifecycle", 3)
    new.ack("w-1", "loc", "replication", 4)
    old.close()  # the old session ends; its ephemerals go with it
    assert new.acks("loc") == {"w-1": {"replication": 4, "lifecycle": 3}}
    assert raw.exists(f"{chroot}/acks/loc/w-1").ephemeralOwner not in (0, None)


def test_removing_a_worker_from_another_process_drops_its_registration_and_acks(
    zk_server: ZkServer, chroot: str, opened: Callable[[str], ZooKeeperBackend]
) -> None:
    url = zk_url(zk_server.hosts, chroot)
    w, checker = opened(url), opened(url)
    for loc in ("a", "b"):
        w.create(record(loc, State.PAUSED, 2), [])
    w.put_worker(worker("w-1"))
    w.ack("w-1", "a", "replication", 1)
    w.ack("w-1", "b", "replication", 2)
    checker.remove_worker("w-1")
    assert checker.workers() == [] and checker.all_acks() == {}
    assert w.acks("a") == {} and w.acks("b") == {}


def test_an_ack_for_a_purged_location_is_refused(backend: ZooKeeperBackend, raw: KazooClient, chroot: str) -> None:
    v = backend.create(record("gone"), []).version
    backend.delete("gone", v)
    with pytest.raises(VersionConflict, match="does not exist"):  # contract invariant 13
        backend.ack("w-1", "gone", "replication", 0)
    assert backend.acks("gone") == {}
    assert raw.exists(f"{chroot}/acks/gone") is None
    again = backend.create(record("gone"), [])
    assert backend.acks("gone") == {}  # nothing of the earlier life leaks into the new one
    assert split_version(again.version)[0] == 1


def test_hints_for_locations_acks_and_workers_arrive_from_watches(
    zk_server: ZkServer, chroot: str, opened: Callable[[str], ZooKeeperBackend]
) -> None:
    url = zk_url(zk_server.hosts, chroot)
    writer, watcher = opened(url), opened(url)
    v = writer.create(record("w-loc"), []).version
    got: list[Hint] = []

    def seen(kind: str, location: str | None = None) -> bool:
        return any(h.kind == kind and h.location == location for h in got)

    unsubscribe = watcher.subscribe(got.append)  # returns once the watches are armed
    writer.compare_and_set(record("w-loc", State.PAUSING, 1), v, [])
    wait_until(lambda: seen("location", "w-loc"), 10, what="location hint")
    # The watch is set again by reading the record: the hint carries it, no read needed.
    (carried,) = [h.record for h in got if h.location == "w-loc" and h.record is not None]
    assert carried.version == v + 1
    assert carried.services["replication"].state is State.PAUSING
    writer.create(record("new-loc", State.PAUSED, 1), [])
    wait_until(lambda: seen("location", "new-loc"), 10, what="new location")
    writer.put_worker(worker("w-1"))
    wait_until(lambda: seen("workers"), 10, what="workers hint")
    writer.ack("w-1", "new-loc", "replication", 1)  # watched since it appeared
    wait_until(lambda: seen("acks", "new-loc"), 10, what="acks hint")
    unsubscribe()


def test_hints_of_quick_successive_writes_carry_records_in_order_ending_with_the_last(
    zk_server: ZkServer, chroot: str, opened: Callable[[str], ZooKeeperBackend]
) -> None:
    """The read a changed location's hint carries is sent from kazoo's callback as its watch
    fires, before the watcher thread takes the event (locstatus/backends/zookeeper/watcher.py):
    under writes that follow each other faster than the watcher's rounds, no hint carries an
    older record than one before it, the last carried record is the last write, and the watch
    stays set (a write after a quiet moment is hinted too)."""
    url = zk_url(zk_server.hosts, chroot)
    writer, watcher = opened(url), opened(url)
    v = writer.create(record("q-loc"), []).version
    got: list[Hint] = []
    watcher.subscribe(got.append, kinds=("location", "resync"))

    def carried() -> list[int]:
        return [h.record.version for h in list(got)
                if h.location == "q-loc" and h.record is not None]

    for i in range(40):
        state = State.PAUSING if i % 2 == 0 else State.RUNNING
        v = writer.compare_and_set(record("q-loc", state, i + 1), v, []).version
    wait_until(lambda: v in carried(), 10, what="a hint carrying the last write")
    versions = carried()
    assert versions == sorted(versions), versions
    assert not [h for h in got if h.kind == "resync"]
    time.sleep(0.3)
    v = writer.compare_and_set(record("q-loc", State.PAUSED, 99), v, []).version
    wait_until(lambda: v in carried(), 10, what="a hint after a quiet moment")


def test_a_backend_nobody_subscribes_to_any_more_stops_reading_changed_locations(
    zk_server: ZkServer, chroot: str, opened: Callable[[str], ZooKeeperBackend],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once its last subscriber left, a backend's location watches die out: the read it sends
    as a watch fires (which sets that watch again) is sent only while its watches are armed,
    so further writes of the location cost it nothing."""
    url = zk_url(zk_server.hosts, chroot)
    writer, watcher = opened(url), opened(url)
    v = writer.create(record("u-loc"), []).version
    got: list[Hint] = []
    unsubscribe = watcher.subscribe(got.append, kinds=("location", "resync"))
    v = writer.compare_and_set(record("u-loc", State.PAUSING, 1), v, []).version
    wait_until(lambda: any(h.record is not None and h.record.version == v for h in got), 10,
               what="the hint of a subscribed backend")
    unsubscribe()
    v = writer.compare_and_set(record("u-loc", State.RUNNING, 2), v, []).version  # disarms
    time.sleep(0.5)
    kazoo = watcher._client.kazoo  # the requests this backend sends
    reads: list[str] = []
    get_async = kazoo.get_async

    def counted(path: str, *a: object, **kw: object) -> object:
        reads.append(path)
        return get_async(path, *a, **kw)

    monkeypatch.setattr(kazoo, "get_async", counted)
    for i in range(5):
        state = State.PAUSING if i % 2 == 0 else State.RUNNING
        v = writer.compare_and_set(record("u-loc", state, 3 + i), v, []).version
        time.sleep(0.05)
    time.sleep(0.3)
    assert [p for p in reads if p.endswith("/locations/u-loc")] == []


def test_acknowledgements_are_watched_only_for_subscribers_that_want_them(
    zk_server: ZkServer, chroot: str, opened: Callable[[str], ZooKeeperBackend]
) -> None:
    """An agent subscribes without ``acks`` (every worker's acknowledgement would wake every
    worker); a ``wait=`` in the same process subscribes with them later and gets them."""
    url = zk_url(zk_server.hosts, chroot)
    writer, watcher = opened(url), opened(url)
    v = writer.create(record("k-loc", State.PAUSED, 1), []).version
    quiet: list[Hint] = []
    watcher.subscribe(quiet.append, kinds=("location", "workers", "resync"))
    writer.ack("w-1", "k-loc", "replication", 1)
    writer.compare_and_set(record("k-loc", State.PAUSING, 1), v, [])
    wait_until(lambda: any(h.kind == "location" for h in quiet), 10, what="location hint")
    time.sleep(0.3)
    assert not [h for h in quiet if h.kind == "acks"]
    loud: list[Hint] = []
    watcher.subscribe(loud.append)  # returns once the acknowledgement nodes are watched too
    writer.ack("w-2", "k-loc", "replication", 1)
    wait_until(lambda: any(h.kind == "acks" and h.location == "k-loc" for h in loud), 10,
               what="acks hint for the subscriber that wants them")
    assert not [h for h in quiet if h.kind == "acks"]  # still filtered for the first one


# -- connection states -------------------------------------------------------------------------


def test_while_disconnected_a_write_fails_at_once_cleanly_and_is_never_sent_later(
    proxy: TcpProxy, chroot: str, opened: Callable[[str], ZooKeeperBackend]
) -> None:
    """While the connection is known down a write is not queued, nor does it wait out the
    10 s ``timeout``: it fails within a second (DOWN_GRACE after the drop; issue 20)."""
    b = opened(zk_url(proxy.hosts, chroot, timeout=10, session_timeout=20))
    v = b.create(record("s"), []).version
    proxy.freeze()
    wait_until(lambda: _unreachable(b), 10, what="the client to notice the partition")
    start = time.monotonic()
    with pytest.raises(BackendUnavailable, match="nothing was written"):
        b.compare_and_set(record("s", State.PAUSING, 1), v, [entry("s", "op-suspended")])
    assert time.monotonic() - start < 1.0
    proxy.thaw()
    wait_until(lambda: not _unreachable(b), 20, what="reconnection")
    time.sleep(0.5)
    assert b.read("s").version == v
    assert "op-suspended" not in history_ops(b, "s")


def test_a_short_partition_keeps_the_session_fails_writes_fast_and_hints_a_resync(
    proxy: TcpProxy, chroot: str, raw: KazooClient, opened: Callable[[str], ZooKeeperBackend]
) -> None:
    b = opened(zk_url(proxy.hosts, chroot, timeout=20, session_timeout=20))
    v = b.create(record("s"), []).version
    b.put_worker(worker("w-1"))
    owner = raw.exists(f"{chroot}/workers/w-1").ephemeralOwner
    got: list[Hint] = []
    b.subscribe(got.append)
    proxy.freeze()
    wait_until(lambda: _unreachable(b), 10, what="the client to notice the partition")
    with pytest.raises(BackendUnavailable, match="nothing was written"):  # known down: at once
        b.compare_and_set(record("s", State.PAUSING, 1), v, [entry("s", "op-down")])
    proxy.thaw()
    wait_until(lambda: not _unreachable(b), 20, what="reconnection")
    stored = b.compare_and_set(record("s", State.PAUSING, 1), v, [entry("s", "op-late")])
    assert stored.version == v + 1
    wait_until(lambda: Hint(kind="resync") in got, 10, what="a resync hint")
    assert raw.exists(f"{chroot}/workers/w-1").ephemeralOwner == owner  # same session
    assert history_ops(b, "s") == ["op-late"]


def _unreachable(b: ZooKeeperBackend) -> bool:
    try:
        b.ping()
    except BackendUnavailable:
        return True
    return False


def test_a_real_session_expiry_drops_ephemerals_the_backend_re_registers_and_says_so(
    proxy: TcpProxy, zk_server: ZkServer, chroot: str, raw: KazooClient,
    opened: Callable[[str], ZooKeeperBackend],
) -> None:
    """The registration comes back on the new session; the acknowledgements do not, from the
    backend: written back from its copy they raced the agent's newer ones and could put a
    generation back (a location then stayed pausing for good). The resync hint says
    session_lost, and agents acknowledge again (next test, and test_agent)."""
    b = opened(zk_url(proxy.hosts, chroot, timeout=20, session_timeout=2))
    b.create(record("loc", State.PAUSED, 4), [])
    b.put_worker(worker("w-1"))
    b.ack("w-1", "loc", "replication", 4)
    got: list[Hint] = []
    b.subscribe(got.append)
    owner = raw.exists(f"{chroot}/workers/w-1").ephemeralOwner
    proxy.freeze()
    wait_until(lambda: raw.exists(f"{chroot}/workers/w-1") is None, 30, what="the server to expire the session")
    assert raw.exists(f"{chroot}/acks/loc/w-1") is None
    proxy.thaw()
    wait_until(lambda: (raw.exists(f"{chroot}/workers/w-1") or _NO).ephemeralOwner not in (0, owner), 30,
               what="re-registration on a new session")
    wait_until(lambda: Hint(kind="resync", session_lost=True) in got, 10,
               what="a resync hint saying the session was lost")
    time.sleep(1.0)
    assert raw.exists(f"{chroot}/acks/loc/w-1") is None  # left to the agent
    b.ack("w-1", "loc", "replication", 4)  # what an agent does on that hint
    assert json.loads(raw.get(f"{chroot}/acks/loc/w-1")[0]) == {"replication": 4}
    got.clear()
    writer = opened(zk_url(zk_server.hosts, chroot))
    writer.compare_and_set(record("loc", State.PAUSING, 5), writer.read("loc").version, [])
    wait_until(lambda: any(h.kind == "location" and h.location == "loc" for h in got), 10,
               what="watches re-armed")


def test_a_standing_registration_survives_a_real_session_expiry_and_is_held_again(
    proxy: TcpProxy, zk_server: ZkServer, chroot: str, raw: KazooClient,
    opened: Callable[[str], ZooKeeperBackend],
) -> None:
    """docs/agent.md "Standing registrations": a persistent node, whose ephemeral ``holder``
    child goes with the session; listed ``away`` meanwhile (a pause waits for it), held again
    once the backend's new session re-registers it. Its acknowledgements were the session's."""
    b = opened(zk_url(proxy.hosts, chroot, timeout=20, session_timeout=2))
    b.create(record("loc", State.PAUSED, 2), [])
    b.put_worker(worker("w-s", standing=True))
    b.ack("w-s", "loc", "replication", 2)
    holder = f"{chroot}/workers/w-s/holder"
    owner = raw.exists(holder).ephemeralOwner
    reader = opened(zk_url(zk_server.hosts, chroot))
    proxy.freeze()
    wait_until(lambda: raw.exists(holder) is None, 30, what="the server to expire the session")
    node = raw.exists(f"{chroot}/workers/w-s")
    assert node is not None and node.ephemeralOwner == 0  # persistent: still there
    assert [(w.worker_id, w.standing, w.away) for w in reader.workers()] == [("w-s", True, True)]
    assert reader.acks("loc") == {}
    proxy.thaw()
    wait_until(lambda: (raw.exists(holder) or _NO).ephemeralOwner not in (0, owner), 30,
               what="the holder taken again on the new session")
    wait_until(lambda: [w.away for w in reader.workers()] == [False], 10,
               what="the reader to see it held again")
    assert reader.remove_worker("w-s") is False  # only a retirement ends it
    assert reader.remove_worker("w-s", retire=True) is False  # held again: present, kept
    assert b.remove_worker("w-s", retire=True) is True  # from its holder's own session
    assert raw.exists(f"{chroot}/workers/w-s") is None


class _NoStat:
    ephemeralOwner = 0


_NO = _NoStat()


def test_a_worker_whose_session_expires_re_registers_resyncs_and_loses_no_acknowledged_write(
    proxy: TcpProxy, zk_server: ZkServer, chroot: str, raw: KazooClient
) -> None:
    operator = connect(zk_url(zk_server.hosts, chroot))
    operator.sync_locations({"site-a": ["replication"]})
    wmgr = connect(zk_url(proxy.hosts, chroot, timeout=20, session_timeout=2))
    applied: list[tuple[str, int]] = []
    agent = wmgr.agent("w-1", services=["replication"], lease_seconds=30, resync_interval=120)

    @agent.on_pause("replication")
    def stop(location: str) -> None:
        applied.append(("pause", agent.applying.status.generation if agent.applying else -1))  # type: ignore[union-attr]

    @agent.on_resume("replication")
    def start(location: str) -> None:
        applied.append(("resume", agent.applying.status.generation if agent.applying else -1))  # type: ignore[union-attr]

    hints: list[Hint] = []
    wmgr.backend.subscribe(hints.append)
    agent.start()
    try:
        path = f"{chroot}/workers/w-1"
        owner = raw.exists(path).ephemeralOwner
        paused = operator.pause("site-a", "replication", op_id="op-pause", wait=20)
        assert paused.services["replication"].state is State.PAUSED  # the worker acked gen 1

        proxy.freeze()
        wait_until(lambda: raw.exists(path) is None, 30, what="the server to expire the worker's session")
        # The operator's process learns of it from its own watch, a moment after another
        # client may have: its workers list is a copy that watch drops (docs/zookeeper.md),
        # and ZooKeeper does not promise two clients the same view at the same instant. Under
        # load that moment was long enough for the resume below to see the worker still
        # registered and stay resuming.
        wait_until(lambda: all(w.worker_id != "w-1" for w in operator.workers()), 30,
                   what="the operator to see the worker's registration gone")
        # the worker is gone: the operator's resume settles at once, and is acknowledged to them
        resumed = operator.resume("site-a", "replication", op_id="op-resume")
        assert resumed.services["replication"].state is State.RUNNING
        assert agent.is_paused("site-a", "replication")  # cut off: still the old state

        proxy.thaw()
        wait_until(lambda: (raw.exists(path) or _NO).ephemeralOwner not in (0, owner), 30,
                   what="re-registration on a new session")
        wait_until(lambda: not agent.is_paused("site-a", "replication"), 30, what="the worker to resync")
        wait_until(lambda: operator.backend.acks("site-a").get("w-1", {}).get("replication") == 2, 30,
                   what="the worker to acknowledge generation 2")
        wait_until(lambda: Hint(kind="resync", session_lost=True) in hints, 10,
                   what="a resync hint saying the session was lost")
        assert applied[-1] == ("resume", 2)
        final = operator.status("site-a").services["replication"]
        assert (final.state, final.generation, final.op_id) == (State.RUNNING, 2, "op-resume")
        hist = list(reversed(operator.history("site-a", 100)))
        assert [(e.event, e.to_state) for e in hist] == [
            ("create", None),
            ("pause", State.PAUSING),
            ("settle", State.PAUSED),  # by the worker, once it had applied generation 1
            ("resume", State.RESUMING),
            ("settle", State.RUNNING),  # same write: no live worker while it was cut off
        ]
        assert [e.op_id for e in hist].count("op-pause") == 1
        assert [e.op_id for e in hist].count("op-resume") == 2
    finally:
        agent.stop()
        wmgr.close()
        operator.close()


def test_after_a_session_expiry_the_agent_acknowledges_again_what_it_applied(
    proxy: TcpProxy, zk_server: ZkServer, chroot: str, raw: KazooClient
) -> None:
    """A worker's acknowledgements live in its session; when the session expires they go, and
    the worker must put them back itself (the backend does not: see above), or a later
    pause of another service there would wait for it for good. It does so from the resync hint
    that says session_lost, against the records as they are, without running its handlers
    again."""
    operator = connect(zk_url(zk_server.hosts, chroot))
    operator.sync_locations({"site-a": ["replication"], "site-b": ["replication"]})
    wmgr = connect(zk_url(proxy.hosts, chroot, timeout=20, session_timeout=2))
    runs: list[str] = []
    agent = wmgr.agent("w-1", services=["replication"], lease_seconds=30, resync_interval=120)
    agent.on_pause("replication")(runs.append)
    agent.start()
    try:
        for loc in ("site-a", "site-b"):
            assert operator.pause(loc, "replication", wait=20).services["replication"].generation == 1
        path = f"{chroot}/workers/w-1"
        owner = raw.exists(path).ephemeralOwner
        proxy.freeze()
        wait_until(lambda: raw.exists(path) is None, 30, what="the server to expire the session")
        assert operator.backend.acks("site-a") == {} == operator.backend.acks("site-b")
        proxy.thaw()
        wait_until(lambda: (raw.exists(path) or _NO).ephemeralOwner not in (0, owner), 30,
                   what="re-registration on a new session")
        wait_until(lambda: all(operator.backend.acks(loc).get("w-1") == {"replication": 1}
                               for loc in ("site-a", "site-b")), 30,
                   what="the worker to acknowledge again")
        assert agent.metrics()["sessions_lost"] == 1
        assert sorted(runs) == ["site-a", "site-b"]  # applied once each, acknowledged twice
    finally:
        agent.stop()
        wmgr.close()
        operator.close()


# -- a TCP connection cut in the middle of a compare-and-set --------------------------------------


@pytest.mark.parametrize("mode", ["before", "after"])
def test_a_connection_cut_mid_compare_and_set_is_reported_ambiguous_and_the_truth_is_readable(
    proxy: TcpProxy, chroot: str, opened: Callable[[str], ZooKeeperBackend], mode: str
) -> None:
    b = opened(zk_url(proxy.hosts, chroot, timeout=20))
    v = b.create(record("cut"), []).version
    proxy.cut_next_multi(mode)  # type: ignore[arg-type]
    with pytest.raises(AmbiguousCommit, match="outcome is unknown"):
        b.compare_and_set(record("cut", State.PAUSING, 1), v, [entry("cut", "op-cut")])
    assert proxy.multis_cut == 1
    landed = mode == "after"
    assert b.read("cut").version == (v + 1 if landed else v)
    assert history_ops(b, "cut") == (["op-cut"] if landed else [])


@pytest.mark.parametrize("mode", ["before", "after"])
def test_a_connection_cut_mid_batch_leaves_each_location_written_once_or_not_at_all(
    proxy: TcpProxy, chroot: str, opened: Callable[[str], ZooKeeperBackend], mode: str
) -> None:
    """A batch of several multi-ops, the first one cut (dropped unsent, or applied and its
    answer lost): each location is reported applied, ambiguous or not sent, and what is
    stored agrees: applied ones once at their version, none twice (docs/zookeeper.md)."""
    b = opened(zk_url(proxy.hosts, chroot, timeout=20))
    names = [f"cutb-{i:03d}" for i in range(120)]
    versions = {n: b.create(record(n), []).version for n in names}
    proxy.cut_next_multi(mode)  # type: ignore[arg-type]
    results = b.compare_and_set_many([
        CasItem(record(n, State.PAUSING, 1), versions[n], [entry(n, f"op-{n}")]) for n in names
    ])
    assert proxy.multis_cut == 1
    assert any(isinstance(r, AmbiguousCommit) for r in results)
    for n, result in zip(names, results, strict=True):
        ops = history_ops(b, n)
        assert ops in ([], [f"op-{n}"]), (n, ops)  # never twice
        stored = b.read(n).version
        assert stored == (versions[n] + 1 if ops else versions[n])
        if isinstance(result, LocationStatus):
            assert result.version == stored == versions[n] + 1
        elif isinstance(result, BackendUnavailable) and not isinstance(result, AmbiguousCommit):
            assert ops == []  # not sent: not written
        else:
            assert isinstance(result, AmbiguousCommit), (n, result)


@pytest.mark.parametrize("mode", ["before", "after"])
def test_a_pause_whose_connection_is_cut_mid_write_happens_exactly_once(
    proxy: TcpProxy, chroot: str, mode: str
) -> None:
    mgr = connect(zk_url(proxy.hosts, chroot, timeout=20))
    try:
        mgr.sync_locations({"cut": ["replication"]})
        before = mgr.status("cut").version
        proxy.cut_next_multi(mode)  # type: ignore[arg-type]
        rec = mgr.pause("cut", "replication", op_id="op-cut")
        assert proxy.multis_cut == 1 and mgr.stats["ambiguous"] == 1
        assert rec.services["replication"].state is State.PAUSED
        assert rec.services["replication"].op_id == "op-cut"
        assert rec.version == before + 2  # the pause once, then its settle
        hist = mgr.history("cut", 50)
        assert [(e.version, e.event) for e in hist if e.op_id == "op-cut"] == [
            (before + 2, "settle"), (before + 1, "pause"),
        ]
    finally:
        mgr.close()


def test_a_location_another_process_keeps_writing_is_read_first_one_round_trip_not_two(
    zk_server: ZkServer, chroot: str,
) -> None:
    """A pause whose version hint another process made stale (bench/bridge.py --store zk: the
    bridge's settle between every two pauses) paid a refused compare-and-set and then a read
    before its write. Once a location's hint proved stale, the manager reads it first
    (docs/design.md §3.1): such a pause costs one round trip more than one planned from a
    current hint, not two. Counted on kazoo's own request log; a location only this manager
    writes goes back to its hint."""
    url = zk_url(zk_server.hosts, chroot)
    a, other = connect(url), connect(url)
    try:
        a.sync_locations({n: ["replication", "lifecycle"] for n in ("mine", "shared")})
        for n in ("mine", "shared"):
            a.status(n)
        a.pause("mine", "lifecycle")  # warm: the worker list is copied, the paths known
        fresh: list[int] = []
        stale: list[int] = []
        for i in range(4):
            flip_a = a.pause if i % 2 == 0 else a.resume
            flip_other = other.pause if i % 2 == 0 else other.resume
            flip_other("shared", "lifecycle")  # a's hint of it is now two versions behind
            time.sleep(0.05)
            with RoundTrips() as trips:
                flip_a("mine", "replication")
            fresh.append(trips.round_trips)
            with RoundTrips() as trips:
                flip_a("shared", "replication")
            stale.append(trips.round_trips)
        assert stale[0] == fresh[0] + 2, (stale, fresh)  # the refused write and the read
        assert stale[1:] == [f + 1 for f in fresh[1:]], (stale, fresh)  # the read only
        assert a.stats["stale_hints"] == 1
    finally:
        a.close()
        other.close()


def test_a_worker_lease_is_kept_as_given_and_the_session_bounds_it(
    backend: ZooKeeperBackend,
) -> None:
    past = datetime.now(UTC) - timedelta(seconds=5)
    backend.put_worker(worker("w-old", lease_expires_at=past))
    backend.put_worker(worker("w-session"))
    listed = {w.worker_id: w for w in backend.workers()}
    now = datetime.now(UTC)
    assert not listed["w-old"].alive(now) and listed["w-session"].alive(now)


def test_a_settle_sees_a_worker_registered_before_the_write_it_settles(
    zk_server: ZkServer, chroot: str, opened: Callable[[str], ZooKeeperBackend]
) -> None:
    """workers() is served from a copy that a watch drops, and that watch runs on kazoo's
    callback thread, after the answers that followed its event may have reached the caller.
    A pause read its own write, then the workers from the copy of before a worker registered,
    and settled ``paused`` without that live worker (it may have read the running record).
    Here the callback thread is busy (the watch event waits behind another callback): the
    settle must still see the worker."""
    url = zk_url(zk_server.hosts, chroot)
    b = opened(url)
    mgr = Manager(b, clock=FakeClock(datetime.now(UTC)))
    mgr.sync_locations(["loc"])
    assert b.workers() == []  # the copy is kept, and watched, from here on
    busy = threading.Event()
    b._client.kazoo.handler.dispatch_callback(Callback("busy", busy.wait, (30,)))
    try:
        opened(url).put_worker(worker("w-join"))  # its own session: alive while listed
        paused: list[LocationStatus] = []
        pausing = threading.Thread(target=lambda: paused.append(mgr.pause("loc", "replication")))
        pausing.start()
        pausing.join(2 * EVENTS_WAIT + 1)
    finally:
        busy.set()
    pausing.join(30)
    assert paused and paused[0].services["replication"].state is State.PAUSING
    assert mgr.lagging("loc", "replication") == ["w-join"]
