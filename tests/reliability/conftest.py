"""Fixtures of the reliability suite (issue 8) and its end report.

- ``budget``: durations from ``LOCSTATUS_RELIABILITY_SECONDS`` (:class:`harness.Budget`).
- ``row``: one report row per scenario test; the test fills it, the hook prints it.
- ``scenario``: builds a :class:`harness.Scenario` in the test's directory and stops its
  processes (by PID) at teardown, whatever happened.
- ``ensemble``: one real 3-node ZooKeeper ensemble for the session (``servers.start_ensemble``);
  every ZooKeeper scenario uses its own chroot and leaves every member running.
- ``own_mongo``: a MongoDB-wire server of the test's own (``servers.start_mongo``), which the
  test may stop, kill and restart without disturbing the session's shared ``mongo_server``.

At the end of the session :func:`pytest_terminal_summary` prints the report: one row per
scenario (backend, operations, writes, faults injected, lost, duplicated, false settles
(``fset``), early resumes (``erly``), convergence seconds after the last fault), totals, and
the outcome of the existing single-scenario tests this suite builds on when they ran in the
same session. With ``LOCSTATUS_RELIABILITY_REPORT=path`` the
same report is written there as JSON.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from faults import reap_all
from harness import Budget, Row, Scenario

from support.servers import MongoHandle, ZooKeeperEnsemble, start_ensemble, start_mongo

REPORT_KEY = pytest.StashKey[list[Row]]()
REUSED = {
    "tests/test_zk_faults.py": "ZooKeeper leader kill / ensemble restart (single scenarios)",
    "tests/test_no_lost_updates.py": "8 processes x 200 ops (500 in the long suite), no lost update",
    "tests/test_bad_input.py": "CLI and library bad input, store unchanged",
    "tests/test_schemathesis.py": "schemathesis over the HTTP API",
    "tests/test_check_processes.py": "worker killed mid-handler, racing check --repair",
}


def pytest_configure(config: pytest.Config) -> None:
    config.stash[REPORT_KEY] = []


_REUSED: dict[str, dict[str, int]] = {}
"""Outcomes of the reused tests of :data:`REUSED` that ran in this session."""


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::", 1)[0]
    if path not in REUSED:
        return
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        counts = _REUSED.setdefault(path, {})
        counts[report.outcome] = counts.get(report.outcome, 0) + 1


@pytest.fixture(scope="session")
def budget() -> Budget:
    return Budget.from_env()


CALL_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call":
        item.stash[CALL_FAILED] = report.failed
    return report


@pytest.fixture
def row(request: pytest.FixtureRequest) -> Iterator[Row]:
    """The test's report row; marked ``failed`` if the test failed after filling it."""
    r = Row(scenario=request.node.name, backend="?")
    request.config.stash[REPORT_KEY].append(r)
    start = time.monotonic()
    yield r
    r.seconds = round(time.monotonic() - start, 1)
    if request.node.stash.get(CALL_FAILED, True):
        r.status = "failed"


@pytest.fixture
def scenario(
    tmp_path: Path, budget: Budget, row: Row
) -> Iterator[Callable[..., Scenario]]:
    made: list[Scenario] = []

    def make(name: str, backend: str, url: str, **kw: Any) -> Scenario:
        sc = Scenario(name, backend, url, tmp_path, budget, row, **kw)
        made.append(sc)
        return sc

    try:
        yield make
    finally:
        for sc in made:
            sc.stop_all()
        reap_all()


@pytest.fixture(scope="session")
def ensemble(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperEnsemble]:
    ens = start_ensemble(tmp_path_factory.mktemp("reliability-zk"), 3, timeout=120)
    try:
        yield ens
    finally:
        ens.close()


@pytest.fixture
def whole_ensemble(ensemble: ZooKeeperEnsemble) -> ZooKeeperEnsemble:
    """The session's ensemble, every member running and one leader (restarts any member a
    previous scenario left down)."""
    for i, s in enumerate(ensemble.servers):
        if not s.running:
            ensemble.start(i, timeout=120)
    ensemble.wait_for_quorum(timeout=120)
    return ensemble


@pytest.fixture
def own_mongo(tmp_path: Path) -> Iterator[MongoHandle]:
    server = start_mongo(tmp_path / "mongo-own", timeout=120)
    try:
        if not server.controllable:
            pytest.skip("LOCSTATUS_TEST_MONGO_URI names an external server: it cannot be restarted")
        yield server
    finally:
        server.close()


# -- the report ----------------------------------------------------------------------------------


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    rows = config.stash.get(REPORT_KEY, [])
    reused = _REUSED
    if not rows and not reused:
        return
    budget = Budget.from_env()
    tr = terminalreporter
    tr.section(f"locstatus reliability report (LOCSTATUS_RELIABILITY_SECONDS={budget.total:g})")
    head = (f"{'scenario':<40} {'backend':<7} {'ops':>6} {'writes':>6} {'faults':>6} "
            f"{'lost':>4} {'dup':>4} {'fset':>4} {'erly':>4} {'unkn':>5} {'conv s':>6} "
            f"{'target':>6} {'recov s':>7} {'test s':>6} status")
    tr.write_line(head)
    tr.write_line("-" * len(head))
    for r in rows:
        tr.write_line(
            f"{r.scenario[:40]:<40} {r.backend:<7} {r.ops:>6} {r.writes:>6} {r.faults:>6} "
            f"{r.lost:>4} {r.duplicated:>4} {r.false_settle:>4} {r.early_resume:>4} "
            f"{r.unknown:>5} {_fmt(r.convergence_s):>6} "
            f"{_fmt(r.target_s):>6} {_fmt(r.recovery_s):>7} {r.seconds:>6.1f} {r.status}"
        )
    per_backend: dict[str, float] = {}
    for r in rows:
        if r.convergence_s is not None:
            per_backend[r.backend] = max(per_backend.get(r.backend, 0.0), r.convergence_s)
    totals = {
        "scenarios": len(rows),
        "ok": sum(r.status == "ok" for r in rows),
        "ops": sum(r.ops for r in rows),
        "writes": sum(r.writes for r in rows),
        "faults": sum(r.faults for r in rows),
        "lost": sum(r.lost for r in rows),
        "duplicated": sum(r.duplicated for r in rows),
        "false_settle": sum(r.false_settle for r in rows),
        "early_resume": sum(r.early_resume for r in rows),
        "max_convergence_s": per_backend,
    }
    tr.write_line("-" * len(head))
    tr.write_line(
        f"total: {totals['ok']}/{totals['scenarios']} scenarios ok, {totals['ops']} ops, "
        f"{totals['writes']} writes, {totals['faults']} faults injected, lost {totals['lost']}, "
        f"duplicated {totals['duplicated']}, false settle {totals['false_settle']}, "
        f"early resume {totals['early_resume']}, max convergence "
        + (", ".join(f"{b} {s:.2f}s" for b, s in sorted(per_backend.items())) or "-")
    )
    for path, counts in sorted(reused.items()):
        tr.write_line(f"reused: {path} ({REUSED[path]}): "
                      + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
    for r in rows:
        phases = ", ".join(f"{k} {v:g}s" for k, v in r.phases.items())
        if r.notes or phases:
            tr.write_line(f"  {r.scenario}: {r.notes}" + (f" [{phases}]" if phases else ""))
    out = os.environ.get("LOCSTATUS_RELIABILITY_REPORT")
    if out:
        Path(out).write_text(json.dumps(
            {"seconds_budget": budget.total, "rows": [r.as_dict() for r in rows],
             "totals": totals, "reused": reused}, indent=2, default=str) + "\n")
