"""The worker protocol over HTTP (docs/http.md, "Workers over HTTP"): register and renew a
lease, watch what the worker handles, acknowledge what it applied, unregister: what the Python
``Agent`` does against a backend, for a worker in any language that can reach the sidecar.

Why it is shaped so:

- **The same records, the same rules.** A registration is a :class:`WorkerInfo` stored with the
  backend's own ``put_worker``, with a lease deadline on the manager's time (the backend's,
  docs/time.md), so ``locstatus workers``, settles and the check job treat an HTTP worker as any
  other; on ZooKeeper the node is held by the sidecar's session *and* carries that deadline, so
  the worker lapses when it stops renewing even while the sidecar lives. An acknowledgement is
  the backend's conditional ``ack(..., if_version=)``: accepted only while the record is at the
  version the worker applied, else a 409 carrying the record as it is now, which the worker
  applies again (docs/agent.md "Acknowledge only what was applied").
- **Watch** is Server-Sent Events (``text/event-stream``, sse-starlette) so a browser's
  ``EventSource`` and any HTTP client can read it: a ``snapshot`` first, then ``location``
  events, each with an id, ``heartbeat`` events when quiet; ``Last-Event-ID`` resumes, a cursor
  the sidecar cannot resume from is a 410 problem meaning "re-list" (:mod:`.watch`).
- Errors are problem documents (:mod:`.problems`); every route is in the OpenAPI document;
  streams are limited per sidecar and per caller (429).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, FastAPI, Header, Path, Query, Request, Security
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.concurrency import run_in_threadpool

from locstatus.errors import InvalidInput, NotFound, StandingRegistered, VersionConflict
from locstatus.manager import Manager, worker_live
from locstatus.models import TOMBSTONE_ACK, LocationStatus, WorkerInfo, tombstone_generation
from locstatus.names import check_location, check_worker_id

from .auth import bearer
from .context import Ctx
from .guard import NativeRoute
from .principals import Principal, Role, require
from .problems import ProblemError, responses
from .watch import StaleCursor, StreamSlot, TooManyStreams, WatchHub, location_payload

__all__ = [
    "WATCH_MEDIA_TYPE", "AckBody", "Acked", "Lease", "Registration", "Unregistered", "close_hub",
    "hub_of",
    "router",
]

WATCH_MEDIA_TYPE = "text/event-stream"
MIN_LEASE, MAX_LEASE = 1.0, 600.0
"""Accepted lease lengths, in seconds."""
SNAPSHOT_TIMEOUT = 10.0
"""Seconds a new stream waits for its snapshot read before a 503."""

_hub_lock = threading.Lock()


def hub_of(app: FastAPI) -> WatchHub:
    """The app's :class:`WatchHub`, made on first use (``app.state.watch_hub``)."""
    hub: WatchHub | None = getattr(app.state, "watch_hub", None)
    if hub is None:
        with _hub_lock:
            hub = getattr(app.state, "watch_hub", None)
            if hub is None:
                hub = WatchHub(app.state.locstatus.mgr)
                app.state.watch_hub = hub
    return hub


def close_hub(app: FastAPI) -> None:
    """Stop the app's :class:`WatchHub` if one was made (the server's shutdown calls it)."""
    hub: WatchHub | None = getattr(app.state, "watch_hub", None)
    if hub is not None:
        hub.close()


# -- bodies --------------------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Registration(_Body):
    """``PUT /v1/workers/{worker_id}``: register, or renew the lease (idempotent)."""

    services: list[str] = Field(min_length=1, max_length=64, examples=[["replication"]])
    """Services the worker applies (``crr`` = replication)."""
    locations: list[str] | None = Field(default=None, max_length=100_000)
    """Location filter; absent or null: every location."""
    lease_seconds: float = Field(default=10.0, ge=MIN_LEASE, le=MAX_LEASE, strict=True)
    """Lease length in seconds: the worker stops counting for settle this long after its last
    renewal, judged on the backend's time (docs/time.md). Renew every third of it."""
    host: str = Field(default="", max_length=256)
    pid: int = Field(default=0, ge=0, le=2**31, strict=True)
    errors: dict[str, str] = Field(default_factory=dict, max_length=100_000)
    """Last handler error per ``location/service``, published as a Python agent's are
    (``locstatus workers``); send the current set with every renewal (an absent key clears)."""


class Lease(BaseModel):
    """The answer to a registration or renewal."""

    worker_id: str
    lease_seconds: float
    lease_expires_at: datetime
    """The deadline written, on the backend's time (UTC)."""
    server_time: datetime
    """The sidecar's reading of the backend's time when it wrote the deadline."""
    uncertainty_seconds: float
    """How far that reading may be off: the worker's own deadline is ``sent + lease_seconds -
    fence_margin - uncertainty_seconds`` on its monotonic clock (docs/agent.md
    "Self-fencing")."""
    renew_every_seconds: float
    fence_margin_seconds: float


class UnregisterBody(_Body):
    """``DELETE /v1/workers/{worker_id}``: no members (a JSON body is optional; the request
    still needs ``Content-Type: application/json``, docs/http.md "Requests from browsers")."""


class Unregistered(BaseModel):
    worker_id: str
    removed: bool
    """False when there was no registration to remove (no error)."""


class AckBody(_Body):
    """``PUT /v1/workers/{worker_id}/acks/{location}/{service}``."""

    generation: int = Field(ge=0, le=2**62, strict=True)
    """The generation applied (the service's, or the event's ``remove_generation``)."""
    if_version: int | None = Field(default=None, ge=0, le=2**62, strict=True)
    """The record version whose state was applied: refused with 409 if the record moved on."""


class Acked(BaseModel):
    worker_id: str
    location: str
    service: str
    generation: int


# -- helpers -------------------------------------------------------------------------------


def _worker_id(worker_id: str) -> str:
    return check_worker_id(worker_id)


def _registration(mgr: Manager, worker_id: str) -> WorkerInfo:
    """The stored registration of ``worker_id`` (read from the backend: it may have been made
    through another sidecar). Raises :class:`NotFound`."""
    for w in mgr.workers():
        if w.worker_id == worker_id:
            return w
    raise NotFound(
        f"worker {worker_id!r} is not registered: PUT /v1/workers/{worker_id} first"
    )


def _refused(mgr: Manager, loc: str, svc: str, body: AckBody) -> Exception:
    """The answer to an acknowledgement the backend refused (:meth:`Backend.ack` judges it
    against the record inside its write, docs/http.md "Workers over HTTP"), told apart on the
    record as it is now: :class:`ProblemError` 409 ``urn:locstatus:unknown-generation`` with
    the record (a generation it does not have: ahead of the service's current one, for
    ``_tombstone`` of the removal generation, or with ``if_version`` not the one at that
    version: it would count for pauses not yet made, which would then settle without the
    worker, docs/agent.md "Acknowledge only what was applied"), :class:`InvalidInput` (the
    record has no such service), else 409 ``urn:locstatus:version-conflict`` with the record
    (moved on, gone, not removed). Raises :class:`BackendUnavailable`, :class:`CorruptRecord`
    when the record cannot be read again."""
    current: LocationStatus | None
    try:
        current = mgr.status(loc)
    except NotFound:
        current = None
    conflict = ProblemError(
        409, "version conflict",
        f"{loc} is no longer at version {body.if_version}: apply the record under "
        "'record', then acknowledge again",
        type_="urn:locstatus:version-conflict",
        record=None if current is None else current.model_dump(mode="json"),
    )
    if current is None or (body.if_version is not None and current.version != body.if_version):
        return conflict
    if svc == TOMBSTONE_ACK:
        if current.deleted_at is None:
            return conflict
        have = tombstone_generation(current.deleted_at)
        what = "the removal generation"
    else:
        status = current.services.get(svc)
        if status is None:
            return InvalidInput(f"{loc} has no service {svc}: nothing to acknowledge")
        have = status.generation
        what = f"the generation of {svc}"
    if body.generation > have or (body.if_version is not None and body.generation != have):
        at = f" at version {current.version}" if body.if_version is not None else ""
        return ProblemError(
            409, "unknown generation",
            f"generation {body.generation} is not one {loc} has: {what}{at} is {have}; "
            "apply the record under 'record', then acknowledge the generation applied",
            type_="urn:locstatus:unknown-generation",
            record=current.model_dump(mode="json"),
        )
    return conflict  # it moved on between the refused write and this read


WorkerPath = Annotated[
    str, Path(description="Worker id (location-name rules)", examples=["mover-7"])
]




async def authorize_worker(
    request: Request,
    worker_id: WorkerPath,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)] = None,
) -> None:
    """With tokens: a ``worker`` principal acting as itself (or an operator/admin); 401/403."""
    require(request, credentials, "worker", worker_id)


async def identify(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)] = None,
) -> None:
    """A read: a token is not needed, but one that is presented must be valid (the stream
    limits count per principal then)."""
    if credentials is not None and credentials.credentials:
        require(request, credentials, "read")
    else:
        request.state.principal = None


router = APIRouter(route_class=NativeRoute)

_PUT_ERRORS = responses(400, 401, 403, 404, 409, 413, 415, 422, 503)


@router.put(
    "/v1/workers/{worker_id}",
    response_model=Lease,
    tags=["workers"],
    summary="Register a worker or renew its lease (idempotent)",
    dependencies=[Depends(authorize_worker)],
    responses=_PUT_ERRORS,
)
def register(
    request: Request, ctx: Ctx, worker_id: WorkerPath, body: Annotated[Registration, Body()]
) -> Lease:
    wid = _worker_id(worker_id)
    mgr = ctx.mgr
    services = []
    for name in body.services:
        canon = ctx.service_arg(name)
        if canon is None:
            raise InvalidInput("services: 'all' is not a service; list the services")
        services.append(canon)
    locations = None
    if body.locations is not None:
        locations = sorted({check_location(loc) for loc in body.locations})
    hub = hub_of(request.app)
    now = mgr.clock()
    expires = now + timedelta(seconds=body.lease_seconds)
    try:
        info = WorkerInfo(
            worker_id=wid,
            services=tuple(dict.fromkeys(services)),
            locations=None if locations is None else tuple(locations),
            host=body.host or (request.client.host if request.client else ""),
            pid=body.pid,
            started_at=hub.started_at.setdefault(wid, now),
            lease_expires_at=expires,
            errors=body.errors,
            clock_offset_seconds=None,
        )
    except ValidationError as exc:
        raise InvalidInput(f"invalid registration: {exc.errors()[0].get('msg', exc)}") from None
    with hub.local_writes:
        mgr.backend.put_worker(info)
    hub.registrations[wid] = info
    margin = body.lease_seconds / 4
    return Lease(
        worker_id=wid,
        lease_seconds=body.lease_seconds,
        lease_expires_at=expires,
        server_time=now,
        uncertainty_seconds=max(0.0, mgr.time.uncertainty_seconds()),
        renew_every_seconds=body.lease_seconds / 3,
        fence_margin_seconds=margin,
    )


@router.delete(
    "/v1/workers/{worker_id}",
    response_model=Unregistered,
    tags=["workers"],
    summary="Unregister a worker (drops its acknowledgements: it no longer blocks a pause)",
    description=(
        "A standing registration is never ended here: 409, naming `locstatus workers retire`, "
        "the one way it ends (docs/agent.md \"Standing registrations\")."
    ),
    dependencies=[Depends(authorize_worker)],
    responses=responses(400, 401, 403, 409, 413, 415, 422, 503),
)
def unregister(
    request: Request,
    ctx: Ctx,
    worker_id: WorkerPath,
    body: Annotated[UnregisterBody | None, Body()] = None,
) -> Unregistered:
    wid = _worker_id(worker_id)
    removed = ctx.mgr.backend.remove_worker(wid)  # never a standing one (no retire)
    if not removed and any(w.worker_id == wid and w.standing for w in ctx.mgr.backend.workers()):
        raise StandingRegistered(
            f"{wid} is a standing registration: DELETE /v1/workers never ends one, nothing "
            f"was removed; only a retirement does, logged with its actor: locstatus workers "
            f"retire {wid} (docs/agent.md \"Standing registrations\")"
        )
    hub = hub_of(request.app)
    hub.started_at.pop(wid, None)
    hub.registrations.pop(wid, None)
    return Unregistered(worker_id=wid, removed=removed)


@router.put(
    "/v1/workers/{worker_id}/acks/{location}/{service}",
    response_model=Acked,
    tags=["workers"],
    summary="Acknowledge the generation applied (409 when the record moved on)",
    description=(
        "`service` is a service the worker applies, or `_tombstone` to acknowledge a removal "
        "(with the event's `remove_generation`). A 409 problem carries the record as it is now "
        "under `record` (null if gone): apply it, then acknowledge again."
    ),
    dependencies=[Depends(authorize_worker)],
    responses=_PUT_ERRORS,
)
def acknowledge(
    request: Request,
    ctx: Ctx,
    worker_id: WorkerPath,
    location: Annotated[str, Path(examples=["us-east-1"])],
    service: Annotated[str, Path(examples=["replication", TOMBSTONE_ACK])],
    body: Annotated[AckBody, Body()],
) -> Acked:
    wid = _worker_id(worker_id)
    loc = check_location(location)
    mgr = ctx.mgr
    if service == TOMBSTONE_ACK:
        svc = service
    else:
        canon = ctx.service_arg(service)
        if canon is None:
            raise InvalidInput("acknowledge one service, not 'all'")
        svc = canon
    hub = hub_of(request.app)
    # The registration this sidecar wrote last, while its lease holds (one read saved per
    # acknowledgement); else the stored one (renewed through another sidecar, or lapsed).
    known = hub.registrations.get(wid)
    worker = known if known is not None and worker_live(known, mgr.time) else None
    if worker is None:
        worker = _registration(mgr, wid)
    if not worker_live(worker, mgr.time):
        raise ProblemError(
            409, "lease lapsed",
            f"the lease of worker {wid!r} has lapsed: register again (PUT /v1/workers/{wid}), "
            "read the state again, then acknowledge",
            type_="urn:locstatus:lease-lapsed",
        )
    if svc != TOMBSTONE_ACK and not worker.applies(loc, svc):
        raise InvalidInput(
            f"worker {wid!r} does not apply {svc} at {loc!r} (its registration says so)"
        )
    try:
        with hub.local_writes:  # the generation is judged in the backend's write
            mgr.backend.ack(wid, loc, svc, body.generation, if_version=body.if_version)
    except VersionConflict:
        raise _refused(mgr, loc, svc, body) from None
    if svc != TOMBSTONE_ACK:
        hub.settle_soon(loc)
    return Acked(worker_id=wid, location=loc, service=svc, generation=body.generation)


# -- watch ---------------------------------------------------------------------------------

_WATCH_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": (
            "Server-Sent Events: `snapshot` (data: `{records: [...], corrupt: [{location, "
            "detail}]}`), then `location` "
            "(data: `{location, removed, remove_generation, remove_service, record}`), "
            "`corrupt` (data: `{location, detail}`: the stored record cannot be read; keep what "
            "was applied, report the error), "
            "`resync` (data: `{session_lost}`: acknowledge again what was applied) and "
            "`heartbeat` (data: `{server_time}`, no id); `gone` ends a stream that fell "
            "behind (reconnect with Last-Event-ID)."
        ),
        "content": {WATCH_MEDIA_TYPE: {"schema": {"type": "string"}}},
    },
    **responses(400, 404, 410, 429, 503),
}
LastEventId = Annotated[
    str | None,
    Header(
        alias="Last-Event-ID", max_length=128,
        description="Resume after this event id (410: re-list without it)",
    ),
]
HeartbeatQuery = Annotated[
    float, Query(ge=0.2, le=60, description="Seconds between heartbeat events")
]


@router.get(
    "/v1/workers/{worker_id}/watch",
    tags=["workers"],
    summary="Watch what the worker handles (SSE: snapshot, changes, heartbeats)",
    response_class=Response,
    responses=_WATCH_RESPONSES,
    dependencies=[Depends(authorize_worker)],
)
async def watch_worker(
    request: Request,
    ctx: Ctx,
    worker_id: WorkerPath,
    last_event_id: LastEventId = None,
    heartbeat: HeartbeatQuery = 15.0,
) -> Response:
    wid = _worker_id(worker_id)
    who: Principal | None = getattr(request.state, "principal", None)
    # Counted per worker id (a principal running many workers is capped as a whole): before
    # the registration or any snapshot is read, so a refused stream costs no read.
    slot = _open_stream(request, f"worker:{wid}", who, shared=False)
    try:
        worker = await run_in_threadpool(_registration, ctx.mgr, wid)
        filt = None if worker.locations is None or worker.corrupt else frozenset(worker.locations)
        return await _stream(request, slot, filt, last_event_id, heartbeat)
    except BaseException:
        hub_of(request.app).close_stream(slot)
        raise


@router.get(
    "/v1/watch",
    tags=["locations"],
    summary="Watch every location (SSE; the same events as a worker's watch)",
    response_class=Response,
    responses={**_WATCH_RESPONSES, **responses(400, 403, 410, 429, 503)},
    dependencies=[Depends(identify)],
)
async def watch_all(
    request: Request, last_event_id: LastEventId = None, heartbeat: HeartbeatQuery = 15.0
) -> Response:
    who: Principal | None = getattr(request.state, "principal", None)
    client = request.client.host if request.client else "?"
    caller = f"principal:{who.name}" if who is not None else f"client:{client}"
    # Without a token or as a read principal: the shared pool, so workers keep their room.
    shared = who is None or who.role is Role.READ
    slot = _open_stream(request, caller, who, shared=shared)
    try:
        return await _stream(request, slot, None, last_event_id, heartbeat)
    except BaseException:
        hub_of(request.app).close_stream(slot)
        raise


def _open_stream(
    request: Request, caller: str, who: Principal | None, *, shared: bool
) -> StreamSlot:
    """Count the stream in or raise the 429 problem naming the limit reached."""
    hub = hub_of(request.app)
    try:
        return hub.open_stream(
            caller,
            principal=None if who is None else who.name,
            principal_cap=None if who is None else who.max_streams,
            shared=shared,
        )
    except TooManyStreams as exc:
        raise ProblemError(
            429, "too many streams",
            f"{exc}; close one or use another sidecar (docs/http.md \"Limits\")",
            headers={"Retry-After": "5"},
            type_="urn:locstatus:too-many-streams",
        ) from None


async def _stream(
    request: Request,
    slot: StreamSlot,
    filt: frozenset[str] | None,
    last_event_id: str | None,
    heartbeat: float,
) -> Response:
    """The SSE response of a stream already counted in as ``slot`` (the response's end counts
    it out; an error raised here leaves that to the caller)."""
    hub = hub_of(request.app)
    snapshot: list[LocationStatus] | None = None
    corrupt: dict[str, str] = {}
    if last_event_id:
        await run_in_threadpool(hub.ensure_started)
        try:
            cursor = hub.cursor(last_event_id)
        except StaleCursor as exc:
            raise ProblemError(
                410, "re-list", str(exc), type_="urn:locstatus:stale-cursor"
            ) from None
    else:
        try:
            cursor, snapshot, corrupt = await run_in_threadpool(hub.snapshot, SNAPSHOT_TIMEOUT)
        except TimeoutError as exc:
            raise ProblemError(503, "backend unavailable", str(exc),
                               type_="urn:locstatus:backend-unavailable") from None

    def wanted(location: str | None) -> bool:
        return filt is None or location is None or location in filt

    async def events() -> AsyncIterator[ServerSentEvent]:
        waiter = hub.waiter()
        seq = cursor
        try:
            if snapshot is not None:
                records = [location_payload(r.location, r) for r in snapshot if wanted(r.location)]
                bad = [{"location": loc, "detail": d} for loc, d in corrupt.items() if wanted(loc)]
                yield ServerSentEvent(
                    json.dumps({"records": records, "corrupt": bad}), event="snapshot",
                    id=hub.event_id(seq),
                )
            while not hub.closed:
                waiter.event.clear()
                try:
                    batch = hub.events_after(seq)
                except StaleCursor as exc:
                    yield ServerSentEvent(json.dumps({"detail": str(exc)}), event="gone")
                    return
                for e in batch:
                    seq = e.seq
                    if e.kind == "resync" or wanted(e.location):  # corrupt: its location
                        yield ServerSentEvent(
                            json.dumps(e.payload()),
                            event=e.kind if e.kind in ("resync", "corrupt") else "location",
                            id=hub.event_id(e.seq),
                        )
                if batch:
                    continue
                try:
                    await asyncio.wait_for(waiter.event.wait(), heartbeat)
                except TimeoutError:
                    now = ctx_time(request)
                    yield ServerSentEvent(json.dumps({"server_time": now}), event="heartbeat")
        finally:
            hub.drop_waiter(waiter)
            hub.close_stream(slot)

    return EventSourceResponse(
        events(), ping=3600, headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    )


def ctx_time(request: Request) -> str:
    """The backend's time as this sidecar reads it (ISO 8601, UTC)."""
    mgr: Manager = request.app.state.locstatus.mgr
    return mgr.clock().isoformat()

