"""The status page's script (``GET /page/live.js``): the package's own file, served as is.

Why it is shaped so: the page (:mod:`.page`) must stay current during an incident without a
full reload and must not load anything from elsewhere (sidecars often have no internet access),
so the few lines of browser code that follow the watch stream ship inside the package
(``locstatus/api/static/live.js``, package data) and are served by the sidecar; what they do is
described in docs/http.md "The status page". Read once, at import; cached by the browser for a
minute.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

__all__ = ["SCRIPT", "router"]

SCRIPT = (resources.files("locstatus.api") / "static" / "live.js").read_text(encoding="utf-8")
"""The script's text."""

router = APIRouter()


@router.get(
    "/page/live.js",
    tags=["meta"],
    summary="The status page's script (follows GET /v1/watch)",
    response_class=Response,
    responses={200: {"content": {"text/javascript": {"schema": {"type": "string"}}}}},
)
def live_script() -> Response:
    return Response(
        SCRIPT,
        media_type="text/javascript",
        headers={"Cache-Control": "max-age=60", "X-Content-Type-Options": "nosniff"},
    )
