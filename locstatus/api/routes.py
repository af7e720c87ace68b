"""The native ``/v1`` routes of the sidecar and its operations routes (docs/http.md, "Native
routes (`/v1`)", "Operations"): locations, history, workers, the state machine, the last check,
health, metrics and the status page.

Routes are plain (synchronous) functions run in the server's thread pool: a backend call may
block (ZooKeeper, MongoDB) and must not stall the event loop. The exception is the location
read, the hot path: on local backends it runs on the event loop (:meth:`.context.Context.read`)
and the app factory serves it by a plain Starlette route in front of this documented one
(:mod:`.app`). Location documents are serialised once by pydantic straight to bytes; the
``response_model`` of a route is documentation only. Every mutation goes through
:meth:`.context.Context.respond`, one location or ``all``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Body, Depends, Header, Path, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import HTMLResponse, PlainTextResponse, Response
from pydantic import TypeAdapter

from locstatus import __version__
from locstatus.audit import history_by_actor
from locstatus.manager import Operation, WorkerStatus
from locstatus.models import HistoryEntry, LocationStatus
from locstatus.names import LOCATION_RE, MAX_ACTOR

from . import page, problems
from .auth import authorize
from .bodies import BulkResult, CancelBody, CheckView, Health, PauseBody, ResumeBody
from .context import Context, Ctx
from .guard import NativeRoute
from .principals import actor_for
from .problems import ProblemError, responses
from .responses import corrupt_listing, etag, location_response, parse_if_match

_LOCATIONS = TypeAdapter(list[LocationStatus])
_HISTORY = TypeAdapter(list[HistoryEntry])
_WORKERS = TypeAdapter(list[WorkerStatus])


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
    operation = Operation.pause(
        ctx.service_arg(service), reason=b.reason, actor=actor_for(request, b.actor)
    )
    return ctx.respond(request, location, operation, if_match=if_match, wait=b.wait)


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
    when: datetime | timedelta | None = b.at
    if b.in_seconds is not None:
        when = timedelta(seconds=b.in_seconds)
    operation = Operation.resume(
        ctx.service_arg(service), at=when, reason=b.reason, actor=actor_for(request, b.actor)
    )
    # Scheduling all targets the locations where the service is paused or pausing.
    return ctx.respond(request, location, operation, if_match=if_match, wait=b.wait)


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
    operation = Operation.cancel_scheduled_resume(
        ctx.service_arg(service), reason=b.reason, actor=actor_for(request, b.actor)
    )
    return ctx.respond(request, location, operation, if_match=if_match)


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
    response_model=list[WorkerStatus],
    tags=["workers"],
    summary="Registered workers and their leases",
    responses=responses(503),
)
def workers(ctx: Ctx) -> Response:
    """Every registered worker with ``alive`` and its lag (``lagging``, ``lag_unknown``): the
    same objects as ``locstatus workers --json`` (:meth:`Manager.worker_statuses
    <locstatus.manager.Manager.worker_statuses>`)."""
    views = ctx.mgr.worker_statuses().workers
    return Response(_WORKERS.dump_json(views, by_alias=True), media_type="application/json")


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
        raise ProblemError(404, "not found", "no consistency check has run yet",
                           type_="urn:locstatus:no-check-yet")
    with state.lock:
        if state.error is not None:
            raise ProblemError(503, "check failed", problems.redact(state.error),
                               type_="urn:locstatus:check-failed")
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
    return Health(status="ok", version=__version__)


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
        raise ProblemError(503, "not ready", "the reconciler thread is not running",
                           type_="urn:locstatus:not-ready")
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


