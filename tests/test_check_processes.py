"""The consistency check with real OS processes, on every backend other processes can reach
(``durable_kit``: SQLite, ZooKeeper, MongoDB).

- a worker process killed with SIGKILL in the middle of its pause handler leaves the location
  ``pausing``: the check reports it, refuses to settle while the dead worker's lease holds, and
  settles it (once) when the lease has run out;
- two ``check --repair`` processes started at the same instant on a store with every kind of
  drift repair each drift exactly once, verified through history and the repairs they report;
- ``locstatus check`` (the CLI) prints the JSON report, writes the metrics file and exits with
  the report's code; the sidecar serves its periodic check at ``/v1/check``.

Drift is made "in the past" by a manager whose clock runs two days behind: the processes under
test run on the real clock and see overdue resumes, expired leases and old tombstones without
anyone sleeping.
"""

from __future__ import annotations

import json
import multiprocessing
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from locstatus import Manager, NotFound, State, WorkerInfo, connect, open_backend
from locstatus.backends import Backend
from locstatus.check import run_check
from locstatus.manager import worker_live

from support.kits import Kit

LOC = "us-east-1"
SVC = "replication"




def eventually(check: Callable[[], Any], timeout: float = 90.0, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last: {value!r})")
        time.sleep(every)


def events(mgr: Manager, location: str, event: str, service: str | None = None) -> list[Any]:
    return [
        e
        for e in mgr.backend.history(location, limit=10_000)
        if e.event == event and service in (None, e.service)
    ]


class PastClock:
    """The real clock, two days ago: drift made with it is old by the time the check runs."""

    def __call__(self) -> datetime:
        return datetime.now(UTC) - timedelta(days=2)


# -- kill -9 mid-handler ----------------------------------------------------------------------


HANGING_WORKER = """
import json, sys, time
from locstatus import connect

url, worker_id, trace = sys.argv[1:4]
agent = connect(url).agent(worker_id, services=["replication"], lease_seconds=10.0)

def mark(**fields):
    with open(trace, "a") as fh:
        fh.write(json.dumps(fields) + "\\n")

@agent.on_pause("replication")
def stop(location):
    mark(event="pause", phase="start", location=location)
    time.sleep(3600)  # stuck in the handler until killed
    mark(event="pause", phase="end", location=location)

@agent.on_resume("replication")
def start(location):
    mark(event="resume", phase="end", location=location)

agent.start()
mark(event="ready")
while True:
    time.sleep(1)
"""


@pytest.fixture
def worker_proc(backend_url: str, tmp_path: Path) -> Iterator[Callable[[str], subprocess.Popen[bytes]]]:
    """A worker process (a real :class:`~locstatus.agent.Agent`, 10 s lease) whose pause
    handler never returns; it traces its handler calls to ``<id>.jsonl``."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(worker_id: str) -> subprocess.Popen[bytes]:
        with (tmp_path / f"{worker_id}.log").open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-c", HANGING_WORKER, backend_url, worker_id,
                 str(tmp_path / f"{worker_id}.jsonl")],
                stdout=log, stderr=subprocess.STDOUT,
            )
        procs.append(proc)
        return proc

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x] if path.exists() else []


def test_worker_killed_mid_handler_is_settled_only_after_its_lease_ran_out(
    backend_url: str, worker_proc: Callable[[str], subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    mgr = connect(backend_url)
    mgr.sync_locations({LOC: [SVC]})
    proc = worker_proc("w1")
    trace = tmp_path / "w1.jsonl"
    eventually(lambda: any(r.get("event") == "ready" for r in records(trace)))
    mgr.pause(LOC, SVC, reason="maintenance")
    eventually(lambda: ("pause", "start") in [(r.get("event"), r.get("phase"))
                                              for r in records(trace)])
    proc.send_signal(signal.SIGKILL)  # in the middle of its pause handler
    proc.wait(10)
    assert ("pause", "end") not in [(r.get("event"), r.get("phase")) for r in records(trace)]

    # Its lease still holds: the check names it and refuses to settle.
    report = run_check(mgr, repair=True, stuck_after=0)
    (stuck,) = [f for f in report.findings if f.kind == "stuck_transition"]
    assert stuck.evidence["lagging_workers"][0]["worker_id"] == "w1"
    assert stuck.evidence["lagging_workers"][0]["lease_alive"] is True
    assert stuck.state == "blocked" and report.exit_code == 1
    assert mgr.status(LOC).services[SVC].state is State.PAUSING

    # Once its lease has run out (heartbeat expiry, or the ZooKeeper session timing out) by the
    # backend's time beyond doubt, as the check judges it (docs/time.md) ...
    eventually(lambda: not any(w.worker_id == "w1" and worker_live(w, mgr.time)
                               for w in mgr.workers()))
    report = run_check(mgr, repair=True, stuck_after=0)
    (stuck,) = [f for f in report.findings if f.kind == "stuck_transition"]
    assert stuck.state == "repaired", report.as_dict()["repairs"]
    assert all(not w["lease_alive"] for w in stuck.evidence["lagging_workers"])
    assert report.exit_code == 0
    rec = mgr.status(LOC)
    assert rec.services[SVC].state is State.PAUSED
    assert len(events(mgr, LOC, "settle", SVC)) == 1
    assert "w1" not in [w.worker_id for w in mgr.workers()]  # expired registration dropped
    second = run_check(mgr, repair=True, stuck_after=0)
    assert second.findings == [] and second.exit_code == 0
    mgr.close()


# -- two check --repair processes at once -----------------------------------------------------


N = 15


def _drift(url: str, kit: Kit) -> tuple[dict[str, list[str]], Backend]:
    """Every kind of drift, N of each repairable kind; returns (expected, keeper's client)."""
    past = Manager(open_backend(url), clock=PastClock())
    stuck = [f"stuck-{i:02d}" for i in range(N)]
    due = [f"due-{i:02d}" for i in range(N)]
    gone = [f"gone-{i:02d}" for i in range(N)]
    extra = [f"extra-{i:02d}" for i in range(N)]
    past.sync_locations({name: [SVC] for name in stuck + due + gone + extra + ["drift"]})
    dead = open_backend(url)  # a worker that died two days ago, for the stuck locations
    dead.put_worker(WorkerInfo(worker_id="dead", services=(SVC,), locations=tuple(stuck),
                               lease_expires_at=past.clock() + timedelta(seconds=30)))
    for name in stuck:
        assert past.pause(name, SVC).services[SVC].state is State.PAUSING
    dead.close()  # session backends: its node goes with its session
    for name in due:
        past.pause(name, SVC)
        past.resume(name, SVC, at=timedelta(minutes=1))
    for name in gone:
        past.remove_location(name)
    # a live worker applying the extra locations: their new tombstones wait for its ack
    keeper = open_backend(url)
    keeper.put_worker(WorkerInfo(worker_id="keeper", services=(SVC,), locations=tuple(extra),
                                 lease_expires_at=datetime.now(UTC) + timedelta(hours=1)))
    rec = past.status("drift")
    st = rec.services[SVC].model_copy(update={"generation": 9})
    past.backend.compare_and_set(rec.model_copy(update={"services": {SVC: st}}), rec.version, [])
    kit.write_raw("zz-corrupt", "{not json")
    past.close()
    expected = {name: [SVC] for name in stuck + due + ["drift", "zz-corrupt"]}
    expected.update({f"want-{i:02d}": [SVC] for i in range(N)})
    return expected, keeper



def _check_process(url: str, expected: dict[str, list[str]], barrier: Any, out: Any) -> None:
    mgr = connect(url)
    barrier.wait(60)
    report = run_check(mgr, repair=True, expected=expected)
    out.put(report.as_dict())
    mgr.close()


def test_two_check_repair_processes_repair_each_drift_exactly_once(
    backend_url: str, durable_kit: Kit
) -> None:
    expected, keeper = _drift(backend_url, durable_kit)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    out = ctx.Queue()
    procs = [ctx.Process(target=_check_process, args=(backend_url, expected, barrier, out))
             for _ in range(2)]
    for p in procs:
        p.start()
    reports = [out.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0

    mgr = connect(backend_url)
    outcomes = Counter((r["action"], r["outcome"]) for rep in reports for r in rep["repairs"])
    assert not [k for k in outcomes if k[1] in ("failed", "not_attempted")], outcomes
    # Each drift repaired by exactly one of the two, whichever got there first; the other
    # reports it done by someone else (remove_worker is idempotent and is not counted).
    for action in ("fire_due_resumes", "settle", "add_location", "remove_location",
                   "purge_location"):
        assert outcomes[(action, "applied")] == N, (action, outcomes)
    for i in range(N):
        due, stuck = f"due-{i:02d}", f"stuck-{i:02d}"
        assert len(events(mgr, due, "resume_due", SVC)) == 1
        assert mgr.status(due).services[SVC].state is State.RUNNING
        assert len(events(mgr, stuck, "settle", SVC)) == 1
        assert mgr.status(stuck).services[SVC].state is State.PAUSED
        with pytest.raises(NotFound):
            mgr.status(f"gone-{i:02d}")
        assert mgr.status(f"extra-{i:02d}").deleted
        assert len(events(mgr, f"extra-{i:02d}", "remove")) == 1
        assert len(events(mgr, f"want-{i:02d}", "create")) == 1
    assert "dead" not in [w.worker_id for w in mgr.workers()]
    for rep in reports:  # what cannot be repaired is reported by both and left alone
        left = {(f["kind"], f["location"]) for f in rep["findings"] if f["state"] == "open"}
        assert left == {("corrupt_record", "zz-corrupt"), ("history_mismatch", "drift")}
        assert rep["exit_code"] == 1
    after = run_check(mgr, expected=expected)
    assert sorted({(f.kind.value, f.location) for f in after.findings}) == [
        ("corrupt_record", "zz-corrupt"), ("history_mismatch", "drift")
    ]
    assert mgr.status("drift").services[SVC].generation == 9  # never rewritten
    mgr.close()
    keeper.close()


# -- the command line and the sidecar ---------------------------------------------------------


def test_cli_check_prints_json_writes_metrics_and_exits_with_the_report_code(
    backend_url: str, tmp_path: Path
) -> None:
    past = Manager(open_backend(backend_url), clock=PastClock())
    past.sync_locations({LOC: [SVC], "old": [SVC]})
    past.pause(LOC, SVC)
    past.resume(LOC, SVC, at=timedelta(minutes=1))
    past.close()
    listing = tmp_path / "locations.txt"
    listing.write_text(f"{LOC}\n")
    prom = tmp_path / "check.prom"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "locstatus", "--backend", backend_url, "--services", SVC,
             "check", *args], capture_output=True, text=True, timeout=240,
        )

    dry = cli("--json", "--locations", str(listing), "--repair", "--dry-run")
    assert dry.returncode == 1, dry.stderr
    report = json.loads(dry.stdout)
    assert {(f["kind"], f["location"]) for f in report["findings"]} == {
        ("overdue_resume", LOC), ("unknown_location", "old")
    }
    assert {r["outcome"] for r in report["repairs"]} == {"planned"}

    done = cli("--json", "--locations", str(listing), "--repair", "--metrics-file", str(prom))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "repaired"
    assert 'locstatus_check_findings{kind="overdue_resume"} 1' in prom.read_text()
    assert "locstatus_check_exit_code 0" in prom.read_text()

    # "old" is now a tombstone; no live worker applies it, so it is ready to purge at once
    human = cli("--locations", str(listing), "--repair")
    assert human.returncode == 0, human.stderr
    assert "tombstone_ready" in human.stdout and "purged" in human.stdout
    clean = cli("--locations", str(listing))
    assert clean.returncode == 0, clean.stderr
    assert "clean" in clean.stdout


def test_sidecar_serves_its_periodic_check(backend_url: str, tmp_path: Path,
                                           durable_kit: Kit) -> None:
    past = Manager(open_backend(backend_url), clock=PastClock())
    past.sync_locations({LOC: [SVC], "old": [SVC]})
    past.remove_location("old")  # a tombstone older than the TTL: the reconciler leaves it
    past.close()
    durable_kit.write_raw("broken", "[1, 2]")
    log = tmp_path / "serve.log"
    code = (
        "from locstatus.api.server import serve\n"
        f"serve({backend_url!r}, host='127.0.0.1', port=0, token=None, insecure=False,"
        " reconcile_interval=1.0, check_interval=0.5)\n"
    )
    with log.open("wb") as fh:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=fh, stderr=subprocess.STDOUT)
    try:
        def base() -> str | None:
            if proc.poll() is not None:
                raise AssertionError(log.read_text())
            m = re.search(r"locstatus sidecar on (http://\S+?),", log.read_text())
            return m.group(1) if m else None

        url = eventually(base, timeout=120)

        def last_check() -> dict[str, Any] | None:
            try:
                r = httpx.get(url + "/v1/check", timeout=30)
            except httpx.TransportError:  # logged the address, not listening yet
                return None
            return r.json() if r.status_code == 200 else None

        view = eventually(last_check, timeout=120)
        result = view["result"]
        assert result["format"] == "locstatus.check/1"
        assert result["options"]["repair"] is False
        assert {(f["kind"], f["location"]) for f in result["findings"]} == {
            ("corrupt_record", "broken"), ("tombstone_ready", "old")
        }
        assert result["exit_code"] == 1
        with connect(backend_url) as mgr:
            assert mgr.status("old").deleted  # the periodic check is read-only
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
