"""Worker faults under random operator load, on SQLite and on the 3-node ZooKeeper ensemble:
a worker frozen with SIGSTOP and thawed, and a worker killed with SIGKILL in the middle of a
handler and restarted by a supervisor.

Each test: 4 load processes (hot and cold locations), 3 worker agents, faults repeated for the
scenario's load time, then the checks of ``harness.Scenario.finish``: nothing lost or
duplicated, history consistent with every caller, converged (targets: 2 s after the last fault
on SQLite, 10 s on ZooKeeper). On ZooKeeper the workers' sessions last 4 s, so the longer
freezes also expire a frozen worker's session.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from harness import Scenario

from support.servers import ZooKeeperEnsemble

BACKENDS = ["sqlite", "zk"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str, str]:
    """``(name, url, worker_url)``: a fresh SQLite file, or a fresh chroot of the session's
    ensemble (workers with 4 s sessions)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/locstatus.db"
        return "sqlite", url, url
    ens: ZooKeeperEnsemble = request.getfixturevalue("whole_ensemble")
    chroot = f"/rel-{uuid.uuid4().hex[:10]}"
    base = f"zk://{ens.hosts}{chroot}?timeout=5"
    return "zk", f"{base}&session_timeout=10", f"{base}&session_timeout=4"


def test_workers_frozen_with_sigstop_and_thawed_converge(
    backend: tuple[str, str, str], scenario: Callable[..., Scenario]
) -> None:
    """SIGSTOP a worker for 0.5-6 s (past its 3 s lease, and its 4 s ZooKeeper session, at
    times), SIGCONT, again."""
    name, url, worker_url = backend
    sc = scenario("sigstop/sigcont a worker", name, url, agent_url=worker_url).start()
    rng = random.Random(1)
    sc.wait_ops(20)
    while sc.remaining > 1:
        victim = rng.choice(sc.agents)
        f = sc.faults.start("sigstop_worker", victim.id)
        victim.freeze()
        time.sleep(min(sc.remaining, rng.uniform(0.5, 6.0)))
        victim.thaw()
        sc.faults.heal(f)
        time.sleep(min(max(0.0, sc.remaining - 0.2), rng.uniform(0.2, 1.0)))
    sc.finish()


def test_workers_killed_mid_handler_and_restarted_converge(
    backend: tuple[str, str, str], scenario: Callable[..., Scenario]
) -> None:
    """kill -9 a worker while one of its handlers runs; a supervisor restarts it (same worker
    id) after 0-1 s. The heal is the restart."""
    name, url, worker_url = backend
    sc = scenario("kill -9 a worker mid-handler", name, url, agent_url=worker_url,
                  agent_args=["--slow", "0.05"]).start()
    rng = random.Random(2)
    sc.wait_ops(20)
    mid = 0
    while sc.remaining > 1:
        victim = rng.choice(sc.agents)
        deadline = time.monotonic() + 3
        while not victim.in_handler() and time.monotonic() < deadline:
            time.sleep(0.005)
        inside = victim.in_handler()
        mid += inside
        f = sc.faults.start("kill9_worker", f"{victim.id} in handler: {inside}")
        victim.kill9()
        time.sleep(rng.uniform(0, 1.0))
        victim.start()
        sc.faults.heal(f)
        victim.wait_ready()
        time.sleep(min(max(0.0, sc.remaining - 0.2), rng.uniform(0.3, 1.5)))
    sc.row.notes = f"{mid} of {sc.faults.count} kills landed inside a handler"
    assert mid >= 1, "no kill landed inside a handler"
    sc.finish()
