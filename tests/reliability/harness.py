"""One scenario of the reliability suite, end to end: locations, worker agents, load, faults,
then the checks and one row of the report.

A test builds a :class:`Scenario`, calls :meth:`Scenario.start` (locations created, M worker
processes ready, N load processes running), injects its faults while the load runs (recording
each in :attr:`Scenario.faults`), then calls :meth:`Scenario.finish`, which:

1. stops the load (every process finishes its current operation) right after the last fault
   was healed;
2. waits until the system converges (:func:`checker.wait_converged`), measured from the last
   heal (or from the stop of the load when that came later);
3. confirms with the real CLI that ``locstatus check`` exits 0;
4. checks the history against every operation (:func:`checker.check_ops`) and the settles
   and scheduled resumes against what the workers applied (:func:`checker.check_clock_safety`);
5. records the row (ops, writes, faults, lost, duplicated, false settles, early resumes,
   convergence) and asserts: nothing lost, nothing duplicated, no false settle, no early
   resume, no violation, converged, and within the target bound when the backend has one.

Durations scale with ``LOCSTATUS_RELIABILITY_SECONDS`` (see :class:`Budget`).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_proc import AgentProc
from checker import OpReport, check_clock_safety, check_ops, load_ops, wait_converged
from faults import FaultLog
from loadgen import LoadFleet

from locstatus import connect
from locstatus.errors import LocstatusError

from support.suite import sized

DEFAULT_SECONDS = sized(ci=120.0, long=1200.0)
"""Default total budget: the CI-length run, or the long one in the long suite
(``LOCSTATUS_TEST_SUITE=long``, ``support/suite.py``)."""

TARGETS = {"sqlite": 2.0, "zk": 10.0}
"""Convergence targets of issue 8 (seconds after the last fault). MongoDB has none."""


@dataclass(frozen=True)
class Budget:
    """How long things run. ``total`` (``LOCSTATUS_RELIABILITY_SECONDS``, default 120) is the
    intended wall time of the whole suite's load phases plus overheads; each load scenario
    runs its load for :attr:`load_seconds` (at least 5 s)."""

    total: float

    @classmethod
    def from_env(cls) -> Budget:
        raw = os.environ.get("LOCSTATUS_RELIABILITY_SECONDS", "")
        try:
            total = float(raw) if raw else DEFAULT_SECONDS
        except ValueError:
            raise ValueError(f"LOCSTATUS_RELIABILITY_SECONDS={raw!r}: expected seconds") from None
        if not total > 0:
            raise ValueError(f"LOCSTATUS_RELIABILITY_SECONDS={raw!r}: must be > 0")
        return cls(total)

    @property
    def load_seconds(self) -> float:
        """Seconds of load per scenario: the budget shared by the load scenarios once their
        fixed costs (servers, processes, convergence) are paid."""
        return max(5.0, (self.total - 90.0) / 12.0)

    def examples(self, low: int = 30, high: int = 2000) -> int:
        """Hypothesis examples per property test."""
        return int(min(high, max(low, self.total / 2)))


@dataclass
class Row:
    """One line of the report (see ``conftest.pytest_terminal_summary``)."""

    scenario: str
    backend: str
    ops: int = 0
    writes: int = 0
    faults: int = 0
    fault_kinds: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    duplicated: int = 0
    false_settle: int = 0
    """Settles while a live worker had not applied the state (checker.check_clock_safety)."""
    early_resume: int = 0
    """Scheduled resumes fired before their time by the backend's clock."""
    resumes_fired: int = 0
    """Scheduled resumes fired (``resume_due`` in the history): what the early check checked."""
    unknown: int = 0
    convergence_s: float | None = None
    target_s: float | None = None
    recovery_s: float | None = None
    """Longest time from a fault's heal to the next operation that succeeded."""
    seconds: float = 0.0
    """Wall time of the whole test."""
    status: str = "failed"
    notes: str = ""
    phases: dict[str, float] = field(default_factory=dict)
    """Wall seconds of setup (locations, workers ready), load (faults) and finish."""

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


HOT = ["hot-1", "hot-2", "hot-3"]


def cold_locations(n: int) -> list[str]:
    return [f"cold-{i:02d}" for i in range(n)]


class Scenario:
    """See the module docstring. ``agent_args`` go to every ``agent_proc.py``;
    ``load_url``/``agent_url`` let a scenario route clients through a proxy; ``agent_skews``
    runs the i-th worker with its wall clock that far off (``+30s``, ``-3h``, None: not)."""

    def __init__(
        self,
        name: str,
        backend: str,
        url: str,
        workdir: Path,
        budget: Budget,
        row: Row,
        *,
        agents: int = 3,
        loaders: int = 4,
        rate: float = 15.0,
        cold: int = 30,
        agent_args: Sequence[str] = (),
        load_url: str | None = None,
        agent_url: str | None = None,
        short_schedules: bool = True,
        extra_locations: Sequence[str] = (),
        agent_skews: Sequence[str | None] = (),
    ) -> None:
        self.name = name
        self.backend = backend
        self.url = url
        self.dir = workdir
        self.budget = budget
        self.row = row
        row.scenario, row.backend = name, backend
        row.target_s = TARGETS.get(backend)
        self.n_agents = agents
        self.n_loaders = loaders
        self.rate = rate
        self.cold = cold_locations(cold)
        self.locations = HOT + self.cold + list(extra_locations)
        self.agent_args = list(agent_args)
        self.load_url = load_url or url
        self.agent_url = agent_url or url
        self.short_schedules = short_schedules
        self.agent_skews = list(agent_skews)
        self.faults = FaultLog()
        self.agents: list[AgentProc] = []
        self.load: LoadFleet | None = None
        self.started = time.time()
        self.deadline = 0.0
        self._t_load = time.monotonic()

    def start(self) -> Scenario:
        t0 = time.monotonic()
        mgr = connect(self.url)
        try:
            mgr.sync_locations(self.locations, remove_missing=False)
        finally:
            mgr.close()
        self.agents = [
            AgentProc(self.agent_url, f"w{i + 1}", self.dir, *self.agent_args,
                      skew=self.agent_skews[i] if i < len(self.agent_skews) else None).start()
            for i in range(self.n_agents)
        ]
        for a in self.agents:
            a.wait_ready()
        load_for = self.budget.load_seconds
        now = time.time()
        self.deadline = now + load_for
        self.load = LoadFleet(
            self.load_url, self.dir, HOT, self.cold,
            processes=self.n_loaders, rate=self.rate,
            # short schedules (0.5-3 s ahead) only while they come due before the load ends
            short_until=(now + load_for - 3.5) if self.short_schedules else 0.0,
        )
        self.row.phases["setup"] = round(time.monotonic() - t0, 1)
        self._t_load = time.monotonic()
        return self

    @property
    def remaining(self) -> float:
        return self.deadline - time.time()

    def wait_ops(self, n: int, timeout: float = 60.0) -> None:
        """Until ``n`` more operations finished (the load is really running)."""
        assert self.load is not None
        start = self.load.lines()
        deadline = time.monotonic() + timeout
        while self.load.lines() < start + n:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: load stalled ({self.load.lines() - start} "
                                     f"of {n} operations in {timeout:g}s)")
            time.sleep(0.05)

    def finish(self, *, converge_timeout: float = 120.0, expect_corrupt: Sequence[str] = (),
               enforce_target: bool = True, allow_kinds: Sequence[str] = ()) -> OpReport:
        """Steps 1-5 of the module docstring. Returns the operation report. ``allow_kinds``:
        check findings expected to stay (``clock_skew`` of workers whose clocks are off)."""
        assert self.load is not None
        unhealed = self.faults.unhealed()
        assert not unhealed, f"faults never healed: {unhealed}"
        t0 = time.monotonic()
        self.row.phases["load"] = round(t0 - self._t_load, 1)
        # the checker's own connection and first clock probe, before the clock starts: they
        # are the measuring instrument's time, not the system's
        checker_mgr = connect(self.url)
        with contextlib.suppress(LocstatusError):  # a backend still coming back: polls will say
            checker_mgr.clock()
        self.load.stop()
        for a in self.agents:
            assert a.alive, f"worker {a.id} is not running:\n{a.proc.log_tail() if a.proc else ''}"
        since = max(self.faults.last_heal() or 0.0, self.load.stopped_at or 0.0)
        conv = wait_converged(self.url, self.agents, since=since, timeout=converge_timeout,
                              expect_corrupt=expect_corrupt, allow_kinds=allow_kinds,
                              manager=checker_mgr)
        ops = load_ops(self.load.outs)
        rep = check_ops(self.url, self.locations, ops)
        clock = check_clock_safety(self.url, self.locations, ops, self.agents)
        row = self.row
        row.ops, row.writes, row.unknown = rep.ops, rep.writes, rep.unknown
        row.lost, row.duplicated = rep.lost, rep.duplicated
        row.false_settle, row.early_resume = clock.false_settle, clock.early_resume
        row.resumes_fired = clock.fired
        row.faults, row.fault_kinds = self.faults.count, self.faults.by_kind()
        row.convergence_s = None if conv.seconds is None else round(conv.seconds, 2)
        row.recovery_s = _recovery(self.faults, ops)
        row.phases["finish"] = round(time.monotonic() - t0, 1)
        stats = self.load.stats()
        row.notes = (f"history writes {rep.history_writes}, refused {rep.refused}, "
                     f"failed {rep.failed}, unknown applied {rep.unknown_applied}/{rep.unknown}, "
                     f"conflicts {stats.get('conflicts', 0)}, ambiguous {stats.get('ambiguous', 0)}"
                     f" (resolved {rep.ambiguous_resolved}, misreported {rep.misreported})"
                     f", settles {clock.settles}, resumes fired {clock.fired}"
                     + (f", errors {rep.errors}" if rep.errors else ""))
        (self.dir / "report.json").write_text(json.dumps(
            {"row": row.as_dict(), "violations": rep.violations[:200],
             "clock_violations": clock.violations[:200],
             "divergence": conv.last_divergence[:50], "convergence_trace": conv.trace[:200]},
            indent=1, default=str))
        assert rep.ops > 0, "no operation ran"
        assert not rep.violations, "\n".join(rep.violations[:30])
        assert rep.lost == 0 and rep.duplicated == 0
        assert not clock.violations, "\n".join(clock.violations[:30])
        assert conv.seconds is not None, (
            f"{self.name}: not converged {converge_timeout:g}s after the last fault:\n"
            + "\n".join(conv.last_divergence[:30])
        )
        cli = cli_check(self.url)
        kinds = {f["kind"] for f in cli["report"].get("findings", [])}
        assert cli["code"] == 0 or expect_corrupt or kinds <= set(allow_kinds), cli
        if expect_corrupt:
            assert cli["code"] == 1 and kinds - set(allow_kinds) == {"corrupt_record"}, cli
        over = row.target_s is not None and conv.seconds > row.target_s
        row.status = "over target" if over else "ok"
        if enforce_target and over:
            raise AssertionError(
                f"{self.name}: converged in {conv.seconds:.2f}s, target {row.target_s:g}s"
            )
        return rep

    def stop_all(self) -> None:
        """Teardown: stop the load and every worker (by PID)."""
        if self.load is not None:
            self.load.stop_file.touch()
            for p in self.load.slots:
                if p.wait(15) is None:
                    p.kill9()
        for a in self.agents:
            a.stop()


def _recovery(faults: FaultLog, ops: Sequence[Any]) -> float | None:
    """Max over faults of: heal -> end of the first operation started after it that
    succeeded (``wrote`` or ``noop``)."""
    worst: float | None = None
    good = sorted((o for o in ops if o.outcome in ("wrote", "noop") and o.end is not None),
                  key=lambda o: o.start)
    for f in faults.faults:
        if f.healed is None:
            continue
        after = next((o for o in good if o.start >= f.healed), None)
        if after is None:
            continue
        took = float(after.end) - f.healed
        worst = took if worst is None else max(worst, took)
    return None if worst is None else round(worst, 2)


def cli_check(url: str, timeout: float = 120.0) -> dict[str, Any]:
    """``locstatus --backend URL check --json`` as a real process: exit code and report."""
    proc = subprocess.run(
        [sys.executable, "-m", "locstatus", "--backend", url, "check", "--json"],
        capture_output=True, text=True, timeout=timeout, check=False,
    )
    try:
        report = json.loads(proc.stdout) if proc.stdout.strip() else {}
    except ValueError:
        report = {"unparsed": proc.stdout[-2000:]}
    return {"code": proc.returncode, "report": report, "stderr": proc.stderr[-2000:]}
