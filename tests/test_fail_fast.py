"""Failing fast while the backend is down, and recovering fast once it is back (issue 20;
docs/reliability.md, "Failing fast while the backend is down").

On a real ZooKeeper and a real MongoDB-wire server, each stopped by PID and started again on
the same port and data:

- while the sidecar's connection is known down (ZooKeeper SUSPENDED/LOST, no MongoDB server
  selectable), ``GET /v1/locations/{loc}``, ``POST .../resume`` and the status page answer 503
  within 1 s (they waited out the 10 s ``timeout`` before);
- ``/readyz`` is 200 again within 2 s of the server serving again;
- a one-shot CLI command against an unreachable backend gives up after ``--connect-timeout``
  (``LOCSTATUS_CONNECT_TIMEOUT``, default 3 s), exit 2, naming the option.

The bounds asserted are the contract's (1 s, 2 s, the connect timeout); the connect timeout is
timed in-process (a CLI process adds its own start-up) and the CLI is shown to apply it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from locstatus import AmbiguousCommit, BackendUnavailable, Operation, connect
from locstatus.api import create_app
from locstatus.api.server import BackgroundServer
from locstatus.client import Client
from locstatus.reconciler import Reconciler

from support.kits_mongo import fresh_database, kit_url
from support.kits_zk import TcpProxy
from support.servers import free_ports, start_mongo, start_zookeeper

FAIL_FAST = 1.0
"""Seconds: the issue's bound on an answer while the connection is known down."""
READY_AGAIN = 2.0
"""Seconds: the issue's bound on /readyz after the backend answers again."""
LOCATION = "loc-a"


class Stoppable:
    """What the tests need of a server: stop by PID, start again on the same port and data."""

    def __init__(self, stop: Callable[[], None], start: Callable[[], Any]) -> None:
        self.stop = stop
        self.start = start


def until(check: Callable[[], bool], timeout: float, every: float = 0.05) -> float:
    """Poll ``check`` until true; returns the seconds it took. Fails after ``timeout``."""
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"not true within {timeout}s")
        time.sleep(every)
    return time.monotonic() - t0


@pytest.fixture(params=["zk", "mongo"])
def stack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Client, Stoppable]]:
    """A manager on a server of its own (it is stopped and started again by the test)."""
    if request.param == "zk":
        zk = start_zookeeper(tmp_path)
        try:
            mgr = connect(f"zk://{zk.hosts}/failfast")
            try:
                yield mgr, Stoppable(zk.stop, zk.start)
            finally:
                mgr.close()
        finally:
            zk.close()
    else:
        server = start_mongo(tmp_path)
        try:
            mgr = connect(kit_url(server, fresh_database()))
            try:
                yield mgr, Stoppable(server.stop, server.start)
            finally:
                mgr.close()
        finally:
            server.close()


def test_the_sidecar_answers_503_within_a_second_while_down_and_is_ready_soon_after(
    stack: tuple[Client, Stoppable],
) -> None:
    mgr, server = stack
    mgr.sync_locations({LOCATION: ["replication"]})
    mgr.pause(LOCATION, "replication", reason="maintenance")
    reconciler = Reconciler(mgr, interval=5)
    reconciler.start()
    app = create_app(mgr, reconciler=reconciler)
    try:
        with BackgroundServer(app) as srv, httpx.Client(
            base_url=srv.url, timeout=30, headers={"Content-Type": "application/json"}
        ) as http:
            assert http.get("/readyz").status_code == 200
            server.stop()
            # known down: the connection noticed (the first call after the stop may still
            # have been sent on the old connection, and is not what is measured)
            until(lambda: http.get("/readyz").status_code == 503, timeout=30)
            for method, path in (
                ("GET", f"/v1/locations/{LOCATION}"),
                ("POST", f"/v1/locations/{LOCATION}/replication/resume"),
                ("GET", "/"),
                ("GET", "/readyz"),
            ):
                t0 = time.monotonic()
                r = http.request(method, path)
                took = time.monotonic() - t0
                assert r.status_code == 503, (method, path, r.status_code, r.text)
                assert took < FAIL_FAST, f"{method} {path} took {took:.2f}s"
            server.start()  # returns once the server serves requests
            took = until(lambda: http.get("/readyz").status_code == 200, timeout=30)
            assert took < READY_AGAIN, f"/readyz ready {took:.2f}s after the backend was back"
            r = http.post(f"/v1/locations/{LOCATION}/replication/resume")
            assert r.status_code == 200, r.text
    finally:
        reconciler.stop()


def _cli(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "locstatus", *args],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, **(env or {})},
    )
    return proc, time.monotonic() - t0


@pytest.mark.parametrize("scheme", ["zk", "mongodb"])
def test_a_one_shot_command_against_an_unreachable_backend_gives_up_after_the_connect_timeout(
    scheme: str,
) -> None:
    """Nothing listens on the port: the command gives up after ``--connect-timeout`` (exit 2,
    naming the option), not after the backend's 10 s (ZooKeeper) or 5 s (MongoDB)."""
    port = free_ports(1)[0]
    url = f"zk://127.0.0.1:{port}/x" if scheme == "zk" else f"mongodb://127.0.0.1:{port}/"
    # the bound itself, measured in-process (a CLI process adds its start-up, whatever it is)
    t0 = time.monotonic()
    with pytest.raises(BackendUnavailable, match="within 1s"):
        connect(url, connect_timeout=1)
    took = time.monotonic() - t0
    assert 0.95 <= took < 1 + FAIL_FAST, f"gave up after {took:.2f}s"
    # the command line: the option, named in the message
    proc, _ = _cli("--backend", url, "--connect-timeout", "1", "status")
    assert proc.returncode == 2, proc.stderr
    assert "within 1s" in proc.stderr and "--connect-timeout" in proc.stderr, proc.stderr
    # the environment variable, and the default (3 s) when neither is given
    proc, _ = _cli("--backend", url, "status", env={"LOCSTATUS_CONNECT_TIMEOUT": "1.5"})
    assert proc.returncode == 2 and "within 1.5s" in proc.stderr, proc.stderr
    env = {k: v for k, v in os.environ.items() if k != "LOCSTATUS_CONNECT_TIMEOUT"}
    proc = subprocess.run(
        [sys.executable, "-m", "locstatus", "--backend", url, "status"],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert proc.returncode == 2 and "within 3s" in proc.stderr, proc.stderr


def test_a_url_that_sets_its_own_timeout_keeps_it() -> None:
    port = free_ports(1)[0]
    proc, _ = _cli(
        "--backend", f"zk://127.0.0.1:{port}/x?timeout=0.5", "--connect-timeout", "5", "status"
    )
    assert proc.returncode == 2 and "within 0.5s" in proc.stderr, proc.stderr


@pytest.mark.parametrize("value", ["0", "-1", "3601", "soon", "nan"])
def test_a_bad_connect_timeout_is_refused_naming_it(value: str) -> None:
    proc, _ = _cli("--backend", "memory://", "--connect-timeout", value, "status")
    assert proc.returncode == 2
    assert f"invalid --connect-timeout {value!r}" in proc.stderr, proc.stderr


def test_a_bulk_pause_on_zookeeper_gives_up_soon_after_the_server_is_killed(
    tmp_path: Path,
) -> None:
    """``pause all`` on ZooKeeper when the server is killed -9 while the bulk's multi-ops are
    in flight: those still queued in kazoo are never answered while the connection is down,
    and each was waited for with the full ``timeout`` in turn (minutes for 3000 locations).
    Now the bulk ends soon after the connection is known down, each unresolved location
    failed with BackendUnavailable or AmbiguousCommit (docs/reliability.md, "Failing fast
    while the backend is down"). A frame-parsing relay between client and server tells when
    the first multi-op of the bulk went out; the server is killed then."""
    zk = start_zookeeper(tmp_path)
    proxy = TcpProxy(zk.hosts)
    try:
        mgr = connect(f"zk://{proxy.hosts}/bulkdown?timeout=10")
        try:
            mgr.sync_locations({f"loc-{i:04d}": ["replication"] for i in range(3000)})
            killed: list[float] = []

            def kill_on_first_write() -> None:
                until(lambda: proxy.multis_cut > 0, timeout=60, every=0.001)
                zk.kill()
                killed.append(time.monotonic())

            # the first multi-op of the bulk drops the connection at once, while the rest of
            # its batch is still being sent; the server is dead before kazoo reconnects
            proxy.cut_next_multi("before")

            killer = threading.Thread(target=kill_on_first_write, daemon=True)
            killer.start()
            report = mgr.bulk(Operation.pause("replication"))
            ended = time.monotonic()
            killer.join(timeout=60)
            took = ended - killed[0]
            assert took < 5.0, f"the bulk ended {took:.1f}s after the server was killed"
            assert report.failed, "nothing failed although the server was killed"
            for item in report.failed:
                assert isinstance(item.error, (BackendUnavailable, AmbiguousCommit)), item
        finally:
            mgr.close()
    finally:
        proxy.close()
        zk.close()
