"""Hypothesis-driven bad input through the library and the CLI, on a real SQLite store.

Where ``tests/test_bad_input.py`` lists known bad values one by one, these properties draw
arbitrary ones (names, services, dates, delays, free text, numbers, wrong types) for every
operation and assert, for each draw:

- the library returns a record or raises a :class:`LocstatusError` (never another exception);
  the CLI exits 0, 1 or 2 (docs/design.md §5.2), prints no traceback, and says why on stderr when it
  refuses;
- a refused call changes nothing in the store; a call that succeeds changes at most the one
  location it names.

Lone surrogates (what Python makes of non-UTF-8 bytes in ``argv``) are left to
``test_product_bugs.py``: the library does not refuse them cleanly today.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

import pytest
from harness import Budget, Row
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from locstatus import LocstatusError, Manager, connect
from locstatus.cli import app

LOCATIONS = ["us-east-1", "eu-west-2", "dr-site-a"]
EXAMPLES = Budget.from_env().examples()
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=False,
                    suppress_health_check=list(HealthCheck))

# printable and control characters, no lone surrogates (see the module docstring), no NUL for
# argv (a real command line cannot carry one)
TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=300)
ARG_TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"),
                   max_size=200)
NAMES: st.SearchStrategy[Any] = st.one_of(st.sampled_from([*LOCATIONS, "nowhere", "all", "..", "a/b"]), TEXT)
SERVICES: st.SearchStrategy[Any] = st.one_of(
    st.none(), st.sampled_from(["replication", "lifecycle", "ingestion", "crr", "gc", ""]),
    TEXT, st.lists(st.one_of(st.sampled_from(["replication", "crr", "x"]), TEXT), max_size=3),
)
"""Typed service arguments (a non-string service is ``test_product_bugs.py``'s)."""
FREE: st.SearchStrategy[Any] = st.one_of(st.none(), TEXT, st.integers(), st.floats())
WHEN: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.datetimes(timezones=st.one_of(st.none(), st.just(UTC))),
    st.timedeltas(min_value=timedelta(days=-3), max_value=timedelta(days=3000)),
    st.floats(), TEXT,
)


def rows(db: Path) -> dict[str, tuple[int, str]]:
    con = sqlite3.connect(db)
    try:
        return {loc: (v, d) for loc, v, d in con.execute(
            "SELECT location, version, data FROM locations")}
    finally:
        con.close()


def history_count(db: Path) -> int:
    con = sqlite3.connect(db)
    try:
        return int(con.execute("SELECT COUNT(*) FROM history").fetchone()[0])
    finally:
        con.close()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    db = tmp_path_factory.mktemp("hostile") / "locstatus.db"
    url = f"sqlite:///{db}"
    with connect(url) as mgr:
        mgr.sync_locations({"us-east-1": ["replication", "lifecycle", "ingestion"],
                            "eu-west-2": ["replication", "lifecycle"],
                            "dr-site-a": ["replication"]})
        mgr.pause("eu-west-2", reason="maintenance", actor="ops")
    yield db, url


def _changed_only(before: dict[str, tuple[int, str]], after: dict[str, tuple[int, str]],
                  target: object) -> bool:
    if target == "all":  # the bulk location: every location may change
        return set(after) == set(before)
    return all(after.get(k) == v for k, v in before.items() if k != target) and set(after) == set(before)


CALLS: dict[str, Callable[[Manager, st.DataObject, Any], Any]] = {
    "pause": lambda m, d, loc: m.pause(loc, d.draw(SERVICES), reason=d.draw(FREE),
                                       actor=d.draw(FREE), wait=d.draw(st.one_of(
                                           st.none(), st.floats(max_value=1.0)))),
    "resume": lambda m, d, loc: m.resume(loc, d.draw(SERVICES), at=d.draw(WHEN),
                                         reason=d.draw(FREE), actor=d.draw(FREE)),
    "cancel": lambda m, d, loc: m.cancel_scheduled_resume(loc, d.draw(SERVICES),
                                                          actor=d.draw(FREE)),
    "status": lambda m, d, loc: m.status(loc),
    "history": lambda m, d, loc: m.history(loc, d.draw(st.integers(-5, 20_000))),
    "if_version": lambda m, d, loc: m.pause(loc, if_version=d.draw(st.integers(-2, 10**20))),
    "op_id": lambda m, d, loc: m.resume(loc, op_id=d.draw(st.one_of(TEXT, st.integers()))),  # type: ignore[arg-type]
}


def test_library_refuses_arbitrary_input_cleanly(store: tuple[Path, str], row: Row) -> None:
    db, url = store
    mgr = connect(url)
    counts = {"calls": 0, "refused": 0}

    @SETTINGS
    @given(data=st.data(), call=st.sampled_from(sorted(CALLS)), location=NAMES)
    def prop(data: st.DataObject, call: str, location: Any) -> None:
        before, hist = rows(db), history_count(db)
        counts["calls"] += 1
        try:
            CALLS[call](mgr, data, location)
        except LocstatusError as exc:
            counts["refused"] += 1
            assert str(exc), "an error with no message"
            assert rows(db) == before and history_count(db) == hist, f"refused {call} wrote"
            return
        assert _changed_only(before, rows(db), location)

    try:
        prop()
    finally:
        mgr.close()
        _note(row, "library", counts)
    row.status = "ok"


CLI_COMMANDS = ["pause", "resume", "cancel-schedule", "status", "history"]
CLI_OPTIONS = ["--service", "--reason", "--actor", "--at", "--in", "--wait", "--limit", "--json"]


@st.composite
def cli_args(draw: st.DrawFn) -> list[str]:
    cmd = draw(st.sampled_from(CLI_COMMANDS))
    loc = draw(st.one_of(st.sampled_from([*LOCATIONS, "nowhere", "all"]), ARG_TEXT))
    args = [cmd]
    for opt in draw(st.lists(st.sampled_from(CLI_OPTIONS), max_size=3)):
        args.append(opt)
        if opt != "--json":
            args.append(draw(st.one_of(
                ARG_TEXT, st.sampled_from(["2h", "0s", "-1", "nan", "2030-01-01T00:00:00Z",
                                           "replication", "crr", "5"]))))
    return [*args, "--", loc]


def test_cli_refuses_arbitrary_input_cleanly(store: tuple[Path, str], row: Row) -> None:
    db, url = store
    runner = CliRunner()
    env = {"LOCSTATUS_BACKEND": None, "LOCSTATUS_SERVICES": None, "COLUMNS": "200"}
    counts = {"calls": 0, "refused": 0}

    @SETTINGS
    @given(args=cli_args())
    def prop(args: list[str]) -> None:
        before, hist = rows(db), history_count(db)
        counts["calls"] += 1
        result = runner.invoke(app, ["--backend", url, *args], env=env)
        out = result.stdout + result.stderr
        assert result.exit_code in (0, 1, 2), (args, result.exit_code, out[-2000:], result.exception)
        assert "Traceback" not in out, out[-3000:]
        if result.exit_code != 0:
            counts["refused"] += 1
            assert result.stderr.strip(), f"{args}: refused without saying why"
            assert "unexpected" not in result.stderr, result.stderr
            assert rows(db) == before and history_count(db) == hist, f"refused {args} wrote"
        else:
            assert _changed_only(before, rows(db), args[-1])

    try:
        prop()
    finally:
        _note(row, "cli", counts)
    row.status = "ok"


def _note(row: Row, what: str, counts: dict[str, int]) -> None:
    row.scenario = f"hypothesis: bad {what} input"
    row.backend = "sqlite"
    row.ops = counts["calls"]
    row.faults = counts["refused"]
    row.fault_kinds = {"refused_input": counts["refused"]}
    row.notes = f"{counts['calls']} calls, {counts['refused']} refused, store unchanged by each"
