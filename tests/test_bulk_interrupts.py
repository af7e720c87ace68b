"""Ctrl-C landing anywhere in a bulk operation on a real SQLite store (docs/cli.md, "Bulk:
`all`"): what was done is always reported, the command exits 130.

A SIGINT is delivered where CPython next runs Python code; inside a pydantic serialization
(a record's enum values, while a batch is encoded) pydantic wraps the KeyboardInterrupt in a
``PydanticSerializationError`` (a failure mode seen on 10 000 locations). The in-process test
delivers a real SIGINT (``signal.raise_signal``) from a trace hook exactly there.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from locstatus import Manager, State
from locstatus.backends.sqlite import SQLiteBackend
from locstatus.cli import app
from locstatus.errors import AmbiguousCommit
from locstatus.manager import BulkInterrupted, Operation, Outcome

from support.fleets import sqlite_fleet

N = 2500  # three SQLite batches of 1000


def test_ctrl_c_inside_a_batchs_encoding_is_an_interrupt_with_the_report(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/locstatus.db"
    names = [f"loc-{i:05d}" for i in range(N)]
    with Manager(SQLiteBackend(url)) as setup:
        setup.sync_locations({n: ["replication"] for n in names})
    batches: list[FrameType] = []  # the operation's batches of writes (not their settles)
    encodes = 0

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal encodes
        if event != "call":
            return
        back = frame.f_back
        name = frame.f_code.co_name
        if (  # a generator's frame: called again at each resume
            name == "write_batch" and back is not None and back.f_code.co_name == "_run"
            and not any(frame is b for b in batches)
        ):
            batches.append(frame)
        if name == "encode_record" and len(batches) == 2:
            encodes += 1
        if (  # batch 2's writes (batch 1: 1000 writes, then 1000 settles): as its records
            # are encoded (the bulk plan's comparison of its texts with the codec's)
            encodes and back is not None and back.f_code.co_name == "model_dump_json"
        ):  # a Python call from inside pydantic's Rust serializer: an enum's value
            sys.setprofile(None)
            signal.raise_signal(signal.SIGINT)

    mgr = Manager(SQLiteBackend(url))
    sys.setprofile(profile)
    try:
        with pytest.raises(BulkInterrupted) as info:
            mgr.bulk(Operation.pause("replication"), op_id="bulk-in-encode")
    finally:
        sys.setprofile(None)
        sys.settrace(None)
    report = info.value.report
    assert report.interrupted and encodes >= 1
    by = {i.location: i for i in report.items}
    written = [i for i in report.items if i.outcome is Outcome.CHANGED]
    unknown = report.failed
    assert len(written) == 1000 and len(unknown) == 1000  # batch 1 written, batch 2 in flight
    assert all(isinstance(i.error, AmbiguousCommit) and "bulk-in-encode" in i.error.message
               for i in unknown)
    for loc in names:
        state = mgr.status(loc).services["replication"].state
        assert (state is not State.RUNNING) == (by.get(loc) in written), loc
    mgr.close()


def test_ctrl_c_as_the_operation_ends_is_an_interrupt_with_the_whole_report(
    tmp_path: Path,
) -> None:
    """A SIGINT once every location was decided, as the collector is enabled again (its first
    run, scanning the report's records, takes a fraction of a second at 10 000 locations):
    ``BulkInterrupted`` with every location in its report, never a bare KeyboardInterrupt
    (the CLI then printed nothing and exited 130, seen in CI)."""
    import gc

    url = f"sqlite:///{tmp_path}/locstatus.db"
    names = [f"loc-{i:05d}" for i in range(N)]
    with Manager(SQLiteBackend(url)) as setup:
        setup.sync_locations({n: ["replication"] for n in names})

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        # on its return: raised on its call, the interrupt would skip gc.enable itself and
        # leave the collector off for every later test of the process
        if event == "c_return" and arg is gc.enable:
            sys.setprofile(None)
            signal.raise_signal(signal.SIGINT)

    mgr = Manager(SQLiteBackend(url))
    try:
        sys.setprofile(profile)
        try:
            with pytest.raises(BulkInterrupted) as info:
                mgr.bulk(Operation.pause("replication"))
        finally:
            sys.setprofile(None)
        assert gc.isenabled()
        report = info.value.report
        assert report.interrupted
        assert [i.location for i in report.items] == names
        assert all(i.outcome is Outcome.CHANGED for i in report.items)
    finally:
        mgr.close()


FLEET = 10_000
ENV = {k: v for k, v in os.environ.items() if not k.startswith("LOCSTATUS_")} | {
    "USER": "t", "COLUMNS": "200",
}


@pytest.fixture(scope="module")
def fleet_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite store of 10 000 locations (copied per test: sync once)."""
    path = tmp_path_factory.mktemp("fleet") / "locstatus.db"
    with Manager(SQLiteBackend(f"sqlite:///{path}")) as mgr:
        mgr.sync_locations({f"loc-{i:05d}": ["replication", "lifecycle"] for i in range(FLEET)})
    return path


@pytest.fixture
def fleet(fleet_db: Path, tmp_path: Path) -> str:
    path = tmp_path / "locstatus.db"
    shutil.copy(fleet_db, path)
    return f"sqlite:///{path}"


def replication_states(url: str) -> Counter[State]:
    with Manager(SQLiteBackend(url)) as mgr:
        return Counter(r.services["replication"].state for r in mgr.statuses())


def start(url: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "locstatus", "--backend", url, *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
    )


def finish(proc: subprocess.Popen[str]) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def invoke_profiled(
    monkeypatch: pytest.MonkeyPatch, profile: Callable[[FrameType, str, Any], None], url: str,
    *args: str,
) -> Result:
    """The CLI in this process on ``url`` with ``profile`` as the profile hook (which raises
    the SIGINT where it wants it)."""
    for name in ("LOCSTATUS_BACKEND", "LOCSTATUS_SERVICES"):
        monkeypatch.delenv(name, raising=False)
    sys.setprofile(profile)
    try:
        return CliRunner().invoke(app, ["--backend", url, *args],
                                  env={"USER": "t", "COLUMNS": "200"}, catch_exceptions=False)
    finally:
        sys.setprofile(None)


def test_ctrl_c_while_the_table_is_drawn_still_prints_what_was_done(fleet: str) -> None:
    """Every location written and settled, then SIGINT while the 10 000-row table (--details)
    is drawn: one line of counts instead of an empty screen, exit 130."""
    proc = start(fleet, "pause", "all", "-s", "replication", "--details")
    deadline = time.monotonic() + 60
    while replication_states(fleet)[State.PAUSED] < FLEET:
        assert time.monotonic() < deadline and proc.poll() is None, "the writes never ended"
        time.sleep(0.1)
    time.sleep(0.2)  # into the drawing (seconds long)
    proc.send_signal(signal.SIGINT)
    out, err = finish(proc)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted while showing the report" in err
    assert f"pause all: {FLEET} changed" in out, out[-2000:]


def test_ctrl_c_before_a_batchs_settle_says_those_locations_are_left_pausing(
    fleet: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGINT as the second batch's settle starts (its 1000 locations written, pausing, no
    live worker): their detail and the summary say they are left pausing, what finishes them."""
    settles = 0

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal settles
        if event == "call" and frame.f_code.co_name == "settle_unwatched_many":
            settles += 1
            if settles == 2:
                sys.setprofile(None)
                signal.raise_signal(signal.SIGINT)

    result = invoke_profiled(monkeypatch, profile, fleet, "pause", "all", "-s", "replication",
                             "--json")
    assert result.exit_code == 130, result.stderr
    assert "1000 left pausing: the next settle — sidecar, check --repair — finishes them" in (
        result.stderr
    )
    items = {i["location"]: i for i in json.loads(result.stdout)}
    pausing = {loc for loc, i in items.items()
               if i["status"]["services"]["replication"]["state"] == "pausing"}
    assert len(pausing) == 1000 and all(items[loc]["result"] == "changed" for loc in pausing)
    assert all("interrupted: still pausing, the next settle (sidecar, check --repair) "
               "finishes it" in items[loc]["detail"] for loc in pausing)
    assert replication_states(fleet) == {State.PAUSED: 1000, State.PAUSING: 1000,
                                         State.RUNNING: FLEET - 2000}


def test_ctrl_c_during_a_batchs_write_counts_unknown_outcomes_and_unreached_apart(
    fleet: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGINT as the second batch's write starts: 1000 changed, 1000 whose outcome is
    unknown, 8000 never reached, each counted on its own (a person read "interrupted after
    2000 location(s)" as 2000 done), the ones beyond the first ten counted in the plural."""
    batches: list[FrameType] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        back = frame.f_back
        if (  # a generator's frame: called again at each resume
            event == "call" and frame.f_code.co_name == "write_batch" and back is not None
            and back.f_code.co_name == "_run" and not any(frame is b for b in batches)
        ):
            batches.append(frame)
            if len(batches) == 2:
                sys.setprofile(None)
                signal.raise_signal(signal.SIGINT)

    result = invoke_profiled(monkeypatch, profile, fleet, "pause", "all", "-s", "replication")
    assert result.exit_code == 130, result.stderr
    counts = "1000 changed, 1000 outcome unknown, 8000 not reached"
    lines = result.stdout.splitlines()
    assert lines[0] == f"pause all: {counts}", result.stdout
    assert sum(line.startswith("  outcome unknown: loc-01") for line in lines) == 10
    assert "  ... and 990 more with an unknown outcome" in lines
    assert "(2000 locations reached: --details shows one row per location)" in lines
    op_id = re.search(r"look for op_id (\S+) in the history", result.stdout)
    assert op_id is not None, result.stdout
    assert result.stderr.splitlines()[-1] == (
        f"error: pause all: interrupted: {counts} (look for op_id {op_id.group(1)} in their "
        "history); shown above is what was done"
    )
    assert replication_states(fleet) == {State.PAUSED: 1000, State.RUNNING: FLEET - 1000}


@pytest.mark.parametrize(("bad", "more"), [(11, "1 more error"), (13, "3 more errors")])
def test_the_errors_beyond_the_first_ten_are_counted_in_the_plural(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: int, more: str
) -> None:
    """docs/cli.md, "Bulk: `all`": corrupt records are errors (exit 2); the summary and stderr
    name the first ten, then count the others ("... and 990 more errors", never "error")."""
    url = f"sqlite:///{tmp_path}/locstatus.db"
    sqlite_fleet(url, [f"loc-{i:03d}" for i in range(60)], corrupt=bad)
    for name in ("LOCSTATUS_BACKEND", "LOCSTATUS_SERVICES"):
        monkeypatch.delenv(name, raising=False)
    result = CliRunner().invoke(
        app, ["--backend", url, "pause", "all", "-s", "replication"],
        env={"USER": "t", "COLUMNS": "200"}, catch_exceptions=False,
    )
    assert result.exit_code == 2, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"pause all: {60 - bad} changed, {bad} errors"
    assert f"  ... and {more}" in lines
    assert f"error: ... and {more}" in result.stderr.splitlines()


@pytest.mark.parametrize("delay", [0.0, 0.1, 0.3, 0.5, 0.8])
def test_ctrl_c_at_any_point_reports_what_the_store_holds(fleet: str, delay: float) -> None:
    """A real SIGINT at varied points of ``pause all`` on 10 000 locations (``delay`` seconds
    after its first write was seen): exit 130 (or 0 when it had finished), never an unexpected
    error; the counts printed are what the store holds."""
    db = fleet.removeprefix("sqlite:///")
    proc = start(fleet, "pause", "all", "-s", "replication")
    deadline = time.monotonic() + 60
    with contextlib.closing(sqlite3.connect(db)) as conn:
        while not conn.execute("SELECT 1 FROM locations WHERE version > 1 LIMIT 1").fetchone():
            assert time.monotonic() < deadline and proc.poll() is None, "no write seen"
            time.sleep(0.01)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    out, err = finish(proc)
    assert proc.returncode in (0, 130), err
    assert "Traceback" not in err and "unexpected" not in err, err
    states = replication_states(fleet)
    touched = states[State.PAUSED] + states[State.PAUSING]
    changed = re.search(r"^pause all: (?:(\d+) changed)?", out, re.M)
    assert changed is not None, (proc.returncode, out, err, delay, replication_states(fleet))
    unknown = re.search(r"^pause all: .*?(\d+) outcome unknown", out, re.M)
    n_changed = int(changed.group(1) or 0)
    n_unknown = int(unknown.group(1)) if unknown else 0
    assert n_changed <= touched <= n_changed + n_unknown, (out, states)
    left = re.search(r"^(\d+) left pausing: the next settle", out, re.M)
    n_left = int(left.group(1)) if left else 0
    assert states[State.PAUSING] <= n_left + n_unknown, (out, states)  # every one announced


@pytest.mark.parametrize("delay", [0.02, 0.05, 0.1])
def test_ctrl_c_after_the_report_exits_never_killed_by_the_signal(
    fleet: str, delay: float
) -> None:
    """A SIGINT ``delay`` seconds after the last line of the report, while the process tears
    down: it exits 0, or 130 when the Ctrl-C landed while it was still closing, never killed
    by the signal (status -2 with nothing on stderr: the interpreter's teardown restores
    SIGINT's default action; seen in CI)."""
    proc = start(fleet, "pause", "all", "-s", "replication")
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "--details shows one row per location" in line:
            break
    assert seen and seen[0].startswith(f"pause all: {FLEET} changed"), seen
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _, err = finish(proc)
    assert proc.returncode in (0, 130), (proc.returncode, err)
    assert "Traceback" not in err, err
    assert replication_states(fleet) == {State.PAUSED: FLEET}


@pytest.mark.parametrize(("count", "full", "table"), [(50, False, True), (51, False, False),
                                                      (51, True, True)])
def test_above_fifty_locations_the_report_is_a_summary_unless_details(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, count: int, full: bool, table: bool
) -> None:
    """docs/cli.md, "Bulk: `all`": one row per location up to 50 (or with --details), above
    that the counts and the first skips by name."""
    url = f"sqlite:///{tmp_path}/locstatus.db"
    with Manager(SQLiteBackend(url)) as mgr:
        mgr.sync_locations({f"loc-{i:03d}": ["lifecycle"] if i % 10 == 0 else ["replication"]
                            for i in range(count)})
    for name in ("LOCSTATUS_BACKEND", "LOCSTATUS_SERVICES"):
        monkeypatch.delenv(name, raising=False)
    result = CliRunner().invoke(
        app, ["--backend", url, "pause", "all", "-s", "replication",
              *(["--details"] if full else [])],
        env={"USER": "t", "COLUMNS": "200"}, catch_exceptions=False,
    )
    assert result.exit_code == 0, result.stderr
    skipped = (count + 9) // 10
    rows = [line for line in result.stdout.splitlines() if line.startswith("│ loc-")]
    if table:
        assert len(rows) == count and "--details" not in result.stdout
    else:
        assert not rows
        lines = result.stdout.splitlines()
        assert lines[0] == f"pause all: {count - skipped} changed, {skipped} skipped"
        assert lines[1:4] == [f"  skipped: loc-{i:03d}: has no replication" for i in (0, 10, 20)]
        assert f"({count} locations: --details shows one row per location)" in lines
