"""The Backbeat bridge with real parts (docs/backbeat.md, "2. The bridge"): Redis (Debian's
redis-server), ZooKeeper, and a stand-in Backbeat queue processor in Node.js using Backbeat's
own npm clients (tests/node/legacy_processor.js) that acts on Backbeat's Redis messages as
Backbeat's processor does. Scenarios: a pause settles only once the processor wrote
``paused: true``; the processor killed, restarted, frozen, its Redis connection cut, a
message lost, Redis restarted, the bridge's ZooKeeper connection cut; scheduled resumes never
published as dates; lifecycle's document kept in step by guarded writes.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from locstatus import SettleTimeout, State, connect
from locstatus.backbeat_state import BackbeatConfig, js_date, parse_node
from locstatus.bridge import Bridge, BridgeSettings
from locstatus.client import Client

from support.kits_zk import TcpProxy, raw_client
from support.legacy_processor import LegacyProcessor
from support.redis_server import RedisServer, redis_server  # noqa: F401  (a fixture)
from support.servers import MongoHandle
from support.tcp_relay import TcpRelay

SITES = ["zenko", "aws-location"]
LOCATIONS = {"zenko": ["replication", "lifecycle"], "aws-location": ["replication"],
             "a-zenko-location": ["ingestion"], "us-east-1": ["lifecycle"]}
FAST = BridgeSettings(ack_wait=1.0, republish_interval=0.3, lost_after=3.0, tick=0.2,
                      lease_seconds=6)


@dataclass
class Site:
    zk_hosts: str
    zk: KazooClient
    redis: RedisServer
    mgr: Client

    def node(self, site: str, service: str = "replication") -> dict[str, Any] | None:
        path = f"/backbeat/{service}/state/{site}"
        if not self.zk.exists(path):
            return None
        data, _ = self.zk.get(path)
        parsed: dict[str, Any] = json.loads(data)
        return parsed

    def processor(self, sites: list[str] | None = None, *, redis: str | None = None,
                  service: str = "replication", drop: int = 0) -> LegacyProcessor:
        return LegacyProcessor(
            self.zk_hosts, redis or f"127.0.0.1:{self.redis.port}", sites or SITES,
            topic=f"backbeat-{service}", namespace=f"/backbeat/{service}", drop=drop,
        ).start()

    def bridge(self, zk_hosts: str | None = None, **kw: Any) -> Bridge:
        cfg = BackbeatConfig(zookeeper=zk_hosts or self.zk_hosts, redis=self.redis.url, **kw)
        return Bridge(self.mgr, cfg, settings=FAST,
                      services=["replication", "ingestion"] + (
                          ["lifecycle"] if kw.get("mongodb") else []))

    def state(self, loc: str, service: str = "replication") -> State:
        return self.mgr.status(loc).services[service].state


@pytest.fixture
def site(tmp_path: Path, zk_server: Any, redis_server: RedisServer) -> Iterator[Site]:  # noqa: F811
    chroot = f"/bb-{uuid.uuid4().hex[:10]}"
    with raw_client(zk_server.hosts) as root:
        root.create(chroot)
    hosts = f"{zk_server.hosts}{chroot}"
    mgr = connect(f"sqlite:///{tmp_path}/ls.db")
    mgr.sync_locations(LOCATIONS)
    with raw_client(hosts) as zk:
        yield Site(hosts, zk, redis_server, mgr)
    mgr.close()


def wait_state(site: Site, loc: str, state: State, timeout: float = 20.0,
               service: str = "replication") -> None:
    deadline = time.monotonic() + timeout
    while site.state(loc, service) is not state:
        assert time.monotonic() < deadline, (loc, site.state(loc, service), site.node(loc))
        time.sleep(0.02)


class Invariant:
    """Watches, from its own thread, that no location reads ``paused`` while its processor's
    state node does not say paused (the record read first: a node read after it that still
    says running means the pause settled before the processor's write)."""

    def __init__(self, site: Site, locations: list[str]) -> None:
        self.site, self.locations = site, locations
        self.violations: list[str] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with raw_client(self.site.zk_hosts) as zk:
            while not self._stop.is_set():
                for loc in self.locations:
                    rec = self.site.mgr.status(loc).services["replication"]
                    data, _ = zk.get(f"/backbeat/replication/state/{loc}")
                    node = parse_node(data, loc)
                    self.samples += 1
                    if rec.state is State.PAUSED and not node.paused:
                        self.violations.append(f"{loc}: paused, node says {data!r}")
                time.sleep(0.01)

    def __enter__(self) -> Invariant:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def test_a_pause_settles_only_once_the_processor_wrote_paused(
    site: Site, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="locstatus")
    with site.processor() as proc, site.bridge() as bridge:
        assert sorted(bridge.workers) == ["backbeat.ingestion",
                                          "backbeat.ingestion.a-zenko-location",
                                          "backbeat.replication",
                                          "backbeat.replication.aws-location",
                                          "backbeat.replication.zenko"]
        with Invariant(site, SITES) as inv:
            proc.freeze()  # the processor cannot act: the pause must stay pausing
            site.mgr.pause("zenko", "replication")
            time.sleep(2.5)
            assert site.state("zenko") is State.PAUSING
            assert site.node("zenko") == {"paused": False}
            lagging = site.mgr.lagging("zenko", "replication")
            assert lagging == ["backbeat.replication.zenko"]
            # waiting for the processor is a normal state: one info line, no traceback, and
            # the handler has a readable name (it was Bridge._processor.<locals>.<lambda>)
            waiting = [r for r in caplog.records if "has not applied the pause" in r.getMessage()]
            assert waiting and all(r.levelno == logging.INFO and r.exc_info is None
                                   for r in waiting), waiting
            started = [r.getMessage() for r in caplog.records
                       if "pause handler" in r.getMessage() and "zenko" in r.getMessage()]
            assert started and all("Bridge.pause_replication_processor" in m
                                   or "Bridge.register_replication_processor" in m
                                   for m in started), started
            assert not any("<lambda>" in r.getMessage() for r in caplog.records)
            proc.thaw()
            wait_state(site, "zenko", State.PAUSED)
            assert site.node("zenko") == {"paused": True, "scheduledResume": None}
            assert proc.find("paused", site="zenko")
            assert not proc.find("paused", site="aws-location")
            site.mgr.resume("zenko", "replication")
            wait_state(site, "zenko", State.RUNNING)
            assert site.node("zenko")["paused"] is False
            assert proc.find("resumed", site="zenko")
            for loc in SITES:
                site.mgr.pause(loc, "replication")
            for loc in SITES:
                wait_state(site, loc, State.PAUSED)
        assert inv.violations == [] and inv.samples > 100


def test_a_processor_killed_then_restarted_catches_up(site: Site) -> None:
    proc = site.processor()
    try:
        with site.bridge():
            proc.kill()  # kill -9: nobody listens on its channels
            site.mgr.pause("zenko", "replication")
            time.sleep(1.5)
            assert site.state("zenko") is State.PAUSING  # its lease is the bridge's: held
            assert site.node("zenko") == {"paused": False}
            mark = proc.mark()
            proc.start()  # reads its node (running), then gets the pause published again
            wait_state(site, "zenko", State.PAUSED)
            assert proc.find("ready", since=mark, site="zenko", paused=False)
            assert proc.find("paused", since=mark, site="zenko")
            assert site.node("zenko")["paused"] is True
            proc.kill()
            proc.start()  # restarted while paused: starts paused from its node, nothing to do
            assert proc.find("ready", since=mark, site="zenko", paused=True)
            site.mgr.resume("zenko", "replication")
            wait_state(site, "zenko", State.RUNNING)
            assert site.node("zenko")["paused"] is False
    finally:
        proc.close()


def test_a_lost_message_is_published_again(site: Site) -> None:
    with site.processor(drop=1) as proc, site.bridge():
        site.mgr.pause("zenko", "replication")
        wait_state(site, "zenko", State.PAUSED)
        assert len(proc.find("dropped", site="zenko")) == 1
        assert proc.find("paused", site="zenko")


def test_a_burst_of_pauses_publishes_each_order_once(site: Site) -> None:
    """The loop can see an agent's copy flip before that agent's handler starts, and both
    published: each processor then got ``pauseService`` twice and read and wrote its node
    twice before it got to the next site's (bench/bridge.py). One order per pause now (the
    republish interval is long here: any second message is a duplicate, not a republish)."""
    burst = [f"burst-{i}" for i in range(8)]
    for loc in burst:
        site.mgr.add_location(loc, ["replication"])
    settings = BridgeSettings(ack_wait=10.0, republish_interval=10.0, tick=0.02,
                              lease_seconds=6)
    cfg = BackbeatConfig(zookeeper=site.zk_hosts, redis=site.redis.url)
    with site.processor(burst) as proc, Bridge(site.mgr, cfg, services=["replication"],
                                               settings=settings):
        for _ in range(3):
            mark = proc.mark()
            for loc in burst:
                site.mgr.pause(loc, "replication")
            for loc in burst:
                wait_state(site, loc, State.PAUSED)
            sent = {loc: len(proc.find("message", since=mark, site=loc, action="pauseService"))
                    for loc in burst}
            assert sent == dict.fromkeys(burst, 1)
            for loc in burst:
                site.mgr.resume(loc, "replication")
            for loc in burst:
                wait_state(site, loc, State.RUNNING)


def test_a_cut_redis_connection_and_a_redis_restart(site: Site) -> None:
    relay = TcpRelay("127.0.0.1", site.redis.port)
    try:
        with site.processor(redis=relay.address) as proc, site.bridge():
            relay.block()  # the processor's Redis connection is cut and stays cut
            proc.wait_for("redis", site="zenko", state="close")
            site.mgr.pause("zenko", "replication")  # published to no subscriber: lost
            time.sleep(1.0)
            assert site.state("zenko") is State.PAUSING
            mark = proc.mark()
            relay.unblock()  # ioredis reconnects and subscribes again; the bridge republishes
            wait_state(site, "zenko", State.PAUSED)
            assert proc.find("paused", since=mark, site="zenko")
            # Redis itself restarted: both sides reconnect; a resume made meanwhile arrives
            site.redis.stop()
            site.mgr.resume("zenko", "replication")
            time.sleep(1.0)
            assert site.state("zenko") is State.RESUMING
            site.redis.start()
            wait_state(site, "zenko", State.RUNNING, timeout=30)
            assert site.node("zenko")["paused"] is False
    finally:
        relay.close()


def test_scheduled_resumes_are_published_when_due_never_as_dates(site: Site) -> None:
    with site.processor() as proc, site.bridge():
        site.mgr.pause("zenko", "replication")
        wait_state(site, "zenko", State.PAUSED)
        site.mgr.resume("zenko", "replication", at=timedelta(seconds=2))
        time.sleep(0.5)
        assert site.state("zenko") is State.PAUSED
        assert site.node("zenko") == {"paused": True, "scheduledResume": None}
        wait_state(site, "zenko", State.RUNNING, timeout=30)  # fired by the bridge's agents
        assert site.node("zenko")["paused"] is False
        messages = proc.find("message", site="zenko")
        assert [m["action"] for m in messages] == ["pauseService", "resumeService"]
        assert all(m["date"] is None for m in messages)
        assert not proc.find("scheduled")


def test_a_timer_armed_in_the_processor_is_disarmed(site: Site) -> None:
    """A processor that starts with a scheduled resume in its node (Backbeat's own schedule,
    from before the migration) arms its own timer; the bridge, for a location paused without
    schedule in locstatus, disarms it, and acknowledges only then."""
    site.zk.create("/backbeat/replication/state/zenko",
                   node_bytes(True, js_date_in(3600)), makepath=True)
    site.mgr.pause("zenko", "replication")
    with site.processor() as proc, site.bridge():
        assert proc.find("scheduled", site="zenko")
        wait_state(site, "zenko", State.PAUSED)
        assert site.node("zenko") == {"paused": True, "scheduledResume": None}
        # the processor's event log is read by another thread: its node can be seen first
        proc.wait_for("message", site="zenko")
        assert [m["action"] for m in proc.find("message", site="zenko")] == [
            "deleteScheduledResumeService"]


def test_the_bridge_resyncs_after_its_zookeeper_connection_was_cut(
    site: Site, zk_server: Any
) -> None:
    proxy = TcpProxy(zk_server.hosts.split(",")[0])
    chroot = site.zk_hosts[len(zk_server.hosts):]
    try:
        with site.processor() as proc, site.bridge(zk_hosts=proxy.hosts + chroot):
            proxy.freeze()  # the bridge cannot see the nodes: no acknowledgement possible
            site.mgr.pause("zenko", "replication")
            proc.wait_for("paused", site="zenko")  # Redis still works: the processor acts
            time.sleep(1.0)
            assert site.state("zenko") is State.PAUSING
            proxy.thaw()  # reconnected: every node read again, the pause acknowledged
            wait_state(site, "zenko", State.PAUSED, timeout=30)
    finally:
        proxy.close()


def test_ingestion_follows_on_its_own_channel(site: Site) -> None:
    with site.processor(["a-zenko-location"], service="ingestion") as proc, site.bridge():
        site.mgr.pause("a-zenko-location", "ingestion")
        wait_state(site, "a-zenko-location", State.PAUSED, service="ingestion")
        assert site.node("a-zenko-location", "ingestion") == {"paused": True,
                                                               "scheduledResume": None}
        assert proc.find("subscribed", channel="backbeat-ingestion-a-zenko-location")
        site.mgr.resume("a-zenko-location", "ingestion")
        wait_state(site, "a-zenko-location", State.RUNNING, service="ingestion")


def test_lifecycle_documents_are_kept_in_step_by_guarded_writes(
    site: Site, mongo_server: MongoHandle
) -> None:
    database = f"bb_{uuid.uuid4().hex[:10]}"
    client = mongo_server.client()
    coll = client[database]["__locationStatusStore"]
    crr = {"paused": True, "scheduledResume": "2031-01-01T00:00:00.000Z"}
    coll.insert_one({"_id": "zenko", "value": {"crr": crr, "ingestion": None,
                                               "lifecycle": {"paused": False,
                                                             "scheduledResume": None}}})
    try:
        with site.bridge(mongodb=mongo_server.uri, mongodb_database=database) as bridge:
            assert "backbeat.lifecycle" in bridge.workers
            site.mgr.pause("zenko", "lifecycle")
            site.mgr.pause("us-east-1", "lifecycle")
            wait_state(site, "zenko", State.PAUSED, service="lifecycle")
            wait_state(site, "us-east-1", State.PAUSED, service="lifecycle")
            doc = coll.find_one({"_id": "zenko"})
            assert doc is not None
            assert doc["value"]["lifecycle"] == {"paused": True, "scheduledResume": None}
            assert doc["value"]["crr"] == crr  # the other services' entries are kept
            created = coll.find_one({"_id": "us-east-1"})
            assert created is not None and created["value"]["lifecycle"]["paused"] is True
            # Backbeat's API server writes the whole document back, with a stale lifecycle:
            coll.update_one({"_id": "zenko"}, {"$set": {"value": {
                "crr": crr, "ingestion": None,
                "lifecycle": {"paused": False, "scheduledResume": None}}}})
            deadline = time.monotonic() + 10
            while coll.find_one({"_id": "zenko"})["value"]["lifecycle"]["paused"] is not True:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            site.mgr.resume("zenko", "lifecycle")
            wait_state(site, "zenko", State.RUNNING, service="lifecycle")
            assert coll.find_one({"_id": "zenko"})["value"]["lifecycle"]["paused"] is False
    finally:
        client.drop_database(database)
        client.close()


@pytest.mark.parametrize("entry", ["paused", 0, True])
def test_a_lifecycle_entry_that_is_no_object_holds_the_pause_and_is_named(
    site: Site, mongo_server: MongoHandle, entry: Any
) -> None:
    """``value.lifecycle`` a string, a number or a boolean: neither guarded write matches and
    the pause settled as if the document already said so, though Backbeat reads no
    ``paused`` there (a hostile review). It stays pausing, the handler's error names the
    document, and nothing is written."""
    database = f"bb_{uuid.uuid4().hex[:10]}"
    client = mongo_server.client()
    coll = client[database]["__locationStatusStore"]
    coll.insert_one({"_id": "zenko", "value": {"crr": None, "ingestion": None,
                                               "lifecycle": entry}})
    try:
        with site.bridge(mongodb=mongo_server.uri, mongodb_database=database) as bridge:
            assert "backbeat.lifecycle" in bridge.workers
            site.mgr.pause("zenko", "lifecycle")
            def errors() -> list[str]:
                return [v for w in site.mgr.workers() if w.worker_id == "backbeat.lifecycle"
                        for k, v in w.errors.items() if k.startswith("zenko")]

            deadline = time.monotonic() + 15
            while not errors():
                assert time.monotonic() < deadline, site.mgr.workers()
                time.sleep(0.1)
            assert any("not an object or null" in e for e in errors()), errors()
            assert site.state("zenko", "lifecycle") is State.PAUSING
            doc = coll.find_one({"_id": "zenko"})
            assert doc is not None and doc["value"]["lifecycle"] == entry
    finally:
        client.drop_database(database)
        client.close()


def node_bytes(paused: bool, when: str | None) -> bytes:
    return json.dumps({"paused": paused, "scheduledResume": when},
                      separators=(",", ":")).encode()


def js_date_in(seconds: float) -> str:
    from datetime import UTC, datetime
    return js_date(datetime.now(UTC) + timedelta(seconds=seconds))


def test_the_bridge_command_runs_until_sigterm(site: Site, tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path}/ls.db"  # the store of site.mgr (zenko, aws-location)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCSTATUS_")}
    with site.processor(["zenko"]):
        cmd = [sys.executable, "-m", "locstatus", "--backend", url, "bridge", "backbeat",
               "--zookeeper", site.zk_hosts, "--redis", site.redis.url,
               "--service", "replication", "--ack-wait", "1"]
        bridge = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        try:
            deadline = time.monotonic() + 30
            while "backbeat.replication.zenko" not in [w.worker_id for w in site.mgr.workers()]:
                assert bridge.poll() is None, bridge.communicate()
                assert time.monotonic() < deadline
                time.sleep(0.1)
            site.mgr.pause("zenko", "replication")
            wait_state(site, "zenko", State.PAUSED)
            assert site.node("zenko") == {"paused": True, "scheduledResume": None}
        finally:
            bridge.send_signal(signal.SIGTERM)
            _out, err = bridge.communicate(timeout=30)
        assert bridge.returncode == 0, err
        assert b"bridging replication for 3 Backbeat worker(s)" in err


def test_the_bridge_command_refuses_what_it_cannot_bridge(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from locstatus.cli import app

    url = f"sqlite:///{tmp_path}/ls.db"
    connect(url).close()
    env = {"LOCSTATUS_BACKEND": None, "LOCSTATUS_SERVICES": None}
    result = CliRunner().invoke(app, ["--backend", url, "bridge", "backbeat"], env=env)
    assert result.exit_code == 2
    assert "nothing to bridge" in result.stderr
    result = CliRunner().invoke(app, ["--backend", url, "bridge", "backbeat", "--service",
                                      "lifecycle", "--zookeeper", "127.0.0.1:1"], env=env)
    assert result.exit_code == 2
    assert "needs Backbeat's MongoDB" in result.stderr


def test_a_refused_bridge_command_leaves_the_process_signal_handlers_as_they_were(
    tmp_path: Path,
) -> None:
    """Run in-process (CliRunner), a bridge command refused after it set its SIGINT/SIGTERM
    handlers once left them behind: every later Ctrl-C of the process only set the dead
    command's event, so tests/test_bulk_interrupts.py's real SIGINTs raised nothing when they
    ran after this file."""
    import signal

    from typer.testing import CliRunner

    from locstatus.cli import app

    url = f"sqlite:///{tmp_path}/ls.db"
    connect(url).close()
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    env = {"LOCSTATUS_BACKEND": None, "LOCSTATUS_SERVICES": None}
    result = CliRunner().invoke(app, ["--backend", url, "bridge", "backbeat"], env=env)
    assert result.exit_code == 2 and "nothing to bridge" in result.stderr
    assert {sig: signal.getsignal(sig) for sig in before} == before
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


# -- the bridge away: its processors' registrations stand (docs/backbeat.md, "2. The bridge") --

LEASE = 3.0
"""The bridge subprocesses' lease (``LOCSTATUS_LEASE_SECONDS``), short so "well past the
lease" is a few seconds."""


def _bridge_process(site: Site, url: str) -> Any:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCSTATUS_")}
    env["LOCSTATUS_LEASE_SECONDS"] = str(LEASE)
    cmd = [sys.executable, "-m", "locstatus", "--backend", url, "bridge", "backbeat",
           "--zookeeper", site.zk_hosts, "--redis", site.redis.url,
           "--service", "replication", "--ack-wait", "1", "--republish-interval", "0.3"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 30
    while not any(w.worker_id == "backbeat.replication.zenko" and not w.away
                  and w.pid == proc.pid for w in site.mgr.worker_statuses().workers):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the bridge never registered its processors"
        time.sleep(0.1)
    return proc


def _check_json(url: str) -> dict[str, Any]:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCSTATUS_")}
    done = subprocess.run(
        [sys.executable, "-m", "locstatus", "--backend", url, "check", "--json",
         "--stuck-after", "1s"],
        capture_output=True, env=env, timeout=60, check=False)
    assert done.returncode == 1, done  # findings
    report: dict[str, Any] = json.loads(done.stdout)
    return report


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_pause_made_while_the_bridge_is_down_settles_only_once_a_bridge_is_back(
    site: Site, tmp_path: Path, how: str
) -> None:
    """The bridge SIGKILLed (its leases lapse) or stopped cleanly (SIGTERM): the processors'
    registrations stand, so a pause made then stays ``pausing`` well past the lease while
    Backbeat's consumer runs on; ``wait=``, ``locstatus workers`` and the check say the
    bridge is away; a bridge started again takes them over, the processor writes
    ``paused`` and only then does the location settle."""
    import signal

    url = f"sqlite:///{tmp_path}/ls.db"  # the store of site.mgr
    with site.processor(["zenko"]) as proc, Invariant(site, ["zenko"]) as inv:
        bridge = _bridge_process(site, url)
        try:
            bridge.send_signal(signal.SIGKILL if how == "killed" else signal.SIGTERM)
            bridge.wait(30)
            assert bridge.returncode == (-signal.SIGKILL if how == "killed" else 0)
            mark = proc.mark()
            site.mgr.pause("zenko", "replication")
            time.sleep(LEASE * 2)  # the leases (if any were left) ran out long ago
            settled = site.mgr.settle("zenko")  # what any wait, agent or check would do
            assert settled.services["replication"].state is State.PAUSING
            assert site.node("zenko") == {"paused": False}  # the consumer still runs
            assert not proc.find("paused", since=mark, site="zenko")
            views = {w.worker_id: w for w in site.mgr.worker_statuses().workers}
            held = views["backbeat.replication.zenko"]
            assert held.standing and held.away and held.live and held.pid == bridge.pid
            with pytest.raises(SettleTimeout) as info:
                site.mgr.wait_settled("zenko", "replication", timeout=0.5)
            assert ("backbeat.replication.zenko (standing registration, holder away since "
                    in str(info.value)), str(info.value)
            assert f"pid {bridge.pid}) is not running" in str(info.value)
            report = _check_json(url)
            stuck = [f for f in report["findings"] if f["kind"] == "stuck_transition"
                     and f["location"] == "zenko"]
            assert stuck and "holder away since" in stuck[0]["message"], report["findings"]
            assert "locstatus workers retire" in stuck[0]["repair"]["description"]
            assert not [f for f in report["findings"] if f["kind"] == "expired_worker"]

            bridge = _bridge_process(site, url)  # takes the registrations over
            wait_state(site, "zenko", State.PAUSED)
            assert site.node("zenko") == {"paused": True, "scheduledResume": None}
            assert proc.find("paused", since=mark, site="zenko")
        finally:
            if bridge.poll() is None:
                bridge.send_signal(signal.SIGTERM)
                bridge.wait(30)
    assert inv.violations == [] and inv.samples > 50


def test_the_bridge_retires_the_registration_of_a_processor_whose_location_is_gone(
    site: Site,
) -> None:
    """A location removed from locstatus: nothing stands for its processor any more, so the
    bridge retires its standing registration: while running (its rescan), and at start for
    one an earlier bridge left."""
    settings = BridgeSettings(ack_wait=1.0, republish_interval=0.3, tick=0.2,
                              lease_seconds=6, rescan_interval=0.3)
    cfg = BackbeatConfig(zookeeper=site.zk_hosts, redis=site.redis.url)

    def ids() -> list[str]:
        return sorted(w.worker_id for w in site.mgr.workers())

    with Bridge(site.mgr, cfg, services=["replication"], settings=settings):
        assert ids() == ["backbeat.replication", "backbeat.replication.aws-location",
                         "backbeat.replication.zenko"]
        site.mgr.sync_locations({k: v for k, v in LOCATIONS.items() if k != "aws-location"})
        deadline = time.monotonic() + 10
        while ids() != ["backbeat.replication", "backbeat.replication.zenko"]:
            assert time.monotonic() < deadline, ids()
            time.sleep(0.05)
    # stopped: left standing
    assert ids() == ["backbeat.replication", "backbeat.replication.zenko"]
    site.mgr.sync_locations({k: v for k, v in LOCATIONS.items() if k not in ("aws-location", "zenko")})
    with Bridge(site.mgr, cfg, services=["replication"], settings=settings):
        assert ids() == ["backbeat.replication"]  # the catch-all stays while it is bridged


# -- what the bridge counts as the acknowledgement (docs/backbeat.md, "What the bridge
# guarantees") --


def _consumer_paused(proc: LegacyProcessor, site_name: str) -> bool | None:
    """The processor's consumer as its last ``paused``/``resumed`` event left it (None: no
    such event)."""
    flips = [e["event"] for e in list(proc.events)
             if e.get("event") in ("paused", "resumed") and e.get("site") == site_name]
    return flips[-1] == "paused" if flips else None


def test_a_pause_is_not_acknowledged_by_a_node_written_before_it(site: Site) -> None:
    """The hostile review's stale acknowledgement: the processor is stopped (SIGSTOP) with a
    ``resumeService`` queued in its Redis connection, then a new pause is made. The node
    still says ``paused: true`` from the earlier pause: that must not settle the new pause,
    which settles only with a write of the processor made after the pause was published
    (here: it applies the queued resume, then the pause published again), and at the end the
    node, the consumer and locstatus agree."""
    path = "/backbeat/replication/state/zenko"
    with site.processor(["zenko"]) as proc, site.bridge():
        site.mgr.pause("zenko", "replication")
        wait_state(site, "zenko", State.PAUSED)
        proc.wait_until(lambda: _consumer_paused(proc, "zenko") is True)
        time.sleep(0.3)  # the pause's last write (scheduledResume: null) is in
        before = site.zk.get(path)[1].mzxid
        proc.freeze()
        site.mgr.resume("zenko", "replication")
        time.sleep(0.5)  # published: queued in the frozen processor's connection
        assert site.state("zenko") is State.RESUMING
        mark = proc.mark()
        site.mgr.pause("zenko", "replication")
        time.sleep(1.5)
        assert site.state("zenko") is State.PAUSING  # was: settled at once by the old write
        assert site.node("zenko") == {"paused": True, "scheduledResume": None}
        assert site.zk.get(path)[1].mzxid == before  # nothing written meanwhile
        proc.thaw()
        wait_state(site, "zenko", State.PAUSED)
        proc.wait_for("resumed", since=mark, site="zenko")  # the queued resume was applied,
        proc.wait_for("paused", since=mark, site="zenko")   # then the pause published again
        proc.wait_until(lambda: _consumer_paused(proc, "zenko") is True)
        time.sleep(1.0)  # nothing moves any more: the three agree
        assert site.state("zenko") is State.PAUSED
        assert site.node("zenko") == {"paused": True, "scheduledResume": None}
        assert _consumer_paused(proc, "zenko") is True


def test_a_processor_restarted_without_its_order_still_acknowledges(site: Site) -> None:
    """The way out: a processor that lost the order (killed with it queued, then restarted)
    starts paused from its node and ignores a ``pauseService`` (it believes it is paused):
    it writes nothing. The bridge then sends ``deleteScheduledResumeService``, which the
    processor applies by writing its node back (``paused`` unchanged), and that write, the
    only one since, acknowledges the pause."""
    with site.processor(["zenko"]) as proc, site.bridge():
        site.mgr.pause("zenko", "replication")
        wait_state(site, "zenko", State.PAUSED)
        proc.wait_until(lambda: _consumer_paused(proc, "zenko") is True)
        time.sleep(0.3)
        proc.freeze()
        site.mgr.resume("zenko", "replication")
        time.sleep(0.5)
        site.mgr.pause("zenko", "replication")
        time.sleep(0.5)
        assert site.state("zenko") is State.PAUSING  # was: settled at once by the old write
        proc.kill()  # the queued resume is lost with its connection
        time.sleep(1.0)
        mark = proc.mark()
        proc.start()
        assert proc.find("ready", since=mark, site="zenko", paused=True)
        wait_state(site, "zenko", State.PAUSED)
        proc.wait_for("message", since=mark, site="zenko",
                      action="deleteScheduledResumeService")
        assert not proc.find("resumed", since=mark, site="zenko")
        assert site.node("zenko") == {"paused": True, "scheduledResume": None}


def test_a_resume_is_not_acknowledged_by_a_node_written_before_it(site: Site) -> None:
    """The same the other way round, with the duplicates a stall leaves: the processor is
    stopped while a pause is published (and published again: a stall looks like a lost
    message), then the pause is cancelled by a resume. The node still says ``paused: false``
    from before: the resume stays ``resuming`` while the processor cannot act. Once it runs
    it applies the queued pauses (its consumer stops) and ignores the resume (it was still
    running when it read it); the resume settles only once it wrote ``paused: false`` again,
    and node, consumer and locstatus agree."""
    with site.processor(["zenko"]) as proc, site.bridge():
        proc.freeze()
        site.mgr.pause("zenko", "replication")
        time.sleep(1.0)
        site.mgr.resume("zenko", "replication")
        time.sleep(1.5)
        assert site.state("zenko") is State.RESUMING  # was: settled at once by the old node
        assert site.node("zenko") == {"paused": False}
        mark = proc.mark()
        proc.thaw()
        proc.wait_for("paused", since=mark, site="zenko")  # the queued pauses were applied
        wait_state(site, "zenko", State.RUNNING)
        proc.wait_for("resumed", since=mark, site="zenko")
        proc.wait_until(lambda: _consumer_paused(proc, "zenko") is False)
        time.sleep(1.0)
        assert site.state("zenko") is State.RUNNING
        assert site.node("zenko")["paused"] is False
        assert _consumer_paused(proc, "zenko") is False


def test_a_service_the_configuration_cannot_bridge_is_named_at_start(tmp_path: Path) -> None:
    """A store with lifecycle and a configuration without Backbeat's MongoDB: the bridge leaves
    lifecycle alone and says so, since a pause of it settles with nothing following it (a
    new-user review paused lifecycle through the Backbeat route, 200, settled at once)."""
    client = connect(f"sqlite:///{tmp_path}/ls.db", services=["replication", "lifecycle"])
    try:
        cfg = BackbeatConfig(zookeeper="127.0.0.1:1", redis="redis://127.0.0.1:1")
        bridge = Bridge(client, cfg)  # nothing connects before it is entered
        assert bridge.services == ["replication"]
        assert bridge.unbridged == {
            "lifecycle": "no Backbeat MongoDB in the configuration (--mongodb)"}
        assert Bridge(client, cfg, services=["replication"]).unbridged == {}  # narrowed: asked
    finally:
        client.close()


def _error(site: Site, worker_id: str, loc: str) -> str | None:
    """The last handler error the worker published for ``loc``'s replication."""
    for w in site.mgr.workers():
        if w.worker_id == worker_id:
            return w.errors.get(f"{loc}/replication")
    return None


def test_a_state_node_deleted_by_hand_does_not_acknowledge_a_resume(site: Site) -> None:
    """A missing node is no write of the processor: once the bridge published an order, a
    node deleted by hand (the processor paused, its consumer stopped) must not settle a
    resume, which the processor cannot apply (its read of the node fails). Before the fix a
    missing node acknowledged every resume, and it settled at once."""
    path = "/backbeat/replication/state/zenko"
    with site.processor(["zenko"]) as proc, site.bridge():
        site.mgr.pause("zenko", "replication")
        wait_state(site, "zenko", State.PAUSED)
        proc.wait_until(lambda: _consumer_paused(proc, "zenko") is True)
        time.sleep(0.3)  # the pause's last write is in
        site.zk.delete(path)
        mark = proc.mark()
        site.mgr.resume("zenko", "replication")
        proc.wait_for("message", since=mark, site="zenko", action="resumeService")
        time.sleep(1.5)
        assert site.state("zenko") is State.RESUMING  # was: RUNNING, the consumer stopped
        assert _consumer_paused(proc, "zenko") is True
        assert site.mgr.lagging("zenko", "replication") == ["backbeat.replication.zenko"]
        error = _error(site, "backbeat.replication.zenko", "zenko")
        assert error is not None and "does not exist" in error, error


def test_the_lag_message_says_the_subscriber_count_is_unknown_while_redis_is_down(
    site: Site,
) -> None:
    """The lag message names the subscribers of the processor's channel as last seen; while
    Redis cannot be reached that count is stale (the processor may have gone meanwhile), so
    the message says it is unknown and when it was last seen. Before the fix it kept
    saying ``1 subscriber(s)``."""
    worker = "backbeat.replication.zenko"
    with site.processor(["zenko"]) as proc, site.bridge():
        proc.freeze()
        site.mgr.pause("zenko", "replication")
        deadline = time.monotonic() + 10
        while "1 subscriber(s) on backbeat-replication-zenko" not in (
                _error(site, worker, "zenko") or ""):
            assert time.monotonic() < deadline, _error(site, worker, "zenko")
            time.sleep(0.05)
        site.redis.stop()
        stopped = time.monotonic()
        deadline = stopped + 15
        while True:
            error = _error(site, worker, "zenko") or ""
            if "unknown" in error:
                break
            assert time.monotonic() < deadline, error
            time.sleep(0.05)
        assert "subscriber(s) on backbeat-replication-zenko unknown" in error, error
        assert "Redis unreachable" in error and "1 seen at " in error, error
        assert site.state("zenko") is State.PAUSING
        proc.thaw()
        site.redis.start()
        wait_state(site, "zenko", State.PAUSED, timeout=30)


def _messages(proc: LegacyProcessor, since: int, site_name: str = "zenko") -> list[str]:
    return [e["action"] for e in proc.find("message", since=since, site=site_name)]


def test_a_processor_stalled_past_the_republish_interval_gets_the_order_once(
    site: Site,
) -> None:
    """A processor stopped (SIGSTOP) for several republish intervals is not sent the order
    again: its copy was received by its Redis connection, which is still open (Redis lists
    it), so nothing was lost, and a copy sent now would only queue behind it (docs/backbeat.md
    "What the bridge guarantees"). Before the fix one copy per interval queued up, and the
    processor ran them all at once when it ran again (a read-then-write each)."""
    with site.processor(["zenko"]) as proc, site.bridge():
        mark = proc.mark()
        proc.freeze()
        site.mgr.pause("zenko", "replication")
        time.sleep(2.0)  # six republish intervals
        assert site.state("zenko") is State.PAUSING
        proc.thaw()
        wait_state(site, "zenko", State.PAUSED)
        time.sleep(1.0)
        assert _messages(proc, mark) == ["pauseService"]
        assert _consumer_paused(proc, "zenko") is True


def test_an_order_superseded_during_a_stall_is_not_queued_behind_it(site: Site) -> None:
    """A pause published to a stopped processor, then a resume made during the stall: the
    resume is not published while the pause may still be queued in the processor's open
    connection; once the processor ran again and wrote the pause, it is sent, alone. So the
    processor never holds two orders at once (its read-then-write chains would interleave,
    and the bridge could only guess from a count of writes which one the node shows). Before
    the fix the copies of both queued (pause, pause, ..., resume, resume) and the processor
    ignored the resumes it read while still running."""
    with site.processor(["zenko"]) as proc, site.bridge():
        mark = proc.mark()
        proc.freeze()
        site.mgr.pause("zenko", "replication")
        time.sleep(1.0)
        site.mgr.resume("zenko", "replication")
        time.sleep(1.0)
        assert site.state("zenko") is State.RESUMING
        assert site.node("zenko") == {"paused": False}
        proc.thaw()
        wait_state(site, "zenko", State.RUNNING)
        proc.wait_until(lambda: _consumer_paused(proc, "zenko") is False)
        time.sleep(1.0)
        assert _messages(proc, mark) == ["pauseService", "resumeService"]
        assert not proc.find("noop", since=mark, site="zenko")
        assert site.state("zenko") is State.RUNNING
        assert site.node("zenko")["paused"] is False


def test_a_fenced_bridge_publishes_nothing_to_the_processors(site: Site) -> None:
    """docs/backbeat.md "2. The bridge": while the bridge cannot renew its leases it leaves the
    processors as they are. Before: its agents, fenced, said every location paused
    (``Agent.is_paused``), and the bridge's loop published ``pauseService`` to every processor."""
    from test_agent_fencing import RenewalsRefused

    link = RenewalsRefused(site.mgr.backend)
    cfg = BackbeatConfig(zookeeper=site.zk_hosts, redis=site.redis.url)
    with site.processor() as proc, Bridge(Client(link), cfg, settings=FAST,
                                          services=["replication"]) as bridge:
        for loc in SITES:
            proc.wait_for("ready", site=loc)
        mark = proc.mark()
        link.cut()  # lease renewals refused: reads, hints and Redis go on
        agents = [p.agent for p in bridge._processors.values()]
        deadline = time.monotonic() + 20
        while not all(a.fenced for a in agents):
            assert time.monotonic() < deadline, "the bridge's agents never fenced"
            time.sleep(0.05)
        # the loop looks at every processor each tick: give it several
        time.sleep(5 * FAST.tick + 2 * FAST.republish_interval)
        assert all(a.fenced for a in agents)
        assert not proc.find("paused", since=mark), proc.events[mark:]
        assert [site.node(loc)["paused"] for loc in SITES] == [False, False]
        link.heal()


def test_backbeat_mongodb_down_does_not_stop_the_other_services(site: Site) -> None:
    """Found by the hostile review of issue 18: with lifecycle bridged and Backbeat's MongoDB
    down, every pass of the loop waited out MongoDB's server selection (10 s) and then failed
    with a traceback before the rescan, so a replication location added to locstatus never
    got its processor's registration: a pause of it settled at once while its Backbeat
    consumer ran. The lifecycle documents' failure is now the lifecycle's alone."""
    from support.servers import free_ports

    settings = BridgeSettings(ack_wait=1.0, republish_interval=0.3, lost_after=3.0, tick=0.2,
                              lease_seconds=6, rescan_interval=0.3)
    (port,) = free_ports(1)  # nothing listens there: Backbeat's MongoDB is down
    cfg = BackbeatConfig(zookeeper=site.zk_hosts, redis=site.redis.url,
                         mongodb=f"mongodb://127.0.0.1:{port}/")
    with site.processor([*SITES, "new-site"]), Bridge(
            site.mgr, cfg, services=["replication", "lifecycle"], settings=settings) as bridge:
        assert "backbeat.lifecycle" in bridge.workers
        site.mgr.sync_locations({**LOCATIONS, "new-site": ["replication"]})
        deadline = time.monotonic() + 40  # the loop's first read of MongoDB waits 10 s
        while "backbeat.replication.new-site" not in bridge.workers:
            assert time.monotonic() < deadline, bridge.workers
            time.sleep(0.05)
        with Invariant(site, ["new-site"]) as inv:
            site.mgr.pause("new-site", "replication")
            wait_state(site, "new-site", State.PAUSED)
        assert site.node("new-site") == {"paused": True, "scheduledResume": None}
        assert inv.violations == []


def test_a_lifecycle_document_with_backbeats_own_date_is_disarmed(
    site: Site, mongo_server: MongoHandle
) -> None:
    """Found by the hostile review of issue 18: Backbeat's API server writes a lifecycle
    document's scheduled resume as ``Date.toString()`` (its LocationStatus model), which the
    bridge could not parse, so its pass skipped the document and left the date there: the
    timer Backbeat's lifecycle process arms from it at its next start. It is cleared within a
    tick, as any stale value."""
    database = f"bb_{uuid.uuid4().hex[:10]}"
    client = mongo_server.client()
    coll = client[database]["__locationStatusStore"]
    try:
        site.mgr.pause("us-east-1", "lifecycle")
        with site.bridge(mongodb=mongo_server.uri, mongodb_database=database):
            wait_state(site, "us-east-1", State.PAUSED, service="lifecycle")
            armed = {"paused": True,
                     "scheduledResume": "Fri Jun 28 2030 07:40:20 GMT+0200 (Central European "
                                        "Summer Time)"}
            coll.update_one({"_id": "us-east-1"}, {"$set": {"value": {
                "crr": None, "ingestion": None, "lifecycle": armed}}})
            deadline = time.monotonic() + 20
            while (doc := coll.find_one({"_id": "us-east-1"}))["value"]["lifecycle"] == armed:
                assert time.monotonic() < deadline, doc
                time.sleep(0.05)
            assert doc["value"]["lifecycle"] == {"paused": True, "scheduledResume": None}
    finally:
        client.drop_database(database)
        client.close()


def test_a_corrupt_record_does_not_retire_its_processors_registration(
    site: Site, tmp_path: Path
) -> None:
    """Found by the hostile review of issue 18: the bridge retired the registration of every
    processor whose location it did not read among the records, and a corrupt record (a stray
    edit; a newer version's field read by an older bridge) is not among them, so its
    processor was retired; once the record read again, a pause of it settled at once while
    the processor's consumer ran. A location whose record does not read is not gone."""
    import sqlite3

    from locstatus.backends.sqlite import SQLiteBackend

    settings = BridgeSettings(ack_wait=1.0, republish_interval=0.3, lost_after=3.0, tick=0.2,
                              lease_seconds=6, rescan_interval=0.2)
    cfg = BackbeatConfig(zookeeper=site.zk_hosts, redis=site.redis.url)
    db = f"{tmp_path}/ls.db"
    with sqlite3.connect(db) as raw:
        (good,) = raw.execute("SELECT data FROM locations WHERE location = 'aws-location'"
                              ).fetchone()
    backend = SQLiteBackend(f"sqlite:///{db}")
    try:
        with site.processor(), Bridge(site.mgr, cfg, services=["replication"],
                                      settings=settings) as bridge:
            assert "backbeat.replication.aws-location" in bridge.workers
            backend.write_raw("aws-location", '{"location": "aws-location", "services": 7}')
            for _ in range(3):  # rescans run meanwhile (every 0.2 s)
                time.sleep(0.5)
                ids = [w.worker_id for w in site.mgr.workers()]
                assert "backbeat.replication.aws-location" in ids, ids
            backend.write_raw("aws-location", good)  # the record reads again
            with Invariant(site, ["aws-location"]) as inv:
                site.mgr.pause("aws-location", "replication")
                wait_state(site, "aws-location", State.PAUSED)
            assert inv.violations == []
            assert site.node("aws-location") == {"paused": True, "scheduledResume": None}
    finally:
        backend.close()


def test_a_location_synced_and_paused_at_once_waits_for_its_processor(site: Site) -> None:
    """Issue 18 (hostile review): the bridge registered a new location's processor only at
    its rescan (every 10 s), so a pause made right after ``locations sync`` added the location
    found no live worker for it and settled at once while Backbeat's consumer ran. The
    catch-all registration ``backbeat.replication`` now holds it up and registers the
    processor before it acknowledges: with the rescan 30 s away, the pause stays pausing
    while the processor is frozen and settles only once it wrote ``paused``."""
    settings = BridgeSettings(ack_wait=1.0, republish_interval=0.3, lost_after=3.0, tick=0.2,
                              lease_seconds=6, rescan_interval=30)
    cfg = BackbeatConfig(zookeeper=site.zk_hosts, redis=site.redis.url)
    with site.processor([*SITES, "new-site"]) as proc, Bridge(
            site.mgr, cfg, services=["replication"], settings=settings) as bridge:
        assert "backbeat.replication.new-site" not in bridge.workers
        deadline = time.monotonic() + 20
        while site.node("new-site") is None:  # the processor created its node
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proc.freeze()
        site.mgr.sync_locations({**LOCATIONS, "new-site": ["replication"]})
        with Invariant(site, ["new-site"]) as inv:
            site.mgr.pause("new-site", "replication")  # milliseconds after the sync
            time.sleep(2.5)
            assert site.state("new-site") is State.PAUSING
            assert "backbeat.replication.new-site" in bridge.workers
            assert site.mgr.lagging("new-site", "replication") == [
                "backbeat.replication.new-site"]
            proc.thaw()
            wait_state(site, "new-site", State.PAUSED)
            assert site.node("new-site") == {"paused": True, "scheduledResume": None}
            site.mgr.resume("new-site", "replication")  # the catch-all does not hold it up
            wait_state(site, "new-site", State.RUNNING)
        assert inv.violations == [] and inv.samples > 50
