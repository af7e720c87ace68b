"""The records of SPEC §2 as a user of the library builds and reads them: times are aware and
UTC whatever offset they were given in, naive times are refused with a message that says so,
and ``crr`` is read as ``replication`` wherever a service is named in Python input.

The stored-record schema is validated without Python callbacks on its hot path (see
``locstatus/models.py``); these tests pin the behaviour that must not change with that."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from locstatus.backends.codec import decode_record, encode_record
from locstatus.errors import CorruptRecord
from locstatus.models import HistoryEntry, LocationStatus, ServiceStatus, WorkerInfo

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
        "us-east-1", 7, '{"services": {"replication": {"state": "paused", '
        '"resume_at": "2030-01-01T10:00:00+02:00"}}}'
    )
    assert rec.version == 7
    assert rec.services["replication"].resume_at == datetime(2030, 1, 1, 8, tzinfo=UTC)


def test_a_stored_record_with_a_naive_time_is_corrupt_and_named() -> None:
    with pytest.raises(CorruptRecord, match=r"us-east-1.*updated_at"):
        decode_record("us-east-1", 1, '{"services": {"replication": '
                      '{"updated_at": "2030-01-01T10:00:00"}}}')


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
            generation=2, resume_at=datetime(2030, 1, 1, tzinfo=PLUS_TWO), reason="r")},
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
