"""The pure state machine (docs/design.md §3): the table, properties over random event sequences, and the
generated docs that must not drift from it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from locstatus.errors import InvalidInput, InvalidTransition
from locstatus.fsm import Event, transition
from locstatus.fsm import table as fsm_table
from locstatus.fsm.diagram import docs, markdown_table, mermaid
from locstatus.models import HistoryEntry, ServiceStatus, State

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
LATER = NOW + timedelta(hours=2)
ROOT = Path(__file__).resolve().parent.parent
INT64_MAX = 2**63 - 1
"""The largest integer every backend stores (locstatus.models.MAX_STORED_INT)."""


def apply(status: ServiceStatus, event: Event, now: datetime = NOW) -> ServiceStatus | None:
    change = transition("loc", "replication", status, event, now=now, op_id="op")
    return None if change is None else change.status


def s(state: State, generation: int = 1, resume_at: datetime | None = None) -> ServiceStatus:
    return ServiceStatus(state=state, generation=generation, resume_at=resume_at)


# -- the table, row by row ---------------------------------------------------------------------


@pytest.mark.parametrize("start", [State.RUNNING, State.RESUMING])
def test_pause_of_an_active_service_starts_pausing_and_bumps_the_generation(start: State) -> None:
    new = apply(s(start, 4), Event("pause", reason="maintenance", actor="ops"))
    assert new is not None
    assert (new.state, new.generation, new.resume_at) == (State.PAUSING, 5, None)
    assert (new.reason, new.actor, new.op_id, new.updated_at) == ("maintenance", "ops", "op", NOW)


@pytest.mark.parametrize(
    ("start", "event"), [(State.RUNNING, "pause"), (State.PAUSED, "resume")]
)
def test_a_flip_past_the_largest_stored_generation_is_refused(start: State, event: str) -> None:
    """A generation past a signed 64-bit integer cannot be stored nor acknowledged (SQLite
    raised OverflowError): the flip is refused, nothing is written; below it, it flips."""
    with pytest.raises(InvalidTransition, match="largest a backend stores"):
        apply(s(start, INT64_MAX), Event(event))
    new = apply(s(start, INT64_MAX - 1), Event(event))
    assert new is not None and new.generation == INT64_MAX


@pytest.mark.parametrize("start", [State.PAUSING, State.PAUSED])
def test_pause_of_a_paused_service_is_a_noop_unless_it_cancels_a_schedule(start: State) -> None:
    assert apply(s(start), Event("pause")) is None
    new = apply(s(start, 1, LATER), Event("pause"))
    assert new is not None and new.state is start and new.resume_at is None and new.generation == 1


@pytest.mark.parametrize("start", [State.PAUSED, State.PAUSING])
def test_resume_of_a_paused_service_starts_resuming_and_clears_the_schedule(start: State) -> None:
    new = apply(s(start, 2, LATER), Event("resume"))
    assert new is not None and (new.state, new.generation, new.resume_at) == (State.RESUMING, 3, None)


@pytest.mark.parametrize("start", [State.RUNNING, State.RESUMING])
def test_resume_of_an_active_service_is_a_noop(start: State) -> None:
    assert apply(s(start), Event("resume")) is None


@pytest.mark.parametrize("start", [State.PAUSED, State.PAUSING])
def test_schedule_resume_sets_and_replaces_the_time(start: State) -> None:
    new = apply(s(start), Event("schedule_resume", at=LATER))
    assert new is not None and new.state is start and new.resume_at == LATER and new.generation == 1
    replaced = apply(new, Event("schedule_resume", at=LATER + timedelta(hours=1)))
    assert replaced is not None and replaced.resume_at == LATER + timedelta(hours=1)
    assert apply(replaced, Event("schedule_resume", at=LATER + timedelta(hours=1))) is None


@pytest.mark.parametrize("start", [State.RUNNING, State.RESUMING])
def test_schedule_resume_of_an_active_service_is_refused(start: State) -> None:
    with pytest.raises(InvalidTransition, match=start.value):
        apply(s(start), Event("schedule_resume", at=LATER))


@pytest.mark.parametrize("when", [NOW, NOW - timedelta(seconds=1)])
def test_schedule_resume_in_the_past_is_bad_input(when: datetime) -> None:
    with pytest.raises(InvalidInput, match="not in the future"):
        apply(s(State.PAUSED), Event("schedule_resume", at=when))


def test_cancel_scheduled_resume_clears_it_and_is_a_noop_without_one() -> None:
    new = apply(s(State.PAUSED, 1, LATER), Event("cancel_scheduled_resume"))
    assert new is not None and new.resume_at is None and new.state is State.PAUSED
    for state in State:
        assert apply(s(state), Event("cancel_scheduled_resume")) is None


def test_resume_due_fires_only_when_due_and_still_the_expected_schedule() -> None:
    paused = s(State.PAUSED, 3, LATER)
    assert apply(paused, Event("resume_due", at=LATER), now=NOW) is None  # not due yet
    fired = apply(paused, Event("resume_due", at=LATER), now=LATER)
    assert fired is not None and (fired.state, fired.generation, fired.resume_at) == (
        State.RESUMING, 4, None,
    )
    other = LATER + timedelta(minutes=5)
    assert apply(paused, Event("resume_due", at=other), now=other) is None  # rescheduled since
    assert apply(fired, Event("resume_due", at=LATER), now=LATER) is None  # already fired


def test_settle_needs_the_current_generation_and_every_ack() -> None:
    pausing = s(State.PAUSING, 7)
    assert apply(pausing, Event("settle", generation=6, acked=True)) is None
    assert apply(pausing, Event("settle", generation=7, acked=False)) is None
    settled = apply(pausing, Event("settle", generation=7, acked=True))
    assert settled is not None and settled.state is State.PAUSED and settled.generation == 7
    running = apply(s(State.RESUMING, 8), Event("settle", generation=8, acked=True))
    assert running is not None and running.state is State.RUNNING
    for state in (State.RUNNING, State.PAUSED):
        assert apply(s(state, 8), Event("settle", generation=8, acked=True)) is None


def test_history_entry_describes_the_change() -> None:
    change = transition(
        "us-east-1", "replication", s(State.RUNNING, 0), Event("pause", reason="r", actor="a"),
        now=NOW, op_id="op-42",
    )
    assert change is not None
    e = change.entry
    assert (e.op_id, e.location, e.service, e.event) == ("op-42", "us-east-1", "replication", "pause")
    assert (e.from_state, e.to_state, e.generation, e.actor, e.reason) == (
        State.RUNNING, State.PAUSING, 1, "a", "r",
    )


def test_unknown_event_is_bad_input() -> None:
    with pytest.raises(InvalidInput, match="explode"):
        apply(s(State.RUNNING), Event("explode"))


# -- properties over random sequences ------------------------------------------------------------

TABLE_MOVES = {
    (t["trigger"], src, t["dest"])
    for t in fsm_table.TRANSITIONS
    for src in (t["source"] if isinstance(t["source"], list) else [t["source"]])
}

events = st.one_of(
    st.builds(lambda: Event("pause")),
    st.builds(lambda: Event("resume")),
    st.builds(lambda: Event("cancel_scheduled_resume")),
    st.integers(1, 10).map(lambda m: ("schedule", m)),
    st.just(("due",)),
    st.tuples(st.just("settle"), st.integers(-1, 1), st.booleans()),
    st.integers(1, 20).map(lambda m: ("tick", m)),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(events, min_size=1, max_size=60))
def test_random_event_sequences_respect_the_table(seq: list[object]) -> None:
    status = ServiceStatus()
    now = NOW
    fired_schedules: set[datetime] = set()
    for item in seq:
        if isinstance(item, tuple) and item[0] == "tick":
            now += timedelta(minutes=int(item[1]))
            continue
        if isinstance(item, Event):
            event = item
        elif item[0] == "schedule":  # type: ignore[index]
            event = Event("schedule_resume", at=now + timedelta(minutes=int(item[1])))  # type: ignore[index]
        elif item[0] == "due":  # type: ignore[index]
            event = Event("resume_due", at=status.resume_at)
        else:
            _, delta, acked = item  # type: ignore[misc]
            event = Event("settle", generation=status.generation + delta, acked=acked)
        try:
            change = transition("loc", "replication", status, event, now=now, op_id="op")
        except InvalidTransition:
            assert (event.name, status.state.value) in {
                (e, st_) for e, sts in fsm_table.REFUSED.items() for st_ in sts
            }
            continue
        if change is None:
            continue  # idempotent: nothing to write
        new = change.status
        # generation never decreases, and moves by at most one
        assert new.generation - status.generation in (0, 1)
        # only transitions of the table happen
        dest = None if new.state is status.state else new.state.value
        assert (event.name, status.state.value, dest) in TABLE_MOVES
        # an applied event always changes something
        assert new.model_dump(exclude={"op_id", "updated_at"}) != status.model_dump(
            exclude={"op_id", "updated_at"}
        ) or dest is not None
        # resume_at only while paused / pausing
        assert new.resume_at is None or new.state.desired_paused
        # settle needs the current generation and every ack
        if event.name == "settle":
            assert event.generation == status.generation and event.acked
        # a scheduled resume fires at most once
        if event.name == "resume_due":
            assert event.at is not None and event.at not in fired_schedules and event.at <= now
            fired_schedules.add(event.at)
        # the history entry records exactly this change
        assert (change.entry.from_state, change.entry.to_state) == (status.state, new.state)
        assert change.entry.generation == new.generation
        # built without validation from validated parts: exactly what validation builds
        assert change.entry == HistoryEntry.model_validate(change.entry.model_dump())
        assert change.entry.model_dump_json() == HistoryEntry.model_validate_json(
            change.entry.model_dump_json()
        ).model_dump_json()
        assert new == ServiceStatus.model_validate(new.model_dump())
        status = new


names = st.sampled_from([None, "alice", "bob", "scheduler"])
notes = st.sampled_from([None, "INC-1", "INC-2", "scheduled resume"])
signed = st.tuples(
    st.sampled_from(
        ["pause", "resume", "schedule_resume", "cancel_scheduled_resume", "resume_due", "settle"]
    ),
    names,
    notes,
    st.integers(1, 30),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(signed, min_size=1, max_size=40))
def test_a_history_entry_names_only_its_own_actor_and_reason(seq: list[tuple]) -> None:  # type: ignore[type-arg]
    """Issue 15: whatever came before, an entry's actor and reason are those of its own event
    (None when it gave none), while the status keeps one pair: that of the last event that gave
    either (a pause or resume always does)."""
    status = ServiceStatus()
    now = NOW
    desired: tuple[str | None, str | None] = (None, None)
    for name, actor, reason, minutes in seq:
        now += timedelta(minutes=minutes)
        at = {
            "schedule_resume": now + timedelta(minutes=minutes),
            "resume_due": status.resume_at,
        }.get(name)
        event = Event(name, at=at, generation=status.generation, acked=True, actor=actor,
                      reason=reason)
        if name == "resume_due" and status.resume_at is not None:
            now = max(now, status.resume_at)
        try:
            change = transition("loc", "replication", status, event, now=now, op_id="op")
        except InvalidTransition:
            continue
        if change is None:
            continue
        assert (change.entry.actor, change.entry.reason) == (actor, reason)
        if name in ("pause", "resume") or actor is not None or reason is not None:
            desired = (actor, reason)  # one pair: never a reason beside who did not give it
        assert (change.status.actor, change.status.reason) == desired
        status = change.status


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(list(State)), st.integers(0, 50))
def test_idempotent_events_write_nothing_when_repeated(state: State, gen: int) -> None:
    status = s(state, gen)
    for name in ("pause", "resume", "cancel_scheduled_resume"):
        first = transition("l", "replication", status, Event(name), now=NOW, op_id="a")
        after = first.status if first else status
        assert transition("l", "replication", after, Event(name), now=NOW, op_id="b") is None


# -- docs generated from the same definition ----------------------------------------------------


def test_docs_fsm_md_is_generated_from_the_table() -> None:
    assert (ROOT / "docs" / "fsm.md").read_text() == docs(), (
        "docs/fsm.md drifted: run `python -m locstatus.fsm.diagram > docs/fsm.md`"
    )


def test_readme_shows_the_generated_diagram_and_table() -> None:
    readme = (ROOT / "README.md").read_text()
    assert mermaid() in readme, "README's Mermaid diagram drifted from locstatus/fsm/table.py"
    assert markdown_table() in readme, "README's transition table drifted"


def test_mermaid_has_every_state_and_event() -> None:
    source = mermaid()
    for state in fsm_table.STATES:
        assert f'state "{state}"' in source
    for event in fsm_table.EVENTS:
        assert event in source
