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
from pathlib import Path

import pytest

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
