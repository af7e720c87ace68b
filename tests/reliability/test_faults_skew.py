"""Clocks off by +30 s, +3 h and -3 h (libfaketime), under random operator load (SQLite).

The three worker agents run with their wall clocks 30 s ahead, 3 h ahead and 3 h behind, and
each fires scheduled resumes; a sidecar 3 h ahead reconciles every 0.3 s (fires due resumes,
settles) and a ``check --repair`` 3 h ahead runs again and again, while the load pauses,
resumes and schedules resumes 0.5-3 s ahead. Leases are 3 s: to a process 30 s or 3 h ahead
judging on its own clock every live worker would look dead, and the worker 3 h behind would
write leases that ended hours ago (issue 14 §1).

Asserted, beyond everything ``harness.Scenario.finish`` asserts: no false settle (nothing
settled paused or running while a live worker had not applied it) and no early resume (none
fired before its time by the backend's clock), from ``checker.check_clock_safety``. Each skewed
process started is one fault of the report. The workers' ``clock_skew`` findings are expected
to stay once they publish their offsets.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from faults import Proc
from harness import Scenario

from support.skew import skew_env

SKEWS = ["+30s", "+3h", "-3h"]


def test_clocks_off_settle_nothing_early_and_fire_nothing_early(
    scenario: Callable[..., Scenario], tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path}/locstatus.db"
    sc = scenario("clocks +30s/+3h/-3h (libfaketime)", "sqlite", url, agent_skews=SKEWS,
                  agent_args=["--slow", "0.1"], rate=10.0).start()
    for skew in SKEWS:
        sc.faults.instant(f"worker_clock_{skew}")
    sidecar = Proc([sys.executable, "-m", "locstatus", "--backend", url, "serve", "--port", "0",
                    "--reconcile-interval", "0.3"], tmp_path / "sidecar-3h-ahead.log",
                   env={"PYTHONUNBUFFERED": "1", **skew_env("+3h")})
    sc.faults.instant("sidecar_clock_+3h")
    checks = 0
    try:
        sc.wait_ops(20)
        while sc.remaining > 1.5:
            check = Proc([sys.executable, "-m", "locstatus", "--backend", url, "check",
                          "--repair", "--json", "--no-progress"],
                         tmp_path / f"check-3h-ahead-{checks}.log", env=skew_env("+3h"))
            sc.faults.instant("check_repair_clock_+3h")
            code = check.wait(60)
            assert code in (0, 1), f"check 3 h ahead exited {code}:\n{check.log_tail()}"
            checks += 1
        assert sidecar.alive, sidecar.log_tail()
        sc.finish(allow_kinds=["clock_skew"])
        sc.row.notes += f", {checks} check --repair runs 3 h ahead, sidecar 3 h ahead"
    finally:
        sidecar.terminate()
