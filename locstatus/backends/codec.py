"""How records, history and workers are turned into stored bytes and back, for every backend.

A stored record holds ``{"services": ..., "deleted_at": ...}``; the location and version live in
the backend's own key and version (column, ``_id``, znode path and stat), so they cannot
disagree with the payload. Decoding validates with pydantic and turns any failure into
:class:`CorruptRecord` naming the location, so one bad record never hides the others. Only what
was written is read: a stored record carries every field (the encoder writes them all), so one
that leaves a field out, or says one twice, is corrupt rather than completed with defaults
(docs/reliability.md, "What a stored record carries").

Every record is written with its stored format, ``"format": FORMAT`` first (:data:`FORMAT`). A
record without it was written before formats were numbered and is format 1; one in a newer
format than :data:`FORMAT` is refused with :class:`NewerFormat`, never read as an older one
(docs/versioning.md, "Stored format"). Records are migrated on write: the next change of a
location writes it in this version's format.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic_core import to_json

from locstatus.errors import CorruptRecord, InvalidInput, NewerFormat, StandingRegistered
from locstatus.models import (
    MAX_STORED_INT,
    STORED_RECORD,
    HistoryEntry,
    LocationStatus,
    ServiceStatus,
    UTCDateTime,
    WorkerInfo,
    copy_with,
)
from locstatus.names import LOCATION_RE, SERVICE_ALIASES

_HISTORY_LIST = TypeAdapter(list[HistoryEntry])
_VALIDATE_HISTORY = _HISTORY_LIST.validator.validate_json  # no Python frame per call


FORMAT = 1
"""The stored format of a record this version writes, and the newest it reads. Raise it with
any change of what a record stores, with the reader of the older formats kept
(docs/versioning.md, "Stored format")."""

_FORMAT_PREFIX = f'{{"format":{FORMAT},'
"""How :func:`encode_record`'s text starts: the decoder's fast path strips exactly this."""


def record_payload(record: LocationStatus) -> dict[str, Any]:
    """The JSON-able payload of a record (without location and version), its ``format``
    first."""
    return {"format": FORMAT, **record.model_dump(mode="json", include={"services", "deleted_at"})}


def encode_record(record: LocationStatus) -> str:
    """The stored JSON text of a record (without location and version), its ``format``
    first."""
    return _FORMAT_PREFIX + record.model_dump_json(include={"services", "deleted_at"})[1:]


def service_text(status: ServiceStatus) -> str:
    """The JSON text of one service status as :func:`encode_record` writes it in a record
    (the same serializer)."""
    return _SERVICE_JSON(status).decode()


def live_record_text(services: Iterable[tuple[str, str]]) -> str:
    """:func:`encode_record`'s text of a record that is not removed (``deleted_at`` null),
    from each service's name and :func:`service_text`, in the record's order: for a caller
    that has the texts of its statuses already (a bulk operation's plan,
    ``locstatus.manager.bulkplan``, which compares the two encodings). Names are canonical
    service names, which JSON writes as they are."""
    return (
        f'{_FORMAT_PREFIX}"services":{{'
        + ",".join([f'"{name}":{text}' for name, text in services])
        + '},"deleted_at":null}'
    )


def json_text(value: str) -> str:
    """The JSON text of a string as the encoders here write it."""
    return to_json(value).decode()


_SERVICE_JSON = ServiceStatus.__pydantic_serializer__.to_json


def stored_format(location: str, data: dict[str, Any]) -> int:
    """Take the ``format`` out of a decoded payload: 1 when absent (written before formats
    were numbered). Raises :class:`NewerFormat` when newer than :data:`FORMAT`,
    :class:`CorruptRecord` when not a whole number >= 1."""
    found = data.pop("format", 1)
    if type(found) is not int or found < 1:
        raise CorruptRecord(location, f"format: expected a whole number >= 1, got {found!r}")
    if found > FORMAT:
        raise NewerFormat(location, found, FORMAT)
    return found


def decode_record(location: str, version: int, raw: str | bytes | dict[str, Any]) -> LocationStatus:
    """Parse a stored payload: JSON text (``str``, or UTF-8 ``bytes``) or a decoded document.

    Only what was written is read (docs/reliability.md, "What a stored record carries"): every
    field must be there (:data:`~locstatus.models.STORED_RECORD`), no key twice in one object,
    no alias beside the name it stands for. Raises :class:`CorruptRecord` naming ``location``
    and what is wrong, for any payload that is not such a record, however it fails to parse
    (nested too deeply for the parser included)."""
    text: object = raw
    if type(raw) is bytes:
        try:
            text = raw.decode()
        except UnicodeDecodeError as exc:
            raise CorruptRecord(location, str(exc)) from None
    if type(text) is str and text[:2] == '{"':  # what encode_record writes
        fast = text
        if fast.startswith(_FORMAT_PREFIX):  # this version's format; none: format 1
            fast = "{" + fast[len(_FORMAT_PREFIX):]
        rec = _decode_fast(location, version, fast)
        if rec is not None:
            return check_schedules(location, rec)
    data = dict(raw) if isinstance(raw, dict) else parse_payload(location, text)
    stored_format(location, data)
    try:
        return check_schedules(location, _validate_payload(location, version, data))
    except RecursionError:
        raise CorruptRecord(location, "payload nested too deeply to validate") from None
    except (ValueError, ValidationError, TypeError) as exc:
        raise CorruptRecord(location, _short(exc)) from exc


def decode_rows(
    rows: Iterable[Sequence[object]],
    decode: Callable[[str, object, object], LocationStatus | CorruptRecord],
) -> list[LocationStatus | CorruptRecord]:
    """``decode(str(location), version, text)`` of each ``(location, version, text)`` row of a
    whole scan, where ``decode`` is a backend's :func:`decode_record_or_error` of a row (its
    columns checked as it stores them).

    The same records and errors as one call per row, in one loop: a row as this version writes
    it (an integer version, :func:`encode_record`'s text) goes through :func:`_decode_fast`'s
    checks written out here (a scan of 100 000 records paid four Python calls a record for
    them, docs/benchmarks.md "Bulk operations"); any other row through ``decode``."""
    out: list[LocationStatus | CorruptRecord] = []
    append = out.append
    prefix, skip = _FORMAT_PREFIX, len(_FORMAT_PREFIX)
    validate, keys, per, aliases = _VALIDATE_RECORD, _PAYLOAD_KEYS, _KEYS_PER_SERVICE, _ALIASES
    seen: dict[str, LocationStatus] = {}  # text -> the record it was read as (any location)
    name = LOCATION_RE.fullmatch
    for location, version, text in rows:
        if type(text) is str and type(version) is int and type(location) is str:
            same = seen.get(text)
            if same is not None and 0 <= version <= MAX_STORED_INT and name(location):
                # the payload validated already: only the key and version differ
                append(copy_with(same, {
                    "location": location, "version": version, "services": dict(same.services)
                }))
                continue
        if (
            type(text) is str
            and type(version) is int
            and type(location) is str
            and text.startswith(prefix)
            and '"' not in location
            and "\\" not in location
            and "\\" not in text
            and "\n" not in text
            and "\r" not in text
            and "\t" not in text
            and " :" not in text
        ):
            body = text[skip:]
            try:
                rec: LocationStatus | None = validate(
                    f'{{"location":"{location}","version":{version},{body}'
                )
            except (ValueError, RecursionError):  # ValidationError is a ValueError
                rec = None
            if (
                rec is not None
                and body.count('":') == keys + per * len(rec.services)
                and aliases.isdisjoint(rec.services)
            ):
                try:
                    append(check_schedules(location, rec))
                except CorruptRecord as exc:
                    append(exc)
                    continue
                if len(seen) < _SEEN_TEXTS:
                    seen[text] = rec
                continue
        append(decode(str(location), version, text))
    return out


def parse_payload(location: str, raw: object) -> dict[str, Any]:
    """The JSON object a stored payload (``str`` or UTF-8 ``bytes``) holds, every key once.
    Raises :class:`CorruptRecord` naming ``location`` when it is not text, not JSON (nested too
    deeply to parse included), not an object, or repeats a key in one object (JSON parsers keep
    one of them, the last here; a record that says two things says neither)."""
    try:
        if isinstance(raw, bytes):
            raw = raw.decode()
        if not isinstance(raw, str):
            raise TypeError(f"expected JSON text, got {type(raw).__name__}")
        data = json.loads(raw, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise CorruptRecord(location, "payload nested too deeply to parse") from None
    except (ValueError, TypeError) as exc:  # JSONDecodeError, UnicodeDecodeError are ValueErrors
        raise CorruptRecord(location, str(exc)) from exc
    if not isinstance(data, dict):
        raise CorruptRecord(location, f"expected a JSON object, got {type(data).__name__}")
    return data


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                shown = key if len(key) <= 64 else key[:61] + "..."
                raise ValueError(f"key {shown!r} appears twice in one object")
            seen.add(key)
    return obj


def _decode_fast(location: str, version: int, text: str) -> LocationStatus | None:
    """One pass of pydantic's JSON parser over the stored text, with the key and version (which
    live outside the payload) spliced in front; None when the slow path must decide (it names
    the error, maps aliases, refuses a payload carrying its own key or a key twice).

    Every record read goes through here (scan, ``statuses()``, agents' snapshots, the check
    job), so it calls the validator directly (``model_validate_json`` adds a Python frame) and
    its guards are substring searches. The parser keeps the last of duplicate keys, so the keys
    are counted: the validator requires every field and refuses any other, so a record of ``n``
    services has exactly ``2 + 8 n`` distinct keys, and the text may hold no more. Without a
    backslash in the text every ``"`` delimits a string and each key ends in ``":`` (a value
    opening with ``:`` counts too, which only sends it to the slow path); whitespace before a
    colon (which hides a key from the count) and escapes go to the slow path. A payload's own
    ``location``/``version`` key is one more key than that, so it is never spliced over."""
    if '"' in location or "\\" in location:
        return None  # spliced as it is: the validator checks the name, nothing may escape it
    try:
        rec: LocationStatus = _VALIDATE_RECORD(
            f'{{"location":"{location}","version":{int(version)},{text[1:]}'
        )
    except (ValueError, RecursionError):  # ValidationError is a ValueError
        return None
    if (
        text.count('":') != _PAYLOAD_KEYS + _KEYS_PER_SERVICE * len(rec.services)
        or "\\" in text
        or "\n" in text
        or "\r" in text
        or "\t" in text
        or (" " in text and " :" in text)
        or not _ALIASES.isdisjoint(rec.services)  # mapped by the slow path
    ):
        return None
    return rec


_VALIDATE_RECORD = STORED_RECORD.validate_json
_SEEN_TEXTS = 4096
"""Distinct stored texts :func:`decode_rows` remembers in one scan (a fleet's records share a
handful: those the last operations wrote, a batch at a time)."""
_PAYLOAD_KEYS = len(LocationStatus.model_fields) - 2
"""Keys of a stored payload: every field of a record but its location and version."""
_KEYS_PER_SERVICE = 1 + len(ServiceStatus.model_fields)
"""Keys per service in a stored payload: its name, then every field of its status."""
_ALIASES = frozenset(SERVICE_ALIASES)
"""Service aliases: a stored record never uses them as keys (the encoder writes canonical
names), but one edited by hand may, and ``crr`` must read as ``replication`` (docs/design.md §2);
the slow path maps them."""


def decode_record_or_error(
    location: str, version: int, raw: str | bytes | dict[str, Any]
) -> LocationStatus | CorruptRecord:
    """:func:`decode_record`, with the error in place of the record (for whole scans, where one
    corrupt record must not hide the others: contract invariant 5)."""
    try:
        return decode_record(location, version, raw)
    except CorruptRecord as exc:
        return exc


def _validate_payload(location: str, version: int, data: dict[str, Any]) -> LocationStatus:
    # A stored payload never carries the key and version (they live in the backend's own key
    # and version); one that does is damaged, e.g. another location's document pasted in.
    own = sorted(k for k in ("location", "version") if k in data)
    if own:
        raise ValueError(f"payload carries its own {' and '.join(own)} (a copied document?)")
    rec: LocationStatus = _VALIDATE_STORED({**data, "location": location, "version": version})
    return rec


_VALIDATE_STORED = STORED_RECORD.validate_python


def check_schedules(location: str, rec: LocationStatus) -> LocationStatus:
    """``rec``, when no service carries a ``resume_at`` outside ``pausing``/``paused`` (no write
    of locstatus leaves one: leaving those states clears it). Raises :class:`CorruptRecord`
    naming the service (a hand edit)."""
    for name, st in rec.services.items():
        if st.resume_at is not None and not st.state.desired_paused:
            raise CorruptRecord(
                location,
                f"services.{name}: resume_at is set on a {st.state.value} service "
                "(only a pausing or paused one has a scheduled resume)",
            )
    return rec


def encode_history(entries: Sequence[HistoryEntry]) -> str:
    """Stored JSON text of the entries of one write."""
    return _HISTORY_LIST.dump_json(list(entries)).decode()


def decode_history(location: str, raw: object, version: int) -> list[HistoryEntry]:
    """Parse the entries of the write stored under ``version`` (the backend's own key) from
    its stored text (``str``/``bytes``).

    Raises :class:`CorruptRecord` when they are not text or do not parse, and when an entry
    names another version: a hand edit, and one that would mislead whoever pages through
    history by it."""
    if not isinstance(raw, str | bytes):
        raise CorruptRecord(
            location, history_error(version, f"expected JSON text, got {type(raw).__name__}")
        )
    try:
        entries: list[HistoryEntry] = _VALIDATE_HISTORY(raw)
    except ValidationError as exc:
        raise CorruptRecord(location, history_error(version, _short(exc, "entries"))) from exc
    return check_write(location, entries, version)


def history_error(version: int, detail: str) -> str:
    """The detail of a :class:`CorruptRecord` for the history write at ``version``: it names
    the write, so an operator knows which one to look at (``locstatus history`` stops there)."""
    return f"history write at version {version}: {detail}"


def write_version(location: str, version: object) -> int:
    """The key a history write is stored under, when it is an integer (a hand edit may have
    stored anything there). Raises :class:`CorruptRecord`."""
    if type(version) is not int:
        raise CorruptRecord(location, f"history: version {version!r} is not an integer")
    return version


def check_write(location: str, entries: list[HistoryEntry], version: int) -> list[HistoryEntry]:
    """``entries``, when each names ``version``, the key its write is stored under. Raises
    :class:`CorruptRecord`."""
    for e in entries:
        if e.version != version:
            raise CorruptRecord(
                location, history_error(version, f"holds an entry of version {e.version}")
            )
    return entries


Write = tuple[int, object]
"""A stored history write: the version it is stored under (the backend's key) and its text."""


def decode_newest_write(location: str, write: Write | None) -> list[HistoryEntry] | CorruptRecord:
    """The entries of one stored write (text as ``str``/``bytes``), newest first; an empty list
    when ``write`` is None (no history); the error in their place when they do not parse (for
    :meth:`Backend.scan_with_history`)."""
    if write is None:
        return []
    version, raw = write
    try:
        entries = decode_history(location, raw, version)
    except CorruptRecord as exc:
        return exc
    entries.reverse()
    return entries


def decode_newest_writes(
    location: str, record: LocationStatus | CorruptRecord, writes: Sequence[Write]
) -> list[HistoryEntry] | CorruptRecord | None:
    """What :meth:`Backend.scan_with_history` pairs with ``record``: the entries of its newest
    stored ``writes`` (newest first; empty when it has no history), newest first: those of
    the newest write, then of older ones for as long as some service of ``record`` has not met
    an entry yet and no create entry was met. Enough for the check job to compare every service
    with its newest entry without a query of its own, in the usual case.

    The error in place of the entries when the newest write does not parse; None when it holds
    no entry (a record created without history, or a hand edit), so the caller pages through
    :meth:`Backend.history` itself. An older write that does not parse, holds no entry, or is not
    older than the ones before it, ends the list: the caller pages on from the oldest entry
    returned, and :meth:`Backend.history` reports or skips that write."""
    if not writes:
        return []
    entries = decode_newest_write(location, writes[0])
    if isinstance(entries, CorruptRecord):
        return entries
    if not entries:
        return None
    if len(writes) == 1 or isinstance(record, CorruptRecord):
        return entries
    pending = set(record.services)
    if not _covered(pending, entries):
        last = writes[0][0]
        for write in writes[1:]:
            if write[0] >= last:  # not older: let the caller page
                break
            more = decode_newest_write(location, write)
            if isinstance(more, CorruptRecord) or not more:
                break
            entries.extend(more)
            if _covered(pending, more):
                break
            last = write[0]
    return entries


def _covered(pending: set[str], entries: list[HistoryEntry]) -> bool:
    """Discard from ``pending`` the services ``entries`` show; True once none is left or a
    create entry (which shows every service) was met."""
    for e in entries:
        if e.service == "*" and e.event == "create":
            pending.clear()
            return True
        pending.discard(e.service)
    return not pending


def stamp(entries: Sequence[HistoryEntry], version: int) -> list[HistoryEntry]:
    """Entries with ``version`` set to the version their write produced (an entry planned
    with it already is kept as it is)."""
    return [e if e.version == version else copy_with(e, {"version": version}) for e in entries]


MAX_REGISTRATION_BYTES = 1_000_000
"""Largest stored worker registration (its JSON text), on every backend: one ZooKeeper node
(``jute.maxbuffer`` is 1 MB for a whole request), so a registration that one backend stores is
stored by all of them (its BSON on MongoDB stays far below the 16 MB document limit). Above it
the handler errors are cut further; a registration still too large without any (a location
filter of ~100 000 names) is refused."""

MAX_WORKER_ERRORS = 100
"""Handler errors a registration keeps: the first by ``location/service`` key order (the same
ones at every heartbeat while they last); the others are counted in :data:`ERRORS_CUT_KEY`."""

MAX_ERROR_CHARS = 1000
"""Characters kept of each handler error message."""

ERRORS_CUT_KEY = "..."
"""The entry of ``WorkerInfo.errors`` that says how many errors a registration left out (no
``location/service`` key looks like it)."""


def encode_worker(info: WorkerInfo, max_bytes: int = MAX_REGISTRATION_BYTES) -> str:
    """The stored JSON text of a registration: :func:`bounded_worker`'s."""
    return bounded_worker(info, max_bytes)[1]


def bounded_worker(
    info: WorkerInfo, max_bytes: int = MAX_REGISTRATION_BYTES
) -> tuple[WorkerInfo, str]:
    """The registration every backend stores for ``info``, and its JSON text (UTF-8 at most
    ``max_bytes`` bytes, default :data:`MAX_REGISTRATION_BYTES`).

    Handler errors are diagnostics, and a worker failing at thousands of locations during an
    outage must keep renewing its lease: at most :data:`MAX_WORKER_ERRORS` errors are kept,
    each cut to :data:`MAX_ERROR_CHARS` characters, and while the text is still too large half
    of those left are dropped, again and again; :data:`ERRORS_CUT_KEY` then says how many are
    not shown. The rest of the registration is never cut: when it does not fit without any
    error (a location filter too large), raises :class:`InvalidInput` naming the sizes, and
    nothing must be written. A registration listed as :attr:`~WorkerInfo.corrupt` is refused
    the same way: stored, it would read as a worker applying nothing."""
    if info.corrupt is not None:
        raise InvalidInput(
            f"worker {info.worker_id!r}: a registration read as corrupt ({info.corrupt}) "
            "cannot be stored back; nothing was written"
        )
    errors = info.errors
    kept = {k: errors[k][:MAX_ERROR_CHARS] for k in sorted(errors)[:MAX_WORKER_ERRORS]}
    if kept == errors:
        text = info.model_dump_json(exclude=not_stored(info))
        if len(text.encode()) <= max_bytes:
            return info, text
    while True:
        shown = dict(kept)
        cut = len(errors) - len(kept)
        if cut:
            shown[ERRORS_CUT_KEY] = (
                f"{cut} more errors not shown (of {len(errors)}; see the worker's own log)"
            )
        bounded = info.model_copy(update={"errors": shown})
        text = bounded.model_dump_json(exclude=not_stored(info))
        size = len(text.encode())
        if size <= max_bytes:
            return bounded, text
        if not kept:
            break
        kept = dict(list(kept.items())[: len(kept) // 2])
    filtered = "" if info.locations is None else (
        f" (its location filter holds {len(info.locations)} names)"
    )
    raise InvalidInput(
        f"worker {info.worker_id!r}: registration of {size} bytes{filtered} exceeds the limit "
        f"of {max_bytes} bytes for a worker registration; nothing was written: give the worker "
        "a shorter location filter (none means every location), or split it into several "
        "workers"
    )


WORKER_NOT_STORED: set[str] = {"corrupt", "away"}
"""Fields of :class:`WorkerInfo` a backend sets when it reads, never part of what it stores."""


def not_stored(info: WorkerInfo) -> set[str]:
    """The fields of ``info`` left out of its stored form: :data:`WORKER_NOT_STORED`,
    ``standing`` unless true and ``instance`` unless set (an ordinary registration is stored
    as it was before either existed, so an older version still reads it)."""
    left = set(WORKER_NOT_STORED)
    if not info.standing:
        left.add("standing")
    if info.instance is None:
        left.add("instance")
    return left

_LEASE: TypeAdapter[UTCDateTime | None] = TypeAdapter(UTCDateTime | None)


def decode_worker(worker_id: str, raw: str | bytes | dict[str, Any] | object) -> WorkerInfo:
    """The registration stored under ``worker_id``: JSON text (``str`` or UTF-8 ``bytes``) or
    a decoded document. Never raises: one that does not parse or validate, or that names
    another worker than its key, is listed as the stand-in of :func:`corrupt_worker`."""
    try:
        if isinstance(raw, str | bytes):
            info = WorkerInfo.model_validate_json(raw)
        else:
            info = WorkerInfo.model_validate(raw)
    except (ValueError, RecursionError) as exc:  # ValidationError is a ValueError
        return corrupt_worker(worker_id, raw, _short(exc, "registration"))
    if info.worker_id != worker_id:
        return corrupt_worker(
            worker_id, raw, f"worker_id: the registration names {info.worker_id!r}"
        )
    if info.corrupt is not None or info.away:
        field = "corrupt" if info.corrupt is not None else "away"
        return corrupt_worker(worker_id, raw, f"{field}: not a field of a stored registration")
    return info


def corrupt_worker(worker_id: str, raw: object, detail: str) -> WorkerInfo:
    """The stand-in listed for a registration that cannot be read (contract invariant 6,
    docs/agent.md "Unreadable registrations and acknowledgements"): ``worker_id`` (the key it
    is stored under), :attr:`~WorkerInfo.corrupt` = ``detail``, applying every service at
    every location, no handler errors, and the ``lease_expires_at`` of ``raw`` when that field
    alone still reads (else None: alive while it is listed). Conservative: a settle waits for
    it exactly as for a live worker that acknowledged nothing, and a lease it still carries
    lapses as any other, so a registration left by a dead worker stops blocking then."""
    data: object = raw
    if isinstance(raw, str | bytes):
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            data = None
    lease = None
    if isinstance(data, dict):
        try:
            lease = _LEASE.validate_python(data.get("lease_expires_at"))
        except (ValueError, RecursionError):
            lease = None
    return WorkerInfo.model_construct(
        worker_id=worker_id, services=(), locations=None, lease_expires_at=lease, corrupt=detail
    )


def ack_generation(raw: object) -> int | None:
    """A stored acknowledged generation, or None when it is not an integer (a hand edit):
    an unreadable acknowledgement acknowledges nothing (contract invariant 6). Integer
    subclasses (BSON's ``Int64``) read as plain ints; ``True`` is no generation."""
    return int(raw) if isinstance(raw, int) and not isinstance(raw, bool) else None


def is_registration(
    worker_id: str, raw: object, if_expires: datetime | None, *, retire: bool = False
) -> bool:
    """Whether the registration stored under ``worker_id`` may be removed by
    ``remove_worker(if_expires=, retire=)``. A standing registration (docs/agent.md "Standing
    registrations") only by a retirement (``retire``, ``Manager.retire_worker``): never by an
    ordinary unregistration, nor by the check's conditional removal (it outlives its lease).
    Otherwise always when ``if_expires`` is None, else only while its lease deadline, as
    :func:`decode_worker` lists it (an unreadable one's stand-in carries the lease that still
    reads in it, or none), is exactly ``if_expires`` (a conditional retirement too: a holder
    that took the registration over meanwhile wrote another deadline)."""
    if retire and if_expires is None:
        return True
    info = decode_worker(worker_id, raw)
    if info.standing and not retire:
        return False
    return if_expires is None or info.lease_expires_at == if_expires


def standing_refusal(worker_id: str, *, registering: bool) -> StandingRegistered:
    """The error for an ordinary registration (``registering``) or unregistration of
    ``worker_id`` met by a standing registration of that id: only a retirement ends it."""
    what = "registration" if registering else "unregistration"
    return StandingRegistered(
        f"{worker_id} is a standing registration: an ordinary {what} of the same id is "
        f"refused, nothing was written; only a retirement ends it: locstatus workers retire "
        f"{worker_id} (docs/agent.md \"Standing registrations\")"
    )


def refuses_put(worker_id: str, raw: object, info: WorkerInfo) -> bool:
    """Whether writing ``info`` over the registration stored as ``raw`` must be refused
    (:func:`standing_refusal`): an ordinary registration over a standing one."""
    return not info.standing and raw is not None and decode_worker(worker_id, raw).standing


def _short(exc: BaseException, root: str = "record") -> str:
    """One line for a validation error: up to three ``field.path: message`` parts, ``root``
    naming the document when the error is about it as a whole."""
    if isinstance(exc, ValidationError):
        errs = exc.errors()
        parts = [
            f"{'.'.join(str(p) for p in e['loc']) or root}: "
            + e["msg"].removeprefix("Value error, ")  # a message of one of our validators
            for e in errs[:3]
        ]
        more = f" (+{len(errs) - 3} more)" if len(errs) > 3 else ""
        return "; ".join(parts) + more
    return str(exc)
