"""The documents the sidecar answers with, shared by the native and the Backbeat routes: a
location with its ETag, a bulk (``all``) result, a listing with corrupt records in it, and the
entity tags of ``If-Match``/``If-None-Match`` (docs/http.md, "ETag and If-Match", "Bulk
operations: `all`", "Corrupt records in listings").

Why shaped so: an error is never hidden in a 200. A bulk operation answers 200 only when every
location succeeded, else a problem document with per-location ``results``; a listing with a
corrupt record is a problem document carrying the readable records and naming the corrupt ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from locstatus.errors import CorruptRecord, InvalidInput, LocstatusError
from locstatus.models import LocationStatus

from . import problems
from .problems import error_body


def dump(rec: LocationStatus) -> Any:
    """A record as JSON-able data (the default rendering of a bulk result)."""
    return rec.model_dump(mode="json")


def bulk_response(
    request: Request,
    results: dict[str, LocationStatus | LocstatusError],
    render: Callable[[LocationStatus], Any],
    *,
    flat: bool = False,
    rescheduled: dict[str, dict[str, str]] | None = None,
) -> Response:
    """200 with every location's rendered record when all succeeded; else a problem with the
    highest error status and per-location ``results``. ``flat``: the 200 body is
    ``{location: render(record)}`` (Backbeat style) instead of ``{"results": ...}``.
    ``rescheduled``: location -> {service: the time its moved schedule had}, shown as each
    such location's ``rescheduled`` member (native results only)."""
    moved = rescheduled or {}
    errors = {loc: v for loc, v in results.items() if isinstance(v, LocstatusError)}
    if not errors:
        ok = {loc: render(v) for loc, v in results.items() if isinstance(v, LocationStatus)}
        if flat:
            return JSONResponse(ok)
        return JSONResponse({"results": {k: _item(k, v, moved) for k, v in ok.items()}})
    status = max(e.http_status for e in errors.values())
    first_loc, first = next(iter(errors.items()))
    body: dict[str, Any] = {
        "type": "urn:locstatus:bulk-failed",
        "title": "bulk operation failed for some locations",
        "status": status,
        "detail": problems.redact(
            f"{len(errors)} of {len(results)} locations failed; {first_loc}: {first.message}"
        ),
        "instance": request.url.path,
        "results": {
            loc: (
                {"error": error_body(v)}
                if isinstance(v, LocstatusError)
                else _item(loc, render(v), moved)
            )
            for loc, v in results.items()
        },
    }
    return problems.problem_response(body)


def _item(location: str, status: Any, moved: dict[str, dict[str, str]]) -> dict[str, Any]:
    item: dict[str, Any] = {"status": status}
    if location in moved:
        item["rescheduled"] = moved[location]
    return item


def corrupt_listing(request: Request, listed: Any, corrupt: Sequence[CorruptRecord]) -> Response:
    """What a route listing records answers when some of them are corrupt (docs/http.md,
    "Corrupt records in listings"): never a 200 that leaves them out, but a problem document
    (500, ``urn:locstatus:corrupt-record``) whose ``locations`` member holds what the 200 would
    have held for the readable ones (``listed``, JSON-able) and whose ``errors`` member names
    each corrupt record (``location`` and its problem)."""
    names = ", ".join(c.location for c in corrupt[:5]) + (", ..." if len(corrupt) > 5 else "")
    body: dict[str, Any] = {
        "type": "urn:locstatus:corrupt-record",
        "title": CorruptRecord.title,
        "status": CorruptRecord.http_status,
        "detail": problems.redact(
            f"{len(corrupt)} record(s) cannot be read: {names}; run 'locstatus check'. "
            "The readable ones are under 'locations'."
        ),
        "instance": request.url.path,
        "locations": listed,
        "errors": [{"location": c.location, **error_body(c)} for c in corrupt],
    }
    return problems.problem_response(body)


def location_response(rec: LocationStatus, status_code: int = 200) -> Response:
    """A location document with its ETag."""
    return Response(
        content=rec.model_dump_json(),
        status_code=status_code,
        media_type="application/json",
        headers={"ETag": etag(rec.version)},
    )


def etag(version: int) -> str:
    """The (strong) ETag of a record version: ``"<version>"``."""
    return f'"{version}"'


def parse_if_match(value: str) -> list[int] | None:
    """Versions named by an ``If-Match``/``If-None-Match`` header: ``"12"``, ``W/"12"``, ``12``,
    comma-separated lists. Returns None for ``*`` (any version). Raises :class:`InvalidInput`."""
    versions: list[int] = []
    for raw in value.split(","):
        tag = raw.strip()
        if not tag:
            continue
        if tag == "*":
            return None
        if tag[:2] in ("W/", "w/"):
            tag = tag[2:]
        if len(tag) >= 2 and tag[0] == tag[-1] == '"':
            tag = tag[1:-1]
        if not tag.isascii() or not tag.isdigit() or len(tag) > 19:
            raise InvalidInput(
                f"invalid entity tag {raw.strip()[:40]!r}: expected a record version such as "
                '"12" (as sent in the ETag header)'
            )
        versions.append(int(tag))
    if not versions:
        raise InvalidInput("empty If-Match header")
    return versions
