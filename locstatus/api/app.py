"""The sidecar's HTTP application (docs/design.md §5.3): :func:`create_app` builds a FastAPI app
over a :class:`~locstatus.manager.Manager`.

What lives where in this package: the per-request context and the mutation path
(:mod:`.context`), authorization (:mod:`.auth`), request and response bodies (:mod:`.bodies`),
response documents (:mod:`.responses`), the native routes (:mod:`.routes`), the Backbeat routes
(:mod:`.backbeat`), the middleware (:mod:`.middleware`); this module only assembles them.

Why it is shaped so:

- The app is a thin shell over the manager: every mutation is the manager's compare-and-set path,
  every error is a :mod:`locstatus.errors` class whose ``http_status`` decides the response
  (:mod:`.problems`), so the CLI and the sidecar never disagree about what an error is.
- The routes go straight into the app's router, and the hot location read is served by a plain
  Starlette route placed first (no dependency for FastAPI to solve); its documented FastAPI
  route stays behind it for the OpenAPI document.
- The record version is the ETag (``"<version>"``). ``If-Match`` becomes the manager's
  ``if_version``, so a stale write is refused by the same compare-and-set that applies it (412).
- ``all`` as the location is a bulk operation: 200 only when every location succeeded, else a
  problem document with per-location ``results`` (:mod:`.responses`).

Usage::

    mgr = Manager(open_backend("sqlite:///./locstatus.db"))
    app = create_app(mgr, token=os.environ.get("LOCSTATUS_API_TOKEN"))
    uvicorn.run(app, host="127.0.0.1", port=8080)
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi_offline import FastAPIOffline
from starlette.routing import Match
from starlette.routing import Route as StarletteRoute

from locstatus import __version__
from locstatus.manager import Manager

from . import problems
from .auth import authenticate, check_token
from .backbeat import router as backbeat_router
from .backbeat_trust import WIDEST, TrustedPeers
from .context import CheckState, Context
from .guard import HostPolicy
from .live import router as live_router
from .metrics import Metrics
from .middleware import MAX_BODY, Middleware, Scope
from .principals import Principals
from .problems import Problem
from .routes import get_location, router
from .series import DEFAULT_LIMIT, CheckView
from .workers import router as workers_router

log = logging.getLogger("locstatus.api")

if TYPE_CHECKING:
    from locstatus.reconciler import Reconciler


DOCS_ASSETS = "/docs/assets"
"""Where the files of ``/docs`` (Swagger UI) and ``/redoc`` (ReDoc) are served from."""


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
    backbeat_trust: Iterable[str] = (),
    principals: Principals | None = None,
    location_series: int = DEFAULT_LIMIT,
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
    - ``check``: where the periodic consistency check stores its result (``/v1/check``, and
      the ``locstatus_check_*`` series of ``/metrics``).
    - ``location_series``: at most this many per-location series in ``/metrics``, the oldest
      services not running (0: none; docs/http.md "Metrics to alert on").
    - ``backbeat_trust``: networks (CIDR) whose peers may call the Backbeat mutations without
      the token (:class:`~.backbeat_trust.TrustedPeers`; InvalidInput for a bad one).
    - ``max_body``: largest request body in bytes (413 above).
    - ``inline_reads``: serve ``GET /v1/locations[/{location}]`` on the event loop instead of
      the thread pool; default: yes for ``sqlite://`` and ``memory://``, no for network backends.
    """


    token = check_token(token) if token else None
    if principals is not None and token is not None:
        principals.legacy_token = token
    principals = principals or Principals.from_settings(tokens_file=None, token=token)
    extra = list(allowed_hosts or ())
    hosts = HostPolicy(allow_any=principals.enabled or "*" in extra, extra=extra)

    def check_view() -> CheckView | None:
        if check is None:
            return None
        with check.lock:
            if check.result is None and check.error is None:
                return None  # not run yet
            return CheckView(report=check.result, error=check.error)

    metrics = Metrics(
        mgr, reconciler=lambda: reconciler, check=check_view, location_series=location_series
    )
    app = FastAPIOffline(
        title="locstatus sidecar",
        version=__version__,
        description=(
            "Pause/resume status per location and service (docs/design.md §5.3). Errors are "
            "application/problem+json; the record version is the ETag."
        ),
        openapi_url="/openapi.json",
        # Swagger UI and ReDoc from the files fastapi-offline ships, never from a CDN: an
        # offline network gets the same pages (docs/http.md, "API documentation")
        docs_url="/docs",
        redoc_url="/redoc",
        static_url=DOCS_ASSETS,
        # The routes go straight into the app's router: FastAPI keeps an included router as a
        # nested level that every request walks through (about 15 us per request).
        routes=[
            _fast_get_location(), *router.routes, *workers_router.routes,
            *backbeat_router.routes, *live_router.routes,
        ],
    )
    app.state.backbeat_trust = trusted = TrustedPeers(backbeat_trust, hosts=extra)
    for net in trusted.wide:  # docs/http.md "Putting locstatus where Backbeat's API server was"
        log.warning("--backbeat-trust %s is wider than a /%d: every peer in it may pause and "
                    "resume through the Backbeat routes without the token", net,
                    WIDEST[net.version])
    app.state.authenticate = authenticate  # the guard's, before a 415 (docs/http.md)
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
    app.add_middleware(Middleware, metrics=metrics, max_body=max_body, hosts=hosts)

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
