"""Errors as ``application/problem+json`` (RFC 9457), mapped once from :mod:`locstatus.errors`.

Why it is shaped so (docs/design.md §5.3): every error the sidecar returns is a problem document
with the status code the error class declares (``http_status``), never a 200 carrying an error and
never a 500 for bad input. The exception handlers installed by :func:`install` cover the library's
errors, request validation (422), unknown routes (404/405) and anything unexpected (500, with no
detail, since an unexpected exception could carry anything). Every detail goes through
:func:`redact`, which removes the API token and credentials embedded in backend URLs
(``mongodb://user:password@...``), so no secret reaches a client or a log line.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import unquote

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Route

from locstatus.errors import LocstatusError, SettleTimeout

log = logging.getLogger("locstatus.api")

PROBLEM_MEDIA_TYPE = "application/problem+json"

_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")
_BEARER = re.compile(r"(?i)(authorization:?\s*bearer\s+)[^\s'\"]+")
_AUTH_PARAM = re.compile(
    r"(?i)((?:^|[?&;])(?:access_token|token|api_key|apikey|auth|password|passwd|secret)=)"
    r"[^&;#\s'\"]+"
)
"""A query parameter named as a credential: its value is redacted whatever it is."""
_CANDIDATE = re.compile(r"[^\s&=?/:;,'\"<>()\[\]{}]{16,}")
"""A run of characters that may be a token (tokens are 16 characters at least)."""


class Problem(BaseModel):
    """A problem document (RFC 9457). Extra members carry details: ``lagging`` (workers that
    have not acknowledged, on a settle timeout), ``results`` (per-location outcome of a bulk
    operation), ``errors`` (request validation errors)."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(
        description="URI naming the kind of problem: urn:locstatus:<kind> (docs/http.md, Errors)",
        pattern=r"^urn:locstatus:[a-z0-9-]+$",
    )
    title: str = Field(description="Short summary of the kind of problem")
    status: int = Field(ge=100, le=599, description="The HTTP status code")
    detail: str | None = Field(default=None, description="What went wrong, for a human")
    instance: str | None = Field(default=None, description="The request path")


class Secrets:
    """The secrets :func:`redact` removes (the API token); shared by the app and the server's
    log filter."""

    def __init__(self, values: Iterable[str | None] = ()) -> None:
        self.values = [v for v in values if v]
        self.recognizers: list[Callable[[str], bool]] = []
        """Tell a token known only by its hash (the tokens file's) from other text."""

    def recognize(self, is_secret: Callable[[str], bool]) -> None:
        """Also redact every run of text ``is_secret`` says is a secret (its percent-decoded
        form is asked too)."""
        if is_secret not in self.recognizers:
            self.recognizers.append(is_secret)

    def add(self, value: str | None) -> None:
        if value and value not in self.values:
            self.values.append(value)


SECRETS = Secrets()
"""Process-wide secrets to redact (the server registers its token here)."""


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with URL credentials, bearer tokens, the values of query parameters named as
    credentials (``token=``, ``access_token=``, ``api_key=``, ``password=`` ...), each of
    ``secrets`` (plus the process-wide :data:`SECRETS`) and every token its recognizers know
    (the tokens file's, by hash) replaced by ``***`` (docs/http.md "Callers and roles")."""
    text = _URL_CREDENTIALS.sub(r"\g<scheme>***@", text)
    text = _BEARER.sub(r"\g<1>***", text)
    text = _AUTH_PARAM.sub(r"\g<1>***", text)
    for secret in [*secrets, *SECRETS.values]:
        if secret:
            text = text.replace(secret, "***")
    if SECRETS.recognizers:
        known = SECRETS.recognizers

        def hide(m: re.Match[str]) -> str:
            word = m.group()
            forms = {word, unquote(word)}
            return "***" if any(r(f) for r in known for f in forms) else word

        text = _CANDIDATE.sub(hide, text)
    return text


def _slug(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "-", name).lower()


def error_type(exc: LocstatusError) -> str:
    """The problem ``type`` URI of a library error (``urn:locstatus:invalid-transition``)."""
    return f"urn:locstatus:{_slug(type(exc).__name__)}"


def error_body(exc: LocstatusError, instance: str | None = None) -> dict[str, Any]:
    """The problem document (a dict) for a library error, with its class's ``http_status``."""
    body: dict[str, Any] = {
        "type": error_type(exc),
        "title": exc.title,
        "status": exc.http_status,
        "detail": redact(exc.message),
    }
    if instance is not None:
        body["instance"] = instance
    if isinstance(exc, SettleTimeout):
        body["lagging"] = list(exc.lagging)
    return body


def problem(
    status: int,
    title: str,
    detail: str | None = None,
    *,
    type_: str,
    instance: str | None = None,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> Response:
    """A ``application/problem+json`` response; ``type_``: its ``urn:locstatus:`` type."""
    body = Problem(
        type=type_,
        title=title,
        status=status,
        detail=None if detail is None else redact(detail),
        instance=instance,
        **extra,
    )
    return problem_response(body.model_dump(mode="json", exclude_none=True), headers=headers)


def problem_response(body: dict[str, Any], *, headers: dict[str, str] | None = None) -> Response:
    """Serialise a problem dict (its ``status`` is the HTTP status)."""
    return Response(
        content=Problem.model_validate(body).model_dump_json(exclude_none=True),
        status_code=int(body["status"]),
        media_type=PROBLEM_MEDIA_TYPE,
        headers=headers,
    )


def from_error(exc: LocstatusError, instance: str | None = None) -> Response:
    """The problem response for a library error."""
    headers = {"WWW-Authenticate": "Bearer"} if exc.http_status == 401 else None
    return problem_response(error_body(exc, instance), headers=headers)


class ProblemError(Exception):
    """An HTTP-only error with no library class (403 wrong token or foreign Origin, 415 not
    JSON, 404 no check result yet); raised inside routes, turned into a problem by
    :func:`install`. ``type_`` is the problem ``type`` URI (``urn:locstatus:<kind>``)."""

    def __init__(
        self, status: int, title: str, detail: str, headers: dict[str, str] | None = None,
        *, type_: str, **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.title = title
        self.detail = detail
        self.headers = headers
        self.type = type_
        self.extra = extra


def _validation_errors(errors: Iterable[Any]) -> list[dict[str, Any]]:
    out = []
    for err in errors:
        # No "input" (could be 64 KiB, or a secret) and no "ctx" (may hold exception objects).
        loc = [str(p) for p in err.get("loc", ())]
        msg = str(err.get("msg", ""))
        if err.get("type") == "json_invalid":
            # FastAPI says "body.0: JSON decode error": say what it is, and where
            at = loc[1] if len(loc) > 1 else "?"
            why = str((err.get("ctx") or {}).get("error", "")).split(":")[0]
            msg = (f"the request body is not JSON ({why or 'does not parse'} at character "
                   f"{at}); send a JSON object such as {{\"reason\": \"maintenance\"}}")
            loc = ["body"]
        elif err.get("type") == "model_attributes_type" and loc == ["body"]:
            msg = "the request body must be a JSON object such as {\"reason\": \"maintenance\"}"
        out.append({"loc": loc, "msg": redact(msg), "type": str(err.get("type", ""))})
    return out


def _allowed_methods(app: FastAPI, path: str) -> list[str]:
    """The methods of every route whose path matches ``path`` as that route itself matches it
    (a Backbeat route and the healthcheck take trailing slashes, api/backbeat.py)."""
    methods: set[str] = set()
    scope: dict[str, Any] = {"type": "http", "path": path, "root_path": "", "method": ""}
    for route in app.router.routes:
        if isinstance(route, Route) and route.matches(scope)[0] is not Match.NONE:
            methods.update(route.methods or ())
    return sorted(methods)


def install(app: FastAPI) -> None:
    """Register the exception handlers that turn every error into a problem document."""

    async def on_locstatus(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, LocstatusError)
        if exc.http_status >= 500:
            log.warning("%s %s: %s", request.method, request.url.path, redact(exc.message))
        return from_error(exc, request.url.path)

    async def on_problem(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ProblemError)
        return problem(
            exc.status, exc.title, exc.detail, type_=exc.type, instance=request.url.path,
            headers=exc.headers, **exc.extra,
        )

    async def on_validation(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        errors = _validation_errors(exc.errors())
        where = "; ".join(f"{'.'.join(e['loc'])}: {e['msg']}" for e in errors[:5])
        return problem(
            422, "invalid request", where or "the request does not validate",
            type_="urn:locstatus:invalid-request", instance=request.url.path, errors=errors,
        )

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        titles = {404: "not found", 405: "method not allowed", 413: "request too large",
                  400: "invalid input"}
        kind = titles.get(exc.status_code, "http-error").replace(" ", "-")
        headers = dict(exc.headers) if exc.headers else {}
        detail = redact(str(exc.detail)) if exc.detail else None
        if exc.status_code == 400 and detail == "There was an error parsing the body":
            # FastAPI's answer to a body json cannot parse (nested too deep, say): the
            # documented 400 (docs/http.md "Errors"), saying what was wrong.
            detail = "the request body is not JSON that can be read (nested too deep?)"
        if exc.status_code == 405:
            # Starlette names the methods of the first matching route only; a path served by
            # several routes (one per method) allows all of theirs.
            headers["Allow"] = ", ".join(_allowed_methods(app, request.url.path))
        return problem(
            exc.status_code,
            titles.get(exc.status_code, "error"),
            detail,
            type_=f"urn:locstatus:{kind}",
            instance=request.url.path,
            headers=headers or None,
        )

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        log.error(
            "%s %s failed: %s", request.method, request.url.path,
            redact(f"{type(exc).__name__}: {exc}"),
        )
        return problem(500, "internal error", "unexpected server error; see the sidecar log",
                       type_="urn:locstatus:internal-error", instance=request.url.path)

    app.add_exception_handler(LocstatusError, on_locstatus)
    app.add_exception_handler(ProblemError, on_problem)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` entries documenting problem documents for ``statuses``."""
    descriptions = {
        400: "Bad input (invalid location name, If-Match, time in the past)",
        401: "Missing bearer token",
        403: "Wrong bearer token, or a cross-origin request (Origin of another site)",
        404: "Unknown location or service",
        408: "Request body not received in time",
        409: "Invalid transition, or compare-and-set conflicts exhausted",
        412: "If-Match does not match the record's version",
        413: "Request body larger than 64 KiB",
        415: "A mutation without Content-Type: application/json (docs/http.md)",
        421: "Host is not a loopback name on a sidecar without a token (DNS rebinding)",
        422: "Body or parameters do not validate",
        500: "A stored record is corrupt (a listing names it under 'errors')",
        503: "Backend unreachable",
        504: "wait= ran out before every live worker acknowledged",
    }
    return {
        s: {
            "description": descriptions.get(s, "Error"),
            "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        for s in statuses
    }
