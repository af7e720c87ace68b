"""Backbeat-compatible routes under ``/_/{crr|ingestion|lifecycle}/`` (Backbeat's API server's
own paths) and ``/_/backbeat/api/{crr|ingestion|lifecycle}/`` (CloudServer's, which it rewrites
to the former before forwarding), plus ``GET /_/healthcheck`` (docs/http.md, "Backbeat-compatible
routes").

Why it is shaped so: existing tooling (Backbeat's API clients, operator scripts) drives pause and
resume through these paths, so they are kept as Backbeat documents them (``docs/pause-resume.md``
of scality/backbeat), with the location defaulting to ``all``:

- ``GET status[/{loc}]`` -> ``{"<loc>": "enabled" | "disabled"}`` (pausing/paused = disabled)
- ``POST pause[/{loc}]``, ``POST resume[/{loc}]``
- ``POST resume[/{loc}]/schedule`` with optional ``{"hours": N}`` (default 6; a positive
  integer up to 87600, else 400)
- ``DELETE resume[/{loc}][/schedule]`` cancels a scheduled resume
- ``GET resume[/{loc}][/schedule]`` -> ``{"<loc>": "<ISO date>" | "none"}``

``crr`` is the ``replication`` service. ``schedule`` right after ``resume`` is always the suffix,
never a location name (a location named ``schedule`` is ``resume/schedule/schedule``).

Two deliberate differences from the original: a refused transition (scheduling a resume of a
running service) is a 409 and every error is an ``application/problem+json`` document with its
real status, never a 200. Mutations answer with the resulting value per location, in the same
shape as the matching GET (the original answered ``{}``; clients that ignored the body still
do). With ``all``, locations that do not have the service are simply absent; scheduling ``all``
targets the locations where the service is paused (409 if there is none). An unknown location,
or one without that service, is a 404. A corrupt record is never absent: with ``all`` a read
answers a problem document naming it beside the readable locations, a mutation counts it as a
failed location (docs/http.md, "Corrupt records in listings").

Routing is Backbeat's too (its ``BackbeatRequest`` / ``findValidRoute``): a known path asked with
a method it does not take (``POST status``, ``GET pause``) is a 404, not a 405; another method
than GET, POST or DELETE is a 405; a trailing slash names the same route (``status/`` is
``status``: Backbeat splits the path on ``/`` and an empty part is the default), never a
redirect, which behind a proxy would point at the sidecar's own address.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.routing import Match
from starlette.types import Scope

from locstatus.errors import InvalidInput, InvalidTransition, NotFound
from locstatus.manager import Operation
from locstatus.models import LocationStatus
from locstatus.names import check_location

from .backbeat_trust import authorize_mutation
from .context import ALL, Context, Ctx
from .guard import BackbeatRoute
from .principals import actor_for
from .problems import responses
from .responses import bulk_response, corrupt_listing

SERVICES: dict[str, str] = {
    "crr": "replication",
    "ingestion": "ingestion",
    "lifecycle": "lifecycle",
}
"""Backbeat service name -> locstatus service."""

DEFAULT_HOURS = 6
MAX_HOURS = 87_600
"""Longest accepted scheduled-resume delay: ten years, in hours."""

ServiceParam = Annotated[
    str,
    Path(description="Backbeat service", json_schema_extra={"enum": sorted(SERVICES)}),
]
LocParam = Annotated[
    str, Path(description="Location name, or 'all'", examples=["us-east-1", "all"])
]
StatusMap = dict[str, str]

_HOURS_BODY: dict[str, Any] = {
    "requestBody": {
        "required": False,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "hours": {
                            "type": "integer", "minimum": 1, "maximum": MAX_HOURS, "default": 6,
                            "description": "Resume this many hours from now (default 6)",
                        }
                    },
                    "additionalProperties": False,
                }
            }
        },
    }
}
_READ = responses(400, 404, 500, 503)
_WRITE = responses(400, 401, 403, 404, 409, 413, 415, 503)

BACKBEAT_METHODS = frozenset({"GET", "POST", "DELETE"})
"""The methods Backbeat's API server takes at all (any other is its 405)."""
PREFIXES = ("/_/backbeat/api/{service}", "/_/{service}")
"""CloudServer's path first (the one in the OpenAPI document), then Backbeat's own."""


class SlashFree(BackbeatRoute):
    """A route whose path with trailing slashes is the route without them (Backbeat reads an
    empty part of the path as the default), never Starlette's 307 redirect, which behind a
    proxy points at the sidecar's own address: the healthcheck's, and every Backbeat
    route's through :class:`BackbeatPath`."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] == "http":
            path: str = scope["path"]
            if len(path) > 1 and path.endswith("/"):
                scope = {**scope, "path": path.rstrip("/") or "/"}
        return super().matches(scope)


class BackbeatPath(SlashFree):
    """A Backbeat route routed as Backbeat routes: a path asked with a method of
    :data:`BACKBEAT_METHODS` the route does not take matches nothing (404 once no other route
    takes it), and trailing slashes are the route without them (:class:`SlashFree`)."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child = super().matches(scope)
        if match is Match.PARTIAL and scope.get("method") in BACKBEAT_METHODS:
            return Match.NONE, {}
        return match, child


_routes = APIRouter(tags=["backbeat"], route_class=BackbeatPath)


# -- helpers ----------------------------------------------------------------------------------


def _service(ctx: Context, name: str) -> str:
    svc = SERVICES.get(name)
    if svc is None or svc not in ctx.mgr.services:
        shown = name if len(name) <= 64 else name[:61] + "..."
        raise NotFound(
            f"unknown Backbeat service {shown!r}: expected one of "
            f"{', '.join(s for s in sorted(SERVICES) if SERVICES[s] in ctx.mgr.services)}"
        )
    return svc


def _read(
    request: Request, ctx: Context, loc: str, svc: str, render: Callable[[LocationStatus], str]
) -> Response:
    """``{location: render(record)}`` for ``loc`` or every location with ``svc``; with
    ``all`` and a corrupt record among them, the problem of :func:`corrupt_listing` (whether a
    corrupt record has the service is unknown: it is named, never left out)."""
    if loc != ALL:
        rec = ctx.mgr.status(check_location(loc))
        if rec.deleted or svc not in rec.services:
            raise NotFound(f"location {loc!r} has no service {svc}")
        return JSONResponse({rec.location: render(rec)})
    found = ctx.mgr.listing()
    listed = {r.location: render(r) for r in found.records if svc in r.services}
    if found.corrupt:
        return corrupt_listing(request, listed, found.corrupt)
    return JSONResponse(listed)


def iso_date(when: datetime) -> str:
    """A date as Backbeat writes it (JavaScript ``toISOString``): ``2018-06-28T05:40:20.600Z``."""
    return when.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _enabled(svc: str) -> Callable[[LocationStatus], str]:
    return lambda rec: "disabled" if rec.services[svc].paused else "enabled"


def _schedule(svc: str) -> Callable[[LocationStatus], str]:
    def render(rec: LocationStatus) -> str:
        at = rec.services[svc].resume_at
        return "none" if at is None else iso_date(at)

    return render


def _mutate(
    request: Request,
    ctx: Context,
    loc: str,
    operation: Operation,
    render: Callable[[LocationStatus], str],
) -> Response:
    svc = operation.service
    if loc != ALL:
        rec = ctx.single(loc, operation)
        if svc not in rec.services:  # pragma: no cover - the manager raised NotFound already
            raise NotFound(f"location {loc!r} has no service {svc}")
        return JSONResponse({rec.location: render(rec)})
    results = ctx.bulk(operation)  # locations without the service (or nothing paused) skipped
    if operation.schedules and not results:
        raise InvalidTransition(f"no location has {svc} paused: nothing to schedule a resume for")
    return bulk_response(request, results, render, flat=True)


def parse_hours(raw: bytes) -> int:
    """The ``hours`` of a schedule body: empty body or no ``hours`` -> 6. Raises
    :class:`InvalidInput` (400) unless it is a JSON object whose ``hours`` is an integer in
    1..87600 and that has no other member. A body of whitespace only is not empty: Backbeat
    parses any non-empty body as JSON and refuses it (docs/http.md "Backbeat-compatible routes")."""
    if not raw:
        return DEFAULT_HOURS
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        raise InvalidInput('schedule body must be JSON such as {"hours": 6}') from None
    if not isinstance(data, dict):  # ``null`` included: the docs say an object, or no body
        raise InvalidInput('schedule body must be a JSON object such as {"hours": 6}')
    extra = sorted(str(k)[:40] for k in data if k != "hours")
    if extra:
        raise InvalidInput(f"unknown field(s) in schedule body: {', '.join(extra)}")
    hours = data.get("hours", DEFAULT_HOURS)
    if isinstance(hours, bool) or not isinstance(hours, int) or not 1 <= hours <= MAX_HOURS:
        shown = repr(hours) if len(repr(hours)) <= 40 else repr(hours)[:37] + "..."
        raise InvalidInput(f"hours must be a positive integer (1..{MAX_HOURS}), got {shown}")
    return hours


# -- status -----------------------------------------------------------------------------------


def _status(request: Request, ctx: Context, service: str, loc: str) -> Response:
    svc = _service(ctx, service)
    return _read(request, ctx, loc, svc, _enabled(svc))


@_routes.get("/status", response_model=StatusMap, responses=_READ,
            summary="enabled/disabled for every location")
def status_all(request: Request, ctx: Ctx, service: ServiceParam) -> Response:
    return _status(request, ctx, service, ALL)


@_routes.get("/status/{loc}", response_model=StatusMap, responses=_READ,
            summary="enabled/disabled for one location (or all)")
def status_one(request: Request, ctx: Ctx, service: ServiceParam, loc: LocParam) -> Response:
    return _status(request, ctx, service, loc)


def _actor(request: Request) -> str:
    """The actor of a Backbeat-route change (docs/http.md, "Backbeat-compatible routes"): the
    principal's name when a token was presented (as ``/v1``), else ``backbeat:<peer address>``
    (a ``--backbeat-trust`` peer, whose requests carry no token, or a sidecar without tokens):
    Backbeat's API names no user, and the peer is the one caller the sidecar knows of."""
    who = actor_for(request, None)
    if who is not None:
        return who
    return f"backbeat:{request.client.host}" if request.client else "backbeat"


# -- pause / resume now -----------------------------------------------------------------------


def _pause(request: Request, ctx: Context, service: str, loc: str) -> Response:
    svc = _service(ctx, service)
    operation = Operation.pause(svc, actor=_actor(request))
    return _mutate(request, ctx, loc, operation, _enabled(svc))


def _resume(request: Request, ctx: Context, service: str, loc: str) -> Response:
    svc = _service(ctx, service)
    operation = Operation.resume(svc, actor=_actor(request))
    return _mutate(request, ctx, loc, operation, _enabled(svc))


@_routes.post("/pause", response_model=StatusMap, responses=_WRITE,
             dependencies=[Depends(authorize_mutation)], summary="Pause every location")
def pause_all(request: Request, ctx: Ctx, service: ServiceParam) -> Response:
    return _pause(request, ctx, service, ALL)


@_routes.post("/pause/{loc}", response_model=StatusMap, responses=_WRITE,
             dependencies=[Depends(authorize_mutation)], summary="Pause one location (or all)")
def pause_one(request: Request, ctx: Ctx, service: ServiceParam, loc: LocParam) -> Response:
    return _pause(request, ctx, service, loc)


@_routes.post("/resume", response_model=StatusMap, responses=_WRITE,
             dependencies=[Depends(authorize_mutation)], summary="Resume every location now")
def resume_all(request: Request, ctx: Ctx, service: ServiceParam) -> Response:
    return _resume(request, ctx, service, ALL)


# -- scheduled resume (registered before resume/{loc} so "schedule" is never a location) ------


def _get_schedule(request: Request, ctx: Context, service: str, loc: str) -> Response:
    svc = _service(ctx, service)
    return _read(request, ctx, loc, svc, _schedule(svc))


async def _post_schedule(request: Request, ctx: Context, service: str, loc: str) -> Response:
    svc = _service(ctx, service)
    hours = parse_hours(await request.body())
    operation = Operation.resume(
        svc, at=timedelta(hours=hours), actor=_actor(request)
    )
    return await run_in_threadpool(_mutate, request, ctx, loc, operation, _schedule(svc))


def _cancel(request: Request, ctx: Context, service: str, loc: str) -> Response:
    svc = _service(ctx, service)
    operation = Operation.cancel_scheduled_resume(svc, actor=_actor(request))
    return _mutate(request, ctx, loc, operation, _schedule(svc))


@_routes.get("/resume", response_model=StatusMap, responses=_READ,
            summary="Scheduled resume of every location")
def get_schedule_all(request: Request, ctx: Ctx, service: ServiceParam) -> Response:
    return _get_schedule(request, ctx, service, ALL)


@_routes.get("/resume/schedule", response_model=StatusMap, responses=_READ,
            summary="Scheduled resume of every location")
def get_schedule_all2(request: Request, ctx: Ctx, service: ServiceParam) -> Response:
    return _get_schedule(request, ctx, service, ALL)


@_routes.post("/resume/schedule", response_model=StatusMap, responses=_WRITE,
             dependencies=[Depends(authorize_mutation)], openapi_extra=_HOURS_BODY,
             summary="Schedule a resume of every paused location in N hours")
async def post_schedule_all(request: Request, ctx: Ctx, service: ServiceParam) -> Response:
    return await _post_schedule(request, ctx, service, ALL)


@_routes.delete("/resume", response_model=StatusMap, responses=_WRITE,
               dependencies=[Depends(authorize_mutation)], summary="Cancel every scheduled resume")
def cancel_all(request: Request, ctx: Ctx, service: ServiceParam) -> Response:
    return _cancel(request, ctx, service, ALL)


@_routes.delete("/resume/schedule", response_model=StatusMap, responses=_WRITE,
               dependencies=[Depends(authorize_mutation)], summary="Cancel every scheduled resume")
def cancel_all2(request: Request, ctx: Ctx, service: ServiceParam) -> Response:
    return _cancel(request, ctx, service, ALL)


@_routes.post("/resume/{loc}", response_model=StatusMap, responses=_WRITE,
             dependencies=[Depends(authorize_mutation)], summary="Resume one location (or all) now")
def resume_one(request: Request, ctx: Ctx, service: ServiceParam, loc: LocParam) -> Response:
    return _resume(request, ctx, service, loc)


@_routes.get("/resume/{loc}", response_model=StatusMap, responses=_READ,
            summary="Scheduled resume of one location (or all)")
def get_schedule_one(
    request: Request, ctx: Ctx, service: ServiceParam, loc: LocParam
) -> Response:
    return _get_schedule(request, ctx, service, loc)


@_routes.delete("/resume/{loc}", response_model=StatusMap, responses=_WRITE,
               dependencies=[Depends(authorize_mutation)], summary="Cancel a scheduled resume")
def cancel_one(request: Request, ctx: Ctx, service: ServiceParam, loc: LocParam) -> Response:
    return _cancel(request, ctx, service, loc)


@_routes.get("/resume/{loc}/schedule", response_model=StatusMap, responses=_READ,
            summary="Scheduled resume of one location (or all)")
def get_schedule_one2(
    request: Request, ctx: Ctx, service: ServiceParam, loc: LocParam
) -> Response:
    return _get_schedule(request, ctx, service, loc)


@_routes.post("/resume/{loc}/schedule", response_model=StatusMap, responses=_WRITE,
             dependencies=[Depends(authorize_mutation)], openapi_extra=_HOURS_BODY,
             summary="Schedule a resume in N hours (default 6)")
async def post_schedule_one(
    request: Request, ctx: Ctx, service: ServiceParam, loc: LocParam
) -> Response:
    return await _post_schedule(request, ctx, service, loc)


@_routes.delete("/resume/{loc}/schedule", response_model=StatusMap, responses=_WRITE,
               dependencies=[Depends(authorize_mutation)], summary="Cancel a scheduled resume")
def cancel_one2(request: Request, ctx: Ctx, service: ServiceParam, loc: LocParam) -> Response:
    return _cancel(request, ctx, service, loc)


# -- healthcheck ------------------------------------------------------------------------------


def healthcheck(ctx: Ctx) -> Response:
    """``GET /_/healthcheck`` (zenkoclient's ``checkConnection``): 200 while the backend answers
    a ping, else the 503 problem of :class:`~locstatus.errors.BackendUnavailable`. The body has
    Backbeat's shape (its Kafka topics and connections): no topic here, one connection."""
    ctx.mgr.backend.ping()
    return JSONResponse({"topics": {}, "internalConnections": {"backend": "ok"}})


router = APIRouter()
"""Every Backbeat route, under both prefixes, and the healthcheck under both. Copied flat, not
included (FastAPI keeps an included router as a level every request walks through)."""
for _prefix in PREFIXES:
    for _route in _routes.routes:
        assert isinstance(_route, APIRoute)
        router.add_api_route(
            _prefix + _route.path, _route.endpoint, methods=sorted(_route.methods or ()),
            response_model=_route.response_model, responses=_route.responses,
            dependencies=_route.dependencies, summary=_route.summary, tags=_route.tags,
            openapi_extra=_route.openapi_extra, route_class_override=BackbeatPath,
            include_in_schema=_prefix == PREFIXES[0],
        )
for _path in ("/_/healthcheck", "/_/backbeat/api/healthcheck"):
    router.add_api_route(
        _path, healthcheck, methods=["GET"], tags=["backbeat"], responses=responses(503),
        summary="Backbeat's healthcheck: 200 while the backend answers",
        include_in_schema=_path == "/_/healthcheck", route_class_override=SlashFree,
    )
