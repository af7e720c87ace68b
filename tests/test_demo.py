"""``locstatus demo`` and its worker program, run for real: OS processes, a SQLite store, the
sidecar on a free port.

What an operator would check after watching it: while a location is paused no worker moves a
single object there, and after the resume every worker moves objects again; the scheduled resume
is fired by the sidecar's reconciler; the demo never touches the store named by
``$LOCSTATUS_BACKEND``; and when it ends (by itself, or with ``--keep`` on SIGTERM) no process it
started is left behind.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from locstatus.client import connect
from locstatus.demo.worker import read_status
from locstatus.locations import load_sample
from locstatus.models import State

from support.kits_zk import zk_url

pytestmark = pytest.mark.timeout(240)

DEMO = [sys.executable, "-m", "locstatus", "demo"]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a demo: no LOCSTATUS_* setting, temporary files under ``tmp_path``
    (the demo's own directory, kept with --keep or after a failure, lands there too)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCSTATUS_")}
    env["TMPDIR"] = str(tmp_path)
    env.update(extra)
    return env


def _summary(stdout: str) -> dict[str, Any]:
    """The demo's last output line: its JSON summary."""
    last = stdout.strip().splitlines()[-1]
    data: dict[str, Any] = json.loads(last)
    return data


def _gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_demo_shows_workers_stop_while_paused_and_start_again(tmp_path: Path) -> None:
    production = tmp_path / "production.db"
    started = time.monotonic()
    proc = subprocess.run(
        [*DEMO, "--workers", "2", "--duration", "15", "--port", "0"],
        cwd=tmp_path,
        env=_env(tmp_path, LOCSTATUS_BACKEND=f"sqlite:///{production}"),
        capture_output=True,
        text=True,
        timeout=180,
    )
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = _summary(proc.stdout)
    assert summary["demo"] == "ok"
    assert 14 <= elapsed < 120

    # The demo used its own temporary store, never $LOCSTATUS_BACKEND nor ./locstatus.db, and
    # removed it at the end.
    assert not production.exists()
    assert not (tmp_path / "locstatus.db").exists()
    store_file = Path(summary["store"].removeprefix("sqlite:///"))
    assert store_file.name == "locstatus.db" and store_file.parent.parent == tmp_path
    assert list(tmp_path.iterdir()) == [], "the demo's temporary directory is removed"

    steps = {s["location"]: s for s in summary["steps"]}
    assert set(steps) == {"us-east-1", "eu-west-par"}
    assert steps["us-east-1"]["services"] == ["ingestion", "lifecycle"]
    assert steps["eu-west-par"]["services"] == ["replication"]
    assert steps["us-east-1"]["resume"] == "scheduled"
    assert steps["us-east-1"]["resumed_by"].startswith("scheduler:"), "the sidecar fired it"
    assert steps["eu-west-par"]["resume"] == "immediate"
    workers = summary["workers"]
    assert set(workers) == {"demo-1", "demo-2"}
    for step in steps.values():
        for wid in workers:
            assert step["moved_before_pause"][wid] > 0
            assert step["moved_while_paused"][wid] == 0
            assert step["moved_after_resume"][wid] > 0

    # The narration shows the stops before the starts.
    out = proc.stdout
    paused_at = out.index("us-east-1 (every service: ingestion, lifecycle) settled to paused")
    fired_at = out.index("scheduled resume of us-east-1 fired by scheduler:")
    running_at = out.index("us-east-1 (every service: ingestion, lifecycle) running again")
    assert paused_at < fired_at < running_at
    assert out.index("replication at eu-west-par settled to paused") < out.index(
        "replication at eu-west-par running again"
    )

    # Every worker process exited cleanly and is gone.
    for info in workers.values():
        assert info["exit_code"] == 0
        assert info["moved"] > 0
        assert _gone(info["pid"])


def _reader(stream: Any, lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def test_demo_keep_stays_up_until_sigterm_on_the_given_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    # The store is given on the command line: global options go before the command.
    proc = subprocess.Popen(
        [*DEMO[:-1], "--backend", url, "demo", "--workers", "1", "--duration", "1",
         "--port", "0", "--keep"],
        cwd=tmp_path,
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    errors: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
    threading.Thread(target=_reader, args=(proc.stderr, errors), daemon=True).start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while not any("still running (--keep)" in line for line in seen):
            assert time.monotonic() < deadline, "".join(seen)
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                continue
            assert line is not None, "demo ended early:\n" + "".join(seen)
            seen.append(line)

        # Still up after the scenario: the worker holds a live lease, everything runs.
        time.sleep(1.5)
        assert proc.poll() is None
        with connect(url) as mgr:
            alive = [w for w in mgr.workers() if w.alive(mgr.clock())]
            assert [w.worker_id for w in alive] == ["demo-1"]
            worker_pid = alive[0].pid
            for rec in mgr.statuses():
                assert all(st.state is State.RUNNING for st in rec.services.values())
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    out = "".join(seen) + "".join(iter(lambda: lines.get(timeout=10) or "", ""))
    err = "".join(iter(lambda: errors.get(timeout=10) or "", ""))
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    assert _summary(out)["demo"] == "ok"
    kept = re.search(r"kept in (\S+)", err)
    assert kept, err
    assert {p.name for p in Path(kept.group(1)).iterdir()} >= {"demo-1.json", "demo-1.log"}
    assert _gone(worker_pid)

    # What the demo did is in the store's history, in order, written by the right actors.
    with connect(url) as mgr:
        assert mgr.workers() == []  # the worker unregistered when it stopped
        events = [
            (e.service, e.event, e.to_state, e.actor or "")
            for e in reversed(mgr.history("us-east-1", limit=100))
            if e.service == "ingestion"
        ]
        kinds = [(ev, to) for _, ev, to, _ in events]
        assert kinds == [
            ("pause", State.PAUSING),
            ("settle", State.PAUSED),
            ("schedule_resume", State.PAUSED),
            ("resume_due", State.RESUMING),
            ("settle", State.RUNNING),
        ]
        assert next(a for _, ev, _, a in events if ev == "resume_due").startswith("scheduler:")
        repl = [
            (e.event, e.to_state)
            for e in reversed(mgr.history("eu-west-par", limit=100))
            if e.service == "replication"
        ]
        assert repl == [
            ("pause", State.PAUSING),
            ("settle", State.PAUSED),
            ("resume", State.RESUMING),
            ("settle", State.RUNNING),
        ]
        # Only what the demo paused changed: lifecycle at eu-west-par was never paused.
        assert all(
            e.event == "create" or e.service != "lifecycle"
            for e in mgr.history("eu-west-par", limit=100)
        )


def test_demo_runs_on_a_zookeeper_store(zk_server: Any, tmp_path: Path) -> None:
    """The compose stack runs the same workers on ZooKeeper (ephemeral worker nodes, watches)."""
    url = zk_url(zk_server.hosts)
    proc = subprocess.run(
        [*DEMO[:-1], "--backend", url, "demo", "--workers", "2", "--duration", "8", "--port", "0"],
        cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = _summary(proc.stdout)
    assert summary["demo"] == "ok"
    for step in summary["steps"]:
        assert set(step["moved_while_paused"].values()) == {0}
        assert min(step["moved_after_resume"].values()) > 0
    with connect(url) as mgr:
        assert mgr.workers() == []
        assert {r.location for r in mgr.statuses()} == set(load_sample())
        assert all(
            st.state is State.RUNNING for r in mgr.statuses() for st in r.services.values()
        )


def test_workers_do_not_outlive_a_killed_demo(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [*DEMO, "--workers", "2", "--duration", "60", "--port", "0"],
        cwd=tmp_path, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
    seen = ""
    try:
        deadline = time.monotonic() + 120
        while "workers registered" not in seen:
            assert time.monotonic() < deadline, seen
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                continue
            assert line is not None, seen
            seen += line
    finally:
        proc.kill()  # no clean-up at all: SIGKILL
        proc.wait(timeout=30)
    pids = [int(p) for p in re.findall(r"demo-\d+ \(pid (\d+)\)", seen)]
    assert len(pids) == 2, seen
    for pid in pids:
        assert _gone(pid, timeout=30), f"worker {pid} outlived the demo"


def test_demo_refuses_a_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run(
            [*DEMO, "--port", str(port)],
            cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=60,
        )
    assert proc.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr
    assert "started workers" not in proc.stdout


def test_demo_refuses_a_given_store_where_a_sample_location_is_paused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ops.db'}"
    with connect(url) as mgr:
        mgr.sync_locations(load_sample())
        mgr.pause("us-east-1", "lifecycle", reason="real maintenance", actor="ops")
    proc = subprocess.run(
        [*DEMO[:-1], "--backend", url, "demo", "--port", "0"],
        cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 1
    assert "lifecycle at us-east-1 is not running" in proc.stderr
    assert _summary(proc.stdout)["demo"] == "failed"
    with connect(url) as mgr:  # the operator's pause is untouched
        st = mgr.status("us-east-1").services["lifecycle"]
        assert st.state in (State.PAUSING, State.PAUSED) and st.reason == "real maintenance"


def test_worker_healthcheck_follows_the_worker(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'w.db'}"
    with connect(url) as mgr:
        mgr.sync_locations(load_sample())
    status = tmp_path / "w1.json"
    check = [sys.executable, "-m", "locstatus.demo.worker", "--healthcheck",
             "--status-file", str(status), "--max-age", "30"]

    def healthcheck() -> subprocess.CompletedProcess[str]:
        return subprocess.run(check, capture_output=True, text=True, timeout=60, env=_env(tmp_path))

    before = healthcheck()
    assert before.returncode == 1 and "no readable status" in before.stderr
    worker = subprocess.Popen(
        [sys.executable, "-m", "locstatus.demo.worker", "--backend", url, "--id", "w1",
         "--status-file", str(status), "--log-every", "0"],
        env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while healthcheck().returncode != 0:
            assert worker.poll() is None, worker.communicate()[0]
            assert time.monotonic() < deadline
            time.sleep(0.3)
        data = read_status(status)
        assert data is not None and data["worker_id"] == "w1" and data["pid"] == worker.pid
        wanted = load_sample()
        assert {loc: sorted(per) for loc, per in data["locations"].items()} == {
            loc: sorted(svcs) for loc, svcs in wanted.items()
        }
    finally:
        worker.send_signal(signal.SIGTERM)
        output = worker.communicate(timeout=30)[0]
    assert worker.returncode == 0, output
    after = healthcheck()
    assert after.returncode == 1 and "worker stopped" in after.stderr
    final = read_status(status)
    assert final is not None
    assert not any(c["running"] for per in final["locations"].values() for c in per.values())
