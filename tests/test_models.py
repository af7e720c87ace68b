"""The records of docs/design.md §2 as a user of the library builds and reads them: times are aware and
UTC whatever offset they were given in, naive times are refused with a message that says so,
and ``crr`` is read as ``replication`` wherever a service is named in Python input.

The stored-record schema is validated without Python callbacks on its hot path (see
``locstatus/models.py``); these tests pin the behaviour that must not change with that."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from locstatus.backends.codec import decode_record, encode_record
from locstatus.clock import CallerClock
from locstatus.errors import CorruptRecord
from locstatus.fsm.machine import Event, transition
from locstatus.models import (
    HistoryEntry,
    LocationStatus,
    ServiceStatus,
    State,
    WorkerInfo,
    copy_with,
    with_version,
)

from support import corrupt_shapes as shapes

PLUS_TWO = timezone(timedelta(hours=2))


def test_an_offset_time_is_stored_as_the_same_instant_in_utc() -> None:
    local = datetime(2030, 1, 1, 10, 0, tzinfo=PLUS_TWO)
    st = ServiceStatus(resume_at=local, updated_at=local)
    assert st.resume_at == local
    assert st.resume_at is not None and st.resume_at.utcoffset() == timedelta(0)
    assert st.resume_at.hour == 8
    assert '"resume_at":"2030-01-01T08:00:00Z"' in st.model_dump_json()


def test_json_input_with_an_offset_is_converted_and_z_is_kept() -> None:
    st = ServiceStatus.model_validate_json('{"resume_at": "2030-01-01T10:00:00+02:00"}')
    assert st.resume_at == datetime(2030, 1, 1, 8, 0, tzinfo=UTC)
    assert st.resume_at is not None and st.resume_at.utcoffset() == timedelta(0)
    z = ServiceStatus.model_validate_json('{"resume_at": "2030-01-01T08:00:00Z"}')
    assert z == st


@pytest.mark.parametrize(
    "value", ["2030-01-01T10:00:00", "not a time", datetime(2030, 1, 1, 10, 0)]
)
def test_a_naive_or_malformed_time_is_refused_with_a_clear_message(value: object) -> None:
    with pytest.raises(ValidationError, match="timezone-aware date and time"):
        ServiceStatus.model_validate({"updated_at": value})


def test_a_stored_record_with_an_offset_time_is_read_in_utc() -> None:
    """A record edited by hand with a local offset is read as the same instant in UTC."""
    rec = decode_record(
        "us-east-1", 7, shapes.record(
            f'{{"replication": {shapes.entry(resume_at="2030-01-01T10:00:00+02:00")}}}')
    )
    assert rec.version == 7
    assert rec.services["replication"].resume_at == datetime(2030, 1, 1, 8, tzinfo=UTC)


def test_a_stored_record_with_a_naive_time_is_corrupt_and_named() -> None:
    with pytest.raises(CorruptRecord, match=r"us-east-1.*updated_at"):
        decode_record("us-east-1", 1, shapes.record(
            f'{{"replication": {shapes.entry(updated_at="2030-01-01T10:00:00")}}}'))


@pytest.mark.parametrize("when", ["9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00+01:00"])
def test_a_stored_time_with_no_utc_equivalent_is_corrupt_not_an_overflow(when: str) -> None:
    """A valid datetime whose UTC time is past year 9999 (or before year 1): converting it
    raised OverflowError out of every read path."""
    with pytest.raises(CorruptRecord, match=r"us-east-1.*resume_at"):
        decode_record("us-east-1", 1, '{"services": {"replication": {"state": "paused", '
                      f'"resume_at": "{when}"}}}}}}')
    with pytest.raises(ValidationError, match="resume_at"):
        ServiceStatus(resume_at=datetime.fromisoformat(when))


def test_records_round_trip_through_their_stored_form() -> None:
    rec = LocationStatus(
        location="us-east-1",
        version=3,
        services={"replication": ServiceStatus(
            state=State.PAUSED, generation=2, resume_at=datetime(2030, 1, 1, tzinfo=PLUS_TWO),
            reason="r")},
        deleted_at=datetime(2030, 1, 2, tzinfo=UTC),
    )
    assert decode_record("us-east-1", 3, encode_record(rec)) == rec


def test_crr_names_replication_in_python_input() -> None:
    rec = LocationStatus(location="us-east-1", services={"crr": ServiceStatus()})
    assert list(rec.services) == ["replication"]
    w = WorkerInfo(worker_id="w-1", services=["crr", "lifecycle"])
    assert w.services == ("replication", "lifecycle")


def test_worker_ids_follow_the_location_rules() -> None:
    with pytest.raises(ValidationError, match="reserved"):
        WorkerInfo(worker_id="all", services=("replication",))
    with pytest.raises(ValidationError, match="worker_id"):
        WorkerInfo(worker_id="../etc", services=("replication",))
    assert WorkerInfo.model_validate_json(
        '{"worker_id": "w-1", "services": ["replication"]}').worker_id == "w-1"


def test_history_entries_hold_utc_times() -> None:
    e = HistoryEntry(op_id="o", at=datetime(2030, 1, 1, 1, tzinfo=PLUS_TWO),
                     location="us-east-1", service="*", event="create")
    assert e.at == datetime(2029, 12, 31, 23, tzinfo=UTC)
    assert e.at.utcoffset() == timedelta(0)
    with pytest.raises(ValidationError, match="timezone-aware"):
        HistoryEntry.model_validate_json(
            '{"op_id": "o", "at": "2030-01-01T01:00:00", "location": "x", '
            '"service": "*", "event": "create"}')


def test_an_invalid_location_or_service_name_is_refused() -> None:
    with pytest.raises(ValidationError, match="location"):
        LocationStatus(location="../x", services={})
    with pytest.raises(ValidationError, match="services"):
        LocationStatus.model_validate_json(
            '{"location": "x", "services": {"Bad Name": {}}}')


# -- only what was written is read ------------------------------------------------------------

_TEXT = st.text(st.sampled_from('ab :,"\\{}[]é\u2028\n\t'), max_size=12)
_TIME = st.none() | st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)
_STATUS = st.sampled_from(State).flatmap(
    lambda state: st.builds(
        ServiceStatus,
        state=st.just(state),
        generation=st.integers(0, 2**40),
        # what locstatus writes: a scheduled resume only while pausing or paused
        resume_at=_TIME if state.desired_paused else st.none(),
        reason=st.none() | _TEXT,
        actor=st.none() | _TEXT,
        op_id=st.none() | st.text("0123456789abcdef:", max_size=32),
        updated_at=_TIME,
    )
)
_RECORD = st.builds(
    LocationStatus,
    location=st.just("us-east-1"),
    version=st.integers(1, 2**50),
    services=st.dictionaries(st.sampled_from(["replication", "lifecycle", "ingestion"]), _STATUS),
    deleted_at=_TIME,
)


def _objects(value: object, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The paths of every JSON object in ``value`` (a parsed payload)."""
    if not isinstance(value, dict):
        return []
    return [path] + [p for k, v in value.items() for p in _objects(v, (*path, k))]


_SEPARATORS = [(":", ","), (": ", ", "), (" :", ","), ("\n:\t", ",\r\n")]
"""How a payload may be spaced: compact (the encoder), as ``json.dumps`` does, and with
whitespace before the colon (which hides a key from a count of ``":``)."""


def _dump(value: object, spaced: int, repeat: tuple[tuple[str, ...], int, int] | None,
          path: tuple[str, ...] = ()) -> str:
    """``value`` as JSON text, spaced as ``_SEPARATORS[spaced]``, with the ``repeat[1]``-th key
    of the object at ``repeat[0]`` written a second time (with its value), last, spaced as
    ``_SEPARATORS[repeat[2]]``."""
    if not isinstance(value, dict):
        return json.dumps(value)
    colon, comma = _SEPARATORS[spaced]
    pairs = [(json.dumps(k) + colon, _dump(v, spaced, repeat, (*path, k)))
             for k, v in value.items()]
    if repeat is not None and repeat[0] == path and pairs:
        key, text = pairs[repeat[1] % len(pairs)]
        pairs.append((key.rstrip(colon) + _SEPARATORS[repeat[2]][0], text))
    return "{" + comma.join(k + v for k, v in pairs) + "}"


@settings(max_examples=300, deadline=None)
@given(rec=_RECORD, spaced=st.integers(0, len(_SEPARATORS) - 1), data=st.data())
def test_a_stored_record_reads_back_as_written_and_a_key_twice_never_does(
    rec: LocationStatus, spaced: int, data: st.DataObject
) -> None:
    """The encoder's text reads back as the record, and so does the same payload spaced out;
    with any one key of any object written twice (same value: the parser would not even see a
    difference) it is a corrupt record naming the key, on the fast path and the slow one."""
    text = encode_record(rec)
    assert decode_record(rec.location, rec.version, text) == rec
    parsed = json.loads(text)
    assert decode_record(rec.location, rec.version, _dump(parsed, spaced, None)) == rec
    where = data.draw(st.sampled_from(_objects(parsed)))
    twice = _dump(parsed, spaced, (where, data.draw(st.integers(0, 10)),
                                   data.draw(st.integers(0, len(_SEPARATORS) - 1))))
    if twice == _dump(parsed, spaced, None):
        return  # an empty object: no key to repeat
    with pytest.raises(CorruptRecord, match="appears twice"):
        decode_record(rec.location, rec.version, twice)


@pytest.mark.parametrize("field", sorted(ServiceStatus.model_fields))
def test_a_stored_service_without_one_of_its_fields_is_corrupt_naming_it(field: str) -> None:
    """Every field is written (nulls included), so one that is missing was not written by
    locstatus: corrupt, naming the field, never completed with its default."""
    with pytest.raises(CorruptRecord, match=rf"services\.replication\.{field}: Field required"):
        decode_record("us-east-1", 3, shapes.record(
            f'{{"replication": {shapes.entry(**{field: ...})}}}'))
    with pytest.raises(CorruptRecord, match="deleted_at: Field required"):
        decode_record("us-east-1", 3, f'{{"services": {{"replication": {shapes.entry()}}}}}')


def test_python_input_keeps_its_defaults() -> None:
    """Only stored records must be complete: values built in Python may leave fields out."""
    assert ServiceStatus().state is State.RUNNING
    assert LocationStatus(location="x", services={"replication": {}}).deleted_at is None
    with pytest.raises(ValidationError, match="name the same service"):
        LocationStatus(location="x", services={"crr": ServiceStatus(),
                                                "replication": ServiceStatus()})


# -- "a resume is due" and "is transitional": decided here, once (docs/time.md) ------------------

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


class _Uncertain(CallerClock):
    """The backend's time is ``T0 + elapsed``, known to within ``uncertainty`` seconds."""

    def __init__(self, elapsed: float, uncertainty: float) -> None:
        super().__init__(lambda: T0 + timedelta(seconds=elapsed))
        self.uncertainty = uncertainty

    def uncertainty_seconds(self) -> float:
        return self.uncertainty


@settings(max_examples=200, deadline=None)
@given(
    state=st.sampled_from(list(State)),
    offset=st.one_of(st.none(), st.integers(-7200, 7200)),
)
def test_a_resume_is_scheduled_exactly_where_the_fsm_would_fire_it(
    state: State, offset: int | None
) -> None:
    """``scheduled_resume`` is set exactly when the FSM's guarded ``resume_due`` event, given
    the resume time read, makes a transition once that time has come: a ``resume_at`` on a
    running or resuming service (a hand edit) is no scheduled resume."""
    at = None if offset is None else T0 + timedelta(seconds=offset)
    status = ServiceStatus(state=state, generation=1, resume_at=at)
    fired = at is not None and transition(
        "us-east-1", "replication", status, Event("resume_due", at=at),
        now=max(at, T0), op_id="0" * 32,
    ) is not None
    assert (status.scheduled_resume is not None) is fired
    assert status.scheduled_resume == (at if fired else None)


@settings(max_examples=200, deadline=None)
@given(
    state=st.sampled_from(list(State)),
    offset=st.one_of(st.none(), st.integers(-10_000, 10_000)),
    uncertainty=st.integers(0, 5_000),
)
def test_a_resume_is_due_only_beyond_doubt_and_overdue_on_the_estimate(
    state: State, offset: int | None, uncertainty: int
) -> None:
    """``resume_due`` (acting) holds only when the resume time passed even at the worst end of
    the time source's bound; ``resume_overdue`` (reporting) compares with the estimate alone.
    Neither holds without a scheduled resume. (Milliseconds, so the bounds are exact.)"""
    at = None if offset is None else T0 + timedelta(milliseconds=offset)
    status = ServiceStatus(state=state, resume_at=at)
    due = status.resume_due(_Uncertain(0.0, uncertainty / 1000))
    overdue = status.resume_overdue(T0)
    if status.scheduled_resume is None:
        assert not due and not overdue
        return
    assert offset is not None
    assert due is (offset + uncertainty <= 0)
    assert overdue is (offset <= 0)
    assert overdue or not due  # what is due to fire is always reported overdue


def test_nothing_is_due_while_the_time_source_refuses() -> None:
    class Refusing(CallerClock):
        asked = 0

        def is_past(self, deadline: datetime) -> bool:
            self.asked += 1
            return False  # docs/time.md "When the bound cannot be met"

    source = Refusing(lambda: T0)
    status = ServiceStatus(state=State.PAUSED, resume_at=T0 - timedelta(hours=1))
    assert not status.resume_due(source) and source.asked == 1
    assert status.resume_overdue(T0)  # still reported


def test_transitional_and_desired_paused_states() -> None:
    assert {s for s in State if s.transitional} == {State.PAUSING, State.RESUMING}
    assert {s for s in State if s.desired_paused} == {State.PAUSING, State.PAUSED}
    assert [ServiceStatus(state=s).paused for s in State] == [s.desired_paused for s in State]


@settings(max_examples=200, deadline=None)
@given(rec=_RECORD, version=st.integers(0, 2**50), data=st.data())
def test_copy_with_is_model_copy(rec: LocationStatus, version: int, data: st.DataObject) -> None:
    # the hot path's copy (locstatus.models.copy_with) is model_copy(update=) without its cost
    services = data.draw(st.dictionaries(st.sampled_from(["replication", "lifecycle"]), _STATUS))
    update = data.draw(st.sampled_from([{}, {"version": version}, {"services": services},
                                        {"services": services, "version": version}]))
    copied, expected = copy_with(rec, update), rec.model_copy(update=update)
    assert copied == expected
    assert copied.model_dump_json() == expected.model_dump_json()
    assert copied.model_fields_set == expected.model_fields_set
    assert encode_record(copied) == encode_record(expected)
    assert copied is not rec and rec == rec.model_copy()  # the original is left as it was
    at = with_version(rec, version)
    assert at == rec.model_copy(update={"version": version})
    assert (at is rec) == (rec.version == version)
