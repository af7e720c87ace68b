"""Bearer-token authorization of the mutating routes (docs/http.md, "Running it").

One module so that the token is handled in one place: the dependency that checks it on every
mutating route (native and Backbeat alike) and the check that refuses, at start-up, a token no
client could ever send. The token never appears in an answer or a message.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from locstatus.errors import Forbidden, InvalidInput, Unauthorized

_bearer = HTTPBearer(
    auto_error=False,
    description="LOCSTATUS_API_TOKEN; required on mutating routes when the sidecar has one",
)


async def authorize(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)] = None,
) -> None:
    """Require ``Authorization: Bearer <token>`` when the app has a token: missing or not a
    bearer token -> 401, wrong token -> 403. The token never appears in an answer."""
    token = request.app.state.locstatus.token
    if token is None:
        return
    if credentials is None or not credentials.credentials:
        raise Unauthorized(
            "this route needs an Authorization header with the sidecar's bearer token "
            "(LOCSTATUS_API_TOKEN)"
        )
    if not hmac.compare_digest(credentials.credentials.encode(), token.encode()):
        raise Forbidden("the bearer token is not the sidecar's token")


def check_token(token: str) -> str:
    """Return ``token`` if a client can present it, else raise :class:`InvalidInput` saying
    why (never showing it): a bearer token travels in an HTTP header, which carries visible
    ASCII and inner spaces only; the server strips surrounding whitespace and decodes other
    bytes differently, so such a token could never match."""
    if token != token.strip():
        raise InvalidInput(
            "the API token (LOCSTATUS_API_TOKEN) has leading or trailing whitespace: no client "
            "can send it (HTTP strips it from the header); remove it"
        )
    for i, char in enumerate(token):
        if not " " <= char <= "~":
            kind = "a non-ASCII" if ord(char) > 0x7F else "a control"
            raise InvalidInput(
                f"the API token (LOCSTATUS_API_TOKEN) has {kind} character at position {i}: a "
                "bearer token is sent in an HTTP header and must be visible ASCII (letters, "
                "digits and punctuation such as - . _ ~ + /)"
            )
    return token

