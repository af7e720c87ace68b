"""The Node.js worker client (clients/node/) runs its own tests (``node --test``) against real
sidecars on SQLite and on ZooKeeper, so the README's test command covers it: a Node worker and
a Python agent hold ``pausing`` until both acknowledged, a Node worker killed -9 stops blocking
when its lease lapses, one whose stream is cut through a TCP proxy converges, one cut off past
its lease fences itself and comes back, a throwing handler is retried with its error shown in
``locstatus workers`` (docs/http.md "Workers over HTTP").
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from locstatus import State, connect
from locstatus.api import create_app
from locstatus.api.server import BackgroundServer

from support.kits_zk import TcpProxy, raw_client, wait_until, zk_url

CLIENT = Path(__file__).resolve().parent.parent / "clients" / "node"
TESTS = ["test/sse.test.js", "test/worker.test.js"]


def node() -> str:
    exe = shutil.which("node")
    assert exe is not None, "Node.js >= 18 is needed for clients/node (scripts/setup.sh installs it)"
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True)
    major = int(version.stdout.strip().lstrip("v").split(".")[0])
    assert major >= 18, f"clients/node needs Node.js >= 18, found {version.stdout.strip()}"
    return exe


def test_package_has_no_runtime_dependencies() -> None:
    pkg = json.loads((CLIENT / "package.json").read_text())
    assert pkg["type"] == "module" and pkg["engines"]["node"] == ">=18"
    assert not pkg.get("dependencies") and not pkg.get("devDependencies")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("store", ["sqlite", "zk"])
def test_node_client_suite(store: str, request: pytest.FixtureRequest) -> None:
    backend = "sqlite" if store == "sqlite" else "zk:" + request.getfixturevalue("zk_server").hosts
    env = {
        "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
        "LOCSTATUS_PYTHON": sys.executable,
        "LOCSTATUS_TEST_BACKEND": backend,
        "HOME": str(Path.home()),
    }
    proc = subprocess.run(
        [node(), "--test", *TESTS],
        cwd=CLIENT, env=env, capture_output=True, text=True, timeout=540,
    )
    summary = [line for line in proc.stdout.splitlines() if line.startswith(("ok", "not ok", "#"))]
    assert proc.returncode == 0, "\n".join(summary) + "\n" + proc.stdout[-6000:] + proc.stderr[-3000:]
    assert any(line.startswith("# pass") and int(line.split()[-1]) >= 9 for line in summary), summary


def test_a_zookeeper_session_lost_by_the_sidecar_reaches_a_node_worker_which_fences_and_acknowledges_again(
    zk_server: Any, tmp_path: Path
) -> None:
    """The sidecar's ZooKeeper session really expires (its link to the server frozen past the
    session timeout, through a TCP proxy): its ephemeral acknowledgements go with it, the feed
    sends ``resync`` with ``session_lost`` (docs/http.md "Workers over HTTP"), and the Node
    worker fences, then, once its renewal holds again, acknowledges what it applied again."""
    proxy = TcpProxy(zk_server.hosts)
    chroot = f"/t-{uuid.uuid4().hex[:12]}"
    mgr = connect(zk_url(proxy.hosts, chroot, timeout=1.5, session_timeout=4))
    ack_node = f"{chroot}/acks/us-east-1/node-1"
    worker: subprocess.Popen[str] | None = None
    lines: list[str] = []
    try:
        mgr.sync_locations(["us-east-1"])
        with BackgroundServer(create_app(mgr)) as srv:
            worker = subprocess.Popen(
                [node(), str(CLIENT / "test" / "fixtures" / "acking-worker.js"), srv.url,
                 "node-1", "10"],
                stdout=subprocess.PIPE, text=True,
            )
            out = worker.stdout
            assert out is not None
            reader = threading.Thread(
                target=lambda: lines.extend(iter(out.readline, "")), daemon=True
            )
            reader.start()
            wait_until(lambda: "ready\n" in lines, 30, what="the Node worker to start")
            rec = mgr.pause("us-east-1", "replication", wait=30)
            gen = rec.services["replication"].generation
            assert rec.services["replication"].state is State.PAUSED
            assert mgr.backend.acks("us-east-1")["node-1"]["replication"] == gen
            with raw_client(zk_server.hosts) as raw:
                first = raw.exists(ack_node)
                assert first is not None and first.owner_session_id

            proxy.freeze()  # past the session timeout: the server expires the session
            time.sleep(6)
            proxy.thaw()
            wait_until(
                lambda: any("self-fencing: the sidecar lost its backend session" in line
                            for line in lines), 30, what="the Node worker to fence",
            )
            wait_until(lambda: any("fence lifted" in line for line in lines), 30,
                       what="the fence to lift")
            # Acknowledged again on the new session (the old one's acks expired with it).
            with raw_client(zk_server.hosts) as raw:
                wait_until(
                    lambda: (st := raw.exists(ack_node)) is not None
                    and st.owner_session_id != first.owner_session_id,
                    30, what="the acknowledgement again, held by the new session",
                )
            assert mgr.backend.acks("us-east-1")["node-1"]["replication"] == gen
            assert mgr.status("us-east-1").services["replication"].state is State.PAUSED
            resumed = mgr.resume("us-east-1", "replication", wait=30)
            assert resumed.services["replication"].state is State.RUNNING  # still acknowledging
    finally:
        if worker is not None:
            worker.kill()
            worker.wait(30)
        mgr.close()
        proxy.close()
    assert "pause us-east-1 replication\n" in lines
