"""The ZooKeeper backend's bulk reads (``read_many``, ``read_all``) through ZooKeeper's multiRead,
on real servers: each record read many to a request is the record its own read gives (present,
missing, corrupt, changing while it is read), a read too large for the server's request limit is
cut to fit, and a server that does not know multiRead is read node by node.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from locstatus.backends.base import CasItem, ReadResult
from locstatus.backends.zookeeper import ZooKeeperBackend, multiread
from locstatus.backends.zookeeper.multiread import MultiRead, node_bytes
from locstatus.errors import CorruptRecord, LocstatusError, NotFound
from locstatus.models import LocationStatus, ServiceStatus, State

from support.kits_zk import ZkServer, raw_client, zk_url
from support.opened import backends_opened
from support.servers import JVM_OPTS, ServerStartError, ZooKeeperServer

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def record(location: str, reason: str | None = None, state: State = State.RUNNING) -> LocationStatus:
    return LocationStatus(
        location=location,
        services={"replication": ServiceStatus(state=state, reason=reason, updated_at=T0)},
    )


def one_by_one(b: ZooKeeperBackend, names: list[str]) -> list[ReadResult]:
    out: list[ReadResult] = []
    for name in names:
        try:
            out.append(b.read(name))
        except (NotFound, CorruptRecord) as exc:
            out.append(exc)
    return out


def same(a: list[ReadResult], b: list[ReadResult]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        if isinstance(x, LocstatusError) or isinstance(y, LocstatusError):
            assert (type(x), str(x)) == (type(y), str(y))
        else:
            assert x == y


@pytest.fixture
def opened() -> Iterator[Callable[[str], ZooKeeperBackend]]:
    with backends_opened(ZooKeeperBackend) as open_:
        yield open_


def states_of(b: ZooKeeperBackend) -> list[str]:
    """Every connection state kazoo reports from now on (SUSPENDED: the connection dropped)."""
    seen: list[str] = []
    b._client.kazoo.add_listener(lambda state: seen.append(str(state)))
    return seen


def test_many_to_a_request_each_record_is_what_its_own_read_gives(
    zk_server: ZkServer, opened: Callable[[str], ZooKeeperBackend]
) -> None:
    chroot = zk_url("x").removeprefix("zk://x")
    b = opened(zk_url(zk_server.hosts, chroot))
    names = [f"loc-{i:04d}" for i in range(650)]  # several requests, several in flight
    for r in b.create_many([(record(n, reason=f"r{i}"), []) for i, n in enumerate(names)]):
        assert isinstance(r, LocationStatus)
    paused = b.read(names[3])
    b.compare_and_set(record(names[3], "later", State.PAUSING), paused.version, [])
    b.delete(names[5], b.read(names[5]).version)
    with raw_client(zk_server.hosts) as raw:
        raw.set(f"{chroot}/locations/{names[7]}", b"{not json")
        raw.create(f"{chroot}/locations/by-hand", b'{"services": {}, "deleted_at": null}')
    asked = [*names, "never-stored", names[9], "by-hand"]  # a name twice is read twice
    seen = states_of(b)

    many = b.read_many(asked)

    same(many, one_by_one(b, asked))
    assert isinstance(many[5], NotFound) and isinstance(many[7], CorruptRecord)
    assert isinstance(many[-3], NotFound)
    assert many[3].services["replication"].reason == "later"  # type: ignore[union-attr]
    assert b._client.multiread is True
    assert "SUSPENDED" not in seen  # the server answered every request
    every = b.read_all()
    want = one_by_one(b, sorted(set(names) - {names[5]} | {"by-hand"}))
    same(list(every), want)


def test_records_changing_while_read_come_each_with_its_own_version(
    zk_server: ZkServer, opened: Callable[[str], ZooKeeperBackend]
) -> None:
    """Each answer's data and stat are one node's at one moment: a record whose content names
    the version it was written at is read with that version, and never older than before."""
    b = opened(zk_url(zk_server.hosts))
    writer = opened(zk_url(zk_server.hosts, b.paths.root))
    names = [f"loc-{i:03d}" for i in range(400)]
    b.create_many([(record(n, reason="v1"), []) for n in names])
    hot = names[::7]
    stop = threading.Event()
    writes = 0

    def write() -> None:
        nonlocal writes
        current = {n: 1 for n in hot}
        while not stop.is_set():
            items = [
                CasItem(record(n, reason=f"v{v + 1}"), v, []) for n, v in current.items()
            ]
            for item, res in zip(items, writer.compare_and_set_many(items), strict=True):
                assert isinstance(res, LocationStatus), res
                current[item.record.location] = res.version
                writes += 1
            # one record gone and back: NotFound or a record, and its version says which life
            gone = writer.read(names[1])
            writer.delete(names[1], gone.version)
            created = writer.create(record(names[1], reason="pending"), [])
            writer.compare_and_set(record(names[1], reason=f"v{created.version + 1}"),
                                   created.version, [])

    t = threading.Thread(target=write)
    t.start()
    last: dict[str, int] = {}
    try:
        deadline = time.monotonic() + 3
        rounds = 0
        while time.monotonic() < deadline or rounds < 5:
            rounds += 1
            for name, got in zip(names, b.read_many(names), strict=True):
                if isinstance(got, NotFound) and name == names[1]:
                    continue
                assert isinstance(got, LocationStatus), got
                reason = got.services["replication"].reason
                if reason != "pending":
                    assert reason == f"v{got.version}", (name, reason, got.version)
                assert got.version >= last.get(name, 0)
                last[name] = got.version
    finally:
        stop.set()
        t.join()
    assert writes > len(hot)  # reads did run while the records changed


def small_buffer_server(tmp_path: Path, limit: int) -> ZooKeeperServer:
    """A standalone server with ``jute.maxbuffer`` at ``limit`` bytes (a JVM property), on a
    free port: tried again on a fresh one if another process took the port meanwhile (as
    ``servers.start_zookeeper`` does)."""
    for attempt in range(3):
        server = ZooKeeperServer(
            tmp_path / f"zk-{attempt}", jvm_opts=[*JVM_OPTS, f"-Djute.maxbuffer={limit}"]
        )
        try:
            return server.start()
        except ServerStartError:
            server.kill()
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def test_a_read_larger_than_the_servers_request_limit_is_cut_to_fit(
    tmp_path: Path, opened: Callable[[str], ZooKeeperBackend]
) -> None:
    """A server with a small ``jute.maxbuffer`` (8 KiB) drops the connection on a larger request
    instead of answering: with ``max_bytes`` set to it, every multiRead stays below, and so does
    every multi-op of a batched create or compare-and-set (their paths counted: long names
    made a group of creates larger than the bound its data alone was kept to)."""
    limit = 8192
    server = small_buffer_server(tmp_path, limit)
    try:
        b = opened(zk_url(server.hosts, max_bytes=limit))
        names = [f"{i:04d}-" + "x" * 123 for i in range(300)]  # the longest names there are
        assert sum(node_bytes(b.paths.location(n)) for n in names[:multiread.PER_REQUEST]) > limit
        for r in b.create_many([(record(n), []) for n in names]):
            assert isinstance(r, LocationStatus), r
        seen = states_of(b)

        many = b.read_many(names)

        assert [r.location for r in many if isinstance(r, LocationStatus)] == names
        assert [r.location for r in b.read_all() if isinstance(r, LocationStatus)] == names
        paused = b.compare_and_set_many([
            CasItem(record(r.location, "limit", State.PAUSING), r.version, [])
            for r in many if isinstance(r, LocationStatus)
        ])
        assert all(isinstance(r, LocationStatus) for r in paused), paused[:3]
        assert {r.services["replication"].reason for r in b.read_many(names)  # type: ignore[union-attr]
                } == {"limit"}
        assert "SUSPENDED" not in seen
    finally:
        server.close()


def test_a_server_that_does_not_know_multiread_is_read_node_by_node(
    zk_server: ZkServer, opened: Callable[[str], ZooKeeperBackend],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server before 3.6 answers opcode 22 as it answers any opcode it does not know:
    UNIMPLEMENTED, then it closes the connection. Sent an opcode no server knows, the real
    server gives that same answer."""
    monkeypatch.setattr(MultiRead, "type", 9999)
    b = opened(zk_url(zk_server.hosts))
    names = [f"loc-{i:04d}" for i in range(1200)]
    b.create_many([(record(n), []) for n in names[:-1]])
    seen = states_of(b)

    many = b.read_many(names)

    same(many, one_by_one(b, names))
    assert isinstance(many[-1], NotFound)
    assert b._client.multiread is False
    assert seen.count("SUSPENDED") == 1  # the one refusal closed the connection, once
    same(list(b.read_all()), one_by_one(b, names[:-1]))
    assert b.read_many(names[:3]) == [b.read(n) for n in names[:3]]
    assert seen.count("SUSPENDED") == 1  # and multiRead is not asked again


def test_a_node_holding_null_reads_as_its_get_does(zk_server: ZkServer) -> None:
    with raw_client(zk_server.hosts) as raw:
        raw.ensure_path("/multiread-null")
        raw.create("/multiread-null/a", None)
        raw.create("/multiread-null/b", b"")
        got = raw.handler.async_result()
        raw._call(MultiRead(["/multiread-null/a", "/multiread-null/b"]), got)
        assert got.get(timeout=10) == [raw.get("/multiread-null/a"), raw.get("/multiread-null/b")]
