"""A handler that hangs, under random operator load, on SQLite and on the 3-node ZooKeeper
ensemble (docs/agent.md "Handlers", docs/reliability.md).

Worker w1's ``on_pause`` for one location (``stuck-1``) never returns until the test releases
it: a consumer that will not stop. While it hangs, the load goes on over the hot and cold
locations, and the test probes another location (``probe-1``) with ``pause(wait=)`` and
``resume(wait=)``: every probe must settle, because one location's handler does not stop a
worker applying the others. The hung handler must be reported where an operator looks: in w1's
registration (``WorkerInfo.stuck``) once past its 1 s deadline, and in the ``SettleTimeout`` of
a ``wait=`` on ``stuck-1``, which names w1 and where it is stuck. Then the handler is released
(the heal) and the scenario finishes as the others do: nothing lost or duplicated, converged.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from harness import Scenario

from locstatus import SettleTimeout, State, connect

from support.servers import ZooKeeperEnsemble

STUCK = "stuck-1"
PROBE = "probe-1"
SVC = "replication"


@pytest.fixture(params=["sqlite", "zk"])
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


def test_a_hung_handler_blocks_only_its_own_location(
    backend: tuple[str, str, str], scenario: Callable[..., Scenario], tmp_path: Path
) -> None:
    name, url, worker_url = backend
    release = tmp_path / "release-hung-handler"
    sc = scenario(
        "hung handler on one location", name, url, agent_url=worker_url,
        agent_args=["--hang-worker", "w1", "--hang-location", STUCK,
                    "--hang-release", str(release), "--handler-deadline", "1"],
        extra_locations=[STUCK, PROBE],
    ).start()
    sc.wait_ops(20)
    mgr = connect(url)
    probes, settled, slowest, reported_after = 0, 0, 0.0, None
    try:
        f = sc.faults.start("hung_handler", f"w1 on_pause at {STUCK}")
        t0 = time.monotonic()
        mgr.pause(STUCK, SVC)
        key = f"{STUCK}/{SVC}"
        while sc.remaining > 1:
            if reported_after is None and any(
                w.worker_id == "w1" and key in w.stuck for w in mgr.workers()
            ):
                reported_after = time.monotonic() - t0
            for op in (mgr.pause, mgr.resume):
                probes += 1
                start = time.monotonic()
                try:
                    rec = op(PROBE, SVC, wait=15)
                except SettleTimeout:
                    continue
                slowest = max(slowest, time.monotonic() - start)
                settled += rec.services[SVC].state in (State.PAUSED, State.RUNNING)
        with pytest.raises(SettleTimeout) as err:
            mgr.wait_settled(STUCK, SVC, timeout=1)
        assert "w1" in err.value.lagging and err.value.stuck.get("w1") == [key], err.value
        assert f"at {key}" in str(err.value)
        release.touch()
        sc.faults.heal(f)
    finally:
        release.touch()
        mgr.close()
    sc.finish()
    sc.row.notes += (f"; probes settled {settled}/{probes} while w1 hung (slowest "
                     f"{slowest:.2f}s); stuck reported after {reported_after or 0:.1f}s")
    assert probes >= 4 and settled == probes, f"{settled} of {probes} probes settled"
    assert reported_after is not None and reported_after < 10
