"""What a browser can be made to send to the sidecar, and the checks that refuse it (docs/http.md,
"Requests from browsers").

Why it is shaped so: a sidecar without a token trusts whoever can reach its loopback port, and a
web page on any other site can make the operator's browser reach it:

- **Cross-site requests.** A page may POST to ``http://127.0.0.1:8080/...`` with a form or a
  ``no-cors`` fetch: no CORS preflight is needed for a body that is empty, ``text/plain``, a form
  (``application/x-www-form-urlencoded``, ``multipart/form-data``) or untyped, and the answer
  does not need to be readable for the pause to happen. The browser always says who sent it in
  ``Origin`` on such a request. So every mutation whose ``Origin`` is not the sidecar's own is
  refused (403), and a native mutation must say ``Content-Type: application/json``, which no
  page can send to another origin without a preflight the sidecar never grants (415).
- **DNS rebinding.** A page on ``evil.example`` whose name is re-pointed to 127.0.0.1 is, to the
  browser, same-origin with the sidecar: it can read every answer and send JSON. Only the
  ``Host`` header gives it away, so a sidecar without a token serves only loopback ``Host``
  names (127.0.0.0/8, ``::1``, ``localhost``, any port) plus those the operator allows (421).

The Backbeat-compatible routes keep Backbeat's clients working: Backbeat's own tests and Zenko's
end-to-end tests POST with no ``Content-Type`` (empty or ``{"hours": 1}`` bodies), signed S3 SDK
clients through CloudServer send ``application/json`` or ``application/octet-stream``. There,
only the types a page can send cross-site without a preflight are refused, and a request that
carries an ``Authorization`` header (a page cannot add one without a preflight) is not judged
by its ``Origin``: CloudServer forwards the browser ``Origin`` of a signed console request.

The checks run in a route class (:class:`NativeRoute`, :class:`BackbeatRoute`), before FastAPI
reads the body, and after routing, so an unknown path or method is still a 404/405. The same
route classes refuse a mutation's JSON body that says a key twice (:func:`repeated_key`): what
any client may send, not only a browser, but read before the route's own parsing keeps one of
the two.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable, Coroutine, Iterable
from typing import Any
from urllib.parse import urlsplit

from fastapi import Request, Response
from fastapi.routing import APIRoute

from locstatus.errors import InvalidInput

from .problems import ProblemError

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
"""Methods that change something; GET and HEAD answers are not readable cross-origin."""

SIMPLE_TYPES = frozenset(
    {"text/plain", "application/x-www-form-urlencoded", "multipart/form-data"}
)
"""Content types a page may send to another origin without a CORS preflight (Fetch standard:
CORS-safelisted request headers)."""

_DEFAULT_PORTS = {"http": 80, "https": 443}


# -- Host ----------------------------------------------------------------------------------------


def split_host(value: str) -> tuple[str, int | None] | None:
    """``(name, port)`` of a ``Host`` header (``name``, ``name:port``, ``[v6]:port``); the
    name lowercased, without brackets or a trailing dot. None when it does not parse."""
    value = value.strip()
    port: int | None = None
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[1:end], value[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                return None
            port = _port(rest[1:])
            if port is None:
                return None
    else:
        name, sep, tail = value.partition(":")
        if sep:
            port = _port(tail)
            if port is None:
                return None
    name = name.lower().rstrip(".")
    return (name, port) if name else None


def _port(text: str) -> int | None:
    if not text.isascii() or not text.isdigit() or len(text) > 5 or int(text) > 65535:
        return None
    return int(text)


def is_loopback_name(name: str) -> bool:
    """True for ``localhost`` and loopback address literals (127.0.0.0/8, ``::1``)."""
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class HostPolicy:
    """Which ``Host`` names are served: every one (``allow_any``), or loopback names plus
    ``extra`` (names, any port).

    Usage::

        policy = HostPolicy(allow_any=False, extra=["s3.zenko.local"])
        policy.refusal("127.0.0.1:8080")  # None: served
        policy.refusal("evil.example")    # the reason it is not
    """

    def __init__(self, *, allow_any: bool, extra: Iterable[str] = ()) -> None:
        self.allow_any = allow_any
        self.extra = frozenset(n.strip().lower().rstrip(".").strip("[]") for n in extra)

    def refusal(self, host: str | None) -> str | None:
        """None when ``host`` (the raw header, or None if absent) is served, else why not."""
        if self.allow_any:
            return None
        if host is None:
            return "the request has no Host header"
        parsed = split_host(host)
        if parsed is None:
            return f"the Host header {host[:80]!r} does not parse"
        name = parsed[0]
        if is_loopback_name(name) or name in self.extra:
            return None
        return (
            f"Host {host[:80]!r} is not a loopback name: a sidecar without an API token serves "
            "only 127.0.0.1, ::1 and localhost (and names given with --allow-host), so a web "
            "page whose DNS name was re-pointed at this host cannot read or change anything "
            "(DNS rebinding); use one of those names, or set LOCSTATUS_API_TOKEN"
        )


# -- Origin and Content-Type ----------------------------------------------------------------------


def _origin_refusal(request: Request) -> str | None:
    origin = request.headers.get("origin")
    if origin is None:
        return None  # not a browser, or a same-origin GET: nothing a page could forge
    host = request.headers.get("host")
    if _same_origin(origin, host):
        return None
    return (
        f"cross-origin request refused: Origin {origin[:80]!r} is not this sidecar "
        f"({(host or '')[:80]!r}); a web page on another site cannot change anything here"
    )


def _same_origin(origin: str, host: str | None) -> bool:
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return False
    if host is None or parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
        return False  # "null" (sandboxed frames, file: pages) and anything odd are foreign
    mine = split_host(host)
    if mine is None:
        return False
    default = _DEFAULT_PORTS[parts.scheme]
    theirs = (parts.hostname.lower().rstrip("."), port or default)
    return theirs == (mine[0], mine[1] or default)


def media_type(request: Request) -> str | None:
    """The request's media type, lowercased, without parameters; None if it has none."""
    raw = request.headers.get("content-type")
    if raw is None:
        return None
    return raw.split(";", 1)[0].strip().lower() or None


def _is_json(kind: str | None) -> bool:
    return kind is not None and (kind == "application/json" or kind.endswith("+json"))


def native_refusal(request: Request) -> ProblemError | None:
    """The problem for a native (``/v1``) mutation a page on another site could have sent:
    a foreign ``Origin`` (403), or no ``Content-Type: application/json`` (415)."""
    reason = _origin_refusal(request)
    if reason is not None:
        return ProblemError(403, "forbidden", reason, type_="urn:locstatus:cross-origin")
    kind = media_type(request)
    if not _is_json(kind):
        # who is asking is judged before what the body is: a caller without the token is told
        # that (401), not about a media type it would fix only to be refused next (the
        # route's own dependency judges the role after)
        authenticate_first(request)
        return ProblemError(
            415, "unsupported media type",
            f"a mutation needs 'Content-Type: application/json' (got "
            f"{'none' if kind is None else repr(kind[:80])}), also with no body: that is what a "
            "page on another site cannot send without the browser asking first",
            type_="urn:locstatus:unsupported-media-type",
        )
    return None


def authenticate_first(request: Request) -> None:
    """Run the app's ``state.authenticate(request)`` (:func:`~.auth.authenticate`, set by the
    app factory: this module is below the principals), which raises when the request carries
    no bearer token (401) or one that is not the sidecar's (403); none set: nothing to judge."""
    hook: Callable[[Request], None] | None = getattr(request.app.state, "authenticate", None)
    if hook is not None:
        hook(request)


def backbeat_refusal(request: Request) -> ProblemError | None:
    """The problem for a Backbeat-route mutation a page on another site could have sent: a
    foreign ``Origin`` without an ``Authorization`` header (403), or a body type a page may
    send without a preflight (415). No ``Content-Type`` at all is Backbeat's clients' way."""
    if "authorization" not in request.headers:
        reason = _origin_refusal(request)
        if reason is not None:
            return ProblemError(403, "forbidden", reason, type_="urn:locstatus:cross-origin")
    kind = media_type(request)
    if kind in SIMPLE_TYPES:
        return ProblemError(
            415, "unsupported media type",
            f"Content-Type {kind!r} is refused on mutations: send JSON (application/json) or "
            "no Content-Type",
            type_="urn:locstatus:unsupported-media-type",
        )
    return None


# -- bodies ----------------------------------------------------------------------------------------

def repeated_key(raw: bytes) -> str | None:
    """The first key a JSON request body says twice in one object, or None (also when it is
    no JSON at all: the route's own parsing names that). JSON parsers keep one of them (the
    last, here), so ``{"reason": "a", "reason": "b"}`` said two things and was read as one
    (the hostile review of issue 15): the routes refuse it instead, naming the key."""
    if not raw.strip():
        return None
    found: list[str] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(items)
        if len(obj) != len(items) and not found:
            seen: set[str] = set()
            for key, _ in items:
                if key in seen:
                    found.append(key)
                    break
                seen.add(key)
        return obj

    try:
        json.loads(raw, object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return None
    if not found:
        return None
    key = found[0]
    return key if len(key) <= 64 else key[:61] + "..."


Handler = Callable[[Request], Coroutine[Any, Any, Response]]


class _GuardedRoute(APIRoute):
    refuse: Callable[[Request], ProblemError | None]
    repeated: Callable[[str], Exception]
    """The error for a body that says a key twice (:func:`~.bodies.repeated_key`)."""

    def get_route_handler(self) -> Handler:
        handler = super().get_route_handler()
        if not ((self.methods or set()) & MUTATING):
            return handler
        refuse = type(self).refuse
        repeated = type(self).repeated

        async def guarded(request: Request) -> Response:
            problem = refuse(request)
            if problem is not None:
                raise problem
            key = repeated_key(await request.body())  # kept: the route reads it again
            if key is not None:
                raise repeated(key)
            return await handler(request)

        return guarded


def _twice(key: str) -> str:
    return f"the body says the key {key!r} twice in one object: say each field once"


class NativeRoute(_GuardedRoute):
    """A ``/v1`` route: mutations are same-origin JSON (:func:`native_refusal`); a body with a
    key twice is a 422, as any body that does not validate."""

    refuse = staticmethod(native_refusal)
    repeated = staticmethod(
        lambda key: ProblemError(
            422, "invalid request", _twice(key), type_="urn:locstatus:invalid-request"
        )
    )


class BackbeatRoute(_GuardedRoute):
    """A Backbeat-compatible route: mutations as Backbeat's clients send them
    (:func:`backbeat_refusal`); a body with a key twice is a 400, as any bad body there."""

    refuse = staticmethod(backbeat_refusal)
    repeated = staticmethod(lambda key: InvalidInput(_twice(key)))
