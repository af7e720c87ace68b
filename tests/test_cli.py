"""The ``locstatus`` command line (docs/design.md §5.2), driven the way an operator drives it: against a
real SQLite file, through typer's runner for most scenarios and through ``python -m locstatus``
in a real process to prove the console entry and its exit codes."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import types
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter
from typer.testing import CliRunner, Result

from locstatus import HistoryEntry, LocationStatus, State, WorkerInfo, connect
from locstatus.backends.sqlite import SQLiteBackend
from locstatus.cli import app
from locstatus.locations import load_sample, sample_path

from support.kits_zk import ZkServer, zk_url

ENV = {
    "LOCSTATUS_BACKEND": None,
    "LOCSTATUS_SERVICES": None,
    "LOCSTATUS_API_TOKEN": None,
    "COLUMNS": "200",
    "USER": "tester",
}
STATUS_LIST = TypeAdapter(list[LocationStatus])
HISTORY_LIST = TypeAdapter(list[HistoryEntry])


class Cli:
    """Runs ``locstatus --backend <url> ...`` in-process against one SQLite file."""

    def __init__(self, tmp_path: Path) -> None:
        self.path = tmp_path / "locstatus.db"
        self.url = f"sqlite:///{self.path}"
        self.runner = CliRunner()

    def __call__(self, *args: str, env: dict[str, str | None] | None = None) -> Result:
        return self.runner.invoke(
            app, ["--backend", self.url, *args], env={**ENV, **(env or {})}, catch_exceptions=False
        )

    def ok(self, *args: str) -> Result:
        result = self(*args)
        assert result.exit_code == 0, (args, result.stdout, result.stderr)
        return result

    def status(self, location: str) -> LocationStatus:
        return LocationStatus.model_validate_json(self.ok("status", location, "--json").stdout)

    def statuses(self) -> list[LocationStatus]:
        return STATUS_LIST.validate_json(self.ok("status", "--json").stdout)


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path)


@pytest.fixture
def synced(cli: Cli) -> Cli:
    cli.ok(
        "locations",
        "sync",
        str(sample_path("config.json")),
        "--location-config",
        str(sample_path("locationConfig.json")),
    )
    return cli


def states(rec: LocationStatus) -> dict[str, State]:
    return {s: st.state for s, st in rec.services.items()}


# -- locations ---------------------------------------------------------------------------------


def test_sync_from_the_sample_configs_creates_each_location_with_its_services(cli: Cli) -> None:
    result = cli.ok(
        "locations",
        "sync",
        str(sample_path("config.json")),
        "--location-config",
        str(sample_path("locationConfig.json")),
        "--json",
    )
    report = json.loads(result.stdout)
    assert report["added"] == sorted(load_sample())
    listed = STATUS_LIST.validate_json(cli.ok("locations", "list", "--json").stdout)
    assert {r.location: tuple(sorted(r.services)) for r in listed} == load_sample()
    assert all(st.state is State.RUNNING for r in listed for st in r.services.values())
    again = json.loads(cli.ok("locations", "sync", "--sample", "--json").stdout)
    assert again["added"] == [] and again["unchanged"] == sorted(load_sample())


def test_sync_removes_missing_locations_unless_kept_and_dry_run_writes_nothing(
    synced: Cli, tmp_path: Path
) -> None:
    short = tmp_path / "short.txt"
    short.write_text("us-east-1\nnew-site\n")
    before = synced.ok("locations", "list", "--json").stdout
    plan = json.loads(synced.ok("locations", "sync", str(short), "--dry-run", "--json").stdout)
    assert plan["dry_run"] is True
    assert plan["added"] == ["new-site"]
    assert plan["removed"] == ["ap-south-tokyo", "cold-archive-1", "dr-site-a", "eu-west-par"]
    assert plan["services_added"] == {"us-east-1": ["replication"]}
    assert synced.ok("locations", "list", "--json").stdout == before

    kept = json.loads(synced.ok("locations", "sync", str(short), "--keep-missing", "--json").stdout)
    assert kept["removed"] == [] and kept["added"] == ["new-site"]
    assert len(synced.statuses()) == 6

    done = json.loads(synced.ok("locations", "sync", str(short), "--json").stdout)
    assert done["removed"] == plan["removed"]
    assert sorted(r.location for r in synced.statuses()) == ["new-site", "us-east-1"]
    listed = STATUS_LIST.validate_json(synced.ok("locations", "list", "--json").stdout)
    assert sum(r.deleted for r in listed) == 4
    # a removed location refuses operator events: unknown location (exit 1)
    result = synced("pause", "dr-site-a")
    assert result.exit_code == 1 and "dr-site-a" in result.stderr


def test_a_large_sync_shows_a_summary_and_details_shows_every_location(
    cli: Cli, tmp_path: Path
) -> None:
    # a table of every location took rich minutes at 100 000 (docs/cli.md, "Importing
    # locations"): above 50 locations the default is a summary, as for a bulk operation
    listing = tmp_path / "fleet.txt"
    listing.write_text("".join(f"site-{i:03d}\n" for i in range(200)))
    out = cli.ok("locations", "sync", str(listing)).stdout
    lines = out.splitlines()
    assert lines[0] == "locations sync: 200 added"
    assert lines[1] == "  added: " + ", ".join(f"site-{i:03d}" for i in range(10)) + " and 190 more"
    assert lines[-1] == "(200 locations: --details shows one row per location)"
    assert "site-150" not in out and len(lines) == 3
    listing.write_text("".join(f"site-{i:03d}\n" for i in range(100, 205)))
    plan = cli.ok("locations", "sync", str(listing), "--dry-run").stdout.splitlines()
    assert plan[0] == ("locations sync (dry run: nothing written): 5 added, 100 removed, "
                       "100 unchanged")
    assert plan[1] == "  added: site-200, site-201, site-202, site-203, site-204"
    assert plan[2].startswith("  removed: site-000, site-001,") and plan[2].endswith(" and 90 more")
    table = cli.ok("locations", "sync", str(listing), "--details").stdout
    for i in (0, 99, 100, 204):
        assert f"site-{i:03d}" in table
    assert table.count("removed") == 100 and table.count("added") == 5
    assert table.count("unchanged") == 100


def test_sync_dry_run_reports_exactly_what_the_sync_then_does(synced: Cli, tmp_path: Path) -> None:
    """One implementation (Manager.sync_locations(dry_run=True)): the plan of a list that
    adds, restores, adds services, keeps and removes is the report of the real sync."""
    synced.ok("locations", "sync", str(sample_path("locations.txt")))  # every service
    first = tmp_path / "first.txt"
    first.write_text("us-east-1\ndr-site-a\n")
    synced.ok("locations", "sync", str(first))  # removes the others
    listing = tmp_path / "listing.txt"
    listing.write_text("zz-new\neu-west-par\naa-new\nus-east-1\n")
    plan = json.loads(synced.ok("locations", "sync", str(listing), "--dry-run", "--json").stdout)
    done = json.loads(synced.ok("locations", "sync", str(listing), "--json").stdout)
    assert plan.pop("dry_run") is True and done.pop("dry_run") is False
    assert plan == done
    assert done["added"] == ["aa-new", "zz-new"] and done["restored"] == ["eu-west-par"]
    assert done["removed"] == ["dr-site-a"]


# -- pause / resume / schedule / cancel --------------------------------------------------------


def test_pause_is_recorded_and_a_second_pause_is_an_idempotent_no_op(synced: Cli) -> None:
    result = synced.ok("pause", "us-east-1", "--reason", "maintenance", "--actor", "ops")
    assert "paused ingestion, lifecycle" in result.stdout
    rec = synced.status("us-east-1")
    assert states(rec) == {"ingestion": State.PAUSED, "lifecycle": State.PAUSED}
    assert {st.reason for st in rec.services.values()} == {"maintenance"}
    assert {st.actor for st in rec.services.values()} == {"ops"}

    again = synced.ok("pause", "us-east-1")
    assert "no change" in again.stdout
    assert synced.status("us-east-1").version == rec.version


def test_default_actor_is_user_at_host(synced: Cli) -> None:
    synced.ok("pause", "dr-site-a")
    actor = synced.status("dr-site-a").services["replication"].actor
    assert actor is not None and actor.startswith("tester@")


def test_service_option_targets_only_that_service_and_accepts_crr(synced: Cli) -> None:
    synced.ok("pause", "eu-west-par", "-s", "crr")
    assert states(synced.status("eu-west-par")) == {
        "lifecycle": State.RUNNING,
        "replication": State.PAUSED,
    }
    synced.ok("pause", "eu-west-par", "--service", "lifecycle", "--service", "replication")
    assert set(states(synced.status("eu-west-par")).values()) == {State.PAUSED}


def test_resume_in_2h_schedules_about_two_hours_from_now(synced: Cli) -> None:
    synced.ok("pause", "us-east-1")
    before = datetime.now(UTC)
    result = synced.ok("resume", "us-east-1", "--service", "lifecycle", "--in", "2h")
    after = datetime.now(UTC)
    assert "scheduled" in result.stdout
    rec = synced.status("us-east-1")
    due = rec.services["lifecycle"].resume_at
    assert due is not None
    assert before + timedelta(hours=2) <= due <= after + timedelta(hours=2)
    assert rec.services["lifecycle"].state is State.PAUSED
    assert rec.services["ingestion"].resume_at is None


def test_resume_at_with_an_offset_is_stored_in_utc_and_cancel_clears_it(synced: Cli) -> None:
    synced.ok("pause", "dr-site-a")
    local = (datetime.now(UTC) + timedelta(days=3)).replace(microsecond=0)
    at = local.astimezone(__import__("datetime").timezone(timedelta(hours=2))).isoformat()
    synced.ok("resume", "dr-site-a", "--at", at)
    due = synced.status("dr-site-a").services["replication"].resume_at
    assert due == local and due.utcoffset() == timedelta(0)

    synced.ok("cancel-schedule", "dr-site-a")
    rec = synced.status("dr-site-a")
    assert rec.services["replication"].resume_at is None
    assert rec.services["replication"].state is State.PAUSED
    again = synced.ok("cancel-schedule", "dr-site-a")  # nothing scheduled: no-op, exit 0
    assert "no change" in again.stdout
    assert synced.status("dr-site-a").version == rec.version


def test_resume_now_and_history_json_round_trips(synced: Cli) -> None:
    synced.ok("pause", "cold-archive-1", "--reason", "tape swap")
    synced.ok("resume", "cold-archive-1", "--in", "1h30m")
    synced.ok("cancel-schedule", "cold-archive-1")
    synced.ok("resume", "cold-archive-1", "--reason", "done")
    assert states(synced.status("cold-archive-1")) == {"lifecycle": State.RUNNING}

    entries = HISTORY_LIST.validate_json(synced.ok("history", "cold-archive-1", "--json").stdout)
    events = [e.event for e in entries]
    assert events == [
        "settle",
        "resume",
        "cancel_scheduled_resume",
        "schedule_resume",
        "settle",
        "pause",
        "create",
    ]
    assert [e.version for e in entries] == sorted((e.version for e in entries), reverse=True)
    assert entries[5].reason == "tape swap" and entries[1].reason == "done"
    limited = HISTORY_LIST.validate_json(
        synced.ok("history", "cold-archive-1", "--limit", "2", "--json").stdout
    )
    assert [e.event for e in limited] == ["settle", "resume"]
    human = synced.ok("history", "cold-archive-1").stdout
    assert "cancel_scheduled_resume" in human and "tape swap" in human


def test_status_human_output_shows_state_schedule_generation_and_reason(synced: Cli) -> None:
    synced.ok("pause", "dr-site-a", "--reason", "disk swap [rack 4]")
    synced.ok("pause", "us-east-1")
    synced.ok("resume", "us-east-1", "--in", "2h")
    out = synced.ok("status").stdout
    for text in ("us-east-1", "paused", "running", "disk swap [rack 4]", "in 1h59m", "by tester@"):
        assert text in out, text
    one = synced.ok("status", "us-east-1").stdout
    assert "version 4" in one and "in 1h59m" in one


def test_a_narrow_terminal_never_cuts_a_location_service_or_state(cli: Cli, tmp_path: Path) -> None:
    """``COLUMNS=80 locstatus status`` (issue 20): names and states whole on one line each, the
    other columns folded or left out and named; a wide terminal shows them all."""
    names = ["ap-southeast-2-sydney-primary", "eu-central-1-frankfurt", "us-east-1"]
    listing = tmp_path / "locations.txt"
    listing.write_text("\n".join(names) + "\n")
    cli.ok("locations", "sync", str(listing))
    reason = "disk swap on rack 4, " * 5
    cli.ok("pause", names[0], "--reason", reason)
    cli.ok("resume", names[0], "-s", "lifecycle", "--in", "2h")
    for width in (80, 60):
        out = cli("status", env={"COLUMNS": str(width)}).stdout
        lines = out.splitlines()
        assert max(len(line) for line in lines) <= width, out
        rows = [line for line in lines if line.startswith("│")]
        for name in names:
            assert any(f"│ {name} " in row for row in rows), (name, out)
        for service in ("replication", "lifecycle", "ingestion"):
            assert sum(f"│ {service} " in row for row in rows) == 3, (service, out)
        assert sum(" paused " in row for row in rows) == 3, out
        assert sum(" running " in row for row in rows) == 6, out
        assert "…" not in out and "..." not in out, out
        assert f"left out to fit {width} columns:" in out and "Reason / actor" in out, out
    wide = cli("status", env={"COLUMNS": "250"}).stdout
    assert "left out" not in wide
    for header in ("Scheduled resume", "Gen", "Version", "Updated", "Reason / actor"):
        assert header in wide, header
    assert reason.strip() in wide
    one = cli("status", names[0], env={"COLUMNS": "40"}).stdout
    assert max(len(line) for line in one.splitlines()) <= 40, one
    assert "│ replication │ paused" in one, one
    history = cli("history", names[0], env={"COLUMNS": "80"}).stdout
    lines = history.splitlines()
    assert max(len(line) for line in lines) <= 80, history
    rows = [line for line in lines if line.startswith("│")]
    assert rows and all(re.search(r"│ \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ │", r) for r in rows), history
    assert any("│ lifecycle   │ schedule_resume │" in r for r in rows), history
    assert "…" not in history, history


def test_a_terminal_table_keeps_its_right_edge_and_a_long_reason_readable(
    synced: Cli,
) -> None:
    """``COLUMNS=80|90|100 locstatus status`` with a 60-character reason and a schedule: rich
    narrowed the folding columns below their longest word, widened them back and the terminal
    cut the table's right edge off (the old test saw only the cut lines); the table is now at
    most the width, every line ends with its border, the reason is whole, and from 100 columns
    it is not folded narrower than 32 for the sake of Gen/Version (docs/cli.md)."""
    reason = "maintenance of the storage array in rack 12, back tomorrow"
    synced.ok("pause", "us-east-1", "--reason", reason)
    synced.ok("resume", "us-east-1", "-s", "lifecycle", "--in", "2h")
    for width in (80, 90, 100):
        out = synced("status", env={"COLUMNS": str(width)}).stdout
        table = [line for line in out.splitlines() if line[:1] in "┏┃┡│└"]
        assert table and all(len(line) <= width for line in table), out
        assert all(line[-1] in "┓┃┩│┘" for line in table), out
        cells = [line.split("│")[-2].strip() for line in table if line.startswith("│")]
        assert reason in " ".join(c for c in cells if c), out
        folded = sum(1 for c in cells if c and c in reason)
        assert folded <= (8 if width < 100 else 3), (folded, out)


def test_status_json_lists_every_location_as_models(synced: Cli) -> None:
    synced.ok("pause", "dr-site-a")
    records = synced.statuses()
    assert [r.location for r in records] == sorted(load_sample())
    by_name = {r.location: r for r in records}
    assert by_name["dr-site-a"].services["replication"].state is State.PAUSED
    assert by_name["dr-site-a"].services["replication"].generation == 1


# -- all ---------------------------------------------------------------------------------------


def test_pause_all_resume_all_and_per_location_results(synced: Cli) -> None:
    results = json.loads(synced.ok("pause", "all", "--reason", "freeze", "--json").stdout)
    assert [r["location"] for r in results] == sorted(load_sample())
    assert {r["result"] for r in results} == {"changed"}
    assert all(
        st.state is State.PAUSED and st.reason == "freeze"
        for r in synced.statuses()
        for st in r.services.values()
    )
    again = json.loads(synced.ok("pause", "all", "--json").stdout)
    assert {r["result"] for r in again} == {"unchanged"}

    synced.ok("resume", "all")
    assert all(st.state is State.RUNNING for r in synced.statuses() for st in r.services.values())


def test_all_with_a_service_skips_locations_without_it(synced: Cli) -> None:
    results = json.loads(synced.ok("pause", "all", "-s", "ingestion", "--json").stdout)
    outcome = {r["location"]: r["result"] for r in results}
    assert outcome == {
        "ap-south-tokyo": "changed",
        "us-east-1": "changed",
        "cold-archive-1": "skipped",
        "dr-site-a": "skipped",
        "eu-west-par": "skipped",
    }
    assert states(synced.status("us-east-1"))["lifecycle"] is State.RUNNING


def test_schedule_all_schedules_paused_locations_and_skips_running_ones(synced: Cli) -> None:
    synced.ok("pause", "dr-site-a")
    results = json.loads(synced.ok("resume", "all", "--in", "1h", "--json").stdout)
    outcome = {r["location"]: r["result"] for r in results}
    assert outcome["dr-site-a"] == "changed"
    assert {v for k, v in outcome.items() if k != "dr-site-a"} == {"skipped"}
    assert synced.status("dr-site-a").services["replication"].resume_at is not None
    synced.ok("cancel-schedule", "all")
    assert synced.status("dr-site-a").services["replication"].resume_at is None
    # nothing paused anywhere: refused
    synced.ok("resume", "dr-site-a")
    refused = synced("resume", "all", "--in", "1h")
    assert refused.exit_code == 1 and "no location" in refused.stderr


def schedule_was(old: datetime, new: datetime) -> str:
    """How a moved schedule's old time is shown: the time alone on the new one's day, else in
    full (a test that expected the short form failed near midnight UTC)."""
    return old.strftime("%H:%MZ" if old.date() == new.date() else "%Y-%m-%dT%H:%M:%SZ")


def test_moving_an_existing_schedule_of_all_says_rescheduled_and_what_it_was(synced: Cli) -> None:
    """Issue 20: ``resume all --in 1h`` over a 2 h schedule moved it earlier, reported only as
    ``changed``: it says ``rescheduled (was HH:MMZ)`` and gives the old time in ``--json``."""
    synced.ok("pause", "all", "-s", "lifecycle")
    out = synced.ok("resume", "all", "-s", "lifecycle", "--in", "2h", "--json").stdout
    first = [r for r in json.loads(out) if r["result"] != "skipped"]  # no lifecycle there
    assert first and {r["result"] for r in first} == {"changed"}
    assert all("rescheduled" not in r for r in first)
    was = {r["location"]: r["status"]["services"]["lifecycle"]["resume_at"] for r in first}
    out = synced.ok("resume", "all", "-s", "lifecycle", "--in", "1h").stdout
    for loc, at in was.items():
        old = datetime.fromisoformat(at)
        new = synced.status(loc).services["lifecycle"].resume_at
        assert new is not None and new < old
        shown = schedule_was(old, new)
        row = next(line for line in out.splitlines() if f" {loc} " in line)
        assert "rescheduled" in row and f"(was {shown})" in row, out
    out = synced.ok("resume", "all", "-s", "lifecycle", "--in", "3h", "--json").stdout
    moved = [r for r in json.loads(out) if r["result"] != "skipped"]
    assert {r["location"] for r in moved} == set(was)
    assert {r["result"] for r in moved} == {"rescheduled"}
    for r in moved:
        new = datetime.fromisoformat(r["status"]["services"]["lifecycle"]["resume_at"])
        old = datetime.fromisoformat(r["rescheduled"]["lifecycle"].replace("Z", "+00:00"))
        assert timedelta(minutes=119) < new - old < timedelta(minutes=121)


def test_moving_the_schedule_of_one_location_says_rescheduled_too(synced: Cli) -> None:
    synced.ok("pause", "us-east-1", "-s", "lifecycle")
    first = synced.ok("resume", "us-east-1", "-s", "lifecycle", "--in", "2h").stdout
    assert "rescheduled" not in first
    at = synced.status("us-east-1").services["lifecycle"].resume_at
    assert at is not None
    out = synced.ok("resume", "us-east-1", "-s", "lifecycle", "--in", "1h").stdout
    new = synced.status("us-east-1").services["lifecycle"].resume_at
    assert new is not None
    assert f"; lifecycle rescheduled (was {schedule_was(at, new)})" in out.splitlines()[0], out


def test_ctrl_c_during_a_bulk_wait_prints_what_was_done_and_exits_130(synced: Cli) -> None:
    """A real ``locstatus pause all --wait`` in its own process, a live worker that never
    applies it, and a SIGINT while it waits: the table of what was done (every location
    written, the worker's ones still pausing), then exit 130, no traceback."""
    register(synced.url, "worker-a")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCSTATUS_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "locstatus", "--backend", synced.url, "pause", "all",
         "-s", "replication", "--wait", "120", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**env, "USER": "t"},
    )
    try:
        deadline = time.monotonic() + 30
        with connect(synced.url) as mgr:
            while not all(
                r.services["replication"].state is State.PAUSING
                for r in mgr.statuses() if "replication" in r.services
            ):
                assert time.monotonic() < deadline and proc.poll() is None, "no write seen"
                time.sleep(0.05)
        time.sleep(0.3)  # into the wait
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err
    results = {r["location"]: r for r in json.loads(out)}
    has_replication = {loc for loc, svcs in load_sample().items() if "replication" in svcs}
    assert {loc for loc, r in results.items() if r["result"] == "changed"} == has_replication
    assert all(
        r["status"]["services"]["replication"]["state"] == "pausing"
        for loc, r in results.items() if loc in has_replication
    )


def test_all_with_no_locations_is_refused(cli: Cli) -> None:
    SQLiteBackend(cli.url).close()  # an empty store
    result = cli("pause", "all")
    assert result.exit_code == 1
    assert "no locations" in result.stderr


@pytest.mark.parametrize(
    "command", [["status"], ["pause", "us-east-1"], ["history", "us-east-1"], ["workers"],
                ["check"], ["resume", "all"]],
)
def test_a_store_that_does_not_exist_is_refused_not_created(
    cli: Cli, command: list[str]
) -> None:
    """A typo in a path, or a command run from another directory (default ./locstatus.db),
    must not look like an empty store, nor leave one behind."""
    result = cli(*command)
    assert result.exit_code == 2
    assert f"no locstatus store at {cli.path}" in result.stderr
    assert not cli.path.exists()
    cli.ok("locations", "sync", str(sample_path("config.json")))  # creates it
    assert cli.path.exists()


# -- exit codes --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["status", "nowhere"], 1, "'nowhere'"),
        (["pause", "nowhere"], 1, "'nowhere'"),
        (["pause", "dr-site-a", "-s", "lifecycle"], 1, "no service lifecycle"),
        (["resume", "dr-site-a", "--in", "2h"], 1, "dr-site-a"),  # running: invalid transition
        (["history", "nowhere"], 1, "'nowhere'"),
        (["pause", "../x"], 2, "'../x'"),
        (["pause", "dr-site-a", "-s", "gc"], 2, "'gc'"),
        (["resume", "dr-site-a", "--in", "soon"], 2, "'soon'"),
        (["history", "dr-site-a", "--limit", "0"], 2, "--limit '0'"),
    ],
)
def test_exit_codes(synced: Cli, args: list[str], code: int, needle: str) -> None:
    result = synced(*args)
    assert result.exit_code == code, (result.stdout, result.stderr)
    assert result.stderr.startswith("error: ")
    assert needle in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_usage_errors_exit_2(synced: Cli) -> None:
    assert synced("pause").exit_code == 2
    assert synced("frobnicate").exit_code == 2
    assert synced("history", "dr-site-a", "--limit", "many").exit_code == 2
    assert synced("pause", "dr-site-a", "--bogus").exit_code == 2


def test_bad_backend_is_exit_2_naming_the_url(tmp_path: Path) -> None:
    runner = CliRunner()
    for url in ("ftp://example.com/x", f"sqlite:///{tmp_path}/missing/dir/x.db"):
        result = runner.invoke(app, ["--backend", url, "status"], env=ENV)
        assert result.exit_code == 2, result.stderr
        assert result.stderr.startswith("error: ")
        assert ("ftp://example.com/x" in result.stderr) or ("missing/dir" in result.stderr)


def test_backend_and_services_come_from_the_environment(cli: Cli) -> None:
    runner = CliRunner()
    env = {**ENV, "LOCSTATUS_BACKEND": cli.url, "LOCSTATUS_SERVICES": "replication,gc"}
    result = runner.invoke(app, ["locations", "sync", str(sample_path("locations.txt"))], env=env)
    assert result.exit_code == 0, result.stderr
    rec = LocationStatus.model_validate_json(
        runner.invoke(app, ["status", "us-east-1", "--json"], env=env).stdout
    )
    assert sorted(rec.services) == ["gc", "replication"]
    assert runner.invoke(app, ["pause", "us-east-1", "-s", "gc"], env=env).exit_code == 0


# -- --wait and workers ------------------------------------------------------------------------


def register(url: str, worker_id: str, *, alive: bool = True, **extra: Any) -> None:
    now = datetime.now(UTC)
    with connect(url) as mgr:
        mgr.backend.put_worker(
            WorkerInfo(
                worker_id=worker_id,
                services=("replication",),
                host="host-1",
                pid=4242,
                started_at=now,
                lease_expires_at=now + (timedelta(hours=1) if alive else -timedelta(hours=1)),
                **extra,
            )
        )


def test_wait_times_out_naming_the_lagging_worker_then_settles_when_acked(synced: Cli) -> None:
    register(synced.url, "worker-7")
    result = synced("pause", "dr-site-a", "--wait", "0.3")
    assert result.exit_code == 1
    assert "worker-7" in result.stderr
    assert synced.status("dr-site-a").services["replication"].state is State.PAUSING

    def ack_later() -> None:
        time.sleep(0.3)
        with connect(synced.url) as mgr:
            mgr.backend.ack("worker-7", "dr-site-a", "replication", 1)

    acker = threading.Thread(target=ack_later)
    acker.start()
    try:
        done = synced.ok("pause", "dr-site-a", "--wait", "60", "--json")
    finally:
        acker.join()
    rec = LocationStatus.model_validate_json(done.stdout)
    assert rec.services["replication"].state is State.PAUSED


def test_a_pause_that_waits_for_workers_says_pausing_not_paused(synced: Cli) -> None:
    """Found by the new-user review: with a live worker that had not applied it yet, the CLI
    printed 'paused' while the table under it said pausing."""
    register(synced.url, "worker-7")
    out = synced.ok("pause", "dr-site-a", "--reason", "test").stdout
    assert "dr-site-a: pausing replication (until every live worker has applied it" in out
    assert "paused replication" not in out
    assert synced.status("dr-site-a").services["replication"].state is State.PAUSING
    assert "us-east-1: paused " in synced.ok("pause", "us-east-1").stdout  # nobody applies it


def test_workers_shows_lease_state_lag_and_handler_errors(synced: Cli) -> None:
    register(synced.url, "worker-a", errors={"dr-site-a/replication": "boom: disk full"})
    register(synced.url, "worker-b", alive=False, locations=("eu-west-par",))
    synced("pause", "dr-site-a", "--wait", "0")  # worker-a is live and has not acked
    rows = {w["worker_id"]: w for w in json.loads(synced.ok("workers", "--json").stdout)}
    assert rows["worker-a"]["alive"] is True and rows["worker-b"]["alive"] is False
    assert rows["worker-a"]["lagging"] == [
        {"location": "dr-site-a", "service": "replication", "acked": 0, "generation": 1}
    ]
    assert rows["worker-b"]["lagging"] == []  # filtered to eu-west-par, which did not change
    assert rows["worker-b"]["locations"] == ["eu-west-par"]
    WorkerInfo.model_validate(
        {k: v for k, v in rows["worker-a"].items() if k not in ("alive", "lagging", "lag_unknown")}
    )
    human = synced.ok("workers").stdout
    for text in ("worker-a", "alive", "expired", "dr-site-a/replication (0<1)", "disk full"):
        assert text in human, text


def test_workers_shows_a_standing_registration_away_and_retire_ends_it(
    synced: Cli, caplog: pytest.LogCaptureFixture
) -> None:
    """docs/cli.md "Reading state", docs/agent.md "Standing registrations": away since its
    lease ran out yet alive (it counts), a pause waits for it; ``workers retire`` ends it
    (exit 0, audit line), an unknown worker is exit 1, a bad id or no id exit 2."""
    register(synced.url, "backbeat.replication.zenko", alive=False, standing=True)
    register(synced.url, "worker-b", alive=False)
    rows = {w["worker_id"]: w for w in json.loads(synced.ok("workers", "--json").stdout)}
    bb = rows["backbeat.replication.zenko"]
    assert (bb["standing"], bb["away"], bb["alive"]) == (True, True, True)
    assert (rows["worker-b"]["standing"], rows["worker-b"]["away"]) == (False, False)
    human = synced.ok("workers").stdout
    assert "standing, away since" in human and "expired" in human
    assert ("backbeat.replication.zenko: its holder (host host-1, pid 4242) is not running; "
            "start it again; retire it only once what it stands for is gone for good "
            "(the pauses it holds back then settle without it): locstatus workers retire "
            "backbeat.replication.zenko") in human, human
    result = synced("pause", "dr-site-a", "--wait", "0.3")
    assert result.exit_code == 1
    assert "backbeat.replication.zenko (standing registration, holder away since" in result.stderr
    caplog.set_level(logging.INFO, logger="locstatus.audit")
    done = synced.ok("workers", "retire", "backbeat.replication.zenko", "--actor", "ops")
    assert "retired the standing registration of backbeat.replication.zenko" in done.stdout
    assert [(r.getMessage().split(" (")[0], getattr(r, "actor", None)) for r in caplog.records
            if r.name == "locstatus.audit"] == [
        ("worker backbeat.replication.zenko retired by ops", "ops")]
    assert [w["worker_id"] for w in json.loads(synced.ok("workers", "--json").stdout)] == [
        "worker-b"]
    assert synced.status("dr-site-a").services["replication"].state is State.PAUSING
    synced.ok("pause", "dr-site-a", "--wait", "5")  # worker-b's lease ran out: settles now
    assert synced.status("dr-site-a").services["replication"].state is State.PAUSED
    unknown = synced("workers", "retire", "backbeat.replication.zenko")
    assert unknown.exit_code == 1
    assert "no worker 'backbeat.replication.zenko' is registered" in unknown.stderr
    assert synced("workers", "retire", "a/b").exit_code == 2
    assert synced("workers", "retire").exit_code == 2


def test_an_away_holders_lapsed_acknowledgements_read_unknown_not_zero(
    tmp_path: Path, zk_server: ZkServer
) -> None:
    """Found by the new-user review (issue 18): on ZooKeeper, once the bridge stopped, its
    standing registration's lag read ``(0<9)`` and the check's ``acked_generation: null``
    though its processor had applied the generation before: its acknowledgements were
    ephemeral under the bridge's session. Now unknown (lapsed with the holder's session); the
    lag itself stays (the settle rule is unchanged)."""
    cli = Cli(tmp_path)
    cli.url = zk_url(zk_server.hosts)
    now = datetime.now(UTC)
    holder = connect(cli.url)
    holder.add_location("zenko", ["replication"])
    holder.backend.put_worker(WorkerInfo(
        worker_id="backbeat.replication.zenko", services=("replication",), host="host-1",
        pid=4242, started_at=now, standing=True))
    gen = holder.pause("zenko").services["replication"].generation
    holder.backend.ack("backbeat.replication.zenko", "zenko", "replication", gen)
    holder.close()  # the bridge stops: its session, and its acknowledgements, go
    assert cli("resume", "zenko", "--wait", "0").exit_code == 1  # it waits for the holder
    now_gen = cli.status("zenko").services["replication"].generation
    rows = {w["worker_id"]: w for w in json.loads(cli.ok("workers", "--json").stdout)}
    bb = rows["backbeat.replication.zenko"]
    assert bb["away"] is True
    assert bb["lagging"] == [
        {"location": "zenko", "service": "replication", "acked": None, "generation": now_gen}]
    human = cli("workers", env={"COLUMNS": "400"}).stdout
    assert (f"zenko/replication (?<{now_gen}: acknowledgement unknown, lapsed with its holder's "
            "session)") in human, human
    assert "(0<" not in human
    time.sleep(1.1)
    checked = cli("check", "--json", "--stuck-after", "1s")
    report = json.loads(checked.stdout or "null")
    assert report is not None, checked.stderr
    [stuck] = [f for f in report["findings"] if f["kind"] == "stuck_transition"]
    [lag] = stuck["evidence"]["lagging_workers"]
    assert (lag["acked_generation"], lag["ack_lapsed"]) == (None, True)
    assert cli.status("zenko").services["replication"].state is State.RESUMING


def test_workers_retire_refuses_a_standing_registration_whose_holder_is_present(
    synced: Cli
) -> None:
    """docs/agent.md "Standing registrations": its lease holds (the bridge runs, or was killed
    a moment ago): retiring it would let a pause settle without the processor, so exit 1
    naming the holder, nothing removed. ``--force`` waits for the holder to be away: a
    holder gone for good (it renews no more) is retired once its lease ran out."""
    now = datetime.now(UTC)
    with connect(synced.url) as mgr:
        mgr.backend.put_worker(WorkerInfo(
            worker_id="backbeat.replication.zenko", services=("replication",), host="host-1",
            pid=4242, instance="5f" * 16, started_at=now,
            lease_expires_at=now + timedelta(seconds=2), standing=True))
    refused = synced("workers", "retire", "backbeat.replication.zenko")
    assert refused.exit_code == 1, refused.stdout
    assert "holder is present (host host-1, pid 4242)" in refused.stderr, refused.stderr
    assert "--force" in refused.stderr
    assert [(w["worker_id"], w["instance"]) for w in json.loads(
        synced.ok("workers", "--json").stdout)] == [("backbeat.replication.zenko", "5f" * 16)]
    done = synced.ok("workers", "retire", "backbeat.replication.zenko", "--force")
    assert datetime.now(UTC) >= now + timedelta(seconds=2)  # it waited for the lease
    # said before the wait, not silent for up to a lease (issue 18's new-user review)
    assert re.search(r"waiting up to \d+ s for backbeat\.replication\.zenko's holder \(host "
                     r"host-1, pid 4242\) to be away", done.stderr), done.stderr
    assert "retired the standing registration of backbeat.replication.zenko" in done.stdout
    assert json.loads(synced.ok("workers", "--json").stdout) == []


@pytest.mark.parametrize("bad", ["../../x", "a/b", "..", "all", "-x"])
def test_workers_retire_of_a_bad_id_names_a_worker_id_not_a_location(
    synced: Cli, bad: str
) -> None:
    """``locstatus workers retire`` takes a worker id: a bad one is exit 2 naming it as a
    worker id (once: "invalid location name"), nothing retired."""
    register(synced.url, "worker-b")
    result = synced("workers", "retire", "--", bad)
    assert result.exit_code == 2, result.stderr
    assert "worker" in result.stderr and repr(bad) in result.stderr
    assert "location name" not in result.stderr
    assert [w["worker_id"] for w in json.loads(synced.ok("workers", "--json").stdout)] == [
        "worker-b"]


def test_workers_show_each_workers_clock_offset_to_the_backend(synced: Cli) -> None:
    """docs/time.md "What an operator sees": the offset each worker published (its host's
    clock minus the backend's), in --json and in the table, and this host's own below it."""
    register(synced.url, "w-ahead", clock_offset_seconds=10_800.0)
    register(synced.url, "w-near", clock_offset_seconds=-0.004)
    register(synced.url, "w-unknown")
    rows = {w["worker_id"]: w for w in json.loads(synced.ok("workers", "--json").stdout)}
    assert rows["w-ahead"]["clock_offset_seconds"] == 10_800.0
    assert rows["w-near"]["clock_offset_seconds"] == -0.004
    assert rows["w-unknown"]["clock_offset_seconds"] is None
    human = synced.ok("workers").stdout
    assert "Clock" in human and "+3h (+10800s)" in human and "-0.004s" in human
    assert "this host's clock minus the backend's: " in human


# -- text written by other means ---------------------------------------------------------------

TITLE = "\x1b]0;owned\x07"  # sets the terminal's title
ERASE = "\x1b[2K\x1b[1A"  # erases the line, moves the cursor up: rewrites what was printed
CSI8 = "\x9b2J"  # the one-byte C1 form of ESC [ (clears the screen on 8-bit terminals)


def stored_with(path: Path, location: str, **fields: str) -> None:
    """Put ``fields`` into the stored record and its newest history row with sqlite3 itself,
    the way another tool (or an older locstatus) could have written them."""
    with sqlite3.connect(path) as db:
        (data,) = db.execute("SELECT data FROM locations WHERE location = ?", (location,)).fetchone()
        record = json.loads(data)
        record["services"]["replication"].update(fields)
        db.execute("UPDATE locations SET data = ? WHERE location = ?", (json.dumps(record), location))
        version, data = db.execute(
            "SELECT version, data FROM history WHERE location = ? ORDER BY version DESC LIMIT 1",
            (location,),
        ).fetchone()
        rows = json.loads(data)
        for row in rows if isinstance(rows, list) else [rows]:
            row.update(fields)
        db.execute("UPDATE history SET data = ? WHERE location = ? AND version = ?",
                   (json.dumps(rows), location, version))


def test_stored_control_characters_are_shown_escaped_never_sent_to_the_terminal(
    synced: Cli,
) -> None:
    synced.ok("pause", "dr-site-a", "--reason", "maintenance")
    stored_with(synced.path, "dr-site-a", reason=f"disk{TITLE}full{ERASE}", actor=f"ops{CSI8}")
    register(synced.url, "worker-a", errors={"dr-site-a/replication": f"boom{ERASE}{TITLE}"})
    assert synced.status("dr-site-a").services["replication"].reason == f"disk{TITLE}full{ERASE}"
    outputs = {
        "status": synced.ok("status").stdout,
        "status LOC": synced.ok("status", "dr-site-a").stdout,
        "history": synced.ok("history", "dr-site-a").stdout,
        "workers": synced.ok("workers").stdout,
    }
    for command, out in outputs.items():
        for raw in (TITLE, "\x1b[2K", "\x1b[1A", "\x9b", "\x07"):
            assert raw not in out, (command, raw, out)
    for command in ("status", "status LOC", "history"):
        assert "disk\\x1b]0;owned\\x07full\\x1b[2K\\x1b[1A" in outputs[command], command
        assert "ops\\x9b2J" in outputs[command], command
    assert "boom\\x1b[2K\\x1b[1A\\x1b]0;owned\\x07" in outputs["workers"]


# -- corrupt records ---------------------------------------------------------------------------


def corrupt(path: Path, location: str, payload: str) -> None:
    with sqlite3.connect(path) as db:
        db.execute("UPDATE locations SET data = ? WHERE location = ?", (payload, location))


def test_corrupt_records_are_named_and_do_not_hide_the_others(synced: Cli) -> None:
    corrupt(synced.path, "dr-site-a", "{not json")
    corrupt(synced.path, "eu-west-par", json.dumps({"deleted_at": None}))  # no "services"

    one = synced("status", "dr-site-a")
    assert one.exit_code == 2
    assert one.stderr.startswith("error: corrupt record for location 'dr-site-a'")
    assert synced("status", "eu-west-par").exit_code == 2

    listing = synced("status")
    assert listing.exit_code == 2
    for name in ("us-east-1", "ap-south-tokyo", "cold-archive-1"):
        assert name in listing.stdout
    assert "CORRUPT" in listing.stdout
    assert "'dr-site-a'" in listing.stderr and "'eu-west-par'" in listing.stderr

    as_json = synced("status", "--json")
    assert as_json.exit_code == 2
    assert [r.location for r in STATUS_LIST.validate_json(as_json.stdout)] == [
        "ap-south-tokyo",
        "cold-archive-1",
        "us-east-1",
    ]
    # the history of a corrupt location is still readable
    hist = synced("history", "dr-site-a", "--json")
    assert hist.exit_code == 0 and "warning: corrupt record" in hist.stderr
    # bulk operations act on the readable ones and report the corrupt ones
    bulk = synced("pause", "all", "--json")
    assert bulk.exit_code == 2
    results = {r["location"]: r["result"] for r in json.loads(bulk.stdout)}
    assert results["dr-site-a"] == "error" and results["us-east-1"] == "changed"
    # syncing a list that names a corrupt location is refused before anything is written
    sync = synced("locations", "sync", str(sample_path("locations.txt")))
    assert sync.exit_code == 2 and "dr-site-a" in sync.stderr
    # and says what to do: check never rewrites a corrupt record, so not "repair it with check"
    assert "restore it by hand" in sync.stderr and "repair it with" not in sync.stderr


def test_workers_names_corrupt_records_and_registrations_as_errors(synced: Cli) -> None:
    """``workers`` read only the readable records, so a corrupt one vanished from every
    worker's lag; and an unreadable registration (listed as the live worker it counts as) was
    shown like any other. Both are named, the readable rest still shown, exit 2."""
    register(synced.url, "worker-a")
    register(synced.url, "worker-eu", locations=("eu-west-par",))
    synced("pause", "dr-site-a", "--wait", "0")  # worker-a lags there
    corrupt(synced.path, "us-east-1", "{not json")
    with sqlite3.connect(synced.path) as db:
        db.execute("INSERT INTO workers (worker_id, data) VALUES ('worker-bad', '{\"x\": 1}')")

    as_json = synced("workers", "--json")
    assert as_json.exit_code == 2
    rows = {w["worker_id"]: w for w in json.loads(as_json.stdout)}
    assert rows["worker-a"]["lag_unknown"] == ["us-east-1"]
    assert [x["location"] for x in rows["worker-a"]["lagging"]] == ["dr-site-a"]
    assert rows["worker-eu"]["lag_unknown"] == []  # its filter leaves us-east-1 out
    bad = rows["worker-bad"]
    assert bad["corrupt"] and bad["alive"] is True and bad["lag_unknown"] == ["us-east-1"]
    assert "dr-site-a" in [x["location"] for x in bad["lagging"]]  # it may apply everything
    assert "'worker-bad': registration does not parse" in as_json.stderr
    assert "corrupt record for location 'us-east-1'" in as_json.stderr

    human = synced("workers")
    assert human.exit_code == 2
    for text in ("worker-a", "dr-site-a/replication (0<1)", "us-east-1/? (record",
                 "worker-bad", "registration corrupt"):  # (cells wrap: a phrase may split)
        assert text in human.stdout, text
    assert "1 corrupt record(s)" in human.stderr
    assert "1 corrupt worker registration(s)" in human.stderr


def test_a_service_entry_without_its_state_is_corrupt_not_running(synced: Cli) -> None:
    """Backbeat's BB-37: an entry written without ``state`` over a paused location was shown
    as ``running`` (exit 0). It is a corrupt record naming the missing field, in ``status``
    of that location and of every location, and in ``check``."""
    synced.ok("pause", "dr-site-a", "--service", "replication", "--reason", "maint")
    corrupt(synced.path, "dr-site-a", '{"services": {"replication": {}}, "deleted_at": null}')
    one = synced("status", "dr-site-a")
    assert one.exit_code == 2 and "running" not in one.stdout
    assert one.stderr.startswith("error: corrupt record for location 'dr-site-a': "
                                 "services.replication.state: Field required")
    listing = synced("status")
    assert listing.exit_code == 2 and "CORRUPT" in listing.stdout
    assert "services.replication.state: Field required" in listing.stderr
    check = synced("check", "--json")
    assert check.exit_code == 1
    assert [(f["kind"], f["location"]) for f in json.loads(check.stdout)["findings"]] == [
        ("corrupt_record", "dr-site-a")]


# -- commands implemented elsewhere: wiring ----------------------------------------------------


@pytest.fixture
def fake_modules(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    calls: dict[str, Any] = {}

    class Report:
        exit_code = 1

        def as_dict(self) -> dict[str, Any]:
            return {"findings": [{"kind": "overdue_resume"}]}

    def run_check(mgr: Any, **kwargs: Any) -> Report:
        calls["check"] = {"locations": [r.location for r in mgr.statuses()], **kwargs}
        return Report()

    def render_report(report: Report, console: Any) -> None:
        console.print("rendered report")

    def write_metrics(report: Report, path: str) -> None:
        Path(path).write_text("locstatus_findings 1\n")

    def serve(url: str, **kwargs: Any) -> None:
        calls["serve"] = {"url": url, **kwargs}

    def run_demo(**kwargs: Any) -> int:
        calls["demo"] = kwargs
        return 3

    check_mod = types.ModuleType("locstatus.check")
    check_mod.__dict__.update(
        run_check=run_check, render_report=render_report, write_metrics=write_metrics
    )
    server_mod = types.ModuleType("locstatus.api.server")
    server_mod.__dict__.update(serve=serve)
    demo_mod = types.ModuleType("locstatus.demo")
    demo_mod.__dict__.update(run_demo=run_demo)
    monkeypatch.setitem(sys.modules, "locstatus.check", check_mod)
    monkeypatch.setitem(sys.modules, "locstatus.api.server", server_mod)
    monkeypatch.setitem(sys.modules, "locstatus.demo", demo_mod)
    yield calls


def test_check_passes_parsed_options_and_exits_with_the_report_code(
    synced: Cli, fake_modules: dict[str, Any], tmp_path: Path
) -> None:
    metrics = tmp_path / "m.prom"
    result = synced(
        "check",
        "--repair",
        "--json",
        "--stuck-after",
        "90s",
        "--tombstone-ttl",
        "1d",
        "--locations",
        str(sample_path("config.json")),
        "--location-config",
        str(sample_path("locationConfig.json")),
        "--metrics-file",
        str(metrics),
        "--max-skew",
        "0.5",
    )
    assert result.exit_code == 1
    assert json.loads(result.stdout) == {"findings": [{"kind": "overdue_resume"}]}
    call = fake_modules["check"]
    assert call["repair"] is True and call["dry_run"] is False
    assert call["stuck_after"] == 90.0 and call["tombstone_ttl"] == 86_400.0
    assert call["max_skew"] == 0.5
    assert call["expected"] == load_sample()
    assert call["progress"] is False  # never a progress bar mixed into JSON
    assert call["locations"] == sorted(load_sample())
    assert metrics.read_text() == "locstatus_findings 1\n"

    human = synced("check", "--no-progress")
    assert human.exit_code == 1 and "rendered report" in human.stdout
    assert fake_modules["check"]["expected"] is None and fake_modules["check"]["progress"] is False
    assert fake_modules["check"]["max_skew"] == 1.0
    assert synced("check", "--max-skew", "-1").exit_code == 2


def test_check_refuses_a_metrics_file_it_cannot_write_before_it_scans(
    synced: Cli, tmp_path: Path
) -> None:
    """Found by the new-user review: the report said clean (exit_code 0) and the process then
    exited 2 on the metrics file. Now the option is refused first, with no report printed."""
    for path, why in ((tmp_path / "missing" / "x.prom", "does not exist"),
                      (tmp_path, "is a directory")):
        result = synced("check", "--json", "--metrics-file", str(path))
        assert result.exit_code == 2
        assert result.stdout == ""
        assert why in result.stderr and "--metrics-file" in result.stderr


def test_check_dry_run_alone_plans_the_repairs(synced: Cli) -> None:
    register(synced.url, "worker-gone", alive=False)
    report = json.loads(synced("check", "--dry-run", "--json").stdout)
    assert report["options"]["dry_run"] is True
    assert [r["outcome"] for r in report["repairs"]] == ["planned"]
    assert report["exit_code"] == 1
    assert [w.worker_id for w in connect(synced.url).workers()] == ["worker-gone"]  # unwritten


def test_a_zookeeper_that_does_not_answer_is_one_error_line(tmp_path: Path) -> None:
    """kazoo logs every failed connection attempt; the CLI says the outcome once (docs/cli.md:
    errors are one line on stderr)."""
    proc = subprocess.run(
        [sys.executable, "-m", "locstatus", "--backend", "zk://127.0.0.1:1/x?timeout=1", "check"],
        capture_output=True, text=True, timeout=60,
        env={k: v for k, v in os.environ.items() if k != "LOCSTATUS_DEBUG"},
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: cannot connect"), (
        proc.stderr
    )


def test_serve_and_demo_wiring(
    synced: Cli, fake_modules: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    result = synced(
        "serve",
        "--port",
        "9999",
        "--check-interval",
        "30",
        "--allow-host",
        "s3.zenko.local",
        "--allow-host",
        "cloudserver",
        "--backbeat-trust",
        "10.100.0.0/16",
        env={"LOCSTATUS_API_TOKEN": "s3cret"},
    )
    assert result.exit_code == 0, result.stderr
    assert fake_modules["serve"] == {
        "url": synced.url,
        "host": "127.0.0.1",
        "port": 9999,
        "token": "s3cret",
        "insecure": False,
        "reconcile_interval": 1.0,
        "check_interval": 30.0,
        "allowed_hosts": ("s3.zenko.local", "cloudserver"),
        "backbeat_trust": ("10.100.0.0/16",),
        "location_series": 1000,
        "log_format": "text",
    }
    result = synced("serve", "--location-series", "0", "--log-format", "JSON")
    assert result.exit_code == 0, result.stderr
    assert fake_modules["serve"]["location_series"] == 0
    assert fake_modules["serve"]["log_format"] == "json"
    for option, bad in (("--location-series", "-1"), ("--location-series", "many"),
                        ("--log-format", "yaml")):
        result = synced("serve", option, bad)
        assert result.exit_code == 2 and f"invalid {option} {bad!r}" in result.stderr
    assert synced("serve", "--port", "65536").exit_code == 2
    assert synced("serve", "--port", "-1").exit_code == 2

    demo = synced("demo", "--workers", "2", "--duration", "5", "--keep")
    assert demo.exit_code == 3
    assert fake_modules["demo"] == {
        "backend_url": synced.url,
        "keep": True,
        "workers": 2,
        "duration": 5.0,
        "port": 8080,
        "services": ("replication", "lifecycle", "ingestion"),
    }
    # the backend only reaches the demo when given on the command line, never from the env
    env_only = CliRunner().invoke(app, ["demo"], env={**ENV, "LOCSTATUS_BACKEND": synced.url})
    assert env_only.exit_code == 3 and fake_modules["demo"]["backend_url"] is None


def test_missing_feature_module_is_a_clear_exit_2(
    synced: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "locstatus.demo", None)  # import fails
    result = synced("demo")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: 'locstatus demo' is not available")


# -- a real process ----------------------------------------------------------------------------


def run(
    tmp_path: Path, *args: str, exe: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCSTATUS_")}
    env["COLUMNS"] = "200"
    return subprocess.run(
        [*(exe or [sys.executable, "-m", "locstatus"]), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_python_dash_m_uses_the_default_backend_and_exit_codes(tmp_path: Path) -> None:
    assert run(tmp_path, "locations", "sync", "--sample").returncode == 0
    assert (tmp_path / "locstatus.db").is_file()  # sqlite:///./locstatus.db in the cwd
    paused = run(tmp_path, "pause", "us-east-1", "--reason", "maintenance")
    assert paused.returncode == 0, paused.stderr
    noop = run(tmp_path, "pause", "us-east-1")
    assert noop.returncode == 0 and "no change" in noop.stdout
    status = run(tmp_path, "status", "us-east-1", "--json")
    assert LocationStatus.model_validate_json(status.stdout).services["lifecycle"].paused
    refused = run(tmp_path, "resume", "dr-site-a", "--at", "2099-01-01T00:00:00Z")
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: ") and "Traceback" not in refused.stderr
    bad = run(tmp_path, "pause", "../etc/passwd")
    assert bad.returncode == 2 and "'../etc/passwd'" in bad.stderr
    assert "Traceback" not in bad.stderr
    usage = run(tmp_path, "resume")
    assert usage.returncode == 2


def test_console_script_is_installed(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "locstatus"
    assert script.is_file(), "package not installed (pip install -e .)"
    SQLiteBackend(f"sqlite:///{tmp_path}/c.db").close()  # an empty store
    result = run(tmp_path, "--backend", f"sqlite:///{tmp_path}/c.db", "status", exe=[str(script)])
    assert result.returncode == 0
    assert "no locations" in result.stdout
    assert run(tmp_path, "--version", exe=[str(script)]).stdout.startswith("locstatus ")
