"""The sidecar's HTTP application (docs/design.md §5.3): :func:`create_app` builds a FastAPI app
over a :class:`~locstatus.manager.Manager`.

Why it is shaped so:

- The app is a thin shell over the manager: every mutation is the manager's compare-and-set path,
  every error is a :mod:`locstatus.errors` class whose ``http_status`` decides the response
  (:mod:`.problems`), so the CLI and the sidecar never disagree about what an error is.
- Routes are plain (synchronous) functions run in the server's thread pool: a backend call may
  block (ZooKeeper, MongoDB) and must not stall the event loop. The exception is the location
  read, the hot path: on local backends (SQLite, where a WAL reader never waits for a writer;
  memory) it runs on the event loop, served by a plain Starlette route in front of its documented
  FastAPI route. Location documents are serialised once by pydantic straight to bytes; the
  ``response_model`` of a route is documentation only.
- The record version is the ETag (``"<version>"``). ``If-Match`` (strong, weak or unquoted;
  several values; ``*``) becomes the manager's ``if_version``, so a stale write is refused by the
  same compare-and-set that applies it (412), never by a check-then-write race.
- ``all`` as the location is a bulk operation. It answers 200 only when every location
  succeeded; otherwise it answers a problem document whose status is the highest error status
  and whose ``results`` member holds the per-location outcome (``{"status": ...}`` or
  ``{"error": <problem>}``). An error is never hidden in a 200. Likewise a listing with a
  corrupt record in it is a problem document carrying the readable records and naming the
  corrupt ones (:func:`corrupt_listing`), and a bulk operation counts a corrupt record as a
  failed location: a record that cannot be read is never silently left out.
- One pure ASGI middleware counts requests and latencies per route template and refuses request
  bodies over 64 KiB (413) before any parsing.

Usage::

    mgr = Manager(open_backend("sqlite:///./locstatus.db"))
    app = create_app(mgr, token=os.environ.get("LOCSTATUS_API_TOKEN"))
    uvicorn.run(app, host="127.0.0.1", port=8080)
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

from fastapi import APIRouter, Body, Depends, FastAPI, Header, Path, Query, Request, Security
from fastapi.encoders import jsonable_encoder
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    model_validator,
)
from starlette.concurrency import run_in_threadpool
from starlette.routing import Match
from starlette.routing import Route as StarletteRoute

from locstatus import __version__
from locstatus.audit import history_by_actor
from locstatus.errors import (
    CorruptRecord,
    InvalidInput,
    LocstatusError,
    NotFound,
    PreconditionFailed,
)
from locstatus.manager import Manager, worker_live
from locstatus.models import HistoryEntry, LocationStatus, WorkerInfo
from locstatus.names import (
    BULK_LOCATION,
    LOCATION_RE,
    MAX_ACTOR,
    MAX_REASON,
    SERVICE_ALIASES,
    check_location,
    check_text,
)

from . import page, problems
from .guard import HostPolicy, NativeRoute
from .metrics import Metrics
from .principals import Principals, actor_for, check_secret, require
from .problems import PROBLEM_MEDIA_TYPE, Problem, ProblemError, error_body, responses

if TYPE_CHECKING:
    from locstatus.reconciler import Reconciler

MAX_BODY = 64 * 1024
"""Largest accepted request body, in bytes (413 above)."""

MAX_DELAY_SECONDS = 10 * 366 * 24 * 3600
"""Longest accepted scheduled-resume delay (about ten years), in seconds."""

ALL = BULK_LOCATION
"""The location (and service) name that means "every one" in mutating routes."""

_LOCAL = frozenset({"sqlite", "memory"})
T = TypeVar("T")

Op = Callable[[str, int | None], LocationStatus]
"""``op(location, if_version) -> stored record``: one manager mutation."""


# -- request and response bodies -------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _free_text(field: str, limit: int) -> AfterValidator:
    """``check_text`` as a body validator: a control character is a 422 naming the field."""

    def check(value: str | None) -> str | None:
        try:
            return check_text(field, value, limit)
        except InvalidInput as exc:
            raise ValueError(exc.message) from None

    return AfterValidator(check)


def _iso_string(value: object) -> object:
    # JSON numbers would be taken as Unix times by pydantic; docs/http.md says ISO 8601.
    if not isinstance(value, str | datetime):
        raise ValueError(
            "at must be an ISO 8601 date and time with an offset, as a string, such as "
            f"2030-01-31T18:00:00Z (got {type(value).__name__} {str(value)[:40]}; a number is "
            "not read as a Unix time)"
        )
    return value


def _in_utc(value: datetime) -> datetime:
    try:
        return value.astimezone(UTC)
    except OverflowError:  # 9999-12-31T23:59:59-01:00 is a datetime with no UTC time
        raise ValueError(
            f"at {value.isoformat()} is out of range: its UTC time is past year 9999 or before "
            "year 1"
        ) from None


Reason = Annotated[
    str | None,
    Field(max_length=MAX_REASON, description="Why (free text, no control characters)"),
    _free_text("reason", MAX_REASON),
]
Actor = Annotated[
    str | None,
    Field(max_length=MAX_ACTOR, description="Who (free text, no control characters)"),
    _free_text("actor", MAX_ACTOR),
]
ResumeTime = Annotated[
    AwareDatetime, BeforeValidator(_iso_string), AfterValidator(_in_utc)
]
"""An ISO 8601 string with an offset, in UTC range; stored in UTC."""


class PauseBody(_Body):
    """Body of ``POST .../pause`` (optional)."""

    reason: Reason = None
    actor: Actor = None
    wait: float | None = Field(
        default=None, ge=0, le=300,
        description="Seconds to wait until every live worker acknowledged (504 on timeout)",
    )


class ResumeBody(PauseBody):
    """Body of ``POST .../resume`` (optional): resume now, or schedule with ``at`` (an aware
    ISO datetime in the future) or ``in_seconds`` (positive), not both."""

    at: ResumeTime | None = Field(
        default=None, description="Scheduled resume time: ISO 8601 with an offset, a string"
    )
    in_seconds: float | None = Field(
        default=None, gt=0, le=MAX_DELAY_SECONDS, description="Schedule a resume this far ahead"
    )

    @model_validator(mode="after")
    def _one_time(self) -> ResumeBody:
        if self.at is not None and self.in_seconds is not None:
            raise ValueError("give at or in_seconds, not both")
        if self.wait is not None and (self.at is not None or self.in_seconds is not None):
            raise ValueError("wait applies to an immediate resume, not to a scheduled one")
        return self


class CancelBody(_Body):
    """Body of ``DELETE .../schedule`` (optional)."""

    reason: Reason = None
    actor: Actor = None


class BulkItem(BaseModel):
    """Outcome for one location of a bulk (``all``) operation: ``status`` or ``error``."""

    status: Any | None = None
    error: Problem | None = None


class BulkResult(BaseModel):
    """Per-location results of a bulk operation that fully succeeded."""

    results: dict[str, BulkItem]


class WorkerView(WorkerInfo):
    """A registered worker and whether its lease holds (``is_alive``: false only once its lease
    deadline passed by the backend's time beyond doubt; docs/time.md). ``clock_offset_seconds``
    is the offset the worker published (its wall clock minus the backend's time)."""

    is_alive: bool


class Health(BaseModel):
    """``/healthz`` and ``/readyz`` answer: ``status`` ``ok``, or ``degraded`` (still ready)
    when this process's latest write found the store full, said in ``writes``."""

    status: str
    reconciler: str | None = None
    writes: str | None = None


class CheckView(BaseModel):
    """The last periodic consistency check (``GET /v1/check``)."""

    at: datetime
    duration_seconds: float
    result: Any


@dataclass
class CheckState:
    """Where the server's periodic check stores its last outcome (read by ``/v1/check``)."""

    result: Any = None
    at: datetime | None = None
    duration: float = 0.0
    error: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


_LOCATIONS = TypeAdapter(list[LocationStatus])
_HISTORY = TypeAdapter(list[HistoryEntry])
_WORKERS = TypeAdapter(list[WorkerView])


# -- the per-app context ----------------------------------------------------------------------


class Context:
    """What the routes share: the manager, the token, metrics and helpers. Every time is the
    manager's (``mgr.time``, the backend's; docs/time.md)."""

    def __init__(
        self,
        mgr: Manager,
        *,
        token: str | None,
        metrics: Metrics,
        reconciler: Reconciler | None,
        check: CheckState | None,
        inline_reads: bool | None = None,
        principals: Principals | None = None,
    ) -> None:
        self.mgr = mgr
        self.token = token
        self.principals = principals or Principals.from_settings(tokens_file=None, token=token)
        """Who may call (docs/http.md "Callers and roles")."""
        self.metrics = metrics
        self.reconciler = reconciler
        self.check = check
        scheme = mgr.backend.url.split(":", 1)[0]
        self.inline_reads = inline_reads if inline_reads is not None else scheme in _LOCAL
        """Run single reads on the event loop: true for local backends (SQLite in WAL mode
        never makes a reader wait for a writer; memory), false for network backends."""

    async def read(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call a quick backend read: inline for local backends, else in the thread pool."""
        if self.inline_reads:
            return fn(*args, **kwargs)
        return await run_in_threadpool(fn, *args, **kwargs)

    # -- names ----------------------------------------------------------------------------

    def service_arg(self, name: str) -> str | None:
        """``all`` -> None (every service); else the canonical configured name.
        Raises :class:`NotFound` for a service that is not configured."""
        if name == ALL:
            return None
        canon = SERVICE_ALIASES.get(name, name)
        if canon not in self.mgr.services:
            shown = name if len(name) <= 64 else name[:61] + "..."
            raise NotFound(
                f"unknown service {shown!r}: expected one of {', '.join(self.mgr.services)}, "
                "crr or all"
            )
        return canon

    # -- mutations ------------------------------------------------------------------------

    def single(
        self,
        event: str,
        location: str,
        service: str | None,
        op: Op,
        *,
        if_match: str | None = None,
        wait: float | None = None,
    ) -> LocationStatus:
        """Apply ``op`` to one location; ``if_match`` is the raw header. Raises the
        manager's errors (:class:`PreconditionFailed` on a stale If-Match)."""
        check_location(location)
        versions = parse_if_match(if_match) if if_match is not None else None
        before = self.mgr.status(location)
        if_version: int | None = None
        if versions:
            if len(versions) == 1:
                if_version = versions[0]
            elif before.version in versions:
                if_version = before.version  # still checked by the compare-and-set
            else:
                raise PreconditionFailed(
                    f"location {location!r} is at version {before.version}, "
                    f"not one of {', '.join(map(str, versions))}"
                )
        try:
            after = op(location, if_version)
        except LocstatusError as exc:
            self.metrics.transition(event, type(exc).__name__)
            raise
        self.metrics.transition(event, "applied" if after.version != before.version else "noop")
        if wait is not None:
            after = self.mgr.wait_settled(location, service, timeout=wait)
        return after

    def bulk(
        self,
        event: str,
        service: str | None,
        op: Op,
        *,
        wait: float | None = None,
        select: Callable[[LocationStatus], bool] | None = None,
    ) -> dict[str, LocationStatus | LocstatusError]:
        """Apply ``op`` to every (non-removed) location that has ``service`` (every location
        if None) and passes ``select``. Returns location -> stored record or error; every
        corrupt record is there as its :class:`CorruptRecord` (whether it has the service is
        unknown). With ``wait``, every write is done first, then each location is waited for
        until one shared deadline."""
        found = self.mgr.listing()
        records = [
            r
            for r in found.records
            if (service is None or service in r.services) and (select is None or select(r))
        ]
        # A record that cannot be read may have the service, in any state: it is a failure
        # of the operation, never silently outside it.
        out: dict[str, LocationStatus | LocstatusError] = {c.location: c for c in found.corrupt}
        for rec in records:
            try:
                after = op(rec.location, None)
            except LocstatusError as exc:
                self.metrics.transition(event, type(exc).__name__)
                out[rec.location] = exc
                continue
            self.metrics.transition(event, "applied" if after.version != rec.version else "noop")
            out[rec.location] = after
        if wait is not None:
            deadline = time.monotonic() + wait
            for loc, value in out.items():
                if isinstance(value, LocationStatus):
                    try:
                        out[loc] = self.mgr.wait_settled(
                            loc, service, timeout=max(0.0, deadline - time.monotonic())
                        )
                    except LocstatusError as exc:
                        out[loc] = exc
        return out

    def respond(
        self,
        request: Request,
        event: str,
        location: str,
        service: str | None,
        op: Op,
        *,
        if_match: str | None,
        wait: float | None = None,
        select: Callable[[LocationStatus], bool] | None = None,
        render: Callable[[LocationStatus], Any] | None = None,
        empty: str | None = None,
    ) -> Response:
        """Run a native mutation for one location (ETag'd record) or ``all`` (bulk)."""
        if location != ALL:
            rec = self.single(event, location, service, op, if_match=if_match, wait=wait)
            return location_response(rec)
        if if_match is not None:
            raise InvalidInput("If-Match cannot be used with location 'all' (one version each)")
        results = self.bulk(event, service, op, wait=wait, select=select)
        if not results and empty is not None:
            return problems.problem(409, "invalid transition", empty, instance=request.url.path,
                                    type_="urn:locstatus:invalid-transition")
        return bulk_response(request, results, render or _dump)


def _dump(rec: LocationStatus) -> Any:
    return rec.model_dump(mode="json")


def bulk_response(
    request: Request,
    results: dict[str, LocationStatus | LocstatusError],
    render: Callable[[LocationStatus], Any],
    *,
    flat: bool = False,
) -> Response:
    """200 with every location's rendered record when all succeeded; else a problem with the
    highest error status and per-location ``results``. ``flat``: the 200 body is
    ``{location: render(record)}`` (Backbeat style) instead of ``{"results": ...}``."""
    errors = {loc: v for loc, v in results.items() if isinstance(v, LocstatusError)}
    if not errors:
        ok = {loc: render(v) for loc, v in results.items() if isinstance(v, LocationStatus)}
        return JSONResponse(ok if flat else {"results": {k: {"status": v} for k, v in ok.items()}})
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
                else {"status": render(v)}
            )
            for loc, v in results.items()
        },
    }
    return problems.problem_response(body)


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


# -- dependencies -----------------------------------------------------------------------------

_bearer = HTTPBearer(
    auto_error=False,
    description=(
        "LOCSTATUS_API_TOKEN or a token of LOCSTATUS_API_TOKENS_FILE; required on mutating "
        "routes when the sidecar has tokens (docs/http.md \"Callers and roles\")"
    ),
)
bearer = _bearer
"""The bearer-token security scheme (shared by every module's routes)."""


async def context(request: Request) -> Context:
    """The app's :class:`Context` (an ``async`` dependency: no thread-pool hop)."""
    ctx: Context = request.app.state.locstatus
    return ctx


async def authorize(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)] = None,
) -> None:
    """Require an operator's bearer token when the app has tokens (docs/http.md "Callers and
    roles"): missing or not a bearer token -> 401, unknown token or a role that may not
    operate -> 403. The token never appears in an answer; the principal is the actor."""
    require(request, credentials, "operate")


def check_token(token: str) -> str:
    """Return ``token`` if a client can present it and it is long enough to be a secret, else
    raise :class:`InvalidInput` saying why (never showing it): a bearer token travels in an
    HTTP header, which carries visible ASCII and inner spaces only; the server strips
    surrounding whitespace and decodes other bytes differently, so such a token could never
    match (:func:`~.principals.check_secret`)."""
    return check_secret(token, "the API token (LOCSTATUS_API_TOKEN)")


Ctx = Annotated[Context, Depends(context)]
LocationPath = Annotated[
    str,
    Path(
        description="Location name, or 'all' for every location (mutations only)",
        json_schema_extra={"pattern": f"^{LOCATION_RE.pattern}$"},
        examples=["us-east-1", "all"],
    ),
]
ServicePath = Annotated[
    str,
    Path(
        description="Service name ('crr' = replication), or 'all' for every service",
        examples=["replication", "crr", "all"],
    ),
]
IfMatch = Annotated[
    str | None,
    Header(description='Record version the change is based on, e.g. "12" (412 if stale)'),
]

_MUTATION_ERRORS = responses(400, 401, 403, 404, 408, 409, 412, 413, 415, 422, 503, 504)
_READ_ERRORS = responses(400, 404, 422, 503)

router = APIRouter(route_class=NativeRoute)


# -- native routes ----------------------------------------------------------------------------


@router.get(
    "/v1/locations",
    response_model=list[LocationStatus],
    tags=["locations"],
    summary="Every location",
    responses=responses(422, 500, 503),
)
async def list_locations(
    request: Request,
    ctx: Ctx,
    include_removed: Annotated[bool, Query(description="Include tombstones")] = False,
) -> Response:
    found = await ctx.read(ctx.mgr.listing, include_removed=include_removed)
    if found.corrupt:
        return corrupt_listing(
            request, _LOCATIONS.dump_python(found.records, mode="json"), found.corrupt
        )
    return Response(_LOCATIONS.dump_json(found.records), media_type="application/json")


@router.get(
    "/v1/locations/{location}",
    response_model=LocationStatus,
    tags=["locations"],
    summary="One location (ETag = version)",
    responses={304: {"description": "Not modified (If-None-Match)"}, **_READ_ERRORS},
    openapi_extra={
        "parameters": [
            {
                "name": "location",
                "in": "path",
                "required": True,
                "schema": {"type": "string", "pattern": f"^{LOCATION_RE.pattern}$"},
                "description": "Location name",
                "examples": {"example": {"value": "us-east-1"}},
            },
            {
                "name": "If-None-Match",
                "in": "header",
                "required": False,
                "schema": {"type": "string"},
                "description": 'ETag(s) already held, e.g. "12": 304 if still current',
            }
        ]
    },
)
async def get_location(request: Request) -> Response:
    # The hot read path. At run time this function is served by a plain Starlette route placed
    # first (see create_app): no dependency or parameter for FastAPI to solve, which costs more
    # than the backend read. The FastAPI route behind it documents it; its two parameters are
    # declared through openapi_extra.
    ctx: Context = request.app.state.locstatus
    location: str = request.path_params["location"]
    if_none_match = request.headers.get("if-none-match")
    rec = await ctx.read(ctx.mgr.status, location)
    if if_none_match is not None:
        versions = parse_if_match(if_none_match)
        if versions is None or rec.version in versions:
            return Response(status_code=304, headers={"ETag": etag(rec.version)})
    return location_response(rec)


@router.post(
    "/v1/locations/{location}/{service}/pause",
    response_model=LocationStatus | BulkResult,
    tags=["mutations"],
    summary="Pause a service (location 'all': every location)",
    responses=_MUTATION_ERRORS,
    dependencies=[Depends(authorize)],
)
def pause(
    request: Request,
    ctx: Ctx,
    location: LocationPath,
    service: ServicePath,
    body: Annotated[PauseBody | None, Body()] = None,
    if_match: IfMatch = None,
) -> Response:
    b = body or PauseBody()
    svc = ctx.service_arg(service)
    actor = actor_for(request, b.actor)

    def op(loc: str, if_version: int | None) -> LocationStatus:
        return ctx.mgr.pause(loc, svc, reason=b.reason, actor=actor, if_version=if_version)

    return ctx.respond(request, "pause", location, svc, op, if_match=if_match, wait=b.wait)


@router.post(
    "/v1/locations/{location}/{service}/resume",
    response_model=LocationStatus | BulkResult,
    tags=["mutations"],
    summary="Resume now, or schedule a resume (at / in_seconds)",
    responses=_MUTATION_ERRORS,
    dependencies=[Depends(authorize)],
)
def resume(
    request: Request,
    ctx: Ctx,
    location: LocationPath,
    service: ServicePath,
    body: Annotated[ResumeBody | None, Body()] = None,
    if_match: IfMatch = None,
) -> Response:
    b = body or ResumeBody()
    svc = ctx.service_arg(service)
    actor = actor_for(request, b.actor)
    when: datetime | timedelta | None = b.at
    if b.in_seconds is not None:
        when = timedelta(seconds=b.in_seconds)
    event = "resume" if when is None else "schedule_resume"

    def op(loc: str, if_version: int | None) -> LocationStatus:
        return ctx.mgr.resume(
            loc, svc, at=when, reason=b.reason, actor=actor, if_version=if_version
        )

    return ctx.respond(
        request, event, location, svc, op, if_match=if_match, wait=b.wait,
        select=None if when is None else _has_paused(svc),
        empty=None if when is None else "no location has a paused service to schedule",
    )


def _has_paused(service: str | None) -> Callable[[LocationStatus], bool]:
    """Bulk scheduling targets locations where the service is paused (or pausing)."""

    def select(rec: LocationStatus) -> bool:
        names = [service] if service is not None else list(rec.services)
        return any(rec.services[s].paused for s in names if s in rec.services)

    return select


@router.delete(
    "/v1/locations/{location}/{service}/schedule",
    response_model=LocationStatus | BulkResult,
    tags=["mutations"],
    summary="Cancel a scheduled resume",
    responses=_MUTATION_ERRORS,
    dependencies=[Depends(authorize)],
)
def cancel_schedule(
    request: Request,
    ctx: Ctx,
    location: LocationPath,
    service: ServicePath,
    body: Annotated[CancelBody | None, Body()] = None,
    if_match: IfMatch = None,
) -> Response:
    b = body or CancelBody()
    svc = ctx.service_arg(service)
    actor = actor_for(request, b.actor)

    def op(loc: str, if_version: int | None) -> LocationStatus:
        return ctx.mgr.cancel_scheduled_resume(
            loc, svc, reason=b.reason, actor=actor, if_version=if_version
        )

    return ctx.respond(request, "cancel_scheduled_resume", location, svc, op, if_match=if_match)


@router.get(
    "/v1/locations/{location}/history",
    response_model=list[HistoryEntry],
    tags=["locations"],
    summary="History of a location, newest first",
    responses=_READ_ERRORS,
)
def history(
    ctx: Ctx,
    location: LocationPath,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 50,
    before_version: Annotated[int | None, Query(ge=0, le=2**62)] = None,
    actor: Annotated[
        str | None,
        Query(min_length=1, max_length=MAX_ACTOR, description="Only the changes of this actor"),
    ] = None,
) -> Response:
    ctx.mgr.status(location)  # 404 for an unknown location, not an empty list
    if actor is not None:
        entries = history_by_actor(
            ctx.mgr, location, actor, limit=limit, before_version=before_version
        )
    else:
        entries = ctx.mgr.history(location, limit=limit, before_version=before_version)
    return Response(_HISTORY.dump_json(entries), media_type="application/json")


@router.get(
    "/v1/workers",
    response_model=list[WorkerView],
    tags=["workers"],
    summary="Registered workers and their leases",
    responses=responses(503),
)
def workers(ctx: Ctx) -> Response:
    time_source = ctx.mgr.time
    # Built as read, not validated again: a registration listed as corrupt (contract
    # invariant 6) may be stored under a key that is no valid worker id.
    views = [
        WorkerView.model_construct(**w.model_dump(), is_alive=worker_live(w, time_source))
        for w in ctx.mgr.workers()
    ]
    return Response(_WORKERS.dump_json(views), media_type="application/json")


@router.get(
    "/v1/fsm",
    response_class=PlainTextResponse,
    tags=["meta"],
    summary="The state machine as Mermaid source",
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
)
def fsm() -> PlainTextResponse:
    return PlainTextResponse(page._mermaid())


@router.get(
    "/v1/check",
    response_model=CheckView,
    tags=["meta"],
    summary="Last periodic consistency check",
    responses=responses(404, 503),
)
def last_check(ctx: Ctx) -> Response:
    state = ctx.check
    if state is None or state.at is None:
        raise ProblemError(404, "not found", "no consistency check has run yet")
    with state.lock:
        if state.error is not None:
            raise ProblemError(503, "check failed", problems.redact(state.error))
        result = state.result
        as_dict = getattr(result, "as_dict", None)  # locstatus.check.CheckReport
        view = CheckView(
            at=state.at,
            duration_seconds=state.duration,
            result=as_dict() if callable(as_dict) else jsonable_encoder(result),
        )
    return Response(view.model_dump_json(), media_type="application/json")


# -- operations ------------------------------------------------------------------------------


@router.get(
    "/healthz", response_model=Health, response_model_exclude_none=True, tags=["meta"],
    summary="The process is up",
)
async def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Health,
    response_model_exclude_none=True,
    tags=["meta"],
    summary="The backend answers (and the reconciler runs)",
    responses=responses(503),
)
def readyz(ctx: Ctx) -> Health:
    """503 when the backend does not answer or the reconciler is not running. A store that
    answers reads but refused this process's latest write as full stays ready (200, ``status:
    degraded``, ``writes`` naming the error): every sidecar of that store would fail the same
    way, and taking them all out of a load balancer would make the reads fail too, while each
    write already fails on its own with a 503 ``backend full`` (docs/http.md "Operations")."""
    backend = ctx.mgr.backend
    backend.ping()
    rec = ctx.reconciler
    if rec is not None and not rec.alive:
        raise ProblemError(503, "not ready", "the reconciler thread is not running")
    full = backend.store_full
    return Health(
        status="ok" if full is None else "degraded",
        reconciler=None if rec is None else "running",
        writes=None if full is None else f"failing: {full.message}",
    )


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    tags=["meta"],
    summary="Prometheus metrics",
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
)
def metrics(ctx: Ctx) -> Response:
    body, content_type = ctx.metrics.render()
    return Response(body, media_type=content_type)


@router.get(
    "/",
    response_class=HTMLResponse,
    tags=["meta"],
    summary="Status page (HTML)",
    responses={200: {"content": {"text/html": {"schema": {"type": "string"}}}},
               503: {"content": {"text/html": {"schema": {"type": "string"}}},
                     "description": "Backend unavailable (page with a banner)"},
               **responses(422)},
)
def status_page(
    ctx: Ctx,
    refresh: Annotated[int, Query(ge=0, le=3600, description="Auto-refresh seconds")] = 5,
) -> HTMLResponse:
    text, status = page.render(ctx.mgr, refresh=refresh)
    return HTMLResponse(text, status_code=status)


# -- middleware -------------------------------------------------------------------------------

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


BODY_TIMEOUT = 5.0
"""Seconds a client may take to send its whole request body (408 after that): a client that
declares a body and stalls must not pin a connection and a request forever."""


class _Middleware:
    """Request metrics per route template, the ``Host`` check of a sidecar without a token
    (421, :class:`~.guard.HostPolicy`), the 64 KiB body limit (413) and the body read deadline
    (408)."""

    def __init__(
        self, app: ASGIApp, metrics: Metrics, max_body: int, hosts: HostPolicy,
        body_timeout: float = BODY_TIMEOUT,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.max_body = max_body
        self.hosts = hosts
        self.body_timeout = body_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        method = scope["method"]
        status = [500]

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            refusal = self.hosts.refusal(_header(scope, b"host"))
            if refusal is not None:
                status[0] = 421
                await self._refuse(scope, send, 421, "misdirected request", refusal,
                                   type_="urn:locstatus:misdirected-request")
                return
            if method in ("POST", "PUT", "PATCH", "DELETE"):
                try:
                    replay = await asyncio.wait_for(
                        self._read_body(scope, receive), self.body_timeout
                    )
                except TimeoutError:
                    status[0] = 408
                    await self._refuse(
                        scope, send, 408, "request timeout",
                        f"request body not received within {self.body_timeout:g} s",
                    )
                    return
                if replay is None:
                    status[0] = 413
                    await self._refuse(
                        scope, send, 413, "request too large",
                        f"request body larger than {self.max_body} bytes",
                    )
                    return
                receive = replay
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            label = getattr(route, "path", None) or "unmatched"
            self.metrics.request(method, label, status[0], time.perf_counter() - start)

    async def _read_body(self, scope: Scope, receive: Receive) -> Receive | None:
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and (
                not value.isdigit() or int(value) > self.max_body
            ):
                return None
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # client went away: let the app see it
                first: Message = message
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                first = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
                break
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return first
            return await receive()

        return replay

    @staticmethod
    async def _refuse(
        scope: Scope, send: Send, status: int, title: str, detail: str,
        type_: str = "about:blank",
    ) -> None:
        body = Problem(
            type=type_, title=title, status=status, detail=detail, instance=scope.get("path"),
        ).model_dump_json(exclude_none=True).encode()
        await send({
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", PROBLEM_MEDIA_TYPE.encode()),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        })
        await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


# -- the factory ------------------------------------------------------------------------------


class _Route(StarletteRoute):
    """A plain Starlette route that names itself in the scope when it matches, fully or by path
    only (a 405), as FastAPI's routes do: metrics label requests by it."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child = super().matches(scope)
        if match is not Match.NONE:
            child["route"] = self
        return match, child


def _fast_get_location() -> StarletteRoute:
    """``GET /v1/locations/{location}`` as a plain Starlette route (the documented FastAPI
    route of the same path and function stays behind it, for the OpenAPI document)."""
    route = _Route("/v1/locations/{location}", get_location, methods=["GET"])
    route.methods = {"GET"}  # no implicit HEAD: the document (and Allow on 405) list GET only
    return route


def create_app(
    mgr: Manager,
    *,
    token: str | None = None,
    reconciler: Reconciler | None = None,
    check: CheckState | None = None,
    max_body: int = MAX_BODY,
    inline_reads: bool | None = None,
    allowed_hosts: Iterable[str] | None = None,
    principals: Principals | None = None,
) -> FastAPI:
    """Build the sidecar app over ``mgr``.

    - ``token``: when set, mutating routes need ``Authorization: Bearer <token>`` (401/403).
      It must be visible ASCII with no surrounding whitespace (:func:`check_token`,
      :class:`InvalidInput` otherwise): any other token could never authenticate.
    - ``allowed_hosts``: without a token, only requests whose ``Host`` is a loopback name
      (127.0.0.0/8, ``::1``, ``localhost``, any port) or one of these names are served, others
      get a 421 (DNS rebinding, docs/http.md); ``["*"]`` serves every ``Host``. With a token
      every ``Host`` is served.
    - ``principals``: named callers (:class:`~.principals.Principals`, e.g. from
      ``LOCSTATUS_API_TOKENS_FILE``); ``token`` is then one more, the ``operator`` principal.
    - ``reconciler``: the sidecar's :class:`~locstatus.reconciler.Reconciler`, reported by
      ``/readyz`` and ``/metrics`` (the app does not start or stop it).
    - ``check``: where the periodic consistency check stores its result (``/v1/check``).
    - ``max_body``: largest request body in bytes (413 above).
    - ``inline_reads``: serve ``GET /v1/locations[/{location}]`` on the event loop instead of
      the thread pool; default: yes for ``sqlite://`` and ``memory://``, no for network backends.
    """
    from .backbeat import router as backbeat_router
    from .workers import router as workers_router

    token = check_token(token) if token else None
    if principals is not None and token is not None:
        principals.legacy_token = token
    principals = principals or Principals.from_settings(tokens_file=None, token=token)
    extra = list(allowed_hosts or ())
    hosts = HostPolicy(allow_any=principals.enabled or "*" in extra, extra=extra)
    metrics = Metrics(mgr, reconciler=lambda: reconciler)
    app = FastAPI(
        title="locstatus sidecar",
        version=__version__,
        description=(
            "Pause/resume status per location and service (docs/design.md §5.3). Errors are "
            "application/problem+json; the record version is the ETag."
        ),
        openapi_url="/openapi.json",
        # The routes go straight into the app's router: FastAPI keeps an included router as a
        # nested level that every request walks through (about 15 us per request).
        routes=[
            _fast_get_location(), *router.routes, *workers_router.routes,
            *backbeat_router.routes,
        ],
    )
    app.state.locstatus = Context(
        mgr,
        token=token,
        metrics=metrics,
        reconciler=reconciler,
        check=check,
        inline_reads=inline_reads,
        principals=principals,
    )
    problems.install(app)
    app.add_middleware(_Middleware, metrics=metrics, max_body=max_body, hosts=hosts)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, description=app.description,
                routes=app.routes,
            )
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components["Problem"] = Problem.model_json_schema(
                ref_template="#/components/schemas/{model}"
            )
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
