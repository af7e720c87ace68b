"""The sidecar (docs/design.md §5.3): HTTP API, Backbeat-compatible routes, metrics and status page.

``create_app(mgr)`` builds the FastAPI app; ``serve(...)`` (:mod:`locstatus.api.server`) runs it
with uvicorn next to the reconciler. FastAPI, uvicorn and prometheus-client are the
``locstatus[server]`` extra, so importing :mod:`locstatus` alone never needs them.
"""

from locstatus.api.app import CheckState, create_app

__all__ = ["CheckState", "create_app"]
