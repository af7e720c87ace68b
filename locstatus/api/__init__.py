"""The sidecar (docs/design.md §5.3): HTTP API, Backbeat-compatible routes, metrics and status page.

``create_app(mgr)`` builds the FastAPI app; ``serve(...)`` (:mod:`locstatus.api.server`) runs it
with uvicorn next to the reconciler. FastAPI, uvicorn and prometheus-client are the
``locstatus[server]`` extra, so importing :mod:`locstatus` alone never needs them.

What lives here, top to bottom (each module imports only those below it; import contract
``api-layers`` in pyproject):

- :mod:`.server`: ``locstatus serve``: the socket, uvicorn, the reconciler, the periodic check.
- :mod:`.app`: :func:`create_app`, the factory that assembles what is below.
- :mod:`.routes` (the native ``/v1`` and operations routes) and :mod:`.backbeat` (the
  Backbeat-compatible routes), both over the request context, never over the app.
- :mod:`.context`: the per-app :class:`~.context.Context` every route shares (manager, token,
  metrics, the mutation path of one location or ``all``); :mod:`.page`: the status page.
- :mod:`.auth` (bearer token), :mod:`.bodies` (request/response models), :mod:`.responses`
  (ETags, bulk results, listings with corrupt records), :mod:`.middleware` (metrics, Host
  check, body limit and deadline), :mod:`.metrics` (Prometheus) over :mod:`.series` (the
  bounded per-location, per-worker and check series alerts read), :mod:`.guard` (route classes,
  Host policy) and :mod:`.problems` (errors as ``application/problem+json``).
"""

from locstatus.api.app import create_app
from locstatus.api.context import CheckState

__all__ = ["CheckState", "create_app"]
