"""Malformed input, through the CLI and through the library (docs/design.md §2, §5.2).

Every case must be refused with a clear error that names the bad value, with the exit code of
docs/design.md §5.2 (2 usage, 1 refused) or the matching :class:`LocstatusError`, and must leave the store
byte-for-byte as it was: the test compares a full ``sqlite3`` dump (records, history, acks,
change log) taken before and after each case, on one store shared by every case.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from locstatus import (
    InvalidInput,
    InvalidTransition,
    LocstatusError,
    Manager,
    NotFound,
    connect,
)
from locstatus.cli import app
from locstatus.locations import load_sample

ENV = {"LOCSTATUS_BACKEND": None, "LOCSTATUS_SERVICES": None, "COLUMNS": "200", "USER": "t"}
LONG = "x" * 10_000


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """One store with the sample locations, one paused with a scheduled resume."""
    path = tmp_path_factory.mktemp("bad-input") / "locstatus.db"
    url = f"sqlite:///{path}"
    with connect(url) as mgr:
        mgr.sync_locations(load_sample())
        mgr.pause("us-east-1", reason="maintenance", actor="ops")
        mgr.resume("us-east-1", "lifecycle", at=timedelta(hours=3), actor="ops")
    yield path, url


def dump(path: Path) -> list[str]:
    db = sqlite3.connect(path)
    try:
        return list(db.iterdump())
    finally:
        db.close()


# -- through the CLI ---------------------------------------------------------------------------

BAD_NAMES = [
    "../x",
    ".",
    "..",
    "",
    "a/b",
    LONG,
    "x" * 129,
    "café",
    "東京",
    "a\nb",
    "a\tb",
    "a\x1b[2Jb",
    "a b",
    " us-east-1",
    "us-east-1 ",
    ".hidden",
    "_x",
    "a:b",
    "a\\b",
    "a*",
    "%2e%2e",
]
"""Invalid location names; each is tried with several commands."""

CLI_CASES: list[tuple[str, list[str], int, str]] = []
for i, name in enumerate(BAD_NAMES):
    shown = repr(name)[:40]
    command = (["pause"], ["resume"], ["cancel-schedule"], ["status"], ["history"])[i % 5]
    CLI_CASES.append((f"name-{i}-{command[0]}", [*command, "--", name], 2, shown))
CLI_CASES += [
    ("name-pause-longname", ["pause", "--", LONG], 2, "'xxxxxxxx"),
    ("name-resume-dotdot", ["resume", "--in", "1h", "--", ".."], 2, "'..'"),
    ("leading-dash", ["pause", "-x"], 2, "-x"),
    ("leading-dash-after-separator", ["pause", "--", "-x"], 2, "'-x'"),
    ("leading-dash-status", ["status", "--", "--json-"], 2, "'--json-'"),
    # services
    ("service-path", ["pause", "us-east-1", "-s", "../x"], 2, "'../x'"),
    ("service-unknown", ["pause", "us-east-1", "-s", "gc"], 2, "'gc'"),
    ("service-empty", ["pause", "us-east-1", "-s", ""], 2, "''"),
    ("service-upper", ["pause", "us-east-1", "-s", "REPLICATION"], 2, "'REPLICATION'"),
    (
        "service-space",
        ["resume", "us-east-1", "-s", "replication lifecycle"],
        2,
        "'replication lifecycle'",
    ),
    ("service-comma", ["pause", "us-east-1", "-s", "crr,lifecycle"], 2, "'crr,lifecycle'"),
    ("service-second-bad", ["pause", "us-east-1", "-s", "lifecycle", "-s", "x/y"], 2, "'x/y'"),
    ("service-not-at-location", ["pause", "dr-site-a", "-s", "lifecycle"], 1, "lifecycle"),
    ("service-all-unknown", ["pause", "all", "-s", "gc"], 2, "'gc'"),
    # dates
    (
        "at-past",
        ["resume", "us-east-1", "--at", "2020-01-01T00:00:00Z"],
        2,
        "'2020-01-01T00:00:00Z'",
    ),
    ("at-naive", ["resume", "us-east-1", "--at", "2030-01-01T00:00:00"], 2, "no timezone"),
    ("at-date-only", ["resume", "us-east-1", "--at", "2030-01-01"], 2, "'2030-01-01'"),
    ("at-garbage", ["resume", "us-east-1", "--at", "tomorrow"], 2, "'tomorrow'"),
    ("at-past-9999-in-utc", ["resume", "us-east-1", "--at", "9999-12-31T23:59:59-01:00"], 2,
     "'9999-12-31T23:59:59-01:00': out of range"),
    ("at-before-year-1-in-utc", ["resume", "us-east-1", "--at", "0001-01-01T00:00:00+01:00"],
     2, "out of range"),
    (
        "at-month-13",
        ["resume", "us-east-1", "--at", "2030-13-01T00:00:00Z"],
        2,
        "'2030-13-01T00:00:00Z'",
    ),
    ("at-hour-25", ["resume", "us-east-1", "--at", "2030-01-01T25:00Z"], 2, "'2030-01-01T25:00Z'"),
    ("at-empty", ["resume", "us-east-1", "--at", ""], 2, "''"),
    ("at-epoch", ["resume", "us-east-1", "--at", "1900000000"], 2, "'1900000000'"),
    ("at-year-10000", ["resume", "us-east-1", "--at", "10000-01-01T00:00:00Z"], 2, "10000"),
    (
        "at-and-in",
        ["resume", "us-east-1", "--at", "2030-01-01T00:00Z", "--in", "1h"],
        2,
        "not both",
    ),
    # durations
    ("in-negative", ["resume", "us-east-1", "--in", "-2h"], 2, "'-2h'"),
    ("in-zero", ["resume", "us-east-1", "--in", "0s"], 2, "'0s'"),
    ("in-zero-compound", ["resume", "us-east-1", "--in", "0h0m"], 2, "'0h0m'"),
    ("in-no-unit", ["resume", "us-east-1", "--in", "2"], 2, "'2'"),
    ("in-bad-unit", ["resume", "us-east-1", "--in", "2w"], 2, "'2w'"),
    ("in-fraction", ["resume", "us-east-1", "--in", "1.5h"], 2, "'1.5h'"),
    ("in-order", ["resume", "us-east-1", "--in", "30m1h"], 2, "'30m1h'"),
    ("in-empty", ["resume", "us-east-1", "--in", ""], 2, "''"),
    ("in-huge", ["resume", "us-east-1", "--in", "999999999d"], 2, "'999999999d'"),
    ("in-running", ["resume", "dr-site-a", "--in", "2h"], 1, "dr-site-a"),
    # waits
    ("wait-text", ["pause", "us-east-1", "--wait", "soon"], 2, "soon"),
    ("wait-negative", ["pause", "us-east-1", "--wait", "-1"], 2, "-1"),
    ("wait-nan", ["pause", "us-east-1", "--wait", "nan"], 2, "nan"),
    ("wait-inf", ["pause", "us-east-1", "--wait", "inf"], 2, "inf"),
    ("wait-too-long", ["resume", "us-east-1", "--wait", "100000"], 2, "100000"),
    ("wait-with-schedule", ["resume", "us-east-1", "--in", "2h", "--wait", "5"], 2, "--wait '5'"),
    # other options
    ("limit-zero", ["history", "us-east-1", "--limit", "0"], 2, "--limit '0'"),
    ("limit-negative", ["history", "us-east-1", "--limit", "-5"], 2, "-5"),
    ("limit-huge", ["history", "us-east-1", "--limit", "10001"], 2, "10001"),
    ("limit-text", ["history", "us-east-1", "--limit", "ten"], 2, "ten"),
    ("reason-too-long", ["pause", "us-east-1", "--reason", "r" * 2000], 2, "2000 characters"),
    ("actor-too-long", ["pause", "us-east-1", "--actor", "a" * 300], 2, "300 characters"),
    ("actor-blank", ["pause", "us-east-1", "--actor", "  "], 2, "'  '"),
    # control characters in free text: a terminal would act on them (locstatus.names)
    ("reason-osc-title", ["pause", "dr-site-a", "--reason", "a\x1b]0;pwned\x07"], 2,
     "--reason 'a\\x1b]0;pwned\\x07' contains the control character U+001B"),
    ("reason-erase-line", ["pause", "dr-site-a", "--reason", "ok\x1b[2K"], 2, "U+001B"),
    ("reason-newline", ["resume", "us-east-1", "--reason", "a\nb"], 2, "U+000A"),
    ("actor-cursor-up", ["cancel-schedule", "us-east-1", "--actor", "ops\x1b[1A"], 2,
     "--actor 'ops\\x1b[1A'"),
    ("actor-c1-csi", ["pause", "all", "--actor", "ops\x9b2J"], 2, "U+009B"),
    ("sync-actor-control", ["locations", "sync", "--sample", "--actor", "a\rb"], 2, "U+000D"),
    # bidirectional controls reorder what a terminal shows: "\u202eemag" prints as "game"
    ("reason-bidi-override", ["pause", "dr-site-a", "--reason", "ok \u202eemag"], 2, "U+202E"),
    ("actor-bidi-isolate", ["resume", "us-east-1", "--actor", "ops\u2067x"], 2, "U+2067"),
    ("check-stuck-zero", ["check", "--stuck-after", "0s"], 2, "'0s'"),
    ("check-ttl-text", ["check", "--tombstone-ttl", "a day"], 2, "'a day'"),
    ("serve-port", ["serve", "--port", "70000"], 2, "'70000'"),
    ("serve-port-text", ["serve", "--port", "http"], 2, "'http'"),
    ("demo-workers", ["demo", "--workers", "0"], 2, "'0'"),
    ("demo-duration", ["demo", "--duration", "-5"], 2, "'-5'"),
    ("serve-interval", ["serve", "--reconcile-interval", "0"], 2, "--reconcile-interval '0'"),
]


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [c[1:] for c in CLI_CASES],
    ids=[c[0] for c in CLI_CASES],
)
def test_cli_refuses_bad_input_and_writes_nothing(
    store: tuple[Path, str], args: list[str], code: int, needle: str
) -> None:
    path, url = store
    before = dump(path)
    result = CliRunner().invoke(app, ["--backend", url, *args], env=ENV)
    assert result.exit_code == code, (result.stdout, result.stderr)
    assert needle in result.stderr, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert dump(path) == before


BAD_GLOBALS: list[tuple[str, list[str], str]] = [
    ("backend-empty", ["--backend", ""], "''"),
    ("backend-scheme", ["--backend", "ftp://host/x"], "'ftp://host/x'"),
    ("backend-no-scheme", ["--backend", "locstatus.db"], "'locstatus.db'"),
    ("backend-sqlite-netloc", ["--backend", "sqlite://host/x.db"], "'sqlite://host/x.db'"),
    ("backend-sqlite-no-path", ["--backend", "sqlite:///"], "'sqlite:///'"),
    (
        "backend-sqlite-missing-dir",
        ["--backend", "sqlite:///{tmp}/no/such/dir/x.db"],
        "no/such/dir",
    ),
    ("backend-sqlite-timeout", ["--backend", "sqlite:///{tmp}/x.db?timeout=abc"], "timeout=abc"),
    ("backend-sqlite-sync", ["--backend", "sqlite:///{tmp}/x.db?synchronous=bogus"], "'bogus'"),
    ("backend-sqlite-timeout-nan", ["--backend", "sqlite:///{tmp}/x.db?timeout=nan"],
     "timeout=nan"),
    ("backend-sqlite-poll-zero", ["--backend", "sqlite:///{tmp}/x.db?poll_interval=0"],
     "poll_interval=0"),
    ("backend-zk-open-bracket", ["--backend", "zk://[::1/x"], "invalid ZooKeeper URL"),
    ("backend-mongo-open-bracket", ["--backend", "mongodb://[::1:37017/"],
     "invalid MongoDB URL"),
    ("services-empty", ["--backend", "{url}", "--services", " , "], "' , '"),
    (
        "services-bad",
        ["--backend", "{url}", "--services", "replication,Life Cycle"],
        "'Life Cycle'",
    ),
]


@pytest.mark.parametrize(
    ("options", "needle"), [c[1:] for c in BAD_GLOBALS], ids=[c[0] for c in BAD_GLOBALS]
)
def test_cli_refuses_bad_backend_and_services(
    store: tuple[Path, str], tmp_path: Path, options: list[str], needle: str
) -> None:
    path, url = store
    before = dump(path)
    opts = [o.replace("{tmp}", str(tmp_path)).replace("{url}", url) for o in options]
    result = CliRunner().invoke(app, [*opts, "pause", "us-east-1"], env=ENV)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert result.stderr.startswith("error: ")
    assert needle in result.stderr
    assert dump(path) == before
    assert not (tmp_path / "x.db").exists()


def test_bad_services_in_the_environment(store: tuple[Path, str]) -> None:
    path, url = store
    before = dump(path)
    env = {**ENV, "LOCSTATUS_SERVICES": "replication,../x"}
    result = CliRunner().invoke(app, ["--backend", url, "status"], env=env)
    assert result.exit_code == 2 and "'../x'" in result.stderr
    assert dump(path) == before


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("us-east-1\n../x\n", "line 2"),
        ("", "no location found"),
        (
            '{"extensions": {"replication": {"destination": {"bootstrapList": [{"site": 1}]}}}}',
            "bootstrapList[0].site",
        ),
        ("{broken", "invalid JSON"),
    ],
    ids=["bad-name", "empty", "bad-site", "bad-json"],
)
def test_locations_sync_refuses_bad_files_before_writing(
    store: tuple[Path, str], tmp_path: Path, content: str, needle: str
) -> None:
    path, url = store
    before = dump(path)
    bad = tmp_path / "sites.txt"
    bad.write_text(content)
    result = CliRunner().invoke(app, ["--backend", url, "locations", "sync", str(bad)], env=ENV)
    assert result.exit_code == 2
    assert str(bad) in result.stderr and needle in result.stderr
    missing = CliRunner().invoke(
        app, ["--backend", url, "locations", "sync", str(tmp_path / "nope.txt")], env=ENV
    )
    assert missing.exit_code == 2 and "nope.txt" in missing.stderr
    assert dump(path) == before


# -- through the library -----------------------------------------------------------------------

PAST = datetime(2020, 1, 1, tzinfo=UTC)
FUTURE_NAIVE = datetime(2030, 1, 1)
LIB_CASES: list[tuple[str, Callable[[Manager], Any], type[LocstatusError], str]] = [
    *[
        (f"pause-name-{i}", (lambda n: lambda m: m.pause(n))(name), InvalidInput, repr(name)[:40])
        for i, name in enumerate(BAD_NAMES)
    ],
    ("pause-none", lambda m: m.pause(None), InvalidInput, "None"),  # type: ignore[arg-type]
    ("pause-int", lambda m: m.pause(42), InvalidInput, "42"),  # type: ignore[arg-type]
    ("resume-name", lambda m: m.resume("../x"), InvalidInput, "'../x'"),
    ("cancel-name", lambda m: m.cancel_scheduled_resume("a/b"), InvalidInput, "'a/b'"),
    ("status-name", lambda m: m.status(".."), InvalidInput, "'..'"),
    ("history-name", lambda m: m.history("a b"), InvalidInput, "'a b'"),
    ("history-limit", lambda m: m.history("us-east-1", limit=0), InvalidInput, "0"),
    ("status-unknown", lambda m: m.status("nowhere"), NotFound, "'nowhere'"),
    ("pause-unknown", lambda m: m.pause("nowhere"), NotFound, "'nowhere'"),
    ("service-path", lambda m: m.pause("us-east-1", "../x"), InvalidInput, "'../x'"),
    ("service-unknown", lambda m: m.pause("us-east-1", "gc"), InvalidInput, "'gc'"),
    ("service-empty-list", lambda m: m.pause("us-east-1", []), InvalidInput, "no service"),
    ("service-in-list", lambda m: m.resume("us-east-1", ["lifecycle", "X"]), InvalidInput, "'X'"),
    ("service-missing-here", lambda m: m.pause("dr-site-a", "lifecycle"), NotFound, "lifecycle"),
    ("at-naive", lambda m: m.resume("us-east-1", at=FUTURE_NAIVE), InvalidInput, "2030-01-01"),
    ("at-past", lambda m: m.resume("us-east-1", at=PAST), InvalidInput, "2020-01-01"),
    (
        "at-string",
        lambda m: m.resume("us-east-1", at="2030-01-01"),  # type: ignore[arg-type]
        InvalidInput,
        "'2030-01-01'",
    ),
    ("delay-zero", lambda m: m.resume("us-east-1", at=timedelta(0)), InvalidInput, "0:00:00"),
    (
        "delay-negative",
        lambda m: m.resume("us-east-1", at=timedelta(hours=-2)),
        InvalidInput,
        "-1 day",
    ),
    (
        "schedule-running",
        lambda m: m.resume("dr-site-a", at=timedelta(hours=1)),
        InvalidTransition,
        "dr-site-a",
    ),
    ("wait-negative", lambda m: m.pause("us-east-1", wait=-1), InvalidInput, "-1"),
    ("wait-nan", lambda m: m.pause("us-east-1", wait=float("nan")), InvalidInput, "nan"),
    ("sync-bad-name", lambda m: m.sync_locations(["new-site", "../x"]), InvalidInput, "'../x'"),
    ("sync-bad-service", lambda m: m.sync_locations({"new-site": ["gc"]}), InvalidInput, "'gc'"),
    ("sync-string", lambda m: m.sync_locations("us-east-1"), InvalidInput, "string"),
    ("add-bad-name", lambda m: m.add_location("a\nb"), InvalidInput, "'a\\nb'"),
    ("remove-bad-name", lambda m: m.remove_location(LONG), InvalidInput, "'xxxx"),
]


@pytest.mark.parametrize(
    ("call", "error", "needle"), [c[1:] for c in LIB_CASES], ids=[c[0] for c in LIB_CASES]
)
def test_library_refuses_bad_input_and_writes_nothing(
    store: tuple[Path, str],
    call: Callable[[Manager], Any],
    error: type[LocstatusError],
    needle: str,
) -> None:
    path, url = store
    before = dump(path)
    with connect(url) as mgr, pytest.raises(error) as err:
        call(mgr)
    assert needle in str(err.value)
    assert dump(path) == before


LIBRARY_REFUSALS: list[tuple[str, Callable[[Manager], Any], str]] = [
    ("reason-too-long", lambda m: m.pause("dr-site-a", reason="r" * 2000), "1024"),
    ("actor-too-long", lambda m: m.pause("dr-site-a", actor="a" * 300), "256"),
    ("reason-not-text", lambda m: m.pause("dr-site-a", reason=5), "reason"),  # type: ignore[arg-type]
    ("delay-overflow", lambda m: m.resume("us-east-1", at=timedelta(days=999_999_999)), "range"),
    # a valid datetime whose UTC time is past year 9999 (or before year 1): OverflowError before
    ("at-past-9999-in-utc", lambda m: m.resume("us-east-1", at=datetime(
        9999, 12, 31, 23, 59, 59, tzinfo=timezone(timedelta(hours=-1)))), "out of range"),
    ("at-before-year-1-in-utc", lambda m: m.resume("us-east-1", at=datetime(
        1, 1, 1, tzinfo=timezone(timedelta(hours=1)))), "out of range"),
    # control characters in free text: refused before any I/O (locstatus.names.check_text)
    ("reason-escape", lambda m: m.pause("dr-site-a", reason="x\x1b]0;t\x07"), "U+001B"),
    ("actor-escape", lambda m: m.resume("us-east-1", actor="ops\x1b[2K"), "actor"),
    ("cancel-actor-del", lambda m: m.cancel_scheduled_resume("us-east-1", actor="a\x7f"),
     "U+007F"),
    ("schedule-reason-c1", lambda m: m.resume("us-east-1", at=timedelta(hours=1),
                                              reason="\x9b2J"), "U+009B"),
    ("sync-actor-tab", lambda m: m.sync_locations(["new-site"], actor="a\tb"), "U+0009"),
    ("remove-actor-nul", lambda m: m.remove_location("dr-site-a", actor="a\x00"), "U+0000"),
    ("reason-bidi", lambda m: m.pause("dr-site-a", reason="x\u202ey"), "U+202E"),
    ("actor-bidi-mark", lambda m: m.resume("us-east-1", actor="ops\u200f"), "U+200F"),
    ("reason-paragraph", lambda m: m.pause("dr-site-a", reason="a\u2029b"), "U+2029"),
]


@pytest.mark.parametrize(
    ("call", "needle"), [c[1:] for c in LIBRARY_REFUSALS], ids=[c[0] for c in LIBRARY_REFUSALS]
)
def test_library_refuses_bad_reason_actor_and_delay(
    tmp_path: Path, call: Callable[[Manager], Any], needle: str
) -> None:
    url = f"sqlite:///{tmp_path}/gaps.db"
    with connect(url) as mgr:
        mgr.sync_locations(load_sample())
        mgr.pause("us-east-1")
    before = dump(tmp_path / "gaps.db")
    with connect(url) as mgr, pytest.raises(InvalidInput) as err:
        call(mgr)
    assert needle in str(err.value)
    assert dump(tmp_path / "gaps.db") == before


BAD_URLS: list[tuple[str, object, str]] = [
    # raised Python's own ValueError / AttributeError before
    ("zk-open-bracket", "zk://[::1/x", "invalid ZooKeeper URL 'zk://[::1/x': Invalid IPv6 URL"),
    ("zk-open-bracket-hint", "zk://[::1/x", "in brackets: [::1]:2181)"),
    ("mongo-open-bracket", "mongodb://[::1:37017/", "invalid MongoDB URL"),
    # the hint gave ZooKeeper's port for every backend
    ("mongo-open-bracket-hint", "mongodb://[::1:37017/", "in brackets: [::1]:27017)"),
    ("sqlite-timeout-nan", "sqlite:///{tmp}/x.db?timeout=nan", "timeout=nan"),
    ("sqlite-timeout-inf", "sqlite:///{tmp}/x.db?timeout=inf", "timeout=inf"),
    ("sqlite-nul-in-path", "sqlite:///{tmp}/x\x00.db", "control character U+0000"),
    ("not-a-string", 5, "must be a string"),
    ("bytes", b"sqlite:///x.db", "must be a string"),
    # accepted before, and then busy-looped a core / killed the hint poller / meant nothing
    ("sqlite-poll-zero", "sqlite:///{tmp}/x.db?poll_interval=0",
     "poll_interval=0 in 'sqlite:///"),
    ("sqlite-poll-huge", "sqlite:///{tmp}/x.db?poll_interval=1e308", "0.01..60 seconds"),
    ("sqlite-timeout-zero", "sqlite:///{tmp}/x.db?timeout=0", "more than 0, at most 3600"),
    ("sqlite-timeout-negative", "sqlite:///{tmp}/x.db?timeout=-1",
     "timeout=-1 in 'sqlite:///"),
    ("zk-timeout-nan", "zk://127.0.0.1:1/x?timeout=nan", "timeout=nan"),
    ("zk-session-inf", "zk://127.0.0.1:1/x?session_timeout=inf", "0.4..3600 seconds"),
    ("zk-max-bytes-float", "zk://127.0.0.1:1/x?max_bytes=1e6", "expected a whole number"),
    ("zk-nul", "zk://127.0.0.1:1/x\x00", "U+0000"),
    ("mongo-poll-zero", "mongodb://127.0.0.1:9/?poll_interval=0", "0.05..60 seconds"),
    ("mongo-poll-huge", "mongodb://127.0.0.1:9/?poll_interval=1e308", "poll_interval=1e308"),
    ("mongo-sst-nan", "mongodb://127.0.0.1:9/?serverSelectionTimeoutMS=nan",
     "serverSelectionTimeoutMS=nan"),
    ("mongo-recent-fraction", "mongodb://127.0.0.1:9/?recent_history=2.5", "recent_history=2.5"),
    ("mongo-ttl-negative", "mongodb://u:hunter2@127.0.0.1:9/?worker_ttl=-1", "worker_ttl=-1"),
    ("memory-nul", "memory://a\x00b", "U+0000"),
]


@pytest.mark.parametrize(("url", "needle"), [c[1:] for c in BAD_URLS], ids=[c[0] for c in BAD_URLS])
def test_a_bad_backend_url_is_a_clear_invalid_input_before_anything_connects(
    tmp_path: Path, url: object, needle: str
) -> None:
    if isinstance(url, str):
        url = url.replace("{tmp}", str(tmp_path))
    started = time.monotonic()
    with pytest.raises(InvalidInput) as err:
        connect(url)  # type: ignore[arg-type]
    assert needle in str(err.value), str(err.value)
    assert "hunter2" not in str(err.value)
    assert time.monotonic() - started < 5  # refused up front, not after a connection attempt
    assert list(tmp_path.iterdir()) == []  # no database file created


def test_the_store_still_reads_back_after_every_case(store: tuple[Path, str]) -> None:
    _, url = store
    with connect(url) as mgr:
        records = mgr.scan()
        assert all(not isinstance(r, LocstatusError) for r in records)
        assert sorted(r.location for r in mgr.statuses()) == sorted(load_sample())
        assert mgr.status("us-east-1").services["lifecycle"].resume_at is not None
