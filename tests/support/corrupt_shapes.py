"""Stored payloads that are not a record locstatus wrote, shared by the backend contract suite,
the read-path tests and the reliability suite's corrupt-record scenario.

Every record locstatus stores carries every field of the record and of each service, ``null``
included (docs/reliability.md, "What a stored record carries"), so each payload here must read
as a :class:`~locstatus.errors.CorruptRecord` naming its location, on every read path, never as
a record completed with defaults (a service without ``state`` read as ``running``: Backbeat's
BB-37).

- :data:`PARTIAL`: JSON objects any backend can hold (MongoDB stores them as documents).
- :data:`DUPLICATE_KEYS`: a key twice in one object; only backends that store JSON text can
  hold them (a MongoDB document is a mapping, its driver cannot write a key twice).
- :data:`DEEP`: nested deeper than a JSON parser recurses (text backends; MongoDB refuses a
  document nested deeper than 100 levels); :data:`NESTED` stays within what MongoDB stores.
"""

from __future__ import annotations

import json

FIELDS = {
    "state": "paused",
    "generation": 1,
    "resume_at": "2030-01-01T00:00:00Z",
    "reason": "maint",
    "actor": "ops",
    "op_id": "op-1",
    "updated_at": "2026-01-01T00:00:00Z",
}
"""A paused service with a scheduled resume, every field given."""


def entry(**changes: object) -> str:
    """The JSON text of a service entry: :data:`FIELDS` with ``changes`` (a value of
    ``...`` leaves that field out)."""
    fields = {k: v for k, v in {**FIELDS, **changes}.items() if v is not ...}
    return json.dumps(fields)


def record(services: str, deleted_at: str = "null") -> str:
    """The JSON text of a payload from the text of its ``services`` object."""
    return f'{{"services": {services}, "deleted_at": {deleted_at}}}'


def compact(text: str) -> str:
    """``text`` as the encoder writes it (no whitespace), key order and repeats kept."""
    return text.replace('": ', '":').replace(", ", ",")


GOOD = record(f'{{"replication": {entry()}}}')
"""A complete payload (it reads, paused with a scheduled resume)."""

PARTIAL: dict[str, str] = {
    "service-without-state": record('{"replication": {}}'),
    "generation-and-reason-only": record('{"replication": {"generation": 1, "reason": "maint"}}'),
    "no-state": record(f'{{"replication": {entry(state=...)}}}'),
    "no-generation": record(f'{{"replication": {entry(generation=...)}}}'),
    "no-resume-at": record(f'{{"replication": {entry(resume_at=...)}}}'),
    "no-updated-at": record(f'{{"replication": {entry(updated_at=...)}}}'),
    "no-deleted-at": f'{{"services": {{"replication": {entry()}}}}}',
    "no-services": '{"deleted_at": null}',
    "crr-beside-empty-replication": record(f'{{"crr": {entry()}, "replication": {{}}}}'),
    "crr-beside-replication": record(
        f'{{"crr": {entry()}, "replication": {entry(state="running", resume_at=None)}}}'
    ),
}

LOOSE: dict[str, str] = {
    "generation-true": record(f'{{"replication": {entry(generation=True)}}}'),
    "generation-string": record(f'{{"replication": {entry(generation="1")}}}'),
    "generation-float": record(f'{{"replication": {entry(generation=1.0)}}}'),
    "updated-at-a-number": record(f'{{"replication": {entry(updated_at=1700000000)}}}'),
    "updated-at-digits": record(f'{{"replication": {entry(updated_at="1700000000")}}}'),
    "updated-at-naive": record(f'{{"replication": {entry(updated_at="2026-01-01T00:00:00")}}}'),
    "deleted-at-zero": record(f'{{"replication": {entry()}}}', "0"),
    "running-with-resume-at": record(f'{{"replication": {entry(state="running")}}}'),
    "resuming-with-resume-at": record(f'{{"replication": {entry(state="resuming")}}}'),
    "reason-a-number": record(f'{{"replication": {entry(reason=5)}}}'),
}
"""Values locstatus never writes that a lax decoder took for others (the hostile review of
issue 15): ``true``, ``"1"`` or ``1.0`` for generation 1, a number for a date (``0``: a 1970
tombstone the check would purge), a scheduled resume on a running service. Any backend holds
them (a MongoDB document as a bool, a float, an int)."""

OUT_OF_RANGE: dict[str, str] = {
    "generation-2-63": record(f'{{"replication": {entry(generation=2**63)}}}'),
    "generation-10-30": record(f'{{"replication": {entry(generation=10**30)}}}'),
}
"""Generations no backend can store as an integer (past a signed 64 bits): text backends only
(MongoDB's driver cannot write them)."""

DUPLICATE_KEYS: dict[str, str] = {
    "state-twice": record(f'{{"replication": {entry()[:-1]}, "state": "running"}}}}'),
    "state-twice-compact": compact(
        record(f'{{"replication": {entry()[:-1]}, "state": "running"}}}}')
    ),
    "state-twice-space-before-colon": compact(
        record(f'{{"replication": {entry()[:-1]}, "state" :"running"}}}}')
    ).replace('"state" :', '"state"   :'),
    "state-twice-escaped": compact(
        record(f'{{"replication": {entry()[:-1]}, "st\\u0061te": "running"}}}}')
    ),
    "resume-at-twice": compact(
        record(f'{{"replication": {entry()[:-1]}, "resume_at": null}}}}')
    ),
    "service-twice": compact(
        record(f'{{"replication": {entry()}, '
               f'"replication": {entry(state="running", resume_at=None)}}}')
    ),
    "deleted-at-twice": compact(
        record(f'{{"replication": {entry()}}}', '"2026-01-02T00:00:00Z", "deleted_at": null')
    ),
    "services-twice": compact(
        record(f'{{"replication": {entry()}}}, "services": {{"lifecycle": {entry()}}}')
    ),
}

DEEP: dict[str, str] = {
    "deep-array": "[" * 100_000 + "]" * 100_000,
    "deep-reason": record(
        '{"replication": {"state": "paused", "reason": ' + "[" * 100_000 + "]" * 100_000 + "}}"
    ),
    "deep-object": record('{"replication": ' + '{"a": ' * 100_000 + "1" + "}" * 100_001),
    "deep-compact": compact(record(f'{{"replication": {entry()[:-1]}, "x": '
                                   + "[" * 100_000 + "]" * 100_000 + "}}")),
}

NESTED: dict[str, str] = {
    "nested-90": record('{"replication": ' + '{"a": ' * 90 + "1" + "}" * 91),
}
