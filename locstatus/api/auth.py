"""Bearer-token authorization of the mutating routes (docs/http.md, "Running it", "Callers
and roles").

One module so that the token is handled in one place: the dependency that checks it on every
mutating route (native and Backbeat alike) and the check that refuses, at start-up, a token no
client could ever send. The token never appears in an answer or a message.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from .principals import check_secret, require

_bearer = HTTPBearer(
    auto_error=False,
    description=(
        "LOCSTATUS_API_TOKEN or a token of LOCSTATUS_API_TOKENS_FILE; required on mutating "
        "routes when the sidecar has tokens (docs/http.md \"Callers and roles\")"
    ),
)
bearer = _bearer
"""The bearer-token security scheme (shared by every module's routes)."""


async def authorize(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)] = None,
) -> None:
    """Require an operator's bearer token when the app has tokens (docs/http.md "Callers and
    roles"): missing or not a bearer token -> 401, unknown token or a role that may not
    operate -> 403. The token never appears in an answer; the principal is the actor."""
    require(request, credentials, "operate")


def authenticate(request: Request) -> None:
    """With tokens: raise as :func:`authorize` does when ``request`` carries no bearer token
    (401) or one that is not the sidecar's (403), without judging the role (the route's own
    dependency does): how a ``/v1`` mutation is authenticated before its media type is judged
    (docs/http.md, "Requests from browsers")."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    credentials = (HTTPAuthorizationCredentials(scheme=scheme, credentials=token.strip())
                   if scheme.lower() == "bearer" and token.strip() else None)
    require(request, credentials, "read")


def check_token(token: str) -> str:
    """Return ``token`` if a client can present it and it is long enough to be a secret, else
    raise :class:`InvalidInput` saying why (never showing it): a bearer token travels in an
    HTTP header, which carries visible ASCII and inner spaces only; the server strips
    surrounding whitespace and decodes other bytes differently, so such a token could never
    match (:func:`~.principals.check_secret`)."""
    return check_secret(token, "the API token (LOCSTATUS_API_TOKEN)")
