"""Self-test of tests/support/servers.py: the real servers start, answer, survive
restarts and (for the ensemble) elect a new leader after ``kill -9``."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.servers import (
    ServerControlUnsupported,
    ZooKeeperEnsemble,
    ZooKeeperServer,
    docker_available,
    four_letter_word,
    start_ensemble,
    start_mongo,
    start_zookeeper,
    zookeeper_available,
)

pytestmark = pytest.mark.timeout(120)

needs_zk = pytest.mark.skipif(not zookeeper_available(), reason="no java/ZooKeeper installed")


def _kazoo(hosts: str, timeout: float = 10.0) -> Any:
    from kazoo.client import KazooClient

    client = KazooClient(
        hosts=hosts,
        timeout=timeout,
        connection_retry={"max_tries": -1, "delay": 0.1, "max_delay": 1.0},
        command_retry={"max_tries": -1, "delay": 0.1, "max_delay": 1.0, "deadline": 20.0},
    )
    client.start(timeout=15)
    return client


def test_docker_probe_is_fast() -> None:
    docker_available.cache_clear()
    t0 = time.monotonic()
    docker_available()
    assert time.monotonic() - t0 < 1.5
    t0 = time.monotonic()
    docker_available()
    assert time.monotonic() - t0 < 0.01  # cached


@pytest.fixture
def zk(tmp_path: Path) -> Iterator[ZooKeeperServer]:
    with start_zookeeper(tmp_path) as server:
        yield server


@needs_zk
def test_single_zookeeper_restart_keeps_data(zk: ZooKeeperServer) -> None:
    assert zk.mode() == "standalone"
    assert zk.hosts == f"127.0.0.1:{zk.port}"
    first_pid = zk.pid
    assert first_pid is not None

    client = _kazoo(zk.hosts)
    try:
        client.create("/locstatus/probe", b"v1", makepath=True)
        zk.stop()
        assert zk.pid is None and not zk.running
        zk.start()
        assert zk.pid not in (None, first_pid)
        data, _ = client.retry(client.get, "/locstatus/probe")
        assert data == b"v1"

        client.retry(client.set, "/locstatus/probe", b"v2")
        zk.kill()
        zk.start()
        data, _ = client.retry(client.get, "/locstatus/probe")
        assert data == b"v2"
    finally:
        client.stop()
        client.close()


@needs_zk
def test_single_zookeeper_allows_short_sessions(zk: ZooKeeperServer) -> None:
    client = _kazoo(zk.hosts, timeout=1.0)
    try:
        client.create("/short", ephemeral=True)
        cons = four_letter_word(zk.port, "cons")
        timeouts = [int(t) for t in re.findall(r"\bto=(\d+)", cons)]
        assert 1000 in timeouts, cons
    finally:
        client.stop()
        client.close()


@pytest.fixture
def ensemble(tmp_path: Path) -> Iterator[ZooKeeperEnsemble]:
    with start_ensemble(tmp_path, 3) as ens:
        yield ens


@needs_zk
def test_ensemble_survives_leader_kill(ensemble: ZooKeeperEnsemble) -> None:
    assert len(ensemble.servers) == 3
    assert ensemble.hosts.count(",") == 2
    old = ensemble.leader()
    assert sorted(ensemble.modes(), key=str) == ["follower", "follower", "leader"]

    client = _kazoo(ensemble.hosts)
    try:
        client.create("/locstatus/e", b"before", makepath=True)
        ensemble.kill(old)
        assert ensemble.servers[old].pid is None
        new = ensemble.leader(timeout=20)
        assert new != old
        client.retry(client.set, "/locstatus/e", b"after")
        data, _ = client.retry(client.get, "/locstatus/e")
        assert data == b"after"

        ensemble.start(old)  # rejoins as a follower with the same data dir
        assert ensemble.servers[old].mode() == "follower"
        assert ensemble.leader() == new
    finally:
        client.stop()
        client.close()


def test_mongo_roundtrip_and_restart(tmp_path: Path) -> None:
    with start_mongo(tmp_path) as mongo:
        assert mongo.kind in ("mongod", "testcontainers", "secantusdb")
        assert mongo.uri.startswith("mongodb://")
        client = mongo.client()
        try:
            coll = client.locstatus_selftest.items
            coll.delete_many({})
            coll.insert_one({"_id": "a", "v": 1})
            assert coll.find_one({"_id": "a"}) == {"_id": "a", "v": 1}
            if not mongo.controllable:
                with pytest.raises(ServerControlUnsupported):
                    mongo.stop()
                return
            assert mongo.pid is not None
            mongo.stop()
            assert not mongo.running
            mongo.start()
            assert coll.find_one({"_id": "a"}) == {"_id": "a", "v": 1}
        finally:
            client.close()
