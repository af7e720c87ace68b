"""kill -9 a sidecar while scheduled resumes come due (SQLite), under random operator load.

Two ``locstatus serve`` processes (each runs the reconciler that fires due resumes) share the
store; the worker agents are told not to fire resumes themselves, so only the sidecars do.
Each round pauses every service of ten dedicated ``due-*`` locations (the load never touches
them), waits until the workers applied it, schedules their resumes two seconds ahead, and at the
due instant kills one sidecar with SIGKILL; a supervisor restarts it half a second later (the
heal). Every scheduled resume must fire exactly once (one ``resume_due`` entry per location,
service and round), whichever sidecar fired it, and everything converges.
"""

from __future__ import annotations

import random
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from faults import Proc, wait_for
from harness import Scenario

from locstatus import connect
from locstatus.models import State

from support.history_check import full_history

DUE = [f"due-{i:02d}" for i in range(10)]


def sidecar(url: str, workdir: Path, n: int) -> Proc:
    return Proc(
        [sys.executable, "-m", "locstatus", "--backend", url, "serve", "--port", "0",
         "--reconcile-interval", "0.5"],
        workdir / f"sidecar-{n}.log",
    )


def test_sidecar_killed_while_resumes_are_due(
    scenario: Callable[..., Scenario], tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path}/locstatus.db"
    sc = scenario("kill -9 a sidecar while resumes are due", "sqlite", url,
                  extra_locations=DUE, agent_args=["--no-fire"], short_schedules=False).start()
    cars = [sidecar(url, tmp_path, 0), sidecar(url, tmp_path, 1)]
    mgr = connect(url)
    rng = random.Random(31)
    rounds = 0
    starts = 2
    try:
        while True:
            for loc in DUE:
                mgr.pause(loc, reason="due round", actor="ops")
            wait_for(lambda: all(st.state is State.PAUSED for loc in DUE
                                 for st in mgr.status(loc).services.values()),
                     60, "the due-* pauses to settle")
            due_at = datetime.now(UTC) + timedelta(seconds=2)
            for loc in DUE:
                mgr.resume(loc, at=due_at, actor="ops")
            time.sleep(max(0.0, (due_at - datetime.now(UTC)).total_seconds())
                       + rng.uniform(0, 0.3))
            victim = rng.randrange(len(cars))
            f = sc.faults.start("kill9_sidecar", f"sidecar {victim} at the due instant")
            cars[victim].kill9()
            time.sleep(0.5)
            cars[victim] = sidecar(url, tmp_path, starts)
            starts += 1
            sc.faults.heal(f)
            rounds += 1
            wait_for(lambda: all(st.state is State.RUNNING and st.resume_at is None
                                 for loc in DUE for st in mgr.status(loc).services.values()),
                     60, "every due resume to fire and settle")
            if sc.remaining < 4:
                break
        sc.finish(converge_timeout=120)
        fired: Counter[tuple[str, str]] = Counter()
        actors: Counter[str] = Counter()
        for loc in DUE:
            for e in full_history(url, loc):
                if e.event == "resume_due":
                    fired[(loc, e.service)] += 1
                    actors[(e.actor or "?").rsplit(":", 2)[-2]] += 1
                assert e.event != "resume", f"{loc}: a resume that nobody asked for: {e}"
        services = {(loc, s) for loc in DUE for s in mgr.status(loc).services}
        assert fired == dict.fromkeys(services, rounds), fired
        sc.row.notes += (f", {rounds} rounds x {len(services)} scheduled resumes fired once "
                         f"each, by sidecar pids {dict(actors)}")
    finally:
        mgr.close()
        for c in cars:
            c.terminate()
