"""Backend faults that used to escape as raw errors, under random operator load with worker
agents (issue 14 §2): the SQLite disk filled up and freed, the MongoDB server and ZooKeeper
members frozen with SIGSTOP and thawed, and worker registrations growing towards, and past,
the size every backend stores.

Besides the checks of ``harness.Scenario.finish`` (nothing lost or duplicated, every caller
told the truth, no operation raised anything but a LocstatusError, every worker converged,
``locstatus check`` clean: so each worker is live again once the fault is gone), each scenario
asserts that nothing settled ``paused`` while a worker still ran (``settles.false_settles``),
and that its fault really bit.

The faults stay shorter than the workers' leases (3-6 s): a longer one lets a lease lapse by the
backend's clock while the worker, cut off, still runs, and keeping that safe is the agent's own
self-fencing (not these scenarios).
"""

from __future__ import annotations

import contextlib
import random
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from agent_proc import AgentProc
from checker import load_ops
from harness import Scenario
from settles import false_settles, read_histories

from locstatus import ConflictError, InvalidInput, InvalidTransition, connect
from locstatus.backends import codec

from support.fulldisk import SmallDisk
from support.kits_mongo import fresh_database, kit_url
from support.servers import MongoHandle, ZooKeeperEnsemble

OUTAGE_TARGET = 10.0
"""Seconds to converge after the handler outage of the registration scenario."""


def stalled(sc: Scenario, failed: int) -> None:
    """The freezes bit: operations stalled across them (or failed)."""
    assert sc.load is not None
    slow = [o for o in load_ops(sc.load.outs) if o.end is not None and o.end - o.start > 0.9]
    sc.row.notes += f", calls stalled > 0.9 s {len(slow)}"
    assert slow or failed, "no call was held up by a frozen server"


def no_false_settle(sc: Scenario) -> None:
    found = false_settles(read_histories(sc.url, sc.locations), sc.agents)
    sc.row.notes += f", false settles {len(found)}"
    assert not found, "\n".join(found[:20])


# -- SQLite: the disk fills up --------------------------------------------------------------


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[SmallDisk]:
    """A 64 MB tmpfs for the scenario's database (``fulldisk.SmallDisk``); skips, naming why,
    only where a tmpfs cannot be mounted."""
    from support.fulldisk import MountUnavailable

    try:
        d = SmallDisk(tmp_path / "disk", size="64m")
    except MountUnavailable as exc:
        pytest.skip(f"full-disk scenario needs a tmpfs: {exc}")
    try:
        yield d
    finally:
        d.free()
        d.close()


def test_sqlite_disk_filled_and_freed_under_load(
    disk: SmallDisk, scenario: Callable[..., Scenario]
) -> None:
    """Fill the disk under the database (its WAL emptied first, so the next write needs new
    space) for 0.3-1.5 s, free it, again: writes fail with BackendFull and nothing is written,
    heartbeats and acknowledgements fail and are retried, and everything carries on."""
    db = disk.path / "locstatus.db"
    url = f"sqlite:///{db}"
    sc = scenario("fill the SQLite disk, free it", "sqlite", url).start()
    rng = random.Random(41)
    sc.wait_ops(20)
    while sc.remaining > 1:
        f = sc.faults.start("disk_full")
        f.detail = f"{disk.fill(sqlite_db=db)} bytes of filler"  # the disk is full from here
        time.sleep(min(sc.remaining, rng.uniform(0.3, 1.5)))
        disk.free()
        sc.faults.heal(f)
        time.sleep(min(max(0.0, sc.remaining - 0.2), rng.uniform(0.3, 1.0)))
    rep = sc.finish()
    assert rep.errors.get("BackendFull", 0) > 0, f"the disk never refused a write: {rep.errors}"
    assert "BackendUnavailable" not in rep.errors, rep.errors  # the disk, named as such
    no_false_settle(sc)


# -- frozen servers --------------------------------------------------------------------------


def test_mongodb_server_frozen_and_thawed_under_load(
    own_mongo: MongoHandle, scenario: Callable[..., Scenario]
) -> None:
    """SIGSTOP the server for 1.5-3.5 s (its sockets stay open, it answers nothing), SIGCONT,
    again. Clients time out after 1 s (``socketTimeoutMS``; pymongo retries a read or write
    once, after selecting the server again): calls stall, then fail as BackendUnavailable or
    AmbiguousCommit (resolved by op_id once it answers) or complete once it is back. Leases
    are 8 s, beyond a freeze and the timeouts after it."""
    url = kit_url(own_mongo, fresh_database(), socketTimeoutMS="1000",
                  serverSelectionTimeoutMS="1000", connectTimeoutMS="1000")
    sc = scenario("SIGSTOP the MongoDB server", "mongo", url, loaders=3, rate=10.0,
                  agent_args=["--lease", "8", "--heartbeat", "1"]).start()
    rng = random.Random(42)
    sc.wait_ops(20)
    try:
        while sc.remaining > 1:
            f = sc.faults.start("sigstop_mongodb")
            own_mongo.pause()
            time.sleep(rng.uniform(1.5, 3.5))
            own_mongo.resume()
            sc.faults.heal(f)
            time.sleep(min(max(0.0, sc.remaining - 0.2), rng.uniform(0.5, 1.5)))
    finally:
        own_mongo.resume()
    rep = sc.finish(converge_timeout=180)
    stalled(sc, rep.failed + rep.unknown)
    no_false_settle(sc)


def test_zookeeper_members_frozen_and_thawed_under_load(
    whole_ensemble: ZooKeeperEnsemble, scenario: Callable[..., Scenario]
) -> None:
    """SIGSTOP every member, the leader or a follower (in turn) for 1.5-3 s, SIGCONT: a
    frozen leader stalls every write (past 3 s its followers elect another), a frozen member
    its own clients; sessions (10 s) and leases (6 s) outlive the freezes."""
    ens = whole_ensemble
    chroot = f"/rel-{uuid.uuid4().hex[:10]}"
    url = f"zk://{ens.hosts}{chroot}?timeout=5&session_timeout=10"
    sc = scenario("SIGSTOP ZooKeeper members", "zk", url,
                  agent_args=["--lease", "6", "--heartbeat", "1"]).start()
    rng = random.Random(43)
    sc.wait_ops(20)
    rounds = 0
    try:
        while sc.remaining > 1:
            leader = ens.leader(timeout=60)
            which = ("all", "leader", "follower")[rounds % 3]
            frozen = ([leader] if which == "leader" else
                      [(leader + 1) % len(ens)] if which == "follower" else list(range(len(ens))))
            f = sc.faults.start("sigstop_zookeeper", f"{which}: node {[i + 1 for i in frozen]}")
            for i in frozen:
                ens[i].pause()
            time.sleep(rng.uniform(1.5, 3.0))
            for i in frozen:
                ens[i].resume()
            ens.wait_for_quorum(timeout=60)
            sc.faults.heal(f)
            rounds += 1
            time.sleep(min(max(0.0, sc.remaining - 0.2), rng.uniform(0.5, 1.5)))
    finally:
        for s in ens:
            s.resume()
    rep = sc.finish()
    stalled(sc, rep.failed + rep.unknown)
    no_false_settle(sc)


# -- registrations near and past the bound ---------------------------------------------------


def test_registrations_near_and_past_the_size_bound_under_load(
    scenario: Callable[..., Scenario], tmp_path: Path
) -> None:
    """A fourth worker with a large location filter (every location plus 1000 names of 110
    characters) meets a handler outage at every location: its handlers raise 1 KB errors while
    an operator flips every service everywhere (pauses the running ones, resumes the
    paused ones), so its registration would carry 102 errors; it
    is trimmed to 100 and w4 stays registered and live (17 000 errors once made a registration
    MongoDB refused with a raw DocumentTooLarge, which killed the heartbeat thread), nothing
    settles paused without it, and once the outage ends it applies and acknowledges
    everything. An agent whose filter (150 000 names) fits no registration refuses to start
    with InvalidInput and registers nothing. The bound is the codec's, the same on every
    backend (each one's own test: ``test_backend_contract.py``); this runs on SQLite, where
    the worker catches up fastest."""
    url = f"sqlite:///{tmp_path}/locstatus.db"
    sc = scenario("registrations near the size bound", "sqlite", url,
                  extra_locations=["extra-00"]).start()  # 34 locations x 3 services: 102 errors
    outage = tmp_path / "outage"
    w4 = AgentProc(url, "w4", sc.dir, "--fail-file", str(outage), "--pad-filter", "1000").start()
    sc.agents.append(w4)
    w4.wait_ready()
    mgr = connect(url)
    trimmed = 0
    try:
        wide = mgr.agent("w-wide", locations=[f"site-{i:06d}" for i in range(150_000)])
        with pytest.raises(InvalidInput, match="location filter holds 150000 names"):
            wide.start()
        sc.faults.instant("oversize_registration", "a 150 000-name filter, refused")
        sc.wait_ops(20)
        f = sc.faults.start("handler_outage", "w4 fails at every location")
        outage.touch()
        for loc in sc.locations:  # flip every service: each needs a handler run of w4's
            for svc, st in mgr.status(loc).services.items():
                with contextlib.suppress(ConflictError, InvalidTransition):  # raced by the load
                    if st.paused:
                        mgr.resume(loc, svc, actor="reliability")
                    else:
                        mgr.pause(loc, svc, reason="outage", actor="reliability")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not trimmed:
            me = next(w for w in mgr.workers() if w.worker_id == "w4")
            assert me.alive(datetime.now(UTC)), f"w4's lease lapsed in the outage: {me}"
            if codec.ERRORS_CUT_KEY in me.errors:
                trimmed += 1
                assert len(me.errors) == codec.MAX_WORKER_ERRORS + 1
                assert me.locations is not None and len(me.locations) == 1034
            time.sleep(0.1)
        outage.unlink()
        sc.faults.heal(f)
        assert "w-wide" not in [w.worker_id for w in mgr.workers()]
    finally:
        outage.unlink(missing_ok=True)
        mgr.close()
    # Converging includes w4 running again the 102 handlers that failed, one after the other,
    # each on its own retry backoff (up to 1 s here): 10 s rather than SQLite's usual 2 s.
    sc.row.target_s = OUTAGE_TARGET
    sc.finish()
    sc.row.notes += f", w4 seen trimmed {trimmed} times"
    assert trimmed > 0, "w4's errors never reached the bound"
    no_false_settle(sc)
