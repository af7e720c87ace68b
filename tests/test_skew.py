"""Processes whose clocks are really off (libfaketime, ``skew.py``) on SQLite, ZooKeeper and
MongoDB: issue 14 §1, docs/time.md.

Ahead: an operator 30 s ahead runs ``pause --wait 60`` while a live worker's pause handler is
still draining, and a sidecar, a ``check --repair`` and two CLI calls 3 h ahead run meanwhile.
Nothing settles before the worker applied the pause, a ``resume in 2h`` stays scheduled, a
resume due in 4 s fires no earlier than due, the stamps they write are the backend's time, and
each says how far off its clock is.

Behind: a worker 3 h behind writes leases the others see as live (so a pause waits for its
handlers) and fires a due resume on time; a check 3 h behind reports a dead worker as expired
and the living one as alive; a CLI 3 h behind schedules ``--in 2h`` two hours from the
backend's now.

The servers, and the test process (which reads the results), run on the host's real clock, so
the test's own ``datetime.now()`` is the backend's time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from locstatus import Manager, State, WorkerInfo, connect
from locstatus.models import HistoryEntry

from support.servers import free_ports
from support.skew import Skewed, mono_to_wall, require_libfaketime

SETTLE_SLACK = timedelta(seconds=0.3)
"""A stamp is its writer's estimate of the backend's time: within that writer's bound (0.25 s
at most) of the truth, plus the conversion of the worker's monotonic stamps."""

CONVERSION = timedelta(seconds=0.05)
"""How far a worker's monotonic stamp, converted to this process's wall time, may be off."""

HOURS3 = 3 * 3600.0


@pytest.fixture
def procs() -> Iterator[list[Skewed]]:
    started: list[Skewed] = []
    yield started
    for p in started:
        p.stop()


@pytest.fixture
def mgr(backend_url: str) -> Iterator[Manager]:
    require_libfaketime()
    m = connect(backend_url)
    yield m
    m.close()


def wait_for(pred: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)


def records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def handler_span(path: Path, event: str, location: str, service: str) -> tuple[float, float]:
    """Wall times (the backend's) of the first handler run: start and end (waited for)."""

    def marks() -> list[dict[str, Any]]:
        return [r for r in records(path) if r.get("event") == event
                and r.get("location") == location and r.get("service") == service]

    wait_for(lambda: any(r["phase"] == "end" for r in marks()), 30,
             f"the {event} handler of {location}/{service} to end")
    start = next(r["t"] for r in marks() if r["phase"] == "start")
    end = next(r["t"] for r in marks() if r["phase"] == "end")
    return mono_to_wall(start), mono_to_wall(end)


def entries(mgr: Manager, location: str, event: str, service: str) -> list[HistoryEntry]:
    return [e for e in mgr.history(location, limit=200) if e.event == event and e.service == service]


def watch_fire(mgr: Manager, location: str, service: str, due: datetime, timeout: float
               ) -> datetime:
    """Poll until ``service`` of ``location`` is no longer paused; return the time the first
    read that saw it fired began."""
    deadline = time.monotonic() + timeout
    while True:
        began = datetime.now(UTC)
        if mgr.status(location).services[service].state is not State.PAUSED:
            return began
        assert time.monotonic() < deadline, f"{location}/{service} due at {due} never fired"
        time.sleep(0.05)


def worker_ready(w: Skewed, record: Path) -> Callable[[], bool]:
    def ready() -> bool:
        assert w.proc.poll() is None, f"worker exited:\n{w.output()}"
        return any(r.get("event") == "ready" for r in records(record))

    return ready


def test_processes_ahead_settle_nothing_early_and_fire_nothing_early(
    mgr: Manager, backend_url: str, tmp_path: Path, procs: list[Skewed]
) -> None:
    url = backend_url
    mgr.sync_locations({"drain": ["replication"], "sched": ["replication", "lifecycle"],
                        "sched-cli": ["replication", "lifecycle"]})
    drain = tmp_path / "w-drain.jsonl"
    worker = Skewed.worker(None, url, "w-drain", drain, [
        "--services", "replication", "--locations", "drain", "--slow", "2.0", "--lease", "5",
    ], tmp_path / "w-drain.log")
    port = free_ports()[0]
    sidecar = Skewed.cli("+3h", url, ["serve", "--port", str(port), "--reconcile-interval",
                                      "0.3"], tmp_path / "sidecar.log")
    procs += [worker, sidecar]
    wait_for(worker_ready(worker, drain), 60, "the worker to start")

    def sidecar_up() -> bool:
        assert sidecar.proc.poll() is None, f"sidecar exited:\n{sidecar.output()}"
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(sidecar_up, 60, "the sidecar 3 h ahead to answer")
    for loc in ("sched", "sched-cli"):
        # nobody applies it: settled at once (by this call, or by the sidecar woken by its write)
        assert mgr.pause(loc, wait=30).services["replication"].state is State.PAUSED
    long_at = mgr.resume("sched", "replication", at=timedelta(hours=2)).services[
        "replication"].resume_at
    short_at = mgr.resume("sched", "lifecycle", at=timedelta(seconds=4)).services[
        "lifecycle"].resume_at
    assert long_at is not None and short_at is not None

    in_1h = (datetime.now(UTC) + timedelta(hours=1)).replace(microsecond=0)
    operator = Skewed.cli("+30s", url, ["pause", "drain", "--service", "replication", "--wait",
                                        "60", "--json"], tmp_path / "operator.log")
    check = Skewed.cli("+3h", url, ["check", "--repair", "--json"], tmp_path / "check.log")
    cli_in = Skewed.cli("+3h", url, ["resume", "sched-cli", "--service", "replication",
                                     "--in", "2h", "--json"], tmp_path / "cli-in.log")
    cli_at = Skewed.cli("+3h", url, ["resume", "sched-cli", "--service", "lifecycle", "--at",
                                     in_1h.isoformat(), "--json"], tmp_path / "cli-at.log")
    procs += [operator, check, cli_in, cli_at]

    # Until the operator returns and the 4 s resume fired: the 2 h resume stays put, and the
    # operator's location is seen paused only once the live worker's handler ended.
    samples: list[tuple[datetime, State]] = []
    returned: datetime | None = None
    seen: datetime | None = None
    deadline = time.monotonic() + 60
    while returned is None or seen is None:
        assert time.monotonic() < deadline, (returned, seen, operator.output())
        began = datetime.now(UTC)
        rec = mgr.status("sched")
        draining = mgr.status("drain").services["replication"].state
        samples.append((datetime.now(UTC), draining))
        st = rec.services["replication"]
        assert st.state is State.PAUSED and st.resume_at == long_at, (
            f"the resume scheduled at {long_at} changed at {began}: {st}"
        )
        if seen is None and rec.services["lifecycle"].state is not State.PAUSED:
            seen = began
        if returned is None and operator.proc.poll() is not None:
            returned = datetime.now(UTC)
        time.sleep(0.05)
    assert seen >= short_at - timedelta(seconds=1), f"fired by {seen}, due at {short_at}"
    (fired,) = entries(mgr, "sched", "resume_due", "lifecycle")
    assert short_at <= fired.at <= short_at + timedelta(seconds=30)  # the backend's time

    # The operator 30 s ahead waited for the worker's handler before calling it paused.
    assert operator.wait(60) == 0, operator.output()
    out = json.loads(operator.stdout())
    assert out["services"]["replication"]["state"] == "paused"
    started, ended = handler_span(drain, "pause", "drain", "replication")
    drained = datetime.fromtimestamp(ended, UTC) - CONVERSION
    early = [t for t, state in samples if state is State.PAUSED and t < drained]
    assert not early, f"seen paused at {early[0]}, the live worker's handler ended at {drained}"
    assert returned >= drained, f"the operator returned at {returned}, the handler ended {drained}"
    (pause,) = entries(mgr, "drain", "pause", "replication")
    # ... and stamped the pause with the backend's time, not its own
    assert datetime.fromtimestamp(operator.started, UTC) - SETTLE_SLACK <= pause.at
    assert pause.at <= datetime.fromtimestamp(started, UTC) + SETTLE_SLACK

    # The check 3 h ahead repaired nothing early and reports its own clock.
    assert check.wait(60) == 1, check.output()
    report = json.loads(check.stdout())
    assert report["clock"]["offset_seconds"] == pytest.approx(HOURS3, abs=1.0)
    own = [f for f in report["findings"] if f["id"] == "clock_skew:-:-:check"]
    assert own and own[0]["evidence"]["offset_seconds"] == pytest.approx(HOURS3, abs=1.0)
    assert {f["kind"] for f in report["findings"]} <= {"clock_skew", "stuck_transition",
                                                        "overdue_resume"}

    # The CLI 3 h ahead: --in 2h is two hours from the backend's now; --at one hour ahead of
    # the backend's time is in the future (this host's clock says it is past).
    assert cli_in.wait(60) == 0, cli_in.output()
    assert cli_at.wait(60) == 0, cli_at.output()
    stored = mgr.status("sched-cli").services
    in_2h = stored["replication"].resume_at
    assert in_2h is not None
    expected = datetime.fromtimestamp(cli_in.started, UTC) + timedelta(hours=2)
    assert expected - timedelta(seconds=1) <= in_2h <= expected + timedelta(seconds=30)
    assert stored["lifecycle"].resume_at == in_1h

    # The sidecar 3 h ahead exports its offset.
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    offset = next(float(line.split()[-1]) for line in text.splitlines()
                  if line.startswith("locstatus_clock_offset_seconds "))
    assert offset == pytest.approx(HOURS3, abs=1.0)


def test_processes_behind_look_alive_see_the_dead_and_fire_on_time(
    mgr: Manager, backend_url: str, tmp_path: Path, procs: list[Skewed]
) -> None:
    url = backend_url
    mgr.sync_locations({"behind": ["replication", "lifecycle"], "behind-cli": ["replication"]})
    mgr.backend.put_worker(WorkerInfo(  # died 30 s ago, by the backend's time
        worker_id="w-dead", services=("ingestion",), host="gone", pid=1,
        lease_expires_at=datetime.now(UTC) - timedelta(seconds=30),
    ))
    record = tmp_path / "w-behind.jsonl"
    worker = Skewed.worker("-3h", url, "w-behind", record, [
        "--services", "replication,lifecycle", "--locations", "behind", "--slow", "1.0",
        "--lease", "4",
    ], tmp_path / "w-behind.log")
    procs.append(worker)
    wait_for(worker_ready(worker, record), 60, "the worker 3 h behind to start")

    # Its lease is the backend's time plus 4 s: alive, not three hours dead.
    (info,) = [w for w in mgr.workers() if w.worker_id == "w-behind"]
    assert info.lease_expires_at is not None
    left = (info.lease_expires_at - datetime.now(UTC)).total_seconds()
    assert 0 < left <= 4.5, f"lease of the worker 3 h behind ends in {left:.1f}s"

    # So a pause waits for its handlers.
    rec = mgr.pause("behind", wait=30)
    returned = datetime.now(UTC)
    assert all(s.state is State.PAUSED for s in rec.services.values())
    for svc in ("replication", "lifecycle"):
        _, ended = handler_span(record, "pause", "behind", svc)
        drained = datetime.fromtimestamp(ended, UTC) - CONVERSION
        assert returned >= drained, f"{svc}: paused at {returned}, its handler ended {drained}"
        (settle,) = entries(mgr, "behind", "settle", svc)
        assert settle.at >= drained - SETTLE_SLACK, (svc, settle)

    assert mgr.pause("behind-cli").services["replication"].state is State.PAUSED
    short_at = mgr.resume("behind", "lifecycle", at=timedelta(seconds=2)).services[
        "lifecycle"].resume_at
    assert short_at is not None
    check = Skewed.cli("-3h", url, ["check", "--json"], tmp_path / "check.log")
    cli = Skewed.cli("-3h", url, ["resume", "behind-cli", "--in", "2h", "--json"],
                     tmp_path / "cli.log")
    procs += [check, cli]

    # The worker 3 h behind (the only one to fire it) fires the resume when it is due.
    seen = watch_fire(mgr, "behind", "lifecycle", short_at, timeout=30)
    assert seen >= short_at - timedelta(seconds=1)
    (fired,) = entries(mgr, "behind", "resume_due", "lifecycle")
    assert fired.actor == "agent:w-behind"
    assert short_at <= fired.at <= short_at + timedelta(seconds=20)

    # The check 3 h behind: the dead worker is expired, the living one is not, its own clock
    # is reported.
    assert check.wait(60) == 1, check.output()
    report = json.loads(check.stdout())
    expired = {f["worker_id"] for f in report["findings"] if f["kind"] == "expired_worker"}
    assert expired == {"w-dead"}
    assert report["clock"]["offset_seconds"] == pytest.approx(-HOURS3, abs=1.0)
    assert "clock_skew:-:-:check" in {f["id"] for f in report["findings"]}

    # The CLI 3 h behind schedules two hours from the backend's now.
    assert cli.wait(60) == 0, cli.output()
    at = mgr.status("behind-cli").services["replication"].resume_at
    expected = datetime.fromtimestamp(cli.started, UTC) + timedelta(hours=2)
    assert at is not None
    assert expected - timedelta(seconds=1) <= at <= expected + timedelta(seconds=30)


# -- the operator's recipe: Debian's faketime wrapper (docs/time.md "Reproducing a skewed host")


def run_under_faketime(
    url: str, args: list[str], *, fake_monotonic: bool, timeout: float
) -> tuple[int, str, str, float]:
    """``[FAKETIME_DONT_FAKE_MONOTONIC=1] faketime '+30 seconds' locstatus --backend URL ARGS``
    as an operator types it: the wrapper, no shim on the path. Returns (exit code, stdout,
    stderr, seconds); on a hang, kills the process group it started and fails."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FAKETIME", "LD_PRELOAD")) and k != "PYTHONPATH"}
    if not fake_monotonic:
        env["FAKETIME_DONT_FAKE_MONOTONIC"] = "1"
    began = time.monotonic()
    proc = subprocess.Popen(
        ["faketime", "+30 seconds", sys.executable, "-m", "locstatus", "--backend", url, *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the wrapper and the locstatus it forked
        out, err = proc.communicate()
        raise AssertionError(f"{args} hung under faketime for {timeout:g}s: {err[-2000:]}") from None
    return proc.returncode, out, err, time.monotonic() - began


def test_faketime_faking_the_monotonic_clock_is_refused_at_once_not_a_hang(
    mgr: Manager, backend_url: str, tmp_path: Path, procs: list[Skewed]
) -> None:
    """A new-user review: ``faketime '+30 seconds' locstatus pause X --wait 10`` hung for good
    while a live worker applied the pause: the wrapper fakes CLOCK_MONOTONIC too (it reads the
    faked wall clock, ~1.8e9 s), and every timed wait of Python then waits for decades
    (docs/time.md). The CLI now refuses, naming the fix, before it writes anything."""
    mgr.sync_locations({"drain": ["replication"]})
    record = tmp_path / "w.jsonl"
    worker = Skewed.worker(None, backend_url, "w-drain", record, [
        "--services", "replication", "--locations", "drain", "--slow", "0.5", "--lease", "5",
    ], tmp_path / "w.log")
    procs.append(worker)
    wait_for(worker_ready(worker, record), 60, "the worker to start")
    code, _, err, took = run_under_faketime(
        backend_url, ["pause", "drain", "--service", "replication", "--wait", "10"],
        fake_monotonic=True, timeout=30)
    assert code == 2 and "FAKETIME_DONT_FAKE_MONOTONIC=1" in err, err
    assert took < 10  # refused, not waited out
    assert mgr.status("drain").services["replication"].state is State.RUNNING  # nothing written


def test_the_documented_faketime_recipe_waits_for_the_worker_without_any_shim(
    mgr: Manager, backend_url: str, tmp_path: Path, procs: list[Skewed]
) -> None:
    """docs/time.md's recipe, ``FAKETIME_DONT_FAKE_MONOTONIC=1 faketime '+30 seconds' locstatus
    pause X --wait 10``, with a live worker whose handler takes 2 s: it returns ``paused`` once
    the handler ended, on the backend's time, with nothing on the Python path."""
    mgr.sync_locations({"drain": ["replication"]})
    record = tmp_path / "w.jsonl"
    worker = Skewed.worker(None, backend_url, "w-drain", record, [
        "--services", "replication", "--locations", "drain", "--slow", "2.0", "--lease", "5",
    ], tmp_path / "w.log")
    procs.append(worker)
    wait_for(worker_ready(worker, record), 60, "the worker to start")
    code, out, err, took = run_under_faketime(
        backend_url, ["pause", "drain", "--service", "replication", "--wait", "10", "--json"],
        fake_monotonic=False, timeout=60)
    assert code == 0, err
    assert json.loads(out)["services"]["replication"]["state"] == "paused", out
    _, handler_end = handler_span(record, "pause", "drain", "replication")
    settled = entries(mgr, "drain", "settle", "replication")[0].at
    assert settled.timestamp() >= handler_end - CONVERSION.total_seconds()
    assert abs(settled.timestamp() - time.time()) < 10  # stamped on the backend's time, not +30 s
    assert took >= 2.0
