"""Fault scenarios on a real 3-node ZooKeeper ensemble (``servers.start_ensemble``), under
random operator load with worker agents: the leader killed again and again, the whole ensemble
restarted, client connections cut around compare-and-sets, and a worker's session expired for
real by a partition.

Every scenario runs on its own chroot of the session's ensemble and leaves every member running.
Target: converged within 10 s of the last fault.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from faults import ProxySet, wait_for
from harness import Scenario

from support.kits_zk import raw_client
from support.servers import ZooKeeperEnsemble


def zk_url(hosts: str, chroot: str, session_timeout: float = 10.0, timeout: float = 5.0) -> str:
    return f"zk://{hosts}{chroot}?timeout={timeout:g}&session_timeout={session_timeout:g}"


@pytest.fixture
def chroot() -> str:
    return f"/rel-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def proxies(whole_ensemble: ZooKeeperEnsemble) -> Iterator[Callable[[], ProxySet]]:
    """Proxy sets in front of the ensemble. Request it before ``scenario``: the proxies must
    outlive the processes that connect through them."""
    made: list[ProxySet] = []

    def make() -> ProxySet:
        p = ProxySet(whole_ensemble.hosts)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


def test_leader_killed_repeatedly_under_load(
    scenario: Callable[..., Scenario], whole_ensemble: ZooKeeperEnsemble, chroot: str
) -> None:
    """kill -9 the leader; wait for the new one; restart the old one (it rejoins as a
    follower); again, for the whole load time. The heal is the rejoin."""
    ens = whole_ensemble
    url = zk_url(ens.hosts, chroot)
    sc = scenario("kill -9 the ZooKeeper leader, repeatedly", "zk", url,
                  agent_args=["--lease", "6", "--heartbeat", "1"]).start()
    rng = random.Random(11)
    sc.wait_ops(20)
    elections: list[float] = []
    while True:
        leader = ens.leader(timeout=60)
        f = sc.faults.start("kill9_zk_leader", f"node {leader + 1}")
        ens.kill(leader)
        new = ens.leader(timeout=60)
        elections.append(time.time() - f.started)
        assert new != leader
        ens.start(leader, timeout=120)
        sc.faults.heal(f)
        if sc.remaining < 2:
            break
        time.sleep(min(sc.remaining - 1, rng.uniform(0.5, 2.0)))
    sc.row.notes = f"elections took {', '.join(f'{s:.1f}' for s in elections)} s"
    sc.finish()


def test_whole_ensemble_restarted_under_load(
    scenario: Callable[..., Scenario], whole_ensemble: ZooKeeperEnsemble, chroot: str
) -> None:
    """Stop every member (SIGTERM, or SIGKILL every other round), wait, start them all again
    (same data); the heal is the new quorum."""
    ens = whole_ensemble
    url = zk_url(ens.hosts, chroot)
    sc = scenario("restart the whole ZooKeeper ensemble", "zk", url,
                  agent_args=["--lease", "6", "--heartbeat", "1"]).start()
    rng = random.Random(12)
    sc.wait_ops(20)
    rounds = 0
    while True:
        hard = rounds % 2 == 1
        f = sc.faults.start("restart_ensemble", "kill -9 all" if hard else "SIGTERM all")
        if hard:
            for i in range(len(ens)):
                ens.kill(i)
        else:
            ens.stop()
        time.sleep(rng.uniform(0.5, 2.0))
        ens.start_all(timeout=120)
        sc.faults.heal(f)
        rounds += 1
        if sc.remaining < 2:
            break
        time.sleep(min(sc.remaining - 1, rng.uniform(1.0, 3.0)))
    sc.finish()


def test_client_connections_cut_mid_write(
    proxies: Callable[[], ProxySet], scenario: Callable[..., Scenario],
    whole_ensemble: ZooKeeperEnsemble, chroot: str,
) -> None:
    """Every client (load and workers) reaches the ensemble through TCP proxies. Again and
    again: the next compare-and-set is dropped before the server sees it, or applied and its
    answer dropped (an ambiguous commit), or every connection is reset."""
    ens = whole_ensemble
    px = proxies()
    url = zk_url(ens.hosts, chroot)
    via = zk_url(px.hosts, chroot)
    sc = scenario("cut ZooKeeper client connections mid-write", "zk", url,
                  load_url=via, agent_url=via,
                  agent_args=["--lease", "6", "--heartbeat", "1"]).start()
    rng = random.Random(13)
    sc.wait_ops(20)
    while sc.remaining > 1:
        kind = rng.choice(["after", "after", "before", "reset"])
        if kind == "reset":
            px.cut()
            sc.faults.instant("reset_connections")
        else:
            # arm one proxy that carries compare-and-sets right now, and wait for its cut
            seen = [p.multis_seen for p in px.proxies]
            time.sleep(0.2)
            busy = [p for p, n in zip(px.proxies, seen, strict=True) if p.multis_seen > n]
            target = rng.choice(busy or px.proxies)
            cut = target.multis_cut
            f = sc.faults.start(f"cut_{kind}_cas", f"proxy :{target.port}")
            target.cut_next_multi(kind)  # type: ignore[arg-type]
            wait_for(lambda t=target, c=cut: t.multis_cut > c, 60,  # type: ignore[misc]
                     "a compare-and-set to cut")
            sc.faults.heal(f)
        time.sleep(min(max(0.0, sc.remaining - 0.5), rng.uniform(0.1, 0.6)))
    rep = sc.finish()
    sc.row.notes += f", {px.multis_cut} compare-and-sets cut of {px.multis_seen}"
    assert rep.unknown_applied <= rep.unknown


def test_worker_session_expired_for_real(
    proxies: Callable[[], ProxySet], scenario: Callable[..., Scenario],
    whole_ensemble: ZooKeeperEnsemble, chroot: str,
) -> None:
    """Worker w1 reaches the ensemble through proxies with a 2 s session. Freeze the proxies
    (a partition) until the ensemble expires the session: w1's ephemeral registration is gone.
    Thaw: w1 gets a new session, registers again and catches up."""
    ens = whole_ensemble
    px = proxies()
    url = zk_url(ens.hosts, chroot)
    sc = scenario("expire a worker's ZooKeeper session", "zk", url,
                  agent_args=["--lease", "6", "--heartbeat", "1"]).start()
    victim = sc.agents[0]
    victim.stop()
    victim.url = zk_url(px.hosts, chroot, session_timeout=2)
    victim.start().wait_ready()
    rng = random.Random(14)
    path = f"{chroot}/workers/{victim.id}"
    expiries = 0
    with raw_client(ens.hosts) as zk:
        wait_for(lambda: zk.exists(path) is not None, 30, "w1 registered")
        while True:
            owner = zk.exists(path).ephemeralOwner
            f = sc.faults.start("expire_worker_session", victim.id)
            px.freeze()
            wait_for(lambda: zk.exists(path) is None, 60, "the ensemble to expire w1's session")
            expiries += 1
            time.sleep(rng.uniform(0, 1.0))
            px.thaw()
            sc.faults.heal(f)
            wait_for(lambda o=owner: (st := zk.exists(path)) is not None  # type: ignore[misc]
                     and st.ephemeralOwner != o, 60, "w1 to register again on a new session")
            if sc.remaining < 2:
                break
            time.sleep(min(sc.remaining - 1, rng.uniform(0.5, 2.0)))
    sc.row.notes = f"{expiries} sessions expired"
    sc.finish()
