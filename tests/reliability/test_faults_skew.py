"""Clocks off by +30 s, +3 h and -3 h (libfaketime), under random operator load (SQLite).

The three worker agents run with their wall clocks 30 s ahead, 3 h ahead and 3 h behind, and
each fires scheduled resumes; a sidecar 3 h ahead reconciles every 0.3 s (fires due resumes,
settles) and a ``check --repair`` 3 h ahead runs again and again, while the load pauses,
resumes and schedules resumes. Leases are 3 s: to a process 30 s or 3 h ahead judging on its
own clock every live worker would look dead, and the worker 3 h behind would write leases that
ended hours ago (issue 14 §1).

Resumes that come due while the skewed processes run: the load's own short schedules come due
only in its first seconds at CI length, mostly on hot services a later operation overrides, so
the run fired none of them ("resumes fired 0"): the early-resume check had nothing to check.
So the test itself runs rounds on locations of their own (``DUE``, no load there): pause every
service, schedule its resume ``AHEAD`` seconds later, wait until every one fired, again while
the load runs. Any of the firers may fire one: the workers, the sidecar, the check; a process 3
h ahead (or 30 s) judging on its own clock would fire each at once, seconds early by the
backend's time, which the checker counts (by the first worker handler that applied it).

The convergence target is SQLite's 2 s (issue 8), kept. What this scenario's convergence time
is made of (report.json's ``convergence_trace``, and the lag from each write to each worker's
handler in its events file): not the checker (it connects and probes its clock before the
clock starts), nor a resume due at the end (the rounds come due ``LEAD`` s before it), but the
three workers under libfaketime applying changes late: in runs at load averages of 7-20 on 2
shared cores, a median of 0.2-9 s after the write (against 0.05 s for the same workers
unfaked in the same scenario, which converged in 0.45-0.71 s), and each self-fencing 0-3 times
a run ("no renewal landed before the lease's end": heartbeats of 3 s leases that came more
than 2.25 s apart). Why a faked process lags so (libfaketime's own calls cost under 0.05 us
each, its sleeps are on time, the backend-time estimate is exact) is not found yet; until it
is, this scenario can miss its target under load, and the target says so.

Asserted, beyond everything ``harness.Scenario.finish`` asserts: no false settle (nothing
settled paused or running while a live worker had not applied it), no early resume (none
fired before its time by the backend's clock), from ``checker.check_clock_safety``, and that
resumes were fired: at least every one the rounds scheduled. Each skewed process started is one
fault of the report. The workers' ``clock_skew`` findings are expected to stay once they publish
their offsets.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from faults import Proc
from harness import Scenario

from locstatus import State, connect

from support.skew import skew_env

SKEWS = ["+30s", "+3h", "-3h"]
DUE = [f"due-{i}" for i in range(3)]
AHEAD = 1.5
"""Seconds between a round's schedule and its resumes' time: a firer on its own clock 30 s or
3 h ahead would fire them that much early (more than the checker's measuring slack)."""
LEAD = 2.5
"""A round is scheduled only while its resumes come due this long before the load's end (their
firing and the workers' handlers are then done before the convergence clock starts)."""


def test_clocks_off_settle_nothing_early_and_fire_nothing_early(
    scenario: Callable[..., Scenario], tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path}/locstatus.db"
    sc = scenario("clocks +30s/+3h/-3h (libfaketime)", "sqlite", url, agent_skews=SKEWS,
                  agent_args=["--slow", "0.1"], rate=10.0, extra_locations=DUE).start()
    for skew in SKEWS:
        sc.faults.instant(f"worker_clock_{skew}")
    sidecar = Proc([sys.executable, "-m", "locstatus", "--backend", url, "serve", "--port", "0",
                    "--reconcile-interval", "0.3"], tmp_path / "sidecar-3h-ahead.log",
                   env={"PYTHONUNBUFFERED": "1", **skew_env("+3h")})
    sc.faults.instant("sidecar_clock_+3h")
    checks = rounds = 0
    mgr = connect(url)  # this process's clock is the backend's (the kernel's, on SQLite)
    try:
        while sc.remaining > 1.5:
            # a round of resumes due AHEAD s from now, as long as they come due in the load
            scheduled = sc.remaining > AHEAD + LEAD
            if scheduled:
                for loc in DUE:
                    mgr.pause(loc, reason="due round", actor="ops")
                    mgr.resume(loc, at=timedelta(seconds=AHEAD), actor="ops")
                rounds += 1
            if checks == 0:
                sc.wait_ops(20)
            check = Proc([sys.executable, "-m", "locstatus", "--backend", url, "check",
                          "--repair", "--json", "--no-progress"],
                         tmp_path / f"check-3h-ahead-{checks}.log", env=skew_env("+3h"))
            sc.faults.instant("check_repair_clock_+3h")
            code = check.wait(60)
            assert code in (0, 1), f"check 3 h ahead exited {code}:\n{check.log_tail()}"
            checks += 1
            if scheduled:  # every resume of the round fired (on time: the checker says)
                deadline = time.monotonic() + AHEAD + 30
                while any(st.state in (State.PAUSED, State.PAUSING)
                          for loc in DUE for st in mgr.status(loc).services.values()):
                    assert time.monotonic() < deadline, [mgr.status(loc) for loc in DUE]
                    time.sleep(0.05)
        assert rounds > 0, "no round of scheduled resumes fitted in the load"
        assert sidecar.alive, sidecar.log_tail()
        sc.finish(allow_kinds=["clock_skew"])
        # every service of every round fired (once: the history check), none early (finish)
        assert sc.row.resumes_fired >= rounds * len(DUE) * 3, (sc.row.resumes_fired, rounds)
        sc.row.notes += (f", {rounds} rounds of {len(DUE) * 3} resumes due {AHEAD:g} s ahead, "
                         f"{checks} check --repair runs 3 h ahead, sidecar 3 h ahead")
    finally:
        mgr.close()
        sidecar.terminate()
