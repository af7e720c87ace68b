"""How records, history and workers are turned into stored bytes and back, for every backend.

A stored record holds ``{"services": ..., "deleted_at": ...}``; the location and version live in
the backend's own key and version (column, ``_id``, znode path and stat), so they cannot
disagree with the payload. Decoding validates with pydantic and turns any failure into
:class:`CorruptRecord` naming the location, so one bad record never hides the others.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic import TypeAdapter, ValidationError

from locstatus.errors import CorruptRecord
from locstatus.models import HistoryEntry, LocationStatus, WorkerInfo
from locstatus.names import LOCATION_RE, SERVICE_ALIASES

_HISTORY_LIST = TypeAdapter(list[HistoryEntry])


def record_payload(record: LocationStatus) -> dict[str, Any]:
    """The JSON-able payload of a record (without location and version)."""
    return record.model_dump(mode="json", include={"services", "deleted_at"})


def encode_record(record: LocationStatus) -> str:
    """The stored JSON text of a record (without location and version)."""
    return record.model_dump_json(include={"services", "deleted_at"})


def decode_record(location: str, version: int, raw: str | bytes | dict[str, Any]) -> LocationStatus:
    """Parse a stored payload. Raises :class:`CorruptRecord` naming ``location``."""
    try:
        if isinstance(raw, dict):
            return _validate_payload(location, version, raw)
        text = raw.decode() if isinstance(raw, bytes) else raw
        if (
            text[:2] == '{"'  # what encode_record writes; anything else takes the slow path
            and '"location"' not in text  # a superset of "carries its own key": a false
            and '"version"' not in text  # positive only costs the slow path below
            and not any(alias in text for alias in _ALIAS_KEYS)  # mapped on the slow path
            and LOCATION_RE.fullmatch(location)
        ):
            # Fast path: one pass of pydantic's JSON parser over the stored text, with the key
            # and version (which live outside the payload) spliced in front.
            joined = f'{{"location":"{location}","version":{int(version)},{text[1:]}'
            try:
                rec = LocationStatus.model_validate_json(joined)
            except ValidationError:
                pass  # re-parse below for an error message about the payload itself
            else:
                # A key spelled with JSON escapes ("\u006cocation") passes the text checks;
                # the parser keeps the last of duplicate keys, so it would win over ours.
                if rec.location == location and rec.version == version:
                    return rec
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, got {type(data).__name__}")
        return _validate_payload(location, version, data)
    except RecursionError:
        raise CorruptRecord(location, "payload nested too deeply to parse") from None
    except (ValueError, ValidationError, TypeError) as exc:
        raise CorruptRecord(location, _short(exc)) from exc


def decode_record_or_error(
    location: str, version: int, raw: str | bytes | dict[str, Any]
) -> LocationStatus | CorruptRecord:
    """:func:`decode_record`, with the error in place of the record (for whole scans, where one
    corrupt record must not hide the others: contract invariant 5)."""
    try:
        return decode_record(location, version, raw)
    except CorruptRecord as exc:
        return exc


_ALIAS_KEYS = tuple(f'"{alias}"' for alias in SERVICE_ALIASES)
"""Service aliases as JSON strings: a stored record never uses them as keys (the encoder writes
canonical names), but one edited by hand may, and ``crr`` must read as ``replication``
(SPEC §2); the slow path maps them."""


def _validate_payload(location: str, version: int, data: dict[str, Any]) -> LocationStatus:
    # A stored payload never carries the key and version (they live in the backend's own key
    # and version); one that does is damaged, e.g. another location's document pasted in.
    own = sorted(k for k in ("location", "version") if k in data)
    if own:
        raise ValueError(f"payload carries its own {' and '.join(own)} (a copied document?)")
    return LocationStatus.model_validate({**data, "location": location, "version": version})


def encode_history(entries: Sequence[HistoryEntry]) -> str:
    """Stored JSON text of the entries of one write."""
    return _HISTORY_LIST.dump_json(list(entries)).decode()


def decode_history(location: str, raw: str | bytes) -> list[HistoryEntry]:
    """Parse the entries of one write. Raises :class:`CorruptRecord`."""
    try:
        return _HISTORY_LIST.validate_json(raw)
    except ValidationError as exc:
        raise CorruptRecord(location, "history: " + _short(exc)) from exc


def decode_newest_write(
    location: str, raw: object
) -> list[HistoryEntry] | CorruptRecord:
    """The entries of one stored write (``str``/``bytes``), newest first; an empty list when
    ``raw`` is None (no history); the error in their place when they do not parse (for
    :meth:`Backend.scan_with_history`)."""
    if raw is None:
        return []
    try:
        if not isinstance(raw, str | bytes):
            raise CorruptRecord(location, f"history: expected JSON text, got {type(raw).__name__}")
        entries = decode_history(location, raw)
    except CorruptRecord as exc:
        return exc
    entries.reverse()
    return entries


def stamp(entries: Sequence[HistoryEntry], version: int) -> list[HistoryEntry]:
    """Entries with ``version`` set to the version their write produced."""
    return [e.model_copy(update={"version": version}) for e in entries]


def encode_worker(info: WorkerInfo) -> str:
    return info.model_dump_json()


def decode_worker(raw: str | bytes) -> WorkerInfo:
    return WorkerInfo.model_validate_json(raw)


def _short(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        errs = exc.errors()
        parts = [f"{'.'.join(str(p) for p in e['loc']) or 'record'}: {e['msg']}" for e in errs[:3]]
        more = f" (+{len(errs) - 3} more)" if len(errs) > 3 else ""
        return "; ".join(parts) + more
    return str(exc)
